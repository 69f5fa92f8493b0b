"""remat's smallest plan against per-block torch.utils.checkpoint (issue 13), on small CPU
configurations of the real-model families (zoo/families.py), uncompiled backend: its
predicted and its measured peak are at most checkpointing's measured peak."""

from __future__ import annotations

import copy

import pytest
import torch

import remat
from benchmarks.ckpt_floor import smallest, step_peak
from zoo import families

CASES = [
    pytest.param("gpt", None), pytest.param("mlp", None), pytest.param("gpt2", 0.0, id="gpt2-no-dropout"),
    pytest.param("gpt2", None, id="gpt2-dropout", marks=pytest.mark.xfail(strict=True, reason=(
        "attention with dropout is traced as its decomposed math (scores materialised, dropout masks "
        "saved); checkpointing replays the RNG: 13.4 MiB predicted against 11.6 MiB measured"))),
    pytest.param("llama", None), pytest.param("vit", None), pytest.param("resnet", None),
]


@pytest.mark.parametrize(("name", "dropout"), CASES)
def test_smallest_plan_is_at_most_per_block_checkpointing(name, dropout):
    torch.set_num_threads(1)
    fam = families.build(name, 4, dropout=dropout)
    ckpt = step_peak(fam.checkpointed, fam.inputs)
    _, low = smallest(fam.model, fam.inputs)
    assert low.predicted_peak_bytes <= ckpt
    torch._dynamo.reset()
    rm = remat.checkpoint(copy.deepcopy(fam.model), backend="eager", budget=low.predicted_peak_bytes)
    measured = step_peak(rm, fam.inputs)
    (plan,) = remat.compiled_plans(rm)
    assert plan.predicted_peak_bytes == low.predicted_peak_bytes
    assert measured <= ckpt
    # Op by op the prediction is exact but for BatchNorm's running-statistics temporaries.
    assert abs(measured - plan.predicted_peak_bytes) <= 0.01 * measured
