"""Stage-local fusion (Note [Stage-local fusion]): under Inductor no kernel mixes two blocks."""

from __future__ import annotations

import contextlib

import pytest
import torch

import remat
from remat.backends.inductor import hooks
from zoo import workloads


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
    from remat.analysis.provenance import block_of

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
    from ..planning.test_budget import measured_peak

    model, x = workloads.build("pointwise", "medium")
    rm = remat.checkpoint(model, backend="inductor")
    measured = measured_peak(rm, x)
    (plan,) = remat.compiled_plans(rm)
    assert abs(plan.predicted_peak_bytes - measured) <= 0.05 * measured
    assert measured < 0.5 * plan.eager_peak_bytes, (measured, plan.eager_peak_bytes)


def _kernel_calls(monkeypatch, tagged_everywhere: bool) -> list[int]:
    """C++ kernel calls in each generated wrapper of the gpt workload (forward, backward)."""
    import re

    from torch._inductor.utils import run_and_get_code

    from remat.analysis.provenance import block_of

    if tagged_everywhere:  # the rule before Note [Blocks an extern kernel separates]
        monkeypatch.setattr(hooks, "fusion_blocks",
                            lambda nodes: tuple(block_of(n) if n.op == "call_function" else None for n in nodes))
    # Both in Inductor's own order (Note [remat's order kept] turns its reordering off): the C++
    # backend emits the kernels between two matmuls as one function, so the count of functions
    # depends on the order as well as on the fusions; in remat's order this small graph's
    # boundary work falls into the same functions either way (16 and 16), in Inductor's the tags
    # cost three.
    monkeypatch.setattr(hooks, "in_remat_order", lambda ordered=True: contextlib.nullcontext())
    torch._dynamo.reset()
    model, x = workloads.build("gpt", "small")
    # Matmuls saved, as the min-cut plan saves them (the default's rule of eager's peak, Note
    # [The default at most eager's peak], takes a segments plan on this graph, which recomputes
    # every block whole in the backward: no boundary work left to fuse).
    rm = remat.checkpoint(model, backend="inductor", policy=remat.save(ops="aten.addmm"))

    def step():
        rm(x).float().square().mean().backward()

    _, code = run_and_get_code(step)
    monkeypatch.undo()
    return [len(re.findall(r"^\s+cpp_fused_\w+\(", c, re.M)) for c in code]


@pytest.mark.inductor
def test_blocks_separated_by_matmuls_fuse_at_their_boundaries(monkeypatch):
    # Every gpt block runs matmuls, so nothing can chain across the model: Inductor may fuse
    # the work at block boundaries (Note [Blocks an extern kernel separates]). Stage tags on
    # this graph cost the backward three kernels.
    free = _kernel_calls(monkeypatch, tagged_everywhere=False)
    tagged = _kernel_calls(monkeypatch, tagged_everywhere=True)
    assert len(free) == len(tagged) == 2
    assert free[0] <= tagged[0] and free[1] < tagged[1], (free, tagged)


def joint_graphs(monkeypatch) -> list:
    """The joint graphs remat plans from now on (appended as they are captured). Captured
    uncompiled, for speed, but with Inductor's decompositions: the uncompiled backend keeps GELU
    whole (Note [Eager GELU]), which Inductor would lower as an extern kernel."""
    from remat.backends.eager import backend as eager
    from remat.capture import partition

    graphs = []
    original = partition.plan_joint_graph

    def record(gm, *args, **kwargs):
        graphs.append(gm)
        return original(gm, *args, **kwargs)

    monkeypatch.setattr(partition, "plan_joint_graph", record)
    monkeypatch.setattr(eager, "KEPT_WHOLE", frozenset())
    return graphs


