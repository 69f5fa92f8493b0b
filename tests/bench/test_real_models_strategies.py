"""``benchmarks/real_models.py``'s strategy names: suffixes add ``remat.checkpoint`` options, the
strategies a budget of compile+ckpt's peak sets run after compile+ckpt, and unknown names stop
the run with the list of known ones."""

import argparse

import pytest
import torch
import torch.nn as nn

import remat
from benchmarks import real_models


def _args(*names: str) -> argparse.Namespace:
    return argparse.Namespace(strategies=list(names), anchors=False, no_compile=False)


def test_suffixes_add_options_in_any_order():
    assert real_models.split_suffixes("remat @0.8 ckpt +offload all unsliced") == (
        "remat @0.8 ckpt", {"offload": "all", "chunking": None})
    assert real_models.split_suffixes("remat unsliced +offload") == ("remat", {"chunking": None, "offload": "auto"})
    assert real_models.split_suffixes("compile+ckpt") == ("compile+ckpt", {})


def test_compile_ckpt_runs_before_the_budgets_its_peak_sets():
    names = real_models.strategy_list(_args("remat @0.8 ckpt +offload", "remat", "compile+ckpt"))
    assert names == ["compile", "compile+ckpt", "remat @0.8 ckpt +offload", "remat"]
    with pytest.raises(SystemExit, match=r"unknown strategy 'remat \+offlaod'"):
        real_models.strategy_list(_args("remat +offlaod"))


def test_a_budget_of_0_8_ckpt_with_offload_reaches_remat_checkpoint(monkeypatch):
    seen = {}
    monkeypatch.setattr(remat, "checkpoint", lambda model, **kw: seen.update(kw) or model)
    wl = real_models.Workload("toy", nn.Linear(4, 4), {"x": torch.randn(2, 4)}, lambda fn, inp: fn(inp["x"]).sum(),
                              lambda m: m, 0.0)
    real_models.make("remat @0.8 ckpt +offload", wl.model, wl, 1000, remat_kw={"backend": "eager"})
    assert seen == {"budget": 800, "offload": "auto", "backend": "eager"}
    with pytest.raises(real_models.NoAnchor):
        real_models.make("remat @0.8 ckpt", wl.model, wl, None)
