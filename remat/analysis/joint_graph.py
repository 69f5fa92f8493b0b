"""The fx joint graph, lowered to facts the solver and the plan need.

``analyze`` classifies every node of an AOTAutograd joint graph:

* inputs: ``primals_*`` placeholders (parameters and buffers among them are free to save);
* backward: tangents and everything that depends on a tangent;
* forward-computable: every other op. Those that forward outputs depend on are *forward*
  ops (the forward computes them anyway); the rest are computed from forward values only
  for the backward and may run in either half.

It also builds the torch-free :class:`remat.core.solver.Problem` from per-op decisions.
"""

from __future__ import annotations

import operator
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from .. import compat
from ..core.peak import Schedule
from ..core.reach import reachable
from ..core.solver import Problem
from ..device import CPU, H200, DeviceModel
from ..plan import NodeFacts, PlanNode, Role
from ..planning.nesting import COPY_OF
from ..policy import OpInfo
from . import cost
from .ops import (
    ATTENTION_OPS,
    CAST_OPS,
    DATA_DEPENDENT_OPS,
    MATMUL_OPS,
    MUTATING_HOPS,
    RANDOM_OPS,
    REDUCTION_OPS,
    is_collective,
    op_name,
    packet,
)

if TYPE_CHECKING:
    from ..backends.base import Backend

__all__ = ["NodeFacts", "JointGraph", "analyze", "op_name", "block_of", "flags", "tensor_inputs", "view_root",
           "device_of"]

_PATH_KEY = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]")


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    path = re.sub(r"^L\[['\"][^'\"]*['\"]\]", "", path)
    path = _PATH_KEY.sub(r".\1", path)
    path = re.sub(r"^self\.|^_orig_mod\.", "", path.lstrip("."))
    return path.lstrip(".")


def block_of(node: fx.Node) -> str | None:
    """The repeated block an op belongs to: its module path up to the first numeric component
    (``layers.3.attn`` -> ``layers.3``, ``0.fc1`` -> ``0``); None outside indexed blocks."""
    parts = _module_path(node).split(".")
    for k, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: k + 1])
    return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WRAPPER_FILES = {os.path.join(_PACKAGE, f) for f in ("api.py", os.path.join("capture", "dynamo_backend.py"))}


def _source(node: fx.Node) -> str:
    """``file:line`` of the innermost user frame (remat's own wrapper frames skipped)."""
    trace = node.meta.get("stack_trace") or ""
    frames = [f for f in _FRAME.findall(trace) if os.path.abspath(f[0]) not in _WRAPPER_FILES]
    if not frames:
        return ""
    file, line = frames[-1]
    return f"{file.rsplit('/', 1)[-1]}:{line}"


@dataclass
class JointGraph:
    """Facts about one joint graph: values are the forward-computable nodes, in graph order."""

    nodes: list[fx.Node]
    index: dict[fx.Node, int]
    facts: list[NodeFacts]
    ops: list[OpInfo]
    inputs: list[tuple[int, ...]]
    cost: list[int]
    needed: set[int]
    forward: set[int]
    eager_saved: list[int] = field(default_factory=list)
    eager_direct: list[int] = field(default_factory=list)
    """Values eager autograd's backward formulas read directly (views not mapped to bases)."""
    schedule: Schedule | None = None
    sched_ids: list[int] = field(default_factory=list)
    """Schedule node id of each value."""
    node_ops: dict[int, str] = field(default_factory=dict)
    """Op name of every schedule node (backward ones included)."""
    recompute_flops: list[int] = field(default_factory=list)
    recompute_seconds: list[float] = field(default_factory=list)
    """Estimated time to recompute each value in a fused backward kernel (0 if not forward)."""
    plan_nodes: dict[tuple[int, str, str], PlanNode] = field(default_factory=dict, repr=False, compare=False)
    """``planner.build_plan``'s node of each (schedule id, status, reason), made once and shared
    by the plans of this graph (the candidates of a budget are dozens of plans of one graph)."""

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
                recompute_cost: list[float] | None = None) -> Problem:
        return Problem(
            inputs=tuple(self.inputs),
            cost=tuple(self.cost),
            needed=frozenset(self.needed),
            no_recompute=dict(no_recompute),
            no_save=dict(no_save),
            names=tuple(f.name for f in self.facts),
            recompute_cost=tuple(recompute_cost or ()),
        )


