"""Planning: from one joint graph to the Plan it runs with.

``plan_joint_graph`` analyses the graph (``remat.analysis.joint_graph``), applies the policy
(``remat.planning.decisions``), solves the min-cut (``remat.core.solver``) and builds the ``Plan``
(``remat.planning.build_plan``). With a budget, or when the frontier is asked for, it also builds
the candidate plans (``remat.planning.candidates``), and with a budget the budget chooses among
them (``remat.planning.choice``).

The backends come from capture: the one that lowers the graph plans it, and eager autograd's
baseline is simulated with the reference one (op by op). This stage never touches the fx split:
``remat.capture.partition`` applies the plan to the graph.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch.fx as fx

from ..analysis.cse import cse
from ..analysis.joint_graph import JointGraph, analyze, device_model_for
from ..backends.base import Backend
from ..core.peak import floor_bytes, simulate
from ..core.solver import ConflictError, Solution, describe, recompute_closure, solve
from ..device import DeviceModel
from ..errors import PlanningError
from ..options import Options
from ..plan import Plan
from ..plan_data import PlanKey
from .build_plan import EagerBaseline, build_plan
from .candidates import Candidate, Origin, candidates, non_dominated
from .choice import FIRST, Attempt, above_eager, budget_share, default_first, judged_peak, within_budget
from .chunking import chunk_rows, chunkable
from .chunking import describe as describe_chunks
from .decisions import Decisions, decisions
from .offload import offloading_candidates, with_offload

__all__ = ["Planned", "plan_joint_graph", "plan_of_saved", "traffic_weight"]

log = logging.getLogger("remat")

RECOMPUTES_RULED = "recomputes values the default plan's cost rules keep saved: "
"""How a candidate's note begins when it recomputes what the cost rules keep saved."""


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


@dataclass
class Planned:
    jg: JointGraph
    saved_ids: list[int]
    plan: Plan
    frontier: tuple[Plan, ...] | None = None
    gm: fx.GraphModule | None = None
    """The joint graph to split when the chosen plan rewrote it (a nested plan's copies,
    ``remat.planning.nesting``); None: the one given."""


def _eager_baseline(gm: fx.GraphModule, num_fwd_outputs: int, static: list[int], dev: DeviceModel,
                    reference: Backend, ends_at_break: bool) -> EagerBaseline:
    """Eager autograd's saved bytes and predicted peak on ``gm`` (before CSE), each decomposed op
    run as one eager kernel (Note [Eager kernels] in ``remat.analysis.joint_graph``)."""
    eager_graph = analyze(gm, num_fwd_outputs, static, dev, reference, eager_kernels=True,
                          ends_at_break=ends_at_break)
    return EagerBaseline(
        saved_bytes=sum(eager_graph.cost[i] for i in eager_graph.eager_saved),
        peak_bytes=simulate(eager_graph.schedule, eager_graph.to_schedule_ids(eager_graph.eager_direct)).peak_bytes,
    )


def _default_cut(jg: JointGraph, decided: Decisions, dev: DeviceModel) -> Solution:
    """The default plan's cut (Note [Default plan: bytes and recompute traffic]); a conflict (a
    value the backward needs that can be neither saved nor recomputed) raises PlanningError."""
    problem = decided.problem(jg)
    try:
        return solve(problem, traffic_weight(dev))
    except ConflictError as e:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("remat: the cut failed; its flow network:\n%s", describe(problem, e.chain))
        steps = "; ".join(f"{jg.facts[v].name} ({jg.facts[v].op or 'input'}, "
                          f"module '{jg.facts[v].module}') {why}" for v, why in e.chain)
        raise PlanningError(
            "remat: no valid plan: a value the backward needs can be neither saved nor "
            f"recomputed: {steps}. Remove or narrow the rule that forbids saving it."
        ) from None


def _noting_rules(c: Candidate, decided: Decisions, jg: JointGraph) -> Candidate:
    """``c``, its plan noting what it recomputes that the default plan's cost rules keep saved."""
    ruled = decided.cost_ruled(jg, c.plan.recomputed) if c.jg is None else ()
    if not ruled:
        return c
    names = set(ruled)
    ops = Counter(f.op for f in jg.facts if f.name in names)
    note = (RECOMPUTES_RULED + ", ".join(f"{op} x{k}" for op, k in sorted(ops.items()))
            + " (a budget may take it; the default plan does not, on estimates)")
    return replace(c, plan=replace(c.plan, notes=(*c.plan.notes, note)))


