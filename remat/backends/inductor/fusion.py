"""Which values Inductor stores in memory, and how its kernels allocate them. Pure: no torch import.

The uncompiled backend runs the joint graph op by op: every op's output is a tensor. Inductor
lowers each graph (the forward, and the backward with its recompute) into kernels, and most
values never reach memory. ``lower`` decides, for one graph, which values become *buffers*,
following Inductor's lowering (``torch/_inductor/graph.py: GraphLowering.run_node``,
``ir.py: StorageBox.realize_hint / mark_reuse / has_exceeded_max_reads``,
``lowering.py: make_reduction, needs_realized_inputs``; torch 2.11 and 2.13):

* graph inputs exist; graph outputs (forward outputs, saved values, gradients) are stored;
* extern kernels (matmul, convolution, attention, ops without a lowering) store their outputs
  and read stored inputs: a value an extern kernel reads is stored (*extern input*);
* reductions are stored (``make_reduction`` realizes them); so are random values;
* a pointwise value is *inlined*: each kernel that reads it recomputes it from the values its
  expression reads, so those values stay alive until the last such kernel runs (the
  simulator's lifetimes follow these reads, not the graph's edges). It is stored instead when
  (Note [Inductor realization]):

  - it has several readers and its expression is expensive to repeat: more than
    ``reads_threshold`` buffer reads, more than ``opcount_threshold`` ops, or (CPU only) an
    ``exp``/``log``/``tanh``/``sigmoid`` in it (``StorageBox.should_realize_on_reuse``);
  - it has several readers and one is a graph output or a matmul (``realize_hint``);
  - a pointwise op broadcasts it and it has more than ``opcount_threshold`` ops or (CPU) an
    ``exp``/``log``/... (Note [Broadcast realization]);
  - its expression has accumulated more than ``acc_reads_threshold`` reads or
    ``opcount_threshold`` ops (``has_exceeded_max_reads``), or more than 100 ops;

* views alias the value they view (stored or inlined alike).

``kernels`` then groups one lowered graph into the kernels the simulator replays, each with the
storages it allocates before it runs and the storages it reads (Note [Inductor allocation]):
fused kernels allocate all their buffers up front (``kernel_groups``); a buffer read only row by
row inside its own fused kernel is never allocated (``local_buffers``), and what it reads stays
alive until that kernel runs; a kernel writes in place into a same-sized buffer it reads for the
last time (``inplace``); a freed buffer is held for a later one of its size (``reuse``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .facts import FusionGraph, Kind

__all__ = ["FusionRules", "CPU", "GPU", "rules_for", "replace_rules", "Lowered", "lower", "Kernel", "kernels"]

# Note [Inductor realization]
# Inductor decides while lowering the fx graph, node by node, whether a pointwise value gets a
# buffer. The thresholds below are torch/_inductor/config.py's (2.11, 2.13): realize_reads_threshold
# = 4; realize_acc_reads_threshold = 8 (realize_cpu_acc_reads_threshold = 12 on CPU);
# realize_opcount_threshold = 30 (realize_cpu_opcount_threshold = 50 on CPU). "Several readers"
# counts the distinct fx users of the node in its graph (the output node is one). The op count of
# an inlined expression is estimated from the ops folded into it (``NodeLowering.ops``) plus one load
# per buffer it reads; "reads" are the distinct buffers it loads.
#
# Note [Inductor allocation]
# The wrapper Inductor generates allocates a kernel's output buffers just before the kernel and
# frees each buffer after the last kernel that reads it. Inductor's scheduler fuses the pointwise
# and reduction work between two extern kernels into as few kernels as their loops allow: the C++
# backend into one kernel of several loop nests (the pointwise workload's whole backward is one
# C++ kernel), Triton into one kernel with a loop per pass over a row (the pointwise workload's
# whole forward is one Triton kernel). Every buffer of a fused kernel exists for the whole kernel.
# ``kernel_groups`` models this as: the stored values between two extern kernels, in execution
# order, form one group. Two refinements:
# * a value read only by pointwise and row-reduction work of its own group, no reduction over
#   the batch (a bias gradient), stays in registers or a per-row local buffer (``local_buffers``;
#   C++: try_outer_loop_fusion_with_local_buf);
# * on GPU a reduction over the batch that shares a full input with a row reduction is fused with
#   it into a mix-order reduction kernel, which takes no other work: it starts a new group whose
#   inputs stay stored (``mix_order_splits``; scheduler.py: MixOrderReduction, on by default in
#   2.11 and 2.13).
# Within these groups the wrapper writes a kernel's output into a same-sized input it reads for
# the last time (config.inplace_buffers), and holds a freed buffer for a later one of the same
# size and dtype when Inductor's own peak estimate allows it (config.allow_buffer_reuse;
# wrapper.py: AllocateLine.plan). These rules reproduce the measured peaks of the reference
# workloads to a few percent (benchmarks/README.md); they are not Inductor's scheduler, and a
# graph whose fusion they misjudge is mispredicted.


@dataclass(frozen=True, slots=True)
class FusionRules:
    """Inductor's realization thresholds and allocation habits on one device."""

    device: str
    reads_threshold: int = 4
    """A value with several readers and more buffer reads than this is stored."""
    acc_reads_threshold: int = 8
    """An expression reading more buffers than this is stored."""
    opcount_threshold: int = 30
    """An expression with more ops than this is stored (if it has several readers, or reads
    more than one buffer)."""
    max_inline_ops: int = 100
    """An expression with more ops than this is always stored."""
    realize_heavy_reuse: bool = False
    """Store a value with several readers whose expression has an exp/log/tanh/sigmoid (CPU)."""
    kernel_groups: bool = False
    """Stored values between two extern kernels share one fused kernel's allocation."""
    stage_local: bool = False
    """Work of two different blocks is never fused (remat compiles with stage-local fusion)."""
    one_kernel_between_externs: bool = False
    """All fused kernels between two extern kernels are emitted as one kernel that allocates
    every buffer before it runs and frees after it (the C++ backend's kernel groups; with
    ``stage_local``, one per block, since remat flushes the group between blocks); in-place
    writes are still decided per fused kernel."""
    mix_order_splits: bool = False
    """A reduction over leading dimensions sharing a full read with a row reduction starts a new
    group (GPU: Inductor's mix-order reduction kernels)."""
    local_buffers: bool = False
    """A stored pointwise value read only by row-wise work of its own group is never allocated
    (registers, or a C++ per-row local buffer)."""
    registers: bool = False
    """Kernel-local values live in registers (Triton): one that row reductions and pointwise
    work of its kernel both read stays local. The C++ backend's per-row local buffers need
    readers of one kind."""
    persistent_rows: int | None = None
    """Rows of at most this many elements are reduced by a persistent kernel that holds the
    whole row in registers. A longer row is reduced in a loop, one pass per dependent row
    reduction, and a value one pass computes and a later pass reads is stored in memory (Triton;
    ``None``: every row fits, as in the C++ backend's per-row local buffers)."""
    inplace: bool = True
    """A pointwise kernel writes into a same-sized buffer it reads for the last time."""
    sm_count: int = 0
    """Streaming multiprocessors of the GPU (132 on an H200): sizes a mix-order reduction's
    workspace (Note [Mix-order workspace]); 0: no workspace."""
    inplace_in_kernel: bool = False
    """A fused kernel's later pass writes into a same-sized buffer an earlier pass of it stored
    and it reads for the last time (Triton's ``in_out_ptr``, Note [Looped reductions])."""
    reuse: bool = True
    """A freed buffer is held for a later one of its size when Inductor's peak estimate allows."""
    reuse_margin: float = 0.01
    """Holding a freed buffer counts as allowed when it raises the model's copy of Inductor's
    peak estimate by at most this fraction. The copy differs from Inductor's own by small
    buffers, and decisions at the margin decide whether a large buffer stays allocated: the gpt
    workload's MLP buffer missed Inductor's own limit by 256 bytes in the model (CPU, medium)
    yet is held in the generated code. With 0.01 the gpt predictions move from -10.7% to -2.9%
    (CPU, medium, default plan); see benchmarks/README.md."""


