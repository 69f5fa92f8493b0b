"""What Inductor does with each op of a joint graph, as facts the peak model reads
(``facts.NodeLowering``, read by ``remat.backends.inductor.fusion``): how it lowers the op
(pointwise, reduction, extern kernel, ...), how many ops it adds to an inlined expression, which
ops its CPU backend counts as expensive to repeat, and the block stage-local fusion keeps it in
(``versions.HOOKS["lowering_tables"]``, ``["realization"]``, ``["inline_opcount"]``). The scratch
an extern kernel holds is ATen's, both backends': ``remat.backends.aten_scratch``."""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ...analysis import cost
from ...analysis.op_facts import op_facts, tensor_inputs, view_root
from ...analysis.ops import CAST_OPS, op_name, packet
from ...analysis.provenance import block_of
from ...analysis.rows import chunk_of
from ...compat import OpOverload
from ...versions import drift
from ..base import INDEX_SOURCE
from .facts import Kind, NodeLowering
from .padding import padding_facts

__all__ = ["HEAVY_OPS", "lowering_kind", "inductor_runs_extern", "node_lowering", "node_lowerings", "fusion_blocks",
           "index_sources"]


def inductor_runs_extern(op: OpOverload) -> bool:
    """Whether Inductor runs ``op`` as an extern kernel (a library call or an eager fallback that
    writes a new buffer and reads realized inputs) rather than generating code for it: ops in
    ``torch._inductor.lowering.needs_realized_inputs`` or ``fallbacks``, or with no lowering at
    all (implicit fallback). A table that moved warns once (``versions.HOOKS["lowering_tables"]``,
    Note [Version drift])."""
    realized, fallbacks, table = _lowering_tables()
    if op in realized or op in fallbacks:
        return True
    return table is not None and op not in table and op.overloadpacket not in table


@functools.cache
def _lowering_tables() -> tuple[Any, Any, Any]:
    """Inductor's ``needs_realized_inputs``, ``fallbacks`` and ``lowerings``, looked up (and any
    missing one named in the drift warning) once per process; the tables are filled in place
    as Inductor registers lowerings, so holding them stays current."""
    from torch._inductor import lowering

    for name in ("needs_realized_inputs", "fallbacks", "lowerings"):
        if not hasattr(lowering, name):
            drift("lowering_tables", f"torch._inductor.lowering.{name}")
    return (getattr(lowering, "needs_realized_inputs", ()), getattr(lowering, "fallbacks", ()),
            getattr(lowering, "lowerings", None))


HEAVY_OPS = frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})
"""Ops whose presence makes Inductor's CPU backend store a reused value rather than repeat it
(``StorageBox.should_realize_on_reuse``: ``versions.HOOKS["realization"]``)."""


def lowering_kind(node: fx.Node, extern: bool) -> Kind:
    """How Inductor lowers ``node``. ``extern``: whether Inductor runs this op as an extern kernel
    (``inductor_runs_extern``)."""
    if node.op != "call_function":
        return Kind.INPUT
    if view_root(node) is not node:
        return Kind.VIEW
    op = op_name(node)
    target = node.args[0] if op == "getitem" and isinstance(node.args[0], fx.Node) else node
    f = op_facts(target)
    if f.is_matmul or f.is_attention or f.is_data_dependent or f.is_collective or f.is_mutating or extern:
        return Kind.EXTERN
    if f.is_random:
        return Kind.RANDOM
    if f.is_reduction:
        return Kind.REDUCTION if _reduces_last_dims(target) else Kind.OUTER_REDUCTION
    return Kind.POINTWISE


def _reduces_last_dims(node: fx.Node) -> bool:
    """Whether a reduction reduces its input's trailing dimensions (a row of a matrix, as a
    layer norm does), rather than leading ones (a bias gradient summing over the batch)."""
    ins = tensor_inputs(node)
    ndim = len(cost.shape(ins[0].meta.get("val"))) if ins else 0
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or not dims or not ndim:
        return True
    got = sorted(d % ndim for d in dims if isinstance(d, int))
    return got == list(range(ndim - len(got), ndim))


