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
from typing import TYPE_CHECKING, Any

import torch.fx as fx

if TYPE_CHECKING:
    from ..core.peak import StepModel

__all__ = ["Backend", "BACKENDS", "INDEX_SOURCE", "WrapBackward"]

WrapBackward = Callable[[fx.GraphModule, Callable[[], Any]], Any]
"""``wrap_backward(bw, compile)`` of ``Backend.compile``."""

BACKENDS = ("inductor", "eager")

INDEX_SOURCE = "index source"
"""The reason of a value a backend keeps saved so that what is computed from it alone is computed
once (Inductor: Note [Values computed from indices] in ``remat/backends/inductor/lowering.py``)."""


class Backend(ABC):
    """One way of running the partitioned forward and backward. What a backend can do is read
    from its attributes (``reads_compiled_peak``, ``keeps_op_order``), never from its name."""

    name: str
    reads_compiled_peak: bool = False
    """Whether ``compile`` reads the peak of the step it compiled and hands it to ``on_peak``
    (Inductor: the memory plan of its generated code, ``remat.core.allocations``); only then can a
    budget re-plan a graph whose compiled peak misses it (Note [Budget re-plan])."""
    keeps_op_order: bool = False
    """Whether the partitioned graphs run op by op in the order remat gives them, nothing fused
    or reordered: only then do plans that depend on that order hold, such as nested checkpoints,
    whose backward recomputes copies of forward ops apart from their originals
    (``remat.planning.nesting``)."""

    @abstractmethod
    def step_model(self, gm: fx.GraphModule, nodes: list[fx.Node]) -> StepModel | None:
        """How the simulator replays a step of the joint graph ``gm`` (``nodes``: its nodes but
        the output, in order; ``remat.core.peak.Schedule.model``), with whatever per-node facts of
        its lowering that model reads; None: op by op (``remat.core.peak.OP_BY_OP``)."""

    @abstractmethod
    def workspace(self, nodes: list[fx.Node]) -> tuple[int, ...]:
        """Scratch bytes each node holds while it runs, beyond its output
        (``remat.core.peak.Schedule.workspace``; ATen's: ``remat.backends.aten_scratch``)."""

    @abstractmethod
    def annotate(self, forward: fx.GraphModule, backward: fx.GraphModule) -> None:
        """Mark the partitioned modules before they are lowered (Inductor: block tags)."""

    def channels_last(self, forward: fx.GraphModule) -> frozenset[str]:
        """The nodes of the partitioned ``forward`` (names) whose outputs this backend lays out
        channels-last where they are dense and 4-D, whatever their traced strides (Inductor's
        layout optimization); an offloaded value's host copy takes that layout (Note [Host copy
        layout] in ``remat.capture.offload_pass``). Empty: outputs keep their traced strides."""
        return frozenset()

    @abstractmethod
    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], partition: Callable[..., Any],
                on_peak: Callable[[Any], None] | None = None, *, stock: bool = False,
                wrap_backward: WrapBackward | None = None) -> Any:
        """Lower a captured graph: AOTAutograd traces the joint graph, ``partition`` splits it
        (``remat.capture.partition``), and the two halves are compiled or run as this backend does. A
        backend that ``reads_compiled_peak`` calls ``on_peak`` with the step's peak read from the
        compiled forward and backward (``remat.core.allocations.StepPeak``); others never call it.
        ``stock``: ``partition`` is torch.compile's own (``remat.tuning``), lowered with the
        backend's own settings rather than those remat's recompute needs. ``wrap_backward(bw,
        compile)``: what AOTAutograd gets for backward graph ``bw``, given ``compile()``, which
        compiles it as this backend does (``remat.capture.unsent_grads.wrapped_backward``)."""

    def keep_saved(self, nodes: list[fx.Node]) -> dict[fx.Node, str]:
        """Forward values of the joint graph (``nodes``) this backend runs faster saved than
        recomputed, each with its reason, a cost rule (``planner.COST_RULES``: a budget may
        override it). ``{}``: none."""
        return {}

    def __repr__(self) -> str:
        return f"<remat backend {self.name!r}>"