CPU = FusionRules("cpu", acc_reads_threshold=12, opcount_threshold=50, realize_heavy_reuse=True,
                  kernel_groups=True, local_buffers=True, stage_local=True, one_kernel_between_externs=True)
GPU = FusionRules("cuda", kernel_groups=True, local_buffers=True, mix_order_splits=True, stage_local=True,
                  persistent_rows=1024, inplace_in_kernel=True, sm_count=132, registers=True)


def rules_for(device: str) -> FusionRules:
    """The rules of a device type (``"cpu"``, ``"cuda"``; other GPUs use the CUDA rules)."""
    return CPU if device == "cpu" else GPU


def replace_rules(rules: FusionRules, **changes: object) -> FusionRules:
    """``rules`` with some fields changed (a GPU's own multiprocessor count, say)."""
    return replace(rules, **changes)


@dataclass(frozen=True)
class Lowered:
    """One graph after lowering. ``stored``: nodes that get a buffer (views excluded). ``reads``:
    for every node of the graph, the storages a kernel reading it loads (the node's own buffer,
    a viewed buffer, or the buffers an inlined expression reads). Storages are node ids."""

    stored: frozenset[int]
    reads: dict[int, frozenset[int]] = field(default_factory=dict)


@dataclass
class _Expr:
    """An inlined pointwise value: the buffers it loads and the nodes folded into it."""

    reads: frozenset[int]
    members: frozenset[int]
    ops: int
    heavy: bool


