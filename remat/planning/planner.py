"""Planning: from one joint graph to the Plan it runs with.

``plan_joint_graph`` analyses the graph (``remat.analysis.joint_graph``), applies the policy (``remat.policy``),
solves the min-cut (``remat.core.solver``) and builds the ``Plan``. With a budget, or when the
frontier is asked for, it also builds the candidate plans (the default plan, the vertices of the
memory/recompute hull, ``remat.core.frontier``, and checkpoint-segment plans, ``remat.core.segments``),
each with its predicted peak (``remat.core.peak``, through the backend's step model), and chooses the
fastest candidate whose predicted peak fits (``choose``). The candidate set does not depend on
the budget, so a smaller budget never gives a larger peak or a shorter recompute time.

This stage never touches the fx split: ``remat.capture.partition`` applies the plan to the graph.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass

import torch.fx as fx

from ..analysis.cse import cse
from ..analysis.joint_graph import JointGraph, analyze, device_model_for
from ..backends.base import INDEX_SOURCE, Backend
from ..backends.registry import backend_for
from ..core.frontier import bytes_first_weight, hull
from ..core.peak import OP_BY_OP, floor_bytes, simulate
from ..core.reach import reachable
from ..core.segments import checkpoint_sets, nested_sets, separators
from ..core.solver import ConflictError, WeightedCuts, describe, solve, solve_weighted
from ..device import DeviceModel
from ..errors import InfeasibleBudgetError, PlanningError
from ..options import Options
from ..plan import Plan, PlanNode, Role, SavedTensor, Status
from ..policy import Decision, decide
from ..units import format_bytes
from .nesting import copy_of, nest

__all__ = ["Candidate", "EagerBaseline", "Planned", "plan_joint_graph", "build_plan", "choose", "non_dominated",
           "COST_RULES", "CHECKPOINT", "plan_key"]

log = logging.getLogger("remat")


def _decisions(jg: JointGraph, options: Options,
               backend: Backend | None = None) -> tuple[dict[int, str], dict[int, str], dict[int, str]]:
    """(no_recompute, no_save, reasons) per value index: the graph's inputs, the policy's rules,
    then what ``backend`` runs faster saved (``Backend.keep_saved``)."""
    no_recompute: dict[int, str] = {}
    no_save: dict[int, str] = {}
    reasons: dict[int, str] = {}
    used: set[str] = set()
    for i, (node, op, facts) in enumerate(zip(jg.nodes, jg.ops, jg.facts)):
        if facts.role in (Role.INPUT, Role.PARAMETER):
            no_recompute[i] = "parameter" if facts.role is Role.PARAMETER else "graph input"
            reasons[i] = no_recompute[i]
            continue
        if isinstance(node.meta.get("val"), (tuple, list)):
            no_save[i] = "multi-output op (its outputs are saved one by one)"
        decision, reason = decide(op, options.policy, used)
        if decision is Decision.MUST_SAVE:
            no_recompute[i] = reason
        elif decision is Decision.MUST_RECOMPUTE:
            no_save.setdefault(i, reason)
        if reason:
            reasons[i] = reason
    if backend is not None and jg.nodes:
        index = {n: i for i, n in enumerate(jg.nodes)}
        graph = [n for n in jg.nodes[0].graph.nodes if n.op != "output"]
        for node, reason in backend.keep_saved(graph).items():
            i = index.get(node)
            if i is not None and i in jg.forward and i not in no_save and i not in no_recompute:
                no_recompute[i] = reasons[i] = reason
    for rule in options.policy:
        if rule.name not in used:
            warnings.warn(f"remat: policy rule `{rule.name}` matched no op in this graph; "
                          "check its ops=/modules= patterns.", stacklevel=2)
    return no_recompute, no_save, reasons


COST_RULES = frozenset({"matmul", "attention", "reduction", "normalization boundary", INDEX_SOURCE})
"""Built-in rules that forbid recompute because it is slow, not because it is unsafe: under a
budget they give way to the estimated recompute cost."""


def traffic_weight(dev: DeviceModel) -> float:
    """What one second of recompute costs the default plan, in bytes: half the device's
    bandwidth (Note [Default plan: bytes and recompute traffic])."""
    return dev.bandwidth / 2


# Note [Default plan: bytes and recompute traffic]
# The default plan is the cut of least ``saved bytes + traffic_weight x recompute seconds``, with
# the recompute time of each value estimated by the device model (``graph._recompute_costs``:
# fused pointwise work at the vector rate). Saving a value costs its bytes twice in time, written
# by the forward and read by the backward, so a second of recompute is worth bandwidth / 2 bytes:
# the weight makes the cut the plan of least estimated memory traffic plus recompute time, not
# only the fewest bytes. The cost rules (matmul, attention, reductions, normalization
# boundaries) still forbid the slow recomputes, so the weight decides between plans whose bytes
# are equal or nearly so, which the bytes-only cut settled by tie terms that ignore time:
# measured on the H200 (profile in benchmarks/README.md), HF GPT-2's bytes-only plan saved the
# fused q/k/v projection and recomputed the three contiguous copies cuDNN attention reads in
# every layer's backward (3 kernels a layer), where saving the copies costs the same bytes; timm
# ViT's recomputed the patch embedding's concatenation, the position embedding and the first
# layer norm's statistics to save one token's row (1/197 of a block input). Budgets are
# unchanged: their candidates come from ``hull``/segments and ``choose``.


CHECKPOINT = "checkpoint (segment boundary)"
INNER = "nested checkpoint (recomputed by the sweep)"
AGAIN = "recomputed again (nested checkpoint)"


@dataclass(frozen=True)
class EagerBaseline:
    """Per-graph numbers every plan is compared with: eager autograd's saved bytes and
    predicted peak, and the floor no plan's predicted peak goes under (``peak.floor_bytes``)."""

    saved_bytes: int
    peak_bytes: int
    floor_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Candidate:
    """One plan the budget may choose: the saved value indices, the values the backward computes
    from them, the Plan, and where it came from (``default``, ``hull``, ``segments`` or
    ``nested``). ``jg``: the rewritten joint graph a nested plan's indices refer to
    (``remat.planning.nesting``); None for the graph being planned."""

    saved: tuple[int, ...]
    recomputed: tuple[int, ...]
    plan: Plan
    origin: str
    jg: JointGraph | None = None

    @property
    def peak(self) -> int:
        return self.plan.predicted_peak_bytes

    @property
    def time(self) -> float:
        return self.plan.recompute_seconds

    @property
    def saved_bytes(self) -> int:
        return self.plan.saved_bytes


