"""What the vision models share: random images and labels, cross-entropy on the float logits."""

from __future__ import annotations

import torch
import torch.nn as nn

from .workload import Workload, ce_loss

__all__ = ["images"]


def images(model: nn.Module, size: tuple[int, int], classes: int, gen: torch.Generator, device, *, ckpt,
           library: str, channels_last: bool = False, dropout: float = 0.0, **info) -> Workload:
    """``model`` stepped on ``size`` = (batch, side) random images (float32 here; ``zoo.build``
    casts them with the model) and fixed random labels. ``channels_last``: the model and its
    input in that memory format, as a channels-last training script has them."""
    batch, side = size
    x = torch.randn(batch, 3, side, side, generator=gen, device=device)
    y = torch.randint(0, classes, (batch,), generator=gen, device=device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
        info["memory_format"] = "channels_last"
    return Workload("", model, {"x": x, "y": y}, ce_loss, ckpt, dropout,
                    {"library": library, "batch": [batch, 3, side, side], **info})
