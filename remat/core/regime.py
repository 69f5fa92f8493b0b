"""A training step's regime (the lens of the seed article): how much of the step's time is spent
in compute-bound kernels (matmuls, convolutions, attention), how much in the others (memory
bandwidth-bound: elementwise ops, reductions, copies) and how much is not covered by any kernel
(overhead: Python, dispatch, launches, synchronisation).

Pure and torch-free: ``summarize`` takes the kernels of one profiled step as intervals on the
device's clock and the step's wall time. Time covered by several kernels at once (two streams)
is counted once, for the first kind that covers it in ``Kind`` order, so that the three parts add
up to the step's time.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Kind", "KernelRun", "Regime", "summarize", "kind_of"]


class Kind(enum.Enum):
    """Which regime a kernel's time counts for."""

    COMPUTE = "compute"
    """Matmuls, convolutions, attention: bound by the device's matmul rate."""
    BANDWIDTH = "bandwidth"
    """Every other kernel: bound by memory bandwidth."""


_COMPUTE_WORDS = ("gemm", "matmul", "cublas", "cutlass", "nvjet", "xmma", "splitk", "conv", "fprop",
                  "dgrad", "wgrad", "winograd", "implicit_gemm", "flash", "fmha", "attention", "sdpa",
                  "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::_grouped_mm",
                  "aten::convolution", "mkldnn")


def kind_of(kernel: str) -> Kind:
    """A kernel's regime from its name: Inductor's generated kernels (``triton_*``, ``cpp_fused_*``)
    and every name without a matmul, convolution or attention word are bandwidth-bound."""
    k = kernel.lower()
    if k.startswith(("triton_", "cpp_fused")):  # Inductor's fused pointwise and reduction kernels
        return Kind.BANDWIDTH
    return Kind.COMPUTE if any(w in k for w in _COMPUTE_WORDS) else Kind.BANDWIDTH


@dataclass(frozen=True, slots=True)
class KernelRun:
    """One kernel run in a profiled step: its name, start and end (seconds, the device's clock),
    and the FLOPs it did where known (0: unknown)."""

    name: str
    start: float
    end: float
    flops: float = 0.0

    @property
    def kind(self) -> Kind:
        return kind_of(self.name)


@dataclass(frozen=True, slots=True)
class Regime:
    """Where one training step's time went (``remat.regime``)."""

    step_seconds: float
    compute_seconds: float
    bandwidth_seconds: float
    overhead_seconds: float
    """The step's time no kernel covers."""
    flops: float
    """FLOPs of the compute kernels where known (0: unknown)."""
    peak_flops: float
    peak_bandwidth: float
    kernels: int
    top: tuple[tuple[str, str, float, int], ...] = ()
    """The kernels that took longest: (name, kind, total seconds, runs), longest first."""
    device: str = ""

    @property
    def achieved_flops(self) -> float | None:
        """FLOP/s of the compute kernels (None when their FLOPs are unknown)."""
        return self.flops / self.compute_seconds if self.flops and self.compute_seconds else None

    @property
    def compute_fraction(self) -> float:
        return self.compute_seconds / self.step_seconds if self.step_seconds else 0.0

    @property
    def bandwidth_fraction(self) -> float:
        return self.bandwidth_seconds / self.step_seconds if self.step_seconds else 0.0

    @property
    def overhead_fraction(self) -> float:
        return self.overhead_seconds / self.step_seconds if self.step_seconds else 0.0

    @property
    def dominant(self) -> str:
        """``"compute"``, ``"bandwidth"`` or ``"overhead"``: the largest part."""
        parts = {"compute": self.compute_seconds, "bandwidth": self.bandwidth_seconds,
                 "overhead": self.overhead_seconds}
        return max(parts, key=parts.__getitem__)

    def __str__(self) -> str:
        ms = 1e3
        lines = [f"regime of one training step{f' on {self.device}' if self.device else ''}: "
                 f"{self.step_seconds * ms:.3f} ms, {self.dominant}-bound",
                 f"  compute   {self.compute_seconds * ms:9.3f} ms  {self.compute_fraction:6.1%}"
                 + (f"  {_rate(self.achieved_flops)} of the device model's {_rate(self.peak_flops)} "
                    f"({self.achieved_flops / self.peak_flops:.0%})" if self.achieved_flops else
                    "  (FLOPs not known for these kernels)"),
                 f"  bandwidth {self.bandwidth_seconds * ms:9.3f} ms  {self.bandwidth_fraction:6.1%}"
                 f"  (elementwise, reductions, copies; peak {self.peak_bandwidth / 1e9:.0f} GB/s)",
                 f"  overhead  {self.overhead_seconds * ms:9.3f} ms  {self.overhead_fraction:6.1%}"
                 "  (no kernel running: Python, dispatch, launches)",
                 f"  {self.kernels} kernel runs; longest:"]
        for name, kind, seconds, runs in self.top:
            lines.append(f"    {seconds * ms:9.3f} ms  {kind:9s} {runs:4d}x  {name[:90]}")
        return "\n".join(lines)


def _rate(flops_per_s: float) -> str:
    return f"{flops_per_s / 1e12:.1f} TFLOP/s" if flops_per_s >= 1e12 else f"{flops_per_s / 1e9:.1f} GFLOP/s"


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(intervals: Sequence[tuple[float, float]], taken: Sequence[tuple[float, float]]) -> float:
    """The length of ``intervals`` (merged) outside ``taken`` (merged)."""
    return _length(intervals) - _length(_union(
        (max(a, c), min(b, d)) for a, b in intervals for c, d in taken if min(b, d) > max(a, c)))


def summarize(kernels: Sequence[KernelRun], step_seconds: float, peak_flops: float, peak_bandwidth: float,
              *, flops: float | None = None, device: str = "", top: int = 8) -> Regime:
    """The regime of a step whose kernels are ``kernels`` and whose wall time is ``step_seconds``;
    ``flops``: the compute kernels' FLOPs counted elsewhere (by default the kernels' own)."""
    compute = _union((k.start, k.end) for k in kernels if k.kind is Kind.COMPUTE)
    other = _union((k.start, k.end) for k in kernels if k.kind is Kind.BANDWIDTH)
    compute_s = _length(compute)
    bandwidth_s = _minus(other, compute)
    busy = compute_s + bandwidth_s
    step = max(step_seconds, busy)
    totals: dict[str, list] = {}
    for k in kernels:
        t = totals.setdefault(k.name, [k.kind.value, 0.0, 0])
        t[1] += k.end - k.start
        t[2] += 1
    longest = sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]
    return Regime(step, compute_s, bandwidth_s, step - busy,
                  sum(k.flops for k in kernels if k.kind is Kind.COMPUTE) if flops is None else flops,
                  peak_flops, peak_bandwidth,
                  len(kernels), tuple((n, kind, s, c) for n, (kind, s, c) in longest), device)
