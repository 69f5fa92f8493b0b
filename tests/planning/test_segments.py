"""Checkpoint-segment plans: separators, checkpoint sets, and the plans a budget can choose."""

from __future__ import annotations

import copy

import pytest
import torch

import remat
from remat.core.segments import checkpoint_sets, separators
from zoo import workloads

from .test_budget import measured_peak


def test_every_value_of_a_chain_separates_it():
    # 0 -> 1 -> 2 -> 3: each value but the last (nothing reads it) separates the chain.
    inputs = [(), (0,), (1,), (2,)]
    assert separators(inputs, range(4)) == [0, 1, 2]


def test_a_residual_edge_hides_the_values_it_jumps_over():
    # x0 -> a -> b; c = b + x0; d = c * 2: the edge x0 -> c jumps over a and b.
    inputs = [(), (0,), (1,), (2, 0), (3,), (4,)]
    assert separators(inputs, range(6)) == [0, 3, 4]


def test_edges_from_non_activations_do_not_block():
    # w (value 0, a parameter-derived value) is read at 2 and 4; it is not an activation.
    inputs = [(), (), (1, 0), (2,), (3, 0), (4,)]
    assert separators(inputs, [1, 2, 3, 4, 5]) == [1, 2, 3, 4]
    assert separators(inputs, range(6)) == [0, 4]  # counted as an activation, w's edges block


def test_checkpoint_sets_split_the_bytes_evenly():
    # Ten values of 1 byte each, all separators: k segments put checkpoints near i*10/k.
    inputs = [()] + [(v - 1,) for v in range(1, 11)]
    seps = separators(inputs, range(11))
    weights = [1] * 11
    sets = checkpoint_sets(seps, weights, range(11), counts=(2, 5))
    # Value v has cumulative bytes v + 1 of 11; k = 2 targets 5.5 (4 and 5 tie: the earlier
    # wins), k = 5 targets 2.2, 4.4, 6.6, 8.8.
    assert sets[0] == (4,)
    assert sets[1] == (1, 3, 6, 8)
    assert sets[-1] == tuple(seps)  # the finest set checkpoints every separator
    assert all(len(a) < len(b) for a, b in zip(sets, sets[1:]))


def test_no_separators_no_sets():
    assert checkpoint_sets([], [1, 1], range(2)) == []


@pytest.mark.parametrize("name", workloads.WORKLOADS)
def test_checkpoint_plans_never_recompute_through_their_checkpoints(name):
    model, x = workloads.build(name, "medium")
    frontier = remat.pareto(remat.checkpoint(model, backend="eager"), x)
    assert frontier.segments, "every workload has residual-stream separators"
    for p in frontier.segments:
        recomputed = set(p.recomputed)
        assert not recomputed & set(p.checkpoints)
        saved = {s.name: s.reason for s in p.saved}
        assert any(saved.get(c) == "checkpoint (segment boundary)" for c in p.checkpoints)
        # Only plans no other frontier plan beats on both peak and time are kept.
        for q in frontier.points:
            assert not (q is not p and q.predicted_peak_bytes <= p.predicted_peak_bytes
                        and q.cost_seconds <= p.cost_seconds
                        and (q.predicted_peak_bytes, q.cost_seconds)
                        != (p.predicted_peak_bytes, p.cost_seconds))
    assert "checkpoints" in str(frontier)


def test_a_budget_can_choose_a_checkpoint_plan_and_its_peak_is_what_it_predicts():
    model, x = workloads.build("pointwise", "medium")
    frontier = remat.pareto(remat.checkpoint(model, backend="eager"), x)
    lowest = min(frontier.points, key=lambda p: (p.predicted_peak_bytes, p.cost_seconds))
    assert lowest.checkpoints, "on pointwise the smallest peak is a checkpoint plan"
    assert lowest.predicted_peak_bytes < min(p.predicted_peak_bytes for p in frontier.hull)
    rm = remat.checkpoint(copy.deepcopy(model), backend="eager", budget=lowest.predicted_peak_bytes)
    measured = measured_peak(rm, x)
    (plan,) = remat.compiled_plans(rm)
    assert plan.checkpoints == lowest.checkpoints
    assert plan.predicted_peak_bytes == lowest.predicted_peak_bytes <= plan.budget_bytes
    assert abs(plan.predicted_peak_bytes - measured) <= 0.05 * measured
    # And training under it computes the same gradients as eager autograd.
    ref = copy.deepcopy(model)
    xr = x.detach().clone().requires_grad_()
    ref(xr).square().mean().backward()
    x.grad = None
    rm(x).square().mean().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-6)
    plan_dict = plan.to_dict(nodes=False)
    assert plan_dict["checkpoints"] == list(plan.checkpoints)
    assert plan_dict["budget_bytes"] == plan.budget_bytes
    assert ("nested checkpoints" if plan.nested else "checkpoint segments") in str(plan)
