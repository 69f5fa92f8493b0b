"""The ``tune`` option: whether a graph's plan is chosen by measuring candidates on the user's
first training steps (Note [Tuning on the user's steps] in ``remat.capture.measure``), and how.

``tune="auto"`` (the default) measures on CUDA and predicts elsewhere: on a CPU the candidates'
compile time (Inductor's C++ compiles) costs more than any step they could save, and the tests
run there. ``tune=True`` measures on every device, ``tune=False`` never does (the default plan,
or the budget's choice by prediction), and ``tune=remat.Tuning(...)`` sets the details.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import RematError

__all__ = ["Tuning", "parse_tune", "TUNE_DEFAULT"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Tuning:
    """How candidates are measured and chosen."""

    devices: tuple[str, ...] = ("cuda",)
    """Device types whose graphs are measured (a graph on any other device keeps the
    prediction's plan). ``tune=True`` means every device."""

    samples: int = 3
    """Timed steps per candidate (after each candidate's first, untimed step)."""

    tolerance: float = 0.02
    """Keep the smallest-peak candidate whose median time is within this fraction of the fastest
    (``remat.core.selection``)."""

    frontier: int = 1
    """Frontier plans measured besides remat's default plan and torch.compile's own partition:
    the ones of smallest predicted peak among those whose estimated recompute time is close to
    the default plan's (under a budget: among those that fit)."""

    faster: int = 1
    """Under a budget, frontier plans measured besides those: the ones estimated faster than the
    budget's choice that the simulator put over the budget by no more than it over-predicted the
    choice's own compile, and whose own compile reads within it (Note [Faster plans the
    simulator put over the budget] in ``remat.planning.measured``)."""

    compile_candidate: bool = True
    """Measure torch.compile's own partition of the same graph too, so that the chosen plan is
    never measured slower than what torch.compile would run (beyond ``tolerance``)."""

    cache: bool = True
    """Keep each decision on disk and reuse it: the next run of the same script compiles only
    the chosen plan (``remat.planning.decision_cache``)."""

    cache_dir: str | None = None
    """Where decisions are kept; ``None``: ``$REMAT_CACHE_DIR``, else ``~/.cache/remat``."""

    def __post_init__(self) -> None:
        if not isinstance(self.samples, int) or isinstance(self.samples, bool) or self.samples < 1:
            raise RematError(f"remat: Tuning.samples must be an int >= 1, got {self.samples!r}. Example: "
                             "remat.Tuning(samples=3).")
        if not isinstance(self.tolerance, (int, float)) or isinstance(self.tolerance, bool) or not (
                0 <= self.tolerance < 1):
            raise RematError(f"remat: Tuning.tolerance must be a fraction in [0, 1), got {self.tolerance!r}. "
                             "Example: remat.Tuning(tolerance=0.02) keeps plans within 2% of the fastest.")
        if not isinstance(self.frontier, int) or isinstance(self.frontier, bool) or self.frontier < 0:
            raise RematError(f"remat: Tuning.frontier must be an int >= 0, got {self.frontier!r}.")
        if not isinstance(self.faster, int) or isinstance(self.faster, bool) or self.faster < 0:
            raise RematError(f"remat: Tuning.faster must be an int >= 0, got {self.faster!r}. Example: "
                             "remat.Tuning(faster=0) measures no plan the simulator put over the budget.")
        if isinstance(self.devices, str) or not all(isinstance(d, str) for d in self.devices):
            raise RematError(f"remat: Tuning.devices must be a tuple of device types such as ('cuda',), got "
                             f"{self.devices!r}.")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise RematError(f"remat: Tuning.cache_dir must be a path or None, got {type(self.cache_dir).__name__}.")

    def measures(self, device: str) -> bool:
        return "*" in self.devices or device in self.devices


TUNE_DEFAULT = Tuning()


def parse_tune(value: object) -> Tuning | None:
    """``"auto"`` -> measure on CUDA; ``True`` -> every device; ``False``/``None`` -> never; a
    ``Tuning`` as given."""
    if isinstance(value, Tuning):
        return value
    if value is False or value is None:
        return None
    if value is True:
        return Tuning(devices=("*",))
    if value == "auto":
        return TUNE_DEFAULT
    raise RematError(f"remat: tune must be 'auto', True, False or a remat.Tuning, got {value!r}. "
                     "Example: remat.checkpoint(model, tune=False) keeps the predicted plan without measuring.")