def _is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and (
        str(node.target).startswith("tangents") or str(node.target).startswith("bwd_")
    )


def _fwd_bwd_outputs(gm: fx.GraphModule, num_fwd_outputs: int) -> tuple[list, list]:
    out = gm.graph.find_nodes(op="output")[0]
    args = list(compat.tree_leaves(out.args))
    return args[:num_fwd_outputs], args[num_fwd_outputs:]


def tensor_inputs(node: fx.Node) -> list[fx.Node]:
    return [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]


def flags(node: fx.Node, op: str) -> dict:
    """The ``OpInfo`` flags of one op (matmul, attention, random, view, reduction ratio, ...)."""
    t = node.target
    pk = packet(op)
    out: dict = {}
    if isinstance(t, compat.OpOverload):
        schema = t._schema
        rets = schema.returns
        out["is_view"] = bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write
        out["is_mutating"] = schema.is_mutable
        out["is_random"] = torch.Tag.nondeterministic_seeded in t.tags or pk in RANDOM_OPS
        out["is_collective"] = is_collective(t)
    else:
        out["is_random"] = op in RANDOM_OPS
        out["is_mutating"] = op in MUTATING_HOPS
    out["is_data_dependent"] = pk in DATA_DEPENDENT_OPS or op in DATA_DEPENDENT_OPS
    out["is_matmul"] = pk in MATMUL_OPS
    out["is_attention"] = pk in ATTENTION_OPS or op in ATTENTION_OPS
    if out["is_attention"]:
        # Attention kernels are tagged as seeded for their optional dropout.
        out["is_random"] = _attention_dropout(node) > 0
    if pk in REDUCTION_OPS:
        ins = tensor_inputs(node)
        out_numel = cost.numel(node.meta.get("val"))
        in_numel = cost.numel(ins[0].meta.get("val")) if ins else 0
        out["reduction_ratio"] = in_numel / max(out_numel, 1)
    return out


def _attention_dropout(node: fx.Node) -> float:
    t = node.target
    if not isinstance(t, compat.OpOverload):
        return 0.0
    for i, arg in enumerate(t._schema.arguments):
        if arg.name == "dropout_p":
            value = node.kwargs.get("dropout_p", node.args[i] if i < len(node.args) else 0.0)
            return float(value or 0.0)
    return 0.0


def device_model_for(gm: fx.GraphModule) -> DeviceModel:
    """The default device model: H200 numbers for a graph on a GPU, CPU numbers otherwise."""
    return H200 if device_of(gm) == "cuda" else CPU


def _recompute_costs(jg: JointGraph, dev: DeviceModel) -> None:
    fl, secs = [], []
    for i, (n, op) in enumerate(zip(jg.nodes, jg.ops)):
        if i not in jg.forward or n.op != "call_function":
            fl.append(0)
            secs.append(0.0)
            continue
        ins = [a.meta.get("val") for a in n.all_input_nodes]
        out = n.meta.get("val")
        f = cost.flops(op.op, out, ins)
        if op.is_view or op.op == "getitem":
            kind, f = "view", 0
        elif op.is_matmul or op.is_attention:
            kind = "heavy"
        elif op.reduction_ratio:
            kind = "reduction"
        else:
            kind = "pointwise"
        bytes_in = sum(cost.nbytes(v) for v in ins)
        bytes_out = sum(cost.nbytes(v) for v in out) if isinstance(out, (tuple, list)) else cost.nbytes(out)
        fl.append(int(f))
        secs.append(cost.recompute_seconds(kind, f, bytes_in, bytes_out, dev))
    jg.recompute_flops, jg.recompute_seconds = fl, secs


