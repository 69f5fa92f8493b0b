"""The Inductor step model: the simulator's view of a step that Inductor compiled, replayed
kernel by kernel (``remat.backends.inductor.fusion`` decides which values are stored and how kernels
allocate them). Pure: no torch import."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ...core.peak import Schedule, Step, ancestors
from .facts import FusionGraph, Kind, NodeLowering, check_facts, itemsize
from .fusion import FusionRules, kernels, lower

__all__ = ["KernelModel", "kernel_steps", "early_order", "elements"]

_Key = tuple[int, int]


@dataclass(frozen=True)
class KernelModel:
    """``remat.core.peak.StepModel`` for Inductor under ``rules``, for one joint graph: ``facts``
    says how Inductor lowers each of its nodes (``remat.backends.inductor.lowering``). In the
    floor (``peak.floor_bytes``) only extern kernels count: a matmul reads and writes real
    buffers, while fused work may keep its operands on chip."""

    rules: FusionRules
    facts: tuple[NodeLowering, ...]
    name = "simulated: Inductor step model"

    def steps(self, s: Schedule, saved: set[int], fwd: list[int], bwd: list[int]):
        check_facts(self.facts, s.n)
        return kernel_steps(s, saved, fwd, bwd, self)

    def in_floor(self, s: Schedule, v: int) -> bool:
        check_facts(self.facts, s.n)
        return self.facts[v].kind is Kind.EXTERN

    def graph(self, s: Schedule, order: Iterable[int], given: Iterable[int], outputs: Iterable[int],
              numel: tuple[int, ...] | None = None) -> FusionGraph:
        """One graph of the step (``order``: its nodes in execution order) as ``fusion`` lowers it."""
        outputs = frozenset(outputs)
        return FusionGraph(tuple(order), s.inputs, self.facts, s.nbytes, frozenset(given), outputs,
                           frozenset(s.root[v] for v in outputs),  # a gradient may be a view (permute of mm)
                           elements(s, self.facts) if numel is None else numel)


def kernel_steps(s: Schedule, saved: set[int], fwd: list[int], bwd: list[int], model: KernelModel):
    """One step per Inductor kernel of the forward and of the backward under ``model.rules``."""
    pre = set(s.graph_input)
    steps: list[Step] = []
    nbytes: dict[_Key, int] = {}
    bwd_given = saved | pre | set(s.tangent)
    bwd_side = set(bwd) | set(s.tangent)
    alias: list[dict[int, int]] = [{}, {}]  # per phase: node -> the storage it lives in

    def storage(u: int, phase: int) -> _Key:
        r = s.root[u]
        if phase and r in bwd_side:
            return (alias[1].get(r, r), 1)
        return (alias[0].get(r, r), 0)

    numel = elements(s, model.facts)
    fwd = early_order(s, fwd, ancestors(s, set(s.fwd_outputs), pre | set(s.tangent)))
    graphs = ((0, fwd, pre, set(s.fwd_outputs) | saved), (1, bwd, bwd_given, set(s.bwd_outputs)))
    boundary = 0
    for phase, nodes, given, outputs in graphs:
        g = model.graph(s, nodes, given, outputs, numel)

        def key(u: int, phase: int = phase, given: set[int] = given) -> _Key:
            if u in given:  # an input of this graph: a forward value (a saved view keeps its base)
                return storage(u, 1 if u in s.tangent else 0)
            return (u, phase)

        ks, alias[phase] = kernels(g, lower(g, model.rules), model.rules)
        if phase == 1:
            boundary = len(steps)
            for t in sorted(s.tangent):
                nbytes[(t, 1)] = s.nbytes[t]
                steps.append(Step(f"backward:{s.names[t] if s.names else t}", ((t, 1),), frozenset()))
        where = "forward" if phase == 0 else "backward"
        for k in ks:
            for a in k.allocs:
                if a not in pre:
                    nbytes[key(a)] = s.nbytes[a]
            steps.append(Step(f"{where}:{s.names[k.node] if s.names else k.node}",
                               tuple(key(a) for a in k.allocs if a not in pre),
                               frozenset(key(u) for u in k.reads if u not in pre),
                               (sum(s.workspace[v] for v in k.nodes) if s.workspace else 0) + k.held))
    return steps, boundary, nbytes, storage


def elements(s: Schedule, facts: tuple[NodeLowering, ...]) -> tuple[int, ...]:
    """Elements of each node's value, from the bytes of the storage it lives in (a view counts
    its base's; 0 where unknown: graph inputs)."""
    return tuple(s.nbytes[s.root[v]] // itemsize(facts[s.root[v]].dtype) for v in range(s.n))


def early_order(s: Schedule, nodes: list[int], main: set[int]) -> list[int]:
    """``nodes`` (in graph order) with every node outside ``main`` moved to just after its last
    input: Inductor fuses a value only the backward needs (a saved layer-norm statistic, a
    derivative the forward precomputes) into the kernel of the values it reads."""
    order = [v for v in nodes if v in main]
    pos = {v: i for i, v in enumerate(order)}
    after: dict[int, list[int]] = {}
    for v in nodes:
        if v in main:
            continue
        anchor = max((u for u in s.inputs[v] if u in pos), key=pos.__getitem__, default=None)
        after.setdefault(anchor, []).append(v)
        pos[v] = pos[anchor] if anchor is not None else -1
    out = list(after.get(None, []))
    stack: list[int] = []
    for v in order:
        out.append(v)
        stack = [v]
        while stack:
            w = stack.pop()
            for x in after.get(w, []):
                out.append(x)
                stack.append(x)
    return out
