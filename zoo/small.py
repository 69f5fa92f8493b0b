"""Small versions of the four real-model families of ``benchmarks/real_models.py`` for CPU
tests: HF GPT-2 and Llama from transformers (tiny configs, SDPA, the model's own LM loss) and
hand-built ViT and ResNet-bottleneck models (timm and torchvision have no CPU wheels for the
tested torch). Each ``build`` returns (model, loss), where ``loss(fn)`` runs the step's forward
through ``fn`` (the model or its wrapped copy) and returns the scalar to differentiate."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from remat import compat

Loss = Callable[[Callable], torch.Tensor]


def _ids(vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


def gpt2() -> tuple[nn.Module, Loss]:
    import transformers

    cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=128, vocab_size=1024,
                                  bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    ids = _ids(1024, 4, 128)
    return transformers.GPT2LMHeadModel(cfg).train(), lambda f: f(input_ids=ids, labels=ids).loss


def llama() -> tuple[nn.Module, Loss]:
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                                   attn_implementation="sdpa")
    torch.manual_seed(0)
    ids = _ids(1024, 4, 128)
    return transformers.LlamaForCausalLM(cfg).train(), lambda f: f(input_ids=ids, labels=ids).loss


class _Block(nn.Module):
    """A ViT block: pre-norm attention (one qkv linear, SDPA) and a GELU MLP."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, d: int = 128, depth: int = 2, heads: int = 4, patch: int = 8, side: int = 64):
        super().__init__()
        self.embed = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (side // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x)[:, 0])


class _Bottleneck(nn.Module):
    """ResNet's bottleneck: 1x1, 3x3, 1x1 convolutions with batch norm, a residual, ReLU."""

    def __init__(self, c: int, mid: int):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.c2, self.b2 = nn.Conv2d(mid, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid)
        self.c3, self.b3 = nn.Conv2d(mid, c, 1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        return F.relu(x + self.b3(self.c3(y)))


class ResNet(nn.Module):
    def __init__(self, c: int = 64, mid: int = 16, depth: int = 2):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.layers = nn.ModuleList(_Bottleneck(c, mid) for _ in range(depth))
        self.fc = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.stem(x)))
        for b in self.layers:
            x = b(x)
        return self.fc(x.mean((2, 3)))


def _vision(make: Callable[[], nn.Module], side: int) -> tuple[nn.Module, Loss]:
    torch.manual_seed(0)
    model = make().train()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, side, side, generator=gen), torch.randint(0, 10, (8,), generator=gen)
    return model, lambda f: F.cross_entropy(f(x).float(), y)


def vit() -> tuple[nn.Module, Loss]:
    return _vision(ViT, 64)


def resnet() -> tuple[nn.Module, Loss]:
    return _vision(ResNet, 32)


MODELS = {"gpt2": gpt2, "llama": llama, "vit": vit, "resnet": resnet}


def measured_peak(fn: Callable, model: nn.Module, loss: Loss) -> int:
    """Peak bytes of one step on CPU (the profiler's allocation trace; ``compat``), after two
    steps that compile and warm up; gradients set to None before each step."""

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        loss(fn).backward()

    step()
    step()
    for p in model.parameters():
        p.grad = None
    return compat.measure_cpu_peak_bytes(step)
