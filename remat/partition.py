"""Split a joint forward+backward graph into a forward and a backward module per a plan.

``make_partition_fn(options, sink)`` returns the function AOTAutograd calls with the joint
graph. It runs CSE, lowers the graph (``graph.analyze``), applies the policy, solves the
min-cut (``solver.solve``), splits the graph, places each recomputed op just before its
first use in the backward, and hands the resulting ``Plan`` to ``sink``.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from . import compat
from .budget import Candidate, choose
from .errors import PlanningError, RematError
from .frontier import bytes_first_weight, hull
from .graph import JointGraph, analyze, block_of
from .options import Options
from .peak import floor_bytes, lazy_order, simulate
from .plan import Plan, PlanNode, SavedTensor
from .policy import Decision, decide
from .segments import checkpoint_sets, separators
from .solver import ConflictError, describe, solve, solve_weighted

__all__ = ["make_partition_fn", "plan_joint_graph", "cse"]

log = logging.getLogger("remat")


def _hashable(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(a) for a in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    if isinstance(x, slice):
        return ("slice", x.start, x.stop, x.step)
    return x


def _impure(node: fx.Node) -> bool:
    t = node.target
    if isinstance(t, compat.OpOverload):
        return (t._schema.is_mutable or torch.Tag.nondeterministic_seeded in t.tags
                or t.namespace in ("_c10d_functional", "c10d_functional", "c10d"))
    return t is not operator.getitem


def cse(gm: fx.GraphModule) -> int:
    """Merge identical pure ops (same target and arguments) in place; returns merges done.
    The backward's re-derivations of forward values (a layer norm's normalised input, say)
    become reads of the forward value, which the cut can then save or recompute once."""
    seen: dict[Any, fx.Node] = {}
    merged = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or _impure(n):
            continue
        key = (n.target, _hashable(n.args), _hashable(n.kwargs))
        try:
            hash(key)
        except TypeError:
            continue
        if key in seen:
            n.replace_all_uses_with(seen[key])
            gm.graph.erase_node(n)
            merged += 1
        else:
            seen[key] = n
    gm.recompile()
    return merged


def _decisions(jg: JointGraph, options: Options) -> tuple[dict[int, str], dict[int, str], dict[int, str]]:
    """(no_recompute, no_save, reasons) per value index."""
    no_recompute: dict[int, str] = {}
    no_save: dict[int, str] = {}
    reasons: dict[int, str] = {}
    used: set[str] = set()
    for i, (node, op, facts) in enumerate(zip(jg.nodes, jg.ops, jg.facts)):
        if facts.role in ("input", "parameter"):
            no_recompute[i] = "parameter" if facts.role == "parameter" else "graph input"
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
    for rule in options.policy:
        if rule.name not in used:
            warnings.warn(f"remat: policy rule `{rule.name}` matched no op in this graph; "
                          "check its ops=/modules= patterns.", stacklevel=2)
    return no_recompute, no_save, reasons


COST_RULES = frozenset({"matmul", "attention", "reduction", "normalization boundary"})
"""Built-in rules that forbid recompute because it is slow, not because it is unsafe: under a
budget they give way to the estimated recompute cost."""


@dataclass
class Planned:
    jg: JointGraph
    saved_ids: list[int]
    plan: Plan
    frontier: tuple[Plan, ...] | None = None


def plan_joint_graph(
    gm: fx.GraphModule, num_fwd_outputs: int, static_input_indices: list[int], options: Options,
    want_frontier: bool = False,
) -> Planned:
    """Analyse and solve one joint graph (CSE is applied to ``gm`` in place). With a budget
    (or ``want_frontier``) the memory/recompute frontier is computed too."""
    gm.graph.eliminate_dead_code()
    eager_graph = analyze(gm, num_fwd_outputs, static_input_indices, options.device_model)
    eager = EagerBaseline(
        saved_bytes=sum(eager_graph.cost[i] for i in eager_graph.eager_saved),
        peak_bytes=simulate(eager_graph.schedule, eager_graph.to_schedule_ids(eager_graph.eager_direct)).peak_bytes,
    )
    cse(gm)
    jg = analyze(gm, num_fwd_outputs, static_input_indices, options.device_model, options.backend)
    eager = dataclasses.replace(eager, floor_bytes=floor_bytes(jg.schedule))
    no_recompute, no_save, reasons = _decisions(jg, options)
    problem = jg.problem(no_recompute, no_save)
    try:
        sol = solve(problem)
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
    options_out: list[tuple[tuple[int, ...], tuple[int, ...], Plan]] = [(sol.saved, sol.recomputed, plan)]
    for v in hull(relaxed):
        if all(v.saved != o[0] for o in options_out):
            options_out.append((v.saved, v.recomputed,
                                build_plan(jg, v.saved, v.recomputed, relaxed_nr, reasons, eager)))
    options_out += _segment_plans(jg, options_out, relaxed_nr, no_save, reasons, eager)
    frontier = tuple(sorted((o[2] for o in options_out), key=lambda q: (q.recompute_seconds, q.predicted_peak_bytes)))
    if options.budget is None:
        return Planned(jg, list(sol.saved), plan, frontier)
    limit = options.budget.resolve(eager.peak_bytes)
    cands = [Candidate(k, o[2].predicted_peak_bytes, o[2].recompute_seconds, o[2].saved_bytes)
             for k, o in enumerate(options_out)]
    chosen = options_out[choose(cands, limit, eager.peak_bytes, eager.floor_bytes).key]
    chosen_plan = dataclasses.replace(chosen[2], budget_bytes=limit)
    return Planned(jg, list(chosen[0]), chosen_plan, frontier)


def _segment_plans(jg: JointGraph, known: list, relaxed_nr: dict[int, str], no_save: dict[int, str],
                   reasons: dict[int, str], eager: EagerBaseline) -> list:
    """Checkpoint-segment plans (``remat.segments``): for each set of separators, the plan that
    recomputes through none of them and otherwise saves the fewest bytes (every cost rule
    relaxed, recompute time breaking ties), i.e. checkpointing with the cut choosing what each
    segment keeps. Only plans that no other candidate beats on both predicted peak and
    recompute time are returned."""
    inputs_ = {i for i, f in enumerate(jg.facts) if f.role == "input"}
    act: set[int] = set()
    for i in range(len(jg.nodes)):
        if i in jg.forward and any(u in act or u in inputs_ for u in jg.inputs[i]):
            act.add(i)
    weights = [jg.schedule.nbytes[sid] for sid in jg.sched_ids]
    seen = {tuple(o[0]) for o in known}
    found = []
    for cps in checkpoint_sets(separators(jg.inputs, act), weights, act):
        nr = {**relaxed_nr, **{c: CHECKPOINT for c in cps if c not in relaxed_nr}}
        prob = jg.problem(nr, no_save, recompute_cost=jg.recompute_seconds)
        try:
            s = solve_weighted(prob, bytes_first_weight(prob))
        except ConflictError:
            continue
        if s.saved not in seen:
            seen.add(s.saved)
            found.append((simulate(jg.schedule, jg.to_schedule_ids(s.saved)).peak_bytes, s.time, cps, nr, s))
    rivals = [(o[2].predicted_peak_bytes, o[2].recompute_seconds) for o in known] + [f[:2] for f in found]
    out = []
    for peak, t, cps, nr, s in found:
        if any(pk <= peak and tt <= t and (pk, tt) != (peak, t) for pk, tt in rivals):
            continue
        p = build_plan(jg, s.saved, s.recomputed, nr, {**reasons, **nr}, eager)
        out.append((s.saved, s.recomputed, dataclasses.replace(p, checkpoints=tuple(jg.facts[c].name for c in cps))))
    return out


CHECKPOINT = "checkpoint (segment boundary)"


@dataclass(frozen=True)
class EagerBaseline:
    """Per-graph numbers every plan is compared with: eager autograd's saved bytes and
    predicted peak, and the floor no plan's predicted peak goes under (``peak.floor_bytes``)."""

    saved_bytes: int
    peak_bytes: int
    floor_bytes: int = 0


