"""The fx joint graph, lowered to facts the solver and the plan need.

``analyze`` classifies every node of an AOTAutograd joint graph:

* inputs: ``primals_*`` placeholders (parameters and buffers among them are free to save);
* backward: tangents and everything that depends on a tangent;
* forward-computable: every other op. Those that forward outputs depend on are *forward*
  ops (the forward computes them anyway); the rest are computed from forward values only
  for the backward and may run in either half.

It also builds the torch-free :class:`remat.solver.Problem` from per-op decisions.
"""

from __future__ import annotations

import operator
import os
import re
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from . import compat, cost, fusion
from .peak import Schedule
from .policy import OpInfo
from .solver import Problem

__all__ = ["NodeFacts", "JointGraph", "analyze", "op_name", "block_of"]

MATMUL_OPS = frozenset(
    "aten." + n
    for n in (
        "mm addmm bmm baddbmm matmul mv addmv dot vdot _int_mm _scaled_mm convolution "
        "_convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d "
        "cudnn_convolution cudnn_convolution_transpose mkldnn_convolution miopen_convolution "
        "_weight_int4pack_mm _weight_int8pack_mm linear"
    ).split()
)
ATTENTION_OPS = frozenset(
    "aten." + n
    for n in (
        "scaled_dot_product_attention _scaled_dot_product_attention_math "
        "_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu "
        "_scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention "
        "_scaled_dot_product_fused_attention_overrideable _flash_attention_forward "
        "_efficient_attention_forward"
    ).split()
) | {"higher_order.flex_attention"}
REDUCTION_OPS = frozenset(
    "aten." + n
    for n in (
        "sum mean amax amin var var_mean std std_mean prod logsumexp max min norm "
        "linalg_vector_norm any all nansum"
    ).split()
) | frozenset({"prims.sum", "prims.var", "prims.amax", "prims.amin", "prims.prod"})
DATA_DEPENDENT_OPS = frozenset(
    "aten." + n
    for n in (
        "topk sort argsort argmax argmin nonzero nonzero_static unique_dim _unique _unique2 "
        "unique_consecutive kthvalue mode median nanmedian masked_select searchsorted "
        "bucketize _local_scalar_dense histc"
    ).split()
) | frozenset({"aten.max.dim", "aten.min.dim", "aten.cummax", "aten.cummin"})
RANDOM_OPS = frozenset(
    "aten." + n
    for n in (
        "native_dropout bernoulli rand randn rand_like randn_like randint randint_like normal "
        "uniform exponential multinomial randperm"
    ).split()
) | frozenset(
    {"prims.inductor_random", "prims.inductor_seeds", "rngprims.philox_rand",
     "higher_order.run_and_save_rng_state", "higher_order.run_with_rng_state"}
)
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d"})
MUTATING_HOPS = frozenset({"higher_order.with_effects", "higher_order.auto_functionalized",
                           "higher_order.triton_kernel_wrapper_mutation"})


def op_name(node: fx.Node) -> str:
    """``aten.mm.default``, ``getitem``, ``higher_order.flex_attention``; ``""`` for placeholders."""
    t = node.target
    if node.op != "call_function":
        return ""
    if isinstance(t, compat.OpOverload):
        return f"{t.namespace}.{t._schema.name.split('::')[-1]}.{t._overloadname}"
    if isinstance(t, compat.HigherOrderOperator):
        return f"higher_order.{t.name()}"
    if t is operator.getitem:
        return "getitem"
    return getattr(t, "__name__", str(t))


def _packet(op: str) -> str:
    return ".".join(op.split(".")[:2])


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


_WRAPPER_FILES = {os.path.join(os.path.dirname(os.path.abspath(__file__)), f) for f in ("api.py", "capture.py")}


