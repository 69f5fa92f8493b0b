"""Nested windows over a CUDA device's allocator peak: the peak bytes above a window's start,
whatever other windows open and close inside it (Note [Measured budget peak] in
``remat.capture.budget_guard``; the measured scratch of library kernels,
``remat.backends.cuda_scratch``, opens one while a budgeted graph's window may be open).

The allocator keeps one peak counter per device, which only ``torch.cuda.reset_peak_memory_stats``
lowers. Each window opens by folding the current peak into every window still open and resetting
the counter (``PeakWindows``), so windows nest (a later graph's inside an earlier one's) without
losing a peak. After a window ``torch.cuda.max_memory_allocated()`` counts from the last window's
start, not from the process's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

__all__ = ["Meter", "Allocator", "CudaAllocator", "PeakWindows", "meter_for", "device_meter"]


@dataclass
class _Window:
    base: int
    peak: int = 0
    retries: int = 0
    """The allocator's retry count at the window's start, then (closed) the retries during it."""


class Meter(Protocol):
    """Opens a measuring window and closes it, returning the peak bytes above its start."""

    def open(self) -> Any: ...

    def close(self, window: Any) -> int: ...

    def retries(self, window: Any) -> int:
        """After ``close``: the allocations the allocator retried during the window (Note
        [Allocator retries at the limit] in ``remat.capture.allocator``)."""
        ...


class Allocator(Protocol):
    """The readings of a device allocator the windows use (``CudaAllocator``)."""

    def peak(self) -> int: ...

    def reset_peak(self) -> None: ...

    def allocated(self) -> int: ...

    def retries(self) -> int:
        """Allocations retried after freeing the cache, since the process started."""
        ...


@dataclass(frozen=True)
class CudaAllocator:
    device: torch.device

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def retries(self) -> int:
        return int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0))


@dataclass
class PeakWindows:
    """Nested windows over one device allocator's peak (Note [Measured budget peak])."""

    allocator: Allocator
    windows: list[_Window] = field(default_factory=list)

    def _fold(self) -> None:
        peak = self.allocator.peak()
        for w in self.windows:
            w.peak = max(w.peak, peak)

    def open(self) -> _Window:
        self._fold()
        self.allocator.reset_peak()
        w = _Window(self.allocator.allocated(), retries=self.allocator.retries())
        w.peak = w.base
        self.windows.append(w)
        return w

    def close(self, window: _Window) -> int:
        self._fold()
        self.windows.remove(window)
        window.retries = self.allocator.retries() - window.retries
        return window.peak - window.base

    def retries(self, window: _Window) -> int:
        return window.retries


_METERS: dict[torch.device, PeakWindows] = {}


def device_meter(device: torch.device) -> PeakWindows:
    """The one set of windows over CUDA device ``device``'s allocator (windows nest only in one)."""
    device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return _METERS.setdefault(device, PeakWindows(CudaAllocator(device)))


def meter_for(example_inputs: list[Any]) -> Meter | None:
    """The meter of the CUDA device the graph's inputs are on; None off CUDA (nothing measured)."""
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return device_meter(t.device)
    return None
