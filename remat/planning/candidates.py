"""The candidate plans a budget chooses among, for one joint graph: the default plan, the
vertices of the memory/recompute hull (``remat.core.frontier``), checkpoint-segment plans
(``remat.core.segments``) and, where the backend keeps a nested plan's copies apart
(``Backend.keeps_op_order``), nested checkpoint plans (``remat.planning.nesting``); each with its
predicted peak (``remat.core.peak``). The set does not depend on the budget, so a smaller budget
never gives a larger peak or a shorter recompute time (``remat.planning.choice``)."""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch.fx as fx

from ..analysis.joint_graph import JointGraph
from ..backends.base import Backend
from ..core.frontier import bytes_first_weight, hull
from ..core.peak import simulate
from ..core.reach import reachable
from ..core.segments import checkpoint_sets, nested_sets, separators
from ..core.solver import ConflictError, Solution, WeightedCuts, solve_weighted
from ..options import Options
from ..plan import Plan
from ..plan_data import PlanData, Role, Tradeoff
from .build_plan import EagerBaseline, build_plan
from .decisions import AGAIN, CHECKPOINT, INNER, Decisions, decisions
from .nesting import copy_of, nest

__all__ = ["Origin", "Candidate", "candidates", "non_dominated"]


class Origin(str, enum.Enum):
    """Where a candidate plan came from."""

    DEFAULT = "default"
    """The plan used without a budget (Note [Default plan: bytes and recompute traffic])."""
    HULL = "hull"
    """A vertex of the lower convex hull of (saved bytes, recompute seconds), cost rules relaxed."""
    SEGMENTS = "segments"
    """Checkpoint segments: never recomputes through a set of separators."""
    NESTED = "nested"
    """Nested checkpoints: outer checkpoints saved, inner ones recomputed twice."""
    CHUNKED = "chunked"
    """The default cut of the graph with its row regions in slices (``remat.planning.chunking``)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One plan the budget may choose: the saved value indices, the values the backward computes
    from them, the Plan, and where it came from. ``jg``: the rewritten joint graph a nested
    plan's indices refer to (``remat.planning.nesting``); None for the graph being planned."""

    saved: tuple[int, ...]
    recomputed: tuple[int, ...]
    plan: Plan
    origin: Origin
    jg: JointGraph | None = None

    @property
    def peak(self) -> int:
        return self.plan.predicted_peak_bytes

    @property
    def time(self) -> float:
        """The plan's estimated time cost (``PlanData.cost_seconds``)."""
        return self.plan.cost_seconds

    @property
    def saved_bytes(self) -> int:
        return self.plan.saved_bytes


def non_dominated(plans: list[PlanData]) -> list[PlanData]:
    """The plans no other plan beats on both predicted peak and estimated time cost (of equal
    pairs, the first), sorted from the least time cost to the most: their peaks fall
    as their times rise."""
    out: list[PlanData] = []
    for p in sorted(plans, key=lambda q: (q.cost_seconds, q.predicted_peak_bytes)):
        if out and out[-1].tradeoff.no_worse(p.tradeoff):
            continue  # an earlier (no slower) plan is no larger
        out.append(p)
    return out


@dataclass(frozen=True)
class _Trial:
    """A checkpoint-segment or nested cut before its Plan is built: what it was cut under, and
    the names of the checkpoints it saves and of the inner ones a nested plan recomputes."""

    tradeoff: Tradeoff
    solution: Solution
    decided: Decisions
    jg: JointGraph
    checkpoints: tuple[str, ...]
    nested: tuple[str, ...] = ()


def _unbeaten(trials: list[_Trial], known: list[Candidate], eager: EagerBaseline, origin: Origin,
              rewritten: bool = False) -> list[Candidate]:
    """The trials no known candidate or other trial beats on both predicted peak and recompute
    time, as candidates; ``rewritten``: their joint graphs are nested rewrites."""
    rivals = [c.plan.tradeoff for c in known] + [t.tradeoff for t in trials]
    out = []
    for t in trials:
        if any(r.dominates(t.tradeoff) for r in rivals):
            continue
        s = t.solution
        p = build_plan(t.jg, s.saved, s.recomputed, t.decided, eager, t.tradeoff.peak_bytes)
        p = replace(p, checkpoints=t.checkpoints, nested=t.nested, origin=origin.value)
        out.append(Candidate(s.saved, s.recomputed, p, origin, t.jg if rewritten else None))
    return out


def _tradeoff(jg: JointGraph, s: Solution) -> Tradeoff:
    return Tradeoff(simulate(jg.schedule, jg.to_schedule_ids(s.saved)).peak_bytes, s.time + jg.traffic_seconds(s.cost))


def _activations(jg: JointGraph) -> set[int]:
    """Forward values computed from the network's inputs (not from parameters alone)."""
    inputs_ = {i for i, f in enumerate(jg.facts) if f.role is Role.INPUT}
    readers = jg.readers()
    return reachable(inputs_, lambda i: [u for u in readers[i] if u in jg.forward], include_seeds=False)


def _checkpoint_sets(jg: JointGraph, act: set[int], tensors_only: bool = False) -> list[tuple[int, ...]]:
    """``segments.checkpoint_sets``; with ``tensors_only``, over the separators that are single
    tensors (for nested plans: an inner checkpoint that is a multi-output op's result would hold
    all its outputs from the sweep to its segment's backward)."""
    weights = [jg.schedule.nbytes[sid] for sid in jg.sched_ids]
    seps = separators(jg.inputs, act)
    if tensors_only:
        seps = [v for v in seps if not isinstance(jg.nodes[v].meta.get("val"), (tuple, list))]
    return checkpoint_sets(seps, weights, act)


