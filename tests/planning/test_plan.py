"""Exact plan assertions on the reference workloads, and measured saved bytes."""

import pytest
import torch

import remat
from zoo import workloads


def plan_of(name, **kw):
    model, x = workloads.build(name, **kw)
    return remat.explain(model, x), model, x


def test_pointwise_saves_layer_inputs_and_norm_statistics():
    plan, model, x = plan_of("pointwise")
    n, d = x.shape
    layer_bytes = n * d * 4
    full = [s for s in plan.saved if s.shape == (n, d)]
    stats = [s for s in plan.saved if s.shape == (n, 1)]
    params = [s for s in plan.saved if s.op == "parameter"]
    assert len(full) == 8  # one per layer: the layer's input (layer 0: x + b, same bytes)
    assert len(full) + len(stats) + len(params) == len(plan.saved)
    assert plan.saved_bytes == 8 * layer_bytes + sum(s.nbytes for s in stats)
    assert all(s.nbytes == layer_bytes for s in full)
    # Layers 1..7 start at the previous layer norm's output.
    assert sum(s.reason == "normalization boundary" for s in full) == 7
    counts = plan.recompute_counts()
    assert counts["aten.tanh.default"] == 8
    assert counts["aten.sigmoid.default"] == 8
    assert counts["aten.erf.default"] == 8
    assert "aten.var_mean.correction" not in counts


def test_mlp_recomputes_gelu_and_saves_fc1_output():
    plan, model, x = plan_of("mlp")
    n = x.shape[0]
    hidden = [s for s in plan.saved if s.shape == (n, 256) and s.op != "parameter"]
    assert [s.op for s in hidden] == ["aten.addmm.default"] * 4
    assert all(s.reason == "matmul" for s in hidden)
    assert plan.recompute_counts()["aten.erf.default"] == 4  # the GELU of each block


@pytest.mark.parametrize("name", workloads.WORKLOADS)
def test_saves_less_than_eager(name):
    plan, _, _ = plan_of(name)
    assert 0 < plan.saved_bytes < plan.eager_saved_bytes


def test_plan_is_deterministic():
    a, _, _ = plan_of("gpt")
    torch._dynamo.reset()
    b, _, _ = plan_of("gpt")
    assert a == b
    assert str(a) == str(b)


def measured_saved_bytes(model, x):
    """Bytes of distinct storages autograd keeps for the backward during one real step,
    parameters excluded, recorded with saved_tensors_hooks."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    workloads.loss(out).backward()
    return sum(storages.values())


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.inductor)])
@pytest.mark.parametrize("name", workloads.WORKLOADS)
def test_measured_saved_bytes_equal_plan(name, backend):
    model, x = workloads.build(name)
    rm = remat.checkpoint(model, backend=backend)
    measured = measured_saved_bytes(rm, x)
    (plan,) = remat.compiled_plans(rm)
    assert measured == plan.saved_bytes


def test_combined_plan_predicts_the_step_across_graph_breaks():
    """Two graphs (a graph break): the step's predicted peak is the largest, over graphs, of a
    graph's own peak plus what the graphs before it save; the plan says how it was combined."""

    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

        def forward(self, x):
            h = torch.tanh(self.a(x))
            torch._dynamo.graph_break()
            return torch.tanh(self.b(h)).sum()

    torch._dynamo.reset()
    model, x = Broken(), torch.randn(128, 32, requires_grad=True)
    rm = remat.checkpoint(model, backend="eager")
    with pytest.warns(UserWarning, match="graph break"):
        rm(x).backward()
    plans = remat.compiled_plans(rm)
    assert len(plans) == 2 and all(p.predicted_peak_bytes for p in plans)
    combined = remat.Plan.combine(plans)
    first, second = plans
    assert combined.predicted_peak_bytes == max(first.predicted_peak_bytes,
                                                first.saved_bytes + second.predicted_peak_bytes)
    assert combined.eager_peak_bytes == max(first.eager_peak_bytes,
                                            first.eager_saved_bytes + second.eager_peak_bytes)
    assert combined.predicted_peak_bytes >= max(p.predicted_peak_bytes for p in plans)
    assert any("peak of 2 graphs" in n for n in combined.notes)
    assert "peak: predicted" in str(combined)
