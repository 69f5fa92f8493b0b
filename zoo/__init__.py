"""The model zoo that benchmarks and tests share: real models built from their own libraries
(transformers, timm, torchvision) and left unchanged, only their configs chosen; each at the
benchmark's size for one H200 and at a ``tiny`` size for CPU smoke runs.

    from zoo import SUITE, MODELS, build
    wl = build("convnext", tiny=True, device="cpu", dtype=torch.float32)
    wl.loss(wl.model, wl.inputs).backward()

``SUITE`` is the ordered list of names; ``MODELS[name]`` says the model's library, family and what
it exercises. The repository root must be on ``sys.path`` (the benchmark scripts put it there).

The other models tests and benchmarks share, each a module here: ``workloads`` (the reference
workloads pointwise, mlp and gpt, at any size), ``families`` (small CPU configurations of the
real-model families with their per-block checkpointed twins), ``small`` (small GPT-2, Llama, ViT
and ResNet for the peak tests and plan pins), ``modules`` (small modules for equivalence tests)
and ``report_model`` (the fixed model of the golden report table: do not edit its lines).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import hf, timm_models, torchvision_models
from .workload import Workload

__all__ = ["Model", "MODELS", "SUITE", "build", "Workload"]


@dataclass(frozen=True)
class Model:
    name: str
    library: str
    """The package that builds it (the import a test skips on)."""
    family: str
    exercises: str
    """What about it the planner and Inductor meet that the other models do not."""
    builder: Callable[..., Workload]


_MODELS = (
    Model("gpt2", "transformers", "causal LM", "learned positions, dropout 0.1 (attention too), tied LM head, "
          "a graph break before the loss", hf.gpt2),
    Model("llama", "transformers", "causal LM", "RoPE, RMSNorm, SwiGLU, grouped-query attention", hf.llama),
    Model("vit", "timm", "vision transformer", "global attention over 197 tokens, class token, GELU MLP",
          timm_models.vit),
    Model("resnet50", "torchvision", "convnet", "dense 3x3 convs, BatchNorm in train mode (running statistics)",
          torchvision_models.resnet50),
    Model("convnext", "timm", "depthwise convnet, channels-last",
          "7x7 depthwise convs, LayerNorm over channels of NHWC tensors, layer scale", timm_models.convnext),
    Model("efficientnet", "timm", "depthwise convnet, channels-last",
          "inverted residuals, squeeze-excite (global pooling, sigmoid gates), SiLU, BatchNorm",
          timm_models.efficientnet),
    Model("mobilenetv3", "torchvision", "depthwise convnet, channels-last",
          "hard-swish, hard-sigmoid squeeze-excite, BatchNorm, dropout; small, host-bound steps",
          torchvision_models.mobilenetv3),
    Model("swin", "torchvision", "windowed-attention vision transformer",
          "shifted windows (roll, pad, window masks), relative position bias, patch merging, stochastic depth",
          torchvision_models.swin),
    Model("bert", "transformers", "encoder, masked LM",
          "attention dropout 0.1 in training, padding-free bidirectional attention, MLM loss on 15%", hf.bert),
    Model("t5", "transformers", "encoder-decoder",
          "relative position bias as an additive mask, cross-attention, dropout 0.1, two stacks", hf.t5),
    Model("mixtral", "transformers", "mixture-of-experts causal LM",
          "top-2 router (softmax, topk), tokens sorted by expert, grouped matmuls, scatter back", hf.mixtral),
    Model("mamba2", "transformers", "state-space LM",
          "torch-path chunked scan: cumsum, segment sums, exp, large broadcast reductions, depthwise conv1d",
          hf.mamba2),
)

MODELS: dict[str, Model] = {m.name: m for m in _MODELS}
SUITE: tuple[str, ...] = tuple(MODELS)


def build(name: str, *, tiny: bool, device: torch.device | str, dtype: torch.dtype, no_dropout: bool = False,
          batch: tuple[int, ...] | None = None, config: dict | None = None) -> Workload:
    """The model ``name`` (``SUITE``) at the benchmark's size (or ``tiny``), seeded, in ``dtype``
    and train mode on ``device``, with its inputs. ``no_dropout``: its dropout (and stochastic
    depth) probabilities set to 0. ``batch`` replaces the input shape: (batch, sequence) for the
    language models, (batch, side) for the vision ones; ``config`` adds keyword arguments to the
    model's config (vision: to its builder)."""
    if name not in MODELS:
        raise ValueError(f"zoo: unknown model {name!r}; expected one of {', '.join(SUITE)}")
    device = torch.device(device)
    torch.manual_seed(0)
    gen = torch.Generator(device).manual_seed(1)
    with torch.device(device):
        wl = MODELS[name].builder(tiny, device, gen, no_dropout, batch, config)
    wl.name = name
    wl.model = wl.model.to(dtype).train()
    wl.inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in wl.inputs.items()}
    wl.info["params"] = sum(p.numel() for p in wl.model.parameters())
    wl.info["family"] = MODELS[name].family
    return wl
