"""A budgeted graph's step peak, measured on the user's training step (CUDA).

Note [Measured budget peak]
Under a budget, a plan is chosen by its predicted peak and, with Inductor, checked against the
peak read from the memory plan Inductor generated (Note [Budget re-plan] in
``remat.planning.choice``). Neither is the allocator: on CUDA the callable Dynamo runs for a
budgeted graph is a ``BudgetGuard``, which measures the graph's second call (the first one pays
for lazy initialisation, cuBLAS's workspace for one, which later steps hold before they start):
the CUDA allocator's peak from the forward's call to the end of its backward (autograd's hook on
the compiled function's node), less what was allocated at the call. That is the measurement
protocol's peak of the step while this graph runs: a graph the step runs after it, and the loss,
fall inside the window, as the planner's share of the budget counts them (Note [Step budget]).

The measurement becomes the plan's peak (``Plan.measured_peak_bytes``, ``Plan.peak_model`` says
so). Within ``MEASURED_SLACK`` of the graph's budget it is kept. Over it, if the graph has a
compile left (``remat.planning.choice.MAX_COMPILES``), the graph is planned again with the
measured peak in place of that plan's prediction and the excess added to every other
candidate's, compiled at the next call, and that plan measured in turn; with none left, the
backward raises ``InfeasibleBudgetError`` naming what was measured: an accepted budget is kept as
measured, or refused.

Under ``torch.distributed`` with several ranks nothing is measured: each rank would measure
its own step and might plan again alone, and the ranks' graphs must agree (Note [Ranks agree on
plans]); the plan read from the compiled graphs decides there, as off CUDA.

The windows nest (a later graph's inside an earlier one's) without losing a peak
(``remat.peak_windows``); only the steps that measure a budgeted graph, and the compiles that
measure a library kernel's scratch, reset the allocator's peak counter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import compat
from ..peak_windows import Allocator, CudaAllocator, Meter, PeakWindows, meter_for
from .allocator import warn_retries
from .measure import _compiled_node

__all__ = ["MEASURED_SLACK", "Meter", "Allocator", "CudaAllocator", "PeakWindows", "BudgetGuard", "meter_for",
           "lookalike_inputs"]

MEASURED_SLACK = 0.02
"""How far over its budget a graph's measured peak may be and still keep it (Note [Measured
budget peak]): the measurement's own noise across steps."""


def lookalike_inputs(example_inputs: list[Any]) -> Callable[[], list[Any]]:
    """What a later compile of the graph needs of its example inputs, without holding the first
    step's activations: parameters and the tensors Dynamo marked static (buffers) themselves,
    every other tensor as its shape, strides, dtype, device and ``requires_grad``
    (``versions.HOOKS["static_input_mark"]``)."""
    kept: list[Any] = []
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and not compat.static_input(t):
            kept.append((tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t.requires_grad))
        else:
            kept.append(t)

    def make() -> list[Any]:
        out = []
        for k in kept:
            if isinstance(k, tuple):
                shape, stride, dtype, device, grad = k
                out.append(torch.empty_strided(shape, stride, dtype=dtype, device=device).requires_grad_(grad))
            else:
                out.append(k)
        return out

    return make


class BudgetGuard:
    """The callable Dynamo runs for a budgeted graph on CUDA (Note [Measured budget peak]).
    ``judge(peak)`` is called, from autograd's hook, with the measured peak of the plan running;
    it returns True when the graph is to be planned again, False when the plan keeps its budget,
    and raises when the budget cannot be kept. ``replan()`` compiles the next plan (at a forward
    call, never inside the backward) and returns its callable."""

    def __init__(self, run: Callable[..., Any], meter: Meter, judge: Callable[[int], bool],
                 replan: Callable[[], Callable[..., Any]], measure_call: int = 2, budget: int | None = None):
        self.run = run
        self._meter = meter
        self._judge = judge
        self._replan = replan
        self._measure_call = measure_call
        self._budget = budget
        self._calls = 0
        self._measuring = True
        self._again = False
        self._window: Any = None
        """The window of a measured forward whose backward has not run yet."""

    def __call__(self, *args: Any) -> Any:
        if not self._measuring:
            return self.run(*args)
        if self._window is not None:  # that forward's backward never ran: measure the next call
            self._meter.close(self._window)
            self._window = None
            self._measure_call = self._calls + 1
        if self._again:  # the last measurement missed the budget: the next plan runs from here
            self._again = False
            self.run, self._calls, self._measure_call = self._replan(), 0, 1
        self._calls += 1
        if self._calls != self._measure_call:
            return self.run(*args)
        window = self._meter.open()
        out = self.run(*args)
        node = _compiled_node(out)
        if node is None:  # no backward to measure to (inference, or outputs not needing grad)
            self._meter.close(window)
            self._measure_call += 1
            return out
        self._window = window

        def measured(grad_inputs: Any, grad_outputs: Any) -> None:
            if self._window is not window:
                return
            self._window = None
            peak = self._meter.close(window)
            warn_retries(self._meter.retries(window), peak, self._budget)
            again = self._judge(peak)
            self._again = again
            self._measuring = again

        node.register_hook(measured)
        return out