def _runs_extern(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    t = node.target
    if t is operator.getitem and isinstance(node.args[0], fx.Node):
        t = node.args[0].target
    return isinstance(t, OpOverload) and inductor_runs_extern(t)


def _own_ops(node: fx.Node) -> int:
    """Ops other than constants a pointwise node adds to an inlined Inductor expression (Note
    [Inlined op counts]): itself and one cast up for each floating operand of a lower precision
    than the one it computes in; a cast is one op, a filled constant none (``_consts``); where
    Inductor emulates eager's rounding of a low-precision result, its two casts (Note [Emulated
    rounding])."""
    if node.op != "call_function":
        return 0
    name = op_name(node)
    if _is_fill(name):
        return 0
    val = node.meta.get("val")
    rounded = 2 if _emulated(node) and isinstance(val, torch.Tensor) and val.dtype in _LOW_PRECISION else 0
    if name in _LOADS:  # the load of its operand alone (a gather's load at the index it computes), unrounded:
        return int(name == "prims.iota.default")  # their lowerings are not make_pointwise's (Note [Emulated rounding])
    if name == "aten.constant_pad_nd.default":  # per padded edge: its index, a compare, and the masks joined
        edges = sum(1 for e in node.args[1] if isinstance(e, int) and e > 0) if len(node.args) > 1 else 0
        return max(3 * edges, 1) + rounded
    if name in CAST_OPS:  # one ``to_dtype``; none to the dtype it has (a no-op Inductor removes)
        src = tensor_inputs(node)
        same = bool(src) and isinstance(val, torch.Tensor) and src[0].meta["val"].dtype == val.dtype
        return (0 if same else 1) + rounded
    widest = _compute_dtype(node)
    promoted = {a for a in tensor_inputs(node) if a.meta["val"].dtype.is_floating_point
                and widest is not None and a.meta["val"].dtype != widest}
    return 1 + len(promoted) + rounded


_LOW_PRECISION = (torch.bfloat16, torch.float16)
_LOADS = frozenset({"aten.clone.default", "aten.gather.default", "aten.embedding.default", "prims.iota.default"})
"""Pointwise ops Inductor lowers to one load or index (``iota``: its index expression), no op of
their own (measured with ``inner_fn_opcount``: a clone 1, a gather its operand's and its index's
expressions, an iota 1 whatever its start and step)."""


def _value_args(node: fx.Node) -> list[object]:
    """The positional arguments of ``node`` that are values (not dims, sizes or lists): those whose
    schema type is not an int (a gather's dim, an iota's start and step are not constants)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return list(node.args)
    out = []
    for i, a in enumerate(node.args):
        typ = str(schema.arguments[i].type) if i < len(schema.arguments) else ""
        if typ not in ("int", "SymInt", "Optional[int]", "Optional[SymInt]", "int?", "SymInt?"):
            out.append(a)
    return out


def _emulated(node: fx.Node) -> bool:
    """Whether Inductor rounds this node's low-precision operands and result as eager would
    (Note [Emulated rounding]; ``versions.HOOKS["recompute_precision"]``)."""
    return bool(node.meta.get("low_precision_pointwise_barrier", False))


# Note [Emulated rounding]
# With ``emulate_precision_casts`` (on in remat's compile, Note [Recompute precision]) the trace
# marks each op it records outside a decomposition whose result or an operand is bf16 or fp16
# (``proxy_tensor._maybe_record_pointwise_barrier``: ``low_precision_pointwise_barrier`` in the
# node's meta), and Inductor lowers such a pointwise op (``lowering.make_pointwise``) with a cast
# down and back up around each low-precision operand it loads and around a low-precision result:
# two ops each in its inlined expression, an operand's pair shared by the readers of one
# expression (``_consts``: they are the same ops). HF Llama's loss backward at ``budget=0.3``
# (Inductor's CUDA lowering without a GPU, traced as an H200 ran it): unmarked, the float32
# log-softmax gradient's expression reached 30 ops and was inlined into its bf16 cast, stored at
# 31 and written into the recomputed logits; marked, the gradient alone passes 30 (32 in the
# model), is stored (in registers), and the bf16 cast gets a new 1,000 MiB buffer beside the
# logits: the read the H200 made. A graph traced without the setting has no marks and is
# counted without these casts.


def _is_fill(name: str) -> bool:
    return name.split(".")[1:2] in (["full"], ["scalar_tensor"])


def _compute_dtype(node: fx.Node) -> torch.dtype | None:
    """The widest floating dtype among ``node``'s tensor operands and result."""
    floats = [a.meta["val"].dtype for a in tensor_inputs(node) if a.meta["val"].dtype.is_floating_point]
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dtype.is_floating_point:
        floats.append(val.dtype)
    return max(floats, key=lambda d: torch.finfo(d).bits, default=None)


def _consts(node: fx.Node) -> frozenset[tuple[str, str]]:
    """The scalar constants ``node`` writes into an inlined expression (a ``full``'s fill value, an
    op's scalar operands), as (value as written, dtype), and the casts that round its
    low-precision operands (Note [Emulated rounding]): Inductor's op count takes each distinct
    one once."""
    name = op_name(node)
    if node.op != "call_function":
        return frozenset()
    rounded = frozenset((f"rounded {a.name}", step) for a in tensor_inputs(node) for step in ("down", "up")
                        if _emulated(node) and name not in _LOADS and a.meta["val"].dtype in _LOW_PRECISION)
    if name in CAST_OPS:
        return rounded
    fill = _is_fill(name)
    args = _value_args(node)
    val = node.meta.get("val")
    dtype = val.dtype if fill and isinstance(val, torch.Tensor) else _compute_dtype(node)
    return rounded | frozenset((repr(a), str(dtype)) for a in args if isinstance(a, (int, float))
                               and not isinstance(a, bool))


def _load_ops(node: fx.Node) -> tuple[int, frozenset[tuple[str, str]]]:
    """Ops and constants an expression reading ``node`` adds besides its load (Note [Inlined op
    counts]): a variance (``var_mean``'s first output, ``var``) is stored as a reduction, and its
    readers inline the scaling: Welford's sum of squares over ``max(0, N - correction)`` (three
    ops, the constants 0, N and the correction), or a two-step variance's sum over its count (one
    op and the count as an index expression)."""
    aten = torch.ops.aten
    src = node
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        if node.args[1] != 0:
            return 0, frozenset()
        src = node.args[0]
    if src.op != "call_function" or src.target not in (aten.var_mean.correction, aten.var.correction):
        return 0, frozenset()
    x = src.args[0].meta.get("val") if isinstance(src.args[0], fx.Node) else None
    out = node.meta.get("val")
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
        return 0, frozenset()
    n, dtype, correction = x.numel() // max(out.numel(), 1), str(out.dtype), src.kwargs.get("correction", 1)
    if _two_step_variance(n, x):
        return 1, frozenset({(f"index {n - correction if correction else n}", dtype)})
    return 3, frozenset((repr(c), dtype) for c in (0, n, correction))


def _two_step_variance(n: int, x: torch.Tensor) -> bool:
    """Whether Inductor lowers a variance over ``n`` elements of ``x`` in two passes (a mean, then a
    sum of squares) rather than as a Welford reduction (``lowering.py: use_two_step_variance``,
    ``versions.HOOKS["inline_opcount"]``): below ``unroll_reductions_threshold``; where the config
    has the two-step thresholds, on a CPU up to ``cpp.use_two_step_variance_threshold`` elements,
    and on CUDA for 16-bit inputs from ``triton.use_two_step_variance_min_numel`` to its threshold
    (when the reduction is not split, not checked here)."""
    from torch._inductor import config

    if n < config.unroll_reductions_threshold:
        return True
    cpu_limit = getattr(config.cpp, "use_two_step_variance_threshold", None)
    if cpu_limit is None:
        return False
    if x.device.type == "cpu":
        return n <= cpu_limit
    low, high = (getattr(config.triton, "use_two_step_variance_min_numel", 0),
                 getattr(config.triton, "use_two_step_variance_threshold", 0))
    return x.dtype in (torch.bfloat16, torch.float16) and low <= n <= high


# Note [Inlined op counts]
# Inductor stores an inlined pointwise value when its expression grows past
# ``realize_opcount_threshold`` ops (Note [Inductor realization]); it counts them with
# ``Pointwise.inner_fn_opcount`` (``versions.HOOKS["inline_opcount"]``): every distinct op of the
# expression's IR, loads and constants included, common subexpressions once. A variance read brings
# its scaling along (Welford's ``m2 / max(0, N - correction)``, ``_load_ops``). Read off the IR of
# ResNet-50's backward under a budget (the versions ``versions.HOOKS["inline_opcount"]`` names,
# Inductor's CUDA lowering, bf16, ``benchmarks/gpu_offline.py``): an op on low-precision operands is
# computed as it is written (a bf16 ``add`` of two bf16 values is one ``add``; the casts to and from
# float32 are made when the kernel is generated, not in the IR), an operand of a lower precision
# than the op's result is cast up with one ``to_dtype``, a cast node is one ``to_dtype``, and a
# constant (a scalar operand, a ``full``'s value) is one op per distinct value and dtype in the
# expression (a variance's zero and its correction of 0 are one ``constant``). Counting two casts for
# each low-precision operand and result, as before, put a recomputed BatchNorm-ReLU at 34 ops where
# Inductor counted 24, and past the threshold: the simulator stored float32 values that Inductor
# inlines (a 196 MiB one at the peak of ResNet-50 at ``budget=0.5``). Not counted: the versions with
# ``emulate_precision_casts_on_saved_tensors`` cast a saved low-precision value down and up again
# where the forward also reads it, so there the count can fall under Inductor's
# (tests/backends/test_inline_opcount.py).


def node_lowering(node: fx.Node, block: str | None) -> NodeLowering:
    """How Inductor lowers ``node`` (``block``: its block for stage-local fusion, ``fusion_blocks``):
    every fact the peak model reads, read here once."""
    load_ops, load_consts = _load_ops(node)
    return NodeLowering(
        kind=lowering_kind(node, _runs_extern(node)),
        ops=_own_ops(node),
        consts=_consts(node),
        load_ops=load_ops,
        load_consts=load_consts,
        dtype=cost.dtype_name(node.meta.get("val")),
        block=block,
        heavy=packet(op_name(node)).split(".")[-1] in HEAVY_OPS,
        at_reader=_fused_into_addmm(node),
        stores_operand=_pad_stores_operand(node),
        fixes_layout=op_name(node) in _FIXED_LAYOUT,
    )


_FIXED_LAYOUT = frozenset({"aten.mm.default", "aten._int_mm.default", "aten.convolution_backward.default"})
"""Ops whose operands with several readers Inductor gives their traced strides (``graph.py:
GraphLowering.run_node``, ``need_fixed_layout``; ``versions.HOOKS["comprehensive_padding"]``)."""


# Note [A padded matmul operand is stored]
# Inductor lowers a 2-D ``constant_pad_nd`` whose one reader is a matmul (``mm``, ``addmm``) by
# first storing its operand (``lowering.py: inplace_constant_pad_nd``, under
# ``config.inplace_padding``, on by default: it hopes to pad in place, in the operand's spare
# columns, and where it cannot, pads the stored copy). On a GPU these are ``pad_mm``'s pads of a
# matmul with an unaligned size: HF GPT-2's LM head pads the logits' gradient (8192 x 50257) for
# one or both of its matmuls, so the bf16 gradient is a buffer of its own (786 MiB at 8 x 1024
# tokens) and the float32 expression it is cast from lives only inside the kernel that writes
# it; the model had inlined the bf16 cast into the pads and stored the float32 value
# (1,571 MiB: +19.8% over the peak Inductor planned, benchmarks/gpu_offline.py --pad-mm force,
# versions.HOOKS["padded_operand_stored"]).


def _pad_stores_operand(node: fx.Node) -> bool:
    """Whether Inductor stores ``node``'s operand before lowering it (Note [A padded matmul
    operand is stored])."""
    if node.op != "call_function" or op_name(node) != "aten.constant_pad_nd.default":
        return False
    from torch._inductor import config

    if not hasattr(config, "inplace_padding"):
        drift("padded_operand_stored", "torch._inductor.config.inplace_padding")
        return False
    aten = torch.ops.aten
    x, pad = node.args[0], node.args[1] if len(node.args) > 1 else ()
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    return (bool(config.inplace_padding) and len(node.users) == 1
            and next(iter(node.users)).target in (aten.mm.default, aten.addmm.default)
            and len(pad) == 4 and isinstance(val, torch.Tensor) and val.dim() == 2)


# Note [Matmuls fused into the add that reads them]
# Inductor's post-grad passes rewrite ``add(x, mm(a, b))`` (either operand order) into
# ``addmm(x, a, b)`` when ``x`` is a tensor of the matmul's dtype that broadcasts to its result
# (fx_passes/post_grad.py: the ``addmm`` pattern, ``is_valid_addmm_fusion``; on a GPU a bias-like
# ``x`` whose sum only pointwise ops read stays unfused). The fused kernel runs where the add
# does, so the matmul's operands stay alive until then. Where the two are far apart this is the
# step's peak: a weight used twice accumulates its gradient as such an add, and HF GPT-2's tied
# LM head and token embedding computed the head's weight gradient at the end of the backward,
# holding the logits' gradient (785 MiB at 8 x 1024 tokens, bf16) through the whole backward
# (found with benchmarks/gpu_offline.py; ``versions.HOOKS["addmm_fusion"]``). The model moves
# such a matmul to its add when ``x`` has the matmul's own shape (a full tensor, not a bias).


def _fused_into_addmm(node: fx.Node) -> bool:
    """Whether ``node`` is a matmul Inductor fuses into the add that reads it (Note [Matmuls fused
    into the add that reads them])."""
    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.mm.default or len(node.users) != 1:
        return False
    (add,) = node.users
    if add.target is not aten.add.Tensor or add.kwargs.get("alpha", 1) != 1 or len(add.args) != 2:
        return False
    other = add.args[1] if add.args[0] is node else add.args[0]
    if other is node or not isinstance(other, fx.Node):
        return False
    x, y = other.meta.get("val"), node.meta.get("val")
    return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
            and tuple(x.shape) == tuple(y.shape))


