"""``remat.regime(model, *inputs)``: where one training step's time goes, measured with
torch.profiler: compute (matmul, convolution and attention kernels, with their achieved FLOP/s
against the device model's peak), bandwidth (every other kernel) and overhead (the step's time no
kernel covers). The lens of the seed article: recompute is nearly free in a bandwidth- or
overhead-bound step and costs matmul time in a compute-bound one.

On CUDA the kernels are the GPU's; on the CPU they are the top-level ATen ops, so code Inductor
generated in C++ (which the profiler does not see) counts as overhead there: read a CPU regime of
a compiled step as compute against the rest.

The step runs as training runs it (the model's forward, the loss's backward) after ``warmup``
steps that compile it, and the model is left as it was: parameters, buffers, ``.grad`` and the
random generators are restored (as ``remat.explain`` restores them). A remat-wrapped model that
is still measuring its candidate plans (``remat.tuning``) counts these steps among them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from .capture.probe import untouched
from .core.regime import KernelRun, Kind, Regime, kind_of, summarize
from .device import CPU, DEVICE_MODELS, H200, DeviceModel
from .errors import RematError

__all__ = ["regime"]


def _loss(out: Any) -> torch.Tensor:
    """The scalar a training step's backward starts from: ``out`` itself, its ``.loss`` (a
    Hugging Face output), or the sum of the first tensor it holds."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, dict):
        out = next(iter(out.values()), None)
    while isinstance(out, (tuple, list)) and out:
        out = out[0]
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise RematError(f"remat: regime needs a forward whose output (or its .loss) is a tensor that requires "
                         f"grad, got {type(out).__name__}. Pass loss_fn=lambda out: ... that returns the loss.")
    return out if out.dim() == 0 else out.float().sum()


def _device(model: Any, inputs: tuple, kwargs: dict) -> torch.device:
    for t in (*inputs, *kwargs.values()):
        if isinstance(t, torch.Tensor):
            return t.device
    params = getattr(model, "parameters", None)
    p = next(iter(params()), None) if callable(params) else None
    return p.device if p is not None else torch.device("cpu")


def _outermost_aten(event: Any) -> bool:
    """Whether a CPU event is an ATen op that no other ATen op called (the autograd engine's and
    a compiled region's ranges around it do not count)."""
    if not event.name.startswith("aten::"):
        return False
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return True


def _kernels(prof: Any, cuda: bool) -> tuple[list[KernelRun], float]:
    """The profiled step's kernels (GPU kernels on CUDA, top-level ATen ops on the CPU) and the
    FLOPs the profiler counted for the compute ATen ops (matmuls and convolutions; on CUDA the
    host-side ops that launched the kernels)."""
    events = prof.events()
    flops = float(sum(e.flops or 0 for e in events  # the profiler counts elementwise ops' FLOPs too
                      if e.device_type == torch.autograd.DeviceType.CPU and kind_of(e.name) is Kind.COMPUTE))
    runs = []
    for e in events:
        on_gpu = e.device_type == torch.autograd.DeviceType.CUDA
        if cuda != on_gpu or (not cuda and not _outermost_aten(e)):
            continue
        start, end = e.time_range.start * 1e-6, e.time_range.end * 1e-6
        if end > start:
            runs.append(KernelRun(e.name, start, end, float(e.flops or 0) if not cuda else 0.0))
    return runs, flops


def regime(model: Any, *inputs: Any, loss_fn: Callable[[Any], torch.Tensor] | None = None, warmup: int = 1,
           device_model: DeviceModel | str | None = None, **kwargs: Any) -> Regime:
    """The regime of one training step of ``model`` on these inputs (module docstring).
    ``loss_fn`` maps the forward's output to the loss (default: the output, its ``.loss``, or
    the sum of its first tensor); ``warmup`` steps run first (compiling); ``device_model``: the
    peaks the achieved rates are read against (default: H200's on CUDA, the CPU's otherwise)."""
    if not callable(model) or isinstance(model, type):
        raise RematError(f"remat: regime expects a model instance or a function, got {model!r}. "
                         "Call remat.regime(model, *example_inputs).")
    if not isinstance(warmup, int) or warmup < 0:
        raise RematError(f"remat: regime's warmup must be an int >= 0, got {warmup!r}.")
    if isinstance(device_model, str):
        if device_model not in DEVICE_MODELS:
            raise RematError(f"remat: unknown device model {device_model!r}; expected one of "
                             f"{sorted(DEVICE_MODELS)} or a remat.DeviceModel.")
        device_model = DEVICE_MODELS[device_model]
    device = _device(model, inputs, kwargs)
    cuda = device.type == "cuda"
    dev = device_model or (H200 if cuda else CPU)
    from torch.profiler import ProfilerActivity, profile

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def step() -> None:
        out = model(*inputs, **kwargs)
        (loss_fn(out) if loss_fn is not None else _loss(out)).backward()

    with untouched(model, inputs, kwargs):
        for _ in range(warmup):
            step()
        sync()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities, with_flops=True) as prof:
            t0 = time.perf_counter()
            step()
            sync()
            wall = time.perf_counter() - t0
    runs, flops = _kernels(prof, cuda)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    return summarize(runs, wall, dev.matmul_flops, dev.bandwidth, flops=flops, device=name)