def lower(g: FusionGraph, rules: FusionRules) -> Lowered:
    """Lower one graph (``g.order``, the nodes in execution order; ``g.given`` exist before it
    runs; ``g.outputs`` it returns; ``g.numel`` shows where a pointwise op broadcasts an operand,
    Note [Broadcast realization]). See the module docstring for the rules."""
    member = set(g.order)
    outs = g.outputs
    users: dict[int, list[int]] = {v: [] for v in g.order}
    for v in g.order:
        for u in dict.fromkeys(g.inputs[v]):
            if u in users:
                users[u].append(v)
    stored: set[int] = set()
    reads: dict[int, frozenset[int]] = {u: frozenset({u}) for u in g.given}
    expr: dict[int, _Expr] = {}
    base: dict[int, int] = {}  # view -> the node whose value it views (stored or inlined)

    def store(v: int) -> None:
        v = base.get(v, v)
        if v in expr:
            del expr[v]
            stored.add(v)
            reads[v] = frozenset({v})
            for w, b in base.items():  # views of it now view a buffer
                if b == v:
                    reads[w] = reads[v]

    for v in g.order:
        k = g.kind(v)
        args = [u for u in dict.fromkeys(g.inputs[v]) if u in reads]
        if k is Kind.VIEW:
            b = base.get(args[0], args[0]) if args else v
            base[v] = b
            reads[v] = reads.get(b, frozenset())
            continue
        if k is Kind.POINTWISE:
            for u in args:
                b = base.get(u, u)
                if b in expr and _broadcasts(v, b, g) and _realize_broadcast(expr[b], rules):
                    store(b)
            inlined = [expr[base.get(u, u)] for u in args if base.get(u, u) in expr]
            rd = frozenset().union(*(reads[u] for u in args)) if args else frozenset()
            members = frozenset({v}).union(*(e.members for e in inlined))
            e = _Expr(rd, members, sum(g.facts[w].ops for w in members) + len(rd),
                      g.facts[v].heavy or any(e.heavy for e in inlined))
            expr[v], reads[v] = e, rd
            _realize_pointwise(v, e, users[v], v in outs, g, rules, store)
            continue
        if k is Kind.EXTERN:
            for u in args:
                store(u)
        stored.add(v)
        reads[v] = frozenset({v})
    for v in outs:
        if v in member:
            store(v)
    return Lowered(frozenset(stored), reads)


def _realize_pointwise(v: int, e: _Expr, readers: list[int], is_output: bool, g: FusionGraph,
                       rules: FusionRules, store: Callable[[int], None]) -> None:
    n_users = len(readers) + (1 if is_output else 0)
    n_reads = len(e.reads)
    if n_users > 1:
        if is_output:
            return store(v)
        if n_reads > 1 and any(g.is_extern(w) for w in readers):
            return store(v)
        if ((rules.realize_heavy_reuse and e.heavy) or e.ops > rules.opcount_threshold
                or n_reads > rules.reads_threshold):
            return store(v)
    if n_reads > 1 and (n_reads > rules.acc_reads_threshold or e.ops > rules.opcount_threshold):
        return store(v)
    if e.ops > rules.max_inline_ops:
        return store(v)
    return None


