"""Minimum-byte cut between the forward and the backward. Pure Python: no torch import.

Construction (max-flow: Boykov-Kolmogorov, ``remat.core.maxflow``, step for step networkx's, which
was measured 1.5-5x faster than preflow-push on joint graphs of 4,000 nodes; see
benchmarks/plan_speed.py):

Every value ``v`` of the forward-computable part of the joint graph becomes two vertices
``2v`` ("v_in") and ``2v+1`` ("v_out") joined by an edge whose capacity is the cost of saving
``v`` (its storage bytes). Data edges ``u -> w`` become infinite edges ``u_out -> w_in``.
Values the backward reads get an infinite edge ``v_out -> sink``; values that cannot be
recomputed in the backward (graph inputs, rules such as "matmul") get ``source -> v_in``.
Values that must not be saved get an infinite ``v_in -> v_out``.

In a finite cut, a value whose ``v_in`` lies on the source side and ``v_out`` on the sink side
is *saved*; a value whose ``v_in`` lies on the sink side is *recomputed* in the backward from
saved values. The infinite edges make every cut a valid plan (everything the backward needs is
either saved or recomputable from saved values) and every valid plan a cut of the same value,
so the minimum cut is the cheapest valid plan.

Ties between plans of equal bytes are broken deterministically: capacities are scaled by a
factor ``M`` larger than the sum of all tie-break terms, and each value adds a tie term that
prefers fewer saved values, then values later in graph order (fewer ops to recompute).
``solve(p, time_weight)`` also charges recomputing ``v`` ``time_weight * recompute_cost[v]``
bytes (an edge ``source -> v_in``, scaled by ``M`` and rounded, so capacities stay exact
integers): the planner's default plan (Note [Default plan: bytes and recompute traffic]).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .maxflow import Recut, source_side

__all__ = ["Problem", "Solution", "ConflictError", "WeightedCuts", "solve", "solve_weighted", "brute_force", "time_of",
           "describe"]

SOURCE = "source"
SINK = "sink"


@dataclass(frozen=True)
class Problem:
    """A save-or-recompute problem over values ``0..n-1`` numbered in graph (topological) order.

    Fields:
      inputs: ``inputs[v]`` are the values ``v`` is computed from.
      cost: bytes kept alive if ``v`` is saved for the backward.
      needed: values the backward reads directly.
      no_recompute: values that cannot be recomputed in the backward (they must be saved if
        needed); ``no_recompute[v]`` maps to the reason (a rule name) for error messages.
      no_save: values that must not be saved (they must be recomputed if needed), with reasons.
      names: a display name per value, for error messages.
    """

    inputs: tuple[tuple[int, ...], ...]
    cost: tuple[int, ...]
    needed: frozenset[int]
    no_recompute: dict[int, str] = field(default_factory=dict)
    no_save: dict[int, str] = field(default_factory=dict)
    names: tuple[str, ...] = ()
    recompute_cost: tuple[float, ...] = ()
    """Estimated seconds to recompute each value (0 for values the forward does not compute:
    computing those in the backward is not extra work). Used by ``solve_weighted``."""

    @property
    def n(self) -> int:
        return len(self.inputs)

    def name(self, v: int) -> str:
        return self.names[v] if self.names else f"v{v}"


@dataclass(frozen=True)
class Solution:
    """``saved``: values kept for the backward; ``recomputed``: values the backward computes
    again (ancestors of needed values through unsaved values); ``cost``: bytes of ``saved``."""

    saved: tuple[int, ...]
    recomputed: tuple[int, ...]
    cost: int
    time: float = 0.0
    """Sum of ``recompute_cost`` over ``recomputed``."""
    weight: float | None = None
    """The bytes-per-second weight this plan was solved at (``solve_weighted``), if any."""


class ConflictError(Exception):
    """No finite plan exists. ``chain`` lists ``(value, reason)`` from a value that can be
    neither recomputed nor saved to a value the backward needs."""

    def __init__(self, chain: list[tuple[int, str]]):
        self.chain = chain
        super().__init__(chain)


def _tie_terms(p: Problem) -> tuple[list[int], int]:
    n = p.n
    ties = [(n + 1) + (n - 1 - v) for v in range(n)]
    scale = sum(ties) + 1
    return ties, scale


def _build(p: Problem, weight: float | None, free: set[int],
           time_weight: float = 0.0) -> dict[object, dict[object, dict]]:
    """The flow network, as networkx would hold it (``{u: {v: attrs}}``, vertices and edges in
    insertion order; see Note [Max-flow without networkx]). With ``weight`` (bytes per second of
    recompute), an edge ``source -> v_in`` of capacity ``weight * recompute_cost[v]`` charges
    recomputing ``v``; the cut then minimises ``saved bytes + weight * recompute seconds``
    (floats, no tie terms)."""
    ties, scale = _tie_terms(p)
    if weight is not None:
        ties, scale = [0] * p.n, 1
    g: dict[object, dict[object, dict]] = {SOURCE: {}, SINK: {}}
    for v in range(p.n):
        if v in free:  # see _free: no vertices, no edges
            continue
        v_in, v_out = 2 * v, 2 * v + 1
        g.setdefault(v_in, {})[v_out] = {} if v in p.no_save else {"capacity": p.cost[v] * scale + ties[v]}
        g.setdefault(v_out, {})
        if v in p.no_recompute:
            g[SOURCE][v_in] = {}  # no capacity attribute: infinite
        elif weight is not None and p.recompute_cost and p.recompute_cost[v] > 0:
            g[SOURCE][v_in] = {"capacity": weight * p.recompute_cost[v]}
        elif time_weight and p.recompute_cost and p.recompute_cost[v] > 0:
            g[SOURCE][v_in] = {"capacity": round(time_weight * p.recompute_cost[v] * scale)}  # exact ints
        for u in p.inputs[v]:
            if u not in free:
                g[2 * u + 1].setdefault(v_in, {})
        if v in p.needed:
            g[v_out][SINK] = {}
    return g


def _free(p: Problem) -> set[int]:
    """Values saved at no cost that cannot be recomputed (parameters, buffers): the cut never
    pays for them, so they are left out of the network (about a tenth of a transformer's
    values) and saved afterwards wherever the backward or a recompute reads them."""
    return {v for v in range(p.n) if p.cost[v] == 0 and v in p.no_recompute and v not in p.no_save}


def _find_conflict(p: Problem, g: dict[object, dict[object, dict]]) -> list[tuple[int, str]] | None:
    """An all-infinite path source -> sink, as a chain of values, or None."""
    parent: dict[object, object] = {SOURCE: None}
    queue: deque[object] = deque([SOURCE])
    while queue:
        x = queue.popleft()
        if x == SINK:
            break
        for y, attrs in g[x].items():
            if "capacity" in attrs or y in parent:
                continue
            parent[y] = x
            queue.append(y)
    if SINK not in parent:
        return None
    values: list[int] = []
    x = parent[SINK]
    while x is not None and x != SOURCE:
        v = x // 2  # type: ignore[operator]
        if not values or values[-1] != v:
            values.append(v)
        x = parent[x]
    values.reverse()
    chain = []
    for i, v in enumerate(values):
        if i == 0:
            reason = f"cannot be recomputed ({p.no_recompute.get(v, 'graph input')}) "
            reason += f"and cannot be saved ({p.no_save.get(v, '?')})"
        else:
            reason = f"cannot be saved ({p.no_save.get(v, '?')})"
        if v in p.needed and i == len(values) - 1:
            reason += "; the backward needs it"
        chain.append((v, reason))
    return chain


def recompute_closure(p: Problem, saved: set[int]) -> list[int] | None:
    """Values the backward must recompute when ``saved`` is kept, or None if ``saved`` is not
    a valid plan (some needed value is neither saved nor recomputable)."""
    out: set[int] = set()
    stack = [v for v in p.needed if v not in saved]
    while stack:
        v = stack.pop()
        if v in out:
            continue
        if v in p.no_recompute:
            return None
        out.add(v)
        stack.extend(u for u in p.inputs[v] if u not in saved and u not in out)
    return sorted(out)


def time_of(p: Problem, recomputed: tuple[int, ...] | list[int]) -> float:
    return sum(p.recompute_cost[v] for v in recomputed) if p.recompute_cost else 0.0


class WeightedCuts:
    """``solve_weighted(p, w)`` for many weights ``w`` of one problem (``remat.core.frontier.hull``).
    What does not depend on ``w`` is done once: the checks, the search for an infinite path,
    the flow network (only the capacities of the ``source -> v_in`` edges that charge recompute
    time change; they are rewritten in place) and its residual network (``remat.core.maxflow``).
    Each cut is the one ``solve_weighted`` finds."""

    def __init__(self, p: Problem, flow_cache: dict | None = None):
        self.p = p
        self.free: set[int] | None = None
        """``_free(p)``, once ``p`` is checked."""
        self.no_conflict = False
        """Whether ``p``'s network was searched for an infinite path and has none."""
        self.flow_cache: dict = {} if flow_cache is None else flow_cache
        """``remat.core.maxflow.source_side``'s cache; problems that differ only in which values may
        be recomputed (``planner``'s checkpoint sets) may share one."""
        self._charged: list[tuple[int, dict]] = []
        """(v, the attributes of ``source -> v_in``) for each value whose recompute is charged."""
        self._recut: Recut | None = None

    def __call__(self, weight: float) -> Solution:
        return solve_weighted(self.p, weight, self)

    def source_side(self, weight: float, free: set[int]) -> set:
        """``_build(p, weight, free)``'s minimum cut, the network built once and re-weighted
        while every charge stays positive (a zero-capacity edge is no edge to the max-flow)."""
        rc = self.p.recompute_cost
        if self._recut is not None and all(weight * rc[v] > 0 for v, _ in self._charged):
            for v, attrs in self._charged:
                attrs["capacity"] = weight * rc[v]  # as _build writes it
            return self._recut.source_side()
        g = _build(self.p, weight, free)
        charged = [(v, g[SOURCE][2 * v]) for v in range(self.p.n) if v not in free and v not in self.p.no_recompute
                   and rc and rc[v] > 0]
        if all(a["capacity"] > 0 for _, a in charged):
            self._charged, self._recut = charged, Recut(g, SOURCE, SINK, self.flow_cache)
            return self._recut.source_side()
        return source_side(g, SOURCE, SINK, self.flow_cache)


