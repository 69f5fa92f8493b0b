"""The ``Plan`` of one cut: what a joint graph saving some values shows of itself (its saved
tensors with their reasons, what the backward recomputes and how often, every node's status)
and the numbers it is compared with (``EagerBaseline``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.joint_graph import JointGraph
from ..core.peak import OP_BY_OP, simulate
from ..plan import Plan
from ..plan_data import PlanNode, Role, SavedTensor, Status
from .decisions import Decisions
from .nesting import copy_of

__all__ = ["EagerBaseline", "build_plan"]


@dataclass(frozen=True)
class EagerBaseline:
    """Per-graph numbers every plan is compared with: eager autograd's saved bytes and
    predicted peak, and the floor no plan's predicted peak goes under (``peak.floor_bytes``)."""

    saved_bytes: int
    peak_bytes: int
    floor_bytes: int = 0


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


def _statuses(jg: JointGraph, saved: set[int], computed: set[int]) -> dict[int, Status]:
    """What the plan does with each value of the joint graph."""
    status: dict[int, Status] = {}
    for i, f in enumerate(jg.facts):
        if i in saved:
            status[i] = Status.SAVED
        elif f.role in (Role.INPUT, Role.PARAMETER):
            status[i] = Status(f.role.value)
        elif i in computed:
            status[i] = Status.RECOMPUTED if i in jg.forward else Status.BACKWARD_ONLY
        else:
            status[i] = Status.FORWARD if i in jg.forward else Status.BACKWARD_ONLY
    return status


def _nodes(jg: JointGraph, status: dict[int, Status], decided: Decisions) -> tuple[PlanNode, ...]:
    """Every schedule node as the plan shows it, in schedule order; each (node, status, reason)
    made once for all the graph's plans (``JointGraph.plan_nodes``)."""
    sched = jg.schedule
    by_sched = {sid: i for i, sid in enumerate(jg.sched_ids)}
    nodes = []
    made = jg.plan_nodes
    for sid in range(sched.n):
        i = by_sched.get(sid)
        if i is None:
            st = Status.TANGENT if sid in sched.tangent else Status.BACKWARD
            key = (sid, st, "")
        else:
            st = status[i]
            key = (sid, st, decided.node_reason(i))
        node = made.get(key)
        if node is None:
            node = made[key] = _plan_node(jg, sid, i, st, key[2])
        nodes.append(node)
    return tuple(nodes)


def build_plan(jg: JointGraph, saved_ids: tuple[int, ...] | list[int], computed_ids: tuple[int, ...] | list[int],
               decided: Decisions, eager: EagerBaseline, peak_bytes: int | None = None) -> Plan:
    """The Plan for one joint graph saving ``saved_ids``; ``computed_ids`` are the values the
    backward computes from them (recomputed forward ops and backward-only ops); ``decided``:
    the decisions it was cut under (the reasons it prints). ``peak_bytes``: its simulated peak
    where the caller has it (``peak.simulate``), else simulated here."""
    saved_set, computed = set(saved_ids), set(computed_ids)
    saved = []
    for i in sorted(saved_set):
        f = jg.facts[i]
        saved.append(SavedTensor.of(f, op=f.op or f.role, nbytes=jg.cost[i], reason=decided.saved_reason(i)))
    recomputed = [i for i in sorted(computed) if i in jg.forward and jg.nodes[i].op == "call_function"]
    times = _recompute_times(jg, recomputed)
    by_name = {n.name: i for i, n in enumerate(jg.nodes)}
    sched = jg.schedule
    flops = sum(jg.recompute_flops[i] for i in recomputed) if jg.recompute_flops else 0
    secs = sum(jg.recompute_seconds[i] for i in recomputed) if jg.recompute_seconds else 0.0
    peak = simulate(sched, jg.to_schedule_ids(saved_ids)).peak_bytes if peak_bytes is None else peak_bytes
    return Plan(
        saved=tuple(saved),
        recomputed=tuple(times),
        recomputed_ops=tuple(jg.facts[by_name[name]].op for name in times),
        recompute_times=tuple(times.values()) if any(t > 1 for t in times.values()) else (),
        eager_saved_bytes=eager.saved_bytes,
        nodes=_nodes(jg, _statuses(jg, saved_set, computed), decided),
        predicted_peak_bytes=peak,
        simulated_peak_bytes=peak,
        peak_model=getattr(sched.model or OP_BY_OP, "name", ""),
        eager_peak_bytes=eager.peak_bytes,
        peak_floor_bytes=eager.floor_bytes,
        recompute_flops=int(flops),
        recompute_seconds=float(secs),
        traffic_seconds=jg.traffic_seconds(sum(st.nbytes for st in saved)),
    )