# Note [Broadcast realization]
# A pointwise op that broadcasts an operand (a [rows, 1] statistic against a [rows, cols] value)
# lowers it through ``expand``, which marks the operand reused once per copy
# (``lowering.py: expand``, ``mark_reuse(..., graph_reuse=False)``; 2.11, 2.13). That is not
# graph fanout: the read-count test does not apply, but the others of
# ``StorageBox.should_realize_on_reuse`` do, so an inlined operand with an ``exp``/``log``/...
# (CPU) or more than ``opcount_threshold`` ops is stored, however few fx readers it has. The
# loss's ``log(sum(exp(x - max)))`` is the case that matters: on CPU the [rows, 1] log is
# stored, so ``x - max - log(...)`` (the log-softmax, [rows, vocab] in float32) holds no heavy
# op and stays inlined into its two readers (the gather of the target's entry and the saved
# softmax) instead of taking a buffer (HF Llama's LM loss, vocab 32000: a 62.5 MiB float32
# buffer at 512 tokens that Inductor never allocates).


def _broadcasts(v: int, u: int, g: FusionGraph) -> bool:
    """Whether pointwise ``v`` reads ``u`` broadcast (``u`` has fewer elements, both known)."""
    return 0 < g.numel_of(u) < g.numel_of(v)