def _checked_free(p: Problem, cuts: WeightedCuts | None) -> set[int]:
    """``_free(p)`` after checking that ``p``'s values are in graph order (once per ``cuts``)."""
    if cuts is not None and cuts.free is not None:
        return cuts.free
    for v in range(p.n):
        if any(u >= v for u in p.inputs[v]):
            raise ValueError(f"value {v} has an input that is not earlier in graph order")
    free = _free(p)
    if cuts is not None:
        cuts.free = free
    return free


def _cut(p: Problem, weight: float | None, cuts: WeightedCuts | None = None, time_weight: float = 0.0) -> Solution:
    free = _checked_free(p, cuts)
    g = None
    if cuts is None or not cuts.no_conflict:  # the same for every weight: infinite edges only
        g = _build(p, weight, free, time_weight)
        chain = _find_conflict(p, g)
        if chain is not None:
            raise ConflictError(chain)
        if cuts is not None:
            cuts.no_conflict = True
    if not p.needed:
        return Solution((), (), 0, 0.0, weight)
    if cuts is not None and weight is not None:
        reachable = cuts.source_side(weight, free)
    else:
        reachable = source_side(g if g is not None else _build(p, weight, free, time_weight), SOURCE, SINK)
    cut = {v for v in range(p.n) if 2 * v in reachable and 2 * v + 1 not in reachable}
    recomputed = recompute_closure(p, cut | free)
    if recomputed is None:  # pragma: no cover - guarded by the construction
        raise AssertionError("remat: internal error, min-cut produced an invalid plan; please report")
    read = p.needed.union(*(p.inputs[w] for w in recomputed))
    saved = tuple(sorted(cut | (free & read)))
    return Solution(saved, tuple(recomputed), sum(p.cost[v] for v in saved), time_of(p, recomputed), weight)


