"""``remat.explain`` and ``remat.pareto`` inspect a model without changing it: buffers,
parameters, ``.grad``, the random generators and the inputs are as they were (issue 15, item 2;
issue 29, item 11)."""

import pytest
import torch
import torch.nn as nn

import remat


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(model, before):
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), k


@pytest.mark.parametrize("probe", [remat.explain, remat.pareto])
def test_batchnorm_buffers_untouched(probe):
    model = cnn()
    x = torch.randn(2, 3, 8, 8)
    before = snapshot(model)
    probe(model, x)
    assert_same_state(model, before)
    assert model[1].num_batches_tracked.item() == 0


def test_batchnorm_buffers_untouched_through_a_wrapped_model():
    model = cnn()
    x = torch.randn(2, 3, 8, 8)
    before = snapshot(model)
    remat.explain(remat.checkpoint(model, backend="eager"), x)
    assert_same_state(model, before)


def test_random_generator_untouched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    remat.explain(model, x)
    assert torch.equal(torch.rand(3), expected)


def test_grad_untouched():
    class GradReader(nn.Module):
        """Zeroes the gradient of its weight in forward (as a badly placed zero_grad would)."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            self.lin.weight.grad = None
            return self.lin(x).tanh()

    model = GradReader()
    grad = torch.full_like(model.lin.weight, 0.5)
    model.lin.weight.grad = grad
    remat.explain(model, torch.randn(2, 4, requires_grad=True))
    assert model.lin.weight.grad is grad
    assert torch.equal(grad, torch.full_like(grad, 0.5))


def test_parameter_values_untouched():
    class Clamped(nn.Module):
        """Clamps its own parameter in place in forward (a projection some models do)."""

        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.full((4,), 3.0))

        def forward(self, x):
            with torch.no_grad():
                self.scale.clamp_(0.0, 1.0)
            return (x * self.scale).sin()

    model = Clamped()
    remat.explain(model, torch.randn(2, 4, requires_grad=True))
    assert torch.equal(model.scale.detach(), torch.full((4,), 3.0))


@pytest.mark.parametrize("probe", [remat.explain, remat.pareto])
def test_inputs_written_in_place_are_restored(probe):
    class Scales(nn.Module):
        """Scales its input in place and clears a mask it is given (as some preprocessing does)."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, extra):
            x.mul_(2.0)
            extra["mask"].zero_()
            return (self.lin(x) * extra["mask"]).tanh()

    x, mask = torch.randn(2, 4), torch.ones(2, 4)
    before = x.clone()
    probe(Scales(), x, extra={"mask": mask})
    assert torch.equal(x, before)
    assert torch.equal(mask, torch.ones(2, 4))
