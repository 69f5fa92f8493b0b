"""The backend interface: how a captured graph is lowered, and what the planner and the peak
simulator need to know about that lowering.

Two backends implement it: ``"eager"`` (``remat.backends.eager``: the partitioned graphs run
uncompiled, op by op) and ``"inductor"`` (``remat.backends.inductor``: Triton on GPU, C++ on CPU);
``remat.backends.registry.backend_for`` picks one by name. Everything that knows how a backend
lowers, fuses and allocates sits behind these methods; planning (``remat.planning``), graph
analysis (``remat.analysis``) and the simulator (``remat.core.peak``) only call them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch.fx as fx

__all__ = ["Backend", "BACKENDS", "INDEX_SOURCE"]

BACKENDS = ("inductor", "eager")

INDEX_SOURCE = "index source"
"""The reason of a value a backend keeps saved so that what is computed from it alone is computed
once (Inductor: Note [Values computed from indices] in ``remat/backends/inductor/lowering.py``)."""


class Backend(ABC):
    """One way of running the partitioned forward and backward."""

    name: str
    nested_plans: bool = False
    """Whether the planner may offer nested checkpoint plans (``remat.planning.nesting``): the
    backend runs a recomputed copy apart from its original (Inductor's scheduler may fuse or
    reorder the two)."""

    @abstractmethod
    def schedule_fields(self, gm: fx.GraphModule, nodes: list[fx.Node]) -> dict[str, Any]:
        """Extra fields of ``remat.core.peak.Schedule`` for the joint graph ``gm`` (``nodes``: its
        nodes but the output, in order): the step model the simulator replays
        (``Schedule.model``) and the per-node lowering facts that model reads. ``{}``: op by op."""

    @abstractmethod
    def annotate(self, forward: fx.GraphModule, backward: fx.GraphModule) -> None:
        """Mark the partitioned modules before they are lowered (Inductor: block tags)."""

    @abstractmethod
    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], partition: Callable[..., Any],
                on_peak: Callable[[Any], None] | None = None) -> Any:
        """Lower a captured graph: AOTAutograd traces the joint graph, ``partition`` splits it
        (``remat.capture.partition``), and the two halves are compiled or run as this backend does. A
        backend that plans its own memory calls ``on_peak`` with the step's peak read from the
        compiled forward and backward (``remat.core.allocations.StepPeak``); others never call it."""

    def keep_saved(self, nodes: list[fx.Node]) -> dict[fx.Node, str]:
        """Forward values of the joint graph (``nodes``) this backend runs faster saved than
        recomputed, each with its reason, a cost rule (``remat.planning.decisions.Kind.COST``: a
        budget may override it). ``{}``: none."""
        return {}

    def __repr__(self) -> str:
        return f"<remat backend {self.name!r}>"
