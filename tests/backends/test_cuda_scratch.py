"""Note [Measured library scratch]: the scratch of a CUDA library kernel is what its call
allocated above its start less what it returned, measured once per distinct call, inside the
allocator's nested peak windows (a budgeted graph's measuring window keeps its peak)."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from remat.backends import aten_scratch, cuda_scratch
from remat.peak_windows import PeakWindows

MiB = 2**20


class FakeAllocator:
    def __init__(self) -> None:
        self.now = self.top = 0

    def alloc(self, n: int) -> None:
        self.now += n
        self.top = max(self.top, self.now)

    def peak(self) -> int:
        return self.top

    def reset_peak(self) -> None:
        self.top = self.now

    def allocated(self) -> int:
        return self.now

    def retries(self) -> int:
        return 0


def kernel(a: FakeAllocator, scratch: int, output: int, calls: list[int], operands: int = 0):
    """A library call's maker: allocates the call's ``operands``, then returns the call, which
    takes ``scratch`` while it runs and returns an ``output`` it keeps."""
    def prepare():
        a.alloc(operands)

        def run() -> str:
            calls.append(1)
            a.alloc(scratch)
            a.alloc(output)
            a.alloc(-scratch)
            return "out"
        return run
    return prepare


def test_scratch_is_the_calls_peak_above_its_start_less_what_it_returned():
    a, calls = FakeAllocator(), []
    a.alloc(500 * MiB)  # what the step holds already
    windows = PeakWindows(a)
    got = cuda_scratch.measure_scratch(kernel(a, 187 * MiB, 23 * MiB, calls), windows, a.allocated)
    assert got == 187 * MiB
    assert len(calls) == 2, "one warm-up call, one measured"


def test_the_calls_operands_are_not_its_scratch():
    """The probe makes its operands before it measures: a convolution that holds nothing beyond
    its output measures 0, however large its input (the probe once counted the operands it made
    inside the measured call: 294 MiB for an EfficientNet-B0 convolution that held none)."""
    a, calls = FakeAllocator(), []
    windows = PeakWindows(a)
    assert cuda_scratch.measure_scratch(kernel(a, 0, 73 * MiB, calls, operands=294 * MiB), windows,
                                        a.allocated) == 0
    assert cuda_scratch.measure_scratch(kernel(a, 40 * MiB, 14 * MiB, calls, operands=28 * MiB), windows,
                                        a.allocated) == 40 * MiB


def test_a_window_open_around_the_probe_keeps_the_probes_peak():
    a, calls = FakeAllocator(), []
    windows = PeakWindows(a)
    outer = windows.open()
    a.alloc(100)
    cuda_scratch.measure_scratch(kernel(a, 1000, 10, calls), windows, a.allocated)
    # the warm-up call peaked at 100 + 1010; its output freed by nobody (a fake): the measured
    # call starts at 110 and peaks at 110 + 1010
    assert windows.close(outer) == 100 + 10 + 1000 + 10


def test_a_failed_call_counts_zero_and_closes_its_window():
    a, calls = FakeAllocator(), []
    windows = PeakWindows(a)

    def run() -> None:
        calls.append(1)
        if len(calls) == 2:  # the measured call runs out of memory
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    assert cuda_scratch.measure_scratch(lambda: run, windows, a.allocated) == 0
    assert windows.windows == [], "the measuring window was left open"

    def no_device() -> None:
        raise RuntimeError("Found no NVIDIA driver on your system")
    assert cuda_scratch.measure_scratch(no_device, windows, a.allocated) == 0, "making the operands failed"
    assert cuda_scratch.measure_scratch(lambda: no_device, windows, a.allocated) == 0


def conv_backward_node(graph: fx.Graph, batch: int) -> fx.Node:
    with FakeTensorMode():
        grad = torch.empty(batch, 96, 7, 7, device="cuda").to(memory_format=torch.channels_last)
        x = torch.empty(batch, 96, 7, 7, device="cuda").to(memory_format=torch.channels_last)
        w = torch.empty(96, 1, 5, 5, device="cuda")
    args = []
    for name, val in (("grad", grad), ("x", x), ("w", w)):
        p = graph.placeholder(f"{name}{batch}_{len(graph.nodes)}")
        p.meta["val"] = val
        args.append(p)
    return graph.call_function(torch.ops.aten.convolution_backward.default,
                               (*args, [0], [1, 1], [2, 2], [1, 1], False, [0, 0], 96, [True, True, False]))


def test_each_distinct_cuda_convolution_is_measured_once(monkeypatch: pytest.MonkeyPatch):
    measured = []

    def fake_measure(run, meter, allocated, sync=None):
        measured.append(run)
        return 5 * MiB * len(measured)
    monkeypatch.setattr(cuda_scratch, "_CACHE", {})
    monkeypatch.setattr(cuda_scratch.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_scratch, "device_meter", lambda device: None)
    monkeypatch.setattr(cuda_scratch, "measure_scratch", fake_measure)
    g = fx.Graph()
    first, same, other = conv_backward_node(g, 256), conv_backward_node(g, 256), conv_backward_node(g, 128)
    assert aten_scratch.scratch_bytes(first) == 5 * MiB
    assert aten_scratch.scratch_bytes(same) == 5 * MiB, "the same call: the cached measurement"
    assert aten_scratch.scratch_bytes(other) == 10 * MiB, "another shape: measured on its own"
    assert len(measured) == 2


def test_cpu_convolutions_keep_their_formula_and_are_not_run(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cuda_scratch.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_scratch, "measure_scratch", lambda *a, **k: pytest.fail("a CPU call was measured"))
    g = fx.Graph()
    grad, x, w = (g.placeholder(n) for n in ("grad", "x", "w"))
    grad.meta["val"], x.meta["val"] = torch.empty(2, 4, 8, 8), torch.empty(2, 4, 8, 8)
    w.meta["val"] = torch.empty(4, 4, 3, 3)
    node = g.call_function(torch.ops.aten.convolution_backward.default,
                           (grad, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False]))
    assert aten_scratch.scratch_bytes(node) == 2 * 2 * 4 * 8 * 8 * 4  # the output gradient and the input


def test_without_cuda_nothing_is_measured(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cuda_scratch.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cuda_scratch, "measure_scratch", lambda *a, **k: pytest.fail("measured without CUDA"))
    assert aten_scratch.scratch_bytes(conv_backward_node(fx.Graph(), 8)) == 0
