"""Predicted peaks that hold on small versions of the four real-model families
(``zoo/small.py``): the peak read from Inductor's memory plan (``remat.core.allocations``)
and the op-by-op simulation (uncompiled backend, eager autograd) against the CPU profiler's
measured peak of the same step; and a budget kept as measured. The pure replay is tested on
hand-made traces first."""

import copy

import pytest
import torch

import remat
from remat.core.allocations import Event, GraphTrace, read_step, step_peak
from remat.plan import READ, Plan
from zoo import small as small_models
from zoo.small import MODELS, measured_peak

# --- the replay, on hand-made traces -----------------------------------------------------------


def fw_trace():
    # x (input) -> a (100 B) -> b (200 B) = forward output; a is saved; c (50 B) dies inside.
    return GraphTrace(
        events=(Event("alloc", "a", 100), Event("alloc", "c", 50), Event("call", label="k0"),
                Event("free", "c"), Event("alloc", "b", 200), Event("call", label="k1")),
        inputs=(("x", 0),), outputs=("b", "a"))


def bw_trace(reuse=False):
    events = [Event("alloc", "g", 100), Event("call", label="k2", nbytes=30), Event("free", "a")]
    if reuse:  # the gradient of x takes g's buffer instead of a new one
        events += [Event("reuse", "gx", 100, other="g")]
    else:
        events += [Event("alloc", "gx", 100), Event("free", "g")]
    events += [Event("free", "tangents_1")]
    return GraphTrace(events=tuple(events), inputs=(("a", 100), ("tangents_1", 200)), outputs=("gx",))


def test_step_peak_when_the_caller_keeps_its_outputs():
    p = step_peak(fw_trace(), bw_trace(), ["out", "a"], ["a", "tangents_1"], caller_keeps_outputs=True)
    assert p.forward_peak_bytes == 300  # a and b: c is freed after k0, before b is allocated
    assert p.boundary_bytes == 100 + 200 + 200  # saved a, the output, its gradient
    # backward: + g (100) + the kernel's scratch (30) = 630; then a dies, gx replaces g.
    assert p.peak_bytes == 630 and p.at == "backward:k2"


def test_step_peak_when_only_the_loss_is_kept():
    p = step_peak(fw_trace(), bw_trace(), ["out", "a"], ["a", "tangents_1"], caller_keeps_outputs=False)
    assert p.boundary_bytes == 100 + 200  # the output died; its gradient is allocated
    assert p.peak_bytes == 430


def test_reused_buffer_is_counted_once_and_freed_by_its_last_name():
    kept = step_peak(fw_trace(), bw_trace(reuse=True), ["out", "a"], ["a", "tangents_1"], False)
    new = step_peak(fw_trace(), bw_trace(reuse=False), ["out", "a"], ["a", "tangents_1"], False)
    assert kept.peak_bytes == new.peak_bytes == 430


def test_saved_tensor_that_is_also_an_output_is_not_freed_while_the_caller_holds_it():
    # the forward returns a twice: as its output and as a saved tensor
    fw = GraphTrace(events=(Event("alloc", "a", 100),), inputs=(), outputs=("a", "a"))
    bw = GraphTrace(events=(Event("free", "a"), Event("alloc", "g", 10)), inputs=(("a", 100),), outputs=("g",))
    assert step_peak(fw, bw, ["a", "a"], ["a"], True).peak_bytes == 110
    assert step_peak(fw, bw, ["a", "a"], ["a"], False).peak_bytes == 100  # freed, then g


def test_read_step_finds_the_loss_by_its_scalar_gradient():
    r = read_step(fw_trace(), bw_trace(), ["out", "a"], ["a", "tangents_1"], scalar_inputs=["tangents_1"])
    assert r.loss_in_graph and r.peak(True) == r.dropped and r.peak(False) == r.kept
    assert not read_step(fw_trace(), bw_trace(), ["out", "a"], ["a", "tangents_1"]).loss_in_graph


def test_reading_hook_that_cannot_install_warns(monkeypatch):
    from torch._inductor.codegen import wrapper

    from remat import versions
    from remat.backends.inductor.wrapper_reading import read_allocations

    monkeypatch.setattr(versions, "_warned", set())
    monkeypatch.delattr(wrapper.PythonWrapperCodegen, "run_wrapper_ir_passes")
    got = []
    with pytest.warns(UserWarning, match="read_allocations"), read_allocations(got.append):
        pass
    assert got == []


