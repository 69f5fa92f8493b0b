"""Version knowledge, in one table: every private torch hook or attribute remat uses, and every
behaviour of torch that its predictions copy or were measured against, each with the torch
versions it was checked on and what happens when a torch release changes it. The prose of the
package cites entries by name (``versions.HOOKS["inductor_partitioner"]``) instead of repeating
version numbers; ``tests/structure/test_versions.py`` checks that every entry is used where it says and
that every private torch name the package uses is in the table.

Note [Version drift]
Private torch APIs change between releases. What remat does when one is missing depends on what
it would cost (``OnDrift``): a hook without which remat would silently do the wrong thing raises
(``RAISE``: Inductor would ignore remat's plan); one whose absence changes memory, not
correctness, warns once naming itself and remat runs without it (``WARN``); an API that changed
shape between checked versions is read both ways (``FALL_BACK``); the foundations (AOTAutograd
as a Dynamo backend, the partitioner's split) fail with torch's own error (``FAILS``); and a
behaviour the peak model copies (a threshold, a fusion habit) is not visible at run time at
all (``UNDETECTED``): a change shows as predicted peaks that miss the compiled ones, which the
compiled peak, read from Inductor's wrapper, still reports. On a torch outside ``VERIFIED``
remat runs, and says so once (``check_torch_version``).
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass

import torch

from .errors import RematError

__all__ = ["OnDrift", "Hook", "HOOKS", "VERIFIED", "torch_version", "is_verified", "check_torch_version", "drift"]


class OnDrift(enum.Enum):
    """What remat does when a torch release changes an entry."""

    RAISE = "raise"
    """``drift`` raises ``RematError``: running on would silently do the wrong thing."""
    WARN = "warn"
    """``drift`` warns once, naming the entry and its consequence; remat runs without it."""
    FALL_BACK = "fall back"
    """The other way the entry names is taken, silently (both ways were checked)."""
    FAILS = "fails"
    """Not guarded: torch's own error (an ImportError, an AttributeError) surfaces."""
    UNDETECTED = "undetected"
    """Not checked at run time: a behaviour the peak model copies or was measured against, or
    one remat relies on; nothing fails, and what remat predicts or does drifts."""


@dataclass(frozen=True)
class Hook:
    """One entry of the table."""

    purpose: str
    """What remat uses it for."""
    apis: tuple[str, ...]
    """The torch names it relies on, dotted from ``torch`` (``Class.attr`` for attributes of
    objects torch hands over), or the torch source it copies."""
    used_in: tuple[str, ...]
    """The modules of ``remat`` that use or copy it (each cites the entry by name)."""
    checked: tuple[str, ...]
    """torch major.minor versions it was checked on."""
    on_drift: OnDrift
    consequence: str
    """What happens when it drifts (the text of the warning or the error)."""
    notes: str = ""
    """How it was checked, or what differs between the checked versions."""


_INDUCTOR = "remat.backends.inductor"
_BOTH = ("2.11", "2.13")

