"""Choosing among candidate plans by measured time. Pure Python: no torch import.

Every candidate of a graph (remat's default plan, frontier plans, torch.compile's own partition)
computes the same gradients, so the first training steps can each run a different one: the step
that measures a candidate is a real training step. ``select`` then keeps the candidate of the
smallest peak among those whose median time is within ``tolerance`` of the fastest median: a
plan that saves memory is kept only when it costs (almost) no time, and the fastest candidate is
never more than ``tolerance`` away. Ties on peak go to the faster candidate, then to the earlier
one (candidates come in a fixed order, so the choice is deterministic).

A median over a few steps resists one slow step (a page fault, a late kernel launch); the first
step of each candidate, which compiles it, is never a sample (the caller drops it).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Measured", "Selection", "select", "DEFAULT_TOLERANCE"]

DEFAULT_TOLERANCE = 0.02
"""Keep the smallest-peak candidate whose median time is within 2% of the fastest median."""


@dataclass(frozen=True, slots=True)
class Measured:
    """One candidate's measurements: ``seconds`` of its timed steps (forward and backward of its
    graph), and its ``peak_bytes`` (read from the compiled step, or predicted)."""

    name: str
    seconds: tuple[float, ...]
    peak_bytes: int

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("inf")


@dataclass(frozen=True, slots=True)
class Selection:
    """The chosen candidate, by index into the measured list, and why."""

    index: int
    fastest: int
    """Index of the candidate with the smallest median time."""
    tolerance: float
    reason: str
    measured: tuple[Measured, ...] = field(default=())


def select(measured: Sequence[Measured], tolerance: float = DEFAULT_TOLERANCE) -> Selection:
    """The smallest-peak candidate whose median time is at most ``(1 + tolerance)`` times the
    fastest median (see the module docstring). Candidates without samples are never chosen,
    unless none has any (then the first one, remat's default plan by the caller's order)."""
    if not measured:
        raise ValueError("remat: internal error, select() needs at least one candidate; please report")
    if not tolerance >= 0:
        raise ValueError(f"remat: tolerance must be >= 0, got {tolerance!r}")
    timed = [k for k, m in enumerate(measured) if m.seconds]
    if not timed:
        return Selection(0, 0, tolerance, "no candidate was timed: the first one is kept", tuple(measured))
    fastest = min(timed, key=lambda k: (measured[k].median, k))
    limit = measured[fastest].median * (1 + tolerance)
    near = [k for k in timed if measured[k].median <= limit]
    chosen = min(near, key=lambda k: (measured[k].peak_bytes, measured[k].median, k))
    best, pick = measured[fastest], measured[chosen]
    if chosen == fastest:
        reason = f"{pick.name} is the fastest ({_ms(pick.median)} median)"
        others = [measured[k] for k in near if k != chosen]
        if others:
            reason += f" and no candidate within {tolerance:.0%} of it has a smaller peak"
    else:
        reason = (f"{pick.name}: {_ms(pick.median)} median, within {tolerance:.0%} of the fastest "
                  f"({best.name}, {_ms(best.median)}), with the smallest peak among those "
                  f"({_mib(pick.peak_bytes)} against {_mib(best.peak_bytes)})")
    return Selection(chosen, fastest, tolerance, reason, tuple(measured))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