def test_reader_passes_over_grouped_asserts_and_names_unknown_lines():
    # torch 2.14 checks the sizes and strides of several tensors in one GroupedAssertSizeStrideLine:
    # it neither allocates nor frees. A line kind the reader does not know is named, never dropped.
    from types import SimpleNamespace

    from torch._inductor.codegen import wrapper

    from remat.backends.inductor.wrapper_reading import trace_of

    class Unheard(wrapper.WrapperLine):
        pass

    graph = SimpleNamespace(graph_inputs={}, graph_outputs=[])
    assert trace_of(graph, [Unheard(), Unheard()]).unknown == ("Unheard", "Unheard")
    grouped = getattr(wrapper, "GroupedAssertSizeStrideLine", None)
    if grouped is None:
        pytest.skip(f"torch {torch.__version__} has no GroupedAssertSizeStrideLine (2.14 on)")
    line = grouped(None, [("primals_1", "(4, 8)", "(8, 1)"), ("primals_2", "(8,)", "(1,)")], "input")
    assert trace_of(graph, [line]) == GraphTrace(events=(), inputs=(), outputs=())


def test_choose_takes_read_peaks_over_predictions():
    # The budget's re-plan: a candidate whose compiled peak was read over the budget gives way
    # to the next one, though its prediction fits.
    from remat.plan import SavedTensor
    from remat.planning.candidates import Candidate
    from remat.planning.choice import Attempt, choose

    def candidate(name, peak, seconds):
        plan = Plan(saved=(SavedTensor(name, "aten.mul.Tensor", nbytes=1),), recomputed=(),
                    predicted_peak_bytes=peak, recompute_seconds=seconds)
        return Candidate((0,), (), plan, "hull")

    a, b, c = candidate("a", 100, 0.0), candidate("b", 80, 1.0), candidate("c", 60, 2.0)
    assert choose([a, b, c], 90, 200) is b
    assert choose([a, b, c], 90, 200, attempt=Attempt({b.plan.key: 95})) is c
    with pytest.raises(remat.InfeasibleBudgetError, match="95 B"):
        choose([b], 90, 200, attempt=Attempt({b.plan.key: 95}))


# --- against the CPU profiler --------------------------------------------------------------


def _plan(model):
    return Plan.combine(remat.compiled_plans(model))


@pytest.mark.parametrize("name", MODELS)
def test_eager_and_uncompiled_peaks_match_measured(name):
    model, loss = MODELS[name]()
    eager = measured_peak(model, model, loss)
    rm = remat.checkpoint(copy.deepcopy(model), backend="eager")
    measured = measured_peak(rm, rm, loss)
    plan = _plan(rm)
    assert abs(plan.eager_peak_bytes - eager) <= 0.05 * eager, (plan.eager_peak_bytes, eager)
    assert abs(plan.predicted_peak_bytes - measured) <= 0.05 * measured, (plan.predicted_peak_bytes, measured)


@pytest.mark.inductor
@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_peak_read_from_inductor_matches_measured(name):
    model, loss = MODELS[name]()
    rm = remat.checkpoint(copy.deepcopy(model))
    measured = measured_peak(rm, rm, loss)
    plans = remat.compiled_plans(rm)
    assert all(p.peak_model == READ and p.compiled_peak_bytes for p in plans)
    assert not any("unread" in n for p in plans for n in p.notes)  # every wrapper line understood
    plan = _plan(rm)
    assert plan.predicted_peak_bytes == plan.compiled_peak_bytes
    assert abs(plan.predicted_peak_bytes - measured) <= 0.05 * measured, (plan.predicted_peak_bytes, measured)


@pytest.mark.inductor
@pytest.mark.slow
def test_budget_is_kept_as_measured_after_replanning(monkeypatch):
    # The first compile's plan is read just over the budget (which plan Inductor compiles above
    # its prediction depends on the model): the graph is planned again with that excess added to
    # every other prediction, compiled a second time, and the step keeps the budget as measured.
    from remat.capture import dynamo_backend as capture

    real, first = capture.RematBackend._apply_readings, []

    def first_misses(self):
        real(self)
        for k, p in enumerate(self.plans):
            if p.compiled_peak_bytes and (not first or first[0] == p.key):
                first[:] = [p.key]
                self.plans[k] = p.with_compiled_peak(p.budget_bytes + 1)

    monkeypatch.setattr(capture.RematBackend, "_apply_readings", first_misses)
    model, loss = small_models.llama()
    # The logits' gradient planned (output_grads="all") keeps the first plan within the forced
    # miss of the budget, so that a second plan fits with the excess added. (At 0.5 no plan reads
    # under the budget on the newest torch, whose smaller plans compile above their predictions:
    # there the step raises InfeasibleBudgetError, as it should.)
    rm = remat.checkpoint(copy.deepcopy(model), budget=0.55, output_grads="all")
    measured = measured_peak(rm, rm, loss)
    (plan,) = remat.compiled_plans(rm)
    assert plan.compiled_peak_bytes <= plan.budget_bytes
    assert measured <= 1.02 * plan.budget_bytes, (measured, plan.budget_bytes)
    assert any(n.startswith("budget re-plan (2 compiles)") for n in plan.notes), plan.notes
    assert plan.key != first[0]
    assert torch.isfinite(loss(rm))


