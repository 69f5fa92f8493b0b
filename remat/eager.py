"""The uncompiled backend: the partitioned forward and backward run op by op, for debugging and
fast tests. Its peak is simulated op by op (``remat.peak.OP_BY_OP``), which is exact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx as fx

from . import compat
from .backend import Backend
from .inductor.decompositions import eager_decompositions

__all__ = ["EagerBackend"]


def _run_uncompiled(gm: fx.GraphModule, example_inputs: Any) -> Any:
    return compat.run_uncompiled(gm)


class EagerBackend(Backend):
    name = "eager"

    def schedule_fields(self, gm: fx.GraphModule, nodes: list[fx.Node]) -> dict[str, Any]:
        return {}

    def annotate(self, forward: fx.GraphModule, backward: fx.GraphModule) -> None:
        return None

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], partition: Callable[..., Any]) -> Any:
        lower = compat.aot_autograd(
            fw_compiler=_run_uncompiled,
            bw_compiler=_run_uncompiled,
            partition_fn=partition,
            decompositions=eager_decompositions(),  # Note [Eager RNG order]
        )
        with compat.no_autograd_cache():
            return lower(gm, example_inputs)