def node_lowerings(nodes: list[fx.Node]) -> tuple[NodeLowering, ...]:
    """``node_lowering`` of each of a joint graph's nodes (all but its output, in order), with
    the padding Inductor gives them on their device (Note [Padded strides])."""
    facts = [node_lowering(n, b) for n, b in zip(nodes, fusion_blocks(nodes))]
    padded, copied, unpadded = padding_facts(nodes, [f.kind for f in facts])
    return tuple(dataclasses.replace(f, padded_nbytes=p, copy_nbytes=c, unpadded_in_backward=u) if p or c else f
                 for f, p, c, u in zip(facts, padded, copied, unpadded))


def fusion_blocks(nodes: list[fx.Node]) -> tuple[str | None, ...]:
    """The block of each node (``graph.block_of``) that stage-local fusion keeps apart, or no
    blocks at all when every block runs an extern kernel.

    Note [Blocks an extern kernel separates]: stage-local fusion (Note [Stage-local fusion])
    exists for graphs whose blocks are all fusible work: there Inductor chained every layer's
    gradient work into one kernel holding every layer's buffers at once. An extern kernel
    (matmul, convolution, attention) is never fused, so when every block runs one, a fused
    kernel reaches at most from one block's last extern kernel to the next block's first:
    nothing chains across the model, and keeping blocks apart only costs the fusions at their
    boundaries (the add+dropout+layer-norm of two GPT-2 blocks, the residual add and ReLU of
    two ResNet blocks). Measured on an H200 (bf16, one process, interleaved,
    ``benchmarks/variant_probe.py``; ``versions.HOOKS["extern_separated_blocks"]``): without the
    tags ResNet-50 stepped 24.96 ms against 25.55 with them (torch.compile 24.62) and GPT-2 27.09
    against 27.17; the measured peaks did not move (3112 / 3109 MiB, 4340 / 4340 MiB).

    The slices of a row-chunked region (Note [Row chunks] in ``remat.analysis.rows``) are always
    kept apart: each runs a matmul, but the sum of their weight-gradient parts is a chain of adds
    that Inductor would fuse into one kernel reading every slice's part, all of them alive until
    the last slice.

    Note [Gradient sums that join blocks]: the argument above holds for work on the path from one
    extern kernel to the next, not for work that reaches no extern kernel at all. A value several
    blocks read (T5's relative position bias, computed once and added to every layer's scores)
    gets its gradient as a sum of per-block reductions joined by a chain of adds; nothing
    separates them, so Inductor fused the twelve batch reductions and the adds into one kernel
    that runs after the last layer's backward. Each reduction had inlined its input (the
    softmax gradient) and read that input's own inputs, so every layer's attention probabilities
    and their gradient, 768 MiB a layer, stayed alive until the end of the backward: T5 at
    ``budget=0.5`` read 10,389 MiB from Inductor's plan against 6,019 predicted (Inductor's CUDA
    lowering without a GPU, bf16, ``benchmarks/gpu_offline.py``; ``versions.HOOKS["extern_separated_blocks"]``),
    7,117 with the blocks kept. So the ops that reach no extern kernel keep their blocks where such ops of two
    or more blocks are connected; every other op fuses freely."""
    blocks = [block_of(n) if n.op == "call_function" else None for n in nodes]
    sliced = {n for n in nodes if chunk_of(n) is not None}
    extern = {n for n in nodes if _runs_extern(n)}
    separated: dict[str, bool] = {}
    for n, b in zip(nodes, blocks):
        if b is not None and n not in sliced:
            separated[b] = separated.get(b, False) or n in extern
    if separated and all(separated.values()):
        of = dict(zip(nodes, blocks))
        joined = sliced | _joined_tails(nodes, of, extern) | _shared_readers(nodes, of, extern)
        return tuple(b if n in joined else None for n, b in zip(nodes, blocks))
    return tuple(blocks)


