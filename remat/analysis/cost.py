"""Bytes and recompute costs of values, from fake-tensor metadata, priced with a roofline
device model (``remat.device.DeviceModel``). Symbolic sizes use their size hints (the sizes of
the example inputs Dynamo traced with), never guards: a plan stays valid for every size."""

from __future__ import annotations

import enum
import operator

import torch
import torch.fx as fx

from .. import compat
from ..device import DeviceModel
from ..policy import OpInfo
from .ops import schema_arg

__all__ = ["hint", "numel", "nbytes", "shape", "dtype_name", "flops", "Work", "recompute_seconds",
           "recompute_estimate", "run_seconds", "fused_seconds"]


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


# --- recompute cost model ----------------------------------------------------------------------


def _dims(val: object) -> tuple[int, ...]:
    return shape(val)


def flops(op: str, out: object, ins: list[object], *, causal: bool = False) -> int:
    """Estimated FLOPs of one op from its output and input tensor metadata.

    Matmuls count 2 per multiply-add; convolutions 2 x output elements x (input channels /
    groups x kernel size); attention 4 x batch x heads x queries x keys x head dim, half of it
    when ``causal`` (the fused kernels skip the blocks above the diagonal); every other op one
    per output element (reductions: one per input element)."""
    packet = ".".join(op.split(".")[:2])
    o = _dims(out)
    shapes = [_dims(v) for v in ins if isinstance(v, torch.Tensor)]
    if packet in ("aten.mm", "aten.addmm") and len(o) == 2 and shapes:
        a = shapes[-2] if packet == "aten.addmm" and len(shapes) >= 3 else shapes[0]
        k = a[-1] if a else 0
        return 2 * o[0] * o[1] * k
    if packet in ("aten.bmm", "aten.baddbmm") and len(o) == 3 and shapes:
        a = shapes[-2] if packet == "aten.baddbmm" and len(shapes) >= 3 else shapes[0]
        return 2 * o[0] * o[1] * o[2] * (a[-1] if a else 0)
    if packet in ("aten._grouped_mm", "aten._scaled_grouped_mm") and len(shapes) >= 2 and shapes[0]:
        # Mixture-of-experts GEMMs, one per group: every output element sums over the first
        # operand's last dim, except when both operands are 2-D (the weight gradient: a 3-D output,
        # one matrix per group, whose groups together sum over the tokens once).
        k = shapes[0][-1]
        per_group = numel(out) // o[0] if len(shapes[0]) == len(shapes[1]) == 2 and len(o) == 3 and o[0] else numel(out)
        return 2 * per_group * k
    if packet in ("aten.convolution", "aten._convolution") and len(shapes) >= 2:
        w = shapes[1]
        per_out = 1
        for s in w[1:]:
            per_out *= s
        return 2 * numel(out) * per_out
    if "attention" in packet and shapes and len(shapes[0]) == 4:
        b, h, lq, d = shapes[0]
        lk = shapes[1][2] if len(shapes) > 1 and len(shapes[1]) == 4 else lq
        full = 4 * b * h * lq * lk * d
        return full // 2 if causal else full
    if isinstance(out, (tuple, list)):
        return sum(numel(v) for v in out if isinstance(v, torch.Tensor))
    return max(numel(out), max((numel(v) for v in ins if isinstance(v, torch.Tensor)), default=0))


class Work(enum.Enum):
    """How recomputing an op in the backward costs time (``recompute_seconds``)."""

    VIEW = "view"
    """Free: a view or a getitem."""
    POINTWISE = "pointwise"
    """Fused into its consumer: compute only, no memory round trip."""
    REDUCTION = "reduction"
    """Reads its input once."""
    HEAVY = "heavy"
    """Matmul, convolution, attention: compute at the matmul rate, or reading its inputs and
    writing its output, whichever is longer."""


def recompute_seconds(kind: Work, n_flops: int, bytes_in: int, bytes_out: int, dev: DeviceModel) -> float:
    """Roofline time to recompute one op of ``kind`` inside the backward (see ``Work``)."""
    if kind is Work.VIEW:
        return 0.0
    if kind is Work.POINTWISE:
        return n_flops / dev.vector_flops
    if kind is Work.REDUCTION:
        return max(n_flops / dev.vector_flops, bytes_in / dev.bandwidth)
    return max(n_flops / dev.matmul_flops, (bytes_in + bytes_out) / dev.bandwidth)


def _io(node: fx.Node) -> tuple[list[object], int, int]:
    """``node``'s input values, the bytes it reads and the bytes it writes."""
    ins = [a.meta.get("val") for a in node.all_input_nodes]
    out = node.meta.get("val")
    bytes_out = sum(nbytes(v) for v in out) if isinstance(out, (tuple, list)) else nbytes(out)
    return ins, sum(nbytes(v) for v in ins), bytes_out


def run_seconds(node: fx.Node, dev: DeviceModel) -> float:
    """Roofline time of running ``node`` as its own kernel (the uncompiled backend runs every op
    so): its FLOPs at the matmul rate for a matmul, convolution or attention and at the vector
    rate otherwise, or reading its inputs and writing its output, whichever is longer; 0 for a
    placeholder or a getitem (views, which own no storage, are zeroed by the caller). The step's
    timeline for hiding offload copies (``remat.planning.offload``)."""
    if node.op != "call_function" or node.target is operator.getitem:
        return 0.0
    name = str(node.target)
    out = node.meta.get("val")
    if not isinstance(out, (torch.Tensor, tuple, list)):
        return 0.0
    ins, bytes_in, bytes_out = _io(node)
    heavy = any(k in name for k in ("mm", "convolution", "attention"))
    rate = dev.matmul_flops if heavy else dev.vector_flops
    return max(flops(name, out, ins) / rate, (bytes_in + bytes_out) / dev.bandwidth)


def fused_seconds(node: fx.Node, dev: DeviceModel) -> float:
    """Roofline time of ``node`` inside Inductor's code: a matmul, convolution or attention (an
    extern kernel, which reads its inputs and writes its output) as ``run_seconds``; any other op
    its FLOPs at the vector rate, no memory traffic (fused with its neighbours). A lower bound on
    the fused kernels' time, which still read what they load and write what they store: the
    compiled step's timeline for hiding offload copies (``remat.planning.offload``, Note [Offload
    in a plan])."""
    if node.op != "call_function" or node.target is operator.getitem:
        return 0.0
    name = str(node.target)
    if any(k in name for k in ("mm", "convolution", "attention")):
        return run_seconds(node, dev)
    out = node.meta.get("val")
    if not isinstance(out, (torch.Tensor, tuple, list)):
        return 0.0
    ins, _, _ = _io(node)
    return flops(name, out, ins) / dev.vector_flops


def _work(op: OpInfo) -> Work:
    if op.is_view or op.op == "getitem":
        return Work.VIEW
    if op.is_matmul or op.is_attention:
        return Work.HEAVY
    return Work.REDUCTION if op.reduction_ratio else Work.POINTWISE


def recompute_estimate(node: fx.Node, op: OpInfo, dev: DeviceModel) -> tuple[int, float]:
    """``(flops, seconds)`` to recompute the forward op ``node`` (described by ``op``) in a fused
    backward kernel; a view's flops count 0."""
    ins, bytes_in, bytes_out = _io(node)
    out = node.meta.get("val")
    kind = _work(op)
    causal = op.is_attention and bool(schema_arg(node, "is_causal", False))
    f = 0 if kind is Work.VIEW else flops(op.op, out, ins, causal=causal)
    return int(f), recompute_seconds(kind, f, bytes_in, bytes_out, dev)
