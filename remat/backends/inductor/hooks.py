"""Inductor hooks: how remat hands its partition to Inductor and steers Inductor's fusion.

Every patch here cites its entry of the version table (``remat.versions.HOOKS``); one that cannot
install warns, or raises where running on would ignore remat's plan (Note [Version drift]),
instead of silently doing nothing.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch.fx as fx
from torch._inductor import config as inductor_config  # versions.HOOKS["inductor_caches_off"]

from ... import compat
from ...analysis.halves import is_unsent
from ...analysis.provenance import block_of
from ...versions import drift
from ..base import WrapBackward
from .facts import Kind
from .lowering import fusion_blocks, node_lowering
from .wrapper_reading import read_allocations

__all__ = ["channels_last_nodes", "recomputed_in_forward_layout", "compile_fx", "in_remat_order", "graph_io_names",
           "estimate_sizes_buffers",
           "inductor_partitioner", "stage_local_fusion", "STAGE_KEY", "tag_stages", "OFFLOAD_OPS"]

# Note [Recompute precision]
# A fused Inductor kernel elides the round trip through bf16/fp16 between two low-precision ops
# (it keeps the fp32 value), but a value the forward saves is stored rounded. A backward that
# recomputes the chain in another fusion then sees other bits than the forward's, and remat's
# gradients would depend on which values it chose to recompute. ``emulate_precision_casts``
# (versions.HOOKS["recompute_precision"]) keeps every cast that eager autocast performs, so a
# recomputed value equals the forward's bit for bit (tests/correctness/test_training_conditions.py checks it
# against a plan that recomputes nothing). Its cost is a few conversion instructions in
# bandwidth-bound kernels.


OFFLOAD_OPS = "remat"
"""The ``torch.library`` namespace of the offload copies (``remat.capture.offload_pass``)."""


def _is_copy(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "namespace", None) == OFFLOAD_OPS


def _saved_name(node: fx.Node) -> str:
    """The name of the saved value an output stands for: an offloaded value's host copy
    (``to_host``, ``ready``) is returned in its place and read by the backward under its name
    (Note [Offload copies])."""
    while _is_copy(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node.name


def graph_io_names(gm: fx.GraphModule) -> tuple[list[str | None], list[str], set[str]]:
    """(the name of each output, the name of each placeholder, the placeholders holding a 0-dim
    tensor) of an fx graph, as the partition made it (before Inductor's passes rename
    anything); an offloaded value's host copy is named after the value. A gradient never sent
    (Note [Gradients the caller does not send]) is left out: it is a meta tensor, no memory."""
    out = gm.graph.find_nodes(op="output")[0].args[0]
    outs = [_saved_name(a) if isinstance(a, fx.Node) else None
            for a in (out if isinstance(out, (tuple, list)) else [out])]
    holders = [n for n in gm.graph.find_nodes(op="placeholder") if not is_unsent(n)]
    scalars = {n.name for n in holders if getattr(n.meta.get("val"), "ndim", None) == 0}
    return outs, [n.name for n in holders], scalars


GraphNames = tuple[list[str | None], list[str], set[str]]
"""``graph_io_names``: output names, placeholder names, 0-dim placeholders."""


def compile_fx(gm: fx.GraphModule, example_inputs: Any,
               on_graph: Callable[[bool, GraphNames, Any], None] | None = None, *, stock: bool = False,
               wrap_backward: WrapBackward | None = None) -> Any:
    """Inductor's entry point. ``torch._inductor.compile_fx.compile_fx`` and its
    ``inner_compile`` argument (``compile_fx_inner``; ``versions.HOOKS["compile_fx"]``). Its
    ``config_patches`` and ``inner_compile`` also apply to the backward, which AOTAutograd
    compiles later, at the first backward call. Low-precision casts are kept: see Note
    [Recompute precision]. Each graph is compiled with stage-local fusion
    (``stage_local_fusion``) and without Inductor's FX graph cache, whose key sees neither node
    meta nor the fusion choices (``versions.HOOKS["inductor_caches_off"]``). ``on_graph(is_backward,
    (output names, input names, 0-dim inputs), trace)`` receives each training graph's memory plan
    (``wrapper_reading.read_allocations``); ``is_backward`` and ``is_inference`` are
    ``compile_fx_inner``'s keyword arguments. Inductor keeps remat's order (``in_remat_order``).
    ``stock=True`` compiles as torch.compile would, with Inductor's own precision and order
    (torch.compile's partition measured as a candidate, ``remat.tuning``: no remat recompute for
    its casts to matter, no remat order to keep). ``wrap_backward(graph, compile)``: what the
    backward's compile returns (``remat.backends.base.Backend.compile``)."""
    from torch._inductor.compile_fx import compile_fx as _compile_fx
    from torch._inductor.compile_fx import compile_fx_inner

    def inner(graph: fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        if wrap_backward is not None and kwargs.get("is_backward"):
            return wrap_backward(graph, lambda: _inner(graph, *args, **kwargs))
        return _inner(graph, *args, **kwargs)

    def _inner(graph: fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        if on_graph is None or kwargs.get("is_inference"):
            with stage_local_fusion(), in_remat_order(not stock):
                return compile_fx_inner(graph, *args, **kwargs)
        names, traces = graph_io_names(graph), []
        with stage_local_fusion(), in_remat_order(not stock), read_allocations(traces.append):
            result = compile_fx_inner(graph, *args, **kwargs)
        if traces:
            on_graph(bool(kwargs.get("is_backward", False)), names, traces[-1])
        return result

    patches: dict[str, Any] = {"fx_graph_cache": False}
    if not stock and hasattr(inductor_config, "emulate_precision_casts"):
        patches["emulate_precision_casts"] = True
    elif not stock:
        drift("recompute_precision", "torch._inductor.config.emulate_precision_casts")
    return _compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches)


def channels_last_nodes(gm: fx.GraphModule) -> frozenset[str]:
    """The names of the nodes of training graph ``gm`` that Inductor lays out channels-last where
    they are dense and 4-D: none unless it optimizes the graph's layout
    (``GraphLowering.decide_layout_opt``), else those ``GraphLowering.find_nodes_prefer_channels_last``
    finds (convolutions, what feeds them, and what follows them up to the last one), asked of
    Inductor itself on ``gm`` as it will lower it (``versions.HOOKS["channels_last_outputs"]``).
    Empty, with a warning, where the two cannot be used."""
    from torch._inductor.graph import GraphLowering

    decide = getattr(GraphLowering, "decide_layout_opt", None)
    find = getattr(GraphLowering, "find_nodes_prefer_channels_last", None)
    if decide is None or find is None:
        drift("channels_last_outputs")
        return frozenset()
    try:
        if not decide(gm, is_inference=False):
            return frozenset()
        return frozenset(n.name for n in find(_Lowering(gm)))
    except Exception as e:  # noqa: BLE001 - a changed signature or attribute: the copies keep traced strides
        drift("channels_last_outputs", f"{type(e).__name__}: {e}")
        return frozenset()


def recomputed_in_forward_layout(backward: fx.GraphModule) -> int:
    """Store channels-last, once, each dense 4-D value ``backward`` computes that Inductor would
    otherwise pin to its traced strides and then copy for the readers that want it channels-last:
    a pointwise value Inductor lays out channels-last (``channels_last_nodes``) with several
    readers, one of them a ``convolution_backward`` or a matmul. Its readers read a channels-last
    clone instead, into which Inductor computes the value (a stored value, a convolution's output
    say, is left alone: its clone would be a copy). Returns how many values changed.

    Note [Recomputed values in the forward's layout]: under its layout optimization Inductor
    computes a convolutional network's forward channels-last, and AOTAutograd hands the backward
    the saved values in those strides. A value remat recomputes is traced in eager's contiguous
    strides instead, and Inductor stores a value of several readers, one of which is a
    ``convolution_backward`` or a matmul, in its traced strides (it pins the layout to the fx
    strides, which it propagates again from the graph's inputs before lowering, so only an op in
    the graph can change them); the recomputed convolution that reads it and the
    ``convolution_backward`` then each want it channels-last and each get a copy of their own.
    In ResNet-50's backward (fake H100, ``budget=0.5``) each recomputed BatchNorm-ReLU output
    read by the next convolution and by its weight gradient was stored three times, one kept to
    the ReLU's gradient far later: Inductor's memory plan read 2,830 MiB against 2,521 simulated
    (the step model stores each value once), and 2,463 with the clones. The clone holds the value
    in the layout its readers want, and only the layout changes (``versions.HOOKS["recomputed_layout"]``).
    On an H100 the plan tuning chose there (a segments plan) measured the same with and without the
    clones (2,192 MiB; 36.5 and 36.7 ms a step, ``benchmarks/layout_ab.py``)."""
    import torch

    names = channels_last_nodes(backward)
    if not names:
        return 0
    aten = torch.ops.aten
    pinning = {aten.convolution_backward.default, aten.mm.default, aten._int_mm.default}
    outputs = set(backward.graph.find_nodes(op="output")[0].all_input_nodes)
    changed = 0
    for n in list(backward.graph.nodes):
        v = n.meta.get("val")
        users = list(n.users)
        if (n.op != "call_function" or n.name not in names or n in outputs or not isinstance(v, torch.Tensor)
                or v.dim() != 4 or v._is_view() or not v.is_contiguous()
                or v.is_contiguous(memory_format=torch.channels_last)
                or len(users) < 2 or not any(u.target in pinning for u in users)
                or node_lowering(n, None).kind is not Kind.POINTWISE):  # computed into the clone, no copy
            continue
        with backward.graph.inserting_after(n):
            c = backward.graph.call_function(aten.clone.default, (n,), {"memory_format": torch.channels_last})
        c.meta.update({k: n.meta[k] for k in (STAGE_KEY, "stack_trace", "seq_nr") if k in n.meta})
        c.meta["val"] = v.clone(memory_format=torch.channels_last)
        n.replace_all_uses_with(c, delete_user_cb=lambda u, c=c: u is not c)
        changed += 1
    if changed:
        backward.recompile()
    return changed


class _Lowering:
    """What ``GraphLowering.find_nodes_prefer_channels_last`` reads of the lowering: its module."""

    def __init__(self, module: fx.GraphModule) -> None:
        self.module = module


@contextlib.contextmanager
def in_remat_order(ordered: bool = True) -> Iterator[None]:
    """Inside this context (``ordered``) Inductor keeps the order of the graph it lowers: its
    peak-memory reordering (``config.reorder_for_peak_memory``) is off (``versions.HOOKS["remat_order"]``).

    Note [remat's order kept]: remat orders the backward it hands Inductor for the peak its step
    model predicts (each block's recompute and gradients just before they are needed, offload
    copies where the offload pass puts them). Inductor's reordering then picks among topological
    orders (greedy least-peak-first, BFS, DFS, the given one) by its own estimate of the peak, and
    where that estimate is off it moves work away from remat's places: it issued every offload
    copy back at the backward's start (the MLP of tests/capture/test_offload_inductor.py, all four
    at once), and it converted twelve T5 layers' saved query/key/value projections to float32 at
    the start of the backward, long before each layer's attention backward reads them (T5 at
    ``budget=0.5``, Inductor's CUDA lowering without a GPU, ``benchmarks/gpu_offline.py``, on the
    versions ``versions.HOOKS["remat_order"]`` names: read 7,117 MiB with the reordering, 6,482
    without, 6,019 simulated). On GPT-2, Llama, ViT-B/16, BERT and ResNet-50 (default plan and ``budget=0.5``)
    the reads with and without it were the same to 3.4 MiB. torch.compile's own partition,
    measured as a candidate (``remat.tuning``), compiles with ``ordered=False``: as
    torch.compile would."""
    if not ordered:
        yield
        return
    if not hasattr(inductor_config, "reorder_for_peak_memory"):
        drift("remat_order", "torch._inductor.config.reorder_for_peak_memory")
        yield
        return
    with inductor_config.patch(reorder_for_peak_memory=False):
        yield


def estimate_sizes_buffers() -> bool:
    """Whether Inductor's peak estimate, which decides buffer reuse, counts a graph's own buffers
    when remat's order is kept (Note [Reuse estimate]). With the peak-memory reordering off, only
    these passes size them (``memory.assign_memory_planning_info_for_scheduler_buffers``), each
    under its setting, read here (``versions.HOOKS["buffer_reuse_estimate"]``): combo kernels,
    the compute-communication reordering, and, where torch has it, the simple overlap of
    collectives (on by default)."""
    overlap = getattr(inductor_config, "aten_distributed_optimizations", None)
    return bool(getattr(inductor_config, "combo_kernels", False)
                or (getattr(inductor_config, "reorder_for_compute_comm_overlap", False)
                    and not getattr(inductor_config, "deterministic", False))
                or getattr(overlap, "enable_simple_overlap", False))


@contextlib.contextmanager
def inductor_partitioner(partition_fn: Callable[..., Any]) -> Iterator[None]:
    """Make Inductor partition joint graphs with ``partition_fn`` inside this context.

    ``compile_fx`` calls the module-level name ``min_cut_rematerialization_partition`` when no
    custom partitioner is set, so that name is rebound here: one code path for every checked
    version (``versions.HOOKS["inductor_partitioner"]``; not every one has
    ``custom_partitioner_fn``). The AOTAutograd cache is turned off inside the context: its key
    does not include the partitioner, so it could return a graph partitioned by the default
    partitioner."""
    import torch._inductor.compile_fx as cfx

    stack = contextlib.ExitStack()
    with stack:
        stack.enter_context(compat.no_autograd_cache())
        if hasattr(inductor_config, "fx_graph_remote_cache"):
            stack.enter_context(inductor_config.patch(fx_graph_remote_cache=False))
        if not hasattr(cfx, "min_cut_rematerialization_partition"):
            # Without the name, Inductor would partition with its own partitioner and remat's
            # plan would be silently ignored: the entry raises.
            drift("inductor_partitioner", "torch._inductor.compile_fx.min_cut_rematerialization_partition")
        original = cfx.min_cut_rematerialization_partition
        cfx.min_cut_rematerialization_partition = partition_fn
        try:
            yield
        finally:
            cfx.min_cut_rematerialization_partition = original


BLOCK_KEY = "remat_block"
"""fx node meta key: the block every op belongs to (``graph.block_of``), tagged or not for
stage-local fusion; ``stage_local_fusion`` keeps fusions from moving a kernel across another
block's kernels (Note [Fusions that jump blocks])."""

STAGE_KEY = "remat_stage"
"""fx node meta key: the block (``layers.3``) a forward or backward op belongs to; see
``stage_local_fusion``."""


def _stages(node: Any, cache: dict[int, tuple[Any, frozenset]]) -> frozenset:
    hit = cache.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    result = frozenset().union(*(_tags(sub, STAGE_KEY) for sub in node.get_nodes()))
    cache[id(node)] = (node, result)
    return result


def _tags(sub: Any, key: str) -> set:
    """The values of fx meta ``key`` one unfused scheduler node carries. The fx node whose
    lowering made its buffer: an inlined expression's origins span every op folded into it, often
    several blocks (``ir.Buffer.origin_node``). Where that node has no value, those of the ops
    folded into it: a softmax whose input adds a bias several blocks share carries its block
    through the add (Note [Values several blocks read] in ``lowering.py``)."""
    ir = getattr(sub, "node", None)
    if ir is None:
        return set()
    if not hasattr(ir, "origin_node"):
        drift("stage_local_fusion", f"{type(ir).__name__}.origin_node")
    owner = getattr(ir, "origin_node", None)
    if owner is not None and owner.meta.get(key) is not None:
        return {owner.meta[key]}
    return {origin.meta[key] for origin in ir.get_origins() if origin.meta.get(key) is not None}


@contextlib.contextmanager
def stage_local_fusion() -> Iterator[None]:
    """Inside this context Inductor fuses two kernels only if their ops together belong to one
    block at most (fx ``meta[STAGE_KEY]``). See Note [Stage-local fusion]
    below. Uses ``torch._inductor.virtualized.V.set_choices_handler`` and
    ``InductorChoices.can_fuse(scheduler, node1, node2, shared_data_score)``, a documented
    extension point for fusion heuristics (``versions.HOOKS["stage_local_fusion"]``). The current
    handler (the user's, if they set one) keeps deciding every other fusion."""
    from torch._inductor.virtualized import V

    if not hasattr(V, "set_choices_handler"):  # pragma: no cover - older or newer torch
        drift("stage_local_fusion", "torch._inductor.virtualized.V.set_choices_handler")
        yield
        return
    inner = V.choices
    cache: dict[int, tuple[Any, frozenset]] = {}
    orders: dict[int, tuple[Any, _BlockOrders]] = {}
    base_can_fuse = inner.can_fuse

    class StageLocal(type(inner)):  # type: ignore[misc]
        def can_fuse(self, scheduler: Any, node1: Any, node2: Any, shared_data_score: int) -> bool:
            # One block at most between them: a kernel whose ops already span two blocks (an
            # accumulation of several blocks' gradients, through the blocks of its ops) takes
            # no more work.
            if len(_stages(node1, cache) | _stages(node2, cache)) > 1:
                return False
            if _across_other_blocks(scheduler, node1, node2, orders):
                return False
            return base_can_fuse(scheduler, node1, node2, shared_data_score)

    handler = StageLocal.__new__(StageLocal)
    handler.__dict__.update(getattr(inner, "__dict__", {}))
    with V.set_choices_handler(handler), _cpp_flush_between_stages(cache):
        yield


def _block(sub: Any) -> str | None:
    """The block of one unfused scheduler node (``_tags``), None where its ops span several."""
    found = _tags(sub, BLOCK_KEY)
    return next(iter(found)) if len(found) == 1 else None


class _BlockOrders:
    """Where each block's kernels lie in a scheduler's order before fusion (``min_order`` of each
    unfused node): the sorted orders of all kernels of one block and, per block, of its own."""

    def __init__(self, scheduler: Any):
        self.of: dict[int, str | None] = {}
        self.any: list[int] = []
        self.only: dict[str, list[int]] = {}
        for node in getattr(scheduler, "nodes", None) or ():
            for sub in node.get_nodes():
                order, block = getattr(sub, "min_order", None), _block(sub)
                self.of[id(sub)] = block
                if order is None or block is None:
                    continue
                self.any.append(order)
                self.only.setdefault(block, []).append(order)
        self.any.sort()
        for orders in self.only.values():
            orders.sort()

    def blocks(self, node: Any) -> set[str]:
        found = set()
        for sub in node.get_nodes():
            block = self.of[id(sub)] if id(sub) in self.of else _block(sub)
            if block is not None:
                found.add(block)
        return found

    def others_between(self, mine: set[str], lo: int, hi: int) -> bool:
        """Whether a kernel of a block other than ``mine`` lies strictly between orders ``lo`` and ``hi``."""
        def count(orders: list[int]) -> int:
            return bisect.bisect_left(orders, hi) - bisect.bisect_right(orders, lo)

        return count(self.any) > sum(count(self.only.get(b, [])) for b in mine)


def _across_other_blocks(scheduler: Any, node1: Any, node2: Any, orders: dict[int, tuple[Any, _BlockOrders]]) -> bool:
    """Whether fusing ``node1`` and ``node2`` would move a kernel across another block's kernels
    (Note [Fusions that jump blocks])."""
    if not all(hasattr(n, "min_order") and hasattr(n, "max_order") for n in (node1, node2)):
        drift("stage_local_fusion", "BaseSchedulerNode.min_order / max_order")
        return False
    lo, hi = min(node1.min_order, node2.min_order), max(node1.max_order, node2.max_order)
    if hi - lo <= 1:
        return False
    hit = orders.get(id(scheduler))
    if hit is None or hit[0] is not scheduler:
        hit = orders[id(scheduler)] = (scheduler, _BlockOrders(scheduler))
    table = hit[1]
    return table.others_between(table.blocks(node1) | table.blocks(node2), lo, hi)


# Note [Fusions that jump blocks]
# Inductor places a fused kernel where its earliest part was (the scheduler sorts fused nodes by
# ``min_order``) and moves everything its later part reads up before it. Two fusions of T5 at
# ``budget=0.5`` did so (Inductor's CUDA lowering on the oldest verified torch, without a GPU:
# ``benchmarks/gpu_offline.py --models t5 --budgets 0.5 --diff``): the position bias, one
# block's value every block reads, recomputed at the start of the backward where the last block
# first reads it, fused with the first block's recomputed softmax, so that block's recomputed
# queries, keys, scores and softmax were computed at the start of the backward and held to its
# end; and the sum of every block's part of the bias's gradient fused with one block's batch
# reduction, so the later blocks' attention gradients were pulled up before that block's
# weight gradients, whose inputs stayed alive across four blocks. Blocks run in remat's order
# only if no fusion moves a kernel across another block's kernels: ``stage_local_fusion`` refuses
# a fusion whose parts span, in the scheduler's order before fusion, a kernel of a block none of
# them belongs to (every op's block is tagged, ``BLOCK_KEY``; ``versions.HOOKS["stage_local_fusion"]``).


@contextlib.contextmanager
def _cpp_flush_between_stages(cache: dict[int, tuple[Any, frozenset]]) -> Iterator[None]:
    """The C++ backend emits every kernel between two extern kernels as one function, and the
    wrapper allocates all their buffers before calling it (``CppScheduling.codegen_node`` adds
    to ``kernel_group``; ``Scheduler.flush`` emits it and frees what it no longer needs): a
    pointwise model with no matmul runs its whole backward as one call holding every layer's
    buffers. Asking for a flush after a kernel whose successor belongs to another block emits
    one function per block, so a block's buffers are freed before the next block runs. Patches
    ``torch._inductor.codegen.cpp.CppScheduling.codegen_node`` for the duration and uses its
    ``_set_flush_status`` (which the scheduler's ``ready_to_flush`` check reads after each node)
    and ``Scheduler.nodes`` / ``current_node`` (``versions.HOOKS["cpp_flush_between_stages"]``)."""
    try:
        from torch._inductor.codegen.cpp import CppScheduling
        from torch._inductor.virtualized import V
    except ImportError:  # pragma: no cover - a build without the C++ backend
        drift("cpp_flush_between_stages", "torch._inductor.codegen.cpp.CppScheduling")
        yield
        return
    if not hasattr(CppScheduling, "_set_flush_status"):  # pragma: no cover
        drift("cpp_flush_between_stages", "CppScheduling._set_flush_status")
        yield
        return
    original = CppScheduling.codegen_node

    positions: dict[int, tuple[Any, dict[int, int]]] = {}

    def codegen_node(self: Any, node: Any) -> Any:
        result = original(self, node)
        sched = V.graph.scheduler
        if not (hasattr(sched, "nodes") and hasattr(sched, "current_node")):
            drift("cpp_flush_between_stages", "Scheduler.nodes / Scheduler.current_node")
        nodes = getattr(sched, "nodes", None) or []
        hit = positions.get(id(sched))
        if hit is None or hit[0] is not nodes or len(hit[1]) != len(nodes):
            hit = positions[id(sched)] = (nodes, {id(n): k for k, n in enumerate(nodes)})
        k = hit[1].get(id(getattr(sched, "current_node", None)))
        if k is not None and k + 1 < len(nodes):
            new, old = _stages(nodes[k + 1], cache), _stages(node, cache)
            if new and old and new.isdisjoint(old):
                self._set_flush_status(True)  # the scheduler flushes after this node
        return result

    CppScheduling.codegen_node = codegen_node
    try:
        yield
    finally:
        CppScheduling.codegen_node = original




def tag_stages(*modules: fx.GraphModule) -> None:
    """Mark every op with its block (``graph.block_of``) for Inductor's fusion.

    Note [Stage-local fusion]: remat predicts the peak of the backward it orders (each block's
    recompute and gradients just before they are needed; ``remat.core.peak``). Inductor may fuse
    kernels across the whole graph: when every op is row-local (the pointwise workload),
    it fused all eight layers' input-gradient chain into one kernel that writes every layer's
    per-row buffers at once for the column sums that follow, so all of them were alive
    together (measured: CPU 21.6 MiB for a plan predicted at 10.0; H200 6017 MiB for 3073).
    With the tags, ``stage_local_fusion`` lets Inductor fuse only kernels of the same
    block (or with ops outside any block), so blocks run in remat's order. Graphs whose every
    block runs an extern kernel are left untagged (Note [Blocks an extern kernel separates] in
    ``lowering.py``); every op still carries its block under ``BLOCK_KEY``, so that no fusion
    moves a kernel across another block's kernels (Note [Fusions that jump blocks])."""
    for gm in modules:
        nodes = list(gm.graph.nodes)
        for n, stage in zip(nodes, fusion_blocks(nodes)):
            if stage is not None:
                n.meta[STAGE_KEY] = stage
            block = block_of(n) if n.op == "call_function" else None
            if block is not None:
                n.meta[BLOCK_KEY] = block