def plan_joint_graph(
    gm: fx.GraphModule, num_fwd_outputs: int, static_input_indices: list[int], options: Options,
    want_frontier: bool, backend: Backend, *, reference: Backend, ends_at_break: bool = False,
    attempt: Attempt = FIRST, pick: PlanKey | None = None,
) -> Planned:
    """Analyse and solve one joint graph (CSE is applied to ``gm`` in place). With a budget
    (or ``want_frontier``) the memory/recompute frontier is computed too. ``backend``: the one
    that will lower the graph; ``reference``: the uncompiled one eager autograd's baseline is
    simulated with; ``ends_at_break``: see ``remat.analysis.joint_graph.analyze``;
    ``attempt``: the budget's compile this planning is for (``remat.planning.choice``);
    ``pick``: the key of the candidate to use instead (one measured on the user's steps,
    ``remat.tuning``); when no candidate has it, the default or budget choice is used."""
    gm.graph.eliminate_dead_code()
    dev = options.device_model or device_model_for(gm)
    eager = _eager_baseline(gm, num_fwd_outputs, static_input_indices, dev, reference, ends_at_break)
    cse(gm)
    jg = analyze(gm, num_fwd_outputs, static_input_indices, dev, backend, ends_at_break=ends_at_break)
    eager = replace(eager, floor_bytes=floor_bytes(jg.schedule))
    decided = decisions(jg, options, backend)
    sol = _default_cut(jg, decided, dev)
    plan = build_plan(jg, sol.saved, sol.recomputed, decided, eager)
    fast = options.budget is None and not want_frontier and pick is None
    if fast and not above_eager(plan.predicted_peak_bytes, eager.peak_bytes):
        # no candidate keeping the rules beats it (Note [The default at most eager's peak])
        return _offloading(Planned(jg, list(sol.saved), plan), options, dev)

    def reanalyze(nested: fx.GraphModule) -> JointGraph:  # a nested plan's rewrite, analysed as gm was
        return analyze(nested, num_fwd_outputs, static_input_indices, options.device_model, backend,
                       ends_at_break=ends_at_break)

    found = candidates(Candidate(sol.saved, sol.recomputed, plan, Origin.DEFAULT), gm, reanalyze, jg, decided,
                       options, backend, eager)
    sliced = _chunked_candidates(gm, reanalyze, options, backend, eager, dev)
    if sliced:  # a sliced graph's plans can go lower than the graph's own floor
        eager = replace(eager, floor_bytes=min(eager.floor_bytes, min(floor_bytes(c.jg.schedule) for c in sliced)))
        found = [replace(c, plan=replace(c.plan, peak_floor_bytes=eager.floor_bytes)) for c in (*found, *sliced)]
    found = default_first([_noting_rules(c, decided, jg) for c in found],
                          eager.peak_bytes)  # Note [The default at most eager's peak]
    if options.offload:  # Note [Offload in a plan]
        fits = None
        if options.offload == "auto" and options.budget is not None:  # Note [Offload under a budget]
            limit = budget_share(options.budget, eager, attempt)
            fits = lambda c: judged_peak(c, attempt) <= limit  # noqa: E731 - the budget's own test
        found = offloading_candidates(found, jg, options.offload, dev, fits=fits)
    frontier = tuple(non_dominated([c.plan for c in found]))
    picked = next((c for c in found if c.plan.key == pick), None) if pick is not None else None
    if picked is not None:
        chosen = picked
    elif options.budget is None:
        chosen = found[0]
    else:
        chosen = within_budget(found, options.budget, eager, attempt)
    chosen_jg = chosen.jg or jg
    return Planned(chosen_jg, list(chosen.saved), chosen.plan, frontier,
                   gm=chosen_jg.nodes[0].graph.owning_module if chosen.jg else None)


