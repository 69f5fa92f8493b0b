"""Stage-local fusion (Note [Stage-local fusion]): under Inductor no kernel mixes two blocks."""

from __future__ import annotations

import pytest
import torch

import remat
from benchmarks import workloads
from remat.inductor import hooks


@pytest.mark.inductor
@pytest.mark.parametrize("budget", [None, 1.0])
def test_no_fused_kernel_spans_two_blocks(monkeypatch, budget):
    seen: list[frozenset] = []
    original = hooks._stages

    def record(node, cache):
        # Every sub-node's own stage, whatever the rule under test computes for the whole.
        own = set()
        for sub in node.get_nodes():
            ir = getattr(sub, "node", None)
            owner = getattr(ir, "origin_node", None) if ir is not None else None
            if owner is not None and owner.meta.get(hooks.STAGE_KEY) is not None:
                own.add(owner.meta[hooks.STAGE_KEY])
        seen.append(frozenset(own))
        return original(node, cache)

    monkeypatch.setattr(hooks, "_stages", record)
    model, x = workloads.build("pointwise", "small")
    rm = remat.checkpoint(model, backend="inductor", budget=budget)
    out = rm(x)
    out.backward(torch.ones_like(out))  # compiles the backward too (lazily, at the first call)
    stages = set().union(*seen)
    assert len(stages) == 8, "every layer's ops carry their block"
    assert seen and all(len(s) <= 1 for s in seen), [sorted(s) for s in seen if len(s) > 1][:3]


def test_block_of_cuts_the_module_path_at_the_first_index():
    from remat.graph import block_of

    class N:
        def __init__(self, path):
            self.meta = {"nn_module_stack": {"k": (path, object)}}
            self.op = "call_function"

    assert block_of(N("L['self'].layers[3].attn")) == "layers.3"
    assert block_of(N("L['self'].0.fc1")) == "0"
    assert block_of(N("L['self'].head")) is None


@pytest.mark.inductor
def test_cpu_kernels_are_flushed_between_blocks(monkeypatch):
    # The C++ backend emits every kernel between two matmuls as one function whose buffers are
    # all allocated before it runs; pointwise has no matmul, so without the flush between blocks
    # (hooks._cpp_flush_between_stages) its whole backward held every layer's buffers at once
    # (measured 18.1 MiB here, 0.79 of eager's peak). With it, the step measures what the model
    # predicts, about a third of eager's peak.
    from .test_budget import measured_peak

    model, x = workloads.build("pointwise", "medium")
    rm = remat.checkpoint(model, backend="inductor")
    measured = measured_peak(rm, x)
    (plan,) = remat.compiled_plans(rm)
    assert abs(plan.predicted_peak_bytes - measured) <= 0.05 * measured
    assert measured < 0.5 * plan.eager_peak_bytes, (measured, plan.eager_peak_bytes)
