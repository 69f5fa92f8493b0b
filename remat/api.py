"""Public entry points: ``checkpoint`` and ``explain``. They validate arguments and wire the
stages together; the algorithms live in ``graph``, ``solver`` and ``partition``."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.nn as nn

from . import compat, distributed
from .capture.dynamo_backend import RematBackend
from .capture.dynamo_errors import model_error, quiet_fake_tensor_errors
from .errors import RematError
from .options import Options
from .plan import Frontier, Plan

__all__ = ["checkpoint", "explain", "pareto", "compiled_plans"]

T = TypeVar("T")
_ATTR = "_remat_backend"
_ORIGINAL = "_remat_original"
_COUNTER = itertools.count()


def _rethrow_remat_errors(fn: Callable[..., Any], run_eagerly: Callable[..., Any],
                          takes_module: bool = False) -> Callable[..., Any]:
    """Dynamo wraps backend exceptions in ``BackendCompilerFailed``; surface our own
    ``RematError`` unchanged so users see the ``remat:`` message first. When the model itself
    fails while Dynamo traces it (a wrong input shape), raise one ``remat:`` error naming the
    model's error (``dynamo_errors.model_error``; ``run_eagerly`` reproduces it without remat).
    With ``takes_module`` the first argument is the module (``_entry``), not one of the inputs
    the error lists."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            with quiet_fake_tensor_errors():
                return fn(*args, **kwargs)
        except RematError:
            raise
        except Exception as e:
            inner: BaseException | None = e
            while inner is not None:
                if isinstance(inner, RematError):
                    raise inner.with_traceback(None) from None
                inner = getattr(inner, "inner_exception", None) or inner.__cause__
            eager, inputs = (functools.partial(run_eagerly, args[0]), args[1:]) if takes_module else (run_eagerly, args)
            user = model_error(e, eager, inputs, kwargs)
            if user is not None:
                raise user from None
            raise

    return call


class _WeakSelf:
    """What the functions remat stores in a wrapped module's ``__dict__`` (``forward``, ``train``)
    are bound to in place of the module: a weak reference to it. A deep copy of the module
    copies its ``__dict__``, bound methods included; they are bound to the copy, as methods
    bound to the module itself would be.

    Note [No reference cycle]: a wrapped module is freed by reference counting when its last
    reference goes (``del model``), not later by Python's cycle collector: a DDP module freed
    after its process group is destroyed can deadlock gloo's teardown (README: Tearing down).
    So nothing remat stores in the module's ``__dict__`` refers to the module strongly: the
    compiled call (``_compiled_call_impl``) holds a ``weakref.ref`` and passes the module to the
    compiled ``_entry`` as its first argument (a closure variable would be a strong reference);
    ``forward`` (Note [One frame per wrapped module]) and ``train`` are bound to a ``_WeakSelf``.
    Dynamo traces the ``self.ref()`` call in ``forward``: it builds the referent with a source of
    its own (``VariableBuilder.wrap_weakref``, ``WeakRefVariable``: ``versions.HOOKS["dynamo_weakref"]``),
    and names the modules reached through it
    ``forward.__self__.ref().<path>``, which ``capture.clean_module_paths`` shortens. Nor may a
    function that outlives a call hold a module, and a nested function that calls itself is a
    cycle that holds what it refers to until the collector runs (``_visit``).
    ``tests/test_no_cycle.py`` checks that ``del`` frees a wrapped module with the collector off.
    Dynamo's own trace of a forward that breaks the graph (DDP's does) can leave cyclic garbage
    that refers to the module, as it does under ``torch.compile(DDP(model))``; only the
    collector frees that."""

    def __init__(self, module: nn.Module) -> None:
        self.ref = weakref.ref(module)

    def __deepcopy__(self, memo: dict[int, Any]) -> _WeakSelf:
        return _WeakSelf(copy.deepcopy(self.ref(), memo))


