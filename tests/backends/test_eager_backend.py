"""The uncompiled backend keeps max pooling, GELU and tanh's backward whole, recomputes dropout's
output from its mask (Notes [Eager pooling], [Eager GELU], [Eager dropout] in remat/backends/eager/backend.py),
and trains like eager autograd."""

import copy

import torch
import torch.nn as nn

import remat

from ..conftest import assert_same_training


def cnn():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def test_max_pool_is_kept_whole_and_gradients_equal_eager():
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    rm = assert_same_training(cnn, [x], "eager", steps=2, lr=0.1)
    (plan,) = remat.compiled_plans(rm)
    ops = {n.op for n in plan.nodes}
    assert {"aten.max_pool2d_with_indices.default", "aten.max_pool2d_with_indices_backward.default"} <= ops
    assert not any("low_memory" in op for op in ops)
    # eager autograd saves the pooling's int64 indices; so does this plan (or recomputes them)
    indices = [s for s in plan.saved if s.dtype == "int64"]
    assert all(s.shape == (2, 4, 4, 4) for s in indices)


def test_casts_run_as_aten_to_copy_with_the_same_result():
    from remat.backends.eager.backend import _aten_casts

    prim = torch.ops.prims.convert_element_type.default

    def f(x, mask):
        return prim(x, torch.bfloat16), prim(mask, torch.float32)

    gm = torch.fx.symbolic_trace(f)
    x, mask = torch.randn(8, 4).t(), torch.randn(4, 8) > 0
    want = gm(x, mask)
    assert _aten_casts(gm) == 2
    assert not gm.graph.find_nodes(op="call_function", target=prim)
    got = gm(x, mask)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)


def test_gelu_and_tanh_backward_are_kept_whole_and_gradients_are_eager_bit_for_bit():
    # Note [Eager GELU]: one op forward and one backward, as eager runs them, so the step holds
    # no decomposition temporaries and computes eager's numbers exactly.
    def mlp():
        return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8), nn.GELU(approximate="tanh"), nn.Tanh())

    x = torch.randn(16, 8, requires_grad=True)
    rm = assert_same_training(mlp, [x], "eager", steps=2, lr=0.1, atol=0, rtol=0)
    (plan,) = remat.compiled_plans(rm)
    ops = [n.op for n in plan.nodes]
    assert ops.count("aten.gelu.default") == 2 and ops.count("aten.gelu_backward.default") == 2
    assert ops.count("aten.tanh_backward.default") == 1
    assert "aten.erf.default" not in ops and ops.count("aten.tanh.default") == 1  # nn.Tanh's


def test_dropout_saves_its_mask_not_its_output_and_gradients_are_eager_bit_for_bit():
    # Note [Eager dropout]: the dropped tensor is recomputed from the input and the mask.
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

        def forward(self, x):
            return self.fc2(nn.functional.dropout(torch.tanh(self.fc1(x)), 0.3, self.training))

    torch.manual_seed(0)
    model, x = Net(), torch.randn(16, 8, requires_grad=True)
    rm = remat.checkpoint(copy.deepcopy(model), backend="eager")
    got = [_seeded(rm, x, s) for s in (1, 2)][-1]
    want = _seeded(model, x, 2)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    (plan,) = remat.compiled_plans(rm)
    random = [s for s in plan.saved if s.reason == "replayed random op"]  # saved by default
    assert [(s.dtype, s.shape) for s in random] == [("bool", (16, 32))]  # the mask alone
    assert sum(n.op == "aten.native_dropout.default" for n in plan.nodes) == 1


def _seeded(model, x, seed):
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    xx = x.detach().clone().requires_grad_()
    out = model(xx)
    out.square().mean().backward()
    return [out, xx.grad, *(p.grad for p in model.parameters())]


def test_backends_say_what_they_can_do_by_attribute():
    """Capabilities are ``Backend`` attributes, never name compares (issue 24): only the uncompiled
    backend runs the partitioned graphs in remat's order (nested plans hold), only Inductor's reads
    the compiled step's peak (a budget's re-plan), and ATen's scratch is both backends' workspace."""
    from remat.backends.registry import backend_for

    eager, inductor = backend_for("eager"), backend_for("inductor")
    assert eager.keeps_op_order and not eager.reads_compiled_peak
    assert inductor.reads_compiled_peak and not inductor.keeps_op_order
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    assert eager.step_model(gm, nodes) is None  # op by op
    assert len(inductor.step_model(gm, nodes).facts) == len(nodes) == len(inductor.workspace(nodes))
