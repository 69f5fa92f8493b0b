"""Peak activation memory of one training step under a plan. Pure Python: no torch import.

The step is simulated on the joint graph, value by value, the way the partitioned modules run:

1. Forward: every op a forward output or a saved value depends on, in graph order. A value is
   freed after its last forward use unless it is saved or a forward output.
2. Boundary: forward outputs stay alive to the end of the step (the caller holds them while it
   computes the loss and runs the backward); the incoming output gradients (tangents) are
   allocated and live to the end of the backward (the caller passed them). When the graph
   computes the loss itself (``Schedule.caller_keeps_outputs`` is False), the other outputs
   die at the boundary and the zero-filled output gradients after their last use (Note [What
   the caller holds] in ``remat.core.allocations``).
3. Backward: the backward ops in graph order; each op the backward computes from saved values
   alone (a recomputed forward op, an activation's derivative) is placed just before its first
   use. A value is freed after its last backward use; gradients (backward outputs) stay.

Views own no storage: a storage lives until the last use of any view of it. Graph inputs
(parameters and the caller's inputs) exist before the step and are not counted. The peak is the
largest sum of live storage bytes after any op.

That is how the uncompiled backend runs (``Schedule.model`` is ``OP_BY_OP``): exact, measured to
the byte. Under Inductor (``remat.backends.inductor.kernel_model``) the same step is replayed kernel by
kernel instead: ``remat.backends.inductor.fusion`` lowers the forward and the backward the way Inductor does, so only
stored values take memory, a value an inlined expression reads lives until the last kernel that
recomputes it, fused kernels allocate their buffers together, and buffers are written in place or
reused; ops only the backward needs are computed in the forward right after their inputs
(``early_order``), and extern kernels add their scratch (``Schedule.workspace``) while they run.

``floor_bytes`` bounds every plan's peak from below (what must coexist whatever is saved).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from .reach import reachable

__all__ = ["Schedule", "PeakResult", "Step", "StepModel", "OpByOp", "OP_BY_OP", "Moved", "Offload", "simulate",
           "floor_bytes", "backward_order", "lazy_order", "ancestors", "op_order"]

T = TypeVar("T")


@dataclass(frozen=True)
class Schedule:
    """The joint graph for simulation. Nodes ``0..n-1`` in graph order.

    inputs: node ids each node reads. nbytes: storage bytes a node allocates (0 for views,
    inputs and non-tensors). root: the node owning a node's storage (itself unless a view).
    graph_input / tangent / backward: placeholders that exist before the step; output gradient
    placeholders; nodes that depend on a tangent. fwd_outputs / bwd_outputs: node ids returned
    by the forward and the backward. names: for reports.
    """

    inputs: tuple[tuple[int, ...], ...]
    nbytes: tuple[int, ...]
    root: tuple[int, ...]
    graph_input: frozenset[int]
    tangent: frozenset[int]
    backward: frozenset[int]
    fwd_outputs: tuple[int, ...]
    bwd_outputs: tuple[int, ...]
    names: tuple[str, ...] = ()
    workspace: tuple[int, ...] = ()
    """Scratch bytes each node holds while it runs, beyond its output (``Backend.workspace``:
    ATen kernels' scratch and, op by op, the outputs of a multi-output op that nothing reads)."""
    kernel: tuple[int, ...] = ()
    """The eager kernel each node's op was decomposed from (-1: its own op), for eager
    autograd's schedule: op by op, consecutive nodes of one kernel run as one step, and only its
    results take memory (``remat.analysis.joint_graph``, Note [Eager kernels])."""
    replay_state: tuple[int, ...] = ()
    """Bytes of the generator state a random op saves in the forward where the backward
    recomputes it by replaying that state (Note [Replayed random ops] in
    ``remat.capture.rng_replay``), in the device's memory (a CPU's); 0 for other nodes. Op by op
    it lives from the op's forward step to its last recompute."""
    replay_of: tuple[int, ...] = ()
    """The node whose generator state each node replays when the backward computes it: itself
    for a replayable random op, its original for a nested plan's copy of one; -1 otherwise."""
    caller_keeps_outputs: bool = True
    """Whether the caller holds the forward's outputs, and the output gradients it passes in,
    through the backward; False when the graph computes the loss (a scalar output gradient):
    the other outputs die at the boundary and their gradients when the backward is done with
    them (Note [What the caller holds] in ``remat.core.allocations``)."""
    model: StepModel | None = None
    """How the backend runs the step: ``None`` (or ``OP_BY_OP``), op by op as the uncompiled
    backend does; otherwise the backend's own model (``Backend.step_model``), which carries
    whatever facts of its lowering it reads, such as Inductor's kernels
    (``remat.backends.inductor.kernel_model``)."""

    @property
    def n(self) -> int:
        return len(self.inputs)


@dataclass(frozen=True)
class PeakResult:
    peak_bytes: int
    """Largest live activation bytes at any point of the step."""
    at: str
    """The op after which the peak occurs (``"forward:<name>"`` or ``"backward:<name>"``)."""
    boundary_bytes: int
    """Live bytes at the forward/backward boundary (saved values and outputs)."""
    forward_peak_bytes: int = 0
    """Largest live bytes during the forward."""


def ancestors(s: Schedule, seeds: set[int], stop: set[int]) -> set[int]:
    """``seeds`` and every node they read, transitively, without entering ``stop``."""
    return reachable(seeds, lambda v: [u for u in s.inputs[v] if u not in stop])


def lazy_order(anchors: Iterable[T], inputs: Callable[[T], Sequence[T]], movable: Callable[[T], bool]) -> list[T]:
    """``anchors`` in their order, each preceded by those of its inputs (recursively) that are
    ``movable`` and not yet placed: every movable op lands just before its first use. Shared by
    the simulator and by the backward module's ordering (``partition.place_recompute``)."""
    emitted: set[T] = set()
    order: list[T] = []
    for a in anchors:
        stack = [(a, False)]
        while stack:
            x, ready = stack.pop()
            if x in emitted:
                continue
            if ready:
                emitted.add(x)
                order.append(x)
                continue
            stack.append((x, True))
            stack.extend((u, False) for u in reversed(inputs(x)) if u not in emitted and movable(u))
    return order


def backward_order(s: Schedule, saved: set[int]) -> list[int]:
    """Backward ops in execution order: tangent-dependent ops in graph order, each op computed
    from saved values alone placed just before its first use."""
    available = set(saved) | set(s.graph_input) | set(s.tangent)
    anchors = [v for v in range(s.n) if v in s.backward and v not in s.tangent]
    anchors += [v for v in s.bwd_outputs if v not in available]
    return lazy_order(anchors, lambda v: s.inputs[v], lambda u: u not in available)


def op_order(s: Schedule, saved: set[int]) -> tuple[list[int], list[int]]:
    """The forward's ops and the backward's ops (tangents aside) in the order the step runs them."""
    pre = set(s.graph_input)
    fwd = sorted(ancestors(s, set(s.fwd_outputs) | set(saved), pre | set(s.tangent)) - pre)
    return fwd, backward_order(s, saved)


@dataclass(frozen=True, slots=True)
class Moved:
    """One offloaded saved value's copies on the step's ops, as positions in ``op_order``'s
    forward then backward ops (Note [Offload timeline] in ``remat.core.offload``)."""

    issued_after: int
    """The forward op after which its copy out is issued (its last forward use): its host copy
    exists from there."""
    released_after: int
    """The op after which its device copy is freed: ``issued_after`` op by op (the allocator holds
    the block until the copy ends), the op the copy out is estimated to end in under a compiled
    step, which holds the buffer itself until then (``StepModel.compiled``)."""
    reloaded_at: int
    """The backward op before which its copy back is allocated."""


@dataclass(frozen=True)
class Offload:
    """Saved values kept in host memory between the halves (``offload=``), for ``simulate``."""

    moves: Mapping[int, Moved]
    """Each offloaded value (a node id that owns its storage) and its copies."""
    host_is_device: bool = False
    """The host copies take the device's own memory (a CPU, whose memory is the host's): they
    count, from their copy out to their copy back; otherwise they take none of it."""


def simulate(s: Schedule, saved: set[int], offload: Offload | None = None) -> PeakResult:
    """Peak live bytes of a step that saves ``saved`` (node ids) for the backward: op by op
    (``s.model`` is ``OP_BY_OP``, the uncompiled backend) or kernel by kernel as Inductor lowers the
    two graphs (``remat.backends.inductor``). ``offload``: saved values kept in host memory between
    the halves, each with where its copies run (``Moved``); the step model replays them."""
    fwd, bwd = op_order(s, saved)
    steps, boundary, nbytes, storage = (s.model or OP_BY_OP).steps(s, set(saved), fwd, bwd, offload)
    return _replay(steps, boundary, nbytes, last_uses(s, saved, steps, boundary, storage))


def last_uses(s: Schedule, saved: set[int], steps: list[Step], boundary: int,
              storage: Callable[[int, int], _Key]) -> dict[_Key, int]:
    """The step after which each storage the steps read or pin is freed: its last read, or for
    pinned ones the end (what the caller keeps, the gradients), at least the boundary (saved
    values; an offloaded value's storage in the forward's phase is its host copy) or at least
    the forward's last step (outputs the caller drops: gone before the backward's first step
    allocates the output gradients)."""
    keep = s.caller_keeps_outputs
    pin_end = {storage(v, 0) for v in s.fwd_outputs} if keep else set()
    pin_end |= {storage(v, 1) for v in (*s.bwd_outputs, *(s.tangent if keep else ()))}
    pin_boundary = {storage(v, 0) for v in saved}
    pin_forward = set() if keep else {storage(v, 0) for v in s.fwd_outputs} - pin_boundary
    last_use: dict[_Key, int] = {}
    for t, st in enumerate(steps):
        for k in st.reads:
            last_use[k] = t
    for k in pin_end:
        last_use[k] = len(steps)
    for k in pin_boundary:
        last_use[k] = max(last_use.get(k, 0), boundary)
    for k in pin_forward:
        last_use[k] = max(last_use.get(k, 0), boundary - 1)
    return last_use


def _offloaded(steps: list[Step], storage: Callable[[int, int], _Key], offload: Offload, n_fwd: int,
               n_tangents: int, nbytes: dict[_Key, int]) -> tuple[list[Step], Callable[[int, int], _Key]]:
    """Op by op, ``steps`` with each offloaded value's device copy read (kept) up to the op it is
    released after, a host copy from its copy out to its copy back (bytes where the host is the
    device), and a new storage for its copy back, allocated at the op its copy in starts and read
    by the backward in its place; and the storage function that gives the host copy for the
    value's forward phase."""
    def at(p: int) -> int:  # a position among the ops -> the step index (tangents come between)
        return p if p < n_fwd else p + n_tangents

    steps = list(steps)
    host: dict[int, _Key] = {}
    for v, m in offload.moves.items():
        out, back, host[v] = (v, 0), (v, 2), (v, 3)
        nbytes[back] = nbytes.get(out, 0)
        nbytes[host[v]] = nbytes.get(out, 0) if offload.host_is_device else 0
        for t in range(n_fwd + n_tangents, len(steps)):
            if out in steps[t].reads:
                steps[t] = replace(steps[t], reads=(steps[t].reads - {out}) | {back})
        k = at(m.issued_after)
        steps[k] = replace(steps[k], allocs=(*steps[k].allocs, host[v]))
        k = at(m.released_after)
        steps[k] = replace(steps[k], reads=steps[k].reads | {out})
        k = at(m.reloaded_at)
        steps[k] = replace(steps[k], allocs=(*steps[k].allocs, back), reads=steps[k].reads | {host[v]})

    def moved_storage(u: int, phase: int) -> _Key:
        return host[u] if phase == 0 and u in host else storage(u, phase)

    return steps, moved_storage


def floor_bytes(s: Schedule) -> int:
    """A lower bound on the peak of every plan for this graph: what must coexist whatever is
    saved or recomputed. Every plan runs the same backward ops in the same order (recompute
    only adds forward ops), the forward outputs and the output gradients live through the
    whole backward, and a gradient lives from its op to the end of the step. So when a
    backward op runs, its result, its operands, the outputs, the output gradients and the
    gradients made before it are all alive. Op by op (``s.model`` is ``OP_BY_OP``) every backward op
    counts; under Inductor only extern kernels (a matmul reads and writes real buffers) and the
    end of the step, since fused work may keep its operands on chip."""
    pre = set(s.graph_input)
    pinned = {s.root[v] for v in (*s.fwd_outputs, *s.tangent)} - pre if s.caller_keeps_outputs else set()
    grads = {s.root[v] for v in s.bwd_outputs} - pre
    done: set[int] = set()
    best = sum(s.nbytes[r] for r in pinned | grads)
    for v in range(s.n):
        if v not in s.backward or v in s.tangent:
            continue
        if (s.model or OP_BY_OP).in_floor(s, v):
            here = {s.root[v]} | {s.root[u] for u in s.inputs[v]}
            best = max(best, sum(s.nbytes[r] for r in (here | pinned | done) - pre))
        if s.root[v] in grads:
            done.add(s.root[v])
    return best


_Key = tuple[int, int]  # (storage-owning node, 0 in the forward or 1 in the backward)


@dataclass(frozen=True)
class Step:
    label: str
    allocs: tuple[_Key, ...]
    reads: frozenset[_Key]
    scratch: int = 0
    """Bytes held only while the step runs."""


class StepModel(Protocol):
    """How a backend runs one step, for the simulator: the backend interface's pure half
    (``remat.backends.base.Backend.step_model``)."""

    compiled: bool
    """Whether the step runs compiled code: ops fused into kernels, buffers allocated and handed
    from a freed one to a later one by the compiler's own plan rather than by the caching
    allocator op by op (Note [Offload in a plan] in ``remat.planning.offload``)."""

    def steps(self, s: Schedule, saved: set[int], fwd: list[int], bwd: list[int], offload: Offload | None = None
              ) -> tuple[list[Step], int, dict[_Key, int], Callable[[int, int], _Key]]:
        """The step as allocation steps: (steps, index of the first backward step, bytes of each
        storage, the storage a node's value lives in per phase; an offloaded value's in the
        forward's phase is its host copy), with ``offload``'s copies."""
        ...

    def in_floor(self, s: Schedule, v: int) -> bool:
        """Whether backward op ``v``'s operands and result must be in memory together
        (``floor_bytes``)."""
        ...


class OpByOp:
    """The uncompiled backend: one step per op, every op's output a tensor; every backward op's
    operands are in memory while it runs, and a library kernel's scratch (``Schedule.workspace``)."""

    name = "simulated: op by op"
    compiled = False

    def steps(self, s: Schedule, saved: set[int], fwd: list[int], bwd: list[int], offload: Offload | None = None):
        steps, boundary, nbytes, storage = _op_steps(s, saved, fwd, bwd)
        if offload is not None and offload.moves:
            if s.kernel:
                raise ValueError("remat: internal error, offload is simulated op by op or by Inductor's kernels, not "
                                 "by eager autograd's kernels; please report")
            steps, storage = _offloaded(steps, storage, offload, len(fwd), len(s.tangent), nbytes)
        return steps, boundary, nbytes, storage

    def in_floor(self, s: Schedule, v: int) -> bool:
        return True


OP_BY_OP = OpByOp()


_STATE = 5
"""The phase of a storage key that is a replayed random op's generator state (``Schedule.replay_state``)."""


def _op_steps(s: Schedule, saved: set[int], fwd: list[int], bwd: list[int]):
    """One step per op; every op's output is a tensor (the uncompiled backend)."""
    pre = set(s.graph_input)
    in_bwd = set(bwd) | set(s.tangent)

    def storage(u: int, phase: int) -> _Key:
        r = s.root[u]
        return (r, 1) if phase and u in in_bwd and r in in_bwd else (r, 0)

    timeline = [(v, 0) for v in fwd] + [(v, 1) for v in sorted(s.tangent)] + [(v, 1) for v in bwd]
    steps, nbytes = [], {}
    boundary, last = len(fwd), None
    replayed = {s.replay_of[v] for v in bwd if s.replay_of and s.replay_of[v] >= 0 and s.replay_state[s.replay_of[v]]}
    for t, (v, phase) in enumerate(timeline):
        own = bool(s.nbytes[v]) and s.root[v] == v and v not in pre
        if own:
            nbytes[(v, phase)] = s.nbytes[v]
        allocs, reads = ((v, phase),) if own else (), frozenset(storage(u, phase) for u in s.inputs[v])
        # a replayed op's generator state: saved by its forward run, read by each recompute
        scratch = s.workspace[v] if s.workspace else 0
        if phase == 0 and v in replayed:
            nbytes[(v, _STATE)] = s.replay_state[v]
            allocs += ((v, _STATE),)
        elif phase == 1 and s.replay_of and s.replay_of[v] in replayed:  # the generator's own state, kept meanwhile
            reads |= {(s.replay_of[v], _STATE)}
            scratch += s.replay_state[s.replay_of[v]]
        where = "forward" if phase == 0 else "backward"
        step = Step(f"{where}:{s.names[v] if s.names else v}", allocs, reads, scratch)
        kernel = (s.kernel[v], phase) if s.kernel and s.kernel[v] >= 0 else None
        if kernel is not None and kernel == last:  # one eager kernel: one step (Note [Eager kernels])
            prev = steps[-1]
            steps[-1] = Step(step.label, prev.allocs + step.allocs, prev.reads | step.reads,
                             max(prev.scratch, step.scratch))
            boundary -= t < len(fwd)
        else:
            steps.append(step)
        last = kernel
    return steps, boundary, nbytes, storage


def _replay(steps: list[Step], boundary: int, nbytes: dict[_Key, int], last_use: dict[_Key, int]) -> PeakResult:
    """Live bytes step by step: a storage is allocated by its step and freed after its last
    use (``last_uses``)."""
    end = len(steps)
    frees: dict[int, int] = {}
    for t, st in enumerate(steps):
        for k in st.allocs:
            f = max(last_use.get(k, t), t)
            frees[f] = frees.get(f, 0) + nbytes.get(k, 0)
    live = peak = at_boundary = fwd_peak = 0
    at = "nothing"
    for t, st in enumerate(steps):
        if t == boundary:
            at_boundary, fwd_peak = live, peak
        live += sum(nbytes.get(k, 0) for k in st.allocs)
        if live + st.scratch > peak:
            peak, at = live + st.scratch, st.label
        live -= frees.get(t, 0)
    if boundary == end:
        at_boundary, fwd_peak = live, peak
    return PeakResult(peak, at, at_boundary, fwd_peak)
