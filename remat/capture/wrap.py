"""How a model reaches remat's backend: ``remat.checkpoint``'s wrapping of a module or a
function, and how a wrapped module is recognised again, also inside wrappers (DDP, FSDP2,
remat per block).

A wrapped module is a shallow copy of the user's module (sharing its parameters, buffers and
submodules) whose ``__dict__`` holds, besides the module's own state:

* ``_remat_backend``: its ``RematBackend`` (the options, the plans compiled so far);
* ``_compiled_call_impl``: the call ``nn.Module.__call__`` runs in place of ``forward``; in
  training mode it runs the module through ``torch.compile`` with remat's backend;
* ``forward``: a method of its own (Note [One frame per wrapped module]);
* ``train``: keeps the original's ``training`` flag in step;
* ``_remat_original``: the module it was copied from;
* ``__reduce_ex__`` and ``__deepcopy__``: a copy is wrapped anew (Note [Copies are wrapped anew]).

None of them refers to the module strongly (Note [No reference cycle]).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import sys
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .. import compat, distributed
from ..errors import RematError
from .dynamo_backend import RematBackend
from .dynamo_errors import model_error, quiet_fake_tensor_errors

__all__ = ["wrap_module", "wrap_function", "compiled_entry", "rethrow_remat_errors", "backend_of", "remat_modules"]

_ATTR = "_remat_backend"
_ORIGINAL = "_remat_original"
_COUNTER = itertools.count()


def rethrow_remat_errors(fn: Callable[..., Any], run_eagerly: Callable[..., Any],
                         takes_module: bool = False, logging_in_graph: bool = False) -> Callable[..., Any]:
    """Dynamo wraps backend exceptions in ``BackendCompilerFailed``; surface our own
    ``RematError`` unchanged so users see the ``remat:`` message first. When the model itself
    fails while Dynamo traces it (a wrong input shape) or while its compiled graphs run (an
    input of the wrong dtype), raise one ``remat:`` error naming the model's error
    (``dynamo_errors.model_error``; ``run_eagerly`` reproduces it without remat), and one when
    the model cannot take the inputs it is called with.
    With ``takes_module`` the first argument is the module (``_entry``), not one of the inputs
    the error lists. With ``logging_in_graph`` (a budget), logger calls do not split the graph
    (Note [Logging does not split the graph] in ``remat.compat``)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        logs = compat.logging_in_graph() if logging_in_graph else contextlib.nullcontext()  # HOOKS["ignore_logging"]
        try:
            with quiet_fake_tensor_errors(), logs:
                return fn(*args, **kwargs)
        except RematError:
            raise
        except Exception as e:
            inner: BaseException | None = e
            while inner is not None:
                if isinstance(inner, RematError):
                    raise inner.with_traceback(None) from None
                inner = getattr(inner, "inner_exception", None) or inner.__cause__
            if takes_module:
                module, inputs = args[0], args[1:]
                eager = functools.partial(run_eagerly, module)
                takes = None if module._forward_pre_hooks else module.forward  # a hook may change the inputs
            else:
                eager, inputs, takes = run_eagerly, args, run_eagerly
            user = model_error(e, eager, inputs, kwargs, takes)
            if user is not None:
                raise user from None
            raise

    return call


