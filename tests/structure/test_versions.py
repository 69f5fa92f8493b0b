"""The version table (``remat/versions.py``, Note [Version drift]): every entry is used where it
says, every private torch name the package uses is in it, and no torch version number is written
anywhere else in the package. remat warns once on a torch it was not verified on, names every hook
that cannot install with its entry's consequence, and refuses to compile when Inductor would
silently ignore its plan. Also: the uncompiled backend works in a fresh process that never
imported Inductor's lowering (a decomposition reads it through the package)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import remat
from remat import versions
from remat.backends.inductor import hooks
from remat.versions import HOOKS, OnDrift

from .test_architecture import MODULES, ROOT, _dotted, _private


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(versions, "_warned", set())


def _caught(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(m.message) for m in w if str(m.message).startswith("remat:")]


# --- the table ------------------------------------------------------------------------------

def _source(module: str) -> str:
    path = ROOT.parent / (module.replace(".", "/") + ".py")
    return (path if path.exists() else path.with_suffix("") / "__init__.py").read_text()


@pytest.mark.parametrize("key", sorted(HOOKS))
def test_every_entry_is_cited_where_it_is_used(key):
    hook = HOOKS[key]
    assert hook.purpose and hook.apis and hook.used_in and hook.consequence
    assert hook.checked and all(re.fullmatch(r"2\.\d+", v) for v in hook.checked), hook.checked
    for module in hook.used_in:
        assert module in MODULES and module != "remat.versions", module
        src = _source(module)
        assert f'"{key}"' in src or f"'{key}'" in src, f"{module} does not cite versions.HOOKS[{key!r}]"


def _defined_names() -> set[str]:
    """Every name the package defines or binds (its own private names are not torch's)."""
    names: set[str] = set()
    for tree in MODULES.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
    return names


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _private_uses(tree: ast.AST, defined: set[str]) -> set[str]:
    """The private torch names a module uses: private modules and names it imports, attribute
    chains and ``getattr``/``hasattr`` names through them, ``"torch._..."`` strings, and private
    attributes (``op._schema``) the package itself never defines (as ``*._schema``)."""
    aliases: dict[str, str] = {}
    others: set[str] = set()  # other libraries' modules (``sys._getframe`` is not torch's)
    uses: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("torch", "functorch"):
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    uses.add(a.name)
                else:
                    others.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                uses.add(f"{node.module}.{a.name}")

    def resolve(node: ast.AST) -> str | None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            base = resolve(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        dotted = _dotted(node)
        if dotted is None or dotted.split(".")[0] not in aliases:
            return None
        root, *rest = dotted.split(".")
        return ".".join([aliases[root], *rest])

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not _is_dunder(node.attr):
            full = resolve(node)
            if full is not None:
                uses.add(full)
            elif node.attr.startswith("_") and node.attr not in defined and (_dotted(node) or ".").split(".")[0] \
                    not in others:
                uses.add(f"*.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            full = resolve(node)
            name = node.args[1].value if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) else None
            if full is not None:
                uses.add(full)
            elif isinstance(name, str) and name.startswith("_") and not _is_dunder(name) and name not in defined:
                uses.add(f"*.{name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"torch\._[\w.]*",
                                                                                          node.value):
            uses.add(node.value.rstrip("."))
    return {u for u in uses if u.startswith("*.") or _private(u)}


def _covered(use: str) -> bool:
    apis = [a for h in HOOKS.values() for a in h.apis]
    if use.startswith("*."):
        return any(use[2:] in a.split(".") for a in apis)
    return any(a == use or a.startswith(use + ".") for a in apis)


def test_every_private_torch_name_the_package_uses_is_in_the_table():
    defined = _defined_names()
    missing = sorted(f"{name}: {use}" for name, tree in MODULES.items() if name != "remat.versions"
                     for use in _private_uses(tree, defined) if not _covered(use))
    assert not missing, "add these to remat/versions.py (HOOKS): " + "; ".join(missing)


def test_the_scan_finds_private_names():
    uses = _private_uses(MODULES["remat.backends.inductor.hooks"], _defined_names())
    assert "torch._inductor.compile_fx.min_cut_rematerialization_partition" in uses
    assert "torch._inductor.virtualized.V.set_choices_handler" in uses  # through hasattr
    assert "*._set_flush_status" in uses
    assert not _covered("torch._inductor.compile_fx.some_new_name")


_VERSION = re.compile(r"(?<![\w.])2\.1\d(?:\.\d+)?(?![\w.]|\s*(?:MiB|GiB|KiB|ms|%|x\b))|torch\s*2\.\d")
"""A torch version (2.10 to 2.19, or "torch 2.x"), not a measurement (2.19 MiB)."""


def test_no_torch_version_in_prose_outside_the_table():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "versions.py" and path.parent == ROOT:
            continue
        for k, line in enumerate(path.read_text().splitlines(), 1):
            if _VERSION.search(line):
                found.append(f"{path.relative_to(ROOT.parent)}:{k}: {line.strip()}")
    assert not found, "cite remat/versions.py instead: " + "; ".join(found)


def test_verified_versions_are_those_every_inductor_hook_was_checked_on():
    inductor = [h for h in HOOKS.values() if h.on_drift is not OnDrift.UNDETECTED
                and any(m.startswith("remat.backends.inductor") for m in h.used_in)]
    assert inductor and versions.VERIFIED
    assert all(set(versions.VERIFIED) <= set(h.checked) for h in inductor)


# --- drift ----------------------------------------------------------------------------------

def test_a_drift_warns_once_with_its_entrys_text():
    key = next(k for k, h in HOOKS.items() if h.on_drift is OnDrift.WARN)
    _, msgs = _caught(lambda: versions.drift(key, "torch.some_missing_name"))
    assert len(msgs) == 1
    assert f"`{key}`" in msgs[0] and HOOKS[key].consequence in msgs[0] and "torch.some_missing_name" in msgs[0]
    assert all(v in msgs[0] for v in HOOKS[key].checked)
    _, again = _caught(lambda: versions.drift(key, "torch.some_missing_name"))
    assert again == []


@pytest.mark.parametrize("key", sorted(k for k, h in HOOKS.items() if h.on_drift is OnDrift.RAISE))
def test_a_raise_kind_drift_raises(key):
    with pytest.raises(remat.RematError, match=rf"^remat: `{key}` .*{re.escape(HOOKS[key].consequence)}"):
        versions.drift(key)


def test_entries_that_do_not_warn_or_raise_have_no_drift_call():
    key = next(k for k, h in HOOKS.items() if h.on_drift is OnDrift.UNDETECTED)
    with pytest.raises(remat.RematError, match="internal error"):
        versions.drift(key)
    with pytest.raises(remat.RematError, match="internal error"):
        versions.drift("no such entry")


def test_verified_versions_are_silent():
    for v in versions.VERIFIED:
        ok, msgs = _caught(lambda v=v: versions.check_torch_version(f"{v}.0+cpu"))
        assert ok and not msgs


def test_unverified_version_warns_once_naming_the_verified_ones():
    ok, msgs = _caught(lambda: versions.check_torch_version("2.99.1+cu130"))
    assert not ok and len(msgs) == 1
    assert "2.99" in msgs[0] and all(v in msgs[0] for v in versions.VERIFIED)
    _, again = _caught(lambda: versions.check_torch_version("2.99.1+cu130"))
    assert again == []


def test_running_torch_is_checked_when_compiling(monkeypatch):
    seen = []
    monkeypatch.setattr("remat.backends.inductor.backend.check_torch_version", lambda: seen.append(1) or True)
    monkeypatch.setattr("remat.backends.inductor.backend.compile_fx", lambda gm, inputs, *_, **__: gm.forward)
    fn = remat.checkpoint(lambda x: (x * 2).sum())
    fn(torch.randn(3, requires_grad=True))
    assert seen


def test_a_hook_that_cannot_install_warns_with_its_name(monkeypatch):
    from torch._inductor.virtualized import V

    monkeypatch.delattr(type(V), "set_choices_handler", raising=False)
    if hasattr(V, "set_choices_handler"):
        pytest.skip("set_choices_handler is not a class attribute on this torch")

    def enter():
        with hooks.stage_local_fusion():
            return True

    ok, msgs = _caught(enter)
    assert ok and len(msgs) == 1 and "stage_local_fusion" in msgs[0] and "set_choices_handler" in msgs[0]
    assert HOOKS["stage_local_fusion"].consequence in msgs[0]


def test_missing_partitioner_name_raises_instead_of_ignoring_the_plan(monkeypatch):
    import torch._inductor.compile_fx as cfx

    monkeypatch.delattr(cfx, "min_cut_rematerialization_partition")
    with pytest.raises(remat.RematError, match=r"^remat: `inductor_partitioner` .* ignore remat's plan"):
        with hooks.inductor_partitioner(lambda *a, **k: None):
            pass


def test_pooling_model_in_a_fresh_process():
    """``max_pool2d_with_indices``' decomposition calls ``torch._inductor.lowering`` through the
    package; the uncompiled backend must work before anything else imported it."""
    code = textwrap.dedent("""
        import torch, torch.nn as nn, remat
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.MaxPool2d(2))
        x = torch.randn(2, 3, 8, 8, requires_grad=True)
        out = remat.checkpoint(model, backend="eager")(x).sum()
        out.backward()
        print("ok", float(out))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("ok")


def test_compat_fallbacks_warn_instead_of_silently_changing_behaviour(monkeypatch):
    import contextlib

    from torch._functorch import config as functorch_config

    from remat import compat

    compat.can_split_ddp.cache_clear()
    monkeypatch.delattr(functorch_config, "force_non_lazy_backward_lowering", raising=False)
    with pytest.warns(UserWarning, match="`backward_compiled_now` .*force_non_lazy_backward_lowering"):
        ctx = compat.backward_compiled_now()
    assert isinstance(ctx, contextlib.nullcontext)

    from torch._dynamo.backends import distributed as dynamo_ddp

    monkeypatch.setattr(dynamo_ddp.DDPOptimizer, "compile_fn", lambda self, gm, inputs: gm)
    with pytest.warns(UserWarning, match="`ddp_bucket_split` .*Dynamo splits DDP graphs itself"):
        assert compat.can_split_ddp() is False
    compat.can_split_ddp.cache_clear()
