"""Recomputed values Inductor would pin to their traced strides are stored once, channels-last
(Note [Recomputed values in the forward's layout] in ``remat.backends.inductor.hooks``)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import remat
from remat.backends.inductor import backend as inductor_backend
from remat.backends.inductor import hooks

pytestmark = pytest.mark.inductor


def _block(c: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())


class ConvNet(nn.Module):
    def __init__(self, c: int = 16, n: int = 4):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*[_block(c) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x)).mean()


class MLP(nn.Module):
    def __init__(self, d: int = 64, n: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x)) * torch.sigmoid(x)
        return x.mean()


def _backwards(monkeypatch) -> list:
    """Each backward graph remat hands Inductor, after the layout pass, with its count of changed values."""
    seen = []

    def record(bw):
        seen.append((bw, hooks.recomputed_in_forward_layout(bw)))
        return seen[-1][1]

    monkeypatch.setattr(inductor_backend, "recomputed_in_forward_layout", record)
    return seen


def _train(model: nn.Module, x: torch.Tensor, **kw) -> tuple[nn.Module, list]:
    torch._dynamo.reset()
    wrapped = remat.checkpoint(copy.deepcopy(model), backend="inductor", **kw)
    wrapped(x).backward()
    return wrapped, remat.compiled_plans(wrapped)


def test_recomputed_conv_inputs_are_stored_once_channels_last_with_eager_gradients(monkeypatch):
    torch.manual_seed(0)
    model, x = ConvNet(), torch.randn(8, 3, 32, 32)
    ref = copy.deepcopy(model)
    ref(x).backward()
    seen = _backwards(monkeypatch)
    # the premise, whatever plan a budget would pick on this torch: every block recomputed, so each
    # recomputed BatchNorm-ReLU output is read by the next recomputed convolution and its weight gradient
    blocks = remat.recompute(modules="blocks.*")
    wrapped, plans = _train(model, x, policy=blocks)
    assert plans[0].recompute_counts().get("aten.convolution.default", 0) > 0
    (bw, changed), = seen
    clones = [n for n in bw.graph.nodes if n.target is torch.ops.aten.clone.default
              and n.kwargs.get("memory_format") is torch.channels_last]
    assert changed == len(clones) > 0
    for c in clones:
        (src,) = c.all_input_nodes
        assert list(src.users) == [c], "every reader of the value reads its clone"
        targets = {u.target for u in c.users}
        assert torch.ops.aten.convolution_backward.default in targets and len(c.users) >= 2
        assert src.meta["val"].is_contiguous() and c.meta["val"].is_contiguous(memory_format=torch.channels_last)
    for (k, a), (_, b) in zip(wrapped.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}")
    # the clone replaces a store, never adds one: Inductor's memory plan is no larger than without the pass
    monkeypatch.setattr(inductor_backend, "recomputed_in_forward_layout", lambda bw: 0)
    _, without = _train(model, x, policy=blocks)
    assert plans[0].compiled_peak_bytes <= without[0].compiled_peak_bytes


def test_graphs_without_convolutions_keep_their_traced_layout(monkeypatch):
    torch.manual_seed(0)
    seen = _backwards(monkeypatch)
    _, plans = _train(MLP(), torch.randn(32, 64), budget=0.9)
    assert plans[0].recompute_counts(), "the premise: the plan recomputes"
    assert [changed for _, changed in seen] == [0]
    assert not [n for n in seen[0][0].graph.nodes if n.target is torch.ops.aten.clone.default
                and n.kwargs.get("memory_format") is torch.channels_last]
