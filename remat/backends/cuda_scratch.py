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

The call's operands are made before anything is measured, and laid out as the backend passes them
(Note [Operands as the backend lays them out] in ``remat.backends.inductor.extern_layouts``). Made
inside the measured call, as they first were, they counted as its scratch: found with
``benchmarks/scratch_check.py`` (H100, the oldest verified torch, EfficientNet-B0 at ``budget=0.5``,
each convolution the compiled step runs wrapped and measured in place), the forward convolutions
held nothing beyond their outputs where the probe had measured their inputs (294 MiB for one at
(128, 96, 112, 112)), and a depthwise backward at (128, 1152, 7, 7) held 40.5 MiB where the probe
measured 68.5 (its two 13.8 MiB operands more). That plan, recomputing 33 convolutions in the
backward, had read 2,121 MiB against 1,756 measured.

Where it cannot be measured (no CUDA device, a symbolic size, the call failing or out of memory)
it counts as 0: the prediction is then short by it, and a budget is still kept by the measured step
(Note [Measured budget peak]).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from .. import compat
from ..analysis.ops import op_name
from ..peak_windows import Meter, device_meter

__all__ = ["MEASURED_OPS", "call_key", "cuda_library_scratch", "measure_call", "measure_scratch"]

MEASURED_OPS = frozenset({"aten.convolution.default", "aten.convolution_backward.default"})
"""The ops whose CUDA scratch is measured (cuDNN's convolutions)."""

_CACHE: dict[tuple, int] = {}


Strides = Sequence[tuple[int, ...] | None]
"""The strides a backend passes the kernel, one entry per tensor argument in order (None: its
traced strides)."""


def cuda_library_scratch(node: fx.Node, strides: Strides | None = None) -> int:
    """Scratch bytes ``node``'s CUDA library kernel allocates while it runs (Note [Measured
    library scratch]), its tensor arguments laid out with ``strides`` where given (the layouts
    the backend passes it: Note [Operands as the backend lays them out]), else as traced; 0 for
    other ops, off CUDA or where it cannot be measured."""
    if op_name(node) not in MEASURED_OPS or not torch.cuda.is_available():
        return 0
    call = _call(node, strides)
    if call is None:
        return 0
    key, device, specs = call
    if key not in _CACHE:
        _CACHE[key] = measure_call(node.target, specs, device)
    return _CACHE[key]


def call_key(op: str, specs: tuple, device: torch.device) -> tuple:
    """The key one measurement is kept under: the op's name, its arguments' ``specs`` (a tensor's
    ``("tensor", (shape, strides, dtype))``, another argument's ``("value", value)``, a list as a
    tuple), cuDNN's flags and the device."""
    flags = (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.backends.cudnn.allow_tf32)
    return (op, specs, flags, device.index)


def measure_call(op: Callable[..., Any], specs: tuple, device: torch.device) -> int:
    """The scratch of ``op`` on ``device``, called on uninitialised tensors of its arguments'
    ``specs`` (``call_key``'s) made before it is measured (``measure_scratch``)."""
    def prepare() -> Callable[[], Any]:
        args = [torch.empty_strided(s[1][0], s[1][1], dtype=s[1][2], device=device) if s[0] == "tensor"
                else (list(s[1]) if isinstance(s[1], tuple) else s[1]) for s in specs]
        return lambda: op(*args)
    return measure_scratch(prepare, device_meter(device), lambda: torch.cuda.memory_allocated(device),
                           torch.cuda.synchronize)


def measure_scratch(prepare: Callable[[], Callable[[], Any]], meter: Meter, allocated: Callable[[], int],
                    sync: Callable[[], None] = lambda: None) -> int:
    """Bytes a call allocates beyond what it returns: ``prepare()`` makes its arguments (before
    anything is measured: they are the step's, not the call's) and returns the call; its second
    run's peak above the start of a window of ``meter``, less what the run left allocated (its
    result, held until the window closes; ``allocated`` reads the allocator); 0 when a call fails
    (the device out of memory, or no device: a CUDA build faking one)."""
    try:
        with compat.real_tensors(), torch.no_grad():
            run = prepare()
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
            del out, run
    except RuntimeError:  # out of memory (torch.cuda.OutOfMemoryError), or no device to run on
        return 0
    return max(0, above - held)


def _call(node: fx.Node, strides: Strides | None = None) -> tuple[tuple, torch.device, tuple] | None:
    """(cache key, device, its arguments' specs: ``call_key``'s) for ``node``, or None
    when one of its tensors is not on CUDA or has a symbolic size (or it has keyword arguments).
    ``strides``: the tensor arguments' strides where they differ from the traced ones."""
    specs: list[Any] = []
    device = None
    if node.kwargs:
        return None
    given = list(strides or ())
    for a in node.args:
        if isinstance(a, fx.Node):
            v = a.meta.get("val")
            if not isinstance(v, torch.Tensor) or v.device.type != "cuda":
                return None
            if any(isinstance(x, torch.SymInt) for x in (*v.shape, *v.stride())):
                return None  # a symbolic size: not measured (reading it as an int would guard on it)
            laid = given.pop(0) if given else None
            laid = laid if laid is not None and len(laid) == v.dim() else None
            spec = (tuple(int(x) for x in v.shape), tuple(int(x) for x in (laid if laid is not None else v.stride())),
                    v.dtype)
            device = v.device
            specs.append(("tensor", spec))
        elif any(isinstance(x, (torch.SymInt, fx.Node)) for x in (a if isinstance(a, (list, tuple)) else (a,))):
            return None
        else:
            specs.append(("value", tuple(a) if isinstance(a, list) else a))
    if device is None:
        return None
    return call_key(op_name(node), tuple(specs), device), device, tuple(specs)
