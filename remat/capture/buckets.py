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
boundary remat made). A moved op or a copy goes just before its first reader in its new piece, so
the pieces stay in graph order: ``split_module`` replays autocast and grad-mode regions piece by
piece and needs that order. An op moves only to where it runs under the same autocast and grad
mode as where it was (``_modes``): the rotary tables some transformers releases (5.17) compute
under ``torch.no_grad`` stay where they are, and later pieces read them. (Graphs with such regions
used to be left as they were, and their pieces kept most of what the split costs without
``regroup``.)
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .. import compat
from ..analysis.op_facts import aliases_by_name
from ..analysis.ops import is_impure

__all__ = ["whole_plan_values", "regroup"]


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
        if not aliases_by_name(node) or not node.args or not isinstance(node.args[0], fx.Node):
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


def _modes(graph: fx.Graph) -> dict[fx.Node, tuple]:
    """The autocast and grad mode each node of ``graph`` runs under, as far as the graph sets
    them: the arguments of the innermost ``_set_grad_enabled`` before it (``None``: the mode the
    graph is called in) and of each autocast region it is inside, outermost first. Two nodes
    with equal modes compute the same thing at either's place."""
    grad: tuple | None = None
    autocasts: list[fx.Node] = []
    modes: dict[fx.Node, tuple] = {}
    for n in graph.nodes:
        name = getattr(n.target, "__name__", "") if _switch(n) else ""
        if name == "_set_grad_enabled":
            grad = tuple(n.args)
        elif name == "_enter_autocast":
            autocasts.append(n)
        elif name == "_exit_autocast" and n.args and n.args[0] in autocasts:
            autocasts.remove(n.args[0])
        modes[n] = (grad, tuple(tuple(a.args) for a in autocasts))
    return modes


def regroup(dynamo: fx.GraphModule, piece: dict[fx.Node, int], kept: set[str],
            recomputed: set[str]) -> dict[fx.Node, int]:
    """``piece`` (the bucket piece of each node of ``dynamo``, as DDP's split chose it) with the
    nodes the whole plan recomputes (and does not keep) computed by the pieces that read them:
    a node only later pieces read moves to the first of them; a node its own piece reads too
    stays and gets a copy (``dynamo`` changes in place) in each later piece that reads it. One
    pass from the last node back, so a recomputed chain follows its readers back to values the
    whole plan keeps. See Note [Bucket pieces keep the whole plan].

    A moved node or a copy goes just before its first reader in its new piece, so the pieces
    stay in graph order (``split_module`` needs that to replay autocast and grad-mode regions
    piece by piece), and only where it runs under the same autocast and grad mode as where it
    was (``_modes``): an op under ``torch.no_grad`` (HF's rotary tables) is read, not copied,
    by a later piece outside that region."""
    moved = dict(piece)
    graph = dynamo.graph
    modes = _modes(graph)
    order = {n: i for i, n in enumerate(graph.nodes)}
    for n in reversed(list(graph.nodes)):
        if n not in moved or not _movable(n, kept, recomputed):
            continue
        first: dict[int, fx.Node] = {}
        for u in n.users:
            p = moved.get(u)
            if p is not None and p > moved[n] and (p not in first or order[u] < order[first[p]]):
                first[p] = u
        later = sorted(p for p in first if modes.get(first[p]) == modes[n])
        if not later:
            continue
        if not any(moved[u] <= moved[n] for u in n.users if u in moved) and later[0] == min(first):
            p = later.pop(0)
            first[p].prepend(n)
            moved[n] = p
        for p in later:
            with graph.inserting_before(first[p]):
                copy = graph.node_copy(n)
            copy.meta = dict(n.meta)
            moved[copy] = p
            modes[copy] = modes[n]
            for u in [u for u in n.users if u is not copy and moved.get(u) == p]:
                u.replace_input_with(n, copy)
        order = {n: i for i, n in enumerate(graph.nodes)}
    graph.lint()
    dynamo.recompile()
    return moved
