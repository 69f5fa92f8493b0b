"""How Inductor's kernels allocate the buffers of one lowered graph. Pure: no torch import.

``kernels`` groups one lowered graph into the kernels the simulator replays, each with the
storages it allocates before it runs and the storages it reads (Note [Inductor allocation]):
fused kernels allocate all their buffers up front (``kernel_groups``); a buffer read only row by
row inside its own fused kernel is never allocated (``local_buffers``), and what it reads stays
alive until that kernel runs; a kernel writes in place into a same-sized buffer it reads for the
last time (``inplace``); a freed buffer is held for a later one of its size (``reuse``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from ..facts import FusionGraph, Kind
from .realization import Lowered
from .reuse import Fused, reuse, storage_of
from .rules import FusionRules

__all__ = ["Kernel", "kernels", "storage_of"]

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
#   inputs stay stored (``mix_order_splits``; scheduler.py: MixOrderReduction, on by default:
#   versions.HOOKS["mix_order_reduction"]).
# Within these groups the wrapper writes a kernel's output into a same-sized input it reads for
# the last time (config.inplace_buffers), and holds a freed buffer for a later one of the same
# size and dtype when Inductor's own peak estimate allows it (config.allow_buffer_reuse;
# wrapper.py: AllocateLine.plan). These rules reproduce the measured peaks of the reference
# workloads to a few percent (benchmarks/README.md); they are not Inductor's scheduler, and a
# graph whose fusion they misjudge is mispredicted (versions.HOOKS["kernel_fusion"]).


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
    reads = {v: frozenset().union(*(_read(u, v, g, lowered) for u in g.inputs[v])) - {v}
             for v in g.order if v in lowered.stored}
    groups, mixed = _groups(g, lowered, rules, reads)
    whole, whole_reads = groups, reads  # what Inductor's own peak estimate counts (Note [Reuse estimate])
    direct = reads  # what each node's own code reads, local buffers included (``_inplace``)
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
    kernel_of: dict[int, int] = {}  # every stored node, local ones too -> its kernel (-1: none is left)
    k = 0
    for grp, w in zip(groups, whole):
        kernel_of.update((v, k if grp else -1) for v in w)
        k += bool(grp)
    groups = [grp for grp in groups if grp]
    alias: dict[int, int] = {}
    if rules.inplace:
        alias = _inplace(groups, reads, direct, kernel_of, g, lowered, keep, rules.inplace_in_kernel)
    fine = groups  # Inductor estimates its peak per fused kernel, before C++ kernel groups merge
    end = list(range(len(groups)))  # per group: the index in ``fine`` of its last kernel
    if rules.one_kernel_between_externs:  # frees happen after the merged kernel: reuse across it
        groups, end = _merged(groups, g, rules)
    if rules.reuse:
        alias = reuse(Fused(groups, reads, fine, end, estimated, whole_reads), g, alias, rules.reuse_margin,
                      rules.reuse_estimate_buffers)
    alias = {v: storage_of(alias, v) for v in alias}
    held = _mix_order_workspace(groups, mixed, reads, g, rules)
    out = [Kernel(tuple(grp), tuple(v for v in grp if g.nbytes[v] and v not in alias),
                  frozenset(alias.get(u, u) for v in grp for u in reads[v]), held[i]) for i, grp in enumerate(groups)]
    return out, alias


def _read(u: int, v: int, g: FusionGraph, lowered: Lowered) -> frozenset[int]:
    """The storages stored node ``v`` loads for its operand ``u``: an extern kernel reads a copied
    view's copy (``Lowered.copies``), everything else what ``u``'s value lives in."""
    if u in lowered.copies and g.is_extern(v):
        return frozenset({u})
    return lowered.reads.get(u, frozenset())


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


def _groups(g: FusionGraph, lowered: Lowered, rules: FusionRules,
            reads: dict[int, frozenset[int]]) -> tuple[list[list[int]], set[int]]:
    """Stored nodes per kernel: one each, or (``kernel_groups``) every run of non-extern ones.
    With ``mix_order_splits``, a reduction over leading dimensions that shares a full read with
    a reduction over trailing dimensions starts a new run: Inductor fuses the two into a
    mix-order reduction kernel with the row-wise work between them, not with what came before
    (``scheduler.py: MixOrderReduction``; ``versions.HOOKS["mix_order_reduction"]``)."""
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
    blocks: set[str] = set()  # the blocks of the current run of non-extern kernels
    run: list[int] = []  # the current run's kernels: indices into ``groups``
    space: dict[int, tuple[int, int]] = {}  # per kernel of the run: its iteration space (Note [One iteration space])
    where: dict[int, int] = {}  # stored node -> its kernel
    order = _randoms_at_readers(g, lowered, reads) if rules.random_at_reader else list(g.order)
    order = _copies_at_readers(order, g, lowered)
    for v in order:
        if v not in lowered.stored:
            continue
        b = g.facts[v].block if rules.stage_local else None
        if groups and g.is_extern(v) and _output_of(v, groups[-1], reads, g):
            groups[-1].append(v)  # one output of a multi-output extern kernel: allocated by it
            where[v] = len(groups) - 1
            continue
        same_run = (rules.kernel_groups and groups and v not in mixed and not g.is_extern(v)
                    and not g.is_extern(groups[-1][-1]) and (b is None or not blocks or b in blocks))
        mine = _iteration_space(v, g) if rules.one_iteration_space else (0, 0)
        k = None
        if same_run:
            k = _kernel_for(mine, reads[v], run, space, where) if rules.one_iteration_space else run[-1]
        else:
            run, blocks = [], set()  # an extern kernel, a mix-order kernel or another block starts a run
        if k is None:
            groups.append([v])
            k = len(groups) - 1
            run.append(k)
            space[k] = mine
        else:
            groups[k].append(v)
            space[k] = _joined(space[k], mine)
        where[v] = k
        if b is not None:
            blocks.add(b)
    if rules.horizontal_fusion:
        groups = _siblings_fused(groups, mixed, reads, g, rules)
    return groups, mixed


# Note [Random values at their readers]
# Inductor stores a random value (``lowering.py: inductor_random`` realizes it), and its scheduler
# fuses it into the kernel of its reader (a dropout mask's compare), where, read nowhere else, it
# is a kernel-local buffer, never allocated. The model counted random values as stored buffers of
# their own, allocated wherever the graph had them. Now ``_randoms_at_readers`` moves each to just
# before its first stored reader, so it joins that reader's kernel, and ``_local_buffers`` treats
# it as a stored pointwise value: one read only in its kernel is not allocated. HF BERT-base at 0.5
# with attention dropout (Inductor's CUDA lowering without a GPU, benchmarks/gpu_offline.py):
# simulated 6,734 MiB against 6,311 read, now 6,616 (+6.7% to +4.8%; the two parts were not
# measured apart, and the rest is not found yet; versions.HOOKS["random_at_reader"]).


def _randoms_at_readers(g: FusionGraph, lowered: Lowered, reads: dict[int, frozenset[int]]) -> list[int]:
    """``g.order`` with each stored random value moved to just before the first stored node that
    reads it (Note [Random values at their readers]); one nothing stored reads stays."""
    first: dict[int, int] = {}  # random value -> its first stored reader, itself not random (seeds stay)
    for w in g.order:
        if w in lowered.stored and g.kind(w) is not Kind.RANDOM:
            for u in reads.get(w, ()):
                if g.kind(u) is Kind.RANDOM and u in lowered.stored:
                    first.setdefault(u, w)
    return _moved_before(g.order, first)


def _copies_at_readers(order: list[int], g: FusionGraph, lowered: Lowered) -> list[int]:
    """``order`` with each copied view (``Lowered.copies``) moved to just before the first extern
    kernel reading it: Inductor makes the copy while it lowers that kernel (Note [Padded
    strides] in ``remat.backends.inductor.padding``; ``versions.HOOKS["comprehensive_padding"]``)."""
    if not lowered.copies:
        return order
    first: dict[int, int] = {}
    for w in order:
        if g.is_extern(w):
            for u in g.inputs[w]:
                if u in lowered.copies:
                    first.setdefault(u, w)
    return _moved_before(order, first)


def _moved_before(order: Sequence[int], first: dict[int, int]) -> list[int]:
    """``order`` with each node of ``first`` moved to just before the node it maps to (several
    before one in id order)."""
    before: dict[int, list[int]] = {}
    for u, w in first.items():
        before.setdefault(w, []).append(u)
    out: list[int] = []
    for v in order:
        if v in first:
            continue
        out += sorted(before.get(v, ()))
        out.append(v)
    return out


# Note [Sibling kernels fused]
# Inductor's scheduler fuses two kernels that read a common buffer and loop over the same number
# of elements even when no value flows between them (horizontal fusion: scheduler.py,
# get_possible_fusions groups nodes by the buffers they share; Triton's can_fuse_horizontal
# checks the sizes), as long as the fusion creates no cycle. The fused kernel runs where the
# first of the two did, so the second one's output is allocated there, before the kernels that
# ran between them. The model's groups follow the graph's order, so a later stored node is moved
# into an earlier group when everything it reads exists by then, it shares a read with a node of
# that group of its own size, and both belong to one block (stage-local fusion). Found with
# benchmarks/gpu_offline.py: HF GPT-2's padded LM head (Inductor's pad_mm) pads the logits'
# gradient twice, for the weight's gradient and for the input's; one kernel writes both pads
# while the gradient is alive, three logits-sized buffers at once (the model had two).


def _siblings_fused(groups: list[list[int]], mixed: set[int], reads: dict[int, frozenset[int]], g: FusionGraph,
                    rules: FusionRules) -> list[list[int]]:
    """``groups`` with each later stored node that Inductor fuses horizontally into an earlier
    group moved there (Note [Sibling kernels fused]). Each group takes, in graph order, the later
    nodes that share a read of its own size with one of its nodes (its own or taken before them),
    read nothing computed after it and are of its block; found through the readers of each read
    buffer, so the cost follows the shared reads, not the number of groups squared."""
    where: dict[int, int] = {v: i for i, grp in enumerate(groups) for v in grp}
    pos = {v: k for k, v in enumerate(v for grp in groups for v in grp)}  # groups hold their nodes in graph order
    movable = {v for grp in groups if grp and not g.is_extern(grp[0]) and grp[0] not in mixed for v in grp}
    readers: dict[int, list[int]] = {}  # a read buffer -> the movable nodes reading it, in graph order
    for v in sorted(movable, key=pos.__getitem__):
        for u in reads[v]:
            readers.setdefault(u, []).append(v)
    groups = [list(grp) for grp in groups]
    for i, grp in enumerate(groups):
        if not grp or g.is_extern(grp[0]) or grp[0] in mixed:
            continue
        block = g.facts[grp[0]].block if rules.stage_local else None
        sized: dict[int, set[int]] = {}  # a buffer this group reads -> the sizes of its nodes reading it
        heap: list[tuple[int, int]] = []
        queued: set[int] = set()
        last = pos[grp[-1]]  # later nodes are visited once, in graph order, after the group's own

        def share(v: int, at: int) -> None:  # v joined the group at position ``at``: queue later readers
            for u in reads[v]:
                sized.setdefault(u, set()).add(g.elements(v))
                for w in readers.get(u, ()):
                    if pos[w] > at and w not in queued and where[w] > i:
                        queued.add(w)
                        heapq.heappush(heap, (pos[w], w))

        for v in list(grp):
            share(v, last)
        while heap:
            _, v = heapq.heappop(heap)
            if where[v] <= i or (block is not None and g.facts[v].block != block) or not g.elements(v):
                continue
            if any(where.get(u, -1) > i for u in reads[v]):
                continue  # it reads something computed after this group
            if any(g.elements(v) in sized.get(u, ()) for u in reads[v]):
                groups[where[v]].remove(v)
                grp.append(v)
                where[v] = i
                share(v, pos[v])
    return [grp for grp in groups if grp]


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
# Triton reduces a row of more than 1024 elements (``triton.persistent_reductions``' limit for inner
# reductions; versions.HOOKS["persistent_reductions"]) in a loop over blocks of it, and a fused
# kernel whose work depends on such a reduction's result loops over the row again: a layer norm's
# backward reads the row once to sum it and once more to use the sums. A value the first pass
# computes and the second reads cannot stay in registers: the kernel stores it in the first pass and
# loads it in the second (the pointwise workload's backward kernels, rows of 4096, store tanh and
# sigmoid this way; ``benchmarks/mem_trace.py`` shows the buffers). The kernel may then write a
# later value of the same size into that buffer in place (``_inplace``).


# Note [One iteration space]
# A Triton kernel loops over one iteration space: ``numel`` elements, each reducing ``rnumel``
# (1 for pointwise work). Inductor fuses two pointwise nodes only where their numels are equal,
# two reductions only where both numbers are (or as a mix-order reduction, modelled apart), and a
# pointwise node into a reduction's kernel only where it loops over the reduction's input
# (``numel x rnumel``) or over its output (``numel``; ``codegen/simd.py: can_fuse``). The stored
# work between two extern kernels is therefore one kernel per iteration space, not one kernel:
# HF GPT-2's padded LM head computes the logits' gradient (8192 x 50257) in one kernel, which
# frees the saved logits, and pads it to 8192 x 50264 in the next (H100: the model
# had both in one kernel with the logits alive, 785 MiB over the peak Inductor planned).
# ``_kernel_for`` puts a node into the latest kernel of its run whose space it fits and that
# runs after every kernel of the run it reads from, or into a new kernel where none does; the
# C++ backend loops over any number of spaces in one kernel (``one_kernel_between_externs``).
# With the bf16 gradient stored as Inductor stores it (Note [A padded matmul operand is stored]),
# HF GPT-2 with every misaligned matmul padded is predicted at 3,952 MiB against 3,954 read (it
# was +19.8%; benchmarks/gpu_offline.py --pad-mm force; versions.HOOKS["iteration_space"]).


def _iteration_space(v: int, g: FusionGraph) -> tuple[int, int]:
    """The (numel, rnumel) a Triton kernel computing ``v`` loops over (Note [One iteration
    space]); (0, 0) where a size is unknown: fits every kernel. A reduction's input size is its
    largest operand's; a view operand counts its base's elements, which a slice exceeds, so
    views are left out."""
    out = g.elements(v)
    if g.kind(v) not in (Kind.REDUCTION, Kind.OUTER_REDUCTION):
        return (out, 1) if out else (0, 0)
    full = max((g.numel_of(u) for u in g.inputs[v] if g.kind(u) is not Kind.VIEW), default=0)
    if not out or not full or full % out:
        return (0, 0)
    return (out, full // out)


def _fits(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether work of iteration spaces ``a`` and ``b`` can share one Triton kernel."""
    if not a[0] or not b[0]:
        return True
    if a[1] == 1 and b[1] == 1:
        return a[0] == b[0]
    if a[1] != 1 and b[1] != 1:
        return a == b
    (n, _), (m, r) = (a, b) if a[1] == 1 else (b, a)
    return n in (m, m * r)