def _entry(module: nn.Module) -> Callable[..., Any]:
    """A top-level frame for Dynamo that runs a module with its hooks, called with the module
    first: ``entry(module, *args, **kwargs)``. The module is an argument, not a closure
    variable, so that the compiled function does not keep it alive (Note [No reference cycle]).
    (Compiling ``module._call_impl`` directly makes Dynamo skip that torch-internal frame and
    capture each submodule separately.) Each call makes a new code object: Dynamo keys its cache
    and its recompile limit on code objects, so every wrapped model gets its own."""

    def run_module(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        return module._call_impl(*args, **kwargs)  # versions.HOOKS["module_call"]

    code = run_module.__code__.replace(co_name=f"remat_{type(module).__name__}_{next(_COUNTER)}")
    return types.FunctionType(code, run_module.__globals__, code.co_name)


def _compiled_entry(module: nn.Module, backend: RematBackend, dynamic: bool | None) -> Callable[..., Any]:
    """``torch.compile`` of ``_entry(module)`` with remat's backend, raising ``remat:`` errors
    first (``_rethrow_remat_errors``); call it with the module first, as the entry."""
    entry = _entry(module)
    return _rethrow_remat_errors(torch.compile(entry, backend=backend, dynamic=dynamic), entry, takes_module=True)


def _own_forward(module: nn.Module) -> Callable[..., Any]:
    """``module.forward`` as an instance attribute: a method with a code object of its own that
    calls the class's ``forward``, looked up at call time (FSDP2 changes the class).

    Note [One frame per wrapped module]: when Dynamo breaks the graph inside ``_entry`` at a
    hook it does not trace (FSDP2's, with ``torch._dynamo.config.skip_fsdp_hooks``), the hook
    runs eagerly and the module's ``forward`` becomes a frame Dynamo compiles on its own. Every
    block of a model shares the code object of its class's ``forward`` (and HF transformers'
    ``forward_with_checkpointing``, which also wraps the subclass FSDP2 makes), and Dynamo keeps
    one cache per code object: each block's different remat backend counted as a recompile, and
    past ``recompile_limit`` (8) the remaining blocks ran eagerly, unplanned (measured: 8 of 10
    blocks under FSDP2 per block, our blocks and HF Llama's). An instance attribute comes before
    any class's ``forward``, so each block's frame has a code object, and a cache, of its own.
    When Dynamo inlines it instead, modules reached through it are named
    ``forward.__self__.ref().<path>`` (and, in the forward's own frame, ``self.ref().<path>``:
    the method is bound to a ``_WeakSelf``, Note [No reference cycle]);
    ``capture.clean_module_paths`` removes that step."""

    def run_forward(self: _WeakSelf, /, *args: Any, **kwargs: Any) -> Any:
        module = self.ref()
        return type(module).forward(module, *args, **kwargs)

    code = run_forward.__code__.replace(co_name=f"remat_forward_{type(module).__name__}_{next(_COUNTER)}")
    fn = types.FunctionType(code, run_forward.__globals__, code.co_name)
    functools.update_wrapper(fn, type(module).forward)  # inspect.signature(wrapped.forward) as before
    return types.MethodType(fn, _WeakSelf(module))


def _no_double_backward(grad: torch.Tensor) -> None:
    """A hook on each output: a backward that records a graph (``create_graph=True``) would
    reach the compiled backward, which cannot itself be differentiated."""
    if torch.is_grad_enabled():
        raise RematError(
            "remat: backward with create_graph=True (double backward, e.g. a gradient penalty) is "
            "not supported through a remat-wrapped model: its compiled backward cannot be "
            "differentiated again. Expected backward()/torch.autograd.grad without create_graph; "
            "got create_graph=True. Compute higher-order gradients with the unwrapped model (it "
            "shares the parameters) or torch.func."
        )


def _finish(rb: RematBackend, out: Any, stacklevel: int) -> Any:
    """After a compiled training call: warn once about graph breaks (at the user's call,
    ``stacklevel`` frames up), and guard the outputs against double backward."""
    rb.warn_graph_breaks(stacklevel + 1)
    for t in compat.tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.grad_fn is not None:  # not the user's leaves
            t.register_hook(_no_double_backward)
    return out


def _turn_off_inner_checkpointing(model: nn.Module) -> None:
    """Hugging Face models with ``model.gradient_checkpointing_enable()`` set a
    ``gradient_checkpointing`` flag on their layers. remat decides what to recompute itself, so
    the flags are turned off (on the modules, which the original model shares), with a warning."""
    names = [name or type(model).__name__ for name, m in model.named_modules()
             if getattr(m, "gradient_checkpointing", None) is True]
    if not names:
        return
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", None) is True:
            m.gradient_checkpointing = False
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    warnings.warn(
        f"remat: gradient checkpointing was enabled on {shown} (model.gradient_checkpointing_enable()); "
        "remat chooses what to recompute itself, so it has been turned off on these modules (they "
        "are shared with the original model). Call model.gradient_checkpointing_disable() before "
        "remat.checkpoint to silence this warning.",
        stacklevel=3,
    )


def _train(self: _WeakSelf, mode: bool = True) -> nn.Module:
    """``train``/``eval`` of a wrapped module. The wrapper shares every submodule with the
    original but has its own top-level ``training`` flag: keep the original's in step, so that
    ``wrapped.eval()`` leaves no module of the original in training mode. (A method bound to the
    module's ``_WeakSelf``, so a deep copy of the wrapper sets its own copies.)"""
    module = self.ref()
    nn.Module.train(module, mode)
    module.__dict__[_ORIGINAL].training = module.training
    return module


def checkpoint(
    model: T,
    *,
    backend: str = "inductor",
    policy: Any = None,
    strict: bool = False,
    dynamic: bool | None = None,
    budget: int | float | str | None = None,
    device_model: Any = None,
) -> T:
    """Wrap ``model`` (an ``nn.Module`` or a function) so that training saves less.

    A module comes back as a shallow copy sharing its parameters, buffers and submodules
    with ``model``: the same ``state_dict()`` keys, usable with any optimizer, ``.train()``
    and ``.eval()`` (in eval mode the module runs as written, uncompiled and unplanned; they
    set the original's top-level ``training`` flag too, as they set its submodules'). A
    function comes back as a function. Each captured training graph is
    planned by a bytes-weighted min-cut; ``remat.compiled_plans(wrapped)`` lists the plans.
    With ``budget`` (bytes, ``"6GiB"``, or a fraction of eager's peak) each graph takes the
    plan with the least estimated recompute whose predicted peak fits (``remat.budget``).

    Warns once if Dynamo breaks the model into several graphs (each is planned on its own),
    and turns off Hugging Face gradient checkpointing flags on the model, with a warning.
    A backward with ``create_graph=True`` through the outputs raises ``RematError``.
    """
    options = Options(backend=backend, policy=policy, strict=strict, dynamic=dynamic, budget=budget,
                      device_model=device_model)
    rb = RematBackend(options)
    if isinstance(model, nn.Module):
        _turn_off_inner_checkpointing(model)
        wrapped = copy.copy(model)
        wrapped.__dict__[_ATTR] = rb
        if "forward" not in wrapped.__dict__:  # Note [One frame per wrapped module]
            wrapped.__dict__["forward"] = _own_forward(wrapped)
        compiled = _compiled_entry(wrapped, rb, dynamic)
        ref = weakref.ref(wrapped)  # Note [No reference cycle]

        def call(*args: Any, **kwargs: Any) -> Any:
            module = ref()  # alive: Module.__call__ holds it
            # Eval mode runs the module as written: no joint graph is planned for inference.
            if not module.training:
                return module._call_impl(*args, **kwargs)
            with distributed.remat_splits_ddp(rb):
                out = compiled(module, *args, **kwargs)
            return _finish(rb, out, 3)  # call <- Module.__call__ <- user

        call._remat_call = True  # type: ignore[attr-defined]  # see _remat_modules
        wrapped.__dict__["_compiled_call_impl"] = call
        wrapped.__dict__[_ORIGINAL] = model  # in __dict__: not a submodule, no state_dict keys
        wrapped.__dict__["train"] = types.MethodType(_train, _WeakSelf(wrapped))
        return wrapped
    if callable(model):
        compiled = _rethrow_remat_errors(torch.compile(model, backend=rb, dynamic=dynamic), model)

        @functools.wraps(model)
        def run(*args: Any, **kwargs: Any) -> Any:
            with distributed.remat_splits_ddp(rb):
                out = compiled(*args, **kwargs)
            return _finish(rb, out, 2)  # run <- user

        setattr(run, _ATTR, rb)
        return run  # type: ignore[return-value]
    raise RematError(
        f"remat: checkpoint expects an nn.Module or a callable, got {type(model).__name__}. "
        "Pass the model itself (remat.checkpoint(model)) or a function of tensors."
    )


def compiled_plans(model: Any) -> list[Plan]:
    """The plans of the graphs a ``checkpoint``-wrapped model has compiled so far, in capture
    order. Works through wrappers: a model that contains remat-wrapped modules (``DDP(wrapped)``,
    remat per block, FSDP2's ``fully_shard`` on either) gives each wrapped module's plans,
    modules in ``named_modules`` order (the outermost wrapped ones)."""
    if not isinstance(model, nn.Module):
        rb = getattr(model, _ATTR, None)
        subs = []
    else:
        subs = _remat_modules(model)
        rb = subs[0].__dict__[_ATTR] if len(subs) == 1 else None
    if rb is None and not subs:
        raise RematError(
            f"remat: compiled_plans expects a model returned by remat.checkpoint (or a module "
            f"containing one: remat per block, DDP, FSDP2), got {type(model).__name__} with no "
            "remat-wrapped module in it. Wrap it first: model = remat.checkpoint(model)."
        )
    if rb is not None:
        return list(rb.plans)
    return [p for m in subs for p in m.__dict__[_ATTR].plans]


# --- through wrappers: DDP, FSDP2, torch.compile, remat per block ----------------------------------


def _remat_modules(model: nn.Module) -> list[nn.Module]:
    """The outermost remat-wrapped modules in ``model`` (``model`` itself if it is one), in
    ``named_modules`` order. Raises if one of them can no longer run remat: torch.compile was
    applied over it (``torch.compile(wrapped)``: Dynamo inlines the module's ``forward`` and
    remat's backend never runs), or ``Module.compile()`` replaced its compiled call."""
    found: list[nn.Module] = []
    _visit(model, "", None, found, set())
    return found


def _visit(m: nn.Module, path: str, compiled_over: str | None, found: list[nn.Module], seen: set[int]) -> None:
    """``_remat_modules`` below ``m``. A module-level function: a nested one that calls itself
    is a reference cycle, which kept ``found``, and the modules in it, alive after
    ``_remat_modules`` returned, until the cycle collector ran (Note [No reference cycle])."""
    if id(m) in seen:
        return
    seen.add(id(m))
    if _ATTR in m.__dict__:
        if compiled_over is not None:
            _raise_compiled_over(compiled_over, path)
        if not getattr(m.__dict__.get("_compiled_call_impl"), "_remat_call", False):
            _raise_compiled_over(f"{path or type(m).__name__} (Module.compile())", path)
        found.append(m)
        return
    if compiled_over is None and isinstance(m._modules.get("_orig_mod"), nn.Module):  # OptimizedModule
        compiled_over = path or type(m).__name__
    for name, child in m._modules.items():
        if child is not None:
            _visit(child, f"{path}.{name}" if path else name, compiled_over, found, seen)


def _raise_compiled_over(where: str, path: str) -> None:
    raise RematError(
        f"remat: torch.compile was applied over a remat-wrapped module (compiled: {where}; "
        f"remat-wrapped: {path or 'the model'}). torch.compile inlines it and remat never plans it. "
        "Expected remat.checkpoint in place of torch.compile, not under it: in torchtitan's order, "
        "remat.checkpoint(block) for each block (it replaces both activation checkpointing and "
        "torch.compile), then fully_shard(block) for each block and fully_shard(model) on the root; "
        "or DDP(remat.checkpoint(model))."
    )


def _probe_blocks(model: nn.Module, subs: list[nn.Module], args: tuple, kwargs: dict, overrides: dict[str, Any],
                  want_frontier: bool) -> RematBackend:
    """Explain a model whose submodules are remat-wrapped (remat per block): run ``model`` once
    with each wrapped module's compiled call replaced by a probe with that module's options
    (restored afterwards); plans come back in call order. The rest of the model runs as written,
    FSDP2's hooks included (their collectives need every rank to call explain)."""
    merged = RematBackend(Options(), explain_only=True, want_frontier=want_frontier)

    def probe_call(sub: nn.Module) -> Callable[..., Any]:
        options = sub.__dict__[_ATTR].options
        given = {k: v for k, v in overrides.items() if v is not None}
        if given:
            options = dataclasses.replace(options, **given)
        probe = RematBackend(options, explain_only=True, want_frontier=want_frontier)
        compiled = _compiled_entry(sub, probe, options.dynamic)

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
def _untouched(model: Any, args: tuple, kwargs: dict) -> Iterator[None]:
    """Leave the model as it was: ``explain`` runs its forward once (Dynamo runs each captured
    graph, and the code between graph breaks, on the real tensors), which updates BatchNorm's
    running statistics and ``num_batches_tracked``, draws from the random generators (dropout)
    and could write parameters. Inside this context every parameter and buffer of ``model`` (and
    of tensors passed as inputs that are modules) is copied, and written back afterwards where it
    changed (its version counter moved or its values differ: kernels such as batch norm update
    running statistics without bumping the counter); ``.grad`` of each parameter is put back (the same tensor, with its
    values), and the CPU and CUDA generators are restored with ``torch.random.fork_rng``. The
    copies cost the model's parameter and buffer memory while the probe runs."""
    modules = [m for m in (model, *args, *kwargs.values()) if isinstance(m, nn.Module)]
    if not modules and not isinstance(model, nn.Module):
        owner = getattr(model, "__self__", None)  # a bound method of a module
        if isinstance(owner, nn.Module):
            modules.append(owner)
    tensors: dict[int, torch.Tensor] = {}
    for m in modules:
        for t in itertools.chain(m.parameters(), m.buffers()):
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


def _probe(model: Any, args: tuple, kwargs: dict, overrides: dict[str, Any], want_frontier: bool) -> RematBackend:
    if isinstance(model, nn.Module):
        subs = _remat_modules(model)
        if subs and subs[0] is not model:
            with _untouched(model, args, kwargs):
                probe = _probe_blocks(model, subs, args, kwargs, overrides, want_frontier)
            return _found_graphs(probe)
        rb = model.__dict__.get(_ATTR)
    elif callable(model):
        rb = getattr(model, _ATTR, None)
    else:
        raise RematError(
            f"remat: explain expects an nn.Module or a callable, got {type(model).__name__}. "
            "Call remat.explain(model, *example_inputs)."
        )
    options = rb.options if rb is not None else Options()
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        options = dataclasses.replace(options, **overrides)
    probe = RematBackend(options, explain_only=True, want_frontier=want_frontier)
    if isinstance(model, nn.Module):
        compiled = functools.partial(_compiled_entry(model, probe, options.dynamic), model)
    else:
        fn = getattr(model, "__wrapped__", model) if rb is not None else model
        compiled = _rethrow_remat_errors(torch.compile(fn, backend=probe, dynamic=options.dynamic), fn)
    with _untouched(model, args, kwargs), torch.enable_grad(), distributed.unsplit_by_ddp():
        compiled(*args, **kwargs)
    return _found_graphs(probe)


def _found_graphs(probe: RematBackend) -> RematBackend:
    if not probe.plans:
        raise RematError(
            "remat: explain found no training graph: nothing in this call requires grad (or "
            "the model is in a torch.no_grad() region). Pass inputs or parameters with "
            "requires_grad=True, as in training."
        )
    return probe


def explain(
    model: Any,
    *args: Any,
    budget: int | float | str | None = None,
    backend: str | None = None,
    policy: Any = None,
    device_model: Any = None,
    **kwargs: Any,
) -> Plan:
    """Plan ``model`` for these inputs without training: the same capture and solve path as
    ``checkpoint`` (with the wrapped model's options, or the defaults), returning the Plan.

    ``budget``, ``backend``, ``policy`` and ``device_model`` are ``checkpoint``'s options and
    override the wrapped model's where given; every other keyword argument goes to the model.
    The forward runs once, uncompiled, and the model is left as it was: parameters, buffers
    (BatchNorm statistics), ``.grad`` and the CPU/CUDA random generators are restored. Nothing
    is compiled or trained. An infeasible ``budget`` raises ``remat.InfeasibleBudgetError``
    here, before any training step.

    Through wrappers as ``compiled_plans``: a model containing remat-wrapped modules
    (``DDP(wrapped)``, remat per block under FSDP2) runs once as written, each wrapped module
    planned with its own options; their plans are combined in call order. The wrappers' forward
    runs too (FSDP2's all-gathers are collectives: call explain on every rank). Under DDP the
    model is planned as one graph, not split at gradient buckets as in training
    (``remat.distributed.unsplit_by_ddp``)."""
    overrides = {"budget": budget, "backend": backend, "policy": policy, "device_model": device_model}
    return Plan.combine(_probe(model, args, kwargs, overrides, want_frontier=False).plans)


def pareto(
    model: Any,
    *args: Any,
    backend: str | None = None,
    policy: Any = None,
    device_model: Any = None,
    **kwargs: Any,
) -> Frontier:
    """The memory/recompute frontier of ``model`` for these inputs: the default plan and every
    plan on the lower convex hull of (saved bytes, estimated recompute time), each with its
    predicted peak. Needs a single captured graph. Options and the model's state as in
    ``explain``."""
    overrides = {"backend": backend, "policy": policy, "device_model": device_model}
    probe = _probe(model, args, kwargs, overrides, want_frontier=True)
    if len(probe.plans) != 1 or probe.frontiers[0] is None:
        raise RematError(
            f"remat: pareto needs exactly one captured training graph, got {len(probe.plans)} "
            "(graph breaks split the model). Call remat.pareto on a part without graph breaks."
        )
    return Frontier(points=probe.frontiers[0], eager_peak_bytes=probe.plans[0].eager_peak_bytes,
                    peak_floor_bytes=probe.plans[0].peak_floor_bytes, default=probe.plans[0])