HOOKS: dict[str, Hook] = {
    # --- Dynamo and AOTAutograd (remat.compat) ----------------------------------------------
    "aot_autograd": Hook(
        "AOTAutograd as a Dynamo backend, with remat's partition function",
        ("torch._dynamo.backends.common.aot_autograd",), ("remat.compat",), _BOTH, OnDrift.FAILS,
        "remat cannot be imported."),
    "unsent_grads": Hook(
        "outputs beside a loss planned without their gradients: the compiled forward's autograd node found among "
        "its outputs' grad_fn (named CompiledFunctionBackward) and told not to fill unsent gradients with zeros "
        "(materialize_grads), AOTAutograd's backward handing such a None to the compiled backward unchanged (Note "
        "[Gradients the caller does not send] in remat.capture.unsent_grads)",
        ("torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchAutograd.process_runtime_tangent",),
        ("remat.compat", "remat.capture.unsent_grads"), ("2.11", "2.13", "2.14"), OnDrift.WARN,
        "Where the node is not found, autograd fills the unsent gradients with zeros again: the step holds them "
        "(the plan's peak does not), and the backward checks that they are zeros before it leaves them unread.",
        "Checked by tests/capture/test_unsent_grads.py on 2.13 and 2.14 (CPU) and by HF GPT-2 and Llama trained "
        "under budgets on an H100 with 2.11 (benchmarks/results/h100-torch2.11.0/unsent-h100.md)."),
    "register_backend": Hook(
        "registering remat as the Dynamo backend \"remat\"",
        ("torch._dynamo.backends.registry.register_backend", "torch._dynamo.backends.registry._BACKENDS"),
        ("remat.compat",), _BOTH, OnDrift.FAILS, "remat cannot be imported."),
    "op_classes": Hook(
        "recognising ATen ops and higher-order ops in fx graphs, and reading their schemas",
        ("torch._ops.OpOverload", "torch._ops.HigherOrderOperator", "torch._ops.OpOverload._schema",
         "torch._ops.OpOverload._overloadname"),
        ("remat.compat", "remat.backends.eager.backend", f"{_INDUCTOR}.decompositions"), _BOTH, OnDrift.FAILS,
        "remat cannot be imported.",
        "Also read by remat.analysis (op names, mutation, aliasing outputs)."),
    "module_call": Hook(
        "a wrapped module's calls go through remat's compiled call, as torch.compile(module)'s do",
        ("torch.nn.Module._call_impl", "torch.nn.Module._compiled_call_impl", "torch.nn.Module._modules",
         "torch.nn.Module._forward_pre_hooks", "torch._dynamo.eval_frame.OptimizedModule._orig_mod"),
        ("remat.capture.wrap",), _BOTH, OnDrift.UNDETECTED,
        "A wrapped module would run without remat (tests/entry/test_api.py notices)."),
    "pytree": Hook(
        "the tensors of nested outputs", ("torch.utils._pytree.tree_leaves",), ("remat.compat",), _BOTH,
        OnDrift.FAILS, "remat cannot be imported."),
    "extract_fwd_bwd": Hook(
        "splitting the joint graph into the forward and the backward at remat's saved values",
        ("torch._functorch.partitioners._extract_fwd_bwd_modules",), ("remat.compat",), _BOTH, OnDrift.FAILS,
        "planning falls back to the default partition (strict=True raises).",
        "The keyword arguments differ between versions: those this torch lacks are left out (its signature "
        "is read)."),
    "default_partition": Hook(
        "the plan a failed planning falls back to (what autograd saves)",
        ("torch._functorch.partitioners.default_partition",), ("remat.compat",), _BOTH, OnDrift.FAILS,
        "compiling fails with torch's error.", "Keyword arguments this torch lacks are left out."),
    "stock_partition": Hook(
        "torch.compile's own partition of a graph, measured as a candidate plan (remat.tuning)",
        ("torch._functorch.partitioners.min_cut_rematerialization_partition",), ("remat.compat",), ("2.13",),
        OnDrift.FAILS, "compiling the candidate fails with torch's error.",
        "Called as Inductor's partition_fn calls it (compiler=\"inductor\"); keyword arguments this torch "
        "lacks are left out."),
    "dynamo_sources": Hook(
        "a copy of Dynamo's graph (a budget's re-plan, a measured candidate) keeps what tells its "
        "parameters from its inputs", ("torch.fx.GraphModule._param_name_to_source", "torch.fx.Node._dynamo_source"),
        ("remat.compat", "remat.capture.graph_copy"), ("2.13",), OnDrift.WARN,
        "a re-planned or measured copy of a graph plans its parameters as inputs the step hands in.",
        "Read by AOTAutograd's _try_get_metadata_from_dynamo; copied by attribute, not by meta."),
    "autograd_cache_off": Hook(
        "turning off the AOTAutograd cache, whose key ignores the partitioner",
        ("torch._functorch.config", "torch._functorch.config.patch",
         "torch._functorch.config.enable_autograd_cache"), ("remat.compat",), _BOTH, OnDrift.FAILS,
        "compiling fails with torch's error (an unknown setting)."),
    "backward_compiled_now": Hook(
        "the budget re-plan: the backward compiled with the forward, so the step's compiled peak is read at once",
        ("torch._functorch.config.force_non_lazy_backward_lowering",), ("remat.compat",), _BOTH, OnDrift.WARN,
        "A plan whose compiled peak misses the budget is not replaced."),
    "static_input_mark": Hook(
        "telling a graph's static inputs (parameters, buffers Dynamo marked) from its activations, so that "
        "a budget's second compile after a measured step holds the former and only the shapes of the latter",
        ("torch._dynamo.mark_static_address", "Tensor._dynamo_static_input_type"),
        ("remat.compat", "remat.capture.budget_guard"),
        ("2.13", "2.14"), OnDrift.WARN,
        "A buffer is taken for an activation in a budget's second compile: a same-shaped tensor stands in for it "
        "while compiling, which Inductor may treat as not static.",
        "Read in the sources of torch 2.13 and 2.14 (mark_static_address sets the attribute); the second compile "
        "ran on CPU under both backends in tests/capture/test_budget_guard.py."),
    "rng_replay": Hook(
        "recomputing a random op (attention with dropout, native_dropout) by replaying the generator state it "
        "drew from in the forward (Note [Replayed random ops])",
        ("torch._prims.rng_prims.run_and_save_rng_state", "torch._prims.rng_prims.run_with_rng_state"),
        ("remat.compat", "remat.analysis.op_facts", "remat.capture.rng_replay"),
        ("2.11", "2.13", "2.14"), OnDrift.WARN,
        "Random ops are saved, never recomputed: plans under a budget keep attention with dropout and dropout "
        "masks on the device.",
        "The operators torch's own partitioner wraps random ops of checkpointed regions in (its non-graph-safe "
        "path); Inductor runs both as fallback kernels."),
    "real_tensors": Hook(
        "measuring the host link for offload with real tensors while AOTAutograd's fake mode is active "
        "(the partition function runs inside it)",
        ("torch._subclasses.fake_tensor.unset_fake_temporarily",), ("remat.compat", "remat.planning.offload"),
        ("2.11", "2.13", "2.14"), OnDrift.WARN,
        "The host link is measured on fake tensors (an unbounded rate): offload='auto' may offload copies the "
        "step cannot hide.",
        "Measured on the H200 (torch 2.11): under the fake mode the rate came out unbounded and 'auto' moved every "
        "movable value of HF Llama (+76% step time); with real tensors, 53 GB/s each way."),
    "fake_value": Hook(
        "the shapes of the ops a row-chunked graph adds (slices, slice-sized copies, concatenations), "
        "computed in the joint graph's fake mode",
        ("torch._subclasses.fake_tensor.FakeTensor.fake_mode",), ("remat.compat", "remat.planning.chunking"),
        ("2.11", "2.13", "2.14"), OnDrift.RAISE,
        "A row-chunked graph's new ops cannot be given shapes; plans cannot chunk rows.",
        "A tensor factory (full) has no tensor argument, so the mode is taken from a value of the graph."),
    "boxed_codegen": Hook(
        "the uncompiled backend's graphs drop each input after its last use",
        ("torch.fx.graph._BoxedCodeGen", "_boxed_call"), ("remat.compat",), _BOTH, OnDrift.FAILS,
        "the uncompiled backend fails to run its graphs."),
    "unbacked_hint": Hook(
        "the size assumed for a data-dependent size without a hint",
        ("torch._inductor.config.unbacked_symint_fallback",), ("remat.compat",), _BOTH, OnDrift.UNDETECTED,
        "Cost estimates of data-dependent sizes differ from Inductor's.", "Its default, 8192."),
    "size_hint": Hook(
        "a concrete value of a symbolic size for cost estimates, without adding a guard",
        ("SymNode.hint", "ShapeEnv.optimization_hint", "ShapeEnv.size_hint"), ("remat.compat",), _BOTH,
        OnDrift.FALL_BACK, "Unbacked sizes are estimated with ShapeEnv.size_hint(allow_none=True) where "
        "optimization_hint is missing, else with the unbacked hint.",
        "ShapeEnv.optimization_hint: 2.13; ShapeEnv.size_hint(allow_none=True): 2.11."),
    "graph_break_reason": Hook(
        "naming the graph break that ended a captured graph",
        ("GraphModule.compile_subgraph_reason", "GraphCompileReason.graph_break", "GraphCompileReason.reason",
         "GraphCompileReason.user_stack"), ("remat.compat",), ("2.13",), OnDrift.FALL_BACK,
        "Read defensively: a graph break is not named."),
    "ordered_set": Hook(
        "the static inputs handed to the partitioner's split", ("torch.utils._ordered_set.OrderedSet",),
        ("remat.compat",), _BOTH, OnDrift.FAILS, "planning falls back to the default partition."),
    "memory_profile": Hook(
        "measuring a CPU step's peak from the profiler's allocation timeline (tests and benchmarks only)",
        ("torch.profiler._memory_profiler.Action", "torch.profiler._memory_profiler.Action.CREATE",
         "torch.profiler._memory_profiler.Action.DESTROY", "torch.profiler.profile._memory_profile"), ("remat.compat",),
        ("2.13",), OnDrift.FAILS, "the measurement fails; training is unaffected."),
    "sdpa_enable_gqa": Hook(
        "attention keeps grouped-query K/V unexpanded (remat.capture.attention)",
        ("torch.nn.functional.scaled_dot_product_attention",), ("remat.compat",), ("2.13",), OnDrift.FALL_BACK,
        "Where SDPA takes no enable_gqa, the K/V expansions Dynamo captured are kept.",
        "Tried once on tiny CPU tensors (compat.sdpa_takes_enable_gqa)."),
    "sdpa_kernel_choice": Hook(
        "which fused kernel SDPA picks for its inputs in the traced joint graph: on CUDA only flash takes "
        "enable_gqa (no mask, head dims up to 256); CPU's takes a mask with it but no dropout "
        "(remat.capture.attention)",
        ("torch.nn.functional.scaled_dot_product_attention",), ("remat.capture.attention",), ("2.13",),
        OnDrift.UNDETECTED, "A rewritten call may run another kernel than the one the rewrite expected "
        "(gradients are unaffected).",
        "Checked on CPU (tests/test_attention_hf.py); CUDA's choice mirrors transformers' use_gqa_in_sdpa."),
    "fake_tensor_errors": Hook(
        "one remat: error about the user's model instead of Dynamo's trace when the model fails on its inputs",
        ("torch._dynamo.exc.TorchRuntimeError", "torch._subclasses.fake_tensor"),
        ("remat.capture.dynamo_errors",), ("2.13",), OnDrift.FALL_BACK,
        "Read defensively: the model's own error reaches the user as Dynamo's, with its log lines.",
        "The logger torch._subclasses.fake_tensor logs the meta kernel's traceback at ERROR level before "
        "Dynamo raises."),
    "dynamo_weakref": Hook(
        "Dynamo traces a wrapped module's forward through a weak reference to it",
        ("VariableBuilder.wrap_weakref", "WeakRefVariable"), ("remat.capture.wrap",), _BOTH, OnDrift.UNDETECTED,
        "Dynamo would trace the referent without a source of its own: graph breaks or recompiles.",
        "The same handling is older than 2.11."),
    "caller_lifetimes": Hook(
        "how long the caller holds a step's outputs and output gradients (Note [What the caller holds])",
        ("autograd", "AOTAutograd"), ("remat.core.allocations",), ("2.13",), OnDrift.UNDETECTED,
        "The predicted and the read peaks of graphs that compute their loss drift.",
        "Measured with the CPU profiler."),
    "eager_kernels": Hook(
        "eager autograd's peak, the reference of budget fractions (Note [Eager kernels])",
        ("ATen kernels' registers-only intermediates",), ("remat.analysis.schedule",), ("2.13",),
        OnDrift.UNDETECTED, "Plan.eager_peak_bytes drifts, and with it what a budget fraction means.",
        "Measured with the CPU profiler: a two-block ViT's eager peak."),
    # --- distributed (remat.compat, remat.distributed) --------------------------------------------
    "dynamo_config": Hook(
        "Dynamo's settings remat changes for a call (optimize_ddp while explaining a DDP model)",
        ("torch._dynamo.config.patch", "torch._dynamo.config.optimize_ddp"),
        ("remat.compat", "remat.distributed"), _BOTH, OnDrift.FAILS, "explaining a DDP model fails."),
    "ignore_logging": Hook(
        "a wrapped model's logger calls traced through instead of splitting its graph (Note [Logging does not split "
        "the graph])",
        ("torch._dynamo.config.ignore_logger_methods",), ("remat.compat", "remat.capture.wrap"),
        ("2.11", "2.13", "2.14"), OnDrift.WARN,
        "A logger call in the model splits its graph again (HF GPT-2's loss becomes a graph of its own).",
        "Named ignore_logging_functions from 2.13 on, with ignore_logger_methods kept as its alias. Torch 2.11 "
        "sorts and dumps that set to JSON after every compile (its blocklist names only the old key): the set holds "
        "string-like wrappers equal to the methods (compat._LogMethod); seen on an H100 with 2.11, plain functions "
        "logged a TypeError at each compile."),
    "default_store": Hook(
        "the default process group's key-value store (ranks agree on plans)",
        ("torch.distributed.distributed_c10d._get_default_store",), ("remat.compat",), ("2.13",), OnDrift.FAILS,
        "checking that ranks agree fails."),
    "active_ddp_module": Hook(
        "the DistributedDataParallel module whose forward is running",
        ("torch.nn.parallel.DistributedDataParallel._get_active_ddp_module",), ("remat.compat",), ("2.13",),
        OnDrift.FAILS, "compiling a graph under DDP fails."),
    "optimize_ddp_mode": Hook(
        "whether Dynamo splits graphs at DDP's buckets", ("torch._dynamo.utils.get_optimize_ddp_mode",
                                                          "torch._dynamo.config.optimize_ddp"),
        ("remat.compat",), ("2.13",), OnDrift.FALL_BACK,
        "Where get_optimize_ddp_mode is missing, torch._dynamo.config.optimize_ddp is read (True or "
        "\"ddp_optimizer\")."),
    "ddp_bucket_split": Hook(
        "remat's own split of a DDP graph at its gradient buckets (pieces keep the whole graph's plan)",
        ("torch._dynamo.backends.distributed.DDPOptimizer",
         "torch._dynamo.backends.distributed.DDPOptimizer.compile_fn", "torch.fx.passes.split_module.split_module"),
        ("remat.compat",), ("2.13",), OnDrift.WARN,
        "Dynamo splits DDP graphs itself, and pieces may keep more than the whole graph's plan.",
        "DDPOptimizer(bucket_bytes_cap, backend_compile_fn) whose compile_fn splits through "
        "torch.fx.passes.split_module.split_module, which is replaced for the length of the call."),
    "from_node": Hook(
        "the Dynamo-graph nodes a joint-graph node was traced from (DDP bucket pieces)",
        ("fx.Node.meta['from_node']", "torch.fx.traceback.NodeSource"), ("remat.compat",), ("2.13",),
        OnDrift.FALL_BACK, "No origins are found: each bucket piece is planned on its own."),
    # --- Inductor: hooks (remat.backends.inductor) -------------------------------------------
    "compile_fx": Hook(
        "Inductor's entry point, each graph compiled through remat's inner compile",
        ("torch._inductor.compile_fx", "torch._inductor.compile_fx.compile_fx",
         "torch._inductor.compile_fx.compile_fx_inner"), (f"{_INDUCTOR}.hooks",), _BOTH, OnDrift.FAILS,
        "compiling fails with torch's error.",
        "compile_fx's inner_compile and config_patches also apply to the backward, compiled later; "
        "compile_fx_inner's keyword arguments is_backward and is_inference."),
    "inductor_caches_off": Hook(
        "Inductor's FX graph caches off (their keys see neither node meta nor fusion choices)",
        ("torch._inductor.config", "torch._inductor.config.patch", "torch._inductor.config.fx_graph_cache",
         "torch._inductor.config.fx_graph_remote_cache"), (f"{_INDUCTOR}.hooks",), _BOTH, OnDrift.FAILS,
        "compiling fails with torch's error (an unknown setting).",
        "fx_graph_remote_cache is turned off where it exists."),
    "recompute_precision": Hook(
        "recomputed low-precision values equal the forward's bit for bit (Note [Recompute precision])",
        ("torch._inductor.config.emulate_precision_casts",
         "torch.fx.experimental.proxy_tensor._maybe_record_pointwise_barrier",
         "torch._inductor.lowering.make_pointwise"), (f"{_INDUCTOR}.hooks", f"{_INDUCTOR}.lowering"),
        ("2.11", "2.13", "2.14"), OnDrift.WARN,
        "A recomputed bf16/fp16 value may differ in its last bits from the saved one: gradients depend on "
        "the plan. The op counts of rounded expressions (Note [Emulated rounding]) drift: predicted peaks "
        "drift from the compiled ones.",
        "The node meta key low_precision_pointwise_barrier, set by the trace and read by make_pointwise's "
        "lowering, read in the source of each version; the counts checked against inner_fn_opcount on a bf16 "
        "network (tests/backends/test_inline_opcount.py) and, on the oldest, HF Llama's loss backward in "
        "Inductor's CUDA lowering without a GPU."),
    "inductor_partitioner": Hook(
        "Inductor partitions joint graphs with remat's partition function",
        ("torch._inductor.compile_fx.min_cut_rematerialization_partition",), (f"{_INDUCTOR}.hooks",), _BOTH,
        OnDrift.RAISE, "Without it Inductor would partition with its own partitioner and ignore remat's plan. "
        "Use backend='eager' (uncompiled) or a verified torch.",
        "compile_fx calls the module-level name when no custom partitioner is set, on both; 2.13 also has "
        "torch._inductor.config.custom_partitioner_fn, 2.11 does not (and it would enter Inductor's cache "
        "key, which cannot pickle a closure)."),
    "stage_local_fusion": Hook(
        "Inductor fuses two kernels only within a block (Note [Stage-local fusion])",
        ("torch._inductor.virtualized", "torch._inductor.virtualized.V",
         "torch._inductor.virtualized.V.set_choices_handler", "torch._inductor.virtualized.V.choices",
         "InductorChoices.can_fuse", "ir.Buffer.origin_node", "BaseSchedulerNode.min_order",
         "BaseSchedulerNode.max_order"), (f"{_INDUCTOR}.hooks",), _BOTH, OnDrift.WARN,
        "Gradients are unaffected, but kernels may fuse across blocks and hold several blocks' buffers at "
        "once, above the predicted peak.",
        "InductorChoices.can_fuse(scheduler, node1, node2, shared_data_score), a documented extension point "
        "for fusion heuristics. BaseSchedulerNode.min_order / max_order: each node's place in the scheduler's "
        "order before fusion (a fused node spans its parts'), and fused nodes sorted by min_order after each "
        "fusion round (Note [Fusions that jump blocks]), read in the source of 2.11, 2.13 and 2.14."),
    "cpp_flush_between_stages": Hook(
        "the C++ backend emits one function per block between two extern kernels",
        ("torch._inductor.codegen.cpp.CppScheduling", "torch._inductor.codegen.cpp.CppScheduling.codegen_node",
         "torch._inductor.codegen.cpp.CppScheduling._set_flush_status", "torch._inductor.virtualized.V.graph",
         "torch._inductor.virtualized.V.graph.scheduler",
         "Scheduler.nodes", "Scheduler.current_node"), (f"{_INDUCTOR}.hooks",), _BOTH, OnDrift.WARN,
        "Gradients are unaffected, but one C++ function may hold every block's buffers between two extern "
        "kernels, above the predicted peak.",
        "The patch installs on both; its effect was measured on 2.13's CPU backend "
        "(tests/backends/test_stage_fusion.py)."),
    "lowering_tables": Hook(
        "which ops Inductor runs as extern kernels (a lowering fact of the peak model)",
        ("torch._inductor.lowering", "torch._inductor.lowering.needs_realized_inputs",
         "torch._inductor.lowering.fallbacks", "torch._inductor.lowering.lowerings"),
        (f"{_INDUCTOR}.lowering",), _BOTH, OnDrift.WARN,
        "Gradients are unaffected; ops are taken for generated code where a table is missing, and the "
        "predicted peak may differ from the compiled one."),
    "decomposition_table": Hook(
        "Inductor's decompositions, which both backends trace the joint graph with",
        ("torch._inductor.decomposition.select_decomp_table", "torch._inductor.lowering"),
        (f"{_INDUCTOR}.decompositions",), _BOTH, OnDrift.FAILS, "tracing the joint graph fails.",
        "Some decompositions (max_pool2d_with_indices) reach torch._inductor.lowering through the package "
        "attribute, which exists only once that module was imported: it is imported first."),
    "read_allocations": Hook(
        "reading the compiled step's peak from the memory plan of Inductor's wrapper (remat.core.allocations)",
        ("torch._inductor.codegen.wrapper", "torch._inductor.codegen.wrapper.PythonWrapperCodegen",
         "torch._inductor.codegen.wrapper.PythonWrapperCodegen.run_wrapper_ir_passes",
         *(f"torch._inductor.codegen.wrapper.{line}" for line in (
             "AllocateLine", "ReuseLine", "FreeIfNotReusedLine", "FreeLine", "ReinterpretLine",
             "ExternKernelAllocLine", "ExternKernelOutLine", "MultiOutputLine", "KernelCallLine", "WrapperLine",
             "ScatterFallbackLine", "IndexPutFallbackLine")),
         "torch._inductor.ir", "torch._inductor.ir.MultiOutputLayout", "torch._inductor.utils.get_dtype_size",
         "torch._inductor.virtualized.V.graph", "GraphLowering.get_allocation_storage_size",
         "GraphLowering.graph_inputs", "GraphLowering.graph_outputs", "SizeVarAllocator.optimization_hint",
         "torch._inductor.ir.ExternKernel", "ExternKernel.op_overload", "IRNode.origins"),
        (f"{_INDUCTOR}.wrapper_reading", f"{_INDUCTOR}.backend"), _BOTH, OnDrift.WARN,
        "The compiled peak is not read (or may be off): the plan keeps the simulator's prediction, and a "
        "budget is not re-planned on it.",
        "The line classes and their fields (node, reused_as, delete_old, is_reused, result_name, arg_name) "
        "have the same names and meaning on both; a line of a kind the reader does not know is named in "
        "GraphTrace.unknown. An extern kernel's fx node is its origin_node, else the one of its origins that "
        "calls its op_overload (a convolution's and a fallback's IR leave origin_node unset)."),
    "remat_order": Hook(
        "Inductor keeps the order remat gives the graphs it compiles, offload copies included: compiled without "
        "Inductor's peak-memory reordering (Note [remat's order kept])",
        ("torch._inductor.config.reorder_for_peak_memory",), (f"{_INDUCTOR}.hooks",), ("2.11", "2.13", "2.14"),
        OnDrift.WARN,
        "Gradients are unaffected, but Inductor may move work away from remat's places (offload copies issued "
        "back at the backward's start, a layer's inputs converted long before they are read): peaks above "
        "the predicted ones.",
        "Run on 2.13 (tests/capture/test_offload_inductor.py) and in 2.14's CUDA lowering without a GPU "
        "(benchmarks/gpu_offline.py); on 2.11 the setting and the scheduler's call of "
        "memory.reorder_for_peak_memory read in its source, the same."),
    "read_offload_copies": Hook(
        "reading a compiled graph with offload copies: a fallback whose output aliases its input (remat's "
        "ready) allocates nothing, and on a GPU host buffers take no device memory",
        ("torch._inductor.ir.FallbackKernel.op_overload", "torch._ops.OpOverload._schema",
         "torch._inductor.ir.FallbackKernel.get_inputs_that_alias_output", "torch._inductor.ir.IRNode.get_device",
         "GraphLowering.device_types", "GraphLowering.get_buffer"),
        (f"{_INDUCTOR}.wrapper_reading",), _BOTH, OnDrift.WARN,
        "An offloaded value's copy back may be counted twice, or its host copy as device memory: the read "
        "peak is above the compiled step's.",
        "Run on 2.13 (tests/capture/test_offload_inductor.py); on 2.11 FallbackKernel's alias_names (its "
        "schema's alias annotations) and GraphLowering.device_types read in its source, the same."),
    "channels_last_outputs": Hook(
        "the layout Inductor gives a training graph's dense 4-D outputs downstream of its convolutions "
        "(channels-last under its layout optimization, whatever their traced strides), so that an offloaded "
        "value's host copy is made in that layout and returned as it is",
        ("torch._inductor.graph.GraphLowering.decide_layout_opt",
         "torch._inductor.graph.GraphLowering.find_nodes_prefer_channels_last"),
        (f"{_INDUCTOR}.hooks",), _BOTH, OnDrift.WARN,
        "An offloaded 4-D value of a convolutional network may be copied again on the host, into pageable "
        "memory, before the forward returns it; its copy back then refuses it (RuntimeError) on CUDA.",
        "Run on 2.13 and 2.14.1 (tests/capture/test_offload_inductor.py); on 2.11 both read in its source "
        "(graph.py: a static method of the graph module and a method reading self.module), the same."),
    "recomputed_layout": Hook(
        "a value Inductor lays out channels-last but pins to its traced strides (a value of several readers, one "
        "of them a convolution_backward or a matmul: GraphLowering.run_node's need_fixed_layout) is read through "
        "a channels-last clone in the backward remat hands it, so that it is stored once (Note [Recomputed "
        "values in the forward's layout])",
        ("torch._inductor.graph.GraphLowering.run_node",
         "torch._inductor.graph.GraphLowering.decide_layout_opt",
         "torch._inductor.graph.GraphLowering.find_nodes_prefer_channels_last", "torch.ops.aten._int_mm",
         "torch.Tensor._is_view"),
        (f"{_INDUCTOR}.hooks",), ("2.11", "2.13", "2.14"), OnDrift.WARN,
        "Gradients are unaffected; a recomputed value of a convolutional network may be stored once per "
        "layout its readers want (ResNet-50 at budget=0.5: 367 MiB above the plan in Inductor's CUDA memory "
        "plan), or the clone may cost a copy of its own.",
        "Run on 2.13 (tests/backends/test_recomputed_layout.py) and in 2.14's CUDA lowering without a GPU "
        "(benchmarks/gpu_offline.py); on 2.11 run_node's need_fixed_layout list (convolution_backward, mm, "
        "_int_mm) and its pinning to the fx strides read in its source, the same."),
    # --- Inductor: behaviour the peak model copies (remat.backends.inductor) -----------------------
    "realization": Hook(
        "which pointwise values Inductor stores rather than inlines (Note [Inductor realization])",
        ("torch._inductor.graph.GraphLowering.run_node", "torch._inductor.ir.StorageBox.realize_hint",
         "torch._inductor.ir.StorageBox.mark_reuse", "torch._inductor.ir.StorageBox.has_exceeded_max_reads",
         "torch._inductor.ir.StorageBox.should_realize_on_reuse", "torch._inductor.lowering.make_reduction",
         "torch._inductor.config.realize_reads_threshold", "torch._inductor.config.realize_acc_reads_threshold",
         "torch._inductor.config.realize_opcount_threshold", "torch._inductor.ir.ComputedBuffer.make_loader"),
        (f"{_INDUCTOR}.fusion.realization", f"{_INDUCTOR}.fusion.rules", f"{_INDUCTOR}.lowering"), _BOTH,
        OnDrift.UNDETECTED, "Predicted peaks drift from the compiled ones.",
        "realize_reads_threshold 4; realize_acc_reads_threshold 8 (realize_cpu_acc_reads_threshold 12); "
        "realize_opcount_threshold 30 (realize_cpu_opcount_threshold 50); the CPU backend's expensive ops "
        "(lowering.HEAVY_OPS); a stored buffer of no reads is inlined into its readers (ComputedBuffer.make_loader, "
        "read in the source of 2.11, 2.13 and 2.14: Note [Stored values that load nothing])."),
    "broadcast_realization": Hook(
        "an inlined value a pointwise op broadcasts is marked reused (Note [Broadcast realization])",
        ("torch._inductor.lowering.expand", "torch._inductor.ir.StorageBox.mark_reuse"),
        (f"{_INDUCTOR}.fusion.realization",), _BOTH, OnDrift.UNDETECTED,
        "Predicted peaks drift from the compiled ones (the LM loss's log-softmax)."),
    "inline_opcount": Hook(
        "ops a pointwise node adds to an inlined expression",
        ("torch._inductor.ir.Pointwise.inner_fn_opcount", "torch._inductor.config.unroll_reductions_threshold",
         "torch._inductor.config.cpp", "torch._inductor.config.cpp.use_two_step_variance_threshold",
         "torch._inductor.config.triton.use_two_step_variance_min_numel",
         "torch._inductor.config.triton.use_two_step_variance_threshold"),
        (f"{_INDUCTOR}.lowering",), ("2.11", "2.13", "2.14"), OnDrift.UNDETECTED,
        "Predicted peaks drift from the compiled ones.",
        "Compared with inner_fn_opcount node by node (Note [Inlined op counts]): on ResNet-50's graphs under "
        "budget=0.5, 2,021 of 2,027 pointwise values counted exactly on 2.11 and a mean error of 0.75 ops on "
        "2.14.1; from 2.13 the casts of saved low-precision values are not counted (tests/backends/"
        "test_inline_opcount.py); the two-step variance thresholds are read from the config where it has them."),
    "index_source_realization": Hook(
        "a value computed from indices alone is stored once only if it reads a buffer (Note [Values "
        "computed from indices])",
        ("torch._inductor.ir.TensorBox.realize_hint", "torch._inductor.ir.Pointwise.inner_fn_opcount"),
        (f"{_INDUCTOR}.lowering",), _BOTH, OnDrift.UNDETECTED,
        "Extern kernels that read a causal mask may each compute it again (time, not memory)."),
    "extern_separated_blocks": Hook(
        "stage-local fusion only where some block runs no extern kernel, and for gradient sums that join "
        "blocks and readers of values several blocks read (Note [Blocks an extern kernel separates], Note "
        "[Gradient sums that join blocks], Note [Values several blocks read])",
        ("the scheduler's fusion around extern kernels", "Scheduler.topological_sort_schedule"),
        (f"{_INDUCTOR}.lowering",), ("2.11", "2.13", "2.14"),
        OnDrift.UNDETECTED, "Steps may be slower than they need to be, or fuse across blocks.",
        "Boundary fusions measured on an H200 (bf16, benchmarks/variant_probe.py); shared values on CPU (2.13, "
        "tests/backends/test_shared_values.py) and in the CUDA lowering of 2.14 without a GPU "
        "(benchmarks/gpu_offline.py, T5)."),
    "kernel_fusion": Hook(
        "how Inductor fuses and allocates the kernels between two extern kernels (Note [Inductor "
        "allocation])",
        ("torch._inductor.scheduler.Scheduler.fuse_nodes", "torch._inductor.config.inplace_buffers",
         "torch._inductor.config.allow_buffer_reuse", "torch._inductor.codegen.wrapper.AllocateLine.plan",
         "torch._inductor.codegen.cpp.CppKernelProxy.try_outer_loop_fusion_with_local_buf"),
        (f"{_INDUCTOR}.fusion.allocation",), _BOTH, OnDrift.UNDETECTED,
        "Predicted peaks drift from the compiled ones."),
    "addmm_fusion": Hook(
        "a matmul an add reads fused into one addmm, run where the add is (Note [Matmuls fused into the "
        "add that reads them])",
        ("torch._inductor.fx_passes.post_grad.addmm", "torch._inductor.fx_passes.post_grad.is_valid_addmm_fusion"),
        (f"{_INDUCTOR}.lowering", f"{_INDUCTOR}.kernel_model"), ("2.13", "2.14"), OnDrift.UNDETECTED,
        "Predicted peaks drift from the compiled ones where a matmul's add runs far from it.",
        "Read in the 2.13 and 2.14.1 sources; seen in 2.14.1's CUDA code generated on a CPU (gpu_offline.py)."),
    "padded_operand_stored": Hook(
        "a 2-D pad that one matmul reads stores its operand first (Note [A padded matmul operand is stored])",
        ("torch._inductor.config.inplace_padding", "torch._inductor.lowering.inplace_constant_pad_nd"),
        (f"{_INDUCTOR}.lowering", f"{_INDUCTOR}.fusion.realization"), ("2.11", "2.13", "2.14"), OnDrift.WARN,
        "Predicted peaks drift from the compiled ones around padded matmuls (a GPU's pad_mm).",
        "Read in the 2.11, 2.13 and 2.14.1 sources (the same test: one mm or addmm reader, padding of four, "
        "a 2-D operand, then realize); seen in 2.11's CUDA code generated on a CPU (gpu_offline.py --pad-mm force)."),
    "comprehensive_padding": Hook(
        "GPU: Inductor pads the strides of the buffers whose layout it picks, and copies a view the padded strides "
        "cannot express before an extern kernel reads it (Note [Padded strides])",
        ("torch._inductor.config.comprehensive_padding", "torch._inductor.config.disable_padding_cpu",
         "torch._inductor.config.pad_channels_last", "torch._inductor.config.padding_alignment_bytes",
         "torch._inductor.config.padding_stride_threshold", "torch._inductor.ir.Layout._pad_strides",
         "torch._inductor.graph.mark_nodes_dislike_padding", "torch._inductor.ir.ExternKernel.realize_input",
         "torch._inductor.graph.GraphLowering.run_node"),
        (f"{_INDUCTOR}.padding", f"{_INDUCTOR}.fusion.realization", f"{_INDUCTOR}.fusion.allocation"),
        ("2.11", "2.13", "2.14"), OnDrift.WARN,
        "Predicted peaks drift from the compiled ones on a GPU where a buffer's strides are padded.",
        "Read in the 2.11, 2.13 and 2.14.1 sources (the same rule: strides past 1,024 elements rounded up to 128 "
        "bytes, channels-last and convolution inputs left alone; a view that is not strides over the padded "
        "buffer copied for an extern kernel); seen in 2.13's C++ code with disable_padding_cpu off "
        "(tests/backends/test_padded_strides.py) and 2.11's CUDA code generated on a CPU (gpu_offline.py)."),
    "iteration_space": Hook(
        "GPU: a Triton kernel loops over one iteration space, so work of other sizes between two extern kernels "
        "is another kernel (Note [One iteration space])",
        ("torch._inductor.codegen.simd.SIMDScheduling.can_fuse",),
        (f"{_INDUCTOR}.fusion.allocation", f"{_INDUCTOR}.fusion.rules"), ("2.11", "2.13", "2.14"),
        OnDrift.UNDETECTED, "Predicted peaks drift from the compiled ones where work of several sizes meets.",
        "Read in the 2.11, 2.13 and 2.14.1 sources; seen in 2.11's CUDA code generated on a CPU (gpu_offline.py) "
        "and on an H100 (HF GPT-2's padded LM head)."),
    "random_at_reader": Hook(
        "GPU: a random value, which Inductor stores, is fused into its first reader's kernel and kept there as a "
        "kernel-local buffer (Note [Random values at their readers])",
        ("torch._inductor.lowering.inductor_random", "torch._inductor.scheduler.Scheduler.fuse_nodes"),
        (f"{_INDUCTOR}.fusion.allocation", f"{_INDUCTOR}.fusion.rules"), ("2.11", "2.13", "2.14"),
        OnDrift.UNDETECTED, "Predicted peaks drift from the compiled ones in graphs with dropout.",
        "inductor_random realizes its result in the 2.11, 2.13 and 2.14.1 sources; the fusion seen in 2.11's CUDA "
        "code generated on a CPU (gpu_offline.py, HF BERT-base with dropout)."),
    "mix_order_reduction": Hook(
        "GPU: a batch reduction fused with a sibling row reduction, and its workspace (Note [Mix-order "
        "workspace])",
        ("torch._inductor.scheduler.MixOrderReduction", "torch._inductor.scheduler.MixOrderReduction.can_fuse",
         "torch._inductor.codegen.simd._codegen_mix_order_reduction"),
        (f"{_INDUCTOR}.fusion.allocation", f"{_INDUCTOR}.fusion.rules"), _BOTH, OnDrift.UNDETECTED,
        "Predicted GPU peaks drift from the compiled ones.", "On by default; thresholds in fusion.rules.MixOrder."),
    "persistent_reductions": Hook(
        "Triton reduces a row of more than 1024 elements in a loop (Note [Looped reductions])",
        ("torch._inductor.config.triton.persistent_reductions",),
        (f"{_INDUCTOR}.fusion.allocation", f"{_INDUCTOR}.fusion.rules"), _BOTH, OnDrift.UNDETECTED,
        "Predicted GPU peaks drift from the compiled ones.", "The limit for inner reductions: 1024."),
    "buffer_reuse_estimate": Hook(
        "Inductor's wrapper holds a freed buffer for a later one when its own peak estimate allows (Note "
        "[Reuse estimate])",
        ("torch._inductor.memory.estimate_peak_memory", "torch._inductor.codegen.wrapper.EfficientPeakEstimate",
         "torch._inductor.codegen.wrapper.AllocateLine.plan",
         "torch._inductor.memory.assign_memory_planning_info_for_scheduler_buffers",
         "torch._inductor.utils.is_nonfreeable_buffers", "torch._inductor.config.combo_kernels",
         "torch._inductor.config.deterministic",
         "torch._inductor.config.reorder_for_compute_comm_overlap",
         "torch._inductor.config.aten_distributed_optimizations.enable_simple_overlap"),
        (f"{_INDUCTOR}.fusion.reuse", f"{_INDUCTOR}.hooks"), ("2.11", "2.13", "2.14"),
        OnDrift.UNDETECTED, "Predicted peaks drift from the compiled ones.",
        "Read in the scheduler's source of each version: with the peak-memory reordering off, a graph's own "
        "buffers are sized for the estimate only under the settings estimate_sizes_buffers reads (2.11 and "
        "2.13: none on by default; 2.14: the simple overlap of collectives, on by default). Checked on 2.11 "
        "in Inductor's CUDA lowering without a GPU (ViT-B/16 at budget=0.5: the estimate was the backward's "
        "saved values, 928.3 MiB)."),
    "extern_operand_layouts": Hook(
        "the layouts Inductor passes a convolution's operands, with which its cuDNN scratch is measured (Note "
        "[Operands as the backend lays them out]): aten.convolution's input and weight in the stride order of "
        "its output, channels-last under the layout optimization; convolution_backward's as traced; read back "
        "from the compiled extern kernel's inputs",
        ("torch._inductor.kernel.conv.convolution", "torch._inductor.kernel.conv.conv_layout",
         "torch._inductor.ir.ExternKernel.inputs", "torch._inductor.ir.IRNode.get_stride"),
        (f"{_INDUCTOR}.extern_layouts",), ("2.11", "2.13", "2.14"), OnDrift.WARN,
        "A convolution's measured scratch may count a copy of an operand the compiled kernel never makes, or "
        "miss one it does: the predicted peak drifts from the compiled one on CUDA.",
        "Run on 2.13 and 2.14.1 (tests/backends/test_extern_layouts.py: the operands Inductor's CPU lowering "
        "passes its extern convolution, with and without the layout optimization); on 2.11 the lowering read in "
        "its source (kernel/conv.py: require_stride_order to conv_layout's order, require_channels_last under "
        "layout_opt), the same."),
    # --- ATen kernels' scratch (remat.backends.aten_scratch) -------------------------------------
    "aten_cpu_convolution_scratch": Hook(
        "ATen's CPU convolutions (oneDNN) copy their operands into blocked layouts",
        ("aten.convolution", "aten.convolution_backward"), ("remat.backends.aten_scratch",), ("2.13",),
        OnDrift.UNDETECTED, "Predicted peaks of CPU convolutions drift.",
        "Measured with the profiler: 1x1 and 3x3 convolutions of 16 and 64 channels, within 0.02 MiB."),
    "aten_cpu_flash_attention_scratch": Hook(
        "ATen's CPU flash attention's per-thread blocks", ("native/cpu/FlashAttentionKernel.cpp",),
        ("remat.backends.aten_scratch",), ("2.13",), OnDrift.UNDETECTED,
        "Predicted peaks of CPU attention drift.",
        "Checked against the profiler (tests/backends/test_fusion_peak.py)."),
}