def _joined(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """The iteration space of a kernel of space ``a`` that takes work of space ``b``."""
    if not a[0]:
        return b
    return b if b[0] and b[1] != 1 else a


def _kernel_for(mine: tuple[int, int], reads: frozenset[int], run: list[int], space: dict[int, tuple[int, int]],
                where: dict[int, int]) -> int | None:
    """The kernel of the current run that a node of iteration space ``mine`` reading ``reads``
    joins, or None for a new one (Note [One iteration space])."""
    after = max((where[u] for u in reads if u in where), default=-1)
    for k in reversed(run):
        if k < after:
            break
        if _fits(space[k], mine):
            return k
    return None


def _output_of(v: int, group: list[int], reads: dict[int, frozenset[int]], g: FusionGraph) -> bool:
    """Whether ``v`` unpacks one output of a multi-output extern kernel of ``group`` (the tuple
    node owns no storage; its outputs are allocated when that kernel runs)."""
    (u,) = reads[v] if len(reads[v]) == 1 else (None,)
    return u is not None and u in group and g.is_extern(u) and not g.elements(u)


def _local_buffers(groups: list[list[int]], reads: dict[int, frozenset[int]], g: FusionGraph,
                   keep: frozenset[int], passes: dict[int, int], registers: bool) -> set[int]:
    """Stored pointwise and random values that every reader reads inside the same group, row by row
    (pointwise or a reduction over trailing dimensions): C++ outer-loop fusion keeps them in a
    per-row local buffer (``cpp.py: try_outer_loop_fusion_with_local_buf``; ``versions.HOOKS["kernel_fusion"]``), Triton
    in registers, unless a later pass of a looped reduction reads them (``passes``, Note [Looped
    reductions])."""
    group_of = {v: i for i, grp in enumerate(groups) for v in grp}
    readers: dict[int, list[int]] = {}
    for v, rd in reads.items():
        for u in rd:
            readers.setdefault(u, []).append(v)

    def work(w: int) -> Kind:  # a stored view is a copy (Note [Padded strides]): pointwise work
        return Kind.POINTWISE if g.kind(w) is Kind.VIEW else g.kind(w)

    return {v for v in group_of if g.kind(v) in (Kind.POINTWISE, Kind.RANDOM) and v not in keep and readers.get(v)
            and all(group_of.get(w) == group_of[v] for w in readers[v])
            and (registers or len({work(w) for w in readers[v]}) == 1)
            and all(work(w) in (Kind.POINTWISE, Kind.REDUCTION) for w in readers[v])
            and all(passes.get(w, 0) == passes.get(v, 0) for w in readers[v])}


def _through_local(reads: dict[int, frozenset[int]], local: set[int]) -> dict[int, frozenset[int]]:
    """``reads`` without the ``local`` buffers: a reader of one reads what it reads instead (its
    kernel computes it from those, so they stay alive until that kernel has run)."""
    out: dict[int, frozenset[int]] = {}
    for v, rd in reads.items():  # execution order: a local buffer comes before its readers
        out[v] = frozenset().union(*(out.get(u, frozenset()) if u in local else frozenset({u}) for u in rd))
    return {v: rd for v, rd in out.items() if v not in local}


def _inplace(groups: list[list[int]], reads: dict[int, frozenset[int]], direct: dict[int, frozenset[int]],
             kernel_of: dict[int, int], g: FusionGraph, lowered: Lowered, keep: frozenset[int],
             in_kernel: bool) -> dict[int, int]:
    """A generated kernel writes an output into a same-sized buffer of an earlier kernel that it
    reads for the last time (``config.inplace_buffers``, ``BaseSchedulerNode.decide_inplace_update``);
    with ``in_kernel``, also into one an earlier node of its own kernel stored. ``reads``: the
    storages each node keeps alive (through the local buffers it reads); ``direct``: the ones its
    own code reads, the only ones Inductor writes it into: a buffer a local one was computed from
    is read by that local buffer's node (HF Llama's loss backward on a GPU: the logits' gradient,
    computed from a float32 local buffer, is not written into the recomputed logits). A buffer of
    an earlier kernel is taken only by its one reader in this kernel: Inductor writes in place
    where the buffer has no other use left (ViT-B/16's recomputed GELU input, read by the GELU
    and by its derivative in one kernel, is not overwritten by the GELU)."""
    nbytes = g.nbytes
    group_of = {v: i for i, grp in enumerate(groups) for v in grp}
    pos = {v: k for grp in groups for k, v in enumerate(grp)}
    last: dict[int, tuple[int, int]] = {}  # storage -> (group, position) of its last reader
    for v, rd in reads.items():
        for u in rd:
            last[u] = max(last.get(u, (-1, -1)), (group_of[v], pos[v]))
    users: dict[tuple[int, int], set[int]] = {}  # (storage, group) -> the nodes of it whose code reads it
    for v, rd in direct.items():
        for u in rd:
            users.setdefault((u, kernel_of.get(v, -1)), set()).add(v)
    alias: dict[int, int] = {}
    taken: set[int] = set()
    for i, grp in enumerate(groups):
        for v in grp:
            if not nbytes[v] or g.is_extern(v):
                continue
            for u in sorted(direct[v]):
                s = alias.get(u, u)
                before = group_of.get(s, i) < i  # an earlier kernel's: this node must be its one reader here
                earlier = (before and users.get((s, i), set()) <= {v}) or (
                    in_kernel and group_of.get(s) == i and pos[s] < pos[v])
                if (s in lowered.stored and s not in keep and s not in taken and earlier and not g.facts[s].own_buffer
                        and last.get(s, (-1, -1))[0] == i and (last[s][1] == pos[v] or before)
                        and nbytes[s] == nbytes[v] and g.dtype(s) == g.dtype(v)):
                    alias[v], last[s] = s, max(last[s], last.get(v, (i, pos[v])))
                    taken.add(s)
                    break
    return alias


# Note [Mix-order workspace]
# A mix-order reduction kernel (GPU) reduces the batch in splits of ``split`` rows and writes
# each split's partial sums to a float32 workspace, ``cols x ceil(rows / split)`` per batch
# reduction it computes (a layer norm's weight and bias gradients: two), summed afterwards.
# ``split`` is the largest power of two at most ``rows / (8 x SMs)``, clamped to 16..128
# (codegen/simd.py: _codegen_mix_order_reduction; versions.HOOKS["mix_order_reduction"]). The
# wrapper hands the workspace from one mix-order kernel to the next of its size (``workspace_6 =
# workspace_5  # reuse``), so it is held from the first such kernel of a graph to the last
# (measured: 4 MiB through the gpt backward, 16 MiB through mlp's; ``benchmarks/mem_trace.py``).


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
            # Inductor's conditions (MixOrderReduction.can_fuse): a large batch of not too many
            # columns (``FusionRules.mix_order``), and a sibling row reduction of the same input
            # (neither feeds the other; a bias gradient computed from the row sums' result is a
            # plain split reduction instead) in the same block (stage-local fusion).
            if not rules.mix_order.fuses(rows, cols):
                continue
            mine = _upstream(v, reads)
            if not any(full in reads[w] and w not in mine and v not in _upstream(w, reads)
                       for h in groups for w in h if w in reads and w not in mixed and w != v
                       and numel(w) == rows and _one_block(g, [v, w], rules)):
                continue
            split = rules.mix_order.split(rows, rules.sm_count)
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
