"""Which values of one graph Inductor stores in memory (*realizes*), and which it inlines into
the kernels that read them. Pure: no torch import.

``lower`` decides, for one graph, which values become *buffers*,
following Inductor's lowering (``torch/_inductor/graph.py: GraphLowering.run_node``,
``ir.py: StorageBox.realize_hint / mark_reuse / has_exceeded_max_reads``,
``lowering.py: make_reduction, needs_realized_inputs``; ``versions.HOOKS["realization"]``):

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
  - a 2-D pad that a matmul reads reads it (``NodeLowering.stores_operand``;
    ``versions.HOOKS["padded_operand_stored"]``);

* a stored value that loads nothing is recomputed by its pointwise readers (Note [Stored values
  that load nothing]);
* views alias the value they view (stored or inlined alike); a view's readers count as its
  value's (Note [Readers of a view]); on a GPU, an extern kernel reads a view that padded strides
  cannot express through a copy (``Lowered.copies``; Note [Padded strides] in
  ``remat.backends.inductor.padding``; ``versions.HOOKS["comprehensive_padding"]``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..facts import FusionGraph, Kind
from .rules import FusionRules

__all__ = ["Lowered", "lower"]

# Note [Inductor realization]
# Inductor decides while lowering the fx graph, node by node, whether a pointwise value gets a
# buffer. The thresholds (``FusionRules``) are torch/_inductor/config.py's
# (versions.HOOKS["realization"]): realize_reads_threshold = 4; realize_acc_reads_threshold = 8
# (realize_cpu_acc_reads_threshold = 12 on CPU); realize_opcount_threshold = 30
# (realize_cpu_opcount_threshold = 50 on CPU). "Several readers" counts the distinct fx users of the
# node in its graph (the output node is one). The op count of an inlined expression is estimated
# from the ops folded into it (``NodeLowering.ops``), its distinct constants, and one load per
# buffer it reads with what reading it brings along (``load_ops``; Note [Inlined op counts]);
# "reads" are the distinct buffers it loads.
#


# Note [Stored values that load nothing]
# A stored pointwise value whose expression loads no buffer (index arithmetic from an iota: T5's
# relative position buckets, computed from positions alone) is stored, but the kernels that read
# it recompute it instead of loading it (``ir.py: ComputedBuffer.make_loader`` inlines a buffer of
# no reads; versions.HOOKS["realization"]). So its readers' expressions carry its ops, and load
# nothing from it; an extern kernel still reads the buffer. Measured with ``inner_fn_opcount``:
# T5's embedding gather of its buckets (a saved value) is 27 ops in Inductor, 26 in the model (7
# before: a load of the buckets). That count decides what T5's backward stores: under 30 ops, the
# recomputed gather stays inlined where the mask is added to it, and the sum (the position bias,
# 192 MiB at the benchmark's size) is what is stored for its twelve readers, as Inductor does; the
# model had stored the gather (6 MiB) and inlined the sum (``benchmarks/gpu_offline.py --models t5
# --budgets 0.5``, the oldest verified torch: 4,167.9 MiB simulated, now 4,353.9, against 4,376.6 read).


# Note [Readers of a view]
# A view of an inlined value is lowered as an index mapping over the same storage box, and what
# Inductor does for a node with several readers (``graph.py: run_node``: ``realize_hint`` where one
# reads it through a matmul, ``mark_reuse``) it does to that box when the view is the node with
# the readers (``BaseView.mark_reuse`` and ``realize_hint`` pass through to the viewed box). So a
# value whose one reader is a view with two readers is stored as one with two readers would be
# (read in the sources of the versions versions.HOOKS["realization"] names).


@dataclass(frozen=True)
class Lowered:
    """One graph after lowering. ``stored``: nodes that get a buffer (views excluded). ``reads``:
    for every node of the graph, the storages a kernel reading it loads (the node's own buffer,
    a viewed buffer, or the buffers an inlined expression reads). Storages are node ids."""

    stored: frozenset[int]
    reads: dict[int, frozenset[int]] = field(default_factory=dict)
    copies: frozenset[int] = frozenset()
    """Views of a padded buffer that an extern kernel reads through a copy, stored just before it
    (Note [Padded strides] in ``remat.backends.inductor.padding``); other readers read the
    view's base."""


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

    cheap: dict[int, _Expr] = {}  # stored values that load nothing: pointwise readers inline them
    copies: set[int] = set()  # views an extern kernel reads through a copy of their own

    def store(v: int) -> None:
        v = base.get(v, v)
        if v in expr:
            if not expr[v].reads:  # Note [Stored values that load nothing]
                cheap[v] = expr[v]
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
            if b in expr and len(users[v]) > 1:  # Note [Readers of a view]
                _realize_pointwise(b, expr[b], users[v], False, g, rules, store)
            if (g.facts[v].copy_nbytes and v not in g.given and _padded(b, g) and len(users[v]) > 1
                    and any(g.facts[w].fixes_layout for w in users[v])):
                stored.add(v)  # Note [Padded strides]: Inductor replaces the view by a copy for all its readers
                reads[v] = frozenset({v})
                base[v] = v
            continue
        if k is Kind.POINTWISE:
            if g.facts[v].stores_operand:  # Note [A padded matmul operand is stored]
                for u in args:
                    store(u)
            for u in args:
                b = base.get(u, u)
                if b in expr and _broadcasts(v, b, g) and _realize_broadcast(expr[b], rules):
                    store(b)
            inlined = [expr.get(b) or cheap[b] for b in (base.get(u, u) for u in args) if b in expr or b in cheap]
            rd = frozenset().union(*(reads[u] for u in args if base.get(u, u) not in cheap))
            members = frozenset({v}).union(*(e.members for e in inlined))
            consts = frozenset().union(*(g.facts[w].consts for w in members), *(g.facts[r].load_consts for r in rd))
            e = _Expr(rd, members, sum(g.facts[w].ops for w in members) + len(consts)
                      + sum(1 + g.facts[r].load_ops for r in rd),
                      g.facts[v].heavy or any(e.heavy for e in inlined))
            expr[v], reads[v] = e, rd
            _realize_pointwise(v, e, users[v], v in outs, g, rules, store)
            continue
        if k is Kind.EXTERN:
            for u in args:
                store(u)
                if g.facts[u].copy_nbytes and u not in g.given and _padded(base.get(u, u), g):
                    copies.add(u)  # Note [Padded strides]: Inductor copies the view for this kernel
        stored.add(v)
        reads[v] = frozenset({v})
    for v in outs:
        if v in member:
            store(v)
    return Lowered(frozenset(stored | copies), reads, frozenset(copies))


