"""A budgeted graph's peak measured on a training step (Note [Measured budget peak], issue 27 item
3): the measurement becomes the plan's peak; over the budget, the graph is planned again with it
(at most two compiles in all) or the backward raises. The CUDA allocator is replaced here by a
scripted meter (CPU); the GPU run measures the real one (benchmarks/real_models.py)."""

from __future__ import annotations

import copy

import pytest
import torch

import remat
from remat.capture import budget_guard
from remat.plan import MEASURED
from zoo import workloads


class Scripted:
    """A meter whose windows measure the given peaks, in order (then the last one again), each
    with ``retries`` allocator retries."""

    def __init__(self, *peaks: int, retries: int = 0):
        self.peaks = list(peaks)
        self.opened = self.closed = 0
        self.retried = retries

    def retries(self, window):
        return self.retried

    def open(self):
        self.opened += 1
        return self.opened

    def close(self, window):
        self.closed += 1
        return self.peaks.pop(0) if len(self.peaks) > 1 else self.peaks[0]


def _model():
    torch.manual_seed(0)
    return workloads.build("pointwise", "small")


def _default_peak(model, x) -> int:
    return remat.explain(copy.deepcopy(model), x, backend="eager").predicted_peak_bytes


def _train(model, x, steps, meter, monkeypatch, budget, backend="eager"):
    monkeypatch.setattr(budget_guard, "meter_for", lambda inputs: meter)
    rm = remat.checkpoint(copy.deepcopy(model), backend=backend, budget=budget)
    ref = copy.deepcopy(model)
    seen = []
    for _ in range(steps):
        for m in (rm, ref):
            for p in m.parameters():
                p.grad = None
            workloads.loss(m(x)).backward()
        for (k, p), q in zip(rm.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=k)
        seen.append(remat.compiled_plans(rm)[0])
    return seen


def test_a_measured_peak_within_the_budget_becomes_the_plans_peak(monkeypatch):
    model, x = _model()
    budget = _default_peak(model, x)
    meter = Scripted(budget - 1000)
    first, second, third = _train(model, x, 3, meter, monkeypatch, budget)
    assert first.measured_peak_bytes == 0 and first.peak_model != MEASURED  # the first step is not measured
    assert second.measured_peak_bytes == budget - 1000 == second.predicted_peak_bytes
    assert second.peak_model == MEASURED and second.key == first.key
    assert any(n.startswith("peak measured by the CUDA allocator on a training step") for n in second.notes)
    assert third == second and meter.opened == meter.closed == 1  # measured once, then left alone


def test_a_measured_miss_plans_the_graph_again_with_the_measurement(monkeypatch):
    model, x = _model()
    budget = _default_peak(model, x)
    over = int(1.08 * budget)
    meter = Scripted(over, budget - 1000)
    first, second, third, fourth = _train(model, x, 4, meter, monkeypatch, budget)
    assert second.key == first.key and second.measured_peak_bytes == over
    # the next step runs a plan chosen with the measured excess added to every prediction
    assert third.key != first.key
    gap = over - first.predicted_peak_bytes
    assert third.simulated_peak_bytes + gap <= budget, (third.simulated_peak_bytes, gap, budget)
    assert any(n.startswith("budget re-plan on a measured step (2 compiles): a plan predicted at") for n in third.notes)
    assert third.measured_peak_bytes == budget - 1000 and third.peak_model == MEASURED  # measured at once
    assert fourth == third and meter.opened == meter.closed == 2


def test_a_budget_missed_as_measured_after_the_last_compile_raises(monkeypatch):
    model, x = _model()
    budget = _default_peak(model, x)
    meter = Scripted(int(1.08 * budget), int(1.1 * budget))
    with pytest.raises(remat.InfeasibleBudgetError,
                       match=r"^remat: no plan of this graph compiled under its budget .* in 2 compiles \(a plan "
                             r"predicted at .* measured on a training step at .*, over the budget; a plan predicted "
                             r"at .* measured on a training step at .*\).*Raise the budget"):
        _train(model, x, 3, meter, monkeypatch, budget)


def test_within_the_slack_the_budget_is_kept(monkeypatch):
    model, x = _model()
    budget = _default_peak(model, x)
    meter = Scripted(int(1.015 * budget))
    first, second, third = _train(model, x, 3, meter, monkeypatch, budget)
    assert third.key == first.key and third.measured_peak_bytes == int(1.015 * budget)


def test_nothing_is_measured_off_cuda():
    model, x = _model()
    assert budget_guard.meter_for([x, *model.parameters()]) is None
    rm = remat.checkpoint(copy.deepcopy(model), backend="eager", budget=_default_peak(model, x))
    for _ in range(2):
        workloads.loss(rm(x)).backward()
    (plan,) = remat.compiled_plans(rm)
    assert plan.measured_peak_bytes == 0 and plan.peak_model != MEASURED


