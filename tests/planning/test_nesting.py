"""Nested checkpoint plans (remat.planning.nesting): checkpoints recomputed from other checkpoints."""

from __future__ import annotations

import copy

import jsonschema
import torch
import torch.nn as nn
import torch.nn.functional as F

import remat
from remat import compat
from remat.core.segments import nested_sets
from remat.report.schema import SCHEMA


def test_nested_sets_keep_every_mth_checkpoint_and_recompute_the_rest():
    sets = [(4,), (1, 3, 6, 8), tuple(range(1, 16))]
    pairs = nested_sets(sets)
    # The finest set first: m = 2, then m = round(sqrt(16)) = 4, then none kept (m = 16).
    assert pairs[0] == ((2, 4, 6, 8, 10, 12, 14), (1, 3, 5, 7, 9, 11, 13, 15))
    assert pairs[1] == ((4, 8, 12), (1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15))
    assert pairs[2] == ((), tuple(range(1, 16)))
    # (1, 3, 6, 8): m = 2 and round(sqrt(5)) = 2 coincide; sets of fewer than 3 are skipped.
    assert pairs[3:] == [((3, 8), (1, 6)), ((), (1, 3, 6, 8))]
    assert len(nested_sets(sets, limit=2)) == 2


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.g = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x + F.dropout(F.gelu(self.fc(x)), 0.1, self.training) * torch.tanh(x * self.g)


class Deep(nn.Module):
    """16 residual blocks with dropout; the loss inside, so that the step is one graph."""

    def __init__(self, d: int = 32, depth: int = 16):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(d) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(x).square().mean()


def _step(model, x, seed):
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    xx = x.detach().clone().requires_grad_()
    loss = model(xx)
    loss.backward()
    return loss, xx.grad, [p.grad for p in model.parameters()]


def test_smallest_plan_is_nested_exact_and_counts_ops_recomputed_twice():
    torch.manual_seed(0)
    model, x = Deep(), torch.randn(64, 32, requires_grad=True)
    frontier = remat.pareto(remat.checkpoint(copy.deepcopy(model), backend="eager"), x)
    low = min(frontier.points, key=lambda p: (p.predicted_peak_bytes, p.cost_seconds))
    assert low.nested, "on 16 blocks the smallest plan nests its checkpoints"
    flat = [p for p in frontier.points if p.checkpoints and not p.nested]
    assert flat and low.predicted_peak_bytes < min(p.predicted_peak_bytes for p in flat)

    torch._dynamo.reset()
    rm = remat.checkpoint(copy.deepcopy(model), backend="eager", budget=low.predicted_peak_bytes)
    ref = copy.deepcopy(model)
    _step(rm, x, 1)  # compile
    got, want = _step(rm, x, 3), _step(ref, x, 3)
    # Same seed, dropout included: the same numbers as eager autograd, bit for bit.
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert all(torch.equal(a, b) for a, b in zip(got[2], want[2]))
    (plan,) = remat.compiled_plans(rm)
    assert plan.nested == low.nested and plan.checkpoints == low.checkpoints

    # The predicted peak is what the step measures (op by op: to a few bytes; every checkpoint
    # plan of this model, flat or nested, measures 12 bytes more, three scalars' worth).
    for p in rm.parameters():
        p.grad = None
    x.grad = None
    measured = compat.measure_cpu_peak_bytes(lambda: rm(x).backward())
    assert 0 <= measured - plan.predicted_peak_bytes <= 64

    # Outer segment by outer segment, the sweep recomputes the blocks whose outputs are inner
    # checkpoints, and each block's copy recomputes what its backward reads again. A block's
    # output is x + dropout(gelu(fc(x))) * tanh(x * g), and tanh's backward reads tanh's output:
    # the tanh of exactly the 12 inner blocks runs twice (the others' once); nothing outside an
    # inner block runs twice, and nothing three times.
    node = {n.name: n for n in plan.nodes}
    # Every 4th of the 15 block outputs saved, the others inner checkpoints.
    outer = [int(node[c].module.split(".")[1]) for c in plan.checkpoints]
    assert all(node[c].op == "aten.add.Tensor" for c in plan.checkpoints)  # each a block's output
    assert len(outer) >= 3 and all(b - a == 4 for a, b in zip(outer, outer[1:]))
    inner_blocks = {node[c].module for c in plan.nested if node[c].op == "aten.add.Tensor"}
    assert inner_blocks == {f"blocks.{i}" for i in range(15) if i not in outer}
    twice = [(r, op) for r, op, k in zip(plan.recomputed, plan.recomputed_ops, plan.times()) if k == 2]
    assert {node[r].module for r, op in twice if op == "aten.tanh.default"} == inner_blocks
    assert sum(op == "aten.tanh.default" for _, op in twice) == len(inner_blocks)
    assert all(node[r].module.rsplit(".fc", 1)[0] in inner_blocks for r, _ in twice)
    assert set(plan.times()) == {1, 2} and sum(plan.times()) == len(plan.recomputed) + len(twice)
    # every block's once, the inner ones again; dropout too, replaying its generator state
    # (Note [Replayed random ops]), so that the numbers above are eager's
    assert plan.recompute_counts()["aten.tanh.default"] == 16 + len(inner_blocks)
    assert plan.recompute_counts()["aten.native_dropout.default"] == 16 + len(inner_blocks)
    assert sum(plan.recompute_counts().values()) == sum(plan.times())
    assert f"recomputed more than once: {len(twice)} ops" in str(plan) and "nested checkpoints: saves" in str(plan)

    doc = plan.to_dict()
    jsonschema.validate(doc, SCHEMA)
    assert sum(r["times"] == 2 for r in doc["recomputed"]) == len(twice)
    assert doc["nested"] == list(plan.nested)
    assert doc["totals"]["recomputed_ops"] == sum(plan.times())