def _source(node: fx.Node) -> str:
    """``file:line`` of the innermost user frame (remat's own wrapper frames skipped)."""
    trace = node.meta.get("stack_trace") or ""
    frames = [f for f in _FRAME.findall(trace) if os.path.abspath(f[0]) not in _WRAPPER_FILES]
    if not frames:
        return ""
    file, line = frames[-1]
    return f"{file.rsplit('/', 1)[-1]}:{line}"


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the plan reports of one value of the joint graph."""

    name: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    module: str
    source: str
    role: str  # "input", "parameter", "forward", "backward-only"


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


def _tensor_inputs(node: fx.Node) -> list[fx.Node]:
    return [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]


def _flags(node: fx.Node, op: str) -> dict:
    t = node.target
    packet = _packet(op)
    flags = {}
    if isinstance(t, compat.OpOverload):
        schema = t._schema
        rets = schema.returns
        flags["is_view"] = bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write
        flags["is_mutating"] = schema.is_mutable
        flags["is_random"] = torch.Tag.nondeterministic_seeded in t.tags or packet in RANDOM_OPS
        flags["is_collective"] = t.namespace in COLLECTIVE_NAMESPACES
    else:
        flags["is_random"] = op in RANDOM_OPS
        flags["is_mutating"] = op in MUTATING_HOPS
    flags["is_data_dependent"] = packet in DATA_DEPENDENT_OPS or op in DATA_DEPENDENT_OPS
    flags["is_matmul"] = packet in MATMUL_OPS
    flags["is_attention"] = packet in ATTENTION_OPS or op in ATTENTION_OPS
    if flags["is_attention"]:
        # Attention kernels are tagged as seeded for their optional dropout.
        flags["is_random"] = _attention_dropout(node) > 0
    if packet in REDUCTION_OPS:
        ins = _tensor_inputs(node)
        out_numel = cost.numel(node.meta.get("val"))
        in_numel = cost.numel(ins[0].meta.get("val")) if ins else 0
        flags["reduction_ratio"] = in_numel / max(out_numel, 1)
    return flags


def _attention_dropout(node: fx.Node) -> float:
    t = node.target
    if not isinstance(t, compat.OpOverload):
        return 0.0
    for i, arg in enumerate(t._schema.arguments):
        if arg.name == "dropout_p":
            value = node.kwargs.get("dropout_p", node.args[i] if i < len(node.args) else 0.0)
            return float(value or 0.0)
    return 0.0


def device_model_for(gm: fx.GraphModule) -> cost.DeviceModel:
    """The default device model: H200 numbers for a graph on a GPU, CPU numbers otherwise."""
    return cost.H200 if _device(gm) == "cuda" else cost.CPU


def _recompute_costs(jg: JointGraph, dev: cost.DeviceModel) -> None:
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
            device_model: cost.DeviceModel | None = None, backend: str = "eager") -> JointGraph:
    """Classify the joint graph's nodes (see the module docstring). ``backend`` is how the
    partitioned graphs will run: its schedule simulates the step op by op (``"eager"``, the
    uncompiled backend) or as Inductor's kernels (``"inductor"``; ``remat.fusion``)."""
    graph = gm.graph
    primals = [n for n in graph.nodes if n.op == "placeholder" and not _is_tangent(n)]
    static = {primals[i] for i in static_input_indices if i < len(primals)}
    fwd_outs, bwd_outs = _fwd_bwd_outputs(gm, num_fwd_outputs)

    backward: set[fx.Node] = set()
    for n in graph.nodes:
        if _is_tangent(n) or any(a in backward for a in n.all_input_nodes):
            if n.op != "output":
                backward.add(n)
    forward_nodes: set[fx.Node] = set()
    stack = [a for a in fwd_outs if isinstance(a, fx.Node)]
    while stack:
        n = stack.pop()
        if n in forward_nodes:
            continue
        forward_nodes.add(n)
        stack.extend(n.all_input_nodes)
    # Every output of a multi-output forward op (an attention's logsumexp, say) is forward.
    forward_nodes.update(u for n in list(forward_nodes) for u in n.users
                         if u.target is operator.getitem)
    # Ops the user's forward ran are forward ops even when only the backward reads them (noise
    # a custom autograd.Function draws and saves, say): AOTAutograd tags them while tracing.
    # Views are left out: taking one is free in either half.
    forward_nodes.update(n for n in graph.nodes if n.op == "call_function" and n not in backward
                         and n.meta.get("partitioner_tag") == "is_forward" and view_root(n) is n)

    values = [n for n in graph.nodes if n.op in ("placeholder", "call_function", "get_attr")
              and n not in backward]
    index = {n: i for i, n in enumerate(values)}
    needed: set[int] = set()
    for n in backward:
        needed.update(index[a] for a in n.all_input_nodes if a in index)
    needed.update(index[a] for a in bwd_outs if isinstance(a, fx.Node) and a in index)

    # Statistics (reduction outputs and pointwise functions of them) for the normalization rule.
    op_names = {n: op_name(n) for n in values}
    flags = {n: _flags(n, op_names[n]) for n in values if n.op == "call_function"}
    stat: set[fx.Node] = set()
    for n in values:
        if n.op != "call_function":
            continue
        f = flags[n]
        if f.get("reduction_ratio", 0) >= 4:
            stat.add(n)
        elif op_names[n] == "getitem" and n.args[0] in stat:
            stat.add(n)
        else:
            ins = _tensor_inputs(n)
            if ins and all(a in stat for a in ins) and not f.get("is_view"):
                stat.add(n)

    boundaries = _normalization_boundaries(values, stat, forward_nodes, flags)
    facts, ops, inputs, costs = [], [], [], []
    for n in values:
        val = n.meta.get("val")
        is_forward = n in forward_nodes
        f = flags.get(n, {})
        if op_names[n] == "getitem" and n.args[0] in flags:
            parent = flags[n.args[0]]
            for k in ("is_random", "is_mutating", "is_collective", "is_data_dependent",
                      "is_matmul", "is_attention", "is_view"):
                if parent.get(k):
                    f = {**f, k: True}
            if n.args[0] in stat and parent.get("reduction_ratio"):
                f = {**f, "reduction_ratio": parent["reduction_ratio"]}
        boundary = n in boundaries
        if n.op == "placeholder":
            role = "parameter" if n in static else "input"
        elif n.op == "get_attr":
            role = "parameter"
        else:
            role = "forward" if is_forward else "backward-only"
        nbytes = 0 if role == "parameter" else cost.nbytes(val)
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
    jg.schedule, ids = _schedule(graph, backward, fwd_outs, bwd_outs, set(primals),
                                 fusion.rules_for(_device(gm)) if backend == "inductor" else None)
    jg.sched_ids = [ids[n] for n in values]
    jg.node_ops = {i: op_name(n) for n, i in ids.items()}
    _recompute_costs(jg, device_model or device_model_for(gm))
    return jg