class _WeakSelf:
    """What the functions remat stores in a wrapped module's ``__dict__`` (``forward``, ``train``,
    ``__reduce_ex__``, ``__deepcopy__``) are bound to in place of the module: a weak reference to
    it. A deep copy of one of them is bound to a deep copy of the module, as a method bound to
    the module itself would be.

    Note [No reference cycle]: a wrapped module is freed by reference counting when its last
    reference goes (``del model``), not later by Python's cycle collector: a DDP module freed
    after its process group is destroyed can deadlock gloo's teardown (README: Tearing down).
    So nothing remat stores in the module's ``__dict__`` refers to the module strongly: the
    compiled call (``_compiled_call_impl``) holds a ``weakref.ref`` and passes the module to the
    compiled ``_entry`` as its first argument (a closure variable would be a strong reference);
    ``forward`` (Note [One frame per wrapped module]), ``train`` and the copy methods (Note
    [Copies are wrapped anew]) are bound to a ``_WeakSelf``.
    Dynamo traces the ``self.ref()`` call in ``forward``: it builds the referent with a source of
    its own (``VariableBuilder.wrap_weakref``, ``WeakRefVariable``: ``versions.HOOKS["dynamo_weakref"]``),
    and names the modules reached through it
    ``forward.__self__.ref().<path>``, which ``capture.clean_module_paths`` shortens. Nor may a
    function that outlives a call hold a module, and a nested function that calls itself is a
    cycle that holds what it refers to until the collector runs (``_visit``).
    ``tests/entry/test_no_cycle.py`` checks that ``del`` frees a wrapped module with the collector off.
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


def compiled_entry(module: nn.Module, backend: RematBackend, dynamic: bool | None) -> Callable[..., Any]:
    """``torch.compile`` of ``_entry(module)`` with remat's backend, raising ``remat:`` errors
    first (``rethrow_remat_errors``); call it with the module first, as the entry."""
    entry = _entry(module)
    return rethrow_remat_errors(torch.compile(entry, backend=backend, dynamic=dynamic), entry, takes_module=True,
                                logging_in_graph=backend.options.budget is not None)


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


def _turn_off_inner_checkpointing(model: nn.Module, stacklevel: int) -> None:
    """Hugging Face models with ``model.gradient_checkpointing_enable()`` set a
    ``gradient_checkpointing`` flag on their layers. remat decides what to recompute itself, so
    the flags are turned off (on the modules, which the original model shares), with a warning
    at the user's line, ``stacklevel`` frames up."""
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
        stacklevel=stacklevel + 1,
    )


def _train(self: _WeakSelf, mode: bool = True) -> nn.Module:
    """``train``/``eval`` of a wrapped module. The wrapper shares every submodule with the
    original but has its own top-level ``training`` flag: keep the original's in step, so that
    ``wrapped.eval()`` leaves no module of the original in training mode. (A method bound to the
    module's ``_WeakSelf``: Note [No reference cycle].)"""
    module = self.ref()
    nn.Module.train(module, mode)
    module.__dict__[_ORIGINAL].training = module.training
    return module


def wrap_module(model: nn.Module, rb: RematBackend) -> nn.Module:
    """``remat.checkpoint`` of a module: a shallow copy of ``model`` that trains through
    ``torch.compile`` with ``rb`` (see the module docstring). Warns (at the user's
    ``remat.checkpoint`` line) if Hugging Face gradient checkpointing was on."""
    _turn_off_inner_checkpointing(model, stacklevel=3)  # <- wrap_module <- checkpoint <- user
    wrapped = copy.copy(model)
    _install(wrapped, model, rb)
    return wrapped


def _install(wrapped: nn.Module, model: nn.Module, rb: RematBackend) -> None:
    """Make ``wrapped``, a copy of ``model``, train through ``rb``: what the module docstring
    lists, in its ``__dict__``."""
    wrapped.__dict__[_ATTR] = rb
    if "forward" not in wrapped.__dict__:  # Note [One frame per wrapped module]
        wrapped.__dict__["forward"] = _own_forward(wrapped)
    compiled = compiled_entry(wrapped, rb, rb.options.dynamic)
    ref = weakref.ref(wrapped)  # Note [No reference cycle]

    def call(*args: Any, **kwargs: Any) -> Any:
        module = ref()  # alive: Module.__call__ holds it
        # Eval mode runs the module as written: no joint graph is planned for inference.
        if not module.training:
            return module._call_impl(*args, **kwargs)
        rb.begin_step()  # Note [Step budget]
        with distributed.remat_splits_ddp(rb):
            out = compiled(module, *args, **kwargs)
        return _finish(rb, out, 3)  # call <- Module.__call__ <- user

    call._remat_call = True  # type: ignore[attr-defined]  # see remat_modules
    wrapped.__dict__["_compiled_call_impl"] = call
    wrapped.__dict__[_ORIGINAL] = model  # in __dict__: not a submodule, no state_dict keys
    weak = _WeakSelf(wrapped)
    wrapped.__dict__["train"] = types.MethodType(_train, weak)
    wrapped.__dict__["__reduce_ex__"] = types.MethodType(_reduce_ex, weak)
    wrapped.__dict__["__deepcopy__"] = types.MethodType(_deepcopy, weak)


