"""Measuring candidate plans on the user's own training steps.

Note [Tuning on the user's steps]
Every candidate plan of a graph computes the same gradients, so the first training steps can
each run a different candidate: there is no extra step, nothing runs twice, and BatchNorm's
running statistics and the random generators advance exactly as they would with one plan. The
callable Dynamo runs for the graph (``TunedGraph``) takes the candidates round-robin; each call
times the graph's forward (from the call to its return) and its backward (from autograd's
pre-hook to its post-hook on the compiled function's backward node, both public
``torch.autograd.graph.Node`` hooks), with CUDA events on a GPU and the wall clock elsewhere.
A candidate's first call is never a sample (it may compile its backward). Once every candidate
has ``samples`` timed steps, ``remat.core.selection.select`` keeps one, the others are dropped,
and every later call runs the winner directly. A step whose backward never runs (inference under
``no_grad``, a forward without backward) is simply not a sample.

The decision is made at the start of the call after the last sample, when the events of every
measured step have been recorded: reading them waits for the GPU once.

Note [Windows a tuning graph runs inside]
Under a budget on CUDA each timed step's peak is measured too, over a window from the graph's
call to the end of its backward, and a graph the step runs after it falls inside that window
(Note [Measured budget peak]). While that later graph still measures its own candidates, the
window holds whichever of them ran. T5's first graph (of four, budget 0.75, H100) measured its
chosen plan at 13,352 MiB, and the step measured 12,603 once every graph had chosen: 749 MiB less,
about the 747 MiB by which the third graph's losing candidate (torch.compile's partition) measured
above its winner (an inference from the two tables, not a trace). So a
step during which another undecided graph (or this one again) ran is *mixed*: its time is a
sample, its peak is used only when a candidate has no clean one. A graph keeps measuring until
each candidate has a clean peak, which comes once the graphs inside its window have chosen,
or until a candidate has run ``PATIENCE`` times its samples (a graph inside that never decides).

Note [A candidate out of memory]
Under a hard cap on the device's memory (``torch.cuda.set_per_process_memory_fraction``, a
shared GPU) a candidate's step can run out of memory although its read peak fits the budget:
the read can miss what the step allocates (Note [Candidates under a budget] in
``remat.capture.tuned``). On an H100 under a 20 GiB cap, HF Llama at 88,064 tokens planned three
candidates and a step ran out of memory allocating 5.25 GiB, which ended the training. A
candidate other than the first (the plan prediction chose, which has run a step before any other
candidate runs) whose forward raises ``torch.OutOfMemoryError`` is dropped instead: the random
generators are put back as they were before the call (the partial forward may have drawn from
them; AOTAutograd applies a graph's input mutations, BatchNorm's statistics, only after its
forward returns), the failed call's tensors are released with the exception, and the same call
runs the next candidate. It is never measured or chosen, and the decision's reason names it. An
error in the first candidate's forward, or in any backward (autograd's engine raises it, past
this callable), is raised with a note naming the candidate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .. import compat
from ..core.selection import Measured, Selection, select
from .allocator import warn_retries

__all__ = ["Timer", "WallTimer", "CudaTimer", "TunedGraph", "timer_for", "PATIENCE"]

PATIENCE = 4
"""Timed steps per sample a candidate runs, at most, waiting for a clean peak (Note [Windows a
tuning graph runs inside])."""

_OPEN: list[Any] = []
"""The timed steps, of every ``TunedGraph``, whose peak window is open: their graph was called and
its backward has not ended (Note [Windows a tuning graph runs inside])."""


class Timer(Protocol):
    """Marks points in a step's execution and measures the seconds between two marks."""

    def mark(self) -> Any: ...

    def seconds(self, start: Any, end: Any) -> float: ...


class WallTimer:
    """The wall clock: exact where every kernel runs synchronously (CPU)."""

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class CudaTimer:
    """CUDA events on the current stream: the GPU time between two marks, host gaps included."""

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def timer_for(device: str) -> Timer:
    return CudaTimer() if device == "cuda" else WallTimer()


@dataclass
class _Step:
    """One call of one candidate: the marks of its forward and of its backward."""

    fwd: tuple[Any, Any]
    bwd_start: Any = None
    bwd_end: Any = None
    window: Any = None
    """Under a budget on CUDA: the step's peak window (``remat.capture.budget_guard``)."""
    peak: int | None = None
    """The peak measured over it, once its backward ended."""
    mixed: bool = False
    """Whether an undecided graph ran inside its window (Note [Windows a tuning graph runs inside])."""


