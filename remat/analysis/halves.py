"""The forward and backward halves of an AOTAutograd joint graph.

* inputs: ``primals_*`` placeholders (parameters and buffers among them are free to save);
* backward: tangents and everything that depends on a tangent;
* forward-computable: every other op. Those that forward outputs depend on are *forward*
  ops (the forward computes them anyway); the rest are computed from forward values only
  for the backward and may run in either half."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch.fx as fx

from .. import compat
from ..core.reach import reachable
from ..planning.nesting import COPY_OF
from .op_facts import view_root

UNSENT = "remat_unsent_grad"
"""Node meta key of ``remat.capture.unsent_grads`` (Note [Gradients the caller does not send]). On
a stand-in ``full``: the name of the tangent placeholder it replaces. On that placeholder: why."""

__all__ = ["Halves", "halves", "is_tangent", "is_unsent", "UNSENT"]


def is_unsent(node: fx.Node) -> bool:
    """A tangent placeholder a stand-in replaced, or the stand-in itself (``UNSENT``)."""
    return bool(node.meta.get(UNSENT))


def is_tangent(node: fx.Node) -> bool:
    """A placeholder of the backward: an output's gradient (``tangents_*``, ``bwd_*``)."""
    return node.op == "placeholder" and (
        str(node.target).startswith("tangents") or str(node.target).startswith("bwd_")
    )


@dataclass(frozen=True, slots=True)
class Halves:
    """Which nodes of one joint graph the forward and the backward compute."""

    primals: tuple[fx.Node, ...]
    """The graph's inputs (placeholders that are not tangents), in graph order."""
    static: frozenset[fx.Node]
    """The primals that are parameters or buffers."""
    fwd_outs: tuple[object, ...]
    """The forward's outputs (nodes, or ``None`` for outputs that are not tensors)."""
    bwd_outs: tuple[object, ...]
    """The backward's outputs: the inputs' gradients."""
    backward: frozenset[fx.Node]
    """Tangents and every node that depends on one."""
    forward: frozenset[fx.Node]
    """The nodes the forward computes."""


def halves(gm: fx.GraphModule, num_fwd_outputs: int, static_input_indices: list[int]) -> Halves:
    """Split ``gm``'s nodes into its halves (see the module docstring)."""
    graph = gm.graph
    primals = tuple(n for n in graph.nodes if n.op == "placeholder" and not is_tangent(n))
    out = graph.find_nodes(op="output")[0]
    args = list(compat.tree_leaves(out.args))
    fwd_outs, bwd_outs = tuple(args[:num_fwd_outputs]), tuple(args[num_fwd_outputs:])
    backward: set[fx.Node] = set()
    for n in graph.nodes:
        # a stand-in for an unsent gradient (remat.capture.unsent_grads) is the backward's
        if is_tangent(n) or is_unsent(n) or any(a in backward for a in n.all_input_nodes):
            if n.op != "output":
                backward.add(n)
    return Halves(primals=primals, static=frozenset(primals[i] for i in static_input_indices if i < len(primals)),
                  fwd_outs=fwd_outs, bwd_outs=bwd_outs, backward=frozenset(backward),
                  forward=frozenset(_forward(graph, fwd_outs, backward)))


def _forward(graph: fx.Graph, fwd_outs: tuple[object, ...], backward: set[fx.Node]) -> set[fx.Node]:
    forward = reachable([a for a in fwd_outs if isinstance(a, fx.Node)], lambda n: n.all_input_nodes)
    # Every output of a multi-output forward op (an attention's logsumexp, say) is forward.
    forward.update(u for n in list(forward) for u in n.users if u.target is operator.getitem)
    # Ops the user's forward ran are forward ops even when only the backward reads them (noise
    # a custom autograd.Function draws and saves, say): AOTAutograd tags them while tracing.
    # Views are left out: taking one is free in either half.
    forward.update(n for n in graph.nodes if n.op == "call_function" and n not in backward
                   and n.meta.get("partitioner_tag") == "is_forward" and view_root(n) is n)
    # A nested plan's copies (``remat.planning.nesting``) compute forward values a second time.
    forward.update(n for n in graph.nodes if n.meta.get(COPY_OF))
    return forward