def _device(gm: fx.GraphModule) -> str:
    """The device type of the graph's first tensor on an accelerator, else ``"cpu"``."""
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type != "cpu":
            return val.device.type
    return "cpu"


HEAVY_OPS = frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})
"""Ops whose presence makes Inductor's CPU backend store a reused value rather than repeat it
(``StorageBox.should_realize_on_reuse``; 2.11, 2.13)."""


def lowering_kind(node: fx.Node, extern: bool) -> str:
    """How Inductor lowers ``node`` (``remat.fusion.KINDS``). ``extern``: whether Inductor runs
    this op as an extern kernel (``compat.inductor_runs_extern``)."""
    if node.op != "call_function":
        return "input"
    if view_root(node) is not node:
        return "view"
    op = op_name(node)
    target = node.args[0] if op == "getitem" and isinstance(node.args[0], fx.Node) else node
    f = _flags(target, op_name(target))
    if any(f.get(k) for k in ("is_matmul", "is_attention", "is_data_dependent", "is_collective",
                               "is_mutating")) or extern:
        return "extern"
    if f.get("is_random"):
        return "random"
    if "reduction_ratio" in f:
        return "reduction" if _reduces_last_dims(target) else "outer-reduction"
    return "pointwise"


def _reduces_last_dims(node: fx.Node) -> bool:
    """Whether a reduction reduces its input's trailing dimensions (a row of a matrix, as a
    layer norm does), rather than leading ones (a bias gradient summing over the batch)."""
    ins = _tensor_inputs(node)
    ndim = len(cost.shape(ins[0].meta.get("val"))) if ins else 0
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or not dims or not ndim:
        return True
    got = sorted(d % ndim for d in dims if isinstance(d, int))
    return got == list(range(ndim - len(got), ndim))


def _workspace(node: fx.Node) -> int:
    """Scratch bytes an extern kernel holds while it runs. CPU flash attention: per-thread
    blocks (``_cpu_flash_attention_scratch``). Other attention backward kernels accumulate the
    query gradient in float32 (FlashAttention's ``dq_accum``): 4 bytes per element of it."""
    op = op_name(node)
    if op.startswith("aten._scaled_dot_product_flash_attention_for_cpu"):
        return _cpu_flash_attention_scratch(node, backward=op.endswith("_backward.default"))
    if not (op.startswith("aten.") and "attention" in op and "backward" in op):
        return 0
    val = node.meta.get("val")
    first = val[0] if isinstance(val, (tuple, list)) and val else val
    return 4 * cost.numel(first) if isinstance(first, torch.Tensor) else 0


