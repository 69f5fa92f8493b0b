"""Offloading saved values to host memory, hidden behind compute. Pure Python: no torch import.

A saved value can leave the device after its last forward use and come back before its first
backward use: a copy to pinned host memory on one side stream, a copy back on another, both
overlapped with compute. ``schedule`` times the copies of a given set of values on the step's
timeline; ``hidden`` chooses which values to offload so that no copy makes compute wait.

Note [Offload timeline]
~~~~~~~~~~~~~~~~~~~~~~~
The step is ``seconds``, one estimate per op in execution order (the forward, then the backward
from op ``boundary``); op ``i`` runs from ``start[i]`` (the sum of the ops before it) to
``end[i]``. One device-to-host (D2H) and one host-to-device (H2D) stream each run their copies
one after another, in parallel with compute; ``b`` bytes take ``b / bandwidth`` seconds.

- Copy-out: issued when op ``ready`` ends, in ``ready`` order (ties by node), it starts when the
  D2H stream is free. The device storage is freed when it ends: during op ``freed_after``, the
  first op from ``ready`` on that ends at or after it (``len(seconds)`` if it ends after the step).
- Copy-in: as late as possible. H2D runs in ``needed`` order (ties by node), scheduled backwards
  from the latest: each copy ends when its op starts or when the next copy starts, whichever is
  first. A copy-in never starts before its value's copy-out ended nor before the previous copy-in
  ended; where that pushes its end past its op's start, the difference is its ``stall``. Storage
  is allocated when the copy-in starts, counted from the start of op ``reloaded_at``, the last op
  that starts at or before it.
- The value is absent from the device during ops ``freed_after + 1 .. reloaded_at - 1``
  (``Entry.absent``). It lives on the host from its copy-out to the end of the step, so the host
  peak is the sum of the offloaded bytes.

Stalls are reported, not simulated: later ops are not delayed by a late copy. ``hidden`` keeps
only schedules without stalls, where that is exact.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

__all__ = ["Link", "OffloadCandidate", "Entry", "OffloadSchedule", "schedule", "hidden"]

_EPS = 1e-9
"""Relative to the step's length: a copy ending within rounding of an op's end ends with it."""


@dataclass(frozen=True, slots=True)
class Link:
    """The host link: bytes per second device-to-host (``d2h``) and host-to-device (``h2d``), and
    the host's seconds to issue one value's copies and their waits (``issue_seconds``, Note
    [Copies the host issues])."""

    d2h: float
    h2d: float
    issue_seconds: float = 0.0

    def __post_init__(self) -> None:
        for name, bw in (("d2h", self.d2h), ("h2d", self.h2d)):
            if not bw > 0:
                raise ValueError(f"remat: link bandwidth {name} must be > 0 bytes/s, got {bw!r}")
        if not (self.issue_seconds >= 0 and math.isfinite(self.issue_seconds)):
            raise ValueError(f"remat: issue_seconds must be finite and >= 0, got {self.issue_seconds!r}")

    def worth_a_copy(self, nbytes: int) -> bool:
        """Whether the link carries ``nbytes`` each way for at least as long as the host takes to
        issue the copies (Note [Copies the host issues])."""
        return nbytes / max(self.d2h, self.h2d) >= self.issue_seconds


# Note [Copies the host issues]
# Every offloaded value costs the host the same few calls a step whatever its bytes (issuing the
# copy out, the copy back and the waits for them), ``Link.issue_seconds``, measured on the device.
# The timeline above is the device's: it hides a copy behind compute, not the host's time to issue
# it, and a step the host already bounds (small kernels, many of them) takes that time on top. So
# a plan pays each offloaded value's issue time in its time cost (``PlanData.cost_seconds``), and
# ``hidden`` keeps only values the link carries for at least as long as the host takes to issue
# them (``Link.worth_a_copy``): below that, offloading many values makes the host, not the link,
# what the copies wait for. With ``issue_seconds`` 0 every value is worth a copy.


@dataclass(frozen=True, slots=True)
class OffloadCandidate:
    """A saved value that may be offloaded. ``node``: its id (a key, opaque here). ``ready``: the
    op of its last forward use (the copy-out may start when it ends). ``needed``: the op of its
    first backward use (the copy-in must end before it starts). ``ready < boundary <= needed``."""

    node: int
    nbytes: int
    ready: int
    needed: int


@dataclass(frozen=True, slots=True)
class Entry:
    """One offloaded value: its copies' (start, end) seconds, where its storage is freed and
    allocated again (op indices, Note [Offload timeline]) and how late its copy-in ends."""

    node: int
    nbytes: int
    out_start: float
    out_end: float
    in_start: float
    in_end: float
    freed_after: int
    reloaded_at: int
    stall: float

    @property
    def absent(self) -> range:
        """The ops during which the value takes no device memory (empty: the offload saves nothing)."""
        return range(self.freed_after + 1, self.reloaded_at)


@dataclass(frozen=True, slots=True)
class OffloadSchedule:
    """The offloaded values in copy-out order, their total stall and the host bytes they take."""

    entries: tuple[Entry, ...] = ()
    stall_seconds: float = 0.0
    host_peak_bytes: int = 0

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(e.node for e in self.entries)

    def describe(self) -> str:
        """One line per value: bytes, copy-out and copy-in in ms, where it is freed and reloaded."""
        return "\n".join(
            f"node {e.node}: {e.nbytes} B, out {e.out_start * 1e3:.3f}-{e.out_end * 1e3:.3f} ms, "
            f"in {e.in_start * 1e3:.3f}-{e.in_end * 1e3:.3f} ms, freed after op {e.freed_after}, "
            f"reloaded at op {e.reloaded_at}" + (f", stall {e.stall * 1e3:.3f} ms" if e.stall else "")
            for e in self.entries) or "nothing offloaded"


def schedule(cands: Iterable[OffloadCandidate], seconds: Sequence[float], boundary: int,
             link: Link) -> OffloadSchedule:
    """Times the copies of every value in ``cands`` (any order; Note [Offload timeline]),
    stalls included. Deterministic."""
    cands = tuple(cands)
    _check(cands, seconds, boundary)
    return _Timeline(seconds, link).schedule(cands)


def hidden(cands: Iterable[OffloadCandidate], seconds: Sequence[float], boundary: int,
           link: Link) -> OffloadSchedule:
    """The values to offload so that no copy stalls compute and each one is absent from the
    device for at least one op, among those worth a copy (``Link.worth_a_copy``, Note [Copies
    the host issues]). Greedy, not optimal: candidates by descending bytes (ties by node), each
    kept when the schedule with it still has no stall and every kept value is still absent
    somewhere; a value that would break that is skipped and the next one tried."""
    cands = tuple(cands)
    _check(cands, seconds, boundary)
    line = _Timeline(seconds, link)  # the op times once: each trial only re-times the copies
    chosen: list[OffloadCandidate] = []
    best = OffloadSchedule()
    for c in sorted(cands, key=lambda c: (-c.nbytes, c.node)):
        if c.nbytes <= 0 or not link.worth_a_copy(c.nbytes):
            continue
        trial = line.schedule((*chosen, c))
        if trial.stall_seconds == 0 and all(e.absent for e in trial.entries):
            chosen.append(c)
            best = trial
    return best


class _Timeline:
    """The step's op times (Note [Offload timeline]), computed once for any number of schedules."""

    def __init__(self, seconds: Sequence[float], link: Link):
        self.start = [0.0, *accumulate(seconds)][:-1]
        self.end = list(accumulate(seconds))
        self.eps = _EPS * self.end[-1]
        self.link = link

    def schedule(self, cands: Sequence[OffloadCandidate]) -> OffloadSchedule:
        start, end, eps = self.start, self.end, self.eps
        outs = _copy_out(cands, end, self.link.d2h)
        ins = _copy_in(cands, start, self.link.h2d, outs)
        entries = []
        for c in sorted(cands, key=lambda c: (c.ready, c.node)):
            (out_start, out_end), (in_start, in_end) = outs[c.node], ins[c.node]
            late = in_end - start[c.needed]
            entries.append(Entry(c.node, c.nbytes, out_start, out_end, in_start, in_end,
                                 freed_after=bisect_left(end, out_end - eps, lo=c.ready),
                                 reloaded_at=bisect_right(start, in_start + eps) - 1,
                                 stall=late if late > eps else 0.0))
        return OffloadSchedule(tuple(entries), sum(e.stall for e in entries), sum(c.nbytes for c in cands))