class FakeAllocator:
    def __init__(self):
        self.now = self.top = self.retried = 0

    def retries(self):
        return self.retried

    def alloc(self, n):
        self.now += n
        self.top = max(self.top, self.now)

    def peak(self):
        return self.top

    def reset_peak(self):
        self.top = self.now

    def allocated(self):
        return self.now


def test_nested_windows_keep_each_others_peaks():
    a = FakeAllocator()
    windows = budget_guard.PeakWindows(a)
    a.alloc(100)
    outer = windows.open()  # base 100
    a.alloc(500)
    a.alloc(-400)  # outer's peak so far: 600
    inner = windows.open()  # resets the counter at 200: outer keeps its 600
    a.alloc(300)
    a.alloc(-300)
    assert windows.close(inner) == 300
    a.alloc(50)
    assert windows.close(outer) == 500  # 600 - 100, although the counter was reset inside it
    assert windows.windows == []


def test_windows_count_the_allocators_retries_inside_them():
    a = FakeAllocator()
    windows = budget_guard.PeakWindows(a)
    a.retried = 3  # before the window: not its own
    outer = windows.open()
    a.retried = 5
    inner = windows.open()
    a.retried = 6
    windows.close(inner)
    windows.close(outer)
    assert (windows.retries(inner), windows.retries(outer)) == (1, 3)


@pytest.fixture
def fresh_warning(monkeypatch):
    """The retry warning not given yet in this process, and no allocator settings in the environment."""
    from remat.capture import allocator

    monkeypatch.setattr(allocator, "_RETRIES_WARNED", False)
    monkeypatch.setattr(allocator, "_FRAGMENTATION_WARNED", False)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(k, raising=False)
    return allocator


def test_a_measured_step_at_the_memory_limit_recommends_expandable_segments_once(monkeypatch, fresh_warning):
    # Note [Allocator retries at the limit]: retries in the measured window warn, once per process,
    # naming the count, the measured peak, the budget and the setting; the plan is judged as before.
    model, x = _model()
    budget = _default_peak(model, x)
    with pytest.warns(UserWarning) as caught:
        second = _train(model, x, 3, Scripted(budget - 1000, retries=4), monkeypatch, budget)[1]
    ours = [str(w.message) for w in caught if "caching allocator" in str(w.message)]
    assert len(ours) == 1 and ours[0].startswith("remat: during a measured training step (peak ")
    assert "failed 4 allocation(s)" in ours[0] and "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in ours[0]
    assert f"under a budget of {remat.units.format_bytes(budget)}" in ours[0]
    assert second.measured_peak_bytes == budget - 1000


