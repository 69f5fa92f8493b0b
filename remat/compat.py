"""The only home of private torch APIs. Each import names the torch versions it was checked on.

Checked on: torch 2.13.0 (CPU, this project's CI) and torch 2.11.0 (CUDA, the GPU machine).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
from functorch.compile import make_boxed_func  # noqa: F401  (public; 2.11, 2.13)

# torch 2.11, 2.13: AOTAutograd as a Dynamo backend, with our own partition function.
from torch._dynamo.backends.common import aot_autograd  # noqa: F401  (2.11, 2.13)
from torch._dynamo.backends.registry import register_backend as _register_backend  # 2.11, 2.13
from torch._functorch import config as functorch_config  # 2.11, 2.13
from torch._functorch import partitioners as _partitioners  # 2.11, 2.13
from torch._inductor import config as inductor_config  # 2.11, 2.13
from torch._inductor.decomposition import select_decomp_table  # noqa: F401  (2.11, 2.13)
from torch._ops import HigherOrderOperator, OpOverload  # noqa: F401  (op classes; 2.11, 2.13)
from torch.utils._pytree import tree_leaves  # noqa: F401  (2.11, 2.13)

__all__ = [
    "OpOverload",
    "HigherOrderOperator",
    "tree_leaves",
    "aot_autograd",
    "select_decomp_table",
    "make_boxed_func",
    "eager_decompositions",
    "extract_fwd_bwd",
    "default_partition",
    "compile_fx",
    "inductor_partitioner",
    "register_backend",
    "inductor_runs_extern",
]

# Note [Eager RNG order]
# Inductor's decomposition table rewrites random ops (dropout into ``rand_like < p``, bernoulli,
# randn_like...) into forms that draw from the generator differently from the eager kernels:
# with the same seed they give different masks. The uncompiled backend keeps these ops whole,
# so the partitioned forward runs the same random kernels as eager autograd, in program order,
# and with the same seed its losses and gradients equal eager's. Ops that are random only
# optionally (attention and RNN layers with dropout) keep their decompositions.
_OPTIONALLY_RANDOM = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                                "rnn_tanh", "rnn_relu", "lstm", "gru"})


def eager_decompositions() -> dict[Any, Callable[..., Any]]:
    """Inductor's decompositions (``select_decomp_table``: 2.11, 2.13) minus those of random
    ops. See Note [Eager RNG order]."""
    return {
        op: fn for op, fn in select_decomp_table().items()
        if not (isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags
                and op._schema.name.split("::")[-1] not in _OPTIONALLY_RANDOM)
    }


def run_uncompiled(gm: fx.GraphModule) -> Callable[[list[Any]], Any]:
    """A boxed callable that runs ``gm`` op by op and drops each input (a saved activation, say)
    after its last use: ``torch.fx.graph._BoxedCodeGen`` (2.11, 2.13) makes the generated code
    take the argument list and clear it."""
    from torch.fx.graph import _BoxedCodeGen

    gm.graph.set_codegen(_BoxedCodeGen())
    gm.recompile()
    forward = gm.forward

    def run(args: list[Any]) -> Any:
        return forward(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def extract_fwd_bwd(
    joint: fx.GraphModule,
    saved_values: list[fx.Node],
    saved_sym_nodes: list[fx.Node],
    num_fwd_outputs: int,
    static_lifetime_input_nodes: Any = None,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Split the joint graph: the forward returns its outputs plus ``saved_values``; the
    backward takes them and recomputes every other forward value it needs.
    ``_extract_fwd_bwd_modules``: 2.11, 2.13 (keyword arguments differ; filtered here)."""
    fn = _partitioners._extract_fwd_bwd_modules
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {"num_fwd_outputs": num_fwd_outputs}
    if "static_lifetime_input_nodes" in params:
        kwargs["static_lifetime_input_nodes"] = static_lifetime_input_nodes
    return fn(joint, saved_values, saved_sym_nodes=saved_sym_nodes, **kwargs)


def default_partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any):
    """Save what the forward computes and the backward reads (autograd's behaviour).
    ``default_partition``: 2.11, 2.13."""
    params = inspect.signature(_partitioners.default_partition).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    return _partitioners.default_partition(joint, joint_inputs, **kwargs)


# Note [Recompute precision]
# A fused Inductor kernel elides the round trip through bf16/fp16 between two low-precision ops
# (it keeps the fp32 value), but a value the forward saves is stored rounded. A backward that
# recomputes the chain in another fusion then sees other bits than the forward's, and remat's
# gradients would depend on which values it chose to recompute. ``emulate_precision_casts``
# (2.11, 2.13) keeps every cast that eager autocast performs, so a recomputed value equals the
# forward's bit for bit (tests/test_training_conditions.py checks it against a plan that
# recomputes nothing). Its cost is a few conversion instructions in bandwidth-bound kernels.