def _realize_broadcast(e: _Expr, rules: FusionRules) -> bool:
    """Whether Inductor stores an inlined value a pointwise op broadcasts (Note [Broadcast
    realization]): ``should_realize_on_reuse`` without its read-count test."""
    return (rules.realize_heavy_reuse and e.heavy) or e.ops > rules.opcount_threshold


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel of a lowered graph, in execution order: the stored nodes it computes
    (``nodes``), the storages it allocates just before it runs and the storages it reads (node
    ids; graph inputs included)."""

    nodes: tuple[int, ...]
    allocs: tuple[int, ...]
    reads: frozenset[int]
    held: int = 0
    """Workspace bytes held while it runs (Note [Mix-order workspace])."""

    @property
    def node(self) -> int:
        """The last node it computes (for reports)."""
        return self.nodes[-1]


def kernels(g: FusionGraph, lowered: Lowered, rules: FusionRules) -> tuple[list[Kernel], dict[int, int]]:
    """The kernels of a lowered graph in execution order (see Note [Inductor allocation]), and
    the stored nodes that take over another node's storage (written in place, or reusing a freed
    buffer): node -> that storage. Kernels of two different blocks (``NodeLowering.block``) are
    never fused (remat compiles with stage-local fusion, Note [Stage-local fusion])."""
    keep = g.given | g.output_storages
    reads = {v: frozenset().union(*(lowered.reads.get(u, frozenset()) for u in g.inputs[v])) - {v}
             for v in g.order if v in lowered.stored}
    groups, mixed = _groups(g, lowered, rules, reads)
    whole, whole_reads = groups, reads  # what Inductor's own peak estimate counts (Note [Reuse estimate])
    if rules.local_buffers:
        # A mix-order reduction kernel takes no pointwise prologue: what it reads stays stored.
        local = _local_buffers([grp for grp in groups if grp[0] not in mixed], reads, g, keep,
                               _looped_passes(groups, reads, g, rules), rules.registers)
        groups = [[v for v in grp if v not in local] for grp in groups]
        reads = _through_local(reads, local)
    estimated: list[list[int]] = []  # per kernel left: its stored nodes, local buffers included
    pending: list[int] = []
    for grp, w in zip(groups, whole):
        pending += w
        if grp:
            estimated.append(pending)
            pending = []
    if pending and estimated:
        estimated[-1] += pending
    groups = [grp for grp in groups if grp]
    alias: dict[int, int] = {}
    if rules.inplace:
        alias = _inplace(groups, reads, g, lowered, keep, rules.inplace_in_kernel)
    fine = groups  # Inductor estimates its peak per fused kernel, before C++ kernel groups merge
    end = list(range(len(groups)))  # per group: the index in ``fine`` of its last kernel
    if rules.one_kernel_between_externs:  # frees happen after the merged kernel: reuse across it
        groups, end = _merged(groups, g, rules)
    if rules.reuse:
        alias = _reuse(_Fused(groups, reads, fine, end, estimated, whole_reads), g, alias, rules.reuse_margin)
    alias = {v: storage_of(alias, v) for v in alias}
    held = _mix_order_workspace(groups, mixed, reads, g, rules)
    out = [Kernel(tuple(grp), tuple(v for v in grp if g.nbytes[v] and v not in alias),
                  frozenset(alias.get(u, u) for v in grp for u in reads[v]), held[i]) for i, grp in enumerate(groups)]
    return out, alias


def _merged(groups: list[list[int]], g: FusionGraph, rules: FusionRules) -> tuple[list[list[int]], list[int]]:
    """The C++ backend's kernel groups (``FusionRules.one_kernel_between_externs``): the fused
    kernels between two extern kernels, of one block, merged; with, per merged group, the index
    of its last fused kernel."""
    merged: list[list[int]] = []
    end: list[int] = []
    for k, grp in enumerate(groups):
        if (merged and not g.is_extern(grp[0]) and not g.is_extern(merged[-1][-1])
                and _one_block(g, merged[-1] + grp, rules)):
            merged[-1] += grp
            end[-1] = k
        else:
            merged.append(list(grp))
            end.append(k)
    return merged, end


# Note [Mix-order workspace]
# A mix-order reduction kernel (GPU) reduces the batch in splits of ``split`` rows and writes
# each split's partial sums to a float32 workspace, ``cols x ceil(rows / split)`` per batch
# reduction it computes (a layer norm's weight and bias gradients: two), summed afterwards.
# ``split`` is the largest power of two at most ``rows / (8 x SMs)``, clamped to 16..128
# (codegen/simd.py: _codegen_mix_order_reduction; 2.11, 2.13). The wrapper hands the workspace
# from one mix-order kernel to the next of its size (``workspace_6 = workspace_5  # reuse``),
# so it is held from the first such kernel of a graph to the last (measured: 4 MiB through the
# gpt backward, 16 MiB through mlp's; ``benchmarks/mem_trace.py``).


def _mix_order_workspace(groups: list[list[int]], mixed: set[int], reads: dict[int, frozenset[int]],
                         g: FusionGraph, rules: FusionRules) -> list[int]:
    """Workspace bytes held while each group runs (Note [Mix-order workspace])."""
    numel = g.elements
    held = [0] * len(groups)
    if not rules.sm_count or not mixed:
        return held
    per_input: dict[int, int] = {}
    where = []
    for i, grp in enumerate(groups):
        for v in grp:
            if v not in mixed or not numel(v):
                continue
            full = max(reads[v], key=numel)
            rows, cols = numel(full) // numel(v), numel(v)
            # Inductor's conditions (MixOrderReduction.can_fuse): a large batch of at most 16384
            # columns, at least twice as many rows, and a sibling row reduction of the same
            # input (neither feeds the other; a bias gradient computed from the row sums' result
            # is a plain split reduction instead) in the same block (stage-local fusion).
            if not (rows >= 4096 and rows >= 2 * cols and rows * cols >= 5 * 2**20 and cols <= 16384):
                continue
            mine = _upstream(v, reads)
            if not any(full in reads[w] and w not in mine and v not in _upstream(w, reads)
                       for h in groups for w in h if w in reads and w not in mixed and w != v
                       and numel(w) == rows and _one_block(g, [v, w], rules)):
                continue
            split = min(max(_floor_pow2(rows // (8 * rules.sm_count)), 16), 128)
            per_input[full] = per_input.get(full, 0) + 4 * cols * -(-rows // split)
            where.append(i)
    if not where:
        return held
    size = max(per_input.values(), default=0)
    for i in range(where[0], where[-1] + 1):
        held[i] = size
    return held


def _one_block(g: FusionGraph, nodes: list[int], rules: FusionRules) -> bool:
    """Whether ``nodes`` span at most one block (remat's C++ kernels are flushed between
    blocks: inductor.hooks._cpp_flush_between_stages)."""
    if not rules.stage_local:
        return True
    return len({b for v in nodes if (b := g.facts[v].block) is not None}) <= 1


def _upstream(v: int, reads: dict[int, frozenset[int]]) -> set[int]:
    """Stored values ``v`` depends on, within one lowered graph."""
    seen: set[int] = set()
    stack = list(reads.get(v, ()))
    while stack:
        u = stack.pop()
        if u not in seen:
            seen.add(u)
            stack.extend(reads.get(u, ()))
    return seen


def _floor_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0


def storage_of(alias: dict[int, int], v: int) -> int:
    """The node whose storage ``v`` lives in, following ``alias`` chains."""
    while v in alias:
        v = alias[v]
    return v


def _groups(g: FusionGraph, lowered: Lowered, rules: FusionRules,
            reads: dict[int, frozenset[int]]) -> tuple[list[list[int]], set[int]]:
    """Stored nodes per kernel: one each, or (``kernel_groups``) every run of non-extern ones.
    With ``mix_order_splits``, a reduction over leading dimensions that shares a full read with
    a reduction over trailing dimensions starts a new run: Inductor fuses the two into a
    mix-order reduction kernel with the row-wise work between them, not with what came before
    (``scheduler.py: MixOrderReduction``; 2.11, 2.13)."""
    numel = g.elements
    mixed: set[int] = set()
    if rules.mix_order_splits:
        rows = [w for w in g.order if w in lowered.stored and g.kind(w) is Kind.REDUCTION]
        for v in g.order:
            if v in lowered.stored and g.kind(v) is Kind.OUTER_REDUCTION:
                big = max(map(numel, reads[v]), default=0)
                full = {u for u in reads[v] if numel(u) == big}
                if any(full & reads[w] for w in rows):
                    mixed.add(v)
    groups: list[list[int]] = []
    blocks: set[str] = set()  # the blocks of the current group
    for v in g.order:
        if v not in lowered.stored:
            continue
        b = g.facts[v].block if rules.stage_local else None
        if groups and g.is_extern(v) and _output_of(v, groups[-1], reads, g):
            groups[-1].append(v)  # one output of a multi-output extern kernel: allocated by it
            continue
        if (rules.kernel_groups and groups and v not in mixed and not g.is_extern(v)
                and not g.is_extern(groups[-1][-1]) and (b is None or not blocks or b in blocks)):
            groups[-1].append(v)
        else:
            groups.append([v])
            blocks = set()
        if b is not None:
            blocks.add(b)
    return groups, mixed


def _looped_passes(groups: list[list[int]], reads: dict[int, frozenset[int]], g: FusionGraph,
                   rules: FusionRules) -> dict[int, int]:
    """For the nodes of groups that reduce rows too long for a persistent kernel
    (``FusionRules.persistent_rows``): the pass of the kernel's row loop each node runs in,
    0 before the first row reduction it depends on, one more after each (Note [Looped
    reductions]). Nodes of other groups are absent."""
    limit = rules.persistent_rows
    if limit is None:
        return {}
    numel = g.elements
    passes: dict[int, int] = {}
    for grp in groups:
        rows = [v for v in grp if g.kind(v) is Kind.REDUCTION and numel(v)
                and max(map(numel, reads[v]), default=0) // numel(v) > limit]
        if not rows:
            continue
        mine = set(grp)
        for v in grp:
            passes[v] = max((passes[u] + (g.kind(u) is Kind.REDUCTION) for u in reads[v] if u in mine),
                            default=0)
    return passes


# Note [Looped reductions]
# Triton reduces a row of more than 1024 elements (``triton.persistent_reductions``' limit for
# inner reductions; 2.11, 2.13) in a loop over blocks of it, and a fused kernel whose work depends
# on such a reduction's result loops over the row again: a layer norm's backward reads the row
# once to sum it and once more to use the sums. A value the first pass computes and the second
# reads cannot stay in registers: the kernel stores it in the first pass and loads it in the
# second (the pointwise workload's backward kernels, rows of 4096, store tanh and sigmoid this
# way; ``benchmarks/mem_trace.py`` shows the buffers). The kernel may then write a later value
# of the same size into that buffer in place (``_inplace``).


def _output_of(v: int, group: list[int], reads: dict[int, frozenset[int]], g: FusionGraph) -> bool:
    """Whether ``v`` unpacks one output of a multi-output extern kernel of ``group`` (the tuple
    node owns no storage; its outputs are allocated when that kernel runs)."""
    (u,) = reads[v] if len(reads[v]) == 1 else (None,)
    return u is not None and u in group and g.is_extern(u) and not g.elements(u)


def _local_buffers(groups: list[list[int]], reads: dict[int, frozenset[int]], g: FusionGraph,
                   keep: frozenset[int], passes: dict[int, int], registers: bool) -> set[int]:
    """Stored pointwise values that every reader reads inside the same group, row by row
    (pointwise or a reduction over trailing dimensions): C++ outer-loop fusion keeps them in a
    per-row local buffer (``cpp.py: try_outer_loop_fusion_with_local_buf``; 2.11, 2.13), Triton
    in registers, unless a later pass of a looped reduction reads them (``passes``, Note [Looped
    reductions])."""
    group_of = {v: i for i, grp in enumerate(groups) for v in grp}
    readers: dict[int, list[int]] = {}
    for v, rd in reads.items():
        for u in rd:
            readers.setdefault(u, []).append(v)
    return {v for v in group_of if g.kind(v) is Kind.POINTWISE and v not in keep and readers.get(v)
            and all(group_of.get(w) == group_of[v] for w in readers[v])
            and (registers or len({g.kind(w) for w in readers[v]}) == 1)
            and all(g.kind(w) in (Kind.POINTWISE, Kind.REDUCTION) for w in readers[v])
            and all(passes.get(w, 0) == passes.get(v, 0) for w in readers[v])}


def _through_local(reads: dict[int, frozenset[int]], local: set[int]) -> dict[int, frozenset[int]]:
    """``reads`` without the ``local`` buffers: a reader of one reads what it reads instead (its
    kernel computes it from those, so they stay alive until that kernel has run)."""
    out: dict[int, frozenset[int]] = {}
    for v, rd in reads.items():  # execution order: a local buffer comes before its readers
        out[v] = frozenset().union(*(out.get(u, frozenset()) if u in local else frozenset({u}) for u in rd))
    return {v: rd for v, rd in out.items() if v not in local}


def _inplace(groups: list[list[int]], reads: dict[int, frozenset[int]], g: FusionGraph, lowered: Lowered,
             keep: frozenset[int], in_kernel: bool) -> dict[int, int]:
    """A generated kernel writes an output into a same-sized buffer of an earlier kernel that it
    reads for the last time (``config.inplace_buffers``, ``BaseSchedulerNode.decide_inplace_update``);
    with ``in_kernel``, also into one an earlier node of its own kernel stored."""
    nbytes = g.nbytes
    group_of = {v: i for i, grp in enumerate(groups) for v in grp}
    pos = {v: k for grp in groups for k, v in enumerate(grp)}
    last: dict[int, tuple[int, int]] = {}  # storage -> (group, position) of its last reader
    for v, rd in reads.items():
        for u in rd:
            last[u] = max(last.get(u, (-1, -1)), (group_of[v], pos[v]))
    alias: dict[int, int] = {}
    taken: set[int] = set()
    for i, grp in enumerate(groups):
        for v in grp:
            if not nbytes[v] or g.is_extern(v):
                continue
            for u in sorted(reads[v]):
                s = alias.get(u, u)
                earlier = group_of.get(s, i) < i or (in_kernel and group_of.get(s) == i and pos[s] < pos[v])
                if (s in lowered.stored and s not in keep and s not in taken and earlier
                        and last.get(s, (-1, -1))[0] == i and (last[s][1] == pos[v] or group_of.get(s, i) < i)
                        and nbytes[s] == nbytes[v] and g.dtype(s) == g.dtype(v)):
                    alias[v], last[s] = s, max(last[s], last.get(v, (i, pos[v])))
                    taken.add(s)
                    break
    return alias


@dataclass(frozen=True)
class _Fused:
    """A lowered graph's kernels, as buffer reuse decides over them (``_reuse``)."""

    groups: list[list[int]]
    """The stored nodes of each kernel the wrapper calls."""
    reads: dict[int, frozenset[int]]
    """The storages each stored node reads."""
    fine: list[list[int]]
    """The fused kernels ``groups`` merge (C++ kernel groups), over which Inductor estimates its
    peak (``groups`` itself elsewhere)."""
    end: list[int]
    """The index in ``fine`` of each group's last kernel, where its memory-planning lines sit."""
    estimated: list[list[int]]
    """``fine``'s kernels with every buffer Inductor's estimate counts (Note [Reuse estimate])."""
    estimated_reads: dict[int, frozenset[int]]
    """What those buffers read."""