def _copy_out(cands: Sequence[OffloadCandidate], end: Sequence[float], d2h: float) -> dict[int, tuple[float, float]]:
    """(start, end) of each value's copy-out: FIFO on the D2H stream, issued when ``ready`` ends."""
    free, times = 0.0, {}
    for c in sorted(cands, key=lambda c: (c.ready, c.node)):
        s = max(end[c.ready], free)
        free = s + c.nbytes / d2h
        times[c.node] = (s, free)
    return times


def _copy_in(cands: Sequence[OffloadCandidate], start: Sequence[float], h2d: float,
             outs: dict[int, tuple[float, float]]) -> dict[int, tuple[float, float]]:
    """(start, end) of each value's copy-in: the latest serial schedule, scheduled backwards from
    the last ``needed``, then pushed later where a copy-out or the previous copy-in is not done."""
    order = sorted(cands, key=lambda c: (c.needed, c.node))
    latest, nxt = {}, math.inf
    for c in reversed(order):
        e = min(start[c.needed], nxt)
        nxt = e - c.nbytes / h2d
        latest[c.node] = (nxt, e)
    times, free = {}, 0.0
    for c in order:
        s, e = latest[c.node]
        earliest = max(outs[c.node][1], free)
        if s < earliest:  # kept exact otherwise: no rounding turns a hidden copy into a stall
            s, e = earliest, earliest + c.nbytes / h2d
        times[c.node] = (s, e)
        free = e
    return times


def _check(cands: Sequence[OffloadCandidate], seconds: Sequence[float], boundary: int) -> None:
    n = len(seconds)
    if any(not (t >= 0 and math.isfinite(t)) for t in seconds):
        raise ValueError(f"remat: op seconds must be finite and >= 0, got {list(seconds)!r}")
    if not 0 < boundary < n:
        raise ValueError(f"remat: boundary must be in 1..{n - 1} (forward and backward ops), got {boundary}")
    if len({c.node for c in cands}) != len(cands):
        raise ValueError("remat: offload candidates must have distinct nodes")
    for c in cands:
        if not 0 <= c.ready < boundary <= c.needed < n:
            raise ValueError(f"remat: offload candidate {c.node} needs 0 <= ready < boundary <= needed < {n} "
                             f"(boundary {boundary}), got ready={c.ready}, needed={c.needed}")
        if c.nbytes < 0:
            raise ValueError(f"remat: offload candidate {c.node} has negative nbytes {c.nbytes}")
