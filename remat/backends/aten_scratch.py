"""The scratch ATen's library kernels hold while they run, beyond their outputs: both backends
run these kernels (the uncompiled backend directly, Inductor as extern kernels), so the peak
simulator adds it for each (``remat.core.peak.Schedule.workspace``), and so does the reading of
Inductor's compiled memory plan (``remat.backends.inductor.wrapper_reading``)."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..analysis import cost
from ..analysis.ops import op_name
from .cuda_scratch import Strides, cuda_library_scratch

__all__ = ["scratch_bytes", "cpu_convolution_scratch", "cpu_dropout_scratch", "cpu_flash_attention_scratch"]


def scratch_bytes(node: fx.Node, strides: Strides | None = None) -> int:
    """Scratch bytes an ATen kernel holds while it runs, beyond its outputs. CPU convolutions:
    operand copies (``cpu_convolution_scratch``); CUDA ones: cuDNN's workspace, measured on the
    device with the operands laid out in ``strides`` where given, the backend's layouts (Note
    [Measured library scratch] in ``remat.backends.cuda_scratch``). CPU flash attention: per-thread blocks
    (``cpu_flash_attention_scratch``). Other attention backward kernels accumulate the query
    gradient in float32 (FlashAttention's ``dq_accum``): 4 bytes per element of it. CPU
    ``native_dropout``: a tensor of its input's size and dtype (``cpu_dropout_scratch``)."""
    op = op_name(node)
    if op in ("aten.convolution.default", "aten.convolution_backward.default"):
        return cpu_convolution_scratch(node) or cuda_library_scratch(node, strides)
    if op == "aten.native_dropout.default":
        return cpu_dropout_scratch(node)
    if op.startswith("aten._scaled_dot_product_flash_attention_for_cpu"):
        return cpu_flash_attention_scratch(node, backward=op.endswith("_backward.default"))
    if not (op.startswith("aten.") and "attention" in op and "backward" in op):
        return 0
    val = node.meta.get("val")
    first = val[0] if isinstance(val, (tuple, list)) and val else val
    return 4 * cost.numel(first) if isinstance(first, torch.Tensor) else 0


def cpu_dropout_scratch(node: fx.Node) -> int:
    """ATen's CPU ``native_dropout`` in training holds a tensor of its input's size and dtype
    beside its two outputs while it runs: measured with the profiler on a 512 x 256 input, 0.50,
    0.25 and 1.00 MiB in float32, bfloat16 and float64. It matters where the op runs at the
    step's peak: recomputed in the backward (Note [Replayed random ops]). 0 on other devices and
    in evaluation."""
    x = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], fx.Node) else None
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
    if not isinstance(x, torch.Tensor) or x.device.type != "cpu" or train is False:
        return 0
    return cost.nbytes(x)


def cpu_convolution_scratch(node: fx.Node) -> int:
    """ATen's CPU convolutions (oneDNN) copy their operands into blocked layouts: the forward
    the larger of its input and output, the backward its output gradient and its input.
    Measured with the profiler (``versions.HOOKS["aten_cpu_convolution_scratch"]``: within 0.02
    MiB; a 3-channel input is padded, up to 0.35 MiB more). 0 on other devices,
    where the library's workspace is not modelled."""
    val = node.meta.get("val")
    ins = [a.meta.get("val") for a in node.args[:2] if isinstance(a, fx.Node)]
    if not ins or not isinstance(ins[0], torch.Tensor) or ins[0].device.type != "cpu":
        return 0
    if op_name(node) == "aten.convolution_backward.default":
        return sum(cost.nbytes(t) for t in ins[:2] if isinstance(t, torch.Tensor))
    return max(cost.nbytes(ins[0]), cost.nbytes(val) if isinstance(val, torch.Tensor) else 0)


def cpu_flash_attention_scratch(node: fx.Node, backward: bool) -> int:
    """ATen's CPU flash attention (``native/cpu/FlashAttentionKernel.cpp``) splits queries into
    blocks of 32, 64 or 256 rows (sequences under 192, under 768, longer) and keys into blocks
    of 512, and gives each thread float32 buffers: the forward a score block, its row max and
    sum and an output block; the backward a score block and its gradient (plus a row sum), and
    bf16/fp16 copies of the score blocks for low-precision inputs; the backward also copies an
    output gradient that is not contiguous in its layout. Checked against the profiler
    (``versions.HOOKS["aten_cpu_flash_attention_scratch"]``, tests/backends/test_fusion_peak.py)."""
    ins = [a.meta.get("val") for a in node.args[:4] if isinstance(a, fx.Node)]
    query = ins[1] if backward and len(ins) > 1 else (ins[0] if ins else None)
    key = ins[2] if backward and len(ins) > 2 else (ins[1] if len(ins) > 1 else None)
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor) or query.dim() != 4:
        return 0
    q_len, head, kv_len = cost.shape(query)[2], cost.shape(query)[3], cost.shape(key)[2]
    q_split = min(256 if q_len >= 768 else 64 if q_len >= 192 else 32, q_len)
    kv_split = min(512, kv_len)
    low = query.dtype in (torch.bfloat16, torch.float16)
    accum = 8 if query.dtype == torch.float64 else 4
    if backward:
        per_thread = 2 * q_split * kv_split * accum + q_split * accum + (2 * q_split * kv_split * 2 if low else 0)
        grad_out = ins[0]
        copy = 0  # the kernel makes grad_out contiguous in (batch, sequence, head, dim) order
        if isinstance(grad_out, torch.Tensor) and not grad_out.transpose(1, 2).is_contiguous():
            copy = cost.nbytes(grad_out)
        return torch.get_num_threads() * per_thread + copy
    per_thread = (q_split * kv_split + 2 * q_split + q_split * head) * accum + (q_split * kv_split * 2 if low else 0)
    return torch.get_num_threads() * per_thread