@pytest.mark.parametrize("conf,retries", [("expandable_segments:True", 4), (None, 0)])
def test_no_retry_warning_with_expandable_segments_or_without_retries(monkeypatch, fresh_warning, conf, retries):
    import warnings

    if conf:
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", f"max_split_size_mb:512, {conf}")
    assert fresh_warning.expandable_segments() == bool(conf)
    model, x = _model()
    budget = _default_peak(model, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(model, x, 3, Scripted(budget - 1000, retries=retries), monkeypatch, budget)
    assert not [w for w in caught if "caching allocator" in str(w.message)]


def test_lookalike_inputs_keep_parameters_and_not_activations():
    p = torch.nn.Parameter(torch.randn(3, 4))
    x = torch.randn(8, 3).t()
    make = budget_guard.lookalike_inputs([p, x, 5])
    q, y, n = make()
    assert q is p and n == 5 and y is not x
    assert (y.shape, y.stride(), y.dtype, y.requires_grad) == (x.shape, x.stride(), x.dtype, False)


@pytest.mark.inductor
def test_the_measured_re_plan_compiles_through_inductor(monkeypatch):
    # The second compile runs at a forward call, outside Dynamo's compile: Inductor compiles the
    # graph from its copy and shape-only inputs, and the gradients stay eager's.
    model, x = _model()
    budget = remat.explain(copy.deepcopy(model), x).predicted_peak_bytes
    meter = Scripted(int(1.04 * budget), budget - 1000)
    seen = _train(model, x, 3, meter, monkeypatch, budget, backend="inductor")
    keys, plan = [p.key for p in seen], seen[-1]
    assert keys[0] == keys[1] != keys[2]
    assert plan.compiled_peak_bytes and plan.measured_peak_bytes == budget - 1000
    assert any(n.startswith("budget re-plan on a measured step (2 compiles)") for n in plan.notes)


def _tuned(monkeypatch, meter, steps):
    monkeypatch.setattr(budget_guard, "meter_for", lambda inputs: meter)
    model, x = _model()
    budget = _default_peak(model, x)
    rm = remat.checkpoint(copy.deepcopy(model), backend="eager", budget=budget,
                          tune=remat.Tuning(devices=("cpu",), samples=1, cache=False))
    for _ in range(steps):
        for p in rm.parameters():
            p.grad = None
        workloads.loss(rm(x)).backward()
    return rm, budget


def test_tuned_candidates_measured_over_the_budget_are_not_chosen(monkeypatch):
    # Two candidates here (the default plan and a nested one; torch.compile's partition is
    # predicted over the budget), one timed step each after an untimed one: the windows close
    # in that order, the default measured over the budget.
    meter = Scripted(10**9, 1234)
    rm, budget = _tuned(monkeypatch, meter, 4)
    workloads.loss(rm(_model()[1])).backward()  # the decision is made at this call
    (plan,) = remat.compiled_plans(rm)
    assert meter.opened == meter.closed == 2
    assert [m[0] for m in plan.measured] == ["remat default", "remat nested"]
    assert [m[2] for m in plan.measured] == [10**9, 1234]
    assert plan.origin == "nested" and plan.measured_peak_bytes == 1234 and plan.peak_model == MEASURED
    assert "measured over the budget, not chosen: remat default" in plan.chosen_by


def test_tuned_candidates_all_measured_over_the_budget_raise(monkeypatch):
    rm, budget = _tuned(monkeypatch, Scripted(10**9), 4)
    with pytest.raises(remat.InfeasibleBudgetError, match=r"^remat: no plan of this graph compiled under its budget "
                       r".* in 2 compiles \(remat default measured on training steps at 953.7 MiB; remat nested"):
        rm(_model()[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA allocator's peak")
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_the_cuda_measurement_is_the_protocols_peak(backend):
    # The plan's measured peak is the measurement protocol's: max_memory_allocated during the
    # step less memory_allocated just before it, on the step that measured it (the second).
    torch.manual_seed(0)
    model, x = workloads.build("pointwise", "small")
    model, x = model.cuda(), x.cuda()
    budget = 10 * remat.explain(copy.deepcopy(model), x, backend=backend).predicted_peak_bytes
    rm = remat.checkpoint(copy.deepcopy(model), backend=backend, budget=budget, tune=False)
    peaks = []
    for _ in range(3):
        for p in rm.parameters():
            p.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        workloads.loss(rm(x)).backward()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - before)
    (plan,) = remat.compiled_plans(rm)
    assert plan.peak_model == MEASURED
    assert abs(plan.measured_peak_bytes - peaks[1]) <= 0.02 * peaks[1], (plan.measured_peak_bytes, peaks)


def test_a_measured_plan_says_so_in_its_text_and_json(monkeypatch):
    import json

    model, x = _model()
    budget = _default_peak(model, x)
    *_, plan = _train(model, x, 2, Scripted(budget - 1000), monkeypatch, budget)
    assert f"peak: measured {remat.plan.format_bytes(budget - 1000)} on a training step" in str(plan)
    assert json.loads(plan.to_json())["totals"]["measured_peak_bytes"] == budget - 1000


def _fragmentation_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "(fragmentation)" in str(w.message)]


def test_a_budget_planned_for_cuda_names_expandable_segments_once(monkeypatch, fresh_warning):
    # Note [Allocator retries at the limit]: a step can run out of memory below its budget before any
    # retry is counted, so a budget measured on CUDA (a meter: the scripted one here) names the
    # setting when its graph compiles, once per process; the plan and the gradients are unchanged.
    import warnings

    model, x = _model()
    budget = _default_peak(model, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plans = _train(model, x, 2, Scripted(budget - 1000), monkeypatch, budget)
        _train(model, x, 1, Scripted(budget - 1000), monkeypatch, budget)  # a second model: not again
    ours = _fragmentation_warnings(caught)
    assert len(ours) == 1 and ours[0].startswith(f"remat: the budget of {remat.units.format_bytes(budget)} ")
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in ours[0]
    assert caught[[str(w.message) for w in caught].index(ours[0])].filename == __file__  # the user's line
    assert plans[1].measured_peak_bytes == budget - 1000


@pytest.mark.parametrize("case", ["expandable", "no budget", "off cuda"])
def test_no_fragmentation_warning_with_expandable_segments_without_a_budget_or_off_cuda(monkeypatch, fresh_warning,
                                                                                       case):
    import warnings

    if case == "expandable":
        monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    model, x = _model()
    budget = _default_peak(model, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if case == "no budget":
            monkeypatch.setattr(budget_guard, "meter_for", lambda inputs: Scripted(budget - 1000))
            rm = remat.checkpoint(copy.deepcopy(model), backend="eager")
            workloads.loss(rm(x)).backward()
        else:
            _train(model, x, 2, None if case == "off cuda" else Scripted(budget - 1000), monkeypatch, budget)
    assert not _fragmentation_warnings(caught)