def _chunked_candidates(gm: fx.GraphModule, reanalyze: Callable[[fx.GraphModule], JointGraph], options: Options,
                        backend: Backend, eager: EagerBaseline, dev: DeviceModel) -> list[Candidate]:
    """The candidates of ``gm`` rewritten with its row regions in slices (``remat.planning.chunking``,
    Note [Row chunks]): its own default cut (``Origin.CHUNKED``) and its hull, segment and nested
    plans, each plan listing the regions (``Plan.row_chunks``). Empty when ``gm`` has none."""
    try:
        regions = chunkable(gm, options.chunking)
        if not regions:
            return []
        sliced = chunk_rows(gm, regions)
        jg = reanalyze(sliced)
        decided = decisions(jg, options, backend)
        sol = _default_cut(jg, decided, dev)
        plan = replace(build_plan(jg, sol.saved, sol.recomputed, decided, eager), origin=Origin.CHUNKED.value)
        found = candidates(Candidate(sol.saved, sol.recomputed, plan, Origin.CHUNKED, jg), sliced, reanalyze, jg,
                           decided, options, backend, eager)
    except PlanningError:
        return []  # no valid cut of the sliced graph: the graph as captured is planned as before
    except Exception as e:  # noqa: BLE001 - the graph as captured still has its plans
        if options.strict:
            raise
        warnings.warn(f"remat: planning rows in slices failed ({type(e).__name__}: {e}); this graph's plans keep "
                      "it as captured. Pass strict=True to raise, or chunking=None to skip slicing.", stacklevel=2)
        return []
    rows = describe_chunks(regions)
    note = "rows in slices: " + "; ".join(r.describe() for r in rows)
    return [replace(c, jg=c.jg or jg, plan=replace(c.plan, row_chunks=rows, notes=(*c.plan.notes, note)))
            for c in (_noting_rules(c, decided, jg) for c in found)]


def _offloading(planned: Planned, options: Options, dev: DeviceModel) -> Planned:
    """``planned`` with the saved values ``options.offload`` moves to host memory (Note [Offload in
    a plan] in ``remat.planning.offload``)."""
    if not options.offload:
        return planned
    return replace(planned, plan=with_offload(planned.jg, planned.saved_ids, planned.plan, options.offload, dev))


def plan_of_saved(gm: fx.GraphModule, num_fwd_outputs: int, static_input_indices: list[int], options: Options,
                  backend: Backend, *, reference: Backend, saved_names: list[str], origin: str,
                  ends_at_break: bool = False) -> Plan:
    """The Plan of a partition remat did not choose (torch.compile's own, measured as a
    candidate: ``remat.tuning``) that saves the values named ``saved_names``: the backward
    recomputes what it needs from them. Analysed without CSE, so that the names are the joint
    graph's; a name the analysis does not know (a value the partitioner made) is noted."""
    gm.graph.eliminate_dead_code()
    dev = options.device_model or device_model_for(gm)
    eager = _eager_baseline(gm, num_fwd_outputs, static_input_indices, dev, reference, ends_at_break)
    jg = analyze(gm, num_fwd_outputs, static_input_indices, dev, backend, ends_at_break=ends_at_break)
    eager = replace(eager, floor_bytes=floor_bytes(jg.schedule))
    decided = decisions(jg, options, backend).relaxed()
    index = {f.name: i for i, f in enumerate(jg.facts)}
    saved = sorted({index[n] for n in saved_names if n in index})
    unknown = [n for n in saved_names if n not in index]
    problem = decided.problem(jg)
    free = {v for v in range(problem.n) if problem.cost[v] == 0 and v in problem.no_recompute}
    recomputed = recompute_closure(problem, set(saved) | free)
    notes = [f"{origin}: the plan of its partition"]
    if recomputed is None:  # remat's rules forbid recomputing something it recomputes
        recomputed = recompute_closure(replace(problem, no_recompute={}), set(saved) | free) or []
        notes.append("it recomputes values remat's rules would save")
    if unknown:
        notes.append(f"{len(unknown)} saved values it made itself are not listed ({', '.join(unknown[:4])})")
    plan = build_plan(jg, saved, recomputed, decided, eager)
    return replace(plan, origin=origin, notes=(*plan.notes, "; ".join(notes)))
