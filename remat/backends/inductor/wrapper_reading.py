"""Reading the memory plan Inductor generated for a compiled graph (``remat.core.allocations``).

After the scheduler has emitted the wrapper's lines and ``memory_plan_reuse`` has decided which
freed buffer each allocation reuses, ``PythonWrapperCodegen.lines`` is the graph's allocation
sequence as structured objects: ``AllocateLine`` (a buffer or a kernel's workspace),
``ReuseLine`` (a buffer takes a freed one's storage, or an output is written in place),
``FreeIfNotReusedLine`` (a free, unless a later allocation took the buffer), ``FreeLine`` (an
input dropped), ``ReinterpretLine`` (a buffer that views another), ``ExternKernelAllocLine``
and ``MultiOutputLine`` (an eager fallback that allocates its own outputs),
``ExternKernelOutLine`` / ``KernelCallLine`` (kernels). ``read_allocations`` wraps
``PythonWrapperCodegen.run_wrapper_ir_passes`` (which runs the planning) and converts the lines
to ``remat.core.allocations.Event``s while the graph's sizes are at hand.

The line classes, their fields (``node``, ``reused_as``, ``delete_old``, ``is_reused``,
``result_name``, ``arg_name``), ``run_wrapper_ir_passes``,
``GraphLowering.get_allocation_storage_size``, ``graph_inputs`` and ``graph_outputs``:
``versions.HOOKS["read_allocations"]``. Anything missing warns (Note [Version drift]) and the plan
keeps the simulator's prediction; a line of a kind not listed here is named in
``GraphTrace.unknown``. Newer versions add ``GroupedAssertSizeStrideLine``, an assert that neither
allocates nor frees.

What Inductor does not allocate: the scratch of extern kernels (attention's float32 query
gradient accumulator, CPU flash attention's per-thread blocks) is added while that kernel runs,
from ``remat.backends.aten_scratch.scratch_bytes`` on the kernel's fx node (cuDNN convolutions' workspace
measured on the device with the operands laid out as compiled: Note [Measured library scratch],
Note [Operands as the backend lays them out]); cuBLAS's workspace is allocated once per
process and is not part of a step's peak; the outputs a fallback returns
and Inductor never reads (attention's random seeds) are not counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ...analysis.ops import op_name
from ...compat import OpOverload
from ...core.allocations import Event, GraphTrace
from ...versions import drift
from ..aten_scratch import scratch_bytes
from ..cuda_scratch import MEASURED_OPS
from .extern_layouts import compiled_operand_strides

__all__ = ["read_allocations"]

_IGNORED = frozenset({
    "CommentLine", "KernelDefinitionLine", "EnterDeviceContextManagerLine", "ExitDeviceContextManagerLine",
    "EnterDeviceContextManagerWithStreamInfoLine", "ExitDeviceContextManagerWithStreamInfoLine",
    "EnterCudaStreamContextLine", "ExitCudaStreamContextLine", "SymbolicCallArgLine", "UnbackedSymbolDefsLine",
    "AssertSizeStrideLine", "AssertDivByZeroLine", "NullLine", "DynamicScalarLine",
    "GroupedAssertSizeStrideLine",  # newer torch: the size and stride checks of several tensors, in one call
})
"""Line kinds that neither allocate nor free."""

_IN_PLACE = frozenset({"ScatterFallbackLine", "IndexPutFallbackLine"})
"""Eager fallbacks that write into an existing buffer (``scatter_``, ``index_put_``)."""


def _hint(graph: Any, expr: Any) -> int:
    sizevars = graph.sizevars
    if hasattr(sizevars, "optimization_hint"):
        return int(sizevars.optimization_hint(expr, fallback=0))
    return int(sizevars.size_hint(expr, fallback=0))  # pragma: no cover - older torch


def _nbytes(graph: Any, node: Any) -> int | None:
    """Bytes Inductor allocates for ``node`` (a buffer or a kernel's workspace), None if it has
    no size to read."""
    from torch._inductor.utils import get_dtype_size

    try:
        return _hint(graph, graph.get_allocation_storage_size(node)) * get_dtype_size(node.get_dtype())
    except Exception:  # noqa: BLE001 - named in GraphTrace.unknown by the caller
        return None


def _input_bytes(graph: Any, value: Any) -> int:
    from torch._inductor.utils import get_dtype_size

    try:
        return _hint(graph, value.get_layout().storage_size()) * get_dtype_size(value.get_dtype())
    except Exception:  # noqa: BLE001 - a symbolic size or a non-tensor input
        return 0


def _name(node: Any) -> str | None:
    try:
        return node.get_name()
    except Exception:  # noqa: BLE001 - a shape or a constant output
        return None


def _buffer(graph: Any, name: str) -> Any:
    try:
        return graph.get_buffer(name)
    except Exception:  # noqa: BLE001 - its size is then unknown (GraphTrace.unknown)
        return None


def _scratch(node: Any) -> int:
    """The scratch of the ATen op extern kernel ``node`` runs, from its fx node: ``origin_node``,
    else (a kernel whose IR names several origins, as a convolution's and a fallback's do) the
    origin that calls its ``op_overload``."""
    origin = getattr(node, "origin_node", None)
    if origin is None and hasattr(node, "get_origin_node"):
        origin = node.get_origin_node()
    if origin is None:
        op = getattr(node, "op_overload", None)
        calls = [o for o in getattr(node, "origins", ()) if getattr(o, "target", None) is op] if op is not None else []
        origin = calls[0] if len(calls) == 1 else None
    if origin is None:
        return 0
    # a convolution's operands as compiled (Note [Operands as the backend lays them out])
    return scratch_bytes(origin, compiled_operand_strides(node) if op_name(origin) in MEASURED_OPS else None)


def _aliased(node: Any) -> str | None:
    """The buffer a fallback kernel's output shares, when its schema returns an alias of an
    input (remat's ``ready``, Note [Offload copies]; ``FallbackKernel.op_overload._schema``,
    ``get_inputs_that_alias_output``: ``versions.HOOKS["read_offload_copies"]``): it allocates
    nothing. None: it allocates."""
    op = getattr(node, "op_overload", None)
    if not isinstance(op, OpOverload):  # none, or a higher-order op (an RNG replay's): allocates
        return None
    if not hasattr(op, "_schema") or not hasattr(node, "get_inputs_that_alias_output"):
        drift("read_offload_copies", "OpOverload._schema, FallbackKernel.get_inputs_that_alias_output")
        return None
    returns = getattr(op._schema, "returns", None)
    if not returns or any(r.alias_info is None or r.alias_info.is_write for r in returns):
        return None
    names = list(node.get_inputs_that_alias_output())
    return names[0] if len(names) == 1 else None


def _on_host(node: Any) -> bool:
    """Whether a buffer lives in host memory (``get_device``): an offloaded value's host copy."""
    try:
        device = node.get_device()
    except Exception:  # noqa: BLE001 - a node without a device allocates none
        return False
    return getattr(device, "type", None) == "cpu"


def trace_of(graph: Any, lines: list[Any]) -> GraphTrace:
    """The ``GraphTrace`` of a planned wrapper (``graph``: its ``GraphLowering``)."""
    from torch._inductor import ir
    from torch._inductor.codegen import wrapper as w

    events: list[Event] = []
    unknown: list[str] = []
    results: dict[str, list[str]] = {}  # a fallback's name -> the outputs taken from its tuple
    for line in lines:
        if isinstance(line, w.MultiOutputLine):
            results.setdefault(str(line.arg_name), []).append(str(line.result_name))
    born: set[str] = set()
    # On a GPU, host buffers (an offloaded value's host copy) take none of the device's memory
    # (versions.HOOKS["read_offload_copies"]).
    if not hasattr(graph, "device_types"):
        drift("read_offload_copies", "GraphLowering.device_types")
    apart = any(t != "cpu" for t in getattr(graph, "device_types", ()))
    host: set[str] = set()

    def elsewhere(name: str, node: Any) -> bool:
        if apart and node is not None and _on_host(node):
            host.add(name)
        return name in host

    def size(node: Any) -> int:
        n = _nbytes(graph, node) if node is not None else None
        if n is None:
            unknown.append(f"size of {type(node).__name__}")
        return n or 0

    def buffer_bytes(name: str) -> int:
        return size(graph.get_buffer(name) if hasattr(graph, "get_buffer") else None)

    for line in lines:
        kind = type(line).__name__
        if isinstance(line, w.AllocateLine):
            events.append(Event("alloc", line.node.get_name(), size(line.node)))
        elif isinstance(line, w.ReuseLine):
            events.append(Event("reuse", line.reused_as.get_name(), size(line.reused_as),
                                other=line.node.get_name(), drop=bool(line.delete_old)))
        elif isinstance(line, w.ReinterpretLine):
            events.append(Event("reuse", line.reused_as.get_name(), 0, other=line.node.get_name(), drop=False))
        elif isinstance(line, w.FreeIfNotReusedLine):
            if not line.is_reused:
                events.append(Event("free", line.node.get_name()))
        elif isinstance(line, w.FreeLine):
            name = _name(line.node)
            if name is not None:
                events.append(Event("free", name))
        elif isinstance(line, w.ExternKernelAllocLine):
            # The kernel allocates its outputs (a tuple's items become buffers by MultiOutputLine),
            # unless they alias an input (then they name its storage).
            node = line.node
            name = node.get_name()
            multi = isinstance(node.layout, ir.MultiOutputLayout)
            shared = _aliased(node)
            items = results.get(name, []) if multi else []
            for r in (name, *items):
                if shared is not None:
                    if shared in host:
                        host.add(r)
                    else:
                        events.append(Event("reuse", r, 0, other=shared, drop=False))
                elif not elsewhere(r, node if r == name else _buffer(graph, r)):
                    events.append(Event("alloc", r, 0 if r == name and multi else
                                        size(node) if r == name else buffer_bytes(r)))
            born.update(items)
            events.append(Event("call", name, _scratch(node), label=name))
        elif isinstance(line, w.MultiOutputLine):
            r = line.result_name
            if r not in born and not elsewhere(r, _buffer(graph, r)):  # an item of a nested result
                events.append(Event("alloc", r, buffer_bytes(r)))
        elif isinstance(line, w.ExternKernelOutLine):
            events.append(Event("call", line.node.get_name(), _scratch(line.node), label=line.node.get_name()))
        elif isinstance(line, w.KernelCallLine):
            events.append(Event("call", label=str(line.kernel_name)))
        elif kind in _IN_PLACE:  # a fallback that writes into a buffer allocated before
            events.append(Event("call", label=kind))
        elif isinstance(line, w.WrapperLine) and kind not in _IGNORED:
            unknown.append(kind)
    inputs = tuple((name, 0 if apart and _on_host(v) else _input_bytes(graph, v))
                   for name, v in graph.graph_inputs.items())
    outputs = tuple(_name(o) for o in graph.graph_outputs)
    return GraphTrace(tuple(events), inputs, outputs, tuple(unknown))


@contextlib.contextmanager
def read_allocations(sink: Callable[[GraphTrace], None]) -> Iterator[None]:
    """Inside this context, each graph Inductor generates code for hands its ``GraphTrace`` to
    ``sink`` once its memory is planned (``PythonWrapperCodegen.run_wrapper_ir_passes``). If the
    hook cannot install, it warns and ``sink`` is never called (``versions.HOOKS["read_allocations"]``)."""
    try:
        from torch._inductor.codegen import wrapper as w
        from torch._inductor.virtualized import V
    except ImportError:  # pragma: no cover - a torch without Inductor's wrapper
        drift("read_allocations", "torch._inductor.codegen.wrapper")
        yield
        return
    missing = [n for n in ("AllocateLine", "ReuseLine", "FreeIfNotReusedLine", "FreeLine", "ReinterpretLine",
                           "ExternKernelAllocLine", "ExternKernelOutLine", "MultiOutputLine", "KernelCallLine",
                           "WrapperLine") if not hasattr(w, n)]
    cls = getattr(w, "PythonWrapperCodegen", None)
    if cls is None or not hasattr(cls, "run_wrapper_ir_passes"):
        missing.append("PythonWrapperCodegen.run_wrapper_ir_passes")
    if missing:
        drift("read_allocations", ", ".join(f"torch._inductor.codegen.wrapper.{m}" for m in missing))
        yield
        return
    original = cls.run_wrapper_ir_passes

    def run_wrapper_ir_passes(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            trace = trace_of(V.graph, list(self.lines))
        except Exception as e:  # noqa: BLE001 - a reading failure must never break compiling
            drift("read_allocations", f"a reader for a wrapper line Inductor generated ({type(e).__name__}: {e})")
        else:
            sink(trace)
        return result

    cls.run_wrapper_ir_passes = run_wrapper_ir_passes
    try:
        yield
    finally:
        cls.run_wrapper_ir_passes = original
