"""Random ops recomputed by replaying their generator state (Note [Replayed random ops]): under a
budget, dropout is recomputed instead of its mask saved, and the gradients and the random stream
stay eager's bit for bit; the partition's rewrite saves one state per replayed op and refuses a
random op it cannot replay."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

import remat
from remat import compat
from remat.capture.rng_replay import insert_rng_replay
from remat.planning.nesting import COPY_OF

from ..correctness.test_training_conditions import seeded_step
from ..planning.test_budget import measured_peak

DROPOUT = "aten.native_dropout.default"


class Blocks(nn.Module):
    def __init__(self, layers: int = 6, width: int = 64):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x):
        for lin in self.layers:
            x = x + F.dropout(torch.tanh(lin(x)), 0.3, training=True)
        return x


def _step(model, x, seed):
    """``seeded_step`` (numbers drawn between the forward and the backward, the generator's state
    after it) as one list: the loss, the input's and the parameters' gradients, the state."""
    loss, x_grad, grads, state = seeded_step(model, x, seed)
    return [loss, x_grad, *grads, state]


def _smallest_budget(model, x, **kw):
    return min(p.predicted_peak_bytes for p in remat.pareto(copy.deepcopy(model), x, **kw).points)


def test_the_smallest_plan_replays_every_dropout_and_trains_as_eager_bit_for_bit():
    torch.manual_seed(0)
    model, x = Blocks(), torch.randn(128, 64)
    budget = _smallest_budget(model, x, backend="eager")
    rm = remat.checkpoint(copy.deepcopy(model), backend="eager", budget=budget)
    for seed in (1, 2):  # the second step runs the compiled halves again
        got, want = _step(rm, x, seed), _step(model, x, seed)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    (plan,) = remat.compiled_plans(rm)
    # every dropout is replayed, some twice where the smallest plan nests its checkpoints
    assert plan.origin == "nested" and plan.recompute_counts()[DROPOUT] > 6
    assert "6 random op(s) recomputed by replaying" in " ".join(plan.notes)
    assert not [s for s in plan.saved if s.dtype == "bool"]  # no mask is saved


def test_replay_lowers_the_smallest_peak_by_the_masks_it_no_longer_saves(monkeypatch):
    torch.manual_seed(0)
    model, x = Blocks(layers=6, width=256), torch.randn(512, 256)
    with_replay = _smallest_budget(model, x, backend="eager")
    monkeypatch.setattr(compat, "can_replay_rng", lambda: False)  # a torch without the operators
    without = _smallest_budget(model, x, backend="eager")
    rm = remat.checkpoint(copy.deepcopy(model), backend="eager", budget=without)
    _step(rm, x, 0)
    (plan,) = remat.compiled_plans(rm)
    masks = [s for s in plan.saved if s.dtype == "bool"]
    assert masks and all(s.reason == "random op" for s in masks)
    assert DROPOUT not in plan.recompute_counts()
    # a mask is one byte an element (512 x 256): the smallest plan without replay keeps at least one
    assert without - with_replay >= 512 * 256


def test_measured_peaks_of_the_replayed_plans_are_their_predictions():
    """Op by op the prediction is exact: a recomputed dropout's kernel holds its mask, its output
    and its scratch at once, and each replayed op's generator state (on a CPU, in the device's
    memory) lives from its forward run to its recompute."""
    torch.manual_seed(0)
    model, x = Blocks(layers=6, width=256), torch.randn(512, 256, requires_grad=True)
    points = remat.pareto(copy.deepcopy(model), x, backend="eager").points
    replayed = 0
    for p in points:
        torch._dynamo.reset()
        rm = remat.checkpoint(copy.deepcopy(model), backend="eager", budget=p.predicted_peak_bytes)
        measured = measured_peak(rm, x)
        (plan,) = remat.compiled_plans(rm)
        replayed += DROPOUT in plan.recompute_counts()
        assert abs(measured - plan.predicted_peak_bytes) <= 16, (plan.origin, plan.predicted_peak_bytes, measured)
    assert replayed >= 3


# --- the partition's rewrite -------------------------------------------------------------------

def _halves(copies: int = 0, extra=None):
    """A forward ``x -> native_dropout`` returning the dropped tensor and saving ``x``, and a
    backward recomputing the dropout (and ``copies`` nested-plan copies of it) for its mask."""
    x = torch.randn(32, 16)
    fw = fx.Graph()
    xp = fw.placeholder("x")
    xp.meta["val"] = x
    d = fw.create_node("call_function", torch.ops.aten.native_dropout.default, (xp, 0.5, True), name="native_dropout")
    d.meta["val"] = (x, x > 0)
    out = fw.call_function(operator.getitem, (d, 0))
    out.meta["val"] = x
    fw.output((out, xp))
    bw = fx.Graph()
    saved = bw.placeholder("x")
    saved.meta["val"] = x
    tangent = bw.placeholder("tangents_1")
    tangent.meta["val"] = x
    grad = tangent
    for k in range(1 + copies):
        r = bw.create_node("call_function", torch.ops.aten.native_dropout.default, (saved, 0.5, True),
                           name="native_dropout" if k == 0 else f"native_dropout_again_{k}")
        r.meta["val"] = (x, x > 0)
        if k:
            r.meta[COPY_OF] = "native_dropout"
        mask = bw.call_function(operator.getitem, (r, 1))
        grad = bw.call_function(torch.ops.aten.mul.Tensor, (grad, mask))
    if extra is not None:  # a forward op the backward computes again
        with fw.inserting_before(fw.find_nodes(op="output")[0]):
            drawn = fw.create_node("call_function", extra, (xp,), name="drawn")
        drawn.meta["val"] = x
        noise = bw.create_node("call_function", extra, (saved,), name="drawn")
        noise.meta["val"] = x
        grad = bw.call_function(torch.ops.aten.mul.Tensor, (grad, noise))
    bw.output((grad,))
    return fx.GraphModule(nn.Module(), fw), fx.GraphModule(nn.Module(), bw), x


@pytest.mark.parametrize("copies", [0, 2])
def test_the_rewrite_saves_one_state_and_every_recompute_draws_the_forwards_mask(copies):
    fw, bw, x = _halves(copies)
    assert insert_rng_replay(fw, bw, num_fwd_outputs=1) == 1
    out, saved, state = fw(x)
    assert state.dtype == torch.uint8 and saved is x
    assert [n.name for n in bw.graph.find_nodes(op="placeholder")] == ["x", "rng_state_0", "tangents_1"]
    after = torch.get_rng_state()
    (grad,) = bw(saved, state, torch.ones_like(x))
    assert torch.equal(torch.get_rng_state(), after)  # the backward's replays restore the generator
    mask = (out != 0).float()
    assert torch.equal(grad, mask ** (1 + copies))  # each replay drew the forward's mask
    assert sum(n.target is torch.ops.aten.native_dropout.default for n in bw.graph.nodes) == 0


def test_the_rewrite_refuses_a_random_op_it_cannot_replay():
    fw, bw, _ = _halves(extra=torch.ops.aten.rand_like.default)
    with pytest.raises(RuntimeError, match="cannot replay"):
        insert_rng_replay(fw, bw, num_fwd_outputs=1)


def test_the_rewrite_erases_a_recomputed_random_op_the_backward_never_reads():
    fw, bw, x = _halves(extra=torch.ops.aten.rand_like.default)
    drawn = next(n for n in bw.graph.nodes if n.name == "drawn")
    (product,) = drawn.users
    product.replace_all_uses_with(product.args[0])
    bw.graph.erase_node(product)  # nothing reads the redrawn noise now
    assert insert_rng_replay(fw, bw, num_fwd_outputs=1) == 1
    assert not [n for n in bw.graph.nodes if n.target is torch.ops.aten.rand_like.default]


def test_a_backward_op_with_dropout_is_not_a_recompute():
    """Attention's backward with dropout is random by its facts, but draws nothing (it reads the
    forward's seed and offset) and is no forward op: the rewrite leaves it alone."""
    fw, bw, x = _halves(extra=torch.ops.aten.rand_like.default)
    next(n for n in bw.graph.nodes if n.name == "drawn").name = "backward_only"
    assert insert_rng_replay(fw, bw, num_fwd_outputs=1) == 1
    assert [n.name for n in bw.graph.nodes if n.target is torch.ops.aten.rand_like.default] == ["backward_only"]


@pytest.mark.inductor
@pytest.mark.slow
def test_inductor_replays_dropout_it_keeps_whole_and_gradients_match_eager():
    """Inductor keeps ``native_dropout`` whole with ``fallback_random`` (eager's numbers): its plan
    at the smallest budget replays it as a fallback kernel, and the gradients are eager's."""
    from torch._inductor import config as inductor_config

    torch.manual_seed(0)
    model, x = Blocks(layers=4), torch.randn(256, 64)
    with inductor_config.patch(fallback_random=True):
        budget = _smallest_budget(model, x.requires_grad_(), backend="inductor")
        rm = remat.checkpoint(copy.deepcopy(model), backend="inductor", budget=budget)
        got, want = _step(rm, x, 2), _step(model, x, 2)
    (plan,) = remat.compiled_plans(rm)
    assert plan.recompute_counts().get(DROPOUT, 0) >= 2
    assert torch.equal(got[-1], want[-1])  # the random stream
    for a, b in zip(got[:-1], want[:-1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
