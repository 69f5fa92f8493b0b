"""The memory/recompute Pareto frontier. Pure Python: no torch import.

Every plan has two costs: bytes saved for the backward and seconds of recompute. Minimising
``bytes + w * seconds`` with a min-cut (``solver.solve_weighted``) for a weight ``w`` finds a
plan on the lower convex hull of all plans' (bytes, seconds) points; sweeping ``w`` over its
breakpoints finds every vertex of that hull. ``hull`` does the sweep recursively: between two
vertices A (more bytes, less time) and B, the only weight at which a third vertex can win is
``w* = (bytes_A - bytes_B) / (time_B - time_A)``, where A and B cost the same; solving there
either finds a strictly cheaper plan C (a new vertex; recurse on A-C and C-B) or proves that
A and B are adjacent. The number of min-cuts is about twice the number of vertices.

``best_within_bytes`` answers a budget on saved bytes: the fastest hull vertex that fits,
improved greedily by saving more values while they fit (the hull alone can leave a gap).
"""

from __future__ import annotations

from .solver import Problem, Solution, WeightedCuts, recompute_closure, time_of

__all__ = ["hull", "best_within_bytes", "bytes_first_weight"]

_REL = 1e-9


def _objective(s: Solution, w: float) -> float:
    return s.cost + w * s.time


def bytes_first_weight(p: Problem) -> float:
    """A weight at which all of ``p``'s recompute together weighs under one byte: the weighted
    cut saves the fewest bytes and breaks ties by recompute time (0.0 if nothing costs time)."""
    total = sum(t for t in p.recompute_cost if t > 0) if p.recompute_cost else 0.0
    return 0.5 / total if total else 0.0


def _extremes(p: Problem) -> tuple[float, float]:
    total_bytes = sum(p.cost) + 1
    times = [t for t in p.recompute_cost if t > 0] if p.recompute_cost else []
    if not times:
        return 0.0, 0.0
    # w_hi: one smallest recompute outweighs all bytes; w_lo: bytes_first_weight.
    return total_bytes / min(times) * 2, bytes_first_weight(p)


def hull(p: Problem, max_vertices: int = 256) -> list[Solution]:
    """Vertices of the lower convex hull of (saved bytes, recompute seconds), from the plan that
    recomputes least (most bytes) to the plan that saves least."""
    w_hi, w_lo = _extremes(p)
    cuts = WeightedCuts(p)  # one residual network for every weight
    first = cuts(w_hi)
    if w_hi == 0.0:
        return [first]
    last = cuts(w_lo)
    found: dict[tuple[int, ...], Solution] = {first.saved: first, last.saved: last}

    def between(a: Solution, b: Solution, depth: int) -> None:
        if len(found) >= max_vertices or depth > 64:
            return
        if b.time <= a.time or a.cost <= b.cost:
            return
        w = (a.cost - b.cost) / (b.time - a.time)
        c = cuts(w)
        ref = _objective(a, w)
        if _objective(c, w) < ref - _REL * max(abs(ref), 1.0) and c.saved not in found:
            found[c.saved] = c
            between(a, c, depth + 1)
            between(c, b, depth + 1)

    between(first, last, 0)
    return sorted(found.values(), key=lambda s: (-s.cost, s.time))


def _time(p: Problem, saved: set[int]) -> float | None:
    closure = recompute_closure(p, saved)
    return None if closure is None else time_of(p, closure)


def _cost(p: Problem, saved: set[int]) -> int:
    return sum(p.cost[v] for v in saved)


def _prune(p: Problem, saved: set[int]) -> set[int]:
    """Drop saved values that neither the backward nor any recompute reads."""
    while True:
        closure = set(recompute_closure(p, saved) or ())
        keep = {u for u in saved if u in p.needed or any(u in p.inputs[w] for w in closure)}
        if keep == saved:
            return saved
        saved = keep


def _repair(p: Problem, saved: set[int], budget: int) -> set[int] | None:
    """Unsave values (cheapest extra recompute per byte first) until the plan fits."""
    saved = set(saved)
    while _cost(p, saved) > budget:
        t0 = _time(p, saved) or 0.0
        best = None
        for u in saved:
            t = _time(p, saved - {u})
            if t is not None and p.cost[u] > 0:
                score = (t - t0) / p.cost[u]
                if best is None or score < best[0]:
                    best = (score, u)
        if best is None:
            return None
        saved = _prune(p, saved - {best[1]})
    return saved


def _improve(p: Problem, saved: set[int], budget: int, swaps: bool) -> set[int]:
    """Hill-climb: save one more value, or swap one saved value for another (each followed by
    dropping saved values nothing reads any more), while it fits and recompute time falls."""
    cur = _time(p, saved)
    assert cur is not None
    while True:
        move = None
        adds = [saved | {v} for v in range(p.n) if v not in saved and v not in p.no_save]
        swapped = ([(saved - {u}) | {v} for u in saved for v in range(p.n) if v not in saved
                    and v not in p.no_save] if swaps else [])
        for cand in adds + swapped:
            t = _time(p, cand)
            if t is None or t >= cur - 1e-15:
                continue
            cand = _prune(p, cand)
            c = _cost(p, cand)
            if c > budget:
                continue
            score = (cur - t, -c)
            if move is None or score > move[0]:
                move = (score, cand)
        if move is None:
            return saved
        saved = move[1]
        cur = _time(p, saved)


def best_within_bytes(p: Problem, vertices: list[Solution], budget: int, search_up_to: int = 200) -> Solution | None:
    """The fastest plan found with saved bytes <= budget. Starts: the fastest hull vertex that
    fits, and the next faster vertex cut down greedily to fit; each start is improved by saving
    one more value or swapping one saved value for another while the recompute time falls.
    None if no vertex fits. Swaps are tried for problems of at most ``search_up_to`` values."""
    fitting = [s for s in vertices if s.cost <= budget]
    if not fitting:
        return None
    best_fit = min(fitting, key=lambda s: (s.time, s.cost))
    starts = [set(best_fit.saved)]
    over = [s for s in vertices if s.cost > budget and s.time < best_fit.time]
    if over:
        nearest = min(over, key=lambda s: s.cost)
        repaired = _repair(p, set(nearest.saved), budget)
        if repaired is not None:
            starts.append(repaired)
    results = []
    for start in starts:
        saved = _improve(p, start, budget, swaps=p.n <= search_up_to)
        t = _time(p, saved)
        results.append((t, _cost(p, saved), tuple(sorted(saved))))
    t, c, saved = min(results)
    closure = recompute_closure(p, set(saved)) or []
    return Solution(saved, tuple(closure), c, t)
