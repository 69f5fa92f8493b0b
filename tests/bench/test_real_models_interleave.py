"""``benchmarks/real_models.py --interleave``: the kept strategies are timed round-robin, each the
same number of steps, in an order rotated every round, and that median replaces the row's step
time (the sequential one kept beside it)."""

import torch
import torch.nn as nn

from benchmarks import real_models


def test_interleave_times_every_kept_strategy_round_robin():
    calls: list[str] = []

    def strategy(name: str, model: nn.Module):
        def fn(x: torch.Tensor) -> torch.Tensor:
            calls.append(name)
            return model(x)
        return fn, model

    model = nn.Linear(4, 4)
    wl = real_models.Workload("toy", model, {"x": torch.randn(2, 4)}, lambda fn, inp: fn(inp["x"]).sum(),
                              lambda m: m, 0.0)
    kept = {n: strategy(n, model) for n in ("compile", "remat", "remat b0.5")}
    rows = [{"strategy": "compile", "ms": 1.0}, {"strategy": "remat", "ms": 2.0},
            {"strategy": "remat b0.5", "ms": 3.0}, {"strategy": "eager", "ms": 4.0}]
    real_models.interleave(kept, rows, wl, torch.device("cpu"), rounds=3)
    rounds = ["compile", "remat", "remat b0.5", "remat", "remat b0.5", "compile", "remat b0.5", "compile", "remat"]
    # untimed rounds first (a strategy's frames may recompile the first times it runs after another's)
    assert real_models.WARM_ROUNDS == 2 and calls == rounds[:6] + rounds
    for row, before in zip(rows[:3], (1.0, 2.0, 3.0)):
        assert row["ms_sequential"] == before and row["ms"] > 0 and row["timing"] == "interleaved: 3 rounds"
        assert len(row["ms_rounds"]) == 3 and row["ms"] == sorted(row["ms_rounds"])[1]
    assert rows[3] == {"strategy": "eager", "ms": 4.0}, "a strategy not kept keeps its sequential timing"
    assert model.weight.grad is not None
