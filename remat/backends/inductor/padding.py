"""Inductor's padded strides, as the peak model reads them (Note [Padded strides]): the bytes a
buffer Inductor pads takes, and the views of it Inductor copies before an extern kernel reads
them. ``padded_strides`` and ``storage_elements`` are arithmetic; ``padding_facts`` reads a joint
graph's fx nodes once (``versions.HOOKS["comprehensive_padding"]``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

from ...analysis.halves import is_tangent
from ...analysis.op_facts import view_root
from ...analysis.ops import op_name, packet
from ...compat import OpOverload
from ...versions import drift
from .facts import Kind

__all__ = ["PaddingRules", "padded_strides", "storage_elements", "padding_rules", "padding_facts"]

# Note [Padded strides]
# On a GPU Inductor pads the strides of the buffers whose layout it chooses (a pointwise or
# reduction kernel's output, ``ir.FlexibleLayout``; ``config.comprehensive_padding``, on by
# default, off on a CPU under ``config.disable_padding_cpu``): going from the innermost dimension
# out, a stride above ``config.padding_stride_threshold`` elements (1024) that is not a multiple
# of ``config.padding_alignment_bytes`` (128) is rounded up to one (``ir.Layout._pad_strides``).
# Channels-last buffers are left alone (``config.pad_channels_last``), and so are the values a
# convolution reads without a reduction between (``graph.py: mark_nodes_dislike_padding``) and
# the graph's user-visible outputs. An extern kernel's output keeps the library's layout.
#
# Two things follow for the peak. A padded buffer is larger: Swin-T's (B * windows, 49, 96)
# windows are 49 x 96 = 4,704 elements a row, padded to 4,736 (73.5 -> 74.0 MiB at batch 128 in
# bf16), and a freed buffer is reused only for one of its padded size. And a view that merges a
# padded dimension with the next cannot be expressed in strides over the padded buffer: a
# pointwise kernel reads it through index arithmetic, but an extern kernel needs a strided
# tensor, so Inductor copies the view into a buffer of its own first (``ExternKernel.realize_input``:
# ``convert_to_reinterpret_view`` fails, ``copy_input``). Swin-T's backward reshapes each saved
# window input to (B * windows * 49, 96) for its linear layers' weight gradients: a 73.5 MiB copy
# made before the matmul, after which the saved value (its last reader now the copy) is freed.
# Where the view has several readers and one is a matmul (or a convolution's backward), Inductor
# gives it its traced strides when it lowers the view (``GraphLowering.run_node``,
# ``need_fixed_layout``): one copy, which every reader reads and further views view (Swin-T's
# qkv gradient, viewed as rows for the weight's gradient and transposed for the input's). On a
# GPU a padded value only its copy reads is computed inside the copy's kernel, never allocated.
# The step model knew neither: at ``budget=0.3`` its estimate of the backward's peak, which
# decides buffer reuse (Note [Reuse estimate]), was 73.5 MiB above Inductor's, and it reused a
# different buffer than Inductor did (H100, the oldest verified torch: simulated 1,927 MiB, read 1,819, measured
# 1,827; Inductor's CUDA code generated on a CPU, ``benchmarks/gpu_offline.py --dropout``).
# ``NodeLowering.padded_nbytes`` is the padded size, ``NodeLowering.copy_nbytes`` the copy's; the
# fusion model stores such a copy for an extern reader of a view whose base is padded.


@dataclass(frozen=True)
class PaddingRules:
    """Inductor's padding settings for one graph's device (``padding_rules``)."""

    align_bytes: int
    """``config.padding_alignment_bytes``: a padded stride is a multiple of this many bytes."""
    threshold: int
    """``config.padding_stride_threshold``: strides of at most this many elements are not padded."""


def padded_strides(size: Sequence[int], strides: Sequence[int], itemsize: int,
                   rules: PaddingRules) -> tuple[int, ...] | None:
    """The strides Inductor gives a buffer of ``size`` laid out in ``strides``' order, or None
    where it pads nothing (Note [Padded strides])."""
    n = len(size)
    if n < 2 or not rules.align_bytes or itemsize <= 0:
        return None
    align = max(rules.align_bytes // itemsize, 1)
    fill = sorted(range(n), key=lambda d: (strides[d], d))  # innermost first
    new = [0] * n
    new[fill[0]] = 1
    padded = False
    for prev, d in zip(fill, fill[1:]):
        stride = new[prev] * size[prev]
        if stride > rules.threshold and stride % align:
            stride = -(-stride // align) * align
            padded = True
        new[d] = stride
    return tuple(new) if padded else None


def storage_elements(size: Sequence[int], strides: Sequence[int]) -> int:
    """Elements of the storage a tensor of ``size`` and ``strides`` spans (0 if it is empty)."""
    if any(s == 0 for s in size):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(size, strides))


def padding_rules(device: torch.device) -> PaddingRules | None:
    """Inductor's padding on ``device``, or None where it pads nothing."""
    from torch._inductor import config

    names = ("comprehensive_padding", "disable_padding_cpu", "pad_channels_last", "padding_alignment_bytes",
             "padding_stride_threshold")
    missing = [n for n in names if not hasattr(config, n)]
    if missing:
        drift("comprehensive_padding", ", ".join(f"torch._inductor.config.{n}" for n in missing))
        return None
    if not config.comprehensive_padding or (device.type == "cpu" and config.disable_padding_cpu):
        return None
    return PaddingRules(int(config.padding_alignment_bytes), int(config.padding_stride_threshold))


