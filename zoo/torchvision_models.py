"""torchvision models (random weights); ``config`` adds keyword arguments to the model's builder.
torchvision has no checkpointing switch: ``zoo.checkpointing`` writes their forwards out with
``torch.utils.checkpoint`` around each stage."""

from __future__ import annotations

from .checkpointing import FeaturesCheckpointed, StageCheckpointed
from .vision import images
from .workload import Workload

__all__ = ["resnet50", "mobilenetv3", "swin"]


def _lib() -> str:
    import torchvision

    return f"torchvision {torchvision.__version__}"


def _size(tiny: bool, batch, default: int = 128) -> tuple[int, int]:
    return tuple(batch) if batch else (4, 32) if tiny else (default, 224)


def resnet50(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """ResNet-50 (bottlenecks, BatchNorm in train mode), 224 px, batch 128; tiny: ResNet-18."""
    import torchvision.models as tvm

    kw = config or {}
    model = tvm.resnet18(weights=None, num_classes=10, **kw) if tiny else tvm.resnet50(weights=None, **kw)
    return images(model, _size(tiny, batch), 10 if tiny else 1000, gen, device, ckpt=StageCheckpointed,
                  library=_lib())


def mobilenetv3(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """MobileNetV3-Large (depthwise convs, squeeze-excite, hard-swish, BatchNorm, dropout 0.2 before
    the last layer), channels-last, 224 px, batch 256; tiny: MobileNetV3-Small."""
    import torchvision.models as tvm

    kw = {"dropout": 0.0} if no_dropout else {}
    kw.update(config or {})
    model = (tvm.mobilenet_v3_small(weights=None, num_classes=10, **kw) if tiny else
             tvm.mobilenet_v3_large(weights=None, **kw))
    dropout = model.classifier[2].p
    return images(model, _size(tiny, batch, 256), 10 if tiny else 1000, gen, device, ckpt=FeaturesCheckpointed,
                  library=_lib(), channels_last=True, dropout=dropout)


def swin(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """Swin-T (shifted-window attention with relative position bias, patch merging, stochastic
    depth 0.2), 224 px, batch 128; tiny: two stages of two blocks, windows of 4, 32 px."""
    import torchvision.models as tvm
    from torchvision.models.swin_transformer import SwinTransformer

    kw = dict(config or {})
    model = (SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
                             num_classes=10, **kw) if tiny else tvm.swin_t(weights=None, **kw))
    if no_dropout:  # swin_t passes its own stochastic_depth_prob, so a second one is refused
        for m in model.modules():
            if type(m).__name__ == "StochasticDepth":
                m.p = 0.0
    dropout = max(getattr(m, "p", 0.0) for m in model.modules() if type(m).__name__ == "StochasticDepth")
    return images(model, _size(tiny, batch), 10 if tiny else 1000, gen, device, ckpt=FeaturesCheckpointed,
                  library=_lib(), dropout=dropout)