def analyze(gm: fx.GraphModule, num_fwd_outputs: int, static_input_indices: list[int],
            device_model: DeviceModel | None = None, backend: Backend | None = None,
            eager_kernels: bool = False, ends_at_break: bool = False) -> JointGraph:
    """Classify the joint graph's nodes (see the module docstring). ``backend`` is how the
    partitioned graphs will run (``remat.backends.base``): it supplies the step model the schedule is
    simulated with; ``None`` simulates op by op, as eager autograd and the uncompiled backend run.
    ``eager_kernels``: the schedule is eager autograd's, whose kernels do not allocate the
    intermediates of their decompositions (Note [Eager kernels]). ``ends_at_break``: Dynamo
    ended the graph at a graph break; like a graph that computes the loss, its outputs are not
    held by the caller through the backward (they go to the code resumed after the break, and
    their gradients come from the next graph's backward: Note [What the caller holds])."""
    graph = gm.graph
    primals = [n for n in graph.nodes if n.op == "placeholder" and not _is_tangent(n)]
    static = {primals[i] for i in static_input_indices if i < len(primals)}
    fwd_outs, bwd_outs = _fwd_bwd_outputs(gm, num_fwd_outputs)

    backward: set[fx.Node] = set()
    for n in graph.nodes:
        if _is_tangent(n) or any(a in backward for a in n.all_input_nodes):
            if n.op != "output":
                backward.add(n)
    forward_nodes = reachable([a for a in fwd_outs if isinstance(a, fx.Node)], lambda n: n.all_input_nodes)
    # Every output of a multi-output forward op (an attention's logsumexp, say) is forward.
    forward_nodes.update(u for n in list(forward_nodes) for u in n.users
                         if u.target is operator.getitem)
    # Ops the user's forward ran are forward ops even when only the backward reads them (noise
    # a custom autograd.Function draws and saves, say): AOTAutograd tags them while tracing.
    # Views are left out: taking one is free in either half.
    forward_nodes.update(n for n in graph.nodes if n.op == "call_function" and n not in backward
                         and n.meta.get("partitioner_tag") == "is_forward" and view_root(n) is n)
    # A nested plan's copies (``remat.planning.nesting``) compute forward values a second time.
    forward_nodes.update(n for n in graph.nodes if n.meta.get(COPY_OF))

    values = [n for n in graph.nodes if n.op in ("placeholder", "call_function", "get_attr")
              and n not in backward]
    index = {n: i for i, n in enumerate(values)}
    needed: set[int] = set()
    for n in backward:
        needed.update(index[a] for a in n.all_input_nodes if a in index)
    needed.update(index[a] for a in bwd_outs if isinstance(a, fx.Node) and a in index)

    # Statistics (reduction outputs and pointwise functions of them) for the normalization rule.
    op_names = {n: op_name(n) for n in values}
    op_flags = {n: flags(n, op_names[n]) for n in values if n.op == "call_function"}
    stat: set[fx.Node] = set()
    for n in values:
        if n.op != "call_function":
            continue
        f = op_flags[n]
        if f.get("reduction_ratio", 0) >= 4:
            stat.add(n)
        elif op_names[n] == "getitem" and n.args[0] in stat:
            stat.add(n)
        else:
            ins = tensor_inputs(n)
            if ins and all(a in stat for a in ins) and not f.get("is_view"):
                stat.add(n)

    boundaries = _normalization_boundaries(values, stat, forward_nodes, op_flags)
    facts, ops, inputs, costs = [], [], [], []
    for n in values:
        val = n.meta.get("val")
        is_forward = n in forward_nodes
        f = op_flags.get(n, {})
        if op_names[n] == "getitem" and n.args[0] in op_flags:
            parent = op_flags[n.args[0]]
            for k in ("is_random", "is_mutating", "is_collective", "is_data_dependent",
                      "is_matmul", "is_attention", "is_view"):
                if parent.get(k):
                    f = {**f, k: True}
            if n.args[0] in stat and parent.get("reduction_ratio"):
                f = {**f, "reduction_ratio": parent["reduction_ratio"]}
        boundary = n in boundaries
        if n.op == "placeholder":
            role = Role.PARAMETER if n in static else Role.INPUT
        elif n.op == "get_attr":
            role = Role.PARAMETER
        else:
            role = Role.FORWARD if is_forward else Role.BACKWARD_ONLY
        nbytes = 0 if role is Role.PARAMETER else cost.nbytes(val)
        if isinstance(val, (tuple, list)):
            nbytes = 0  # multi-output op: its getitems carry the bytes
        root = view_root(n) if n.op == "call_function" else n
        if root is not n and root in index:
            nbytes = costs[index[root]]  # a saved view keeps its base's whole storage alive
        facts.append(NodeFacts(
            name=n.name, op=op_names[n], shape=cost.shape(val), dtype=cost.dtype_name(val),
            nbytes=nbytes, module=_module_path(n), source=_source(n), role=role))
        ops.append(OpInfo(
            name=n.name, op=op_names[n], module=facts[-1].module, forward=is_forward,
            is_normalization_boundary=boundary, **f))
        inputs.append(tuple(sorted(index[a] for a in n.all_input_nodes if a in index)))
        costs.append(nbytes)

    jg = JointGraph(values, index, facts, ops, inputs, costs, needed,
                    {i for i, n in enumerate(values) if n in forward_nodes})
    jg.eager_saved = _eager_saved(jg, values, backward, bwd_outs)
    jg.schedule, ids = _schedule(gm, backward, fwd_outs, bwd_outs, set(primals), backend, eager_kernels,
                                 ends_at_break)
    jg.sched_ids = [ids[n] for n in values]
    jg.node_ops = {i: op_name(n) for n, i in ids.items()}
    _recompute_costs(jg, device_model or device_model_for(gm))
    return jg