def plan_key(plan: Plan) -> tuple[str, ...]:
    """What identifies a candidate plan across traces of the same graph: its saved values' names."""
    return tuple(sorted(s.name for s in plan.saved))


def choose(candidates: list[Candidate], budget_bytes: int, eager_peak: int, floor: int = 0,
           known: dict[tuple[str, ...], int] | None = None, last: bool = False) -> Candidate:
    """The default plan (``candidates[0]``) when its peak fits the budget; otherwise the fastest
    candidate whose peak fits it (ties to the lower peak), whose peak is then below the default
    plan's. A budget never trades the default plan's memory, or its speed, for an estimate: the
    estimates that rank candidates of nearly equal predicted peak are not worth the risk that
    the compiled step misses (Note [Budget re-plan]). Raises InfeasibleBudgetError if nothing
    fits, naming the smallest predicted peak (and ``floor``, ``remat.core.peak.floor_bytes``, when the
    budget is below it).

    Monotone: lowering the budget only removes candidates, so the chosen peak never rises and
    the estimated recompute time never falls.

    ``known``: peaks read from compiled candidates (``plan_key`` -> bytes; the budget's re-plan in
    ``remat.capture``), used instead of their predictions. ``last``: the re-plan's last compile,
    which takes the fitting candidate of the smallest peak, the one with the most room for its
    compiled peak to exceed its prediction."""
    known = known or {}

    def peak(c: Candidate) -> int:
        return known.get(plan_key(c.plan), c.peak)

    if peak(candidates[0]) <= budget_bytes:
        return candidates[0]
    fitting = [c for c in candidates if peak(c) <= budget_bytes]
    if not fitting:
        best = min(peak(c) for c in candidates)
        why = ""
        if floor and budget_bytes < floor:
            why = (f"none of remat's plans can fit it: in remat's model of this step the gradients, "
                   f"outputs and output gradients, with the operands of the backward's largest op, need "
                   f"{format_bytes(floor)} whatever is saved or recomputed (a differently scheduled "
                   "backward may need less)")
        raise InfeasibleBudgetError(
            f"remat: no plan fits a peak of {format_bytes(budget_bytes)}: the smallest predicted "
            f"peak for this graph is {format_bytes(best)} (eager autograd's: "
            f"{format_bytes(eager_peak)}){'; ' + why if why else ''}. Raise the budget to at least "
            f"{format_bytes(best)}, or use remat.pareto(model, *inputs) to see every trade-off."
        )
    if last:
        return min(fitting, key=lambda c: (peak(c), c.time, c.saved_bytes))
    return min(fitting, key=lambda c: (c.time, peak(c), c.saved_bytes))


