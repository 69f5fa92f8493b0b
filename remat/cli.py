"""The command line: ``python -m remat explain path/to/file.py:factory [options]`` (and
``python -m remat regime path/to/file.py:factory``: where one training step's time goes).

factory() takes no arguments and returns (model, example_args) or (model, example_args,
example_kwargs); example_args is a tuple (or one tensor). The model may be wrapped with
remat.checkpoint(..., policy=...) to explain it under those options. The command plans one
training step (remat.explain: the forward runs once and the model's state is restored; nothing
is trained) and prints the table and the per-module summary, or the JSON document with --json;
--html, --dot and --why add a report file, a Graphviz file, and why-sentences; --budget plans
under a memory budget. Exit status: 0 on success, 2 on a usage error or a remat: error (printed
to stderr). Example: python -m remat explain examples/quickstart.py:factory --budget 1.0
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import itertools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .errors import RematError

__all__ = ["main", "load_factory", "call_factory"]

_MODULE_IDS = itertools.count()


def load_factory(spec: str) -> Callable[[], Any]:
    """The callable named by ``path/to/file.py:factory``."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise RematError(f"remat: expected FILE.py:FACTORY (a Python file and a function in it), got {spec!r}. "
                         "Example: python -m remat explain examples/quickstart.py:factory")
    if not os.path.isfile(path):
        raise RematError(f"remat: expected an existing Python file before ':', got {path!r} (no such file). "
                         "Check the path (relative paths start from the current directory).")
    module_name = f"_remat_cli_{next(_MODULE_IDS)}_{os.path.splitext(os.path.basename(path))[0]}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise RematError(f"remat: expected a Python source file, got {path!r}, which Python cannot import. "
                         "Pass a .py file.")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module_name)
        raise RematError(f"remat: expected a function named {name!r} in {path}, got "
                         f"{'nothing by that name' if fn is None else type(fn).__name__}. "
                         f"Callables defined there: {', '.join(found) or 'none'}.")
    return fn


def call_factory(fn: Callable[[], Any], spec: str = "factory") -> tuple[Any, tuple, dict]:
    """``(model, args, kwargs)`` from ``fn()``, validated."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: just call it
        signature = None
    if signature is not None:
        try:
            signature.bind()
        except TypeError:
            needed = [n for n, p in signature.parameters.items() if p.default is p.empty
                      and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            raise RematError(f"remat: {spec} must be callable with no arguments (the command calls it as "
                             f"{getattr(fn, '__name__', 'factory')}()), got one that needs "
                             f"{', '.join(needed)}. Give them defaults, or add a function that calls it "
                             "with your values: def factory(): return make(...)") from None
    out = fn()
    if not isinstance(out, (tuple, list)) or len(out) not in (2, 3):
        raise RematError(f"remat: {spec}() must return (model, example_args) or (model, example_args, "
                         f"example_kwargs), got {type(out).__name__}"
                         f"{f' of length {len(out)}' if isinstance(out, (tuple, list)) else ''}. "
                         "Example: return model, (x,)")
    model, args = out[0], out[1]
    kwargs = out[2] if len(out) == 3 else {}
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    if not isinstance(kwargs, dict):
        raise RematError(f"remat: {spec}()'s third item must be a dict of keyword arguments, got "
                         f"{type(kwargs).__name__}. Return (model, args, {{'name': value}}).")
    return model, args, kwargs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m remat", description="Explain remat's plan for a model.")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="plan one training step of FILE.py:FACTORY and report it",
                        description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ex.add_argument("target", metavar="FILE.py:FACTORY")
    ex.add_argument("--json", action="store_true", help="print the plan as JSON (schema: remat.report.schema)")
    ex.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML report")
    ex.add_argument("--dot", metavar="OUT.dot|OUT.svg", help="write the graph as Graphviz DOT (or SVG via dot)")
    ex.add_argument("--why", metavar="NAME", action="append", default=[],
                    help="explain why NAME (a node or an op) was saved or recomputed; repeatable")
    ex.add_argument("--budget", metavar="BUDGET",
                    help="plan under a peak-memory budget: bytes (6GiB, 800MB, 1000000) or a fraction of "
                         "eager's predicted peak (0.5)")
    rg = sub.add_parser("regime", help="profile one training step of FILE.py:FACTORY: compute, bandwidth, overhead",
                        description="Run FILE.py:FACTORY's model for one warm-up step and one profiled training "
                                    "step (the model is left as it was) and print where the step's time went: "
                                    "compute kernels (with achieved FLOP/s), bandwidth-bound kernels, overhead.")
    rg.add_argument("target", metavar="FILE.py:FACTORY")
    rg.add_argument("--warmup", type=int, default=1, help="steps run before the profiled one (default 1)")
    rg.add_argument("--json", action="store_true", help="print the regime as JSON")
    return parser


def _regime(ns: argparse.Namespace) -> None:
    import dataclasses
    import json

    from .regime import regime

    model, args, kwargs = call_factory(load_factory(ns.target), ns.target)
    found = regime(model, *args, warmup=ns.warmup, **kwargs)
    print(json.dumps(dataclasses.asdict(found), indent=1) if ns.json else found)


def _budget(text: str | None) -> int | float | str | None:
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _explain(ns: argparse.Namespace) -> None:
    from .api import explain

    model, args, kwargs = call_factory(load_factory(ns.target), ns.target)
    plan = explain(model, *args, budget=_budget(ns.budget), **kwargs)
    if ns.json:
        print(plan.to_json())
    else:
        print(plan)
        print()
        print(plan.summary())
    # Reports first: a mistyped --why name must not cost the files asked for.
    if ns.html:
        plan.to_html(ns.html, title=f"remat plan: {ns.target}")
        print(f"remat: wrote {ns.html}", file=sys.stderr)
    if ns.dot:
        plan.to_dot(ns.dot)
        print(f"remat: wrote {ns.dot}", file=sys.stderr)
    for name in ns.why:
        print(plan.explain(name), file=sys.stderr if ns.json else sys.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    ns = _parser().parse_args(argv)
    try:
        (_regime if ns.command == "regime" else _explain)(ns)
    except RematError as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0
