"""``remat.capture.buckets.regroup`` on a hand-made graph: which ops move to a later DDP bucket piece, which
get a copy there, and which stay (Note [Bucket pieces keep the whole plan])."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from remat.capture.buckets import regroup


def f(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    a = x @ w1  # piece 0; the whole plan saves it
    b = a.sin()  # piece 0; recomputed; read in piece 0 (e) and piece 1 (the add)
    e = b @ w1  # piece 0; saved
    c = b * 2  # piece 0; recomputed; read in piece 1 only (cos)
    r = torch.rand_like(a)  # piece 0; random (neither saved nor recomputed)
    return (e @ w2 + b) + c.cos() + r  # piece 1


class _Record(fx.Interpreter):
    """Runs the graph and records each value as ``meta["example_value"]``, as Dynamo does."""

    def run_node(self, n: fx.Node):
        out = super().run_node(n)
        n.meta["example_value"] = out
        return out


def traced() -> tuple[fx.GraphModule, dict[str, fx.Node]]:
    gm = fx.symbolic_trace(f)
    _Record(gm).run(*(torch.randn(4, 4) for _ in range(3)))
    return gm, {n.name: n for n in gm.graph.nodes}


def test_regroup_moves_copies_and_keeps():
    gm, nodes = traced()
    later = ("matmul_2", "add", "cos", "add_1", "add_2")
    piece = {n: (1 if n.name in later else 0) for n in gm.graph.nodes if n.op not in ("placeholder", "output")}
    moved = regroup(gm, dict(piece), kept={"matmul", "matmul_1"}, recomputed={"sin", "mul", "cos"})
    assert moved[nodes["mul"]] == 1, "read by a later piece only: moves there"
    assert moved[nodes["sin"]] == 0, "its own piece reads it too: stays"
    copies = [n for n in moved if n not in piece]
    assert [(n.target, moved[n]) for n in copies] == [("sin", 1)], "and gets one copy in the later piece"
    assert nodes["add"].args[1] is copies[0] and nodes["mul"].args[0] is copies[0], "which reads the copy"
    assert nodes["matmul_1"].args[0] is nodes["sin"]
    assert all(moved[nodes[k]] == 0 for k in ("matmul", "matmul_1", "rand_like")), "the rest stays"
    x, w1, w2 = (torch.randn(4, 4) for _ in range(3))
    torch.manual_seed(0)
    want = f(x, w1, w2)
    torch.manual_seed(0)
    torch.testing.assert_close(gm(x, w1, w2), want)


def g(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    t = x.cos()  # piece 0, under no_grad (inserted below); recomputed; read in piece 1 only
    a = x @ w1  # piece 0; saved
    b = a.sin()  # piece 0; recomputed; read in piece 1 only
    return (a @ w2) * t + b  # piece 1


def test_regroup_keeps_grad_mode_regions_and_graph_order():
    """HF Llama's rotary tables run under ``torch.no_grad`` (a ``_set_grad_enabled`` pair in
    Dynamo's graph). ``split_module`` replays such regions piece by piece and needs the pieces in
    graph order. An op outside the region moves to just before its reader in the later piece;
    the op inside it stays, since it would run with grad enabled at its reader's place."""
    gm = fx.symbolic_trace(g)
    _Record(gm).run(*(torch.randn(4, 4) for _ in range(3)))
    nodes = {n.name: n for n in gm.graph.nodes}
    with gm.graph.inserting_before(nodes["cos"]):
        off = gm.graph.call_function(torch._C._set_grad_enabled, (False,))
    with gm.graph.inserting_after(nodes["cos"]):
        on = gm.graph.call_function(torch._C._set_grad_enabled, (True,))
    gm.recompile()
    later = ("matmul_1", "mul", "add")
    piece = {n: (1 if n.name in later else 0) for n in gm.graph.nodes if n.op not in ("placeholder", "output")}
    moved = regroup(gm, dict(piece), kept={"matmul"}, recomputed={"cos", "sin"})
    assert moved[nodes["cos"]] == 0 and moved[off] == 0 and moved[on] == 0, "the region's op stays"
    assert moved[nodes["sin"]] == 1, "the op outside it moves to the piece that reads it"
    order = [n.name for n in gm.graph.nodes if n in moved]
    assert order.index("sin") == order.index("add") - 1, "just before its reader"
    pieces_in_order = [moved[n] for n in gm.graph.nodes if n in moved]
    assert pieces_in_order == sorted(pieces_in_order)
    split = split_module(gm, None, lambda n: moved[n])  # asserts the order itself with grad regions
    x, w1, w2 = (torch.randn(4, 4, requires_grad=True) for _ in range(3))
    got = split(x, w1, w2)
    torch.testing.assert_close(got, g(x, w1, w2))
    assert len(list(split.children())) == 2


def test_regroup_moves_within_one_autocast_region():
    """Inside an autocast region that spans both pieces, ops move as without one: they run under
    the same autocast state at their reader's place."""
    gm, nodes = traced()
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_before(first):
        enter = gm.graph.call_function(torch.amp._enter_autocast, ("cpu", torch.bfloat16, True, None))
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        leave = gm.graph.call_function(torch.amp._exit_autocast, (enter,))
    gm.recompile()
    later = ("matmul_2", "add", "cos", "add_1", "add_2", leave.name)
    piece = {n: (1 if n.name in later else 0) for n in gm.graph.nodes if n.op not in ("placeholder", "output")}
    moved = regroup(gm, dict(piece), kept={"matmul", "matmul_1"}, recomputed={"sin", "mul", "cos"})
    assert moved[nodes["mul"]] == 1 and moved[nodes["sin"]] == 0
    assert sum(1 for n in moved if n not in piece) == 1, "one copy of sin"
    pieces_in_order = [moved[n] for n in gm.graph.nodes if n in moved]
    assert pieces_in_order == sorted(pieces_in_order)
    split_module(gm, None, lambda n: moved[n])