def non_dominated(plans: list[Plan]) -> list[Plan]:
    """The plans no other plan beats on both predicted peak and estimated recompute time (of
    equal pairs, the first), sorted from the least recompute time to the most: their peaks fall
    as their times rise."""
    out: list[Plan] = []
    for p in sorted(plans, key=lambda q: (q.recompute_seconds, q.predicted_peak_bytes)):
        if out and out[-1].predicted_peak_bytes <= p.predicted_peak_bytes:
            continue  # an earlier (no slower) plan is no larger
        out.append(p)
    return out


@dataclass
class Planned:
    jg: JointGraph
    saved_ids: list[int]
    plan: Plan
    frontier: tuple[Plan, ...] | None = None
    gm: fx.GraphModule | None = None
    """The joint graph to split when the chosen plan rewrote it (a nested plan's copies,
    ``remat.planning.nesting``); None: the one given."""


def plan_joint_graph(
    gm: fx.GraphModule, num_fwd_outputs: int, static_input_indices: list[int], options: Options,
    want_frontier: bool = False, backend: Backend | None = None, ends_at_break: bool = False,
    known_peaks: dict[tuple[str, ...], int] | None = None, last_compile: bool = False,
) -> Planned:
    """Analyse and solve one joint graph (CSE is applied to ``gm`` in place). With a budget
    (or ``want_frontier``) the memory/recompute frontier is computed too. ``backend``: the one
    that will lower the graph (by default ``options.backend``'s); ``ends_at_break``: see
    ``remat.analysis.joint_graph.analyze``; ``known_peaks``, ``last_compile``: ``choose``'s ``known``
    and ``last``."""
    gm.graph.eliminate_dead_code()
    dev = options.device_model or device_model_for(gm)
    eager_graph = analyze(gm, num_fwd_outputs, static_input_indices, dev,  # op by op
                          backend_for("eager"), eager_kernels=True, ends_at_break=ends_at_break)
    eager = EagerBaseline(
        saved_bytes=sum(eager_graph.cost[i] for i in eager_graph.eager_saved),
        peak_bytes=simulate(eager_graph.schedule, eager_graph.to_schedule_ids(eager_graph.eager_direct)).peak_bytes,
    )
    cse(gm)
    backend = backend or backend_for(options.backend)
    jg = analyze(gm, num_fwd_outputs, static_input_indices, dev, backend,
                 ends_at_break=ends_at_break)
    eager = dataclasses.replace(eager, floor_bytes=floor_bytes(jg.schedule))
    no_recompute, no_save, reasons = _decisions(jg, options, backend)
    problem = jg.problem(no_recompute, no_save, recompute_cost=jg.recompute_seconds)
    try:
        sol = solve(problem, traffic_weight(dev))
    except ConflictError as e:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("remat: the cut failed; its flow network:\n%s", describe(problem, e.chain))
        steps = "; ".join(f"{jg.facts[v].name} ({jg.facts[v].op or 'input'}, "
                          f"module '{jg.facts[v].module}') {why}" for v, why in e.chain)
        raise PlanningError(
            "remat: no valid plan: a value the backward needs can be neither saved nor "
            f"recomputed: {steps}. Remove or narrow the rule that forbids saving it."
        ) from None
    plan = build_plan(jg, sol.saved, sol.recomputed, no_recompute, reasons, eager)
    if options.budget is None and not want_frontier:
        return Planned(jg, list(sol.saved), plan)

    relaxed_nr = {i: r for i, r in no_recompute.items() if r not in COST_RULES}
    relaxed = jg.problem(relaxed_nr, no_save, recompute_cost=jg.recompute_seconds)
    candidates = [Candidate(sol.saved, sol.recomputed, plan, "default")]
    for v in hull(relaxed):
        if all(v.saved != c.saved for c in candidates):
            candidates.append(Candidate(v.saved, v.recomputed,
                                        build_plan(jg, v.saved, v.recomputed, relaxed_nr, reasons, eager), "hull"))
    candidates += _segment_plans(jg, candidates, relaxed_nr, no_save, reasons, eager)
    candidates += _nested_plans(gm, num_fwd_outputs, static_input_indices, jg, relaxed_nr, options, backend,
                                candidates, eager, ends_at_break)
    frontier = tuple(non_dominated([c.plan for c in candidates]))
    if options.budget is None:
        return Planned(jg, list(sol.saved), plan, frontier)
    limit = options.budget.resolve(eager.peak_bytes)
    chosen = choose(candidates, limit, eager.peak_bytes, eager.floor_bytes, known_peaks, last_compile)
    chosen_jg = chosen.jg or jg
    return Planned(chosen_jg, list(chosen.saved), dataclasses.replace(chosen.plan, budget_bytes=limit), frontier,
                   gm=chosen_jg.nodes[0].graph.owning_module if chosen.jg else None)


