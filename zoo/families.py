"""Small CPU configurations of the real-model families, each with its per-block checkpointed twin.

``build(name)`` returns a ``Family``: the seeded model, its inputs, its loss, and the same
model with ``torch.utils.checkpoint`` (non-reentrant) around each block, as users write it.

* ``gpt2``, ``llama``: Hugging Face ``transformers`` models at tiny sizes, the LM loss (next-token
  cross-entropy) and their own ``gradient_checkpointing_enable``.
* ``vit``, ``resnet``: hand-built ViT-style (patch embedding, pre-LN attention + GELU MLP
  blocks, class token) and ResNet-bottleneck-style (1x1/3x3/1x1 conv + BatchNorm + ReLU,
  residual) networks, the layers timm's ``vit_base_patch16_224`` and torchvision's ``resnet50``
  are made of (neither library installs on the CPU torch these tests run on).
* ``gpt``, ``mlp``: ``zoo/workloads.py`` at its ``medium`` size (``layers`` up to 4; more:
  its ``deep`` size, 12 and 16 blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tuc

from zoo import workloads

__all__ = ["Family", "build", "FAMILIES", "ViT", "Bottleneck", "ResNet"]

FAMILIES = ("gpt", "mlp", "gpt2", "llama", "vit", "resnet")


@dataclass
class Family:
    name: str
    model: nn.Module
    """Returns the scalar loss from ``*inputs``."""
    checkpointed: nn.Module
    """The same weights, each block under ``torch.utils.checkpoint``."""
    inputs: tuple[torch.Tensor, ...]


class _Loss(nn.Module):
    """``loss(net(*inputs))`` as one module (so that remat captures the loss too)."""

    def __init__(self, net: nn.Module, loss: Callable[..., torch.Tensor]):
        super().__init__()
        self.net, self.loss = net, loss

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.loss(self.net, *inputs)


class Checkpointed(nn.Module):
    """``blocks`` in sequence, each under non-reentrant ``torch.utils.checkpoint``."""

    def __init__(self, blocks: nn.Sequential):
        super().__init__()
        self.blocks = blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = tuc.checkpoint(b, x, use_reentrant=False)
        return x


class _ViTBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    """Patch embedding, class token, position embedding, pre-LN blocks, final norm, head on
    the class token (timm's ViT layout)."""

    def __init__(self, side: int = 32, patch: int = 4, d: int = 64, heads: int = 4, depth: int = 4,
                 classes: int = 10, checkpoint: bool = False):
        super().__init__()
        self.embed = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (side // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.Sequential(*[_ViTBlock(d, heads) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = Checkpointed(self.blocks)(x) if self.checkpoint else self.blocks(x)
        return self.head(self.norm(x)[:, 0])


class Bottleneck(nn.Module):
    """torchvision's bottleneck: 1x1 reduce, 3x3, 1x1 expand, each with BatchNorm; ReLU; residual."""

    def __init__(self, c: int, mid: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, c, 1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + x)


class ResNet(nn.Module):
    """Stem (conv, BatchNorm, ReLU, max-pool), bottleneck blocks, average pool, head."""

    def __init__(self, c: int = 32, mid: int = 8, depth: int = 4, classes: int = 10, checkpoint: bool = False):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.blocks = nn.Sequential(*[Bottleneck(c, mid) for _ in range(depth)])
        self.fc = nn.Linear(c, classes)
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = Checkpointed(self.blocks)(x) if self.checkpoint else self.blocks(x)
        return self.fc(x.mean((2, 3)))


def _hf(name: str, layers: int, dropout: float | None) -> tuple[nn.Module, nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    if name == "gpt2":
        p = {} if dropout is None else dict(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
        cfg = transformers.GPT2Config(n_layer=layers, n_embd=64, n_head=4, n_positions=256, vocab_size=128,
                                      bos_token_id=0, eos_token_id=0, attn_implementation="sdpa", **p)
        lm = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=layers,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                       max_position_embeddings=256, attn_implementation="sdpa")
        lm = transformers.LlamaForCausalLM(cfg)
    lm.train()
    ids = torch.randint(0, cfg.vocab_size, (2, 256), generator=torch.Generator().manual_seed(1))
    twin = _copy(lm)
    twin.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def loss(net: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        # The LM loss (next-token cross-entropy), written out: the models' own loss function
        # breaks the graph under Dynamo on transformers 5.
        logits = net(input_ids=ids, use_cache=False).logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())

    return _Loss(lm, loss), _Loss(twin, loss), (ids,)


def _copy(m: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(m)


def _ce(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(net(x), y)


def _square(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return workloads.loss(net(x))


def build(name: str, layers: int = 4, seed: int = 0, dropout: float | None = None) -> Family:
    """The family ``name`` (``FAMILIES``) at its CPU size with ``layers`` blocks (the workloads:
    their ``medium`` or ``deep`` depth, see the module docstring), seeded. ``dropout``: GPT-2's
    dropout probabilities (default: the model's, 0.1)."""
    torch.manual_seed(seed)
    if name in ("gpt2", "llama"):
        model, twin, inputs = _hf(name, layers, dropout)
        return Family(name, model, twin, inputs)
    if name in ("gpt", "mlp"):
        net, x = workloads.build(name, "medium" if layers <= 4 else "deep", seed=seed)
        return Family(name, _Loss(net, _square), _Loss(Checkpointed(net), _square), (x,))
    gen = torch.Generator().manual_seed(1)
    if name == "vit":
        net: nn.Module = ViT(depth=layers)
        x = torch.randn(8, 3, 32, 32, generator=gen)
    elif name == "resnet":
        net = ResNet(depth=layers)
        x = torch.randn(8, 3, 32, 32, generator=gen)
    else:
        raise ValueError(f"unknown family {name!r}; expected one of {FAMILIES}")
    twin = _copy(net)
    twin.checkpoint = True
    y = torch.randint(0, 10, (x.shape[0],), generator=gen)
    return Family(name, _Loss(net, _ce), _Loss(twin, _ce), (x, y))
