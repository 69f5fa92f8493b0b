"""Plans chosen by measured time (``remat.tuning``, issue 25), on CPU with the uncompiled backend
and an injected clock: candidates compiled, measured on the user's own steps with gradients
equal to eager autograd's, BatchNorm statistics updated once per step, the random generator
advanced as eager advances it, the winner kept, and the decision cached."""

import copy

import pytest
import torch
import torch.nn as nn

import remat
from remat.capture import measure, tuned
from remat.capture.partition import STOCK

from .test_measure import Clock  # time moves only when a candidate runs


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        # wide enough that the frontier holds a plan well under the default's peak (a plan
        # measured beside it must be 5% smaller: remat.planning.measured.SMALLER)
        self.fc1 = nn.Linear(16, 256)
        self.bn = nn.BatchNorm1d(256)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(256, 16)
        self.fc3 = nn.Linear(16, 16)

    def forward(self, x):
        h = self.drop(torch.tanh(self.bn(self.fc1(x))) * torch.sigmoid(x.sum(-1, keepdim=True)))
        y = self.fc2(h).sin().cos() + x
        return self.fc3(y).tanh()


@pytest.fixture
def costs(monkeypatch):
    """Candidate name -> seconds each of its forward calls takes on the fake clock."""
    clock, table = Clock(), {}
    real = measure.TunedGraph

    def tuned_graph(candidates, timer, samples, tolerance, on_decided, **measuring):
        def slowed(name, run):
            def call(*args):
                clock.now += table.get(name, table.get("*", 1.0))
                return run(*args)
            return call
        return real([(n, slowed(n, r), p) for n, r, p in candidates], clock, samples, tolerance, on_decided,
                    **measuring)

    monkeypatch.setattr(tuned, "TunedGraph", tuned_graph)
    return table


