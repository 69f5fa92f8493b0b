"""A value computed from indices alone (a causal mask built from ``arange``) and read by several
extern kernels (each layer's attention) is computed once under Inductor: remat saves its index
source (Note [Values computed from indices] in ``remat/backends/inductor/lowering.py``)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import remat
from remat.capture.attention import AttentionReport


@pytest.fixture(autouse=True)
def masks_stay(monkeypatch):
    """The causal mask stays as the model builds it: the attention rewrite would turn it into
    ``is_causal=True`` before planning (Note [Attention as eager runs it] in
    ``remat/capture/attention.py``), and these tests are about a mask that reaches Inductor."""
    monkeypatch.setattr("remat.capture.dynamo_backend.rewrite_attention",
                        lambda gm, strict=False: AttentionReport())


class Masked(nn.Module):
    """Layers of attention that all read one causal mask the forward builds from ``arange``, as
    HF models build theirs."""

    def __init__(self, d: int = 32, heads: int = 4, layers: int = 3):
        super().__init__()
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        i = torch.arange(s, device=x.device)
        mask = torch.where(i[None, :] <= i[:, None], 0.0, float("-inf")).to(x.dtype)
        for lin in self.qkv:
            q, k, v = lin(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, d)
        return x


def model_and_input() -> tuple[Masked, torch.Tensor]:
    torch.manual_seed(0)
    return Masked(), torch.randn(2, 64, 32)


def test_inductor_plan_saves_the_index_source_and_recomputes_the_mask():
    m, x = model_and_input()
    plan = remat.explain(remat.checkpoint(m, backend="inductor"), x)
    kept = [n for n in plan.nodes if n.reason == "index source"]
    assert [(n.op, n.status.value) for n in kept] == [("prims.iota.default", "saved")]
    assert kept[0].nbytes == 64 * 8  # the positions, int64: not the mask
    mask = [n for n in plan.nodes if n.op == "aten.where.self"]
    assert [n.status.value for n in mask] == ["recomputed"]


def test_uncompiled_backend_has_no_index_source():
    """Run op by op, the mask is computed once wherever it is recomputed: nothing to keep."""
    m, x = model_and_input()
    plan = remat.explain(remat.checkpoint(m, backend="eager"), x)
    assert not [n for n in plan.nodes if n.reason == "index source"]
    assert [n.status.value for n in plan.nodes if n.op == "prims.iota.default"] == ["recomputed"]


def _mask_kernel_calls(code: str) -> int:
    """Calls, in one compiled graph, of generated kernels that compare indices (the mask)."""
    body = code.split("def call(")[-1]
    return sum(1 for k in re.findall(r"\b(cpp_fused_\w+|triton_\w+)\.run\(|\b(cpp_fused_\w+)\(", body)
               if "_le_" in (k[0] or k[1]))


@pytest.mark.inductor
def test_inductor_computes_the_mask_once_per_graph():
    """Without the saved source each layer's attention got its own copy of the mask, in the
    forward and again in the backward (3 + 3 kernel calls here)."""
    from torch._inductor.utils import run_and_get_code

    m, x = model_and_input()
    ref = Masked()
    ref.load_state_dict(m.state_dict())
    ref(x).square().sum().backward()
    compiled = remat.checkpoint(m)
    _, codes = run_and_get_code(lambda: compiled(x).square().sum().backward())
    assert [_mask_kernel_calls(c) for c in codes] == [1, 1]
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=2e-5, rtol=2e-4)  # as tests/correctness/test_equivalence.py


class Stem(nn.Module):
    """ResNet's stem and the two convolutions of its first block that read the max-pool's output
    (the block's first convolution and its downsample)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.branch, self.down = nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(8, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return self.branch(x) + self.down(x)


def test_a_multi_output_ops_result_is_not_an_index_source():
    """``getitem`` of the max-pool (output, indices) pair has no tensor input of its own; taking it
    for a value computed from indices saved the pooled activation for nothing (ResNet-50's
    measured peak rose by 47 MiB on the H200)."""
    torch.manual_seed(0)
    plan = remat.explain(remat.checkpoint(Stem().train(), backend="inductor"), torch.randn(2, 3, 32, 32))
    assert not [n for n in plan.nodes if n.reason == "index source"]