# Note [Copies are wrapped anew]
# ``nn.Module.__getstate__`` drops ``_compiled_call_impl``, so a copy made from the module's
# state (``copy.deepcopy``, ``pickle``, ``torch.save``) kept ``_remat_backend`` (and the plans of
# the model it was copied from) but trained as plain eager, unplanned, and then looked to
# ``remat_modules`` like a module torch.compile was applied over; and pickling that state failed
# on the weak references of Note [No reference cycle]. So a wrapped module reduces itself
# (``__reduce_ex__``, an instance attribute, which ``copy`` and ``pickle`` look up on the
# object): to a new module of its class (``_unwrapped``) given its state less what remat
# installed (``_own_state``), the original and the options; once given that state (``_rewrap``,
# set as its own ``__setstate__`` until then), the new module is wrapped anew with a
# ``RematBackend`` of its own, which plans its graphs when it first trains. ``__deepcopy__`` does
# the same and shares the options (they are immutable) rather than copying them; pickling
# them pickles the policy's rules, and a rule whose function pickle cannot save (a lambda)
# raises a ``remat:`` error naming it (``policy.Rule.__reduce__``).

_INSTALLED = frozenset({_ATTR, _ORIGINAL, "_compiled_call_impl", "train", "__reduce_ex__", "__deepcopy__"})


def _own_state(module: nn.Module) -> Any:
    """The state its class gives ``module`` (``nn.Module.__getstate__``), less what remat
    installed in its ``__dict__``."""
    state = type(module).__getstate__(module)
    if not isinstance(state, dict):
        return state
    own_forward = isinstance(getattr(state.get("forward"), "__self__", None), _WeakSelf)
    return {k: v for k, v in state.items() if k not in _INSTALLED and not (k == "forward" and own_forward)}


def _reduction(module: nn.Module) -> tuple[Callable[..., nn.Module], tuple[type], dict[str, Any]]:
    state = {"module": _own_state(module), "original": module.__dict__[_ORIGINAL],
             "options": module.__dict__[_ATTR].options}
    return _unwrapped, (type(module),), state


def _reduce_ex(self: _WeakSelf, protocol: int) -> tuple[Callable[..., nn.Module], tuple[type], dict[str, Any]]:
    return _reduction(self.ref())


def _deepcopy(self: _WeakSelf, memo: dict[int, Any]) -> nn.Module:
    module = self.ref()
    make, args, state = _reduction(module)
    copied = make(*args)
    memo[id(module)] = copied
    options = state.pop("options")  # immutable: shared, not copied
    copied.__setstate__({**copy.deepcopy(state, memo), "options": options})  # _rewrap
    return copied


def _unwrapped(cls: type[nn.Module]) -> nn.Module:
    """A new, empty module of class ``cls``, to be given a wrapped module's state (``_rewrap``)."""
    module = cls.__new__(cls)
    module.__dict__["__setstate__"] = types.MethodType(_rewrap, _WeakSelf(module))
    return module


def _rewrap(self: _WeakSelf, state: dict[str, Any]) -> None:
    module = self.ref()
    del module.__dict__["__setstate__"]
    type(module).__setstate__(module, state["module"])
    _install(module, state["original"], RematBackend(state["options"]))