def device_of(gm: fx.GraphModule) -> str:
    """The device type of the graph's first tensor on an accelerator, else ``"cpu"``."""
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type != "cpu":
            return val.device.type
    return "cpu"


def _decomposed_key(n: fx.Node) -> tuple[str, str] | None:
    """The eager op a node was decomposed from (``meta["original_aten"]``) and that op's
    autograd sequence number (``meta["seq_nr"]``): one key per eager kernel call; None for a node
    that is its own op."""
    original, seq = n.meta.get("original_aten"), n.meta.get("seq_nr")
    if n.op != "call_function" or original is None or seq is None or str(original) == str(n.target):
        return None
    return str(original), str(seq)


def _inside_eager_kernels(nodes: list[fx.Node], roots: list[fx.Node], outs: set[fx.Node]) -> set[fx.Node]:
    """Note [Eager kernels]: the joint graph is traced with decompositions, so one eager kernel
    (``gelu_backward``, ``native_layer_norm_backward``) appears as several ops whose
    intermediates eager autograd never allocates: the kernel computes them in registers. A
    value every user of which comes from the same eager op (``_decomposed_key``), which no
    other op's view reads, and which the graph does not return, lives only inside that kernel.
    Eager autograd's predicted peak (``Plan.eager_peak_bytes``) gives it no bytes. Measured with
    the CPU profiler (torch 2.13): a two-block ViT's eager peak, 9.68 MiB, was predicted at 11.71
    MiB with these intermediates (the decomposed GELU backward's), 9.68 without."""
    inside = set()
    for n in nodes:
        k = _decomposed_key(n)
        if k is not None and n not in outs and n.users and all(_decomposed_key(u) == k for u in n.users):
            inside.add(n)
    escaping = {r for n, r in zip(nodes, roots) if r is not n and n not in inside}
    return inside - escaping


