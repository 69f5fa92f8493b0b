"""Which of a graph's candidate plans are measured on the user's first training steps
(``remat.tuning``), besides the plan prediction chose (the default plan, or a budget's choice)
and torch.compile's own partition (``remat.capture.partition.make_stock_partition_fn``).

The prediction's ranking is what fails on models nobody tuned for (a depthwise-conv net ran a
smaller frontier plan faster than the default one): so the plans measured next to it are the
ones that save memory at the least estimated cost, the frontier's plans that are meaningfully
smaller than the chosen one (at most ``SMALLER`` of its predicted peak) and, under a budget,
fit it, taken in order of estimated recompute time. Measurement then keeps the smallest plan
that is as fast as the fastest (``remat.core.selection``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..plan_data import PlanData

__all__ = ["measured_picks", "SMALLER"]

SMALLER = 0.95
"""A frontier plan is worth measuring when its predicted peak is at most this fraction of the
chosen plan's."""


def measured_picks(chosen: PlanData, frontier: Sequence[PlanData], count: int,
                   budget_bytes: int | None = None) -> list[PlanData]:
    """Up to ``count`` frontier plans to measure beside ``chosen``: smaller by ``SMALLER`` at
    least, or estimated to beat it on both peak and time cost (a plan the default's cost rules
    kept from being the default: Note [The default at most eager's peak]), within
    ``budget_bytes`` if given; those that beat it first, then the least estimated time cost
    (ties to the smaller peak); never ``chosen`` itself."""
    limit = chosen.predicted_peak_bytes * SMALLER
    fits = [p for p in frontier if p.key != chosen.key
            and (p.predicted_peak_bytes <= limit or p.tradeoff.dominates(chosen.tradeoff))
            and (budget_bytes is None or p.predicted_peak_bytes <= budget_bytes)]
    fits.sort(key=lambda p: (not p.tradeoff.dominates(chosen.tradeoff), p.cost_seconds, p.predicted_peak_bytes))
    return fits[:count]