def _joined_tails(nodes: list[fx.Node], blocks: dict[fx.Node, str | None], extern: set[fx.Node]) -> set[fx.Node]:
    """The ops that reach no extern kernel (``extern``: ``_runs_extern``) and are connected,
    through such ops, to ops of two or more blocks (Note [Gradient sums that join blocks])."""
    reaches: set[fx.Node] = set()
    for n in reversed(nodes):
        if any(u in extern or u in reaches for u in n.users):
            reaches.add(n)
    tails = [n for n in nodes if n.op == "call_function" and n not in extern and n not in reaches]
    parent = {n: n for n in tails}

    def find(n: fx.Node) -> fx.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in tails:
        for u in n.users:
            if u in parent:
                parent[find(u)] = find(n)
    spans: dict[fx.Node, set[str]] = {}
    for n in tails:
        if blocks[n] is not None:
            spans.setdefault(find(n), set()).add(blocks[n])
    return {n for n in tails if len(spans.get(find(n), ())) >= 2}


def _shared_readers(nodes: list[fx.Node], blocks: dict[fx.Node, str | None], extern: set[fx.Node]) -> set[fx.Node]:
    """The fusible ops (not extern kernels, not views) that read a value fusible ops of two or
    more other blocks read too: a weight several blocks share, or a mask or position table
    computed once.

    Note [Values several blocks read]: Inductor fuses two kernels that read the same buffer
    (horizontal fusion) wherever they are in the graph, and a fused kernel runs where its first
    part was, after everything any part needs. Recomputed softmaxes of several blocks that all
    add one shared bias read that bias: the C++ backend fused four blocks' recomputed softmaxes
    into one kernel at the start of the backward, so four blocks' recomputed scores were alive
    at once (``tests/backends/test_shared_values.py``: 19.8 MiB read against 12.7 simulated;
    13.9 with the blocks kept). So the readers of such a value keep their blocks; a kernel whose
    own op has no block takes the blocks of the ops inlined into it (``hooks._stages``), and
    kernels fuse only within one block (``hooks.stage_local_fusion``). A value read only by the
    block that computes it and the next (the residual stream at a block boundary) is not shared:
    those boundary fusions stay (Note [Blocks an extern kernel separates])."""
    out: set[fx.Node] = set()
    for v in nodes:
        readers = [u for u in _fusible_readers(v, extern) if blocks.get(u) is not None]
        if len({blocks[u] for u in readers} - {blocks.get(v)}) >= 2:
            out.update(readers)
    return out


