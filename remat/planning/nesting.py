"""Nested checkpoints: checkpoints that are themselves recomputed (Chen et al. 2016, two levels).

A checkpoint-segment plan (``remat.core.segments``) saves its separators for the whole backward: with
``n`` segments the backward holds ``n`` checkpoints plus one segment's working set. A nested plan
saves only *outer* checkpoints, every ``m``-th. When the backward reaches an outer segment it
recomputes it once, keeping just its *inner* checkpoints (the sweep), and recomputes each inner
segment a second time right before that segment's backward. The step then holds ``n/m`` outer
checkpoints, at most ``m`` inner ones and one segment's working set; ops before an inner
checkpoint run three times (forward, sweep, backward). ``m`` near ``sqrt(n)`` gives Chen et al.'s
``O(sqrt(n))`` schedule.

The joint graph says this with copies (``nest``): every activation the backward reads inside a
segment, and every activation such a value is computed from back to the nearest checkpoint, gets
a copy computed from the copies of its inputs (or from the checkpoint, parameter, or saved-only
value, such as a dropout mask, that it reads); the backward reads the copies instead. The
originals then feed the forward and the sweep only. Planned with the outer checkpoints never
recomputed, and the inner checkpoints and the copies never saved (``remat.planning.planner``), the rewritten
graph needs nothing else: the cut, the simulator's lazy placement (``remat.core.peak``) and the
partition (``remat.capture.partition``) place the sweep before the first copy that reads an inner
checkpoint, and each copy just before its first use. Copies never merge back: common
subexpressions are eliminated before planning, not after.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch.fx as fx

from ..core.reach import reachable

__all__ = ["COPY_OF", "copy_of", "nest"]

COPY_OF = "remat_copy_of"
"""``node.meta`` key of a copy: the name of the node it copies."""


def copy_of(node: fx.Node) -> str | None:
    """The name of the node ``node`` copies (a nested plan's second recompute), or None."""
    return node.meta.get(COPY_OF)


def nest(gm: fx.GraphModule, values: list[fx.Node], activations: Iterable[int], forward: Iterable[int],
         keep: Iterable[int]) -> fx.GraphModule:
    """A copy of the joint graph ``gm`` in which the backward reads copies of activations (see
    the module docstring). ``values``: the joint graph's values (``JointGraph.nodes``);
    ``activations``: indices of the forward values computed from the network's inputs;
    ``forward``: indices of every value the forward computes; ``keep``: indices the backward
    keeps reading directly (the checkpoints, and values that must be saved). ``gm`` is unchanged."""
    act, fwd, kept = set(activations), set(forward), set(keep)
    index = {n: i for i, n in enumerate(values)}
    copyable = act - kept
    # A getitem of a multi-output op that is not copied reads the op's result, which holds every
    # output: copying the getitem would keep them all alive until the copy runs.
    copyable -= {v for v in copyable if values[v].target is operator.getitem
                 and index.get(values[v].args[0]) not in copyable}

    def backward_side(n: fx.Node) -> bool:
        return n.op != "output" and (n not in index or index[n] not in fwd)

    read = {index[a] for n in gm.graph.nodes if backward_side(n) for a in n.all_input_nodes
            if a in index and index[a] in copyable}
    copied = reachable(read, lambda v: [index[a] for a in values[v].all_input_nodes
                                        if a in index and index[a] in copyable])
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    out, old_out = graph.graph_copy(gm.graph, env, return_output_node=True)
    output = graph.output(out)
    output.meta = dict(old_out.meta)
    twin: dict[fx.Node, fx.Node] = {}
    for v in sorted(copied):
        orig = env[values[v]]
        src = values[v]
        with graph.inserting_after(orig):
            c = graph.create_node(src.op, src.target, fx.map_arg(src.args, lambda a: twin.get(a, env[a])),
                                  fx.map_arg(src.kwargs, lambda a: twin.get(a, env[a])), name=f"{orig.name}_again")
        c.meta = {k: x for k, x in src.meta.items() if k != "partitioner_tag"}
        c.meta[COPY_OF] = orig.name
        twin[values[v]] = c
    by_new = {env[n]: t for n, t in twin.items()}
    for n in list(gm.graph.nodes):
        if backward_side(n):
            new = env[n]
            for a in list(new.all_input_nodes):
                if a in by_new:
                    new.replace_input_with(a, by_new[a])
    graph.lint()
    nested = fx.GraphModule(gm, graph)
    nested.meta = dict(gm.meta)
    return nested