def build_plan(jg: JointGraph, saved_ids: tuple[int, ...] | list[int], computed_ids: tuple[int, ...] | list[int],
               no_recompute: dict[int, str], reasons: dict[int, str], eager: EagerBaseline) -> Plan:
    """The Plan for one joint graph saving ``saved_ids``; ``computed_ids`` are the values the
    backward computes from them (recomputed forward ops and backward-only ops)."""
    saved_set, computed = set(saved_ids), set(computed_ids)
    saved = []
    for i in sorted(saved_set):
        f = jg.facts[i]
        reason = reasons[i] if i in no_recompute else "min-cut boundary"
        saved.append(SavedTensor(f.name, f.op or f.role, f.shape, f.dtype, jg.cost[i], reason, f.source, f.module))
    recomputed = [i for i in sorted(computed) if i in jg.forward and jg.nodes[i].op == "call_function"]
    status = {}
    for i, f in enumerate(jg.facts):
        if i in saved_set:
            status[i] = "saved"
        elif f.role in ("input", "parameter"):
            status[i] = f.role
        elif i in computed:
            status[i] = "recomputed" if i in jg.forward else "backward-only"
        else:
            status[i] = "forward" if i in jg.forward else "backward-only"
    sched = jg.schedule
    by_sched = {sid: i for i, sid in enumerate(jg.sched_ids)}
    nodes = []
    for sid in range(sched.n):
        name = sched.names[sid]
        i = by_sched.get(sid)
        if i is None:
            st = "tangent" if sid in sched.tangent else "backward"
            nodes.append(PlanNode(name, st if st == "tangent" else jg.node_ops.get(sid, ""), st, "",
                                  tuple(sched.names[u] for u in sched.inputs[sid])))
            continue
        f = jg.facts[i]
        nodes.append(PlanNode(name, f.op or f.role, status[i], reasons.get(i, ""),
                              tuple(sched.names[u] for u in sched.inputs[sid]), f.shape, f.dtype,
                              jg.cost[i], f.module, f.source))
    flops = sum(jg.recompute_flops[i] for i in recomputed) if jg.recompute_flops else 0
    secs = sum(jg.recompute_seconds[i] for i in recomputed) if jg.recompute_seconds else 0.0
    return Plan(
        saved=tuple(saved),
        recomputed=tuple(jg.facts[i].name for i in recomputed),
        recomputed_ops=tuple(jg.facts[i].op for i in recomputed),
        eager_saved_bytes=eager.saved_bytes,
        nodes=tuple(nodes),
        predicted_peak_bytes=simulate(sched, jg.to_schedule_ids(saved_ids)).peak_bytes,
        eager_peak_bytes=eager.peak_bytes,
        peak_floor_bytes=eager.floor_bytes,
        recompute_flops=int(flops),
        recompute_seconds=float(secs),
    )


