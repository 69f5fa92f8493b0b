"""Bytes of values, from fake-tensor metadata. Symbolic sizes use their size hints (the sizes
of the example inputs Dynamo traced with), never guards: a plan stays valid for every size."""

from __future__ import annotations

import torch

from . import compat

__all__ = ["hint", "numel", "nbytes", "shape", "dtype_name"]


def hint(x: object) -> int:
    """A concrete int for an int or a SymInt: its size hint (the example input's size), or a
    fallback for data-dependent sizes (see ``compat.size_hint``)."""
    if isinstance(x, torch.SymInt):
        return compat.size_hint(x)
    return int(x)  # type: ignore[call-overload]


def numel(val: object) -> int:
    if isinstance(val, torch.Tensor):
        return hint(val.numel())
    return 0


def nbytes(val: object) -> int:
    """Storage bytes a tensor value keeps alive (0 for non-tensors)."""
    if isinstance(val, torch.Tensor):
        return numel(val) * val.element_size()
    return 0


def shape(val: object) -> tuple[int, ...]:
    if isinstance(val, torch.Tensor):
        return tuple(hint(s) for s in val.shape)
    return ()


def dtype_name(val: object) -> str:
    if isinstance(val, torch.Tensor):
        return str(val.dtype).removeprefix("torch.")
    if isinstance(val, torch.SymInt):
        return "SymInt"
    return type(val).__name__ if val is not None else ""
