"""What a benchmark or a test needs of one model: the ``Workload`` (the seeded model, its inputs,
its loss and its per-block checkpointed twin) and the losses and checkpointing switches the
models share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Workload", "hf_lm_loss", "hf_loss", "ce_loss", "hf_ckpt", "timm_ckpt"]


@dataclass
class Workload:
    name: str
    model: nn.Module
    """Seeded initialisation, on the device, in the benchmark dtype; each strategy deep-copies it."""
    inputs: dict[str, torch.Tensor]
    loss: Callable[[Callable, dict], torch.Tensor]
    """loss(fn, inputs): the scalar the step differentiates."""
    with_ckpt: Callable[[nn.Module], nn.Module] | None
    """Turns on the model's own per-block checkpointing (or wraps it so); returns what to call.
    None where neither the library nor the zoo offers one (``info["ckpt"]`` says why)."""
    dropout: float
    """The largest probability of the model's random ops in training (dropout, stochastic depth):
    above 0, compiled strategies draw other masks than eager's, so gradients differ by noise."""
    info: dict = field(default_factory=dict)


def hf_lm_loss(fn: Callable, inputs: dict) -> torch.Tensor:
    """A causal LM's own loss, next-token cross-entropy of ``inputs["ids"]`` (``labels=input_ids``)."""
    return fn(input_ids=inputs["ids"], labels=inputs["ids"]).loss


def hf_loss(fn: Callable, inputs: dict) -> torch.Tensor:
    """The model's own loss, ``inputs`` being its keyword arguments, ``labels`` among them
    (masked-LM labels, an encoder-decoder's targets)."""
    return fn(**inputs).loss


def ce_loss(fn: Callable, inputs: dict) -> torch.Tensor:
    """Cross-entropy of the float logits of ``inputs["x"]`` on the labels ``inputs["y"]``."""
    return F.cross_entropy(fn(inputs["x"]).float(), inputs["y"])


def hf_ckpt(model: nn.Module) -> nn.Module:
    """Hugging Face's per-layer checkpointing (non-reentrant ``torch.utils.checkpoint``)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def timm_ckpt(model: nn.Module) -> nn.Module:
    """timm's per-block checkpointing."""
    model.set_grad_checkpointing(True)
    return model