def _fusible_readers(node: fx.Node, extern: set[fx.Node]) -> set[fx.Node]:
    """The ops that read ``node`` directly or through views of it and are not extern kernels."""
    def fusible(u: fx.Node) -> bool:
        return u.op == "call_function" and u not in extern

    return {u for u in _readers_through_views(node, lambda u: fusible(u) and op_facts(u).is_view) if fusible(u)}


def _readers_through_views(node: fx.Node, is_view: Callable[[fx.Node], bool]) -> set[fx.Node]:
    """The nodes that read ``node`` directly or through views of it (``is_view``), views excluded."""
    found: set[fx.Node] = set()
    todo = [node]
    while todo:
        for u in todo.pop().users:
            if is_view(u):
                todo.append(u)
            else:
                found.add(u)
    return found


def index_sources(nodes: list[fx.Node]) -> dict[fx.Node, str]:
    """Ops with no tensor input (``arange``, ``full``) to save rather than recompute, so that the
    values computed from them are computed once: see Note [Values computed from indices].

    Note [Values computed from indices]: Inductor stores a pointwise value once for all its
    readers only if computing it reads some buffer (``TensorBox.realize_hint``, which
    ``GraphLowering`` calls for the inputs of ops in ``needs_realized_inputs``: it realizes a
    ``Pointwise`` whose ``inner_fn_opcount().nontrivial_read_count`` is not 0;
    ``versions.HOOKS["index_source_realization"]``). A value
    computed from indices and constants alone (a causal mask, ``where(arange <= arange, 0, -inf)``)
    reads nothing, so every extern kernel that reads it (each layer's attention, forward and
    backward) gets a copy of its own, a full write of the mask each time. torch.compile saves the
    position ids (``embedding``'s backward reads them), so its mask reads that buffer and is
    stored once. remat's plan recomputed the ``arange`` (no inputs, so no cost in bytes), and on
    an H200 GPT-2's step wrote the mask 48 times: 0.4 ms of a 28 ms step. So when a read-free
    value (pointwise ops and views down to ops without tensor inputs) is read by two or more
    extern kernels, the smallest of its sources is saved (its non-scalar sources first: the
    ``arange`` of a few KiB, not a 0-dim constant Inductor would otherwise fold): then computing
    the value reads a buffer in the forward and in the backward, and it is stored once in each."""
    kinds = {n: lowering_kind(n, _runs_extern(n)) for n in nodes}
    sources: dict[fx.Node, set[fx.Node]] = {}  # read-free node -> its ops without tensor inputs
    for n in nodes:
        if n.op != "call_function" or kinds[n] not in (Kind.POINTWISE, Kind.VIEW):
            continue
        ins = [a for a in n.all_input_nodes if not _is_scalar(a)]  # a size is not a read
        if not all(a in sources for a in ins):
            continue  # reads a buffer (or a multi-output op's result, as ``getitem`` does)
        sources[n] = set().union(*(sources[a] for a in ins)) if ins else {n}
    keep: dict[fx.Node, str] = {}
    for n, srcs in sources.items():
        if kinds[n] is Kind.VIEW or len(_extern_readers(n, kinds)) < 2:
            continue
        tensors = [s for s in srcs if cost.numel(s.meta.get("val")) > 1] or list(srcs)
        best = min(tensors, key=lambda s: (cost.nbytes(s.meta.get("val")), nodes.index(s)))
        keep[best] = INDEX_SOURCE
    return keep


def _is_scalar(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def _extern_readers(node: fx.Node, kinds: dict[fx.Node, Kind]) -> set[fx.Node]:
    """The extern kernels that read ``node`` directly or through views of it."""
    return {u for u in _readers_through_views(node, lambda u: kinds.get(u) is Kind.VIEW) if kinds.get(u) is Kind.EXTERN}
