"""The scratch a CUDA library kernel allocates while it runs, measured on the device.

Note [Measured library scratch]
ATen's cuDNN convolutions ask PyTorch's caching allocator for their workspace on every call and
free it on return, so it adds to the step's peak while the kernel runs; neither the graph nor
Inductor's memory plan shows it. Its size is cuDNN's choice (the algorithm picked for these
shapes, strides, dtype and flags, by heuristics or, in benchmark mode, by timing), not a formula
of the shapes: depthwise backward kernels take the most. So on a CUDA device remat measures it:
the op runs on uninitialised tensors of the node's shapes, strides and dtypes, once to warm up
(benchmark mode tries its algorithms then) and once inside a window over the allocator's peak
(``remat.peak_windows``, which nests in a budgeted graph's measuring window). What the window
saw above its start, less what is still allocated at its close (the outputs), is the scratch.
Each distinct call (op, tensors' shapes, strides and dtypes, the other arguments, cuDNN's flags)
is measured once per process.

Found with ``benchmarks/mem_trace.py`` (H100, the oldest verified torch, bf16, default plans): the allocator's
peak was 118 MiB over Inductor's planned peak on MobileNetV3-Large and 106 MiB on ConvNeXt-T, the
blocks live at the peak that no planned buffer explains being held inside
``aten.convolution_backward`` of a depthwise convolution: 187.5 MiB for a 5 x 5 one at
(256, 960, 7, 7), 147 MiB for a 7 x 7 one at (128, 768, 7, 7), where the gradient they return
is 23 and 9 MiB.

The measurement can also run long: ATen's cuDNN path keeps only the plans whose workspace fits the
largest free block the caching allocator holds when a call's plan is chosen
(``Conv_v8.cpp: get_available_workspace``), so a call measured with much memory free may hold more
than it does inside a loaded step. Measured on an H100 (``benchmarks/README.md``, ``s15a``): the
depthwise nets' default plans now read within +1% of their measured peaks (-2.8% and -2.7% before),
but EfficientNet-B0 at ``budget=0.5``, whose plan recomputes 33 convolutions in the backward, read
2,121 MiB against 1,756 measured (the cause not traced yet). A budget is kept either way: the
plan's peak model folds the measured step in (Note [Measured budget peak]).

Where it cannot be measured (no CUDA device, a symbolic size, the call failing or out of memory)
it counts as 0: the prediction is then short by it, and a budget is still kept by the measured step
(Note [Measured budget peak]).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from .. import compat
from ..analysis.ops import op_name
from ..peak_windows import Meter, device_meter

__all__ = ["MEASURED_OPS", "cuda_library_scratch", "measure_scratch"]

MEASURED_OPS = frozenset({"aten.convolution.default", "aten.convolution_backward.default"})
"""The ops whose CUDA scratch is measured (cuDNN's convolutions)."""

_CACHE: dict[tuple, int] = {}


def cuda_library_scratch(node: fx.Node) -> int:
    """Scratch bytes ``node``'s CUDA library kernel allocates while it runs (Note [Measured
    library scratch]); 0 for other ops, off CUDA or where it cannot be measured."""
    if op_name(node) not in MEASURED_OPS or not torch.cuda.is_available():
        return 0
    call = _call(node)
    if call is None:
        return 0
    key, device, make_args = call
    if key not in _CACHE:
        op = node.target
        _CACHE[key] = measure_scratch(lambda: op(*make_args()), device_meter(device),
                                      lambda: torch.cuda.memory_allocated(device), torch.cuda.synchronize)
    return _CACHE[key]


def measure_scratch(run: Callable[[], Any], meter: Meter, allocated: Callable[[], int],
                    sync: Callable[[], None] = lambda: None) -> int:
    """Bytes ``run`` allocates beyond what it returns: its second call's peak above the start of a
    window of ``meter``, less what the call left allocated (its result, held until the window
    closes; ``allocated`` reads the allocator); 0 when a call fails (the device out of memory, or
    no device: a CUDA build faking one)."""
    try:
        with compat.real_tensors(), torch.no_grad():
            run()  # warm-up: lazy initialisation, benchmark mode's trials
            sync()
            before = allocated()
            window = meter.open()
            try:
                out = run()
                sync()
                held = allocated() - before
            finally:
                above = meter.close(window)
            del out
    except RuntimeError:  # out of memory (torch.cuda.OutOfMemoryError), or no device to run on
        return 0
    return max(0, above - held)


def _call(node: fx.Node) -> tuple[tuple, torch.device, Callable[[], list[Any]]] | None:
    """(cache key, device, a maker of the op's arguments as real tensors) for ``node``, or None
    when one of its tensors is not on CUDA or has a symbolic size (or it has keyword arguments)."""
    specs: list[Any] = []
    device = None
    if node.kwargs:
        return None
    for a in node.args:
        if isinstance(a, fx.Node):
            v = a.meta.get("val")
            if not isinstance(v, torch.Tensor) or v.device.type != "cuda":
                return None
            if any(isinstance(x, torch.SymInt) for x in (*v.shape, *v.stride())):
                return None  # a symbolic size: not measured (reading it as an int would guard on it)
            spec = (tuple(int(x) for x in v.shape), tuple(int(x) for x in v.stride()), v.dtype)
            device = v.device
            specs.append(("tensor", spec))
        elif any(isinstance(x, (torch.SymInt, fx.Node)) for x in (a if isinstance(a, (list, tuple)) else (a,))):
            return None
        else:
            specs.append(("value", tuple(a) if isinstance(a, list) else a))
    if device is None:
        return None
    flags = (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.backends.cudnn.allow_tf32)
    key = (op_name(node), tuple(specs), flags, device.index)

    def make() -> list[Any]:
        return [torch.empty_strided(s[1][0], s[1][1], dtype=s[1][2], device=device) if s[0] == "tensor"
                else (list(s[1]) if isinstance(s[1], tuple) else s[1]) for s in specs]

    return key, device, make
