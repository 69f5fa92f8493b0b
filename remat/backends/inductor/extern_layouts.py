"""The layouts Inductor gives an extern kernel's operands, where they are not the traced ones.

Note [Operands as the backend lays them out]
A library kernel's scratch can depend on its operands' layouts: ATen's cuDNN convolution picks
one memory format for the call (channels-last where the input or the weight is) and copies an
operand laid out otherwise into it first, and that copy is scratch the call holds while it runs.
The traced strides are eager's; Inductor passes its own:
- ``aten.convolution``: Inductor's lowering (``kernel/conv.py: convolution``) requires the input
  and the weight in the stride order of the output ATen computes for them (``conv_layout``),
  channels-last everywhere under its layout optimization (``channels_last``): neither is copied
  inside the kernel. EfficientNet-B0's joint graph traces most convolutions' inputs in eager's
  contiguous strides beside channels-last weights, where ATen would copy the input; its compiled
  step hands every one channels-last (``benchmarks/scratch_check.py`` lists each call's operands).
- ``aten.convolution_backward``: a fallback Inductor constrains to the fx strides
  (``constrain_to_fx_strides``): the traced ones.
Before compiling, the simulator asks for these (``operand_strides``); the reading of Inductor's
memory plan takes them from the extern kernel's inputs as compiled (``compiled_operand_strides``).
Both follow ``versions.HOOKS["extern_operand_layouts"]``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ...analysis.ops import op_name
from ...versions import drift

__all__ = ["compiled_operand_strides", "dense_strides", "operand_strides", "stride_order"]

CHANNELS_LAST_ORDER = (3, 0, 2, 1)
"""A 4-D tensor's stride order channels-last (0: the innermost dimension), as Inductor writes it."""


def stride_order(strides: tuple[int, ...]) -> tuple[int, ...]:
    """Each dimension's rank among ``strides``, smallest first (0: innermost), ties by position."""
    ranked = sorted(range(len(strides)), key=lambda i: strides[i])
    order = [0] * len(strides)
    for rank, dim in enumerate(ranked):
        order[dim] = rank
    return tuple(order)


def dense_strides(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a dense tensor of ``shape`` whose dimensions nest in ``order``."""
    strides = [0] * len(shape)
    step = 1
    for dim in sorted(range(len(shape)), key=lambda i: order[i]):
        strides[dim] = step
        step *= max(int(shape[dim]), 1)
    return tuple(strides)


def operand_strides(node: fx.Node, channels_last: bool) -> tuple[tuple[int, ...] | None, ...] | None:
    """The strides Inductor passes ``node``'s tensor operands on a GPU, in order, None for one
    that keeps its traced strides; None where all do (Note [Operands as the backend lays them
    out]). ``channels_last``: Inductor optimizes the graph's layout."""
    if op_name(node) != "aten.convolution.default":
        return None
    out = node.meta.get("val")
    vals = [a.meta.get("val") for a in node.args[:2] if isinstance(a, fx.Node)]
    if not isinstance(out, torch.Tensor) or len(vals) != 2 or not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    if any(isinstance(x, torch.SymInt) for v in (out, *vals) for x in (*v.shape, *v.stride())):
        return None
    order = CHANNELS_LAST_ORDER if channels_last and out.dim() == 4 else stride_order(tuple(out.stride()))
    return tuple(dense_strides(tuple(v.shape), order) for v in vals)


def compiled_operand_strides(kernel: Any) -> tuple[tuple[int, ...] | None, ...] | None:
    """The strides of the tensor inputs of Inductor's extern kernel ``kernel`` as compiled, in
    order (None for one whose strides are not plain integers); None when it names none."""
    if not hasattr(kernel, "inputs"):
        drift("extern_operand_layouts", "torch._inductor.ir.ExternKernel.inputs")
        return None
    inputs = kernel.inputs
    if not inputs:
        return None
    strides: list[tuple[int, ...] | None] = []
    for inp in inputs:
        try:
            st = tuple(int(s) for s in inp.get_stride())
        except Exception:  # noqa: BLE001 - a symbolic stride, or an input that is no tensor buffer
            st = None
        strides.append(st)
    return tuple(strides)
