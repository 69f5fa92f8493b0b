"""When the user's own model fails while Dynamo traces it (a wrong input shape, say), show one
``remat:`` error about the model instead of Dynamo's trace and fake-tensor log lines.

Private torch names used here (``versions.HOOKS["fake_tensor_errors"]``; read defensively): the exception class
``torch._dynamo.exc.TorchRuntimeError`` (Dynamo failed to run an op on fake tensors) and the
logger ``torch._subclasses.fake_tensor``, which logs the meta kernel's traceback at ERROR level
before Dynamo raises.
"""

from __future__ import annotations

import contextlib
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


def _is_tracing_failure(e: BaseException) -> bool:
    exc = getattr(getattr(torch, "_dynamo", None), "exc", None)
    cls = getattr(exc, "TorchRuntimeError", None)
    return cls is not None and isinstance(e, cls)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def model_error(e: BaseException, run_eagerly: Callable[..., Any], args: tuple, kwargs: dict) -> RematError | None:
    """If ``e`` is Dynamo failing to trace an op of the model and the model raises without remat
    too (``run_eagerly``, under ``no_grad``), the ``remat:`` error that names the model's own
    error, its line and the inputs; otherwise None (``e`` is remat's or Dynamo's problem)."""
    if not _is_tracing_failure(e):
        return None
    try:
        with torch.no_grad():
            run_eagerly(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - the model's own error, reported below
        frame = user_frame(err.__traceback__)
        where = f" at {frame[0]}:{frame[1]} ({frame[2]})" if frame else ""
        inputs = ", ".join([_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()])
        first = (str(err).strip().splitlines() or [""])[0].rstrip(".") + "."
        return RematError(
            f"remat: the model raises {type(err).__name__}{where} on these inputs, also without remat, so "
            f"nothing was planned: {first} Inputs: ({inputs}). Fix the inputs' shapes or dtypes (or the "
            "model): calling the model without remat shows the same error."
        )
    return None