def _cpu_flash_attention_scratch(node: fx.Node, backward: bool) -> int:
    """ATen's CPU flash attention (``native/cpu/FlashAttentionKernel.cpp``) splits queries into
    blocks of 32, 64 or 256 rows (sequences under 192, under 768, longer) and keys into blocks
    of 512, and gives each thread float32 buffers: the forward a score block, its row max and
    sum and an output block; the backward a score block and its gradient (plus a row sum), and
    bf16/fp16 copies of the score blocks for low-precision inputs; the backward also copies an
    output gradient that is not contiguous in its layout. Checked against the profiler on torch
    2.13 (tests/test_fusion_peak.py)."""
    ins = [a.meta.get("val") for a in node.args[:4] if isinstance(a, fx.Node)]
    query = ins[1] if backward and len(ins) > 1 else (ins[0] if ins else None)
    key = ins[2] if backward and len(ins) > 2 else (ins[1] if len(ins) > 1 else None)
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor) or query.dim() != 4:
        return 0
    q_len, head, kv_len = cost.shape(query)[2], cost.shape(query)[3], cost.shape(key)[2]
    q_split = min(256 if q_len >= 768 else 64 if q_len >= 192 else 32, q_len)
    kv_split = min(512, kv_len)
    low = query.dtype in (torch.bfloat16, torch.float16)
    accum = 8 if query.dtype == torch.float64 else 4
    if backward:
        per_thread = 2 * q_split * kv_split * accum + q_split * accum + (2 * q_split * kv_split * 2 if low else 0)
        grad_out = ins[0]
        copy = 0  # the kernel makes grad_out contiguous in (batch, sequence, head, dim) order
        if isinstance(grad_out, torch.Tensor) and not grad_out.transpose(1, 2).is_contiguous():
            copy = cost.nbytes(grad_out)
        return torch.get_num_threads() * per_thread + copy
    per_thread = (q_split * kv_split + 2 * q_split + q_split * head) * accum + (q_split * kv_split * 2 if low else 0)
    return torch.get_num_threads() * per_thread


def _runs_extern(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    t = node.target
    if t is operator.getitem and isinstance(node.args[0], fx.Node):
        t = node.args[0].target
    return isinstance(t, compat.OpOverload) and compat.inductor_runs_extern(t)


LOW_PRECISION = frozenset({torch.bfloat16, torch.float16})


def _own_ops(node: fx.Node) -> int:
    """Ops a pointwise node adds to an inlined Inductor expression: itself and its scalar
    constants; Inductor computes low-precision values in float32, so a bf16/fp16 result adds a
    cast down and back (2) and each low-precision operand a cast up (2, with its precision-emulation
    round trip). Calibrated on Inductor's ``inner_fn_opcount`` (2.13)."""
    if node.op != "call_function":
        return 0
    low = {a for a in _tensor_inputs(node) if a.meta["val"].dtype in LOW_PRECISION}
    val = node.meta.get("val")
    out_low = isinstance(val, torch.Tensor) and val.dtype in LOW_PRECISION
    if op_name(node) in CAST_OPS:
        return 3 if out_low else 1
    scalars = [a for a in node.args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    return 1 + len(scalars) + (2 if out_low else 0) + 2 * len(low)


def _schedule(graph: fx.Graph, backward: set[fx.Node], fwd_outs: list, bwd_outs: list,
              primals: set[fx.Node], rules: fusion.FusionRules | None = None
              ) -> tuple[Schedule, dict[fx.Node, int]]:
    nodes = [n for n in graph.nodes if n.op != "output"]
    ids = {n: i for i, n in enumerate(nodes)}
    kind: tuple[str, ...] = ()
    if rules is not None:
        kind = tuple(lowering_kind(n, _runs_extern(n)) for n in nodes)
    nbytes, root = [], []
    for n in nodes:
        r = view_root(n) if n.op == "call_function" else n
        r = r if r in ids else n
        root.append(ids[r])
        own = r is n and n not in primals and not isinstance(n.meta.get("val"), (tuple, list))
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
        kind=kind,
        ops=tuple(_own_ops(n) for n in nodes) if kind else (),
        dtype=tuple(cost.dtype_name(n.meta.get("val")) for n in nodes) if kind else (),
        workspace=tuple(_workspace(n) for n in nodes) if kind else (),
        block=tuple(block_of(n) if n.op == "call_function" else None for n in nodes) if kind else (),
        heavy=frozenset(i for i, n in enumerate(nodes) if _packet(op_name(n)).split(".")[-1] in HEAVY_OPS)
        if kind else frozenset(),
        fusion=rules,
    ), ids


_STOPS = ("is_matmul", "is_attention", "is_random", "is_mutating", "is_collective", "is_data_dependent")


def _reaches_reduction_pointwise(start: fx.Node, forward_nodes: set[fx.Node], flags: dict[fx.Node, dict]) -> bool:
    """True if a path of forward ops that the cut may recompute for free (no matmul, attention,
    random or data-dependent op) leads from ``start`` to another reduction: only then can
    recompute chain from one normalisation into the next layer without saving anything."""
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
            return True
        stack.extend(u for u in n.users if u in forward_nodes)
    return False


CAST_OPS = frozenset({"prims.convert_element_type.default", "aten._to_copy.default"})


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
        ins = _tensor_inputs(n)
        full = cost.numel(n.meta.get("val"))
        if not (any(a in stat for a in ins)
                and any(a not in stat and cost.numel(a.meta.get("val")) == full for a in ins)):
            continue
        if not any(u in forward_nodes and u.op == "call_function"
                   and not any(a in stat for a in _tensor_inputs(u)) for u in n.users):
            continue
        if not _reaches_reduction_pointwise(n, forward_nodes, flags):
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
