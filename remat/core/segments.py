"""Checkpoint segments: plans that bound the backward's working set. Pure Python: no torch import.

The (saved bytes, recompute time) frontier (``remat.core.frontier``) minimises what is *saved*. The
plan that saves least (the network input alone, say) is not the one with the smallest *peak*:
lazily recomputing everything from the input rebuilds all layers at the start of the backward
and keeps most of them alive, so its peak is close to eager's. Checkpointing (Chen et al. 2016,
``torch.utils.checkpoint`` per block) bounds the peak differently: it keeps a few *separator*
values and recomputes each segment between two of them only when the backward reaches it, so
at most one segment is rebuilt at a time.

See Note [Separators]: a forward value ``s`` separates the forward when every forward data
edge that crosses ``s``'s position in graph order leaves ``s`` itself; then everything after
``s`` can be recomputed from ``s`` (and parameters) alone. In a residual network these are the
residual stream between blocks (and, inside a block, the values a single op feeds on).

``checkpoint_sets`` picks, for k = 2, 4, 16 and 64 segments (and one per separator), the
separators that split the forward's bytes most evenly into k parts. Each set, forbidden to be
recomputed through, is then solved like any other problem (``remat.capture.partition`` solves each for
the fewest bytes, cost rules relaxed, recompute time breaking ties); the simulator
(``remat.core.peak``) scores the result.

``nested_sets`` groups a set's checkpoints for nested plans (``remat.planning.nesting``): every ``m``-th
checkpoint stays saved (outer), the others are recomputed by the backward's sweep (inner).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

__all__ = ["separators", "checkpoint_sets", "nested_sets", "SEGMENT_COUNTS"]

SEGMENT_COUNTS = (2, 4, 16, 64)
"""Segment counts tried (capped by the number of separators + 1)."""


def separators(inputs: Sequence[Sequence[int]], activations: Iterable[int]) -> list[int]:
    """Values of ``activations`` (forward values in graph order, those that depend on the
    network's inputs) that separate the forward: no edge between two activations jumps over
    them (see the module docstring). Values nothing in ``activations`` reads are left out."""
    act = sorted(set(activations))
    members = set(act)
    reach = {v: v for v in act}  # the latest activation reading v
    for w in act:
        for u in inputs[w]:
            if u in members and w > reach[u]:
                reach[u] = w
    out: list[int] = []
    furthest = -1  # latest reader of any activation before v
    for v in act:
        if furthest <= v and reach[v] > v:
            out.append(v)
        furthest = max(furthest, reach[v])
    return out


def checkpoint_sets(seps: Sequence[int], weights: Sequence[int], activations: Iterable[int],
                    counts: Sequence[int] = SEGMENT_COUNTS) -> list[tuple[int, ...]]:
    """For each count k in ``counts`` (up to ``len(seps) + 1``, and that maximum itself), the
    separators at which the forward's cumulative ``weights`` (bytes per value) cross
    ``j/k`` of the total, j = 1..k-1. Distinct sets, fewest checkpoints first."""
    if not seps:
        return []
    act = sorted(set(activations))
    running, total = {}, 0
    for v in act:
        total += weights[v]
        running[v] = total
    positions = [running[s] for s in seps]
    ks = sorted({k for k in counts if k <= len(seps) + 1} | {len(seps) + 1})
    out: list[tuple[int, ...]] = []
    for k in ks:
        if k < 2:
            continue
        chosen: set[int] = set()
        for j in range(1, k):
            target = total * j / k
            i = bisect_left(positions, target)
            near = [c for c in (i - 1, i) if 0 <= c < len(seps)]
            chosen.add(seps[min(near, key=lambda c: (abs(positions[c] - target), c))])
        key = tuple(sorted(chosen))
        if key not in out:
            out.append(key)
    return out


def nested_sets(sets: Sequence[tuple[int, ...]], limit: int = 6) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(outer, inner)`` checkpoint pairs for nested plans, from the finest of ``sets`` with at
    least three checkpoints down: groups of ``m`` consecutive checkpoints for ``m`` = 2 and
    ``round(sqrt(len + 1))`` keep every ``m``-th checkpoint saved (outer) and recompute the rest
    (inner); ``m = len + 1`` keeps none (one outer segment from the network's inputs). At most
    ``limit`` distinct pairs."""
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for cps in sorted((s for s in sets if len(s) >= 3), key=len, reverse=True):
        n = len(cps)
        for m in sorted({2, max(2, round((n + 1) ** 0.5)), n + 1}):
            outer = tuple(cps[m - 1::m])
            pair = (outer, tuple(c for c in cps if c not in outer))
            if pair not in out and len(out) < limit:
                out.append(pair)
    return out