def _segment_plans(jg: JointGraph, known: list[Candidate], relaxed_nr: dict[int, str], no_save: dict[int, str],
                   reasons: dict[int, str], eager: EagerBaseline) -> list[Candidate]:
    """Checkpoint-segment plans (``remat.core.segments``): for each set of separators, the plan that
    recomputes through none of them and otherwise saves the fewest bytes (every cost rule
    relaxed, recompute time breaking ties), i.e. checkpointing with the cut choosing what each
    segment keeps. Only plans that no other candidate beats on both predicted peak and
    recompute time are returned."""
    act = _activations(jg)
    seen = {tuple(c.saved) for c in known}
    found = []
    flow_cache: dict = {}  # the sets' networks differ in capacities only (remat.core.solver.WeightedCuts)
    for cps in _checkpoint_sets(jg, act):
        nr = {**relaxed_nr, **{c: CHECKPOINT for c in cps if c not in relaxed_nr}}
        prob = jg.problem(nr, no_save, recompute_cost=jg.recompute_seconds)
        try:
            s = solve_weighted(prob, bytes_first_weight(prob), WeightedCuts(prob, flow_cache))
        except ConflictError:
            continue
        if s.saved not in seen:
            seen.add(s.saved)
            found.append((simulate(jg.schedule, jg.to_schedule_ids(s.saved)).peak_bytes, s.time, cps, nr, s))
    rivals = [(c.plan.predicted_peak_bytes, c.plan.recompute_seconds) for c in known] + [f[:2] for f in found]
    out = []
    for peak, t, cps, nr, s in found:
        if _beaten(peak, t, rivals):
            continue
        p = build_plan(jg, s.saved, s.recomputed, nr, {**reasons, **nr}, eager, peak)
        p = dataclasses.replace(p, checkpoints=tuple(jg.facts[c].name for c in cps))
        out.append(Candidate(s.saved, s.recomputed, p, "segments"))
    return out


def _beaten(peak: int, t: float, rivals: list[tuple[int, float]]) -> bool:
    """Whether another (predicted peak, recompute time) point is no worse on both and differs."""
    return any(pk <= peak and tt <= t and (pk, tt) != (peak, t) for pk, tt in rivals)


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


