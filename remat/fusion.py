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
  - its expression has accumulated more than ``acc_reads_threshold`` reads or
    ``opcount_threshold`` ops (``has_exceeded_max_reads``), or more than 100 ops;

* views alias the value they view (stored or inlined alike).

``kernels`` then turns one graph into the steps the simulator replays: one step per stored
value, with the storages it allocates and reads. Two allocation effects of Inductor's code are
modelled (Note [Inductor allocation]): a pointwise kernel writes *in place* into a same-sized
buffer it reads for the last time (``inplace_buffers``), and on CPU consecutive pointwise and
reduction kernels between two extern kernels form one fused C++ kernel whose buffers are all
allocated before it runs and freed after it (``kernel_groups``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["KINDS", "FusionRules", "CPU", "GPU", "rules_for", "Lowered", "lower", "Kernel", "kernels"]

KINDS = ("input", "view", "pointwise", "reduction", "outer-reduction", "extern", "random")
"""How Inductor lowers an op: ``input`` (a placeholder), ``view`` (aliases its first input),
``pointwise`` (an expression inlined into its readers unless realized), ``reduction`` (a stored
reduction over the trailing dimensions, as in a layer norm), ``outer-reduction`` (a stored
reduction over leading dimensions, as in a bias gradient), ``extern`` (a library or fallback
kernel: stored output, stored inputs), ``random`` (a stored random value)."""

# Note [Inductor realization]
# Inductor decides while lowering the fx graph, node by node, whether a pointwise value gets a
# buffer. The thresholds below are torch/_inductor/config.py's (2.11, 2.13): realize_reads_threshold
# = 4; realize_acc_reads_threshold = 8 (realize_cpu_acc_reads_threshold = 12 on CPU);
# realize_opcount_threshold = 30 (realize_cpu_opcount_threshold = 50 on CPU). "Several readers"
# counts the distinct fx users of the node in its graph (the output node is one). The op count of
# an inlined expression is estimated from the ops folded into it (``Schedule.ops``) plus one load
# per buffer it reads; "reads" are the distinct buffers it loads.
#
# Note [Inductor allocation]
# The wrapper Inductor generates allocates a kernel's output buffers just before the kernel and
# frees each buffer after the last kernel that reads it; a freed buffer is reused for a later one
# of the same size (no new bytes), and a pointwise kernel whose output matches the size of a buffer
# it reads for the last time writes into that buffer (config.inplace_buffers). On CPU the C++
# backend fuses pointwise and reduction kernels of compatible loops into one kernel of several
# loop nests; buffers passed between its loop nests are not removed, and all of them exist for
# the whole kernel (the pointwise workload's backward is one such kernel holding every layer's
# intermediates). ``kernel_groups`` models it as: the stored values between two extern kernels
# (in execution order) form one group.


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
    """Stored values between two extern kernels share one kernel's allocation (CPU)."""
    local_buffers: bool = False
    """A stored pointwise value read only by row-wise kernels of its own group lives in a
    per-row local buffer, not in memory (CPU outer-loop fusion)."""
    inplace: bool = True
    """A pointwise kernel writes into a same-sized buffer it reads for the last time."""


CPU = FusionRules("cpu", acc_reads_threshold=12, opcount_threshold=50, realize_heavy_reuse=True,
                  kernel_groups=True, local_buffers=True)
GPU = FusionRules("cuda")


def rules_for(device: str) -> FusionRules:
    """The rules of a device type (``"cpu"``, ``"cuda"``; other GPUs use the CUDA rules)."""
    return CPU if device == "cpu" else GPU


@dataclass(frozen=True)
class Lowered:
    """One graph after lowering. ``stored``: nodes that get a buffer (views excluded). ``reads``:
    for every node of the graph, the storages a kernel reading it loads (the node's own buffer,
    a viewed buffer, or the buffers an inlined expression reads). Storages are node ids."""

    stored: frozenset[int]
    reads: dict[int, frozenset[int]] = field(default_factory=dict)


@dataclass
class _Expr:
    reads: frozenset[int]
    ops: int
    heavy: bool


def lower(nodes: Sequence[int], inputs: Sequence[Sequence[int]], kind: Sequence[str], ops: Sequence[int],
          heavy: Iterable[int], graph_inputs: Iterable[int], outputs: Iterable[int],
          rules: FusionRules) -> Lowered:
    """Lower one graph: ``nodes`` in execution order, ``inputs`` (per node id, of the whole
    schedule) their operands; ``graph_inputs`` exist before it runs; ``outputs`` it returns.
    See the module docstring for the rules."""
    member = set(nodes)
    outs = set(outputs)
    heavy = set(heavy)
    users: dict[int, list[int]] = {v: [] for v in nodes}
    for v in nodes:
        for u in dict.fromkeys(inputs[v]):
            if u in users:
                users[u].append(v)
    stored: set[int] = set()
    reads: dict[int, frozenset[int]] = {g: frozenset({g}) for g in graph_inputs}
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

    for v in nodes:
        k = kind[v] if v < len(kind) else "extern"
        args = [u for u in dict.fromkeys(inputs[v]) if u in reads]
        if k == "view":
            b = base.get(args[0], args[0]) if args else v
            base[v] = b
            reads[v] = reads.get(b, frozenset())
            continue
        if k == "pointwise":
            inlined = [base.get(u, u) for u in args if base.get(u, u) in expr]
            rd = frozenset().union(*(reads[u] for u in args)) if args else frozenset()
            e = _Expr(rd, (ops[v] if v < len(ops) else 1) + sum(expr[u].ops for u in dict.fromkeys(inlined))
                      + sum(1 for u in args if base.get(u, u) not in expr),
                      v in heavy or any(expr[u].heavy for u in inlined))
            expr[v], reads[v] = e, rd
            _realize_pointwise(v, e, users[v], v in outs, kind, rules, store)
            continue
        if k == "extern":
            for u in args:
                store(u)
        stored.add(v)
        reads[v] = frozenset({v})
    for v in outs:
        if v in member:
            store(v)
    return Lowered(frozenset(stored), reads)


def _realize_pointwise(v: int, e: _Expr, readers: list[int], is_output: bool, kind: Sequence[str],
                       rules: FusionRules, store) -> None:
    n_users = len(readers) + (1 if is_output else 0)
    n_reads = len(e.reads)
    if n_users > 1:
        if is_output:
            return store(v)
        if n_reads > 1 and any(kind[w] == "extern" for w in readers if w < len(kind)):
            return store(v)
        if ((rules.realize_heavy_reuse and e.heavy) or e.ops > rules.opcount_threshold
                or n_reads > rules.reads_threshold):
            return store(v)
    if n_reads > 1 and (n_reads > rules.acc_reads_threshold or e.ops > rules.opcount_threshold):
        return store(v)
    if e.ops > rules.max_inline_ops:
        return store(v)
    return None


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel of a lowered graph, in execution order: the storages it allocates just before
    it runs and the storages it reads (node ids; graph inputs included). ``node``: the last
    node it computes, for reports."""

    node: int
    allocs: tuple[int, ...]
    reads: frozenset[int]


def kernels(nodes: Sequence[int], inputs: Sequence[Sequence[int]], kind: Sequence[str],
            nbytes: Sequence[int], lowered: Lowered, keep: Iterable[int],
            rules: FusionRules) -> tuple[list[Kernel], dict[int, int]]:
    """The kernels of a lowered graph (see Note [Inductor allocation]), and the nodes written in
    place into another node's storage (node -> that storage). ``keep``: storages that must not be
    written in place (graph inputs and outputs)."""
    groups: list[list[int]] = []  # stored nodes of each kernel, in execution order
    for v in nodes:
        if v not in lowered.stored:
            continue
        if rules.kernel_groups and groups and not _is_extern(kind, v) and not _is_extern(kind, groups[-1][-1]):
            groups[-1].append(v)
        else:
            groups.append([v])
    reads = {v: frozenset().union(*(lowered.reads.get(u, frozenset()) for u in inputs[v])) - {v}
             for g in groups for v in g}
    group_of = {v: i for i, g in enumerate(groups) for v in g}
    keep = set(keep)
    if rules.local_buffers:
        readers: dict[int, list[int]] = {}
        for v, rd in reads.items():
            for u in rd:
                readers.setdefault(u, []).append(v)
        local = {v for v in group_of if _kind(kind, v) == "pointwise" and v not in keep and readers.get(v)
                 and all(group_of[w] == group_of[v] and _kind(kind, w) in ("pointwise", "reduction")
                         for w in readers[v])}
        groups = [[v for v in g if v not in local] for g in groups]
        reads = {v: rd - local for v, rd in reads.items() if v not in local}
    last: dict[int, int] = {}
    for v, rd in reads.items():
        for u in rd:
            last[u] = max(last.get(u, -1), group_of[v])
    alias: dict[int, int] = {}  # a node written in place -> the storage it took over
    if rules.inplace:
        for i, g in enumerate(groups):
            for v in g:
                if not nbytes[v] or _is_extern(kind, v):
                    continue
                for u in sorted(reads[v]):
                    s = alias.get(u, u)
                    if (s in lowered.stored and s not in keep and s not in alias.values()
                            and group_of[s] < i and last.get(s) == i and nbytes[s] == nbytes[v]):
                        alias[v], last[s] = s, max(i, last.get(v, i))
                        if v in keep:
                            keep.add(s)
                        break
    out = [Kernel(g[-1], tuple(v for v in g if nbytes[v] and v not in alias),
                  frozenset(alias.get(u, u) for v in g for u in reads[v])) for g in groups if g]
    return out, alias


def _kind(kind: Sequence[str], v: int) -> str:
    return kind[v] if v < len(kind) else "extern"


def _is_extern(kind: Sequence[str], v: int) -> bool:
    return _kind(kind, v) == "extern"