def steps(model, n, seed=0):
    """n training steps; the loss, input gradient and parameter gradients of each."""
    out = []
    torch.manual_seed(seed)
    for i in range(n):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i), requires_grad=True)
        for p in model.parameters():
            p.grad = None
        loss = model(x).square().mean()
        loss.backward()
        out.append((loss.detach(), x.grad.clone(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    return out


def assert_steps_equal(got, ref):
    for (l1, x1, g1), (l2, x2, g2) in zip(got, ref):
        torch.testing.assert_close(l1, l2)
        torch.testing.assert_close(x1, x2)
        for k in g2:
            torch.testing.assert_close(g1[k], g2[k], msg=k)


def tuned_model(base, tmp_path, **tuning):
    return remat.checkpoint(copy.deepcopy(base), backend="eager",
                            tune=remat.Tuning(devices=("*",), samples=2, cache_dir=str(tmp_path), **tuning))


def test_measures_on_the_users_steps_and_keeps_the_fastest(costs, tmp_path):
    costs.update({"*": 1.0, STOCK: 0.5})  # torch.compile's partition is twice as fast
    torch.manual_seed(0)
    base = Net()
    ref_model, model = copy.deepcopy(base), tuned_model(base, tmp_path)
    k = 3  # the default plan, one smaller frontier plan, torch.compile's partition
    n = k * 3 + 2  # each candidate once untimed and twice timed, then the winner
    assert_steps_equal(steps(model, n), steps(ref_model, n))
    for (_, a), (_, b) in zip(model.named_buffers(), ref_model.named_buffers()):
        torch.testing.assert_close(a, b)  # BatchNorm: one update per step, as eager
    (plan,) = remat.compiled_plans(model)
    names = [m[0] for m in plan.measured]
    assert names[0] == "remat default" and names[2] == STOCK
    assert names[1] in {"remat hull", "remat segments", "remat nested"}  # the frontier's smaller plan
    assert plan.origin == STOCK and plan.chosen_by.startswith(f"measured: {STOCK} is the fastest")
    assert plan.measured[2][1] == pytest.approx(0.5) and plan.measured[0][1] == pytest.approx(1.0)
    assert any("measured on the first training steps" in n for n in plan.notes)


def test_the_smallest_plan_within_tolerance_wins(costs, tmp_path):
    costs.update({"*": 1.0})  # all equally fast: the smallest predicted peak wins
    torch.manual_seed(0)
    model = tuned_model(Net(), tmp_path)
    steps(model, 11)
    (plan,) = remat.compiled_plans(model)
    peaks = {name: peak for name, _, peak in plan.measured}
    assert plan.predicted_peak_bytes == min(peaks.values())
    (smaller,) = [n for n in peaks if n not in ("remat default", STOCK)]
    assert peaks[smaller] < peaks["remat default"]
    assert plan.origin == smaller.removeprefix("remat ")


def test_the_decision_is_cached(costs, tmp_path, monkeypatch):
    costs.update({"*": 1.0, STOCK: 0.5})
    torch.manual_seed(0)
    base = Net()
    steps(tuned_model(base, tmp_path), 11)
    compiles = []
    real = remat.backends.eager.backend.EagerBackend.compile

    def counted(self, *args, **kwargs):
        compiles.append(kwargs.get("stock", False))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(remat.backends.eager.backend.EagerBackend, "compile", counted)
    torch._dynamo.reset()
    again, ref = tuned_model(base, tmp_path), copy.deepcopy(base)
    assert_steps_equal(steps(again, 3), steps(ref, 3))
    assert compiles == [True]  # only the chosen candidate, torch.compile's partition
    (plan,) = remat.compiled_plans(again)
    assert plan.chosen_by.startswith("decision cache:") and plan.origin == STOCK
    assert len(plan.measured) == 3


def test_no_tuning_without_the_option_or_on_cpu_by_default(costs, tmp_path):
    torch.manual_seed(0)
    base = Net()
    for model in (remat.checkpoint(copy.deepcopy(base), backend="eager"),
                  remat.checkpoint(copy.deepcopy(base), backend="eager", tune=False)):
        steps(model, 3)
        (plan,) = remat.compiled_plans(model)
        assert plan.measured == () and plan.chosen_by == ""


def test_tune_option_is_validated():
    with pytest.raises(remat.RematError, match="tune must be"):
        remat.checkpoint(nn.Linear(2, 2), tune="always")
    with pytest.raises(remat.RematError, match="samples"):
        remat.Tuning(samples=0)
    with pytest.raises(remat.RematError, match="tolerance"):
        remat.Tuning(tolerance=1.5)


def test_a_copy_of_the_graph_plans_parameters_as_the_original_does():
    # A copy of Dynamo's graph (a budget's re-plan, a measured candidate) keeps what tells
    # AOTAutograd its parameters from its inputs: planned, it gives the original's plan.
    from remat.capture.dynamo_backend import RematBackend
    from remat.capture.graph_copy import copy_graph
    from remat.options import Options

    plans = []

    def both(gm, example_inputs):
        for g in (copy_graph(gm), gm):
            rb = RematBackend(Options(backend="eager"), want_frontier=True)
            rb.compile_plan(g, example_inputs)
            plans.append((rb.plans[0], rb.frontiers[0]))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(Net(), backend=both)(torch.randn(8, 16, requires_grad=True))
    (copied, copied_frontier), (plan, frontier) = plans
    roles = {s.name: s.reason for s in plan.saved}
    assert "parameter" in roles.values()
    assert copied.key == plan.key and {s.name: s.reason for s in copied.saved} == roles
    assert [p.key for p in copied_frontier] == [p.key for p in frontier]


def test_under_a_budget_the_winner_keeps_it_and_the_cache_too(costs, tmp_path):
    costs.update({"*": 1.0})  # all equally fast: the smallest predicted peak wins
    torch.manual_seed(0)
    base = Net()
    model = remat.checkpoint(copy.deepcopy(base), backend="eager", budget=1.0,
                             tune=remat.Tuning(devices=("*",), samples=2, cache_dir=str(tmp_path)))
    steps(model, 11)
    (plan,) = remat.compiled_plans(model)
    assert len(plan.measured) > 1 and plan.chosen_by.startswith("measured:")
    assert plan.budget_bytes is not None and plan.predicted_peak_bytes <= plan.budget_bytes
    torch._dynamo.reset()
    again = remat.checkpoint(copy.deepcopy(base), backend="eager", budget=1.0,
                             tune=remat.Tuning(devices=("*",), samples=2, cache_dir=str(tmp_path)))
    steps(again, 2)
    (cached,) = remat.compiled_plans(again)
    assert cached.chosen_by.startswith("decision cache:") and cached.key == plan.key
    assert cached.budget_bytes == plan.budget_bytes


class TwoGraphs(nn.Module):
    """``Net`` (whose smaller frontier plan saves more than its default plan), a data-dependent
    branch, and a second graph."""

    def __init__(self):
        super().__init__()
        self.a = Net()
        self.b = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16), nn.Tanh())

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:
            h = h * 2
        return self.b(h).square().mean()


def test_a_later_graph_leaves_room_for_any_candidate_the_earlier_one_measures(costs, monkeypatch):
    # While graph 1's candidates are measured, any may win: graph 2's share of the step's budget
    # is the budget less the most any of them saves (Note [Step budget]).
    costs.update({"*": 1.0})
    taken = []
    real_take = tuned._take

    def take(rb, k, name, run):
        entry = real_take(rb, k, name, run)
        taken.append((k, entry.plan.saved_bytes))
        return entry

    monkeypatch.setattr(tuned, "_take", take)
    torch.manual_seed(0)
    base, x = TwoGraphs(), torch.randn(8, 16)
    plain = remat.checkpoint(copy.deepcopy(base), backend="eager")
    plain(x).backward()
    budget = 2 * remat.Plan.combine(remat.compiled_plans(plain)).predicted_peak_bytes
    torch._dynamo.reset()
    model = remat.checkpoint(copy.deepcopy(base), backend="eager", budget=budget,
                             tune=remat.Tuning(devices=("*",), samples=1, cache=False))
    ref = copy.deepcopy(base)
    for i in range(8):
        for m in (model, ref):
            for p in m.parameters():
                p.grad = None
            torch.manual_seed(i)  # the same dropout masks
            m(x).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    first = [saved for k, saved in taken if k == 0]
    assert len(first) > 1 and len(set(first)) > 1  # graph 1's candidates save different bytes
    p0, p1 = remat.compiled_plans(model)[:2]
    assert p1.budget_bytes == budget - max(first)
    assert p0.saved_bytes <= max(first)


def test_under_a_budget_a_candidate_simulated_over_it_is_not_run(costs, tmp_path, monkeypatch):
    # Note [Candidates under a budget]: under a hard memory cap a candidate's step over the budget
    # runs out of memory instead of being measured, and Inductor's read peak can be below the step;
    # a candidate the simulator puts over the budget is not run, whatever its read peak.
    from dataclasses import replace

    from remat.capture import partition

    real = partition.plan_of_saved

    def oversized(*args, **kwargs):
        plan = real(*args, **kwargs)
        return replace(plan, simulated_peak_bytes=10 * plan.predicted_peak_bytes)

    monkeypatch.setattr(partition, "plan_of_saved", oversized)
    costs.update({"*": 1.0})
    torch.manual_seed(0)
    model = remat.checkpoint(copy.deepcopy(Net()), backend="eager", budget=1.0,
                             tune=remat.Tuning(devices=("*",), samples=2, cache_dir=str(tmp_path)))
    steps(model, 11)
    (plan,) = remat.compiled_plans(model)
    measured = [m[0] for m in plan.measured]
    assert measured and STOCK not in measured
    assert plan.predicted_peak_bytes <= plan.budget_bytes


@pytest.mark.parametrize("faster", [1, 0])
def test_under_a_budget_a_faster_plan_the_simulator_put_over_it_is_measured(costs, tmp_path, monkeypatch, faster):
    # Note [Faster plans the simulator put over the budget]: every compile here reads 10% below
    # the simulator (as Inductor's CUDA lowering of ResNet-50 did), so the default plan, simulated
    # over the budget and estimated faster than the budget's choice, fits as compiled: it is
    # compiled, read within the budget, measured and, being the fastest, kept; its steps' gradients
    # are eager autograd's. With Tuning(faster=0) it is not compiled.
    from remat.capture.dynamo_backend import RematBackend

    real_sink = RematBackend._sink

    def read_lower(self, plan, frontier):
        return real_sink(self, plan.with_compiled_peak(int(0.9 * plan.predicted_peak_bytes), "emulated read"), frontier)

    costs.update({"*": 1.0, "remat default": 0.5})
    torch.manual_seed(0)
    base = Net()
    seen = []  # the training step's frontier (the caller holds more than pareto's)
    monkeypatch.setattr(RematBackend, "_sink", lambda self, plan, frontier: (seen.append(frontier),
                                                                            real_sink(self, plan, frontier)))
    steps(remat.checkpoint(copy.deepcopy(base), backend="eager", budget=1.0, tune=False), 1)
    (points,) = [f for f in seen if f]
    torch._dynamo.reset()
    monkeypatch.setattr(RematBackend, "_sink", read_lower)
    default = points[0]
    chosen = min(points, key=lambda p: p.predicted_peak_bytes)  # the budget's choice below
    budget = (chosen.predicted_peak_bytes + min(p.predicted_peak_bytes for p in points if p.key != chosen.key)) // 2
    assert chosen.predicted_peak_bytes <= budget < default.predicted_peak_bytes <= budget / 0.9
    ref_model = copy.deepcopy(base)
    model = remat.checkpoint(copy.deepcopy(base), backend="eager", budget=budget,
                             tune=remat.Tuning(devices=("*",), samples=2, cache=False, faster=faster,
                                               compile_candidate=False))
    assert_steps_equal(steps(model, 8), steps(ref_model, 8))
    (plan,) = remat.compiled_plans(model)
    names = [m[0] for m in plan.measured]
    if faster:
        assert names == ["remat " + chosen.origin, "remat default"]
        assert plan.key == default.key and plan.origin == ""
        assert plan.simulated_peak_bytes > budget >= plan.predicted_peak_bytes
    else:
        assert plan.measured == () or names == ["remat " + chosen.origin]
        assert plan.key == chosen.key


def test_faster_picks_only_where_the_choice_read_below_its_simulation():
    from remat.planning.measured import faster_picks

    torch.manual_seed(0)
    points = remat.pareto(Net(), torch.randn(8, 16, requires_grad=True)).points
    chosen = min(points, key=lambda p: p.predicted_peak_bytes)
    budget = chosen.predicted_peak_bytes + 1
    faster = [p for p in points if p.cost_seconds < chosen.cost_seconds]
    assert faster  # one on this frontier since the reuse estimate became Inductor's (two before)
    assert faster_picks(chosen, points, 2, budget) == []  # not compiled: nothing read
    assert faster_picks(chosen.with_compiled_peak(chosen.predicted_peak_bytes + 8), points, 2, budget) == []
    read = chosen.with_compiled_peak(chosen.predicted_peak_bytes // 2)
    assert faster_picks(read, points, 2, None) == [] and faster_picks(read, points, 0, budget) == []
    picks = faster_picks(read, points, 2, budget)
    assert [p.key for p in picks] == [p.key for p in sorted(faster, key=lambda p: p.cost_seconds)[:2]]
    tight = read.with_compiled_peak(int(chosen.predicted_peak_bytes * 0.99))  # only what 1% less would fit
    assert all(p.predicted_peak_bytes * 0.99 <= budget for p in faster_picks(tight, points, 2, budget))


def _out_of_memory(monkeypatch, fails):
    """TunedGraph's candidates, those ``fails(name, call)`` names raising an out-of-memory error
    after drawing from the random generator (a forward that failed part way)."""
    real = measure.TunedGraph

    def tuned_graph(candidates, timer, samples, tolerance, on_decided, **measuring):
        def failing(name, run):
            calls = [0]

            def call(*args):
                calls[0] += 1
                if fails(name, calls[0], candidates[0][0]):
                    torch.rand(3)  # the partial forward's draw, which the retry must not see
                    raise torch.OutOfMemoryError("CUDA out of memory (emulated)")
                return run(*args)
            return call
        return real([(n, failing(n, r), p) for n, r, p in candidates], timer, samples, tolerance, on_decided,
                    **measuring)

    monkeypatch.setattr(tuned, "TunedGraph", tuned_graph)


def test_a_candidate_out_of_memory_is_dropped_and_training_goes_on(tmp_path, monkeypatch):
    # Note [A candidate out of memory]: torch.compile's partition runs out of memory in its first
    # forward; the call runs the next candidate instead, with the random generator as it was (the
    # dropout masks and so the gradients are eager's on every step), and it is never chosen.
    _out_of_memory(monkeypatch, lambda name, call, first: name == STOCK)
    torch.manual_seed(0)
    base = Net()
    ref_model, model = copy.deepcopy(base), tuned_model(base, tmp_path)
    assert_steps_equal(steps(model, 9), steps(ref_model, 9))
    for (_, a), (_, b) in zip(model.named_buffers(), ref_model.named_buffers()):
        torch.testing.assert_close(a, b)  # BatchNorm: one update per step, as eager
    (plan,) = remat.compiled_plans(model)
    names = [m[0] for m in plan.measured]
    assert plan.chosen_by.startswith("measured:") and STOCK not in names and len(names) == 2
    assert plan.origin != STOCK
    assert f"(out of memory in a training step's forward, not measured: {STOCK})" in plan.chosen_by


def test_the_first_candidate_out_of_memory_is_raised_naming_it(tmp_path, monkeypatch):
    _out_of_memory(monkeypatch, lambda name, call, first: name == first and call == 2)
    torch.manual_seed(0)
    model = tuned_model(Net(), tmp_path)
    steps(model, 3)  # each candidate once: the first, a smaller plan, torch.compile's partition
    with pytest.raises(torch.OutOfMemoryError) as info:
        steps(model, 1)
    (note,) = info.value.__notes__
    assert "raised in the forward of tuning candidate 'remat " in note and "(call 2 of it)" in note
    assert "remat.Tuning(faster=0, frontier=0, compile_candidate=False)" in note
