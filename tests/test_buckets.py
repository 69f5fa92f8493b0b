"""``remat.buckets.regroup`` on a hand-made graph: which ops move to a later DDP bucket piece, which
get a copy there, and which stay (Note [Bucket pieces keep the whole plan])."""

from __future__ import annotations

import torch
import torch.fx as fx

from remat.buckets import regroup


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


def test_regroup_leaves_graphs_with_autocast_regions_alone():
    gm, nodes = traced()
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_before(first):
        enter = gm.graph.call_function(torch.amp._enter_autocast, ("cpu", torch.bfloat16, True, None))
    later = ("matmul_2", "add", "cos", "add_1", "add_2")
    piece = {n: (1 if n.name in later else 0) for n in gm.graph.nodes if n.op not in ("placeholder", "output")}
    assert regroup(gm, dict(piece), kept={"matmul", "matmul_1"}, recomputed={"sin", "mul", "cos"}) == piece
    assert enter in piece
