"""A fixed small model for the report tests (golden table, CLI, HTML).

Do not edit the lines of this file: the golden table records ``report_model.py:<line>``.
``factory()`` is the CLI's entry point: ``python -m remat explain zoo/report_model.py:factory``.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import remat


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.Tanh()
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.fc1(self.ln(x))
        h = self.drop(F.gelu(h) * self.act(h))
        keep = torch.rand(x.shape[0], 1)  # a random per-row scale: the backward reads it
        return x + self.fc2(h) * keep


class Net(nn.Module):
    def __init__(self, d: int = 16, blocks: int = 3):
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(blocks))
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).sum(dim=-1)


POLICY = [remat.save(modules="layers.*.act")]


def factory():
    """``(model, example_args)``: the model wrapped with a user rule that saves ``layers.*.act``."""
    torch.manual_seed(0)
    model = remat.checkpoint(Net(), backend="eager", policy=POLICY)
    x = torch.randn(8, 16, requires_grad=True)
    return model, (x,)


def factory_kwargs():
    """``(model, example_args, example_kwargs)`` with no policy."""
    torch.manual_seed(0)
    return Net(), (), {"x": torch.randn(8, 16, requires_grad=True)}
