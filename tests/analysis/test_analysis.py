"""Graph analysis (``remat.analysis``): the facts of one op (``OpFacts``), the view facts, a
``JointGraph`` built complete and frozen, and the public device model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

import remat
from remat.analysis.joint_graph import JointGraph, analyze
from remat.analysis.op_facts import (
    aliases_by_name,
    op_facts,
    returns_alias,
    stops_free_recompute,
    through_getitem,
    view_root,
)
from remat.analysis.ops import op_name
from remat.capture import partition
from remat.device import CPU, DEVICE_MODELS, H200


def _nodes(fn, *args) -> dict[str, torch.fx.Node]:
    """The ``call_function`` nodes of ``fn``'s traced graph, by op name."""
    gm = make_fx(fn)(*args)
    return {op_name(n): n for n in gm.graph.nodes if n.op == "call_function"}


def test_op_facts_of_matmul_reduction_view_random_and_data_dependent_ops():
    def f(x, w):
        y = x @ w
        return y.sum(-1), y.view(-1), torch.rand_like(y), torch.sort(y, dim=-1)[0]

    n = _nodes(f, torch.randn(4, 6), torch.randn(6, 8))
    mm = n["aten.mm.default"]
    assert op_facts(mm).is_matmul and not op_facts(mm).is_reduction
    total = op_facts(n["aten.sum.dim_IntList"])
    assert total.is_reduction and total.reduction_ratio == 8.0
    assert op_facts(n["aten.view.default"]).is_view and view_root(n["aten.view.default"]) is mm
    assert op_facts(n["aten.rand_like.default"]).is_random
    sort = op_facts(n["aten.sort.default"])
    assert sort.is_data_dependent and stops_free_recompute(sort)
    getitem = op_facts(n["getitem"])
    assert not getitem.is_data_dependent and through_getitem(getitem, sort, False).is_data_dependent


def test_grouped_mm_is_a_matmul_with_its_flops():
    # A mixture-of-experts LM's expert GEMMs (aten._grouped_mm): matmuls, never recomputed as cheap
    # ops (the MoE model recomputed its experts' GEMMs before: 48 grouped GEMMs a step, not 24).
    from remat.analysis.cost import flops

    meta = {"device": "meta", "dtype": torch.bfloat16}
    tokens, k, n, groups = 64, 32, 16, 4
    a, b = torch.empty(tokens, k, **meta), torch.empty(groups, k, n, **meta)
    offs = torch.empty(groups, device="meta", dtype=torch.int32)
    nodes = _nodes(lambda a, b, o: torch.ops.aten._grouped_mm(a, b, o), a, b, offs)
    node = nodes["aten._grouped_mm.default"]
    assert op_facts(node).is_matmul
    out = node.meta["val"]
    assert flops("aten._grouped_mm.default", out, [a, b, offs]) == 2 * tokens * n * k
    # the weight gradient: (k, tokens) x (tokens, n) per group -> (groups, k, n), summing the tokens once
    wgrad = torch.empty(groups, k, n, **meta)
    assert flops("aten._grouped_mm.default", wgrad, [torch.empty(k, tokens, **meta),
                                                      torch.empty(tokens, n, **meta), offs]) == 2 * k * n * tokens
    # batched: (groups, m, k) x (groups, k, n)
    assert flops("aten._grouped_mm.default", torch.empty(groups, 8, n, **meta),
                 [torch.empty(groups, 8, k, **meta), b]) == 2 * groups * 8 * n * k


def test_views_by_schema_and_by_name_differ_on_unsafe_view():
    """``aliases_by_name`` (DDP's bucket split) counts ``_unsafe_view``, which the schema's test
    (graph analysis) does not: the two are named apart, not merged."""
    n = _nodes(lambda x: torch.ops.aten._unsafe_view(x * 2, [-1]), torch.randn(2, 3))
    unsafe = n["aten._unsafe_view.default"]
    assert aliases_by_name(unsafe) and not returns_alias(unsafe.target) and view_root(unsafe) is unsafe


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8)

    def forward(self, x):
        return self.ln(torch.tanh(self.fc(x))) + x


def test_joint_graph_is_built_complete_and_frozen():
    grabbed = {}
    real = partition.plan_joint_graph

    def grab(gm, *args, **kwargs):
        grabbed.setdefault("jg", analyze(gm, args[0], args[1]))
        return real(gm, *args, **kwargs)

    partition.plan_joint_graph = grab
    try:
        remat.explain(_Net(), torch.randn(4, 8, requires_grad=True), backend="eager")
    finally:
        partition.plan_joint_graph = real
    jg: JointGraph = grabbed["jg"]
    n = len(jg.nodes)
    assert n and all(len(s) == n for s in (jg.facts, jg.ops, jg.inputs, jg.cost, jg.sched_ids,
                                            jg.recompute_flops, jg.recompute_seconds))
    assert jg.schedule is not None and jg.eager_saved and set(jg.eager_saved) <= set(range(n))
    assert {op.module for op in jg.ops} >= {"fc", "ln"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        jg.eager_saved = ()  # type: ignore[misc]


def test_device_model_is_public_and_options_name_it():
    assert remat.DeviceModel is type(H200) and DEVICE_MODELS == {"h200": H200, "cpu": CPU}
    assert remat.Options(device_model="cpu").device_model is CPU
    with pytest.raises(remat.RematError, match=r"remat\.DeviceModel"):
        remat.Options(device_model=3)