_STORED = (Kind.POINTWISE, Kind.REDUCTION, Kind.OUTER_REDUCTION, Kind.RANDOM)
_DISLIKE = ("aten.convolution", "aten.convolution_backward", "aten._scaled_mm")
_LIKE = ("aten.var_mean", "aten.sum", "aten.mean", "aten.prod", "aten.any", "aten.amin", "aten.amax", "aten.min",
         "aten.max", "aten.argmin", "aten.argmax", "aten.scatter_reduce")


def _packet(node: fx.Node) -> str:
    """``node``'s op packet as ``namespace.name`` ("" for a placeholder or a non-op target such as
    ``getitem``, which Inductor's marking passes over)."""
    return packet(op_name(node)) if isinstance(node.target, OpOverload) else ""


def _disliked(nodes: Sequence[fx.Node], starts: set[fx.Node]) -> set[fx.Node]:
    """What Inductor's ``mark_nodes_dislike_padding`` marks from the convolutions among
    ``starts``: each one and, from each marked node back, every operand that is an op and not a
    reduction (Note [Padded strides])."""
    out: set[fx.Node] = set()
    for cur in reversed(nodes):
        if cur in starts and _packet(cur) in _DISLIKE:
            out.add(cur)
        if cur in out:
            for prior in cur.all_input_nodes:
                p = _packet(prior)
                if p and p not in _LIKE:
                    out.add(prior)
    return out


def _returned(nodes: Sequence[fx.Node]) -> set[fx.Node]:
    """The graph's outputs (and the bases of those that are views): Inductor keeps the strides
    it traced for them."""
    out: set[fx.Node] = set()
    for n in nodes:
        if any(u.op == "output" for u in n.users):
            out.update((n, view_root(n)))
    return out


def _backward(nodes: Sequence[fx.Node]) -> set[fx.Node]:
    """The joint graph's backward: the tangents and what depends on one."""
    out: set[fx.Node] = set()
    for n in nodes:
        if is_tangent(n) or any(u in out for u in n.all_input_nodes):
            out.add(n)
    return out


def _tensor(node: fx.Node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.layout is not torch.strided:
        return None
    if not all(isinstance(x, int) for x in (*val.shape, *val.stride())):
        return None
    return val


def _padded(val: torch.Tensor, rules: PaddingRules) -> tuple[int, ...] | None:
    if val.dim() in (4, 5) and val.is_contiguous(memory_format=torch.channels_last if val.dim() == 4
                                                 else torch.channels_last_3d) and not val.is_contiguous():
        return None
    return padded_strides(tuple(val.shape), tuple(val.stride()), val.element_size(), rules)


def _copy_bytes(view: fx.Node, root: fx.Node, strides: tuple[int, ...], rules: PaddingRules) -> int:
    """Bytes of the copy Inductor makes of ``view`` for an extern kernel when ``root`` is stored
    with ``strides``, or 0 where the view is expressible over them (replayed on meta tensors)."""
    chain = []
    v = view
    while v is not root:
        chain.append(v)
        v = v.args[0]
    base, val = _tensor(root), _tensor(view)
    symbolic = any(isinstance(a, fx.Node) for v in chain for a in (*v.args[1:], *v.kwargs.values()))
    if base is None or val is None or symbolic:
        return 0  # sizes only known at run time: no claim
    x = torch.empty_strided(tuple(base.shape), strides, dtype=base.dtype, device="meta")
    try:
        for v in reversed(chain):
            x = v.target(x, *v.args[1:], **v.kwargs)
    except (RuntimeError, ValueError):  # no such view over the padded strides: Inductor copies it
        size = tuple(val.shape)
        contiguous = torch.empty(size, device="meta").stride()
        own = padded_strides(size, contiguous, val.element_size(), rules) or contiguous
        return storage_elements(size, own) * val.element_size()
    return 0


def padding_facts(nodes: Sequence[fx.Node], kinds: Sequence[Kind]) -> tuple[list[int], list[int], list[bool]]:
    """Per node (``kinds``: each one's lowering kind): the bytes of its storage as Inductor pads
    it, for a view the bytes of the copy an extern reader gets (0: unpadded, never copied), and
    whether the backward, recomputing a forward value, leaves it unpadded (Note [Padded strides]).
    The convolutions of each half mark what Inductor does not pad in that half's graph."""
    n_nodes = len(nodes)
    padded_bytes, copy_bytes, unpadded_bwd = [0] * n_nodes, [0] * n_nodes, [False] * n_nodes
    device = next((t.device for t in map(_tensor, nodes) if t is not None), None)
    rules = padding_rules(device) if device is not None else None
    if rules is None:
        return padded_bytes, copy_bytes, unpadded_bwd
    bwd = _backward(nodes)
    fwd_skip = _disliked(nodes, set(nodes) - bwd) | _returned(nodes)
    bwd_skip = _disliked(nodes, bwd) | _returned(nodes)
    strides: dict[fx.Node, tuple[int, ...]] = {}
    for i, (n, k) in enumerate(zip(nodes, kinds)):
        val = _tensor(n)
        if val is None or k not in _STORED or n in (bwd_skip if n in bwd else fwd_skip):
            continue
        st = _padded(val, rules)
        if st is not None:
            strides[n] = st
            padded_bytes[i] = storage_elements(tuple(val.shape), st) * val.element_size()
            unpadded_bwd[i] = n not in bwd and n in bwd_skip
    for i, (n, k) in enumerate(zip(nodes, kinds)):
        if k is Kind.VIEW and isinstance(r := view_root(n), fx.Node) and r in strides:
            copy_bytes[i] = _copy_bytes(n, r, strides[r], rules)
    return padded_bytes, copy_bytes, unpadded_bwd
