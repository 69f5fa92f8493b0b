"""A copy of a captured graph to plan or compile again from: Inductor's passes change the graph
they compile, and a budget's re-plan or a measured candidate compiles the same graph again."""

from __future__ import annotations

import copy

import torch.fx as fx

from .. import compat

__all__ = ["copy_graph"]


def copy_graph(gm: fx.GraphModule) -> fx.GraphModule | None:
    """A copy of ``gm`` to plan or compile again from (Inductor's passes change the graph they
    compile), sharing its parameters and constants; None if the graph cannot be copied."""
    try:
        copied = fx.GraphModule(gm, copy.deepcopy(gm.graph))  # the graph anew; its attributes shared
    except Exception:  # noqa: BLE001 - a node meta holding an object that cannot be copied
        return None
    copied.meta.update(gm.meta)
    compat.copy_dynamo_sources(gm, copied)  # versions.HOOKS["dynamo_sources"]: parameters stay parameters
    return copied