def _nested_plans(gm: fx.GraphModule, num_fwd_outputs: int, static: list[int], jg: JointGraph,
                  relaxed_nr: dict[int, str], options: Options, backend: Backend | None, known: list[Candidate],
                  eager: EagerBaseline, ends_at_break: bool = False) -> list[Candidate]:
    """Nested checkpoint plans (``remat.planning.nesting``), uncompiled backend only: for each
    ``(outer, inner)`` pair of ``segments.nested_sets``, the joint graph rewritten with copies,
    planned with the outer checkpoints saved, the inner ones and the copies recomputed, and
    otherwise the fewest bytes (every cost rule relaxed, recompute time breaking ties). Only
    plans no other candidate beats on both predicted peak and recompute time are returned.
    (Under Inductor the copies are not known to stay apart: its scheduler may fuse or reorder a
    copy with its original.)"""
    backend = backend or backend_for(options.backend)
    if not backend.keeps_op_order:
        return []
    act = _activations(jg)
    keep = set(relaxed_nr)  # saved whatever the plan (inputs, random ops, user rules): never copied
    found = []
    for outer, inner in nested_sets(_checkpoint_sets(jg, act, tensors_only=True)):
        gm2 = nest(gm, jg.nodes, act, jg.forward, keep | set(outer) | set(inner))
        jg2 = analyze(gm2, num_fwd_outputs, static, options.device_model, backend, ends_at_break=ends_at_break)
        names = [jg.nodes[c].name for c in (*outer, *inner)]
        solved = _solve_nested(jg2, options, names[:len(outer)], names[len(outer):])
        if solved is not None:
            found.append((*solved, outer, inner, jg2))
    rivals = [(c.plan.predicted_peak_bytes, c.plan.recompute_seconds) for c in known] + [f[:2] for f in found]
    out = []
    for peak, t, s, nr2, reasons2, outer, inner, jg2 in found:
        if _beaten(peak, t, rivals):
            continue
        p = build_plan(jg2, s.saved, s.recomputed, nr2, reasons2, eager, peak)
        p = dataclasses.replace(p, checkpoints=tuple(jg.facts[c].name for c in outer),
                                nested=tuple(jg.facts[c].name for c in inner))
        out.append(Candidate(s.saved, s.recomputed, p, "nested", jg2))
    return out


