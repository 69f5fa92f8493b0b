"""Small models for equivalence tests."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(x))) + x


class InplaceViews(nn.Module):
    """In-place ops, views, transposes and slicing."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.scale = nn.Parameter(torch.ones(16))

    def forward(self, x):
        y = self.fc(x)
        y.mul_(2.0)
        y = y.view(4, -1, 16).transpose(0, 1)
        z = torch.sin(y) * 0.5
        z.add_(1.0)
        z = z * self.scale
        head = z[:, :2].clone()
        head.relu_()
        return torch.cat([head, z[:, 2:]], dim=1).reshape(-1, 16).tanh()


class SharedParam(nn.Module):
    """One weight used twice (tied), and a parameter used by two branches."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) * 0.2)
        self.b = nn.Parameter(torch.zeros(16))

    def forward(self, x):
        h = F.gelu(x @ self.w + self.b)
        return torch.tanh(h @ self.w.t() + self.b) * h
