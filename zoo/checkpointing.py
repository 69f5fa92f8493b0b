"""Per-stage checkpointing for torchvision models, which have no switch of their own: the model's
forward written out with non-reentrant ``torch.utils.checkpoint`` around each stage, sharing the
model's modules. (BatchNorm's running statistics are updated again by the recompute, as
``torch.utils.checkpoint`` always does.)"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.utils.checkpoint as tuc

__all__ = ["StageCheckpointed", "FeaturesCheckpointed"]


class StageCheckpointed(nn.Module):
    """torchvision ResNet's forward with each of its four stages checkpointed."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.net
        x = n.maxpool(n.relu(n.bn1(n.conv1(x))))
        for stage in (n.layer1, n.layer2, n.layer3, n.layer4):
            x = tuc.checkpoint(stage, x, use_reentrant=False)
        return n.fc(torch.flatten(n.avgpool(x), 1))


class FeaturesCheckpointed(nn.Module):
    """A torchvision model whose forward is ``head(features(x))`` (MobileNetV3, Swin), with each
    child of ``features`` checkpointed: MobileNetV3's blocks, Swin's stages and patch merges."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.net
        for part in n.features:
            x = tuc.checkpoint(part, x, use_reentrant=False)
        if hasattr(n, "head"):  # torchvision SwinTransformer.forward after its features
            return n.head(n.flatten(n.avgpool(n.permute(n.norm(x)))))
        return n.classifier(torch.flatten(n.avgpool(x), 1))  # MobileNetV3._forward_impl after its features
