"""Policy rules match the op the user wrote (Note [Rules match the op the user wrote]): under the
default backend Inductor's decompositions split GELU before planning, and ``ops="aten.gelu"``
still names its value."""

import warnings

import torch
import torch.nn as nn

import remat


class _GeluMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 128), nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def test_save_gelu_matches_the_decomposed_gelu_under_inductor():
    torch.manual_seed(0)
    model, x = _GeluMLP(), torch.randn(8, 32, requires_grad=True)
    rule = remat.save(ops="aten.gelu", name="keep-gelu")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        plan = remat.explain(model, x, policy=rule)  # default backend: Inductor's decompositions
    assert not [m for m in w if "matched no op" in str(m.message)]
    kept = [s for s in plan.saved if s.reason == "user rule `keep-gelu`"]
    assert len(kept) == 1
    # The value GELU returned: the fc1-sized product that fc2 reads, not an intermediate.
    assert kept[0].op == "aten.mul.Tensor" and kept[0].shape == (8, 128)
    assert plan.saved_bytes >= remat.explain(model, x).saved_bytes


def test_recompute_gelu_matches_the_decomposed_gelu_under_inductor():
    model, x = _GeluMLP(), torch.randn(8, 32, requires_grad=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        plan = remat.explain(model, x, policy=remat.recompute(ops="aten.gelu", name="redo-gelu"))
    assert not [m for m in w if "matched no op" in str(m.message)]
    assert not [s for s in plan.saved if s.reason == "user rule `redo-gelu`"]
