"""timm models (``timm.create_model``, random weights); ``config`` adds keyword arguments to
``create_model``; each has timm's own per-block checkpointing (``set_grad_checkpointing``)."""

from __future__ import annotations

from .vision import images
from .workload import Workload, timm_ckpt

__all__ = ["vit", "convnext", "efficientnet"]


def _create(name: str, tiny_name: str, tiny: bool, config: dict | None, **tiny_kw):
    import timm

    model = (timm.create_model(tiny_name, pretrained=False, num_classes=10, **tiny_kw, **(config or {})) if tiny
             else timm.create_model(name, pretrained=False, **(config or {})))
    return model, f"timm {timm.__version__}"


def _size(tiny: bool, batch) -> tuple[int, int]:
    return tuple(batch) if batch else (4, 32) if tiny else (128, 224)


def vit(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """ViT-B/16 at 224 px, batch 128."""
    model, lib = _create("vit_base_patch16_224", "vit_tiny_patch16_224", tiny, config, img_size=32, depth=2)
    return images(model, _size(tiny, batch), 10 if tiny else 1000, gen, device, ckpt=timm_ckpt, library=lib)


def convnext(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """ConvNeXt-T (7x7 depthwise convs, LayerNorm over channels, layer scale), channels-last, 224 px,
    batch 128."""
    model, lib = _create("convnext_tiny", "test_convnext", tiny, config)
    return images(model, _size(tiny, batch), 10 if tiny else 1000, gen, device, ckpt=timm_ckpt, library=lib,
                  channels_last=True)


def efficientnet(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """EfficientNet-B0 (depthwise separable inverted residuals, squeeze-excite, SiLU, BatchNorm),
    channels-last, 224 px, batch 128."""
    model, lib = _create("efficientnet_b0", "test_efficientnet", tiny, config)
    return images(model, _size(tiny, batch), 10 if tiny else 1000, gen, device, ckpt=timm_ckpt, library=lib,
                  channels_last=True)
