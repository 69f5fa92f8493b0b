"""``InductorBackend``: the partitioned graphs are compiled by Inductor (Triton on GPU, C++ on
CPU), and the simulator replays the step kernel by kernel (``kernel_model``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ...analysis.joint_graph import device_of
from ...core.allocations import GraphTrace, Reading, read_step
from ...versions import check_torch_version, drift
from ..aten_scratch import scratch_bytes
from ..base import Backend, WrapBackward
from . import fusion
from .extern_layouts import operand_strides
from .hooks import (
    channels_last_nodes,
    compile_fx,
    estimate_sizes_buffers,
    inductor_partitioner,
    recomputed_in_forward_layout,
    tag_stages,
)
from .kernel_model import KernelModel
from .lowering import index_sources, node_lowerings

__all__ = ["InductorBackend", "rules_for_graph"]


def rules_for_graph(gm: fx.GraphModule) -> fusion.FusionRules:
    """The fusion rules of the graph's device; on a GPU, sized with its own multiprocessor count
    (Note [Mix-order workspace]); buffer reuse judged by Inductor's estimate as this torch makes
    it for a graph compiled in remat's order (Note [Reuse estimate])."""
    device = device_of(gm)
    rules = fusion.replace_rules(fusion.rules_for(device), reuse_estimate_buffers=estimate_sizes_buffers())
    if device == "cuda" and torch.cuda.is_available():
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        if sms != rules.sm_count:
            rules = fusion.replace_rules(rules, sm_count=sms)
    return rules


class InductorBackend(Backend):
    name = "inductor"
    reads_compiled_peak = True

    def step_model(self, gm: fx.GraphModule, nodes: list[fx.Node]) -> KernelModel:
        return KernelModel(rules_for_graph(gm), node_lowerings(nodes))

    def workspace(self, nodes: list[fx.Node]) -> tuple[int, ...]:
        """ATen kernels' scratch with their operands laid out as Inductor passes them (Note
        [Operands as the backend lays them out])."""
        convs = [n for n in nodes if n.target is torch.ops.aten.convolution.default]
        gm = nodes[0].graph.owning_module if nodes else None
        channels_last = bool(convs and gm is not None and device_of(gm) == "cuda" and channels_last_nodes(gm))
        return tuple(scratch_bytes(n, operand_strides(n, channels_last)) for n in nodes)

    def annotate(self, forward: fx.GraphModule, backward: fx.GraphModule) -> None:
        tag_stages(forward, backward)
        recomputed_in_forward_layout(backward)

    def channels_last(self, forward: fx.GraphModule) -> frozenset[str]:
        return channels_last_nodes(forward)

    def keep_saved(self, nodes: list[fx.Node]) -> dict[fx.Node, str]:
        return index_sources(nodes)

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], partition: Callable[..., Any],
                on_peak: Callable[[Reading], None] | None = None, *, stock: bool = False,
                wrap_backward: WrapBackward | None = None) -> Any:
        check_torch_version()
        reading = _StepReading(on_peak) if on_peak is not None else None
        with inductor_partitioner(partition):
            return compile_fx(gm, example_inputs, reading.on_graph if reading else None, stock=stock,
                              wrap_backward=wrap_backward)


class _StepReading:
    """Collects the memory plans of one captured graph's compiled forward and backward and hands
    the step's peak under both callers (``remat.core.allocations.read_step``) to ``report`` once both
    are compiled."""

    def __init__(self, report: Callable[[Reading], None]):
        self.report = report
        self.forward: tuple[list[str | None], GraphTrace] | None = None

    def on_graph(self, is_backward: bool, names: tuple[list[str | None], list[str], set[str]],
                 trace: GraphTrace) -> None:
        if trace.unknown:  # a line the reader does not know: the read peak may be off
            drift("read_allocations", f"a reader for the wrapper lines {', '.join(sorted(set(trace.unknown)))}")
        if not is_backward:
            self.forward = (names[0], trace)
        elif self.forward is not None:
            outputs, fw = self.forward
            self.report(read_step(fw, trace, outputs, names[1], names[2]))
