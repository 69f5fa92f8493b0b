"""``InductorBackend``: the partitioned graphs are compiled by Inductor (Triton on GPU, C++ on
CPU), and the simulator replays the step kernel by kernel (``kernel_model``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ..backend import Backend
from ..graph import device_of
from . import fusion
from .hooks import compile_fx, inductor_partitioner, tag_stages
from .kernel_model import KernelModel
from .lowering import schedule_fields
from .versions import check_torch_version

__all__ = ["InductorBackend", "rules_for_graph"]


def rules_for_graph(gm: fx.GraphModule) -> fusion.FusionRules:
    """The fusion rules of the graph's device; on a GPU, sized with its own multiprocessor count
    (Note [Mix-order workspace])."""
    device = device_of(gm)
    rules = fusion.rules_for(device)
    if device == "cuda" and torch.cuda.is_available():
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        if sms != rules.sm_count:
            rules = fusion.replace_rules(rules, sm_count=sms)
    return rules


class InductorBackend(Backend):
    name = "inductor"

    def schedule_fields(self, gm: fx.GraphModule, nodes: list[fx.Node]) -> dict[str, Any]:
        return {**schedule_fields(nodes), "model": KernelModel(rules_for_graph(gm))}

    def annotate(self, forward: fx.GraphModule, backward: fx.GraphModule) -> None:
        tag_stages(forward, backward)

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], partition: Callable[..., Any]) -> Any:
        check_torch_version()
        with inductor_partitioner(partition):
            return compile_fx(gm, example_inputs)