# Note [Pickling a wrapped function]
# pickle saves a function by its module and name, and ``functools.wraps`` gives the wrapper its
# function's: so ``g = remat.checkpoint(f)`` failed to pickle with a raw "not the same object as
# f". A wrapped function is a ``WrappedFunction``, which reduces itself by name when its module
# holds it under that name (``f = remat.checkpoint(f)``: unpickling finds it there, wrapped by
# the module's own code), and otherwise to its function (by name) and its options, wrapped anew
# when unpickled, with a ``RematBackend`` of its own that plans when it first runs. A function
# pickle cannot find by name (a lambda, a local function) raises a ``remat:`` error.


class WrappedFunction:
    """``remat.checkpoint`` of a function: calls ``fn`` through ``torch.compile`` with ``rb``;
    pickles as Note [Pickling a wrapped function] says."""

    def __init__(self, fn: Callable[..., Any], rb: RematBackend) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        setattr(self, _ATTR, rb)
        self._compiled = rethrow_remat_errors(torch.compile(fn, backend=rb, dynamic=rb.options.dynamic), fn,
                                              logging_in_graph=rb.options.budget is not None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rb = getattr(self, _ATTR)
        rb.begin_step()  # Note [Step budget]
        with distributed.remat_splits_ddp(rb):
            out = self._compiled(*args, **kwargs)
        return _finish(rb, out, 2)  # __call__ <- user

    def __reduce__(self) -> Any:
        fn, options = self._fn, getattr(self, _ATTR).options
        found = _by_name(fn)
        if found is self:
            return fn.__qualname__  # the module holds the wrapper under the function's name
        if found is not fn:
            raise RematError(
                f"remat: pickling a remat.checkpoint-wrapped function pickles its function by name, and "
                f"pickle cannot find {fn.__module__}.{fn.__qualname__} by that name (a lambda or a function "
                "defined inside another); got one. Define the function at module level, or pickle what it "
                "computes with instead (a model's state_dict).")
        return _wrap_again, (fn, options)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:  # a method, as a decorated function would be
        return self if obj is None else types.MethodType(self, obj)


def _by_name(fn: Callable[..., Any]) -> Any:
    """What ``fn``'s module holds under ``fn``'s qualified name (None if nothing)."""
    found: Any = sys.modules.get(fn.__module__)
    for part in fn.__qualname__.split("."):
        found = getattr(found, part, None)
    return found


def _wrap_again(fn: Callable[..., Any], options: Any) -> WrappedFunction:
    return WrappedFunction(fn, RematBackend(options))


def wrap_function(fn: Callable[..., Any], rb: RematBackend) -> Callable[..., Any]:
    """``remat.checkpoint`` of a function: a ``WrappedFunction`` that runs ``fn`` through
    ``torch.compile`` with ``rb``."""
    return WrappedFunction(fn, rb)


def backend_of(model: Any) -> RematBackend | None:
    """The ``RematBackend`` of a ``remat.checkpoint``-wrapped module or function (None if
    ``model`` is not one; a module containing wrapped ones is not)."""
    if isinstance(model, nn.Module):
        return model.__dict__.get(_ATTR)
    return getattr(model, _ATTR, None)


# --- through wrappers: DDP, FSDP2, torch.compile, remat per block ----------------------------------


def remat_modules(model: nn.Module) -> list[nn.Module]:
    """The outermost remat-wrapped modules in ``model`` (``model`` itself if it is one), in
    ``named_modules`` order. Raises if one of them can no longer run remat: torch.compile was
    applied over it (``torch.compile(wrapped)``: Dynamo inlines the module's ``forward`` and
    remat's backend never runs), or ``Module.compile()`` replaced its compiled call."""
    found: list[nn.Module] = []
    _visit(model, "", None, found, set())
    return found


def _visit(m: nn.Module, path: str, compiled_over: str | None, found: list[nn.Module], seen: set[int]) -> None:
    """``remat_modules`` below ``m``. A module-level function: a nested one that calls itself
    is a reference cycle, which kept ``found``, and the modules in it, alive after
    ``remat_modules`` returned, until the cycle collector ran (Note [No reference cycle])."""
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