@dataclass
class _Candidate:
    name: str
    run: Callable[..., Any] | None
    peak_bytes: Callable[[], int]
    """The candidate's peak, read when the decision is made (a compiled reading may arrive
    after its first backward)."""
    calls: int = 0
    steps: list[_Step] = field(default_factory=list)
    dropped: bool = False
    """Its forward ran out of memory (Note [A candidate out of memory])."""


class TunedGraph:
    """The callable for one graph while its candidates are measured (Note [Tuning on the user's
    steps]). ``candidates``: (name, compiled callable, peak getter), remat's default plan first.
    ``on_decided(index, selection)`` is called once, when the choice is made."""

    def __init__(self, candidates: Sequence[tuple[str, Callable[..., Any], Callable[[], int]]], timer: Timer,
                 samples: int, tolerance: float, on_decided: Callable[[int, Selection], None],
                 meter: Any = None, allowed: Callable[[int], bool] | None = None):
        """``meter`` (``remat.capture.budget_guard.Meter``): measure each timed step's peak too;
        ``allowed(peak)``: whether a measured peak keeps the budget (a candidate measured over it
        is not chosen; when none keeps it, ``on_decided`` gets the selection of none, index -1)."""
        if not candidates:
            raise ValueError("remat: internal error, TunedGraph needs a candidate; please report")
        self._candidates = [_Candidate(n, r, p) for n, r, p in candidates]
        self._timer = timer
        self._samples = samples
        self._tolerance = tolerance
        self._on_decided = on_decided
        self._meter = meter
        self._allowed = allowed
        self._next = 0
        self.winner: Callable[..., Any] | None = candidates[0][1] if len(candidates) == 1 and meter is None else None
        self.selection: Selection | None = None

    def __call__(self, *args: Any) -> Any:
        if self.winner is not None:
            return self.winner(*args)
        if self._measured():
            self._decide()
            return self.winner(*args)
        while True:
            cand = self._candidates[self._next]
            self._next = (self._next + 1) % len(self._candidates)
            if not cand.dropped:
                break
        cand.calls += 1
        for s in _OPEN:  # this graph has not chosen: the windows it runs inside are mixed
            s.mixed = True
        window = self._meter.open() if self._meter is not None and cand.calls > 1 else None
        droppable = cand is not self._candidates[0]
        rng = _rng_states(args) if droppable else None
        start = self._timer.mark()
        try:
            out = cand.run(*args)
        except torch.OutOfMemoryError as e:  # Note [A candidate out of memory]
            if not droppable:
                e.add_note(f"remat: raised in the forward of tuning candidate {cand.name!r} (call {cand.calls} of "
                           f"it), measured against {', '.join(repr(c.name) for c in self._candidates)}; "
                           "remat.Tuning(faster=0, frontier=0, compile_candidate=False) measures only the "
                           "budget's choice")
                raise
            cand.dropped = True
            out = None
        if cand.dropped:  # outside the except clause: the failed call's frames (and tensors) are gone
            for st in cand.steps:  # its earlier steps' windows, open where their backward has not run
                if st.window is not None:
                    self._meter.close(st.window)
                    _forget(st)
            if window is not None:
                self._meter.close(window)
            _set_rng_states(rng)
            cand.run, cand.steps = None, []
            return self(*args)
        step = _Step((start, self._timer.mark()), window=window)
        if cand.calls > 1 and self._hook_backward(out, step):
            cand.steps.append(step)
            if window is not None:
                _OPEN.append(step)
        elif window is not None:
            self._meter.close(window)
        return out

    def _measured(self) -> bool:
        live = [c for c in self._candidates if not c.dropped]
        timed = all(sum(s.bwd_end is not None for s in c.steps) >= self._samples for c in live)
        if not timed or self._meter is None:
            return timed
        return all(any(s.peak is not None and not s.mixed for s in c.steps) or len(c.steps) >= PATIENCE * self._samples
                   for c in live)

    def _hook_backward(self, out: Any, step: _Step) -> bool:
        node = _compiled_node(out)
        if node is None:
            return False
        timer = self._timer

        def before(grad_outputs: Any) -> None:
            if step.bwd_start is None:
                step.bwd_start = timer.mark()

        def after(grad_inputs: Any, grad_outputs: Any) -> None:
            if step.bwd_end is None:
                step.bwd_end = timer.mark()
                if step.window is not None:
                    window, step.window = step.window, None
                    step.peak = self._meter.close(window)
                    _forget(step)
                    warn_retries(self._meter.retries(window), step.peak, None)  # Note [Allocator retries at the limit]

        node.register_prehook(before)
        node.register_hook(after)
        return True

    def _decide(self) -> None:
        measured = []
        for c in self._candidates:
            done = [s for s in c.steps if s.bwd_end is not None][: self._samples]
            seconds = tuple(self._timer.seconds(*s.fwd) + self._timer.seconds(s.bwd_start, s.bwd_end) for s in done)
            clean = [s.peak for s in c.steps if s.peak is not None and not s.mixed]
            peaks = clean or [s.peak for s in c.steps if s.peak is not None]
            measured.append(Measured(c.name, seconds, max(peaks) if peaks else c.peak_bytes()))
        for c in self._candidates:  # windows of forwards whose backward never ran
            for s in c.steps:
                if s.window is not None:
                    self._meter.close(s.window)
                    s.window = None
                    _forget(s)
        dropped = {i for i, c in enumerate(self._candidates) if c.dropped}
        keep = [i for i, m in enumerate(measured)
                if i not in dropped and (self._allowed is None or self._allowed(m.peak_bytes))]
        if not keep:  # on_decided raises: the budget is not kept by any candidate
            self._on_decided(-1, Selection(-1, -1, self._tolerance, "every candidate measured over the budget",
                                           tuple(measured)))
        chosen = select([measured[i] for i in keep], self._tolerance)
        over = [m.name for i, m in enumerate(measured) if i not in keep and i not in dropped]
        reason = chosen.reason + (f" (measured over the budget, not chosen: {', '.join(over)})" if over else "")
        if dropped:
            reason += (f" (out of memory in a training step's forward, not measured: "
                       f"{', '.join(self._candidates[i].name for i in sorted(dropped))})")
        self.selection = Selection(keep[chosen.index], keep[chosen.fastest], chosen.tolerance, reason, tuple(measured))
        k = self.selection.index
        self.winner = self._candidates[k].run
        for c in self._candidates:  # the losers' compiled code and the steps' events go
            c.run, c.steps = None, []
        self._on_decided(k, self.selection)