def compile_fx(gm: fx.GraphModule, example_inputs: Any) -> Any:
    """Inductor's entry point. ``torch._inductor.compile_fx.compile_fx`` and its
    ``inner_compile`` argument (``compile_fx_inner``): 2.11, 2.13. Its ``config_patches`` and
    ``inner_compile`` also apply to the backward, which AOTAutograd compiles later, at the first
    backward call. Low-precision casts are kept: see Note [Recompute precision]. Each graph is
    compiled with stage-local fusion (``stage_local_fusion``) and without Inductor's FX graph
    cache, whose key sees neither node meta nor the fusion choices."""
    from torch._inductor.compile_fx import compile_fx as _compile_fx
    from torch._inductor.compile_fx import compile_fx_inner

    def inner(*args: Any, **kwargs: Any) -> Any:
        with stage_local_fusion():
            return compile_fx_inner(*args, **kwargs)

    patches: dict[str, Any] = {"fx_graph_cache": False}
    if hasattr(inductor_config, "emulate_precision_casts"):
        patches["emulate_precision_casts"] = True
    return _compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches)


def no_autograd_cache() -> Any:
    """Turn off the AOTAutograd cache (its key ignores the partitioner). 2.11, 2.13."""
    return functorch_config.patch(enable_autograd_cache=False)


@contextlib.contextmanager
def inductor_partitioner(partition_fn: Callable[..., Any]) -> Iterator[None]:
    """Make Inductor partition joint graphs with ``partition_fn`` inside this context.

    torch 2.13 has ``torch._inductor.config.custom_partitioner_fn``; torch 2.11 does not. Both
    versions' ``compile_fx`` call the module-level name ``min_cut_rematerialization_partition``
    when no custom partitioner is set, so that name is rebound here: one code path for both
    versions. (``custom_partitioner_fn`` would also enter Inductor's cache key, which cannot
    pickle a closure.) The AOTAutograd cache is turned off inside the context: its key does not include
    the partitioner, so it could return a graph partitioned by the default partitioner."""
    import torch._inductor.compile_fx as cfx

    stack = contextlib.ExitStack()
    with stack:
        stack.enter_context(no_autograd_cache())
        if hasattr(inductor_config, "fx_graph_remote_cache"):
            stack.enter_context(inductor_config.patch(fx_graph_remote_cache=False))
        original = cfx.min_cut_rematerialization_partition
        cfx.min_cut_rematerialization_partition = partition_fn
        try:
            yield
        finally:
            cfx.min_cut_rematerialization_partition = original


STAGE_KEY = "remat_stage"
"""fx node meta key: the block (``layers.3``) a forward or backward op belongs to; see
``stage_local_fusion``."""


def _stages(node: Any, cache: dict[int, tuple[Any, frozenset]]) -> frozenset:
    hit = cache.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    out = set()
    for sub in node.get_nodes():
        ir = getattr(sub, "node", None)
        if ir is None:
            continue
        # The fx node whose lowering made this buffer: an inlined expression's origins span
        # every op folded into it, often several blocks. ``ir.Buffer.origin_node``: 2.11, 2.13.
        owner = getattr(ir, "origin_node", None)
        for origin in ([owner] if owner is not None else ir.get_origins()):
            stage = origin.meta.get(STAGE_KEY)
            if stage is not None:
                out.add(stage)
    result = frozenset(out)
    cache[id(node)] = (node, result)
    return result


