"""Capture: the Dynamo backend that hands each captured graph to AOTAutograd with remat's
partition function, then to the chosen lowering (Inductor or uncompiled)."""

from __future__ import annotations

import warnings
from typing import Any

import torch.fx as fx

from . import compat, distributed
from .options import Options
from .partition import make_partition_fn
from .plan import Plan

__all__ = ["RematBackend", "remat_backend"]


class _Planned(Exception):
    """Raised after planning in explain-only mode, to skip compiling the planned graph."""


def _run_uncompiled(gm: fx.GraphModule, example_inputs: Any) -> Any:
    return compat.run_uncompiled(gm)


class RematBackend:
    """A Dynamo backend. ``plans`` collects one Plan per captured training graph, in capture
    order. With ``explain_only``, graphs are planned but run uncompiled and never trained."""

    def __init__(self, options: Options, *, explain_only: bool = False, want_frontier: bool = False):
        self.options = options
        self.explain_only = explain_only
        self.want_frontier = want_frontier
        self.plans: list[Plan] = []
        self.frontiers: list[tuple[Plan, ...] | None] = []
        self.graph_breaks: list[str] = []
        """Where Dynamo broke the model's graphs (``file:line (why)``), in capture order."""
        self._warned_breaks = False

    def warn_graph_breaks(self, stacklevel: int = 2) -> None:
        """One warning per wrapped model listing its graph breaks, if it has any."""
        if self._warned_breaks or not self.graph_breaks:
            return
        self._warned_breaks = True
        warnings.warn(
            f"remat: Dynamo broke the model into several graphs at {len(self.graph_breaks)} graph "
            f"break(s): {'; '.join(self.graph_breaks)}. Each captured graph is planned on its own "
            "(remat.compiled_plans lists them): nothing is recomputed across a break, and tensors "
            "that cross it stay alive. Remove the breaks to plan the step as one graph "
            "(torch._dynamo.explain(model)(*inputs) explains each).",
            stacklevel=stacklevel + 1,
        )

    def _sink(self, plan: Plan, frontier: tuple[Plan, ...] | None) -> None:
        self.plans.append(plan)
        self.frontiers.append(frontier)
        if self.explain_only:
            raise _Planned()
        distributed.check_ranks_agree(plan)  # Note [Ranks agree on plans]; no-op outside torch.distributed

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        clean_module_paths(gm)
        where = compat.graph_break(gm)
        if where is not None and where not in self.graph_breaks:
            self.graph_breaks.append(where)
        partition = make_partition_fn(self.options, self._sink, self.want_frontier)
        try:
            if self.options.backend == "eager":
                lower = compat.aot_autograd(
                    fw_compiler=_run_uncompiled,
                    bw_compiler=_run_uncompiled,
                    partition_fn=partition,
                    decompositions=compat.eager_decompositions(),
                )
                with compat.no_autograd_cache():
                    return lower(gm, example_inputs)
            with compat.inductor_partitioner(partition):
                return compat.compile_fx(gm, example_inputs)
        except _Planned:
            return gm.forward
        except Exception as e:  # Dynamo wraps backend errors; unwrap our own _Planned
            cause = e
            while cause is not None:
                if isinstance(cause, _Planned):
                    return gm.forward
                cause = cause.__cause__
            raise


def clean_module_paths(gm: fx.GraphModule) -> None:
    """Drop the ``.forward.__self__`` step Dynamo puts in the module paths of modules it reached
    through a wrapped module's own ``forward`` method (Note [One frame per wrapped module] in
    ``remat/api.py``): ``m.forward.__self__`` is ``m``."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack and any(".forward.__self__" in v[0] for v in stack.values()):
            node.meta["nn_module_stack"] = {k: (v[0].replace(".forward.__self__", ""), *v[1:])
                                            for k, v in stack.items()}


def remat_backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """``torch.compile(model, backend="remat")``: remat with default options (Inductor)."""
    return RematBackend(Options(**kwargs))(gm, example_inputs)
