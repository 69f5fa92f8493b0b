"""``remat.explain``'s and ``remat.pareto``'s probe: run a model's forward once through remat's
backend in explain-only mode (graphs planned, run uncompiled, never trained), and leave the
model as it was."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

from .. import compat, distributed
from ..errors import RematError
from ..options import Options
from .dynamo_backend import RematBackend
from .wrap import backend_of, compiled_entry, remat_modules, rethrow_remat_errors

__all__ = ["probe", "untouched"]


def _with_overrides(options: Options, overrides: dict[str, Any]) -> Options:
    """``options`` with the overrides given (those not None)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(options, **given) if given else options


def _probe_blocks(model: nn.Module, subs: list[nn.Module], args: tuple, kwargs: dict, overrides: dict[str, Any],
                  want_frontier: bool) -> RematBackend:
    """Explain a model whose submodules are remat-wrapped (remat per block): run ``model`` once
    with each wrapped module's compiled call replaced by a probe with that module's options
    (restored afterwards); plans come back in call order. The rest of the model runs as written,
    FSDP2's hooks included (their collectives need every rank to call explain)."""
    merged = RematBackend(Options(), explain_only=True, want_frontier=want_frontier)

    def probe_call(sub: nn.Module) -> Callable[..., Any]:
        options = _with_overrides(backend_of(sub).options, overrides)
        probe = RematBackend(options, explain_only=True, want_frontier=want_frontier)
        compiled = compiled_entry(sub, probe, options.dynamic)

        def run(*a: Any, **k: Any) -> Any:
            out = compiled(sub, *a, **k)
            merged.plans.extend(probe.plans)
            merged.frontiers.extend(probe.frontiers)
            probe.plans.clear()
            probe.frontiers.clear()
            return out

        return run

    calls = {id(sub): (sub, sub.__dict__["_compiled_call_impl"]) for sub in subs}
    try:
        for sub in subs:
            sub.__dict__["_compiled_call_impl"] = probe_call(sub)
        with torch.enable_grad(), distributed.unsplit_by_ddp():
            model(*args, **kwargs)
    finally:
        for sub, call in calls.values():
            sub.__dict__["_compiled_call_impl"] = call
    return merged


def _version(t: torch.Tensor | None) -> int:
    """A tensor's version counter (bumped by every in-place write); -1 where it has none
    (inference tensors), which are then always restored."""
    if t is None:
        return 0
    try:
        return t._version
    except RuntimeError:
        return -1


@contextlib.contextmanager
def untouched(model: Any, args: tuple, kwargs: dict) -> Iterator[None]:
    """Leave the model as it was: ``explain`` runs its forward once (Dynamo runs each captured
    graph, and the code between graph breaks, on the real tensors), which updates BatchNorm's
    running statistics and ``num_batches_tracked``, draws from the random generators (dropout)
    and could write parameters or the inputs it is given. Inside this context every parameter and
    buffer of ``model`` (and of inputs that are modules) and every tensor among the inputs (in
    lists, tuples and dicts too) is copied, and written back afterwards where it changed (its
    version counter moved or its values differ: kernels such as batch norm update running
    statistics without bumping the counter); ``.grad`` of each parameter is put back (the same
    tensor, with its values), and the CPU and CUDA generators are restored with
    ``torch.random.fork_rng``. The copies cost the memory of the model's parameters and buffers
    and of the inputs while the probe runs."""
    modules = [m for m in (model, *args, *kwargs.values()) if isinstance(m, nn.Module)]
    if not modules and not isinstance(model, nn.Module):
        owner = getattr(model, "__self__", None)  # a bound method of a module
        if isinstance(owner, nn.Module):
            modules.append(owner)
    tensors: dict[int, torch.Tensor] = {}
    for m in modules:
        for t in itertools.chain(m.parameters(), m.buffers()):
            tensors.setdefault(id(t), t)
    for t in compat.tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            tensors.setdefault(id(t), t)
    saved = [(t, _version(t), t.detach().clone()) for t in tensors.values()]
    grads = [(t, t.grad, _version(t.grad), t.grad.detach().clone() if t.grad is not None else None)
             for t in tensors.values() if isinstance(t, nn.Parameter)]
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        with torch.no_grad():
            for t, version, copy_ in saved:
                if _version(t) != version or version < 0 or not torch.equal(t, copy_):
                    t.copy_(copy_)
            for p, grad, version, copy_ in grads:
                if p.grad is not grad:
                    p.grad = grad
                if grad is not None and (_version(grad) != version or version < 0):
                    grad.copy_(copy_)


def probe(model: Any, args: tuple, kwargs: dict, overrides: dict[str, Any], want_frontier: bool) -> RematBackend:
    """Plan ``model(*args, **kwargs)`` (a module or a callable) without training: the
    explain-only backend that ran, with the plans (and, with ``want_frontier``, the frontiers) of
    the graphs captured. ``overrides``: ``checkpoint``'s options given to ``explain``, over the
    wrapped model's (or the defaults)."""
    if isinstance(model, nn.Module):
        subs = remat_modules(model)
        if subs and subs[0] is not model:
            with untouched(model, args, kwargs):
                found = _probe_blocks(model, subs, args, kwargs, overrides, want_frontier)
            return _found_graphs(found)
    rb = backend_of(model)
    options = _with_overrides(rb.options if rb is not None else Options(), overrides)
    explainer = RematBackend(options, explain_only=True, want_frontier=want_frontier)
    if isinstance(model, nn.Module):
        compiled = functools.partial(compiled_entry(model, explainer, options.dynamic), model)
    else:
        fn = getattr(model, "__wrapped__", model) if rb is not None else model
        compiled = rethrow_remat_errors(torch.compile(fn, backend=explainer, dynamic=options.dynamic), fn,
                                        logging_in_graph=options.budget is not None)
    with untouched(model, args, kwargs), torch.enable_grad(), distributed.unsplit_by_ddp():
        compiled(*args, **kwargs)
    return _found_graphs(explainer)


def _found_graphs(probe: RematBackend) -> RematBackend:
    if not probe.plans:
        raise RematError(
            "remat: explain found no training graph: nothing in this call requires grad (or "
            "the model is in a torch.no_grad() region). Pass inputs or parameters with "
            "requires_grad=True, as in training."
        )
    return probe