def _schedule(gm: fx.GraphModule, backward: set[fx.Node], fwd_outs: list, bwd_outs: list,
              primals: set[fx.Node], backend: Backend | None,
              eager_kernels: bool = False, ends_at_break: bool = False) -> tuple[Schedule, dict[fx.Node, int]]:
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    ids = {n: i for i, n in enumerate(nodes)}
    roots = []
    for n in nodes:
        r = view_root(n) if n.op == "call_function" else n
        roots.append(r if r in ids else n)
    outs = {a for a in (*fwd_outs, *bwd_outs) if isinstance(a, fx.Node)}
    inside = _inside_eager_kernels(nodes, roots, outs) if eager_kernels else set()
    kernel: dict[tuple[str, str], int] = {}
    kernels = tuple(kernel.setdefault(k, len(kernel)) if (k := _decomposed_key(n)) is not None else -1
                    for n in nodes) if eager_kernels else ()
    tangents = [n for n in nodes if _is_tangent(n)]
    loss_in_graph = any(getattr(n.meta.get("val"), "ndim", None) == 0 for n in tangents)
    if eager_kernels and loss_in_graph:
        # Eager autograd has gradients only for what the loss reads: the other outputs'
        # zero-filled gradients are AOTAutograd's (Note [What the caller holds]).
        inside |= {n for n in tangents if getattr(n.meta.get("val"), "ndim", None) != 0}
    nbytes, root = [], []
    for n, r in zip(nodes, roots):
        root.append(ids[r])
        own = r is n and n not in primals and n not in inside and not isinstance(n.meta.get("val"), (tuple, list))
        nbytes.append(cost.nbytes(n.meta.get("val")) if own and n.op != "get_attr" else 0)
    return Schedule(
        inputs=tuple(tuple(ids[a] for a in n.all_input_nodes if a in ids) for n in nodes),
        nbytes=tuple(nbytes),
        root=tuple(root),
        graph_input=frozenset(ids[n] for n in nodes if n in primals or n.op == "get_attr"),
        tangent=frozenset(ids[n] for n in nodes if _is_tangent(n)),
        backward=frozenset(ids[n] for n in backward if n in ids),
        fwd_outputs=tuple(ids[a] for a in fwd_outs if isinstance(a, fx.Node) and a in ids),
        bwd_outputs=tuple(ids[a] for a in bwd_outs if isinstance(a, fx.Node) and a in ids),
        names=tuple(n.name for n in nodes),
        kernel=kernels,
        caller_keeps_outputs=not (loss_in_graph or ends_at_break),
        **(backend.schedule_fields(gm, nodes) if backend is not None else {}),
    ), ids


_STOPS = ("is_matmul", "is_attention", "is_random", "is_mutating", "is_collective", "is_data_dependent")


def _reaches_reduction_pointwise(start: fx.Node, forward_nodes: set[fx.Node], flags: dict[fx.Node, dict],
                                 stat: set[fx.Node]) -> bool:
    """True if a path of forward ops that the cut may recompute for free (no matmul, attention,
    random or data-dependent op) leads from ``start`` to the reduction of a *next* normalisation
    (``_applications``): only then can recompute chain from one normalisation into the next
    layer without saving anything. Two kinds of reduction do not count. One whose statistic is
    applied to nothing but ``start`` or values computed from it alone is part of ``start``'s own
    normalisation (the sum of a softmax after the max subtracted, the variance of a layer norm
    after the mean): the boundary is where that normalisation ends. One whose statistic is never
    applied to a tensor ends the graph's work (a loss summed to a scalar). An LM loss's
    log-softmax, held at ``x - max``, saved float32 probabilities in place of the logits they
    are recomputed from."""
    own = _computed_from(start, forward_nodes, stat)
    seen: set[fx.Node] = set()
    stack = [u for u in start.users if u in forward_nodes]
    while stack:
        n = stack.pop()
        if n in seen or n.op != "call_function":
            continue
        seen.add(n)
        f = flags.get(n, {})
        if any(f.get(k) for k in _STOPS):
            continue
        if f.get("reduction_ratio", 0) >= 4:
            applied = _applications(n, forward_nodes, stat)
            if any(a not in own for u in applied for a in tensor_inputs(u) if a not in stat):
                return True
            continue
        stack.extend(u for u in n.users if u in forward_nodes)
    return False


def _computed_from(start: fx.Node, forward_nodes: set[fx.Node], stat: set[fx.Node]) -> set[fx.Node]:
    """``start`` and the forward values computed from it alone (besides statistics): each op's
    only tensor input that is not a statistic is ``start`` or another such value."""
    own = {start}
    stack = [start]
    while stack:
        for u in stack.pop().users:
            if u in own or u not in forward_nodes or u.op != "call_function" or u in stat:
                continue
            if all(a in own for a in tensor_inputs(u) if a not in stat):
                own.add(u)
                stack.append(u)
    return own


