"""The Inductor step model: the simulator's view of a step that Inductor compiled, replayed
kernel by kernel (``remat.backends.inductor.fusion`` decides which values are stored and how kernels
allocate them). Pure: no torch import."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.peak import Schedule, Step, ancestors
from .fusion import FusionRules, itemsize, kernels, lower

__all__ = ["KernelModel", "kernel_steps", "early_order", "elements"]

_Key = tuple[int, int]


@dataclass(frozen=True)
class KernelModel:
    """``remat.core.peak.StepModel`` for Inductor under ``rules``. In the floor (``peak.floor_bytes``)
    only extern kernels count: a matmul reads and writes real buffers, while fused work may keep
    its operands on chip."""

    rules: FusionRules
    name = "simulated: Inductor step model"

    def steps(self, s: Schedule, saved: set[int], fwd: list[int], bwd: list[int]):
        return kernel_steps(s, saved, fwd, bwd, self.rules)

    def in_floor(self, s: Schedule, v: int) -> bool:
        return bool(s.kind) and s.kind[v] == "extern"


def kernel_steps(s: Schedule, saved: set[int], fwd: list[int], bwd: list[int], rules: FusionRules):
    """One step per Inductor kernel of the forward and of the backward under ``rules``."""
    pre = set(s.graph_input)
    kind, ops = s.kind, s.ops or (1,) * s.n
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

    numel = elements(s)
    fwd = early_order(s, fwd, ancestors(s, set(s.fwd_outputs), pre | set(s.tangent)))
    graphs = ((0, fwd, pre, set(s.fwd_outputs) | saved), (1, bwd, bwd_given, set(s.bwd_outputs)))
    boundary = 0
    for phase, nodes, given, outputs in graphs:
        lowered = lower(nodes, s.inputs, kind, ops, s.heavy, given, outputs, rules, numel)

        def key(u: int, phase: int = phase, given: set[int] = given) -> _Key:
            if u in given:  # an input of this graph: a forward value (a saved view keeps its base)
                return storage(u, 1 if u in s.tangent else 0)
            return (u, phase)

        storage_outputs = {s.root[v] for v in outputs}  # a gradient may be a view (permute of mm)
        ks, alias[phase] = kernels(nodes, s.inputs, kind, s.nbytes, s.dtype, lowered, given, storage_outputs,
                                   rules, s.block)
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


def elements(s: Schedule) -> tuple[int, ...]:
    """Elements of each node's value, from the bytes of the storage it lives in (a view counts
    its base's; 0 where unknown: graph inputs)."""
    dt = s.dtype or ("",) * s.n
    return tuple(s.nbytes[s.root[v]] // itemsize(dt[s.root[v]]) for v in range(s.n))


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
