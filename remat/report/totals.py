"""The totals every report shows under its table.

Definitions (see Note [Bytes if everything were saved]):

* ``saved_bytes``: what this plan keeps for the backward (parameters excluded);
* ``eager_saved_bytes``: what eager autograd keeps for the same graph;
* ``activation_bytes``: bytes if everything were saved (below);
* ``recomputed_ops`` / ``recompute_flops`` / ``recompute_seconds``: the forward ops the backward
  computes again (an op a nested plan recomputes twice counts twice) and their estimated cost
  (``0`` where the cost model has no estimate).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan_data import PlanData, Role
from ..units import format_bytes, format_scaled

__all__ = ["Totals", "totals", "activation_bytes", "format_flops", "FORWARD_STATUSES"]

# Note [Bytes if everything were saved]
# The storage of every value the forward computes: nodes whose status is ``saved``,
# ``recomputed`` or ``forward``, minus views (reason ``view``: they share their base's storage)
# and minus graph inputs and parameters that are not saved (they live anyway). It is what a
# backward that recomputed nothing could read, an upper bound on what any plan saves and
# usually above what eager autograd keeps (autograd keeps only what the backward formulas
# read). Values computed only for the backward (``backward-only``) are not counted unless the
# plan saves them. A fallback plan has no nodes; its ``activation_bytes`` is ``None``.

FORWARD_STATUSES = ("saved", "recomputed", "forward")


def activation_bytes(plan: PlanData) -> int | None:
    """Bytes if everything were saved (see Note [Bytes if everything were saved])."""
    if not plan.nodes:
        return None
    total = 0
    for n in plan.nodes:
        if n.status == "saved" or (n.status in FORWARD_STATUSES and n.reason != "view"):
            total += n.nbytes
    return total


def format_flops(n: int) -> str:
    """``1.50 GFLOP``, ``12 FLOP``."""
    return format_scaled(n, (("PFLOP", 10**15), ("TFLOP", 10**12), ("GFLOP", 10**9), ("MFLOP", 10**6),
                             ("kFLOP", 10**3)), "FLOP")


@dataclass(frozen=True, slots=True)
class Totals:
    """The numbers under a plan's table."""

    saved_tensors: int
    """Saved values, parameters excluded."""
    free_saved: int
    """Parameters and buffers the backward reads (saved at no cost: they live anyway)."""
    saved_bytes: int
    eager_saved_bytes: int
    activation_bytes: int | None
    """Bytes if everything were saved; ``None`` for a fallback plan."""
    recomputed_ops: int
    recompute_flops: int
    recompute_seconds: float
    predicted_peak_bytes: int
    eager_peak_bytes: int
    peak_floor_bytes: int = 0
    """No remat plan for the graph has a smaller predicted peak (``Plan.peak_floor_bytes``)."""
    measured_peak_bytes: int = 0
    """The step's peak measured by the CUDA allocator under a budget (``Plan.measured_peak_bytes``)."""

    def peak_line(self) -> str:
        """One line on the step's predicted peak, or ``""`` when unknown (several graphs)."""
        if not self.predicted_peak_bytes:
            return ""
        if self.measured_peak_bytes:
            return (f"peak: measured {format_bytes(self.measured_peak_bytes)} on a training step by the CUDA "
                    f"allocator (eager autograd's predicted: {format_bytes(self.eager_peak_bytes)})")
        return (f"peak: predicted {format_bytes(self.predicted_peak_bytes)} for one training step (eager "
                f"autograd: {format_bytes(self.eager_peak_bytes)}; remat's model puts none of its plans under "
                f"{format_bytes(self.peak_floor_bytes)})")

    def line(self) -> str:
        """One line: ``totals: saved ...; eager autograd saves ...; ...``."""
        everything = "unknown" if self.activation_bytes is None else format_bytes(self.activation_bytes)
        return (f"totals: saved {format_bytes(self.saved_bytes)}; eager autograd saves "
                f"{format_bytes(self.eager_saved_bytes)}; saving every activation {everything}; "
                f"{self.recomputed_ops} ops recomputed, {format_flops(self.recompute_flops)} (estimated)")


def totals(plan: PlanData) -> Totals:
    """The totals of ``plan``."""
    return Totals(
        saved_tensors=sum(s.role is not Role.PARAMETER for s in plan.saved),
        free_saved=sum(s.role is Role.PARAMETER for s in plan.saved),
        saved_bytes=plan.saved_bytes,
        eager_saved_bytes=plan.eager_saved_bytes,
        activation_bytes=activation_bytes(plan),
        recomputed_ops=sum(plan.times()),
        recompute_flops=plan.recompute_flops,
        recompute_seconds=plan.recompute_seconds,
        predicted_peak_bytes=plan.predicted_peak_bytes,
        eager_peak_bytes=plan.eager_peak_bytes,
        peak_floor_bytes=plan.peak_floor_bytes,
        measured_peak_bytes=plan.measured_peak_bytes,
    )
