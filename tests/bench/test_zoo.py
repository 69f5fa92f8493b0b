"""``zoo``: every suite model's tiny configuration builds from its own library and trains one
step under remat (uncompiled backend) with eager autograd's loss, gradients and buffers
(BatchNorm's running statistics updated once). Models whose library is not installed are
skipped (timm and torchvision are not in the test environment)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import remat
import zoo
from benchmarks import real_models

from ..conftest import train_step


class _Step(nn.Module):
    """One workload's loss as a module without inputs, so remat captures the loss too."""

    def __init__(self, wl: zoo.Workload):
        super().__init__()
        self.model, self.inputs, self.loss = wl.model, wl.inputs, wl.loss

    def forward(self) -> torch.Tensor:
        return self.loss(self.model, self.inputs)


def test_registry_names_every_model_once_with_its_library():
    assert zoo.SUITE == tuple(zoo.MODELS) and len(set(zoo.SUITE)) == len(zoo.SUITE) >= 12
    assert set(real_models.MODELS) <= set(zoo.SUITE)
    assert {m.library for m in zoo.MODELS.values()} == {"transformers", "timm", "torchvision"}
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        zoo.build("nope", tiny=True, device="cpu", dtype=torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.SUITE)
def test_tiny_model_trains_under_remat_as_under_eager_autograd(name):
    pytest.importorskip(zoo.MODELS[name].library)
    wl = zoo.build(name, tiny=True, device="cpu", dtype=torch.float32)
    assert wl.name == name and wl.info["params"] > 0
    assert wl.with_ckpt is not None, f"{name}: every suite model has a per-block checkpointing twin"
    # Dropout and stochastic depth stay on: from the same seed the uncompiled backend draws eager's masks.
    ref_model = copy.deepcopy(_Step(wl))
    wrapped = remat.checkpoint(copy.deepcopy(_Step(wl)), backend="eager", strict=True)
    torch.manual_seed(0)
    ref_loss, _, ref_grads = train_step(ref_model, loss_fn=lambda y: y)
    torch.manual_seed(0)
    loss, _, grads = train_step(wrapped, loss_fn=lambda y: y)
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for k, g in ref_grads.items():
        assert (grads[k] is None) == (g is None), k
    # Relative L2 errors, not elementwise ones: decomposed ops sum in another order (BatchNorm's
    # backward above all: ResNet-18's first conv differs by 8e-4 in an element of a cancelling sum).
    pairs = [(grads[k], g) for k, g in ref_grads.items() if g is not None]
    assert real_models.rel_error([a for a, _ in pairs], [b for _, b in pairs]) < 5e-4, name
    # Each parameter on its own, against a floor of the whole step's gradient scale: some gradients
    # are zero in exact arithmetic (BERT's key bias: softmax ignores a shift shared by a row), and
    # their rounding noise has no scale of its own.
    floor = 1e-6 * max(g.abs().max().item() for _, g in pairs)
    for k, g in ref_grads.items():
        if g is not None:
            err = (grads[k] - g).norm().item()
            assert err <= 1e-2 * g.norm().item() + floor * g.numel() ** 0.5, f"{name} {k}: {err}"
    tol = {"atol": 1e-4, "rtol": 1e-3}
    for (k, a), (_, b) in zip(wrapped.named_buffers(), ref_model.named_buffers()):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, k=k: f"{name} buffer {k}: {m}")
    plans = remat.compiled_plans(wrapped)
    assert plans and all(p.fallback is None for p in plans)


@pytest.mark.parametrize("name", zoo.SUITE)
def test_no_dropout_turns_every_dropout_and_stochastic_depth_off(name):
    pytest.importorskip(zoo.MODELS[name].library)
    wl = zoo.build(name, tiny=True, device="cpu", dtype=torch.float32, no_dropout=True)
    probs = [(n, getattr(m, "p", getattr(m, "drop_prob", None))) for n, m in wl.model.named_modules()
             if type(m).__name__ in ("Dropout", "StochasticDepth", "DropPath")]
    assert all(p == 0.0 for _, p in probs), (name, [x for x in probs if x[1] != 0.0])


def test_full_size_swin_builds_without_stochastic_depth():
    # torchvision's swin_t names its own stochastic depth, so the zoo may not pass a second one
    pytest.importorskip("torchvision")
    wl = zoo.build("swin", tiny=False, device="cpu", dtype=torch.float32, no_dropout=True)
    depths = [m.p for m in wl.model.modules() if type(m).__name__ == "StochasticDepth"]
    assert depths and all(p == 0.0 for p in depths)