def _solve_nested(jg2: JointGraph, options: Options, outer: list[str], inner: list[str]):
    """The fewest-bytes plan of a nested graph (``remat.planning.nesting``): ``outer`` checkpoints never
    recomputed, ``inner`` ones and every copy never saved, cost rules relaxed. ``(peak, seconds,
    solution, no_recompute, reasons)``, or None if no plan exists."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unmatched policy rules were reported on the graph itself
        nr2, ns2, reasons2 = _decisions(jg2, options)
    index2 = {n.name: i for i, n in enumerate(jg2.nodes)}
    nr2 = {**{i: r for i, r in nr2.items() if r not in COST_RULES}, **{index2[c]: CHECKPOINT for c in outer}}
    ns2 = {**ns2, **{index2[c]: INNER for c in inner}, **{i: AGAIN for i, n in enumerate(jg2.nodes) if copy_of(n)}}
    prob = jg2.problem(nr2, ns2, recompute_cost=jg2.recompute_seconds)
    try:
        s = solve_weighted(prob, bytes_first_weight(prob))
    except ConflictError:
        return None
    peak = simulate(jg2.schedule, jg2.to_schedule_ids(s.saved)).peak_bytes
    return peak, s.time, s, nr2, {**reasons2, **nr2, **ns2}


def _recompute_times(jg: JointGraph, recomputed: list[int]) -> dict[str, int]:
    """How many times the backward computes each recomputed forward op, by the name of the op
    the forward runs (a nested plan's copy counts for the op it copies), in graph order."""
    times: dict[str, int] = {}
    for i in recomputed:
        name = copy_of(jg.nodes[i]) or jg.nodes[i].name
        times[name] = times.get(name, 0) + 1
    order = {n.name: k for k, n in enumerate(jg.nodes)}
    return dict(sorted(times.items(), key=lambda kv: order[kv[0]]))


def _plan_node(jg: JointGraph, sid: int, i: int | None, status: Status, reason: str) -> PlanNode:
    """Schedule node ``sid`` (value ``i``, None for a backward-only node) as a plan shows it."""
    sched = jg.schedule
    ins = tuple(sched.names[u] for u in sched.inputs[sid])
    if i is None:
        op = str(status) if status is Status.TANGENT else jg.node_ops.get(sid, "")
        return PlanNode(sched.names[sid], op, status=status, reason=reason, inputs=ins)
    f = jg.facts[i]
    return PlanNode.of(f, op=f.op or f.role, nbytes=jg.cost[i], status=status, reason=reason, inputs=ins)


def build_plan(jg: JointGraph, saved_ids: tuple[int, ...] | list[int], computed_ids: tuple[int, ...] | list[int],
               no_recompute: dict[int, str], reasons: dict[int, str], eager: EagerBaseline,
               peak_bytes: int | None = None) -> Plan:
    """The Plan for one joint graph saving ``saved_ids``; ``computed_ids`` are the values the
    backward computes from them (recomputed forward ops and backward-only ops). ``peak_bytes``:
    its simulated peak where the caller has it (``peak.simulate``), else simulated here."""
    saved_set, computed = set(saved_ids), set(computed_ids)
    saved = []
    for i in sorted(saved_set):
        f = jg.facts[i]
        reason = reasons[i] if i in no_recompute else "min-cut boundary"
        saved.append(SavedTensor.of(f, op=f.op or f.role, nbytes=jg.cost[i], reason=reason))
    recomputed = [i for i in sorted(computed) if i in jg.forward and jg.nodes[i].op == "call_function"]
    times = _recompute_times(jg, recomputed)
    by_name = {n.name: i for i, n in enumerate(jg.nodes)}
    status: dict[int, Status] = {}
    for i, f in enumerate(jg.facts):
        if i in saved_set:
            status[i] = Status.SAVED
        elif f.role in (Role.INPUT, Role.PARAMETER):
            status[i] = Status(f.role.value)
        elif i in computed:
            status[i] = Status.RECOMPUTED if i in jg.forward else Status.BACKWARD_ONLY
        else:
            status[i] = Status.FORWARD if i in jg.forward else Status.BACKWARD_ONLY
    sched = jg.schedule
    by_sched = {sid: i for i, sid in enumerate(jg.sched_ids)}
    nodes = []
    made = jg.plan_nodes  # one PlanNode per (node, status, reason) for all the graph's plans
    for sid in range(sched.n):
        i = by_sched.get(sid)
        if i is None:
            st = Status.TANGENT if sid in sched.tangent else Status.BACKWARD
            key = (sid, st, "")
        else:
            st = status[i]
            key = (sid, st, reasons.get(i, ""))
        node = made.get(key)
        if node is None:
            node = made[key] = _plan_node(jg, sid, i, st, key[2])
        nodes.append(node)
    flops = sum(jg.recompute_flops[i] for i in recomputed) if jg.recompute_flops else 0
    secs = sum(jg.recompute_seconds[i] for i in recomputed) if jg.recompute_seconds else 0.0
    return Plan(
        saved=tuple(saved),
        recomputed=tuple(times),
        recomputed_ops=tuple(jg.facts[by_name[name]].op for name in times),
        recompute_times=tuple(times.values()) if any(t > 1 for t in times.values()) else (),
        eager_saved_bytes=eager.saved_bytes,
        nodes=tuple(nodes),
        predicted_peak_bytes=(peak := simulate(sched, jg.to_schedule_ids(saved_ids)).peak_bytes
                              if peak_bytes is None else peak_bytes),
        simulated_peak_bytes=peak,
        peak_model=getattr(sched.model or OP_BY_OP, "name", ""),
        eager_peak_bytes=eager.peak_bytes,
        peak_floor_bytes=eager.floor_bytes,
        recompute_flops=int(flops),
        recompute_seconds=float(secs),
    )