def torch_version(version: str | None = None) -> str:
    """``"2.13"`` for ``"2.13.0+cpu"``."""
    parts = (version or torch.__version__).split("+")[0].split(".")
    return ".".join(parts[:2])


def _verified() -> tuple[str, ...]:
    """The versions every Inductor hook (an entry of ``remat.backends.inductor`` that torch's code
    is called through, not a copied behaviour) was checked on."""
    hooks = [h for h in HOOKS.values() if h.on_drift is not OnDrift.UNDETECTED
             and any(m.startswith(_INDUCTOR) for m in h.used_in)]
    common = set.intersection(*(set(h.checked) for h in hooks))
    return tuple(sorted(common, key=lambda v: tuple(map(int, v.split(".")))))


VERIFIED: tuple[str, ...] = _verified()
"""torch major.minor versions on which every Inductor hook in ``HOOKS`` was checked."""

_warned: set[tuple[str, str]] = set()


def is_verified(version: str | None = None) -> bool:
    return torch_version(version) in VERIFIED


def check_torch_version(version: str | None = None) -> bool:
    """Warn once per process if this torch is not among ``VERIFIED``; True if it is."""
    v = torch_version(version)
    if v in VERIFIED:
        return True
    if ("", v) not in _warned:
        _warned.add(("", v))
        warnings.warn(
            f"remat: torch {v} was not verified with remat's Inductor hooks (verified: "
            f"{', '.join(VERIFIED)}). Training stays correct, but the predicted peak memory and "
            "the fusion limits remat sets may drift; any hook that cannot install is named in its "
            "own warning. Please report what you see, or use a verified torch.",
            stacklevel=3,
        )
    return False


def drift(key: str, missing: str | None = None) -> None:
    """``HOOKS[key]`` cannot be used on this torch (``missing``: what is absent or failed; by
    default the entry's names): raise ``RematError`` if it is a ``RAISE`` entry, else warn once
    with the entry's consequence (Note [Version drift])."""
    hook = HOOKS.get(key)
    if hook is None or hook.on_drift not in (OnDrift.RAISE, OnDrift.WARN):
        raise RematError(f"remat: internal error: no drift behaviour for {key!r} in remat.versions.HOOKS "
                         "(please report)")
    what = missing or ", ".join(hook.apis)
    text = (f"remat: `{key}` ({hook.purpose}) cannot be used on torch {torch.__version__}: {what} is missing "
            f"(checked on {', '.join(hook.checked)}). {hook.consequence} Please report this torch version.")
    if hook.on_drift is OnDrift.RAISE:
        raise RematError(text)
    if (key, what) not in _warned:
        _warned.add((key, what))
        warnings.warn(text, stacklevel=3)
