"""Common-subexpression elimination on the joint graph, before planning: the backward's
re-derivations of forward values (a layer norm's normalised input, say) become reads of the
forward value, which the cut can then save or recompute once."""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from .ops import is_impure

__all__ = ["cse"]


def _hashable(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(a) for a in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    if isinstance(x, slice):
        return ("slice", x.start, x.stop, x.step)
    return x


def cse(gm: fx.GraphModule) -> int:
    """Merge identical pure ops (same target and arguments) in place; returns merges done.
    Impure ops (``remat.analysis.ops.is_impure``: mutations, random ops, collectives of every
    namespace) are never merged."""
    seen: dict[Any, fx.Node] = {}
    merged = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or is_impure(n):
            continue
        key = (n.target, _hashable(n.args), _hashable(n.kwargs))
        try:
            hash(key)
        except TypeError:
            continue
        if key in seen:
            n.replace_all_uses_with(seen[key])
            gm.graph.erase_node(n)
            merged += 1
        else:
            seen[key] = n
    gm.recompile()
    return merged
