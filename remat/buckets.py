"""DDP's gradient buckets: where remat cuts a graph that DDP splits, so that the pieces keep what
the plan of the whole graph keeps.

Note [Bucket pieces keep the whole plan]: under DDP, Dynamo splits each captured graph at the
boundaries of DDP's gradient buckets (``DDPOptimizer``), so that each piece's backward hands its
buckets' gradients to DDP's all-reduce while the earlier pieces' backward still runs (compute
and communication overlap). Each piece is a separate autograd function: a value one piece
computes and a later one reads is an *input* of the later piece, and if that piece's backward
needs it, the piece must keep it, since it cannot recompute its own inputs. Dynamo cuts
wherever a bucket fills up, often between a cheap op and the matmul that reads it (the SiLU
product before Llama's ``down_proj``, the RMSNorm output before ``lm_head``, the float32 cast of
the residual inside RMSNorm): the whole graph's plan recomputes those values from what it
saves, the pieces had to keep them (``benchmarks/README.md`` has the measured cost, before and
after).

So remat splits DDP graphs itself (``capture.RematBackend._compile_by_bucket``, with Dynamo's
own DDP split turned off for remat's calls, ``distributed.remat_splits_ddp``):

1. it plans the whole graph once (planning only, nothing compiled; the default plan, since a
   budget is per piece) and reads, through each joint-graph node's Dynamo origin, which of
   Dynamo's nodes produce a value that plan keeps and which ones it recomputes
   (``whole_plan_values``);
2. it splits the graph at the same buckets as Dynamo (``compat.ddp_bucket_split``, Dynamo's own
   code), after letting the pieces that read a recomputed value compute it themselves
   (``regroup``): an op only later pieces read moves to the first of them; an op its own piece
   reads too gets a copy in each later piece that reads it (the forward runs that cheap op once
   more; the whole plan runs it again in the backward anyway). Following the readers back, the
   pieces end up passing each other values the whole plan keeps, or graph inputs;
3. each piece is planned and compiled as before (one plan per piece in ``compiled_plans``, the
   rank check per piece).

Only ops the whole plan recomputes move (pointwise ops, casts, views, the masks and rotary
tables models build from positions), never a matmul it saves nor what it neither saves nor
recomputes (a residual add), so the pieces keep DDP's buckets and their order. A moved op's
parameter (an RMSNorm weight) gets its gradient in the later piece, whose backward runs first,
so that gradient is ready earlier; the later piece's own gradients wait for the moved ops'
backward, a few pointwise kernels. Ops are never moved when that could change what runs: random
ops (dropout keeps its place in the random stream), mutations and collectives, ops that do not
produce a tensor, ops with a non-tensor input computed in the graph (only tensors cross a
boundary remat made), and every op of a graph with autocast or grad-mode switches (the split
replays those regions per piece, by position).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from . import compat
from .ops import is_impure

__all__ = ["whole_plan_values", "regroup"]

_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "squeeze",
                    "unsqueeze", "alias", "slice", "select", "as_strided", "unflatten", "flatten"})


def _is_view(node: fx.Node) -> bool:
    name = getattr(node.target, "__name__", "")
    return name.split(".")[0] in _VIEWS


def whole_plan_values(joint: fx.GraphModule, saved: set[str], recomputed: set[str],
                      dynamo: fx.GraphModule) -> tuple[set[str], set[str]]:
    """``(kept, recomputed)``: names of ``dynamo``'s nodes whose value the plan of the whole
    graph keeps (it saves the joint-graph value the node outputs, or one it is a view of), and
    of those whose ops that plan recomputes in the backward, all of them pure (none traced to a
    random op, a mutation, a collective or a higher-order op). ``joint`` is the whole graph's
    joint graph as planned; ``saved`` and ``recomputed`` name its values the plan saves and the
    forward ops it recomputes."""
    names = {n.name for n in dynamo.graph.nodes}
    origin: dict[fx.Node, str] = {}
    for n in joint.graph.nodes:
        if n.op == "call_function":
            found = [o for o in compat.dynamo_origins(n) if o in names]
            if found:
                origin[n] = found[0]
    kept: set[str] = set()
    again: set[str] = set()
    pinned: set[str] = set()
    for n, d in origin.items():
        if is_impure(n):
            pinned.add(d)
        if n.name in recomputed:
            again.add(d)
        read_elsewhere = any(u.op == "output" or (u in origin and origin[u] != d) for u in n.users)
        if read_elsewhere and _keeps(n, saved):
            kept.add(d)
    return kept, again - pinned


def _keeps(node: fx.Node, saved: set[str]) -> bool:
    """Whether ``node`` is saved, or is a view (of a view...) of a saved value: a view of a
    saved value costs nothing more."""
    while node.name not in saved:
        if not _is_view(node) or not node.args or not isinstance(node.args[0], fx.Node):
            return False
        node = node.args[0]
    return True


def _tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get("example_value"), torch.Tensor)


def _movable(node: fx.Node, kept: set[str], recomputed: set[str]) -> bool:
    if node.op not in ("call_function", "call_method") or node.name in kept or node.name not in recomputed:
        return False
    if not _tensor(node) or any(u.op == "output" for u in node.users):
        return False
    return all(a.op == "placeholder" or _tensor(a) for a in node.all_input_nodes)


_SWITCHES = frozenset({"_enter_autocast", "_exit_autocast", "_set_grad_enabled"})


def _switch(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "__name__", "") in _SWITCHES


def regroup(dynamo: fx.GraphModule, piece: dict[fx.Node, int], kept: set[str],
            recomputed: set[str]) -> dict[fx.Node, int]:
    """``piece`` (the bucket piece of each node of ``dynamo``, as DDP's split chose it) with the
    nodes the whole plan recomputes (and does not keep) computed by the pieces that read them:
    a node only later pieces read moves to the first of them; a node its own piece reads too
    stays and gets a copy (``dynamo`` changes in place) in each later piece that reads it. One
    pass from the last node back, so a recomputed chain follows its readers back to values the
    whole plan keeps. Graphs with autocast or grad-mode switches are left as they are (the
    split replays those regions per piece). See Note [Bucket pieces keep the whole plan]."""
    moved = dict(piece)
    if any(_switch(n) for n in dynamo.graph.nodes):
        return moved
    for n in reversed(list(dynamo.graph.nodes)):
        if n not in moved or not _movable(n, kept, recomputed):
            continue
        later = sorted({moved[u] for u in n.users if u in moved and moved[u] > moved[n]})
        if not later:
            continue
        if not any(moved[u] == moved[n] for u in n.users if u in moved):
            moved[n] = later.pop(0)
        for p in later:
            with dynamo.graph.inserting_after(n):
                copy = dynamo.graph.node_copy(n)
            copy.meta = dict(n.meta)
            moved[copy] = p
            for u in [u for u in n.users if u is not copy and moved.get(u) == p]:
                u.replace_input_with(n, copy)
    dynamo.graph.lint()
    dynamo.recompile()
    return moved