def _rng_states(args: Sequence[Any]) -> tuple[torch.Tensor, list[tuple[int, torch.Tensor]]]:
    """The CPU generator's state and that of every CUDA device among ``args`` (Note [A candidate
    out of memory])."""
    devices = sorted({t.device.index or 0 for t in args if isinstance(t, torch.Tensor) and t.device.type == "cuda"})
    return torch.get_rng_state(), [(d, torch.cuda.get_rng_state(d)) for d in devices]


def _set_rng_states(states: tuple[torch.Tensor, list[tuple[int, torch.Tensor]]] | None) -> None:
    if states is None:
        return
    cpu, cuda = states
    torch.set_rng_state(cpu)
    for d, state in cuda:
        torch.cuda.set_rng_state(state, d)


def _forget(step: _Step) -> None:
    """``step``'s window is closed: no later call runs inside it."""
    for i, s in enumerate(_OPEN):
        if s is step:
            del _OPEN[i]
            return


_VIEW_NODES = ("View", "Alias", "AsStrided", "Transpose", "Permute", "Expand", "Select", "Slice", "Squeeze",
               "Unsqueeze", "TBackward", "Unbind", "Split", "Narrow", "Diagonal", "Unfold")


def _compiled_node(out: Any) -> Any:
    """The autograd node of the compiled function that produced ``out``: the
    ``CompiledFunctionBackward`` its outputs come from, directly or through the view nodes
    AOTAutograd adds for outputs that alias an intermediate (never through other ops, which
    would reach an earlier graph's node); None when no output comes from it."""
    todo = [(t.grad_fn, 0) for t in compat.tree_leaves(out) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    while todo:
        node, depth = todo.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        name = node.name()
        if "CompiledFunction" in name:
            return node
        if depth < 3 and any(v in name for v in _VIEW_NODES):
            todo.extend((n, depth + 1) for n, _ in node.next_functions)
    return None