def test_fusion_blocks_only_where_no_extern_kernel_separates_them(monkeypatch):
    from remat.backends.inductor.lowering import fusion_blocks

    graphs = joint_graphs(monkeypatch)
    kept = {}
    for name in ("pointwise", "mlp", "gpt"):
        torch._dynamo.reset()
        model, x = workloads.build(name, "small")
        remat.checkpoint(model, backend="eager")(x).float().sum().backward()
        blocks = fusion_blocks(list(graphs[-1].graph.nodes))
        kept[name] = len({b for b in blocks if b is not None})
    # pointwise: no extern kernel anywhere, its 8 layers stay apart; every mlp and gpt block runs matmuls.
    assert kept == {"pointwise": 8, "mlp": 0, "gpt": 0}


@pytest.mark.parametrize("stock", [False, True])
def test_remats_graphs_compile_in_remats_order_and_stock_ones_in_inductors(monkeypatch, stock):
    # Note [remat's order kept]: Inductor's peak-memory reordering is off while remat's graphs
    # lower, and on (torch.compile's setting) for torch.compile's own partition.
    import torch._inductor.compile_fx as cfx
    import torch._inductor.config as ic

    seen = []

    def inner(graph, *args, **kwargs):
        seen.append(ic.reorder_for_peak_memory)
        return lambda *a: graph(*a)

    monkeypatch.setattr(cfx, "compile_fx_inner", inner)

    def fake_compile_fx(gm, example_inputs, inner_compile, config_patches):
        with ic.patch(**config_patches):
            return inner_compile(gm, example_inputs, is_backward=False)

    monkeypatch.setattr(cfx, "compile_fx", fake_compile_fx)
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    assert ic.reorder_for_peak_memory  # torch.compile's default
    hooks.compile_fx(gm, [torch.randn(2)], stock=stock)
    assert seen == [stock]
    assert ic.reorder_for_peak_memory


class _FakeIR:
    def __init__(self, block):
        self.origin_node = type("FxNode", (), {"meta": {hooks.BLOCK_KEY: block} if block else {}})()

    def get_origins(self):
        return [self.origin_node]


class _FakeNode:
    """A scheduler node of one block (or none) at one place in the order before fusion, or a fused one."""

    def __init__(self, order, block=None, parts=()):
        self.parts = list(parts) or [self]
        self.node = _FakeIR(block) if not parts else None
        self.min_order = min(p.min_order for p in parts) if parts else order
        self.max_order = max(p.max_order for p in parts) if parts else order

    def get_nodes(self):
        return self.parts


def test_a_fusion_may_not_move_a_kernel_across_another_blocks_kernels():
    # Note [Fusions that jump blocks]: block 0 computes a value at the backward's start (order 0,
    # where block 2 reads it first); blocks 2 and 1 run; block 0's softmax (order 6) reads it.
    blocks = ["b0", "b2", "b2", "b1", None, "b1", "b0", "b0", None, "b9"]
    nodes = [_FakeNode(k, b) for k, b in enumerate(blocks)]
    scheduler = type("Scheduler", (), {"nodes": nodes})()
    orders: dict = {}

    def jumps(a, b):
        return hooks._across_other_blocks(scheduler, a, b, orders)

    assert jumps(nodes[0], nodes[6])  # blocks 2 and 1 lie between them
    assert jumps(nodes[6], nodes[0])
    assert not jumps(nodes[6], nodes[7])  # neighbours
    assert not jumps(nodes[3], nodes[5])  # only a kernel of no block lies between them
    assert not jumps(nodes[2], nodes[3])  # a boundary between two blocks
    assert not jumps(nodes[1], nodes[3])  # block 2's second kernel belongs to a part's block
    assert jumps(nodes[4], nodes[7])  # a kernel of no block moved across block 1's and 0's: still a jump
    assert not jumps(nodes[7], nodes[9])  # a kernel of no block between the last two blocks
    fused = _FakeNode(None, parts=[nodes[6], nodes[7]])
    assert jumps(fused, nodes[0])  # a fused kernel spans its parts
    assert not jumps(fused, nodes[8])
