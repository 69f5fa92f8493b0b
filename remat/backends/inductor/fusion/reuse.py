"""Which freed buffer a later buffer of a lowered graph takes, as Inductor's wrapper decides it
against its own estimate of the graph's peak (Note [Reuse estimate]). Pure: no torch import."""

from __future__ import annotations

from dataclasses import dataclass

from ..facts import FusionGraph

__all__ = ["Fused", "reuse", "storage_of"]

@dataclass(frozen=True)
class Fused:
    """A lowered graph's kernels, as buffer reuse decides over them (``reuse``)."""

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


def reuse(fused: Fused, g: FusionGraph, alias: dict[int, int], margin: float,
          own_buffers: bool = False) -> dict[int, int]:
    """Inductor's wrapper reuses a freed buffer for a later one of the same size and dtype instead
    of freeing it, holding it meanwhile, when the kernels are adjacent or its own estimate of the
    graph's peak (bytes after each kernel, freeable inputs counted) allows it
    (``codegen/wrapper.py: AllocateLine.plan, EfficientPeakEstimate``;
    ``versions.HOOKS["buffer_reuse_estimate"]``). Freed buffers
    are reused last in, first out. ``margin``: ``FusionRules.reuse_margin``; ``own_buffers``:
    ``FusionRules.reuse_estimate_buffers``."""
    groups, reads, end, nbytes, given, outs = fused.groups, fused.reads, fused.end, g.nbytes, g.given, g.output_storages
    alias = dict(alias)
    after = _estimate(fused.estimated, fused.estimated_reads, g, own_buffers)
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
            if a not in holders or not pool.get(key) or g.facts[a].own_buffer:
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
            if s not in given and not g.facts[s].own_buffer:
                pool.setdefault((nbytes[s], g.dtype(s)), []).append((s, i))
    return alias


# Note [Reuse estimate]
# Whether the wrapper holds a freed buffer for a later allocation of its size is decided against
# Inductor's own estimate of the graph's peak (``memory.estimate_peak_memory`` over the scheduler
# nodes, ``wrapper.EfficientPeakEstimate``; versions.HOOKS["buffer_reuse_estimate"]), made before
# code is generated. It counts the freeable inputs (the graph's inputs but parameters and output
# gradients, ``utils.is_nonfreeable_buffers``) from the start to their last reader, and the
# graph's own buffers only where Inductor sized them for the estimate, which its peak-memory
# reordering does (``memory.assign_memory_planning_info_for_scheduler_buffers``): otherwise each
# counts 0 bytes. remat compiles its plans with that reordering off (Note [remat's order kept]),
# so for them (``FusionRules.reuse_estimate_buffers`` False) a backward's estimate is its saved
# values, falling as they die, and a forward's is 0: a buffer is held for a later one only for
# the next kernel, or where it fits under the saved values still alive. ViT-B/16 at
# ``budget=0.5`` (Inductor's CUDA lowering without a GPU, on the oldest version the hook names):
# Inductor estimated the backward's peak at 928.3 MiB, its saved values, and freed each block's
# 147.75 MiB MLP buffers where the model's copy, counting every buffer (1,516 MiB), held two of them through every
# attention backward for the next block: simulated 1,615 MiB against 1,410 read, 1,330 with the
# estimate as Inductor makes it. Where the reordering runs (torch.compile's own partition, a
# tuning candidate) every buffer counts from its first writer to its last reader, and a
# kernel's output beside the input it is later written into in place, also the ones code
# generation then keeps in registers or a per-row local buffer.


def _estimate(groups: list[list[int]], reads: dict[int, frozenset[int]], g: FusionGraph,
              own_buffers: bool) -> list[int]:
    """Inductor's own estimate of live bytes at each kernel (``memory.estimate_peak_memory``):
    freeable inputs (all but ``g.nonfreeable``) from the start to their last reader and, with
    ``own_buffers``, each storage from its first writer to its last reader (outputs to the end)."""
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
    for u in given - g.nonfreeable:
        if nbytes[u] and u in last:
            delta[0] += nbytes[u]
            delta[last[u] + 1] -= nbytes[u]
    kept = g.output_storages
    for s, i in first.items():
        if own_buffers and nbytes[s] and s not in given:
            t = n if s in kept else last[s]
            delta[i] += nbytes[s]
            delta[t + 1] -= nbytes[s]
    after, mem = [], 0
    for i in range(n):
        mem += delta[i]
        after.append(mem)
    return after


def storage_of(alias: dict[int, int], v: int) -> int:
    """The node whose storage ``v`` lives in, following ``alias`` chains."""
    while v in alias:
        v = alias[v]
    return v
