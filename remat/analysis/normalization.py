"""The normalization-boundary rule's facts (Note [Normalization boundary] in ``remat/policy.py``):
which forward values are statistics (reduction outputs and pointwise functions of them), and
which ops apply a statistic to a full tensor and feed, through ops free to recompute, the next
normalisation's reduction."""

from __future__ import annotations

import torch.fx as fx

from ..policy import OpFacts
from . import cost
from .op_facts import NO_FACTS, stops_free_recompute, tensor_inputs
from .ops import CAST_OPS, op_name

__all__ = ["statistics", "normalization_boundaries"]

Facts = dict[fx.Node, OpFacts]
"""Each ``call_function`` value's own ``OpFacts``."""


def statistics(values: list[fx.Node], facts: Facts, ops: dict[fx.Node, str]) -> set[fx.Node]:
    """Reduction outputs (at least 4 input elements per output element), their getitems, and the
    ops whose every tensor input is a statistic (views excepted). ``ops``: each value's op name."""
    stat: set[fx.Node] = set()
    for n in values:
        if n.op != "call_function":
            continue
        f = facts[n]
        if f.reduction_ratio >= 4:
            stat.add(n)
        elif ops[n] == "getitem" and n.args[0] in stat:
            stat.add(n)
        else:
            ins = tensor_inputs(n)
            if ins and all(a in stat for a in ins) and not f.is_view:
                stat.add(n)
    return stat


def normalization_boundaries(values: list[fx.Node], stat: set[fx.Node], forward_nodes: frozenset[fx.Node],
                             facts: Facts) -> set[fx.Node]:
    """Ops that apply a statistic to a full tensor and feed, through ops free to recompute, the
    next reduction (see Note [Normalization boundary]). When such an op's only forward user is a cast to a narrower
    dtype (a bf16 layer norm computes in fp32 and casts back), the cast is the boundary: the
    narrower side is the one worth keeping."""
    out: set[fx.Node] = set()
    for n in values:
        if n.op != "call_function" or n not in forward_nodes or n in stat or facts[n].is_view:
            continue
        ins = tensor_inputs(n)
        full = cost.numel(n.meta.get("val"))
        if not (any(a in stat for a in ins)
                and any(a not in stat and cost.numel(a.meta.get("val")) == full for a in ins)):
            continue
        if not any(u in forward_nodes and u.op == "call_function"
                   and not any(a in stat for a in tensor_inputs(u)) for u in n.users):
            continue
        if not _reaches_reduction_pointwise(n, forward_nodes, facts, stat):
            continue
        out.add(_past_narrowing_casts(n, forward_nodes))
    return out


def _past_narrowing_casts(n: fx.Node, forward_nodes: frozenset[fx.Node]) -> fx.Node:
    """``n``, or the last of the casts to narrower dtypes that are, one after the other, its only
    forward user."""
    while True:
        users = [u for u in n.users if u in forward_nodes]
        if not (len(users) == 1 and op_name(users[0]) in CAST_OPS
                and cost.nbytes(users[0].meta.get("val")) < cost.nbytes(n.meta.get("val"))):
            return n
        n = users[0]


def _reaches_reduction_pointwise(start: fx.Node, forward_nodes: frozenset[fx.Node], facts: Facts,
                                 stat: set[fx.Node]) -> bool:
    """True if a path of forward ops that the cut may recompute for free (no matmul, attention,
    random or data-dependent op) leads from ``start`` to the reduction of a *next* normalisation
    (``_applications``): only then can recompute chain from one normalisation into the next
    layer without saving anything. Two kinds of reduction do not count. One whose statistic is
    applied to nothing but ``start`` or values computed from it alone is part of ``start``'s own
    normalisation (the sum of a softmax after the max subtracted, the variance of a layer norm
    after the mean): the boundary is where that normalisation ends. One whose statistic is never
    applied to a tensor ends the graph's work (a loss summed to a scalar). An LM loss's
    log-softmax, held at ``x - max``, saved float32 probabilities in place of the logits they
    are recomputed from."""
    own = _computed_from(start, forward_nodes, stat)
    seen: set[fx.Node] = set()
    stack = [u for u in start.users if u in forward_nodes]
    while stack:
        n = stack.pop()
        if n in seen or n.op != "call_function":
            continue
        seen.add(n)
        f = facts.get(n, NO_FACTS)
        if stops_free_recompute(f):
            continue
        if f.reduction_ratio >= 4:
            applied = _applications(n, forward_nodes, stat)
            if any(a not in own for u in applied for a in tensor_inputs(u) if a not in stat):
                return True
            continue
        stack.extend(u for u in n.users if u in forward_nodes)
    return False


def _computed_from(start: fx.Node, forward_nodes: frozenset[fx.Node], stat: set[fx.Node]) -> set[fx.Node]:
    """``start`` and the forward values computed from it alone (besides statistics): each op's
    only tensor input that is not a statistic is ``start`` or another such value."""
    own = {start}
    stack = [start]
    while stack:
        for u in stack.pop().users:
            if u in own or u not in forward_nodes or u.op != "call_function" or u in stat:
                continue
            if all(a in own for a in tensor_inputs(u) if a not in stat):
                own.add(u)
                stack.append(u)
    return own


def _applications(reduction: fx.Node, forward_nodes: frozenset[fx.Node], stat: set[fx.Node]) -> set[fx.Node]:
    """The forward ops that apply ``reduction``'s statistic (or one computed from statistics
    alone) to a value that is not a statistic, as a norm applies its mean and variance."""
    found: set[fx.Node] = set()
    seen: set[fx.Node] = set()
    stack = [reduction]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for u in n.users:
            if u not in forward_nodes or u.op != "call_function":
                continue
            if u in stat:
                stack.append(u)
            elif any(a not in stat for a in tensor_inputs(u)):
                found.add(u)
    return found