def _hull_plans(jg: JointGraph, relaxed: Decisions, known: list[Candidate], eager: EagerBaseline) -> list[Candidate]:
    """The vertices of the memory/recompute hull, every cost rule relaxed, that are new."""
    out: list[Candidate] = []
    for v in hull(relaxed.problem(jg)):
        if all(v.saved != c.saved for c in (*known, *out)):
            plan = replace(build_plan(jg, v.saved, v.recomputed, relaxed, eager), origin=Origin.HULL.value)
            out.append(Candidate(v.saved, v.recomputed, plan, Origin.HULL))
    return out


def _segment_plans(jg: JointGraph, relaxed: Decisions, known: list[Candidate],
                   eager: EagerBaseline) -> list[Candidate]:
    """Checkpoint-segment plans (``remat.core.segments``): for each set of separators, the plan that
    recomputes through none of them and otherwise saves the fewest bytes (every cost rule
    relaxed, recompute time breaking ties), i.e. checkpointing with the cut choosing what each
    segment keeps. Only plans that no other candidate beats on both predicted peak and
    recompute time are returned."""
    seen = {tuple(c.saved) for c in known}
    found = []
    flow_cache: dict = {}  # the sets' networks differ in capacities only (remat.core.solver.WeightedCuts)
    for cps in _checkpoint_sets(jg, _activations(jg)):
        nr = {**relaxed.no_recompute, **{c: CHECKPOINT for c in cps if c not in relaxed.no_recompute}}
        decided = Decisions(nr, relaxed.no_save, {**relaxed.reasons, **nr})
        prob = decided.problem(jg)
        try:
            s = solve_weighted(prob, bytes_first_weight(prob), WeightedCuts(prob, flow_cache))
        except ConflictError:
            continue
        if s.saved not in seen:
            seen.add(s.saved)
            found.append(_Trial(_tradeoff(jg, s), s, decided, jg, tuple(jg.facts[c].name for c in cps)))
    return _unbeaten(found, known, eager, Origin.SEGMENTS)


def _solve_nested(jg2: JointGraph, options: Options, backend: Backend, outer: list[str],
                  inner: list[str]) -> tuple[Solution, Decisions] | None:
    """The fewest-bytes plan of a nested graph (``remat.planning.nesting``): ``outer`` checkpoints never
    recomputed, ``inner`` ones and every copy never saved, cost rules relaxed; with the
    decisions it was cut under. None if no plan exists."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unmatched policy rules were reported on the graph itself
        relaxed = decisions(jg2, options, backend).relaxed()
    index2 = {n.name: i for i, n in enumerate(jg2.nodes)}
    nr2 = {**relaxed.no_recompute, **{index2[c]: CHECKPOINT for c in outer}}
    ns2 = {**relaxed.no_save, **{index2[c]: INNER for c in inner},
           **{i: AGAIN for i, n in enumerate(jg2.nodes) if copy_of(n)}}
    decided = Decisions(nr2, ns2, {**relaxed.reasons, **nr2, **ns2})
    prob = decided.problem(jg2)
    try:
        return solve_weighted(prob, bytes_first_weight(prob)), decided
    except ConflictError:
        return None


def _nested_plans(gm: fx.GraphModule, reanalyze: Callable[[fx.GraphModule], JointGraph], jg: JointGraph,
                  relaxed: Decisions, options: Options, backend: Backend, known: list[Candidate],
                  eager: EagerBaseline) -> list[Candidate]:
    """Nested checkpoint plans (``remat.planning.nesting``), for a backend that keeps a copy apart
    from its original (``Backend.keeps_op_order``; under Inductor its scheduler may fuse or
    reorder a copy with its original): for each ``(outer, inner)`` pair of
    ``segments.nested_sets``, the joint graph rewritten with copies (``reanalyze``\\ d as ``jg``
    was), planned with the outer checkpoints saved, the inner ones and the copies recomputed,
    and otherwise the fewest bytes (every cost rule relaxed, recompute time breaking ties).
    Only plans no other candidate beats on both predicted peak and time cost are returned."""
    if not backend.keeps_op_order:
        return []
    act = _activations(jg)
    keep = set(relaxed.no_recompute)  # saved whatever the plan (inputs, random ops, user rules): never copied
    found = []
    for outer, inner in nested_sets(_checkpoint_sets(jg, act, tensors_only=True)):
        jg2 = reanalyze(nest(gm, jg.nodes, act, jg.forward, keep | set(outer) | set(inner)))
        names = [jg.nodes[c].name for c in (*outer, *inner)]
        solved = _solve_nested(jg2, options, backend, names[:len(outer)], names[len(outer):])
        if solved is not None:
            s, decided = solved
            found.append(_Trial(_tradeoff(jg2, s), s, decided, jg2, tuple(jg.facts[c].name for c in outer),
                                tuple(jg.facts[c].name for c in inner)))
    return _unbeaten(found, known, eager, Origin.NESTED, rewritten=True)


def candidates(default: Candidate, gm: fx.GraphModule, reanalyze: Callable[[fx.GraphModule], JointGraph],
               jg: JointGraph, decided: Decisions, options: Options, backend: Backend,
               eager: EagerBaseline) -> list[Candidate]:
    """Every candidate plan of ``jg`` (analysed from ``gm``), the default plan first."""
    relaxed = decided.relaxed()
    found = [default]
    found += _hull_plans(jg, relaxed, found, eager)
    found += _segment_plans(jg, relaxed, found, eager)
    found += _nested_plans(gm, reanalyze, jg, relaxed, options, backend, found, eager)
    return found