@contextlib.contextmanager
def stage_local_fusion() -> Iterator[None]:
    """Inside this context Inductor fuses two kernels only if their ops share a block (fx
    ``meta[STAGE_KEY]``) or one of them has none. See Note [Stage-local fusion] in
    ``remat/partition.py``. Uses ``torch._inductor.virtualized.V.set_choices_handler`` and
    ``InductorChoices.can_fuse(scheduler, node1, node2, shared_data_score)``, a documented
    extension point for fusion heuristics: checked on 2.11, 2.13. The current handler (the
    user's, if they set one) keeps deciding every other fusion."""
    from torch._inductor.virtualized import V

    if not hasattr(V, "set_choices_handler"):  # pragma: no cover - older torch
        yield
        return
    inner = V.choices
    cache: dict[int, tuple[Any, frozenset]] = {}
    base_can_fuse = inner.can_fuse

    class StageLocal(type(inner)):  # type: ignore[misc]
        def can_fuse(self, scheduler: Any, node1: Any, node2: Any, shared_data_score: int) -> bool:
            a, b = _stages(node1, cache), _stages(node2, cache)
            if a and b and a.isdisjoint(b):
                return False
            return base_can_fuse(scheduler, node1, node2, shared_data_score)

    handler = StageLocal.__new__(StageLocal)
    handler.__dict__.update(getattr(inner, "__dict__", {}))
    with V.set_choices_handler(handler), _cpp_flush_between_stages(cache):
        yield


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
    and ``Scheduler.nodes`` / ``current_node``: present on 2.11 and 2.13 (the patch installs on
    both); its effect was measured on 2.13's CPU backend (tests/test_stage_fusion.py)."""
    try:
        from torch._inductor.codegen.cpp import CppScheduling
        from torch._inductor.virtualized import V
    except ImportError:  # pragma: no cover - a build without the C++ backend
        yield
        return
    original = CppScheduling.codegen_node

    positions: dict[int, tuple[Any, dict[int, int]]] = {}

    def codegen_node(self: Any, node: Any) -> Any:
        result = original(self, node)
        sched = V.graph.scheduler
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


def inductor_runs_extern(op: OpOverload) -> bool:
    """Whether Inductor runs ``op`` as an extern kernel (a library call or an eager fallback that
    writes a new buffer and reads realized inputs) rather than generating code for it: ops in
    ``torch._inductor.lowering.needs_realized_inputs`` or ``fallbacks``, or with no lowering at
    all (implicit fallback). Checked on 2.11 and 2.13 (read defensively)."""
    from torch._inductor import lowering

    if op in getattr(lowering, "needs_realized_inputs", ()) or op in getattr(lowering, "fallbacks", ()):
        return True
    table = getattr(lowering, "lowerings", None)
    return table is not None and op not in table and op.overloadpacket not in table


def register_backend(name: str, fn: Callable[..., Any]) -> None:
    """``torch._dynamo.backends.registry.register_backend``: 2.11, 2.13."""
    from torch._dynamo.backends.registry import _BACKENDS

    if name not in _BACKENDS:
        _register_backend(compiler_fn=fn, name=name)


def size_hint(x: torch.SymInt) -> int:
    """A concrete value for a symbolic size, for cost estimates only (adds no guard): the example
    input's size for backed sizes; for unbacked ones (rows of ``nonzero``), the shape
    environment's optimization hint (2.13) or Inductor's ``unbacked_symint_fallback`` (2.11, 2.13)."""
    node = x.node
    h = getattr(node, "hint", None)
    if h is not None:
        return int(h)
    fallback = int(getattr(inductor_config, "unbacked_symint_fallback", 8192))
    env = node.shape_env
    if hasattr(env, "optimization_hint"):  # 2.13
        return int(env.optimization_hint(node.expr, fallback=fallback))
    h = env.size_hint(node.expr, allow_none=True)  # 2.11
    return int(h) if h is not None else fallback


def graph_break(gm: fx.GraphModule) -> str | None:
    """``"file.py:12 (why)"`` if Dynamo ended this graph at a graph break, else None. Dynamo sets
    ``compile_subgraph_reason`` (a ``GraphCompileReason``) on the graph module it hands to the
    backend (2.13; read defensively)."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is None or not getattr(reason, "graph_break", False):
        return None
    why = (str(getattr(reason, "reason", "")).strip().splitlines() or ["unknown reason"])[0]
    stack = getattr(reason, "user_stack", None) or []
    where = f"{stack[-1].filename.rsplit('/', 1)[-1]}:{stack[-1].lineno}" if stack else "unknown location"
    return f"{where} ({why[:120]})"




def is_sym(val: object) -> bool:
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))


def ordered_set(items: Any) -> Any:
    """``torch.utils._ordered_set.OrderedSet``: 2.11, 2.13."""
    from torch.utils._ordered_set import OrderedSet

    return OrderedSet(items)


def measure_cpu_peak_bytes(step: Any) -> int:
    """Peak bytes of tensor storages allocated and still alive at any moment while ``step()``
    runs on CPU, from the profiler's allocation timeline (every create and destroy, timestamped).
    Storages that existed before are not counted. ``torch.profiler``'s ``_memory_profile()``:
    checked on 2.13 (a measurement aid for tests and benchmarks, not used when training)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        step()
    live = peak = 0
    for _, action, _, size in sorted(prof._memory_profile().timeline, key=lambda e: e[0]):
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak
