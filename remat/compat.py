"""The home of torch's private APIs other than Inductor's (those live in ``remat.backends.inductor``).
Each use cites its entry of the version table (``remat.versions.HOOKS``): the torch versions it
was checked on and what remat does when it drifts.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from functorch.compile import make_boxed_func  # noqa: F401  (public)
from torch._dynamo.backends.common import aot_autograd  # noqa: F401  (versions.HOOKS["aot_autograd"])
from torch._dynamo.backends.registry import register_backend as _register_backend  # HOOKS["register_backend"]
from torch._functorch import config as functorch_config  # HOOKS["autograd_cache_off"], ["backward_compiled_now"]
from torch._functorch import partitioners as _partitioners  # HOOKS["extract_fwd_bwd"], ["default_partition"]
from torch._ops import HigherOrderOperator, OpOverload  # noqa: F401  (HOOKS["op_classes"])
from torch.utils._pytree import tree_leaves  # noqa: F401  (HOOKS["pytree"])

from .versions import drift

__all__ = [
    "OpOverload",
    "HigherOrderOperator",
    "tree_leaves",
    "aot_autograd",
    "make_boxed_func",
    "extract_fwd_bwd",
    "default_partition",
    "stock_partition",
    "register_backend",
    "no_autograd_cache",
    "fake_value",
    "default_store",
    "dynamo_config_patch",
    "logging_in_graph",
    "LOG_METHODS",
    "backward_compiled_now",
    "size_hint",
    "graph_break",
    "is_sym",
    "copy_dynamo_sources",
    "ordered_set",
    "measure_cpu_peak_bytes",
    "active_ddp_module",
    "dynamo_splits_ddp",
    "can_split_ddp",
    "ddp_bucket_split",
    "dynamo_origins",
    "sdpa_takes_enable_gqa",
]

def run_uncompiled(gm: fx.GraphModule) -> Callable[[list[Any]], Any]:
    """A boxed callable that runs ``gm`` op by op and drops each input (a saved activation, say)
    after its last use: ``torch.fx.graph._BoxedCodeGen`` makes the generated code take the
    argument list and clear it (``versions.HOOKS["boxed_codegen"]``)."""
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
    ``_extract_fwd_bwd_modules`` (``versions.HOOKS["extract_fwd_bwd"]``: keyword arguments differ
    between versions; filtered here)."""
    fn = _partitioners._extract_fwd_bwd_modules
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {"num_fwd_outputs": num_fwd_outputs}
    if "static_lifetime_input_nodes" in params:
        kwargs["static_lifetime_input_nodes"] = static_lifetime_input_nodes
    return fn(joint, saved_values, saved_sym_nodes=saved_sym_nodes, **kwargs)


def default_partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any):
    """Save what the forward computes and the backward reads (autograd's behaviour).
    ``versions.HOOKS["default_partition"]``."""
    params = inspect.signature(_partitioners.default_partition).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    return _partitioners.default_partition(joint, joint_inputs, **kwargs)


def stock_partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any):
    """torch.compile's own partition of the joint graph, as Inductor calls it
    (``min_cut_rematerialization_partition(..., compiler="inductor")``): a candidate remat
    measures (``remat.tuning``). ``versions.HOOKS["stock_partition"]``."""
    fn = _partitioners.min_cut_rematerialization_partition
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    if "compiler" in params:
        kwargs["compiler"] = "inductor"
    return fn(joint, joint_inputs, **kwargs)


def static_input(t: Any) -> bool:
    """Whether Dynamo treats graph input ``t`` as static (a parameter, or a tensor
    ``torch._dynamo.mark_static_address`` marked, as Dynamo marks module buffers):
    ``versions.HOOKS["static_input_mark"]``."""
    import torch

    if isinstance(t, torch.nn.Parameter):
        return True
    if not hasattr(torch._dynamo, "mark_static_address"):
        drift("static_input_mark", "torch._dynamo.mark_static_address")
    return hasattr(t, "_dynamo_static_input_type")


def real_tensors() -> Any:
    """A context in which tensors are real although a fake mode is active (the partition function
    runs under AOTAutograd's): ``unset_fake_temporarily`` (``versions.HOOKS["real_tensors"]``)."""
    import contextlib

    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:
        drift("real_tensors", "torch._subclasses.fake_tensor.unset_fake_temporarily")
        return contextlib.nullcontext()
    return unset_fake_temporarily()


def rng_replay_ops() -> tuple[Any, Any] | None:
    """``(run_and_save_rng_state, run_with_rng_state)``: torch's operators that run an op and
    return the generator state it started from, and run an op from a given state, restoring the
    generator after (``versions.HOOKS["rng_replay"]``); None where this torch lacks them (drift
    warns, and random ops are saved, never recomputed)."""
    try:
        from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    except ImportError:
        drift("rng_replay", "torch._prims.rng_prims.run_and_save_rng_state, run_with_rng_state")
        return None
    return run_and_save_rng_state, run_with_rng_state


def can_replay_rng() -> bool:
    """Whether random ops can be recomputed by replaying their generator state (``rng_replay_ops``)."""
    return rng_replay_ops() is not None


def fake_value(target: Any, args: Any, kwargs: Any, like: Any) -> Any:
    """The value ``target(*args, **kwargs)`` has when ``args`` hold the fake tensors of a traced
    graph's ``meta["val"]``, computed in the fake mode ``like`` (one of them) belongs to (a tensor
    factory has no tensor argument to find it from): ``versions.HOOKS["fake_value"]``."""
    import contextlib

    mode = getattr(like, "fake_mode", None)
    if mode is None and type(like).__name__ == "FakeTensor":
        drift("fake_value", "FakeTensor.fake_mode")
    with mode if mode is not None else contextlib.nullcontext():
        return target(*args, **kwargs)


def compiled_function_node(outputs: Any) -> Any:
    """The autograd node of AOTAutograd's compiled function that produced ``outputs`` (one call's
    results): the ``grad_fn`` of a tensor among them named ``CompiledFunctionBackward``, or of the
    node one step behind a view of one (outputs AOTAutograd regenerates as views); None if none
    is (``versions.HOOKS["unsent_grads"]``)."""
    def named(fn: Any) -> bool:
        return fn is not None and type(fn).__name__.endswith("CompiledFunctionBackward")

    behind = []
    for t in tree_leaves(outputs):
        fn = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
        if named(fn):
            return fn
        if fn is not None:
            behind.extend(f for f, _ in fn.next_functions)
    found = next((f for f in behind if named(f)), None)
    if found is None and behind:
        drift("unsent_grads", "a CompiledFunctionBackward node behind the compiled forward's outputs")
    return found


def no_autograd_cache() -> Any:
    """Turn off the AOTAutograd cache (its key ignores the partitioner):
    ``versions.HOOKS["autograd_cache_off"]``."""
    return functorch_config.patch(enable_autograd_cache=False)


def default_store() -> Any:
    """The default process group's key-value store: ``distributed_c10d._get_default_store``
    (``versions.HOOKS["default_store"]``)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def backward_compiled_now() -> Any:
    """Make AOTAutograd compile the backward with the forward, not at the first backward call:
    ``torch._functorch.config.force_non_lazy_backward_lowering``, read by
    ``aot_module_simplified`` when it is called (``versions.HOOKS["backward_compiled_now"]``)."""
    import contextlib

    if not hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        drift("backward_compiled_now", "torch._functorch.config.force_non_lazy_backward_lowering")
        return contextlib.nullcontext()
    return functorch_config.patch(force_non_lazy_backward_lowering=True)


def dynamo_config_patch(**changes: Any) -> Any:
    """``torch._dynamo.config.patch`` (``versions.HOOKS["dynamo_config"]``)."""
    import torch._dynamo

    return torch._dynamo.config.patch(**changes)


LOG_METHODS = ("debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log")
"""The ``logging.Logger`` methods a compiled call skips, and those a library adds under these names
(``warning_once``, ``info_once``): Note [Logging does not split the graph]."""


def logging_in_graph() -> Any:
    """A context in which Dynamo traces through calls of ``logging.Logger``'s methods (``LOG_METHODS``,
    those present when it is entered) instead of breaking the graph at them; the calls are skipped
    (``versions.HOOKS["ignore_logging"]``).

    Note [Logging does not split the graph]: Dynamo breaks the graph at a logger's method, and HF
    GPT-2 (transformers 5.x) logs a ``warning_once`` in its loss: the loss became a graph of its
    own, whose input, the logits, the first graph's backward waited for whole, so no plan could
    slice the LM head and its loss together (Note [Row chunks] in ``remat.analysis.rows``) and the
    tensors crossing the break stayed alive. Logging computes nothing the step needs, so under a
    budget a wrapped model's calls run with these methods ignored: the graph stays whole, and a
    message logged inside the compiled region is not printed (as ``torch.export`` treats it).
    Without a budget the break stays: HF returns the logits beside the loss, and in one graph
    autograd hands the backward a zero gradient for them (the caller drops them), a logits-sized
    buffer the split graphs never hold. Under the Inductor model, HF GPT-2 at 2 x 1,024 tokens
    (bf16): the default plan at 1,244 MiB in one graph against 1,048 MiB in two; at ``budget=0.3``
    the one graph fits with its head in slices (579 MiB), the two graphs do not (the loss graph's
    smallest plan, 495 MiB, above its 444 MiB share)."""
    import contextlib
    import logging

    import torch._dynamo

    config = torch._dynamo.config
    if not hasattr(config, "ignore_logger_methods"):
        drift("ignore_logging", "torch._dynamo.config.ignore_logger_methods")
        return contextlib.nullcontext()
    methods = {_LogMethod(v) for k, v in vars(logging.Logger).items() if callable(v) and k.split("_")[0] in LOG_METHODS}
    return config.patch(ignore_logger_methods=set(config.ignore_logger_methods) | methods)


class _LogMethod(str):
    """A logger method as Dynamo's ignore set holds it: equal to the method (and hashed as it), so
    Dynamo's ``method in ignore_set`` finds it, and a string of its name, so the set sorts and dumps
    to JSON where a torch release logs Dynamo's settings after each compile without leaving this
    one out (a set of functions does not sort: every compile logged a ``TypeError``;
    ``versions.HOOKS["ignore_logging"]`` says which releases)."""

    fn: Any

    def __new__(cls, fn: Any) -> _LogMethod:
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
        obj = super().__new__(cls, f"{getattr(fn, '__module__', '')}.{name}")
        obj.fn = fn
        return obj

    def __hash__(self) -> int:
        return hash(self.fn)

    def __eq__(self, other: object) -> bool:
        return other is self.fn or (isinstance(other, _LogMethod) and other.fn is self.fn)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


def active_ddp_module() -> Any:
    """The ``DistributedDataParallel`` module whose forward is running, or None:
    ``DistributedDataParallel._get_active_ddp_module()``, what Dynamo itself asks before splitting
    a graph at gradient buckets (``versions.HOOKS["active_ddp_module"]``)."""
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel._get_active_ddp_module()


def dynamo_splits_ddp() -> bool:
    """Whether Dynamo's settings ask for graphs split at DDP's buckets: ``optimize_ddp`` left at
    its default (``torch._dynamo.utils.get_optimize_ddp_mode() == "ddp_optimizer"``; where that
    function is missing, ``torch._dynamo.config.optimize_ddp`` is True or "ddp_optimizer":
    ``versions.HOOKS["optimize_ddp_mode"]``)."""
    import torch._dynamo

    try:
        from torch._dynamo.utils import get_optimize_ddp_mode
    except ImportError:
        return torch._dynamo.config.optimize_ddp in (True, "ddp_optimizer")
    return get_optimize_ddp_mode() == "ddp_optimizer"


@functools.cache
def can_split_ddp() -> bool:
    """Whether this torch's DDPOptimizer is the one ``ddp_bucket_split`` was written against: it
    takes ``bucket_bytes_cap`` and ``backend_compile_fn`` and splits through
    ``fx.passes.split_module.split_module`` (``versions.HOOKS["ddp_bucket_split"]``). Where not, remat
    leaves the split to Dynamo, and warns."""
    try:
        from torch._dynamo.backends.distributed import DDPOptimizer

        params = inspect.signature(DDPOptimizer.__init__).parameters
        source = inspect.getsource(DDPOptimizer.compile_fn)
        ok = {"bucket_bytes_cap", "backend_compile_fn"} <= params.keys() and "split_module.split_module(" in source
    except (ImportError, AttributeError, OSError, TypeError):
        ok = False
    if not ok:
        drift("ddp_bucket_split", "DDPOptimizer(bucket_bytes_cap, backend_compile_fn) splitting through "
              "torch.fx.passes.split_module.split_module")
    return ok


def ddp_bucket_split(gm: fx.GraphModule, example_inputs: list[Any], bucket_bytes_cap: int,
                     compile_piece: Callable[..., Any],
                     regroup: Callable[[fx.GraphModule, dict[fx.Node, int]], dict[fx.Node, int]]) -> Any:
    """Dynamo's own split of ``gm`` at DDP's gradient buckets (``DDPOptimizer``, Note [DDPOptimizer]
    in ``torch/_dynamo/backends/distributed.py``), each piece compiled by ``compile_piece``, with
    one change: ``regroup(gm, piece_of_node)`` may move nodes to other pieces before the graph is
    split. DDPOptimizer computes the bucket of each node, then calls
    ``torch.fx.passes.split_module.split_module(gm, None, callback)``: for the length of the call
    that function is replaced by one that applies ``regroup`` to the callback's answers
    (``versions.HOOKS["ddp_bucket_split"]``)."""
    import torch.fx.passes.split_module as split_module_pass
    from torch._dynamo.backends.distributed import DDPOptimizer

    original = split_module_pass.split_module

    def split(m: fx.GraphModule, root_m: Any, callback: Callable[[fx.Node], int], *args: Any, **kwargs: Any) -> Any:
        pieces = {n: callback(n) for n in m.graph.nodes if n.op not in ("placeholder", "output")}
        moved = regroup(m, pieces)
        return original(m, root_m, lambda n: moved[n] if n in moved else callback(n), *args, **kwargs)

    split_module_pass.split_module = split
    try:
        return DDPOptimizer(bucket_bytes_cap=bucket_bytes_cap, backend_compile_fn=compile_piece).compile_fn(
            gm, example_inputs)
    finally:
        split_module_pass.split_module = original


def dynamo_origins(node: fx.Node) -> tuple[str, ...]:
    """Names of the nodes of the graph AOTAutograd traced (Dynamo's graph) that a joint-graph node
    was traced from: ``node.meta["from_node"]``, a list of ``torch.fx.traceback.NodeSource``
    followed back through their own ``from_node`` (``versions.HOOKS["from_node"]``); empty for
    backward nodes."""
    names: list[str] = []
    todo = list(node.meta.get("from_node") or ())
    while todo:
        src = todo.pop()
        name = getattr(src, "name", None)
        if name is not None:
            names.append(name)
        todo.extend(getattr(src, "from_node", None) or ())
    return tuple(names)


def register_backend(name: str, fn: Callable[..., Any]) -> None:
    """``torch._dynamo.backends.registry.register_backend`` (``versions.HOOKS["register_backend"]``)."""
    from torch._dynamo.backends.registry import _BACKENDS

    if name not in _BACKENDS:
        _register_backend(compiler_fn=fn, name=name)


UNBACKED_HINT = 8192
"""The size assumed for a data-dependent (unbacked) size without a hint: the default of
Inductor's ``unbacked_symint_fallback`` (``versions.HOOKS["unbacked_hint"]``)."""


def size_hint(x: torch.SymInt) -> int:
    """A concrete value for a symbolic size, for cost estimates only (adds no guard): the example
    input's size for backed sizes; for unbacked ones (rows of ``nonzero``), the shape
    environment's optimization hint or ``UNBACKED_HINT`` (``versions.HOOKS["size_hint"]``)."""
    node = x.node
    h = getattr(node, "hint", None)
    if h is not None:
        return int(h)
    fallback = UNBACKED_HINT
    env = node.shape_env
    if hasattr(env, "optimization_hint"):
        return int(env.optimization_hint(node.expr, fallback=fallback))
    h = env.size_hint(node.expr, allow_none=True)  # the older torch's API
    return int(h) if h is not None else fallback


def graph_break(gm: fx.GraphModule) -> str | None:
    """``"file.py:12 (why)"`` if Dynamo ended this graph at a graph break, else None. Dynamo sets
    ``compile_subgraph_reason`` (a ``GraphCompileReason``) on the graph module it hands to the
    backend (read defensively: ``versions.HOOKS["graph_break_reason"]``)."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is None or not getattr(reason, "graph_break", False):
        return None
    why = (str(getattr(reason, "reason", "")).strip().splitlines() or ["unknown reason"])[0]
    stack = getattr(reason, "user_stack", None) or []
    where = f"{stack[-1].filename.rsplit('/', 1)[-1]}:{stack[-1].lineno}" if stack else "unknown location"
    return f"{where} ({why[:120]})"




def copy_dynamo_sources(gm: fx.GraphModule, copied: fx.GraphModule) -> None:
    """Give ``copied`` (a copy of Dynamo's graph ``gm``) what AOTAutograd reads off a Dynamo
    graph to tell the parameters and buffers from the inputs the step hands in (its static
    inputs): the module's ``_param_name_to_source`` and each placeholder's ``_dynamo_source``.
    Without them a copy plans parameters as activations. ``versions.HOOKS["dynamo_sources"]``."""
    if "dynamo_compile_id" in gm.meta and not hasattr(gm, "_param_name_to_source"):
        drift("dynamo_sources", "GraphModule._param_name_to_source")
        return
    if hasattr(gm, "_param_name_to_source"):
        copied._param_name_to_source = gm._param_name_to_source
    for old, new in zip(gm.graph.find_nodes(op="placeholder"), copied.graph.find_nodes(op="placeholder")):
        if hasattr(old, "_dynamo_source"):
            new._dynamo_source = old._dynamo_source


def is_sym(val: object) -> bool:
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))


def ordered_set(items: Any) -> Any:
    """``torch.utils._ordered_set.OrderedSet`` (``versions.HOOKS["ordered_set"]``)."""
    from torch.utils._ordered_set import OrderedSet

    return OrderedSet(items)


def measure_cpu_peak_bytes(step: Any) -> int:
    """Peak bytes of tensor storages allocated and still alive at any moment while ``step()``
    runs on CPU, from the profiler's allocation timeline (every create and destroy, timestamped).
    Storages that existed before are not counted. ``torch.profiler``'s ``_memory_profile()``
    (``versions.HOOKS["memory_profile"]``: a measurement aid for tests and benchmarks, not used
    when training)."""
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


@functools.cache
def sdpa_takes_enable_gqa() -> bool:
    """Whether this torch's ``F.scaled_dot_product_attention`` takes ``enable_gqa=True`` (keys and
    values with fewer heads than the queries), tried once on tiny CPU tensors
    (``versions.HOOKS["sdpa_enable_gqa"]``): where it does not, the attention rewrite keeps K/V
    expansions (``remat.capture.attention``)."""
    q, kv = torch.zeros(1, 2, 1, 1), torch.zeros(1, 1, 1, 1)
    try:
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True