class _LossAfterBreak(torch.nn.Module):
    """An LM, then a graph break, then its next-token loss."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        logits = self.lm(input_ids=ids).logits
        torch._dynamo.graph_break()
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


@pytest.mark.inductor
@pytest.mark.slow
def test_a_budget_the_default_plan_fits_keeps_it_in_one_compile_across_a_graph_break():
    # Dynamo breaks the small GPT-2 before its loss (here at an explicit break: HF's own, a logger
    # call, no longer splits it: Note [Logging does not split the graph]). The budget's re-plan
    # judges the first graph's read peak before the second graph is compiled: that graph hands its
    # outputs to the next one (Note [What the caller holds]), so the caller does not hold them;
    # judged as held, the default plan missed a budget just above its own peak and four compiles
    # ended elsewhere.
    lm, _ = small_models.gpt2()
    model = _LossAfterBreak(lm)
    ids = torch.randint(0, 1024, (4, 128), generator=torch.Generator().manual_seed(1))

    def loss(f):
        return f(ids)

    rm = remat.checkpoint(copy.deepcopy(model))
    loss(rm).backward()
    first, second = remat.compiled_plans(rm)
    budget = int(1.01 * max(first.compiled_peak_bytes, first.simulated_peak_bytes, second.predicted_peak_bytes))
    rb = remat.checkpoint(copy.deepcopy(model), budget=budget)
    loss(rb).backward()
    got = remat.compiled_plans(rb)[0]
    assert not any(n.startswith("budget re-plan") for n in got.notes), got.notes
    assert [s.name for s in got.saved] == [s.name for s in first.saved]
    assert got.compiled_peak_bytes == first.compiled_peak_bytes <= budget


@pytest.mark.inductor
@pytest.mark.slow
def test_a_budget_no_compiled_plan_keeps_is_refused_after_its_reading(monkeypatch):
    # Every compile reads ten times its prediction here: with the first reading's excess added to
    # every other candidate's prediction none fits, so the budget is refused before a second
    # compile is spent (Note [Budget re-plan]), never kept silently over.
    from remat.capture import dynamo_backend as capture

    real = capture.RematBackend._apply_readings

    def inflated(self):
        real(self)
        self.plans = [p.with_compiled_peak(10 * p.compiled_peak_bytes)
                      if p.compiled_peak_bytes else p for p in self.plans]

    monkeypatch.setattr(capture.RematBackend, "_apply_readings", inflated)
    model, loss = small_models.llama()
    rb = remat.checkpoint(copy.deepcopy(model), budget=0.9)
    want = (r"^remat: no plan fits a peak of .*: a compile of this graph read .* more than its plan's predicted "
            r"peak, and with that added the smallest peak for this graph is .*no further compile is spent on it.*Raise")
    with pytest.raises(remat.InfeasibleBudgetError, match=want):
        loss(rb).backward()


def test_the_re_plan_loop_compiles_until_the_read_peak_fits(monkeypatch):
    # Note [Budget re-plan], without compiling: each compile's plan is read over or under its budget.
    from remat.plan import SavedTensor
    from remat.planning import choice

    def plan(name, read):
        return Plan(saved=(SavedTensor(name, "aten.mul.Tensor", nbytes=1),), recomputed=(), budget_bytes=100,
                    simulated_peak_bytes=90).with_compiled_peak(read)

    attempts = []

    def compile_once(reads):
        def once(attempt):
            attempts.append(attempt)
            return plan(f"p{attempt.compiles}", reads[attempt.compiles])
        return once

    assert choice.compile_within_budget(compile_once([80])) is None and len(attempts) == 1
    attempts.clear()
    note = choice.compile_within_budget(compile_once([120, 90]))
    assert note == "budget re-plan (2 compiles): a plan predicted at 90 B compiled to 120 B, over the budget"
    assert attempts[1].known_peaks == {plan("p0", 120).key: 120} and attempts[1].gap == 30
    assert choice.MAX_COMPILES == 2 and attempts[1].last  # at most two compiles per graph (issue 27)
    attempts.clear()
    with pytest.raises(remat.InfeasibleBudgetError, match=r"^remat: no plan of this graph compiled under its budget "
                       r"of 100 B in 2 compiles \(.*\): their compiled peaks exceed their predictions. Raise the "
                       r"budget to at least 110 B, or use remat.pareto"):
        choice.compile_within_budget(compile_once([120, 110]))
    assert attempts[1].last
    assert choice.compile_within_budget(lambda attempt: None) is None  # nothing to judge: one compile