def _padded(b: int, g: FusionGraph) -> bool:
    """Whether ``b``'s buffer has padded strides in this graph (Note [Padded strides]): only a
    value a pointwise or reduction kernel stores has padded bytes, and a graph that stores it
    unpadded gives it its plain ones (``kernel_model.stored_bytes``)."""
    f = g.facts[b]
    return bool(f.padded_nbytes) and g.nbytes[b] == f.padded_nbytes


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
# lowers it through ``expand``, which marks the operand reused once per copy (``lowering.py:
# expand``, ``mark_reuse(..., graph_reuse=False)``; versions.HOOKS["broadcast_realization"]). That
# is not graph fanout: the read-count test does not apply, but the others of
# ``StorageBox.should_realize_on_reuse`` do, so an inlined operand with an ``exp``/``log``/... (CPU)
# or more than ``opcount_threshold`` ops is stored, however few fx readers it has. The loss's
# ``log(sum(exp(x - max)))`` is the case that matters: on CPU the [rows, 1] log is stored, so ``x -
# max - log(...)`` (the log-softmax, [rows, vocab] in float32) holds no heavy op and stays inlined
# into its two readers (the gather of the target's entry and the saved softmax) instead of taking a
# buffer (HF Llama's LM loss, vocab 32000: a 62.5 MiB float32 buffer at 512 tokens that Inductor
# never allocates).


def _broadcasts(v: int, u: int, g: FusionGraph) -> bool:
    """Whether pointwise ``v`` reads ``u`` broadcast (``u`` has fewer elements, both known)."""
    return 0 < g.numel_of(u) < g.numel_of(v)


def _realize_broadcast(e: _Expr, rules: FusionRules) -> bool:
    """Whether Inductor stores an inlined value a pointwise op broadcasts (Note [Broadcast
    realization]): ``should_realize_on_reuse`` without its read-count test."""
    return (rules.realize_heavy_reuse and e.heavy) or e.ops > rules.opcount_threshold