def _reuse(fused: _Fused, g: FusionGraph, alias: dict[int, int], margin: float) -> dict[int, int]:
    """Inductor's wrapper reuses a freed buffer for a later one of the same size and dtype instead
    of freeing it, holding it meanwhile, when the kernels are adjacent or its own estimate of the
    graph's peak (bytes after each kernel, freeable inputs counted) allows it
    (``codegen/wrapper.py: AllocateLine.plan, EfficientPeakEstimate``; 2.11, 2.13). Freed buffers
    are reused last in, first out. ``margin``: ``FusionRules.reuse_margin``."""
    groups, reads, end, nbytes, given, outs = fused.groups, fused.reads, fused.end, g.nbytes, g.given, g.output_storages
    alias = dict(alias)
    after = _estimate(fused.estimated, fused.estimated_reads, g)
    overall = max(after, default=0)
    n = len(groups)
    last: dict[int, int] = {}
    for i, grp in enumerate(groups):
        for v in grp:
            last.setdefault(v, i)
            for u in reads[v]:
                last[u] = i
    holders: dict[int, list[int]] = {}  # storage -> the nodes living in it
    for grp in groups:
        for v in grp:
            if nbytes[v]:
                holders.setdefault(storage_of(alias, v), []).append(v)

    def death(s: int) -> int:  # n: lives past the graph (an output)
        return n if any(h in outs for h in holders[s]) else max(last[h] for h in holders[s])

    dies = {s: death(s) for s in holders}
    dying: dict[int, set[int]] = {}
    for s, t in dies.items():
        dying.setdefault(t, set()).add(s)
    pool: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for i, grp in enumerate(groups):
        for a in grp:
            key = (nbytes[a], g.dtype(a))
            if a not in holders or not pool.get(key):
                continue
            f, j = pool[key].pop()
            lo, hi = end[j] + 1, end[i]  # Inductor's peak_between: kernels strictly between
            if j + 1 == i or nbytes[a] + max(after[lo:hi], default=0) <= overall * (1 + margin):
                alias[a] = f
                holders[f] += holders.pop(a)
                dying[dies.pop(a)].discard(a)
                dies[f] = death(f)
                dying.setdefault(dies[f], set()).add(f)
                for k in range(lo, hi):
                    after[k] += nbytes[a]
            else:
                pool[key].append((f, j))
        for s in sorted(dying.pop(i, ())):
            if s not in given:
                pool.setdefault((nbytes[s], g.dtype(s)), []).append((s, i))
    return alias