def solve(p: Problem, time_weight: float = 0.0) -> Solution:
    """The cheapest valid plan in bytes, plus ``time_weight`` bytes per second of recompute
    (``p.recompute_cost``), ties broken by the tie terms (module docstring). Raises
    ConflictError when every plan is infinite."""
    return _cut(p, None, time_weight=time_weight)


def solve_weighted(p: Problem, weight: float, cuts: WeightedCuts | None = None) -> Solution:
    """The plan minimising ``saved bytes + weight * recompute seconds``. ``cuts``: a
    ``WeightedCuts`` of ``p`` shared by many calls (the same plan, found faster)."""
    if not weight >= 0:
        raise ValueError(f"weight must be >= 0, got {weight!r}")
    if cuts is not None and cuts.p is not p:
        raise ValueError("remat: internal error, WeightedCuts of another problem; please report")
    return _cut(p, weight, cuts)


def brute_force(p: Problem) -> int | None:
    """Cheapest valid plan's cost by enumerating every subset of values (tests only)."""
    best: int | None = None
    candidates = [v for v in range(p.n) if v not in p.no_save]
    for mask in range(1 << len(candidates)):
        saved = {candidates[i] for i in range(len(candidates)) if mask >> i & 1}
        if recompute_closure(p, saved) is None:
            continue
        c = sum(p.cost[v] for v in saved)
        if best is None or c < best:
            best = c
    return best


def describe(p: Problem, chain: list[tuple[int, str]] | None = None) -> str:
    """The flow network of ``p`` as text, one edge a line, in the construction's order (the module
    docstring): ``source -> mul_3.in  inf  cannot be recomputed: matmul``.
    Capacities are the bytes of saving a value (the tie-break terms are left out). With
    ``chain`` (a ``ConflictError``'s), the conflict's values are listed last. For debugging."""
    lines = [f"flow network: {p.n} values, {len(p.needed)} read by the backward; "
             "vertices <name>.in and <name>.out per value, plus source and sink"]
    for v in range(p.n):
        name = p.name(v)
        if v in p.no_recompute:
            lines.append(f"  source -> {name}.in  inf  cannot be recomputed: {p.no_recompute[v]}")
        if v in p.no_save:
            lines.append(f"  {name}.in -> {name}.out  inf  cannot be saved: {p.no_save[v]}")
        else:
            lines.append(f"  {name}.in -> {name}.out  {p.cost[v]}  bytes if saved")
        for u in p.inputs[v]:
            lines.append(f"  {p.name(u)}.out -> {name}.in  inf  data")
        if v in p.needed:
            lines.append(f"  {name}.out -> sink  inf  the backward reads it")
    if chain:
        lines.append("conflict (every edge on this path is infinite):")
        lines += [f"  {p.name(v)}: {why}" for v, why in chain]
    return "\n".join(lines)
