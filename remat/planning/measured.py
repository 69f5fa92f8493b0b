"""Which of a graph's candidate plans are measured on the user's first training steps
(``remat.tuning``), besides the plan prediction chose (the default plan, or a budget's choice)
and torch.compile's own partition (``remat.capture.partition.make_stock_partition_fn``).

The prediction's ranking is what fails on models nobody tuned for (a depthwise-conv net ran a
smaller frontier plan faster than the default one): so the plans measured next to it are the
ones that save memory at the least estimated cost, the frontier's plans that are meaningfully
smaller than the chosen one (at most ``SMALLER`` of its predicted peak) and, under a budget,
fit it, taken in order of estimated recompute time (``measured_picks``); and, under a budget,
the faster plans the simulator put just over it where it over-predicted the choice's compile
(``faster_picks``, Note [Faster plans the simulator put over the budget]). Measurement then
keeps the smallest plan that is as fast as the fastest (``remat.core.selection``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..plan_data import PlanData

__all__ = ["measured_picks", "faster_picks", "SMALLER"]

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


# Note [Faster plans the simulator put over the budget]
# A budget's choice is the fastest plan whose simulated peak fits; where the simulator
# over-predicts what Inductor allocates, the plans just above the budget may fit as compiled,
# and they are the faster ones. On ResNet-50 in Inductor's CUDA lowering (``gpu_offline.py``,
# fake H100, the newest torch here) at a budget of 2,490 MiB the choice simulated 2,057 MiB and read
# 1,956 (+5.2%), while a plan of less estimated recompute simulated 2,521 MiB and read 2,463: it
# fits and was never compiled. The choice's own compile says how far the simulator is off on
# this graph, so under a budget tuning also compiles the frontier plans estimated faster than the
# choice whose simulated peak, scaled by the choice's read over its simulated peak, fits the
# budget (none where the simulator did not over-predict), fastest first; one is measured only if
# its own compile reads within the budget too (Note [Candidates under a budget] in
# ``remat.capture.tuned``), and the meter checks every measured step against the budget. What is
# measured, not the scale, decides: the scale only says which plans are worth a compile.


def faster_picks(chosen: PlanData, frontier: Sequence[PlanData], count: int,
                 budget_bytes: int | None) -> list[PlanData]:
    """Under a budget, up to ``count`` frontier plans estimated faster than ``chosen`` (compiled,
    its read peak in ``predicted_peak_bytes``) that the simulator put over ``budget_bytes`` by no
    more than it over-predicted ``chosen`` (Note [Faster plans the simulator put over the
    budget]); the least estimated time cost first."""
    if budget_bytes is None or not chosen.simulated_peak_bytes or count <= 0:
        return []
    scale = chosen.predicted_peak_bytes / chosen.simulated_peak_bytes
    if scale >= 1:
        return []
    out = [p for p in frontier if p.key != chosen.key and p.cost_seconds < chosen.cost_seconds
           and p.predicted_peak_bytes > budget_bytes and _scaled_peak(p, scale) <= budget_bytes]
    out.sort(key=lambda p: (p.cost_seconds, p.predicted_peak_bytes))
    return out[:count]


def _scaled_peak(plan: PlanData, scale: float) -> int:
    """``plan``'s simulated peak scaled by ``scale`` (the chosen plan's read over its simulated peak)."""
    return int((plan.simulated_peak_bytes or plan.predicted_peak_bytes) * scale)