# Note [Reuse estimate]
# Whether the wrapper holds a freed buffer for a later allocation of its size is decided against
# Inductor's own estimate of the graph's peak (``memory.estimate_peak_memory`` over the scheduler
# nodes, ``wrapper.EfficientPeakEstimate``; 2.11, 2.13). That estimate is made before code is
# generated: every buffer a fused kernel defines counts from that kernel to its last reader, also
# the ones code generation then keeps in registers or a per-row local buffer, and a kernel's
# output counts beside the input it is later written into in place. The model's copy counts the
# same. Measured (CPU, the small float32 HF Llama at budget 0.5): a SiLU backward kernel defines
# five 0.69 MiB buffers, one local and one written in place; Inductor estimated the backward's
# peak at 7.97 MiB, the model's copy without them at 6.12, so the model let the five buffers be
# freed where the wrapper held them through the attention backward for the next layer's MLP
# (read peak 8.04 MiB, simulated 6.12).


def _estimate(groups: list[list[int]], reads: dict[int, frozenset[int]], g: FusionGraph) -> list[int]:
    """Inductor's own estimate of live bytes at each kernel (``memory.estimate_peak_memory``):
    freeable inputs from the start to their last reader, each storage from its first writer to
    its last reader (outputs to the end)."""
    nbytes, given = g.nbytes, g.given
    n = len(groups)
    last: dict[int, int] = {}
    first: dict[int, int] = {}
    for i, grp in enumerate(groups):
        for v in grp:
            first.setdefault(v, i)
            last[v] = max(last.get(v, i), i)
            for u in reads[v]:
                last[u] = i
    delta = [0] * (n + 2)
    for u in given:
        if nbytes[u] and u in last:
            delta[0] += nbytes[u]
            delta[last[u] + 1] -= nbytes[u]
    kept = g.output_storages
    for s, i in first.items():
        if nbytes[s] and s not in given:
            t = n if s in kept else last[s]
            delta[i] += nbytes[s]
            delta[t + 1] -= nbytes[s]
    after, mem = [], 0
    for i in range(n):
        mem += delta[i]
        after.append(mem)
    return after
