"""The default plan weighs recompute time against bytes (Note [Default plan: bytes and recompute
traffic] in ``remat/planning/planner.py``): between plans of (nearly) equal bytes it takes the one that
recomputes less. Solver-level on a hand-made problem, then on the small GPT-2 and ViT of the
real-model families, where the bytes-only cut recomputed what the H200 profile found slow."""

from __future__ import annotations

import remat
from remat.core.solver import Problem, solve, solve_weighted
from remat.planning import planner
from zoo.small import MODELS

# x -> a -> b -> c, the backward reads c. Saving a (100 bytes) means recomputing b and c (1 s
# each); saving c costs 101 bytes and recomputes nothing; b (150 bytes) and x (1000) cost more.
CHAIN = Problem(inputs=((), (0,), (1,), (2,)), cost=(1000, 100, 150, 101), needed=frozenset({3}),
                no_recompute={0: "graph input"}, names=("x", "a", "b", "c"),
                recompute_cost=(0.0, 1.0, 1.0, 1.0))


def test_bytes_only_cut_recomputes_to_save_one_byte():
    assert solve(CHAIN).saved == (1,)
    assert solve(CHAIN).recomputed == (2, 3)


def test_time_weight_keeps_the_value_when_recompute_costs_more_than_the_byte():
    sol = solve(CHAIN, time_weight=1.0)  # 2 s of recompute = 2 bytes > 1 byte more saved
    assert sol.saved == (3,) and sol.recomputed == () and sol.cost == 101
    assert solve(CHAIN, time_weight=0.4).saved == (1,)  # 0.8 bytes < 1 byte: recompute
    # the same plans as the float-weighted cut, with the tie terms kept
    assert solve_weighted(CHAIN, 1.0).saved == (3,)


def test_time_weight_keeps_capacities_exact_integers():
    from remat.core.solver import _build, _free
    g = _build(CHAIN, None, _free(CHAIN), time_weight=0.123456789)
    caps = [a["capacity"] for nbrs in g.values() for a in nbrs.values() if "capacity" in a]
    assert caps and all(isinstance(c, int) for c in caps)


def test_gpt2_saves_the_attention_input_copies(monkeypatch):
    """GPT-2 (its default dropout) splits the fused q/k/v projection and copies q, k and v
    contiguous for attention: the copies cost the projection's bytes, so the default saves them
    rather than recomputing three copies a layer in the backward, at the same saved bytes. (The
    bytes-only cut recomputed them; the loss's shifted-logits copy stays recomputed in both.)"""
    from zoo.families import build

    fam = build("gpt2", layers=2)
    plan = remat.explain(fam.model, *fam.inputs, backend="inductor", device_model="h200")
    monkeypatch.setattr(planner, "traffic_weight", lambda dev: 0.0)
    bytes_only = remat.explain(fam.model, *fam.inputs, backend="inductor", device_model="h200")
    assert bytes_only.recompute_counts()["aten.clone.default"] == 3 * 2 + 1
    assert plan.recompute_counts()["aten.clone.default"] == 1
    assert plan.saved_bytes == bytes_only.saved_bytes


def test_vit_keeps_the_first_block_input(monkeypatch):
    """ViT's first block input is the class token concatenated with the patch embedding, plus the
    position embedding; the default saves what the first layer norm's backward reads instead of
    recomputing the concatenation to save the class token's row."""
    model, loss = MODELS["vit"]()
    plan = _explain(model, loss)
    monkeypatch.setattr(planner, "traffic_weight", lambda dev: 0.0)
    bytes_only = _explain(model, loss)
    assert bytes_only.recompute_counts()["aten.cat.default"] == 1
    assert "aten.cat.default" not in plan.recompute_counts()
    # 2016 bytes more (0.03% of what the plan saves)
    assert plan.saved_bytes - bytes_only.saved_bytes == 2016


def _explain(model, loss):
    """The plan of ``model``'s call in the step ``loss`` runs, planned for the H200 with Inductor
    (nothing is compiled)."""
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return model(*args, **kwargs)

    loss(record)
    args, kwargs = calls[0]
    return remat.explain(model, *args, backend="inductor", device_model="h200", **kwargs)
