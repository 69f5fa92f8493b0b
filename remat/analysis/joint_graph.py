"""The fx joint graph, lowered to facts the solver and the plan need.

``analyze`` describes every value of an AOTAutograd joint graph (the nodes the backward does not
compute; ``remat.analysis.halves`` says which half computes what): its ``NodeFacts`` (name, op,
shape, dtype, bytes, module path and source line, role), its ``OpInfo`` for the policy's rules
(``remat.analysis.op_facts``, and Note [Normalization boundary]), its inputs, what eager autograd
would save of it, the step's ``Schedule`` (``remat.analysis.schedule``) and the estimated cost of
recomputing it (``remat.analysis.cost``), in one frozen :class:`JointGraph`. It also builds the
torch-free :class:`remat.core.solver.Problem` from per-op decisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from ..core.peak import Schedule
from ..core.solver import Problem
from ..device import CPU, H200, DeviceModel
from ..plan import NodeFacts, PlanNode, Role
from ..policy import OpFacts, OpInfo
from . import cost
from .halves import Halves, halves
from .normalization import normalization_boundaries, statistics
from .op_facts import NO_FACTS, op_facts, op_info, through_getitem, view_root
from .ops import op_name
from .provenance import decomposed_outputs, module_path, source
from .schedule import step_schedule

if TYPE_CHECKING:
    from ..backends.base import Backend

__all__ = ["NodeFacts", "JointGraph", "analyze", "device_of", "device_model_for"]


@dataclass(frozen=True)
class JointGraph:
    """Facts about one joint graph: values are the forward-computable nodes, in graph order;
    every per-value sequence is indexed like ``nodes``."""

    nodes: tuple[fx.Node, ...]
    index: Mapping[fx.Node, int]
    """The position of each value in ``nodes``."""
    facts: tuple[NodeFacts, ...]
    ops: tuple[OpInfo, ...]
    inputs: tuple[tuple[int, ...], ...]
    """The values each value reads, sorted."""
    cost: tuple[int, ...]
    """Bytes saving each value keeps alive (a view: its base's; parameters: 0)."""
    needed: frozenset[int]
    """Values the backward reads."""
    forward: frozenset[int]
    """Values the forward computes."""
    eager_saved: tuple[int, ...]
    """Values eager autograd keeps: the storage (view roots) of ``eager_direct``."""
    eager_direct: tuple[int, ...]
    """Values eager autograd's backward formulas read directly (views not mapped to bases)."""
    schedule: Schedule
    sched_ids: tuple[int, ...]
    """Schedule node id of each value."""
    node_ops: Mapping[int, str]
    """Op name of every schedule node (backward ones included)."""
    recompute_flops: tuple[int, ...]
    recompute_seconds: tuple[float, ...]
    """Estimated time to recompute each value in a fused backward kernel (0 if not forward)."""
    plan_nodes: dict[tuple[int, str, str], PlanNode] = field(default_factory=dict, repr=False, compare=False)
    """A cache, not a fact: ``planner.build_plan``'s node of each (schedule id, status, reason),
    made once and shared by the plans of this graph (the candidates of a budget are dozens of
    plans of one graph)."""
    bandwidth: float = 0.0
    """The device model's memory bandwidth (bytes/s): what a saved byte costs in time, written by
    the forward and read by the backward (``PlanData.traffic_seconds``); 0: not estimated."""

    def traffic_seconds(self, saved_bytes: int) -> float:
        """The estimated time of writing ``saved_bytes`` in the forward and reading them in the
        backward (Note [Default plan: bytes and recompute traffic])."""
        return 2 * saved_bytes / self.bandwidth if self.bandwidth else 0.0

    def readers(self) -> list[list[int]]:
        """For each value, the values that read it (in graph order)."""
        out: list[list[int]] = [[] for _ in self.inputs]
        for i, ins in enumerate(self.inputs):
            for u in ins:
                out[u].append(i)
        return out

    def to_schedule_ids(self, values: list[int] | tuple[int, ...]) -> set[int]:
        return {self.sched_ids[i] for i in values}

    def problem(self, no_recompute: dict[int, str], no_save: dict[int, str],
                recompute_cost: list[float] | tuple[float, ...] | None = None) -> Problem:
        return Problem(
            inputs=tuple(self.inputs),
            cost=tuple(self.cost),
            needed=frozenset(self.needed),
            no_recompute=dict(no_recompute),
            no_save=dict(no_save),
            names=tuple(f.name for f in self.facts),
            recompute_cost=tuple(recompute_cost or ()),
        )


def analyze(gm: fx.GraphModule, num_fwd_outputs: int, static_input_indices: list[int],
            device_model: DeviceModel | None = None, backend: Backend | None = None,
            eager_kernels: bool = False, ends_at_break: bool = False) -> JointGraph:
    """Describe the joint graph's values (see the module docstring). ``backend`` is how the
    partitioned graphs will run (``remat.backends.base``): it supplies the step model the schedule is
    simulated with; ``None`` simulates op by op, as eager autograd and the uncompiled backend run.
    ``eager_kernels``: the schedule is eager autograd's, whose kernels do not allocate the
    intermediates of their decompositions (Note [Eager kernels]). ``ends_at_break``: Dynamo
    ended the graph at a graph break; like a graph that computes the loss, its outputs are not
    held by the caller through the backward (they go to the code resumed after the break, and
    their gradients come from the next graph's backward: Note [What the caller holds])."""
    h = halves(gm, num_fwd_outputs, static_input_indices)
    values = [n for n in gm.graph.nodes if n.op in ("placeholder", "call_function", "get_attr")
              and n not in h.backward]
    index = {n: i for i, n in enumerate(values)}
    facts, ops, costs = _describe(values, index, h)
    forward = frozenset(i for i, n in enumerate(values) if n in h.forward)
    direct = _eager_direct(values, index, forward, h)
    schedule, ids = step_schedule(gm, h, backend, eager_kernels, ends_at_break)
    dev = device_model or device_model_for(gm)
    estimates = [cost.recompute_estimate(n, op, dev) if i in forward and n.op == "call_function" else (0, 0.0)
                 for i, (n, op) in enumerate(zip(values, ops))]
    return JointGraph(
        nodes=tuple(values), index=index, facts=facts, ops=ops,
        inputs=tuple(tuple(sorted(index[a] for a in n.all_input_nodes if a in index)) for n in values),
        cost=costs, needed=_needed(index, h), forward=forward,
        eager_saved=_eager_saved(direct, index, costs), eager_direct=tuple(sorted(index[a] for a in direct)),
        schedule=schedule, sched_ids=tuple(ids[n] for n in values),
        node_ops={i: op_name(n) for n, i in ids.items()},
        recompute_flops=tuple(f for f, _ in estimates), recompute_seconds=tuple(s for _, s in estimates),
        bandwidth=dev.bandwidth,
    )


def _needed(index: dict[fx.Node, int], h: Halves) -> frozenset[int]:
    """The values the backward reads, and those it returns."""
    needed: set[int] = set()
    for n in h.backward:
        needed.update(index[a] for a in n.all_input_nodes if a in index)
    needed.update(index[a] for a in h.bwd_outs if isinstance(a, fx.Node) and a in index)
    return frozenset(needed)


def _describe(values: list[fx.Node], index: dict[fx.Node, int],
              h: Halves) -> tuple[tuple[NodeFacts, ...], tuple[OpInfo, ...], tuple[int, ...]]:
    """Each value's ``NodeFacts``, ``OpInfo`` and bytes (``JointGraph.facts``, ``ops``, ``cost``)."""
    names = {n: op_name(n) for n in values}
    own = {n: op_facts(n, names[n]) for n in values if n.op == "call_function"}
    stat = statistics(values, own, names)
    boundaries = normalization_boundaries(values, stat, h.forward, own)
    # Only forward nodes answer to the op the user wrote: AOTAutograd gives the backward's nodes
    # the forward op's ``original_aten`` and ``seq_nr`` (slice's gradient ``full`` says
    # ``aten.slice.Tensor``), and a value the backward computes is never a choice to save.
    written = decomposed_outputs([n for n in values if n in h.forward])
    facts: list[NodeFacts] = []
    ops: list[OpInfo] = []
    costs: list[int] = []
    for n in values:
        val = n.meta.get("val")
        role = _role(n, h)
        # A parameter is free to save; a multi-output op's getitems carry its bytes.
        nbytes = 0 if role is Role.PARAMETER or isinstance(val, (tuple, list)) else cost.nbytes(val)
        root = view_root(n) if n.op == "call_function" else n
        if root is not n and root in index:
            nbytes = costs[index[root]]  # a saved view keeps its base's whole storage alive
        module = module_path(n)
        facts.append(NodeFacts(name=n.name, op=names[n], shape=cost.shape(val), dtype=cost.dtype_name(val),
                               nbytes=nbytes, module=module, source=source(n), role=role))
        ops.append(op_info(_rules_facts(n, names[n], own, stat), name=n.name, op=names[n], module=module,
                           forward=n in h.forward, is_normalization_boundary=n in boundaries,
                           written_as=written.get(n, "")))
        costs.append(nbytes)
    return tuple(facts), tuple(ops), tuple(costs)


def _rules_facts(n: fx.Node, name: str, own: dict[fx.Node, OpFacts], stat: set[fx.Node]) -> OpFacts:
    """The facts rules see of ``n``: its own, or for a getitem, those it takes from its op."""
    f = own.get(n, NO_FACTS)
    if name == "getitem" and n.args[0] in own:
        return through_getitem(f, own[n.args[0]], n.args[0] in stat)
    return f


def _role(n: fx.Node, h: Halves) -> Role:
    if n.op == "placeholder":
        return Role.PARAMETER if n in h.static else Role.INPUT
    if n.op == "get_attr":
        return Role.PARAMETER
    return Role.FORWARD if n in h.forward else Role.BACKWARD_ONLY


def _eager_direct(values: list[fx.Node], index: dict[fx.Node, int], forward: frozenset[int],
                  h: Halves) -> set[fx.Node]:
    """Values eager autograd's backward formulas read: forward values (and inputs) read by
    backward-only values, by the backward, or returned by it. Computed on the graph before
    common-subexpression elimination, where each backward formula reads what it saved."""
    def kept(a: object) -> bool:
        return isinstance(a, fx.Node) and a in index and (index[a] in forward or a.op == "placeholder")

    readers = [n for n in values if index[n] not in forward] + list(h.backward)
    direct = {a for n in readers for a in n.all_input_nodes if kept(a)}
    direct.update(a for a in h.bwd_outs if kept(a))
    return direct


def _eager_saved(direct: set[fx.Node], index: dict[fx.Node, int], costs: tuple[int, ...]) -> tuple[int, ...]:
    """The values eager autograd keeps for ``direct``: each view counted as its base's storage."""
    roots = {view_root(a) for a in direct}
    return tuple(sorted(index[r] for r in roots if r in index and costs[index[r]] > 0))


def device_of(gm: fx.GraphModule) -> str:
    """The device type of the graph's first tensor on an accelerator, else ``"cpu"``."""
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type != "cpu":
            return val.device.type
    return "cpu"


def device_model_for(gm: fx.GraphModule) -> DeviceModel:
    """The default device model: H200 numbers for a graph on a GPU, CPU numbers otherwise."""
    return H200 if device_of(gm) == "cuda" else CPU
