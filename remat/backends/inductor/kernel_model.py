"""The Inductor step model: the simulator's view of a step that Inductor compiled, replayed
kernel by kernel (``remat.backends.inductor.fusion`` decides which values are stored and how kernels
allocate them). Pure: no torch import."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...core.peak import Offload, Schedule, Step, ancestors
from .facts import FusionGraph, Kind, NodeLowering, check_facts, itemsize
from .fusion import FusionRules, kernels, lower

__all__ = ["KernelModel", "kernel_steps", "early_order", "elements", "stored_bytes"]

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
    compiled = True

    def steps(self, s: Schedule, saved: set[int], fwd: list[int], bwd: list[int], offload: Offload | None = None):
        check_facts(self.facts, s.n)
        return kernel_steps(s, saved, fwd, bwd, self, offload)

    def in_floor(self, s: Schedule, v: int) -> bool:
        check_facts(self.facts, s.n)
        return self.facts[v].kind is Kind.EXTERN

    def graph(self, s: Schedule, order: Iterable[int], given: Iterable[int], outputs: Iterable[int],
              numel: tuple[int, ...] | None = None, backward: bool = False) -> FusionGraph:
        """One graph of the step (``order``: its nodes in execution order; ``backward``: the
        backward's) as ``fusion`` lowers it."""
        outputs, given = frozenset(outputs), frozenset(given)
        nbytes = stored_bytes(s.nbytes, self.facts, given, backward)
        return FusionGraph(tuple(order), s.inputs, self.facts, nbytes, given,
                           outputs, frozenset(s.root[v] for v in outputs),  # a gradient may be a view (permute of mm)
                           elements(s, self.facts) if numel is None else numel, frozenset(s.tangent))


def kernel_steps(s: Schedule, saved: set[int], fwd: list[int], bwd: list[int], model: KernelModel,
                 offload: Offload | None = None):
    """One step per Inductor kernel of the forward and of the backward under ``model.rules``,
    with ``offload``'s copies (Note [Offloaded values in Inductor's kernels])."""
    pre = set(s.graph_input)
    c = _copies(s, model, offload, bwd) if offload is not None and offload.moves else None
    moved = set(c.to_host) if c else set()
    steps: list[Step] = []
    nbytes: dict[_Key, int] = {}
    bwd_given = (saved - moved) | (set(c.to_host.values()) if c else set()) | pre | set(s.tangent)
    bwd_side = set(bwd) | set(s.tangent) | (set(c.to_device.values()) if c else set())
    alias: list[dict[int, int]] = [{}, {}]  # per phase: node -> the storage it lives in

    def storage(u: int, phase: int) -> _Key:
        r = c.root(s, u, phase) if c else s.root[u]
        if phase and r in bwd_side:
            return (alias[1].get(r, r), 1)
        return (alias[0].get(r, r), 0)

    numel = elements(s, model.facts)
    ops = (list(fwd), list(bwd))
    fwd = early_order(s, fwd, ancestors(s, set(s.fwd_outputs), pre | set(s.tangent)))
    fwd, bwd = at_readers(s, fwd, model.facts), at_readers(s, bwd, model.facts)
    if c:
        fwd, bwd = c.placed(s, fwd, bwd, offload, *ops)
        numel = numel + tuple(numel[v] for v in sorted(moved) for _ in range(3))
    fwd_outputs = (set(s.fwd_outputs) | saved) - moved | (set(c.ready.values()) if c else set())
    graphs = ((0, fwd, pre, fwd_outputs), (1, bwd, bwd_given, set(s.bwd_outputs)))
    names = c.names if c else s.names
    boundary = 0
    for phase, nodes, given, outputs in graphs:
        g = (c.graph(s, phase, nodes, given, outputs, numel) if c
             else model.graph(s, nodes, given, outputs, numel, phase == 1))

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
                    nbytes[key(a)] = g.nbytes[a]
            steps.append(Step(f"{where}:{names[k.node] if names else k.node}",
                               tuple(key(a) for a in k.allocs if a not in pre),
                               frozenset(key(u) for u in k.reads if u not in pre),
                               (sum(s.workspace[v] for v in k.nodes if v < s.n) if s.workspace else 0) + k.held))
    return steps, boundary, nbytes, storage


# Note [Offloaded values in Inductor's kernels]
# The offload pass (Note [Offload copies] in ``remat.capture.offload_pass``) adds fallback
# kernels per offloaded value ``v``, which the step model replays as three extra nodes (ids
# from ``Schedule.n`` on), extern kernels all: ``to_host`` reads ``v`` and writes its host copy
# (device bytes only where the host is the device), placed after ``v``'s last forward reader;
# the forward's ``ready`` reads the host copy and ``v`` and allocates nothing, placed after the
# op the plan releases ``v`` after (``Moved.released_after``): ``v``'s buffer lives until then,
# and only then may a later buffer take it; the forward returns it, the host copy's storage, in
# ``v``'s place. ``to_device`` reads the host copy and allocates ``v``'s bytes again, placed
# before the backward op the plan reloads it at (no later than ``v``'s first backward reader);
# the backward reads it in ``v``'s place, views of ``v`` included. The backward's ``ready``
# returns its input, an alias that allocates nothing, and is not modelled (its fallback call
# also ends a C++ kernel group, which the model ignores).


# Note [Released after, in kernel order]
# An offloaded value's forward ``ready`` goes right after the op the plan releases it after
# (``Moved.released_after``, a position in the plan's op order), where the offload pass puts it in
# the forward graph, and Inductor runs the fallback there. The step model runs some ops earlier
# than the graph lists them (``early_order``: a value only the backward reads is computed in the
# kernel of what it reads), so the ready is placed after every op up to the release op in the
# plan's order, wherever the model runs them, not after the release op's own early slot. The
# forward's last op, where a copy out the forward cannot hide is waited for, is often such a
# value (ResNet-50's last ReLU mask, saved for the backward): placed after its early slot, every
# device copy held to the forward's end was freed near its start (fake H100, budget 0.3: 37
# values, 3.3 GiB, simulated at 1,445 MiB, read at 4,335).


@dataclass(frozen=True)
class _Copies:
    """The offload copies as extra nodes of the step model (Note [Offloaded values in
    Inductor's kernels]): per offloaded value, its ``to_host``, forward ``ready`` and
    ``to_device`` node ids, and the step's arrays extended with them."""

    to_host: dict[int, int]
    ready: dict[int, int]
    to_device: dict[int, int]
    inputs: tuple[tuple[Sequence[int], ...], tuple[Sequence[int], ...]]
    """Per phase (forward, backward): each node's operands; the backward reads ``to_device`` in
    an offloaded value's place."""
    facts: tuple[NodeLowering, ...]
    nbytes: tuple[int, ...]
    names: tuple[str, ...]

    def root(self, s: Schedule, u: int, phase: int) -> int:
        """The node owning ``u``'s storage in ``phase``: an offloaded value's host copy in the
        forward's (what the forward returns), its copy back in the backward's."""
        if u >= s.n:
            k = (u - s.n) // 3
            return s.n + 3 * k if (u - s.n) % 3 == 1 else u  # a ready: its host copy
        r = s.root[u]
        if phase == 0:
            return self.to_host.get(r, r)
        return self.to_device.get(r, r)

    def graph(self, s: Schedule, phase: int, order: list[int], given: Iterable[int], outputs: Iterable[int],
              numel: tuple[int, ...]) -> FusionGraph:
        """One graph of the step with the copies, as ``KernelModel.graph`` builds it without."""
        outputs, given = frozenset(outputs), frozenset(given)
        return FusionGraph(tuple(order), self.inputs[phase], self.facts,
                           stored_bytes(self.nbytes, self.facts, given, phase == 1),
                           given, outputs, frozenset(self.root(s, v, phase) for v in outputs), numel,
                           frozenset(s.tangent))

    def placed(self, s: Schedule, fwd: list[int], bwd: list[int], offload: Offload, ops_fwd: list[int],
               ops_bwd: list[int]) -> tuple[list[int], list[int]]:
        """``fwd`` and ``bwd`` with the copies placed. ``ops_fwd`` / ``ops_bwd``: the ops
        ``offload``'s positions count."""
        fwd, bwd = list(fwd), list(bwd)
        last_reader: dict[int, int] = {}  # storage -> the last forward node that is it or reads it
        for w in fwd:
            last_reader[w] = w
            for u in s.inputs[w]:
                last_reader[s.root[u]] = w
        first_reader: dict[int, int] = {}  # storage -> the first backward node reading it
        for w in bwd:
            for u in s.inputs[w]:
                first_reader.setdefault(s.root[u], w)
        # The release op as the graph places it (Note [Released after, in kernel order]): the last
        # node of ``fwd`` among the ops up to it in the plan's order.
        where = {w: k for k, w in enumerate(fwd)}
        through: list[int] = []  # per op position p: the node of ops_fwd[:p + 1] that fwd runs last
        for w in ops_fwd:
            through.append(w if not through or where[w] > where[through[-1]] else through[-1])
        for v, m in sorted(offload.moves.items()):  # a copy never reads a value: the readers stay the step's nodes
            last = fwd.index(last_reader[v])
            fwd.insert(last + 1, self.to_host[v])
            anchor = fwd.index(through[min(m.released_after, len(through) - 1)])
            fwd.insert(max(anchor, last + 1) + 1, self.ready[v])
            first = bwd.index(first_reader[v]) if v in first_reader else len(bwd)
            p = m.reloaded_at - len(ops_fwd)
            bwd.insert(min(bwd.index(ops_bwd[p]) if 0 <= p < len(ops_bwd) else first, first), self.to_device[v])
        return fwd, bwd


def _copies(s: Schedule, model: KernelModel, offload: Offload, bwd: list[int]) -> _Copies:
    """The copies of ``offload``'s values as extra nodes, after the step's ``s.n``."""
    moved = sorted(offload.moves)
    to_host = {v: s.n + 3 * k for k, v in enumerate(moved)}
    ready = {v: s.n + 3 * k + 1 for k, v in enumerate(moved)}
    to_device = {v: s.n + 3 * k + 2 for k, v in enumerate(moved)}
    fwd_inputs: list[Sequence[int]] = list(s.inputs)
    bwd_inputs: list[Sequence[int]] = list(s.inputs)
    for w in bwd:
        if any(s.root[u] in to_device for u in s.inputs[w]):
            bwd_inputs[w] = tuple(to_device.get(u, u) for u in s.inputs[w])
    facts, nbytes = list(model.facts), list(s.nbytes)
    names = list(s.names or map(str, range(s.n)))
    for v in moved:
        for inputs in (fwd_inputs, bwd_inputs):
            inputs += [(v,), (to_host[v], v), (to_host[v],)]
        facts += [NodeLowering(Kind.EXTERN, dtype=model.facts[v].dtype, own_buffer=True)] * 3
        nbytes += [s.nbytes[v] if offload.host_is_device else 0, 0, s.nbytes[v]]
        names += [f"to_host({names[v]})", f"ready({names[v]})", f"to_device({names[v]})"]
    return _Copies(to_host, ready, to_device, (tuple(fwd_inputs), tuple(bwd_inputs)), tuple(facts), tuple(nbytes),
                   tuple(names))


def stored_bytes(nbytes: Sequence[int], facts: Sequence[NodeLowering], given: frozenset[int],
                 backward: bool) -> tuple[int, ...]:
    """The bytes of each node's buffer as Inductor allocates it in one graph (``given``: its
    inputs; ``backward``: the backward's): a padded buffer's padded size, and for a view of one
    that the graph copies for an extern kernel, the copy's (Note [Padded strides] in
    ``remat.backends.inductor.padding``); an input's are the graph that made it's. The fusion
    model takes a value to be padded where its bytes are its padded bytes."""
    def one(v: int, f: NodeLowering, b: int) -> int:
        if v in given:
            return f.padded_nbytes or b
        if f.padded_nbytes and not (backward and f.unpadded_in_backward):
            return f.padded_nbytes
        return f.copy_nbytes or b

    return tuple(one(v, f, b) for v, (f, b) in enumerate(zip(facts, nbytes)))


def elements(s: Schedule, facts: tuple[NodeLowering, ...]) -> tuple[int, ...]:
    """Elements of each node's value, from the bytes of the storage it lives in (a view counts
    its base's; 0 where unknown: graph inputs)."""
    return tuple(s.nbytes[s.root[v]] // itemsize(facts[s.root[v]].dtype) for v in range(s.n))


def at_readers(s: Schedule, nodes: list[int], facts: Sequence[NodeLowering]) -> list[int]:
    """``nodes`` with each matmul Inductor fuses into the add reading it (``NodeLowering.at_reader``)
    moved to just before that add (Note [Matmuls fused into the add that reads them];
    ``versions.HOOKS["addmm_fusion"]``)."""
    moved = {v for v in nodes if v < len(facts) and facts[v].at_reader}
    if not moved:
        return nodes
    reader: dict[int, int] = {}
    for w in nodes:
        for u in s.inputs[w]:
            if u in moved:
                reader.setdefault(u, w)
    before: dict[int, list[int]] = {}
    for v in moved:
        if v in reader:
            before.setdefault(reader[v], []).append(v)
    out: list[int] = []
    for w in nodes:
        if w in reader:
            continue
        out += before.get(w, [])
        out.append(w)
    return out


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
