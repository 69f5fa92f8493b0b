"""When the user's own model fails while Dynamo traces it (a wrong input shape, say) or while its
compiled graphs run (an input of the wrong dtype), or cannot take the inputs it is called with,
show one ``remat:`` error about the model instead of Dynamo's trace and fake-tensor log lines.

Private torch names used here (``versions.HOOKS["fake_tensor_errors"]``; read defensively): the
exception class ``torch._dynamo.exc.TorchRuntimeError`` (Dynamo failed to run an op on fake
tensors), its base ``TorchDynamoException`` (Dynamo's and the backends' own failures), and the
logger ``torch._subclasses.fake_tensor``, which logs the meta kernel's traceback at ERROR level
before Dynamo raises.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import RematError
from ..logs import user_frame

__all__ = ["quiet_fake_tensor_errors", "model_error"]

_FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"
_state = threading.local()


class _DropMetaFailures(logging.Filter):
    """Drops the fake-tensor "failed while attempting to run meta" record inside remat's calls
    (the error itself still reaches the caller, as a ``remat:`` error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(_state, "depth", 0):
            return True
        return not str(record.msg).startswith("failed while attempting to run meta")


logging.getLogger(_FAKE_TENSOR_LOGGER).addFilter(_DropMetaFailures())


@contextlib.contextmanager
def quiet_fake_tensor_errors() -> Iterator[None]:
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _is_dynamo(e: BaseException, name: str) -> bool:
    exc = getattr(getattr(torch, "_dynamo", None), "exc", None)
    cls = getattr(exc, name, None)
    return cls is not None and isinstance(e, cls)


def _is_tracing_failure(e: BaseException) -> bool:
    return _is_dynamo(e, "TorchRuntimeError")


def _may_be_the_models(e: BaseException) -> bool:
    """Whether ``e`` may be the model's own error: Dynamo failing to trace one of its ops, or an
    error raised by its code or a kernel it runs (a dtype mismatch inside the compiled
    forward); not Dynamo's or a backend's own failure, nor running out of memory."""
    if _is_tracing_failure(e):
        return True
    return not _is_dynamo(e, "TorchDynamoException") and not isinstance(e, torch.OutOfMemoryError)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def _inputs(args: tuple, kwargs: dict) -> str:
    return ", ".join([_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()])


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0].rstrip(".") + "."


def _unbound(takes: Callable[..., Any], args: tuple, kwargs: dict) -> RematError | None:
    """The ``remat:`` error for a call whose inputs ``takes``'s signature cannot bind (no inputs
    at all, say: ``remat.explain(model)``); None if they bind or it has no signature."""
    try:
        signature = inspect.signature(takes)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        given = f"({_inputs(args, kwargs)})" if args or kwargs else "no inputs"
        return RematError(
            f"remat: the model takes {signature} and was called with {given}: {_first_line(err)} Nothing was "
            "planned. Pass the inputs of a training step after the model, as the model takes them: "
            "remat.explain(model, x) plans model(x), and a wrapped model is called as the model is."
        )
    return None


def model_error(e: BaseException, run_eagerly: Callable[..., Any], args: tuple, kwargs: dict,
                takes: Callable[..., Any] | None = None) -> RematError | None:
    """If the model cannot take these inputs (a ``TypeError`` where ``takes``, its ``forward``,
    cannot bind them), or the model raises without remat too (``run_eagerly``, under
    ``no_grad``): where Dynamo failed to trace one of its ops, any error; where ``e`` came from
    the model's code or a kernel (``_may_be_the_models``), an error of ``e``'s type. Then the
    ``remat:`` error that names the model's own error, its line and the inputs; otherwise None
    (``e`` is remat's or Dynamo's problem). Only a failing call runs the model again."""
    if isinstance(e, TypeError) and takes is not None:
        unbound = _unbound(takes, args, kwargs)
        if unbound is not None:
            return unbound
    if not _may_be_the_models(e):
        return None
    tracing = _is_tracing_failure(e)
    try:
        with torch.no_grad():
            run_eagerly(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - the model's own error, reported below
        if not tracing and type(err) is not type(e):
            return None
        frame = user_frame(err.__traceback__)
        where = f" at {frame[0]}:{frame[1]} ({frame[2]})" if frame else ""
        inputs = _inputs(args, kwargs)
        first = _first_line(err)
        whose = "so nothing was planned" if tracing else "so the error is the model's, not remat's"
        return RematError(
            f"remat: the model raises {type(err).__name__}{where} on these inputs, also without remat, {whose}: "
            f"{first} Inputs: ({inputs}). Fix the inputs' shapes or dtypes (or the model): calling the model "
            "without remat shows the same error."
        )
    return None
