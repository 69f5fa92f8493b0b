"""A budget bounds the training step, not each graph (Note [Step budget], issue 27 item 1): with a
graph break the second graph's share is the budget less what the first graph saves, so an
accepted budget is kept as measured (CPU allocation peak) or raises, naming what the earlier
graphs hold; never a step silently over its budget."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import remat
from remat import compat


class TwoStacks(nn.Module):
    """Two MLP stacks with a data-dependent branch between them: Dynamo breaks it into two graphs."""

    def __init__(self, width=256, depth=4):
        super().__init__()
        self.a = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())])
        self.b = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())])

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:
            h = h * 2
        return self.b(h).square().mean()


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    base, x = TwoStacks(), torch.randn(512, 256)
    m = remat.checkpoint(copy.deepcopy(base), backend="eager")
    default = compat.measure_cpu_peak_bytes(lambda: m(x).backward())
    assert len(remat.compiled_plans(m)) == 2
    return base, x, default


def _run(base, x, budget):
    m = remat.checkpoint(copy.deepcopy(base), backend="eager", budget=budget)
    ref = copy.deepcopy(base)
    measured = compat.measure_cpu_peak_bytes(lambda: m(x).backward())
    ref(x).backward()
    for (k, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=k)
    return m, measured


def test_an_accepted_budget_is_kept_by_the_whole_step(setup):
    base, x, default = setup
    budget = default  # the default plan's measured peak: the first graph's default plan leaves room
    m, measured = _run(base, x, budget)
    plans = remat.compiled_plans(m)
    assert measured <= budget * 1.02, (measured, budget)
    # the second graph's share is the budget less what the first graph saves
    assert plans[0].budget_bytes == budget
    assert plans[1].budget_bytes == budget - plans[0].saved_bytes
    assert remat.Plan.combine(plans).predicted_peak_bytes <= budget


def test_a_budget_the_step_cannot_keep_raises_naming_the_earlier_graphs(setup):
    base, x, default = setup
    with pytest.raises(remat.InfeasibleBudgetError) as info:
        _run(base, x, int(0.7 * default))  # each graph fits alone; the step does not
    text = str(info.value)
    assert text.startswith("remat: the step's budget of") and "graph 2 of the step" in text
    assert "the 1 graph(s) before it save" in text and "Raise the budget to at least" in text


def test_a_new_step_does_not_count_an_earlier_steps_graphs(setup):
    # A recompile (here: a new batch size, dynamic=False) plans in a new step: the graphs of the
    # first step are not alive while it runs.
    base, x, default = setup
    m = remat.checkpoint(copy.deepcopy(base), backend="eager", budget=default, dynamic=False)
    m(x).backward()
    m(x[:256]).backward()
    plans = remat.compiled_plans(m)
    assert len(plans) == 4
    assert plans[2].budget_bytes == default
    assert plans[3].budget_bytes == default - plans[2].saved_bytes


class ThreeStacks(nn.Module):
    """Three MLP stacks with two data-dependent branches between them: three graphs."""

    def __init__(self, width=256, depth=3):
        super().__init__()
        def stack():
            return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())])

        self.a, self.b, self.c = stack(), stack(), stack()

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:
            h = h * 2
        h = self.b(h)
        if h.sum() > 0:
            h = h + 1
        return self.c(h).square().mean()


def test_three_graphs_share_the_step_budget():
    # The third graph's share is the budget less what both earlier graphs save; kept as measured,
    # and a budget the step cannot keep raises naming both earlier graphs.
    torch.manual_seed(0)
    base, x = ThreeStacks(), torch.randn(512, 256)
    m = remat.checkpoint(copy.deepcopy(base), backend="eager")
    measured_default = compat.measure_cpu_peak_bytes(lambda: m(x).backward())
    plans = remat.compiled_plans(m)
    assert len(plans) == 3
    # At least the default plans' composed prediction, each graph's default plan fits its share
    # and is kept (at the measured peak alone an earlier graph may take a faster plan that saves
    # more and leave the last too little: that raises, as below).
    budget = max(measured_default, remat.Plan.combine(plans).predicted_peak_bytes)
    m, measured = _run(base, x, budget)
    p0, p1, p2 = remat.compiled_plans(m)
    assert [p.key for p in (p0, p1, p2)] == [p.key for p in plans]
    assert measured <= budget * 1.02, (measured, budget)
    assert (p0.budget_bytes, p1.budget_bytes, p2.budget_bytes) == (
        budget, budget - p0.saved_bytes, budget - p0.saved_bytes - p1.saved_bytes)
    with pytest.raises(remat.InfeasibleBudgetError, match=r"graph 3 of the step.*the 2 graph\(s\) before it save"):
        _run(base, x, int(0.7 * budget))


def test_an_encoder_decoder_keeps_its_budget_as_predicted():
    # Issue 27 item 5: an HF encoder-decoder (tiny T5: two stacks, cross-attention, relative
    # position bias, so its attention stays in its math path) under a budget on the uncompiled
    # backend: the step's measured peak (second step, CPU profiler) is the prediction to the
    # byte and within the budget. Its softmax backward runs prims.fma through its Python
    # reference, whose a * b temporary the step peaks on (Note [Eager fma]): before it was
    # counted, the plan under budget=0.8 (torch 2.13) measured 16% above its prediction and 2.6%
    # above its budget.
    pytest.importorskip("transformers")
    import zoo

    wl = zoo.build("t5", tiny=True, device="cpu", dtype=torch.float32, no_dropout=True, batch=(8, 128))

    def step(fn):
        wl.loss(fn, wl.inputs).backward()

    ref = copy.deepcopy(wl.model)
    step(ref)
    default = remat.checkpoint(copy.deepcopy(wl.model), backend="eager")
    step(default)
    # Below the default plan's prediction (eager autograd's own peak moves between torch versions).
    budget = int(0.95 * remat.compiled_plans(default)[0].predicted_peak_bytes)
    m = remat.checkpoint(copy.deepcopy(wl.model), backend="eager", budget=budget)
    step(m)  # compiles
    for (k, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=k)
        p.grad = None
    measured = compat.measure_cpu_peak_bytes(lambda: step(m))
    (plan,) = remat.compiled_plans(m)
    assert plan.budget_bytes and plan.predicted_peak_bytes <= plan.budget_bytes
    assert measured <= plan.budget_bytes, (measured, plan.budget_bytes)
    assert abs(measured - plan.predicted_peak_bytes) <= 64, (measured, plan.predicted_peak_bytes)
    assert plan.recomputed  # a plan that recomputes, not eager autograd's


@pytest.mark.inductor
def test_graph_breaks_keep_the_step_budget_under_inductor(setup):
    # Item 5 on the default backend: the two graphs of TwoStacks compiled by Inductor under the
    # default plan's measured step peak; the second graph's share is the budget less what the
    # first saves, and the step keeps the budget as measured (or raises, never silently over).
    base, x, _ = setup
    m = remat.checkpoint(copy.deepcopy(base), backend="inductor")
    m(x).backward()
    default = compat.measure_cpu_peak_bytes(lambda: m(x).backward())
    budget = default
    b = remat.checkpoint(copy.deepcopy(base), backend="inductor", budget=budget)
    ref = copy.deepcopy(base)
    b(x).backward()
    ref(x).backward()
    for (k, p), q in zip(b.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=k, rtol=1e-4, atol=1e-5)
        p.grad = None
    measured = compat.measure_cpu_peak_bytes(lambda: b(x).backward())
    p0, p1 = remat.compiled_plans(b)
    assert (p0.budget_bytes, p1.budget_bytes) == (budget, budget - p0.saved_bytes)
    assert measured <= budget * 1.02, (measured, budget)
    with pytest.raises(remat.InfeasibleBudgetError, match="graph 2 of the step"):
        c = remat.checkpoint(copy.deepcopy(base), backend="inductor", budget=int(0.7 * default))
        c(x).backward()
