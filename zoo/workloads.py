"""The reference workloads of the project's benchmarks (pointwise, mlp, gpt), at any size.

``build(name, size="small"|"full", dtype=..., device=...)`` returns ``(model, x)``; the loss of
every workload is ``loss(y) = y.float().square().mean()``. "full" sizes are the GPU benchmark
sizes; "small" sizes run in seconds on a CPU; "medium" sizes (more rows) make activations,
not parameters, dominate memory while still running in seconds on a CPU.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["PointwiseLayer", "MlpBlock", "GptBlock", "build", "loss", "SIZES", "WORKLOADS"]


class PointwiseLayer(nn.Module):
    """``y = gelu(x + b) * g; y = tanh(y) * sigmoid(y) + x; x = layer_norm(y)`` (no affine)."""

    def __init__(self, d: int):
        super().__init__()
        self.b = nn.Parameter(torch.randn(d) * 0.1)
        self.g = nn.Parameter(1 + torch.randn(d) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(x + self.b) * self.g
        y = torch.tanh(y) * torch.sigmoid(y) + x
        return F.layer_norm(y, (y.shape[-1],))


class MlpBlock(nn.Module):
    """``x = x + fc2(gelu(fc1(layer_norm(x))))``."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class GptBlock(nn.Module):
    """Pre-LN: ``x = x + proj(attn(ln1(x))); x = x + fc2(gelu(fc1(ln2(x))))``."""

    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


SIZES = {
    "pointwise": {"full": dict(n=16384, d=4096, layers=8), "small": dict(n=64, d=128, layers=8),
                  "medium": dict(n=1024, d=128, layers=8), "deep": dict(n=256, d=512, layers=32)},
    "mlp": {"full": dict(n=16384, d=2048, hidden=8192, blocks=4),
            "small": dict(n=64, d=64, hidden=256, blocks=4),
            "medium": dict(n=1024, d=64, hidden=256, blocks=4),
            "deep": dict(n=1024, d=64, hidden=256, blocks=16)},
    "gpt": {"full": dict(batch=8, seq=1024, d=1024, heads=16, hidden=4096, blocks=12),
            "small": dict(batch=2, seq=16, d=64, heads=4, hidden=256, blocks=2),
            "medium": dict(batch=2, seq=256, d=64, heads=4, hidden=256, blocks=2),
            "deep": dict(batch=2, seq=256, d=64, heads=4, hidden=256, blocks=12)},
}
"""Sizes of each workload. ``full``: the project's GPU configuration. ``small`` and ``medium``:
CPU sizes of the same depth (``medium`` has more rows, so that activations outweigh parameters).
``deep``: CPU sizes with more layers (32, 16, 12), where a quarter of eager's peak is reachable:
the smallest peak of any plan is the checkpoints plus one layer's backward working set, so it
shrinks relative to eager's as depth grows."""
WORKLOADS = tuple(SIZES)


def build(name: str, size: str = "small", *, dtype: torch.dtype = torch.float32,
          device: str | torch.device = "cpu", seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """``(model, x)`` for a workload; ``x`` requires grad."""
    if name not in SIZES:
        raise ValueError(f"unknown workload {name!r}; expected one of {WORKLOADS}")
    s = SIZES[name][size]
    torch.manual_seed(seed)
    if name == "pointwise":
        model: nn.Module = nn.Sequential(*[PointwiseLayer(s["d"]) for _ in range(s["layers"])])
        shape: tuple[int, ...] = (s["n"], s["d"])
    elif name == "mlp":
        model = nn.Sequential(*[MlpBlock(s["d"], s["hidden"]) for _ in range(s["blocks"])])
        shape = (s["n"], s["d"])
    else:
        model = nn.Sequential(*[GptBlock(s["d"], s["heads"], s["hidden"]) for _ in range(s["blocks"])])
        shape = (s["batch"], s["seq"], s["d"])
    model = model.to(device=device, dtype=dtype)
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    return model, x


def loss(y: torch.Tensor) -> torch.Tensor:
    return y.float().square().mean()