def place_recompute(bw: fx.GraphModule, recomputed: set[str]) -> None:
    """Move each op of ``recomputed`` (every op the backward computes from saved values alone:
    recomputed forward ops and backward-only ones such as an activation's derivative) to just
    before its first use (fx frees values after their last use), so these tensors live only as
    long as the backward needs them. The same ordering as the simulator's (``peak.lazy_order``)."""
    nodes = list(bw.graph.nodes)

    def movable(n: fx.Node) -> bool:
        return n.op == "call_function" and n.name in recomputed

    anchors = [n for n in nodes if n.op not in ("placeholder", "output") and not movable(n)]
    anchors += [n for n in nodes if movable(n)]  # movable ops nobody reads keep a place at the end
    order = lazy_order(anchors, lambda n: n.all_input_nodes, movable)
    output = bw.graph.find_nodes(op="output")[0]
    for n in order:
        output.prepend(n)
    bw.graph.lint()
    bw.recompile()


def tag_stages(*modules: fx.GraphModule) -> None:
    """Mark every op with its block (``graph.block_of``) for Inductor's fusion.

    Note [Stage-local fusion]: remat predicts the peak of the backward it orders (each block's
    recompute and gradients just before they are needed; ``remat.peak``). Inductor may fuse
    kernels across the whole graph: when every op is row-local (the pointwise workload),
    it fused all eight layers' input-gradient chain into one kernel that writes every layer's
    per-row buffers at once for the column sums that follow, so all of them were alive
    together (measured: CPU 21.6 MiB for a plan predicted at 10.0; H200 6017 MiB for 3073).
    With the tags, ``compat.stage_local_fusion`` lets Inductor fuse only kernels of the same
    block (or with ops outside any block), so blocks run in remat's order."""
    for gm in modules:
        for n in gm.graph.nodes:
            if n.op == "call_function":
                stage = block_of(n)
                if stage is not None:
                    n.meta[compat.STAGE_KEY] = stage


def make_partition_fn(options: Options, sink: Callable[[Plan, tuple[Plan, ...] | None], None],
                      want_frontier: bool = False) -> Callable[..., Any]:
    """The partition function for AOTAutograd (and Inductor's partitioner hook). ``sink``
    receives each graph's plan and, with a budget or ``want_frontier``, its frontier."""

    def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                  static_lifetime_input_indices: list[int] | None = None, **_: Any):
        static = list(static_lifetime_input_indices or [])
        try:
            planned = plan_joint_graph(joint, num_fwd_outputs, static, options, want_frontier)
            jg, saved_ids, plan, frontier = planned.jg, planned.saved_ids, planned.plan, planned.frontier
            values = [jg.nodes[i] for i in saved_ids]
            saved_sym = [n for n in values if compat.is_sym(n.meta.get("val"))]
            saved_tensors = [n for n in values if not compat.is_sym(n.meta.get("val"))]
            static_nodes = {jg.nodes[i] for i, f in enumerate(jg.facts) if f.role == "parameter"
                            and jg.nodes[i].op == "placeholder"}
            fw, bw = compat.extract_fwd_bwd(joint, saved_tensors, saved_sym, num_fwd_outputs,
                                            compat.ordered_set(n for n in joint.graph.nodes
                                                               if n in static_nodes))
            place_recompute(bw, {n.name for n in jg.nodes if n.op == "call_function"})
            tag_stages(fw, bw)
        except RematError:
            raise
        except Exception as e:  # noqa: BLE001 - any unexpected failure falls back
            if options.strict:
                raise RematError(f"remat: planning failed ({type(e).__name__}: {e}). "
                                 "strict=True forbids the fallback; please report this graph.") from e
            warnings.warn(f"remat: planning failed ({type(e).__name__}: {e}); this graph saves "
                          "what autograd would save instead. Pass strict=True to raise.", stacklevel=2)
            fw, bw = compat.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                              static_lifetime_input_indices=static)
            plan, frontier = Plan(saved=(), recomputed=(), fallback=f"{type(e).__name__}: {e}"), None
        if log.isEnabledFor(logging.INFO):
            log.info("%s", plan.summary())
        log.debug("%s", plan)
        sink(plan, frontier)
        return fw, bw

    return partition