def _applications(reduction: fx.Node, forward_nodes: set[fx.Node], stat: set[fx.Node]) -> set[fx.Node]:
    """The forward ops that apply ``reduction``'s statistic (or one computed from statistics
    alone) to a value that is not a statistic, as a norm applies its mean and variance."""
    found: set[fx.Node] = set()
    seen: set[fx.Node] = set()
    stack = [reduction]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for u in n.users:
            if u not in forward_nodes or u.op != "call_function":
                continue
            if u in stat:
                stack.append(u)
            elif any(a not in stat for a in tensor_inputs(u)):
                found.add(u)
    return found




def _normalization_boundaries(values: list[fx.Node], stat: set[fx.Node], forward_nodes: set[fx.Node],
                              flags: dict[fx.Node, dict]) -> set[fx.Node]:
    """Ops that apply a statistic to a full tensor and feed, through ops free to recompute, the
    next reduction (see Note [Normalization boundary]). When such an op's only forward user is a cast to a narrower
    dtype (a bf16 layer norm computes in fp32 and casts back), the cast is the boundary: the
    narrower side is the one worth keeping."""
    out: set[fx.Node] = set()
    for n in values:
        if n.op != "call_function" or n not in forward_nodes or n in stat or flags[n].get("is_view"):
            continue
        ins = tensor_inputs(n)
        full = cost.numel(n.meta.get("val"))
        if not (any(a in stat for a in ins)
                and any(a not in stat and cost.numel(a.meta.get("val")) == full for a in ins)):
            continue
        if not any(u in forward_nodes and u.op == "call_function"
                   and not any(a in stat for a in tensor_inputs(u)) for u in n.users):
            continue
        if not _reaches_reduction_pointwise(n, forward_nodes, flags, stat):
            continue
        while True:
            users = [u for u in n.users if u in forward_nodes]
            if (len(users) == 1 and op_name(users[0]) in CAST_OPS
                    and cost.nbytes(users[0].meta.get("val")) < cost.nbytes(n.meta.get("val"))):
                n = users[0]
            else:
                break
        out.add(n)
    return out


def view_root(node: fx.Node) -> fx.Node:
    """The node whose storage a view (chain) aliases."""
    while node.op == "call_function":
        t = node.target
        if t is operator.getitem and isinstance(node.args[0], fx.Node):
            parent = node.args[0].target
            if isinstance(parent, compat.OpOverload) and _returns_alias(parent):
                node = node.args[0].args[0]
                continue
            return node
        is_view = isinstance(t, compat.OpOverload) and _returns_alias(t)
        if is_view and node.args and isinstance(node.args[0], fx.Node):
            node = node.args[0]
            continue
        return node
    return node


def _returns_alias(t: compat.OpOverload) -> bool:
    rets = t._schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def _eager_saved(jg: JointGraph, values: list[fx.Node], backward: set[fx.Node], bwd_outs: list) -> list[int]:
    """Values eager autograd keeps for this graph: forward values (and inputs) read by the
    backward formulas, each view counted as its base's storage. Computed on the graph before
    common-subexpression elimination, where each backward formula reads what it saved."""
    readers = [n for n in values if jg.index[n] not in jg.forward] + list(backward)
    direct: set[fx.Node] = set()
    for n in readers:
        for a in n.all_input_nodes:
            if a in jg.index and jg.index[a] in jg.forward or (a in jg.index and a.op == "placeholder"):
                direct.add(a)
    direct.update(a for a in bwd_outs if isinstance(a, fx.Node) and a in jg.index
                  and (jg.index[a] in jg.forward or a.op == "placeholder"))
    jg.eager_direct = sorted(jg.index[a] for a in direct)
    roots = {view_root(a) for a in direct}
    return sorted(jg.index[r] for r in roots if r in jg.index and jg.cost[jg.index[r]] > 0)
