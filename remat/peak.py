"""Peak activation memory of one training step under a plan. Pure Python: no torch import.

The step is simulated on the joint graph, value by value, the way the partitioned modules run:

1. Forward: every op a forward output or a saved value depends on, in graph order. A value is
   freed after its last forward use unless it is saved or a forward output.
2. Boundary: forward outputs stay alive to the end of the step (the caller holds them while it
   computes the loss and runs the backward); the incoming output gradients (tangents) are
   allocated and live to the end of the backward (the autograd Function's arguments hold them).
3. Backward: the backward ops in graph order; each op the backward computes from saved values
   alone (a recomputed forward op, an activation's derivative) is placed just before its first
   use. A value is freed after its last backward use; gradients (backward outputs) stay.

Views own no storage: a storage lives until the last use of any view of it. Graph inputs
(parameters and the caller's inputs) exist before the step and are not counted. The peak is the
largest sum of live storage bytes after any op.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Schedule", "PeakResult", "simulate", "backward_order", "lazy_order"]

T = TypeVar("T")


@dataclass(frozen=True)
class Schedule:
    """The joint graph for simulation. Nodes ``0..n-1`` in graph order.

    inputs: node ids each node reads. nbytes: storage bytes a node allocates (0 for views,
    inputs and non-tensors). root: the node owning a node's storage (itself unless a view).
    graph_input / tangent / backward: placeholders that exist before the step; output gradient
    placeholders; nodes that depend on a tangent. fwd_outputs / bwd_outputs: node ids returned
    by the forward and the backward. names: for reports.
    """

    inputs: tuple[tuple[int, ...], ...]
    nbytes: tuple[int, ...]
    root: tuple[int, ...]
    graph_input: frozenset[int]
    tangent: frozenset[int]
    backward: frozenset[int]
    fwd_outputs: tuple[int, ...]
    bwd_outputs: tuple[int, ...]
    names: tuple[str, ...] = ()

    @property
    def n(self) -> int:
        return len(self.inputs)


@dataclass(frozen=True)
class PeakResult:
    peak_bytes: int
    """Largest live activation bytes at any point of the step."""
    at: str
    """The op after which the peak occurs (``"forward:<name>"`` or ``"backward:<name>"``)."""
    boundary_bytes: int
    """Live bytes at the forward/backward boundary (saved values and outputs)."""
    forward_peak_bytes: int = 0
    """Largest live bytes during the forward."""


def _ancestors(s: Schedule, seeds: set[int], stop: set[int]) -> set[int]:
    out: set[int] = set()
    stack = [v for v in seeds]
    while stack:
        v = stack.pop()
        if v in out:
            continue
        out.add(v)
        stack.extend(u for u in s.inputs[v] if u not in out and u not in stop)
    return out


def lazy_order(anchors: Iterable[T], inputs: Callable[[T], Sequence[T]], movable: Callable[[T], bool]) -> list[T]:
    """``anchors`` in their order, each preceded by those of its inputs (recursively) that are
    ``movable`` and not yet placed: every movable op lands just before its first use. Shared by
    the simulator and by the backward module's ordering (``partition.place_recompute``)."""
    emitted: set[T] = set()
    order: list[T] = []
    for a in anchors:
        stack = [(a, False)]
        while stack:
            x, ready = stack.pop()
            if x in emitted:
                continue
            if ready:
                emitted.add(x)
                order.append(x)
                continue
            stack.append((x, True))
            stack.extend((u, False) for u in reversed(inputs(x)) if u not in emitted and movable(u))
    return order


def backward_order(s: Schedule, saved: set[int]) -> list[int]:
    """Backward ops in execution order: tangent-dependent ops in graph order, each op computed
    from saved values alone placed just before its first use."""
    available = set(saved) | set(s.graph_input) | set(s.tangent)
    anchors = [v for v in range(s.n) if v in s.backward and v not in s.tangent]
    anchors += [v for v in s.bwd_outputs if v not in available]
    return lazy_order(anchors, lambda v: s.inputs[v], lambda u: u not in available)


def simulate(s: Schedule, saved: set[int]) -> PeakResult:
    """Peak live bytes of a step that saves ``saved`` (node ids) for the backward."""
    pre = set(s.graph_input)
    fwd = sorted(_ancestors(s, set(s.fwd_outputs) | set(saved), pre | set(s.tangent)) - pre)
    bwd = backward_order(s, saved)
    in_bwd = set(bwd) | set(s.tangent)
    # A value recomputed in the backward is a second instance: key (node, 1); forward ones (node, 0).
    timeline = [((v, 0), "forward") for v in fwd] + [((v, 1), "backward") for v in sorted(s.tangent)]
    timeline += [((v, 1), "backward") for v in bwd]
    boundary = len(fwd)

    def storage(u: int, phase: int) -> tuple[int, int]:
        r = s.root[u]
        return (r, 1) if phase and u in in_bwd and r in in_bwd else (r, 0)

    end = len(timeline)
    last_use: dict[tuple[int, int], int] = {}
    for t, ((v, phase), _) in enumerate(timeline):
        for u in s.inputs[v]:
            last_use[storage(u, phase)] = t
    for v in s.fwd_outputs:
        last_use[storage(v, 0)] = end
    for v in (*s.bwd_outputs, *s.tangent):  # the autograd Function holds its grads to the end
        last_use[storage(v, 1)] = end
    for v in saved:  # saved values live at least to the boundary
        k = storage(v, 0)
        last_use[k] = max(last_use.get(k, 0), boundary)
    frees: dict[int, list[int]] = {}
    for t, ((v, phase), _) in enumerate(timeline):
        if s.nbytes[v] and s.root[v] == v and v not in pre:
            frees.setdefault(max(last_use.get((v, phase), t), t), []).append(s.nbytes[v])
    live = peak = at_boundary = fwd_peak = 0
    at = "nothing"
    for t, ((v, _phase), where) in enumerate(timeline):
        if t == boundary:
            at_boundary, fwd_peak = live, peak
        if s.nbytes[v] and s.root[v] == v and v not in pre:
            live += s.nbytes[v]
        if live > peak:
            peak, at = live, f"{where}:{s.names[v] if s.names else v}"
        live -= sum(frees.get(t, ()))
    if boundary == end:
        at_boundary, fwd_peak = live, peak
    return PeakResult(peak, at, at_boundary, fwd_peak)
