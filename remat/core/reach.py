"""Reachability over a graph given as a successor function. Pure: no torch import.

One helper for every "everything reachable from these seeds" walk in remat: the forward values
a graph's outputs depend on (``graph.analyze``), the ops a simulated step runs
(``peak.simulate``), the activations of a segment plan (``planner``), and whether a
normalisation reaches the next reduction (``graph``)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

__all__ = ["reachable"]

T = TypeVar("T", bound=Hashable)


def reachable(seeds: Iterable[T], step: Callable[[T], Iterable[T]], *, stop: Callable[[T], bool] | None = None,
              include_seeds: bool = True) -> set[T]:
    """Every node reachable from ``seeds`` by following ``step`` (seeds included unless
    ``include_seeds`` is False). A node for which ``stop`` is true is reached but not expanded."""
    seen: set[T] = set()
    stack = list(seeds) if include_seeds else [u for s in seeds for u in step(s)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if stop is not None and stop(n):
            continue
        stack.extend(u for u in step(n) if u not in seen)
    return seen
