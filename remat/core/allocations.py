"""The peak of a compiled step, replayed from the allocations its compiled graphs make. Pure
Python: no torch import.

A compiler that plans its own memory (Inductor: ``remat.backends.inductor.wrapper_reading``) knows every
buffer the forward and the backward allocate, which buffer a later one reuses, and where each
is freed. ``GraphTrace`` is that sequence for one compiled graph; ``step_peak`` replays the
forward and then the backward of one training step, as they run:

1. Forward: graph inputs (parameters, the caller's inputs) exist before the step and are not
   counted. Everything the forward returns (its outputs and the tensors saved for the backward)
   is alive when it ends.
2. Boundary: the output gradients (tangents) are allocated; the caller keeps the forward's own
   outputs, and autograd the tangents, to the end of the backward.
3. Backward: starts with the saved tensors, outputs and tangents alive. A saved tensor's storage
   is freed when the backward frees the last input that holds it (autograd has released its
   references before the call); gradients (the backward's outputs) stay.

An extern kernel's scratch (``Event.scratch``: cuBLAS-free attention workspaces and the like,
which the compiler does not allocate itself) counts while that kernel runs. Storages are
tracked by identity: a reused buffer, an in-place output and a saved tensor returned under two
names count once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["Event", "GraphTrace", "StepPeak", "Reading", "replay", "step_peak", "read_step"]


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a compiled graph's memory plan.

    ``alloc``: ``name`` gets a new storage of ``nbytes``. ``reuse``: ``name`` takes the storage of
    ``other`` (which keeps it too unless ``drop`` is set). ``free``: the name ``name`` is
    dropped; its storage is freed once no name holds it. ``call``: a kernel runs, holding
    ``nbytes`` of scratch while it runs (``label`` names it)."""

    kind: str
    name: str = ""
    nbytes: int = 0
    other: str = ""
    drop: bool = True
    label: str = ""


@dataclass(frozen=True)
class GraphTrace:
    """One compiled graph's allocation sequence, with what it knows of its inputs and outputs."""

    events: tuple[Event, ...]
    inputs: tuple[tuple[str, int], ...]
    """Each tensor input's name and the bytes of its storage, in order."""
    outputs: tuple[str | None, ...]
    """For each output (in order), the buffer or input name holding its storage (None: not a
    tensor)."""
    unknown: tuple[str, ...] = ()
    """Kinds of lines the reader did not understand (any is a reason to distrust the trace)."""


@dataclass(frozen=True)
class StepPeak:
    peak_bytes: int
    """Largest live bytes at any point of the step (forward or backward)."""
    forward_peak_bytes: int
    boundary_bytes: int
    """Live bytes when the backward starts: what the forward returns (outputs and saved tensors,
    each storage once) plus the tangents."""
    at: str = ""
    """Where the peak occurs (``forward:<event>`` or ``backward:<event>``)."""
    notes: tuple[str, ...] = field(default=())


@dataclass
class _State:
    """Live storages (key -> bytes), the names that hold each, and storages kept to the end."""

    sizes: dict[object, int] = field(default_factory=dict)
    names: dict[str, object] = field(default_factory=dict)
    pinned: set[object] = field(default_factory=set)
    live: int = 0
    refs: dict[object, int] = field(default_factory=dict)

    def bind(self, name: str, key: object) -> None:
        old = self.names.get(name)
        if old is not None:
            self.unbind(name)
        self.names[name] = key
        self.refs[key] = self.refs.get(key, 0) + 1

    def unbind(self, name: str) -> None:
        key = self.names.pop(name, None)
        if key is None:
            return
        self.refs[key] -= 1
        if not self.refs[key] and key not in self.pinned:
            self.live -= self.sizes.pop(key, 0)

    def new(self, key: object, nbytes: int) -> None:
        self.sizes[key] = nbytes
        self.live += nbytes


def replay(events: Iterable[Event], st: _State, where: str) -> tuple[int, str]:
    """Replay ``events`` on ``st`` (mutated); returns the peak live bytes seen and where."""
    peak, at = st.live, f"{where}:start"
    for e in events:
        here = st.live
        if e.kind == "alloc":
            key = (where, e.name)
            st.new(key, e.nbytes)
            st.bind(e.name, key)
            here = st.live
        elif e.kind == "reuse":
            key = st.names.get(e.other)
            if key is None:  # reusing a buffer the reader never saw allocated: a new one
                key = (where, e.name)
                st.new(key, e.nbytes)
            st.bind(e.name, key)
            if e.drop and e.other != e.name:
                st.unbind(e.other)
            here = st.live
        elif e.kind == "free":
            st.unbind(e.name)
        elif e.kind == "call":
            here = st.live + e.nbytes
        if here > peak:
            peak, at = here, f"{where}:{e.label or e.name}"
    return peak, at


def step_peak(fw: GraphTrace, bw: GraphTrace, fw_output_names: Sequence[str | None],
              bw_input_names: Sequence[str], caller_keeps_outputs: bool = True) -> StepPeak:
    """The peak of one step that runs the compiled forward ``fw`` and then the compiled backward
    ``bw``. ``fw_output_names``: the fx name of each forward output (saved tensors keep their
    name as the backward's inputs); ``bw_input_names``: the backward's inputs, in order (the
    same order as ``bw.inputs``). ``loss_in_graph``: see Note [What the caller holds].

    Note [What the caller holds]
    Two callers, two lifetimes, measured with the CPU profiler (``versions.HOOKS["caller_lifetimes"]``):
    * ``out = model(x); loss_fn(out).backward()`` or ``out.backward(grad)``: the caller holds
      ``out`` through the backward, and the gradient it passes in (its own tensor) too.
    * ``model(ids, labels=ids).loss.backward()`` (the loss computed inside the graph, as HF
      models do): the other outputs (logits, key/value caches) are dropped before the backward,
      and their gradients, which autograd fills with zeros, die when the backward frees them
      (AOTAutograd hands them over without keeping a reference).
    ``caller_keeps_outputs`` selects the first. Which one a step follows is known only from the
    graphs: ``Reading.peak_bytes`` takes the second when some graph of the step computes the
    loss (returns a scalar whose gradient flows back), as HF models and the benchmarks' loss
    functions do. A graph Dynamo ended at a graph break hands its outputs to the next graph,
    which keeps only what it saves, wherever the loss is: ``RematBackend`` reads it as the
    second caller, also before the next graph is compiled (``remat.capture``)."""
    st = _State()
    for name, _ in fw.inputs:  # exist before the step: not counted
        st.bind(name, ("input", name))
    fw_peak, fw_at = replay(fw.events, st, "forward")
    by_fx: dict[str, object] = {}
    for fx_name, buf in zip(fw_output_names, fw.outputs):
        if fx_name is not None and buf is not None and buf in st.names:
            by_fx[fx_name] = st.names[buf]
    bw_inputs = dict(bw.inputs)
    # What the forward returns and the backward does not take are the caller's outputs: kept
    # (also when a saved tensor shares the storage).
    taken, given = Counter(bw_input_names), Counter(n for n in fw_output_names if n is not None)
    pinned = set() if not caller_keeps_outputs else {k for n, k in by_fx.items() if given[n] > taken[n]}
    # The storages the backward takes or the caller keeps, each once (the forward's other
    # buffers died when it returned; inputs cost nothing).
    bst = _State(pinned=set(pinned))
    kept = {by_fx[n] for n in bw_input_names if n in by_fx} | pinned
    for k, nbytes in st.sizes.items():
        if k in kept:
            bst.new(k, nbytes)
    notes = []
    for name in bw_input_names:
        if name in by_fx:
            bst.bind(name, by_fx[name])
        elif name in bw_inputs:  # a tangent (an output's gradient): allocated at the boundary, kept
            key = ("tangent", name)
            bst.new(key, bw_inputs[name])
            if caller_keeps_outputs:
                bst.pinned.add(key)
            bst.bind(name, key)
    boundary = bst.live
    bw_peak, bw_at = replay(bw.events, bst, "backward")
    if fw.unknown or bw.unknown:
        notes.append("unread lines: " + ", ".join(sorted(set(fw.unknown) | set(bw.unknown))))
    if fw_peak >= bw_peak:
        return StepPeak(fw_peak, fw_peak, boundary, fw_at, tuple(notes))
    return StepPeak(bw_peak, fw_peak, boundary, bw_at, tuple(notes))


@dataclass(frozen=True)
class Reading:
    """One graph's step peak under both callers of Note [What the caller holds]."""

    kept: StepPeak
    """The caller holds the outputs (and the gradients it passes) through the backward."""
    dropped: StepPeak
    """The caller keeps only the loss."""
    loss_in_graph: bool
    """The graph returns a scalar whose gradient flows back (it computes the loss)."""

    def peak(self, loss_in_step: bool) -> StepPeak:
        """The peak of this graph in a step that computes its loss in some graph (``dropped``) or
        outside all of them (``kept``)."""
        return self.dropped if loss_in_step else self.kept


def read_step(fw: GraphTrace, bw: GraphTrace, fw_output_names: Sequence[str | None],
              bw_input_names: Sequence[str], scalar_inputs: Iterable[str] = ()) -> Reading:
    """``step_peak`` under both callers; ``scalar_inputs``: the backward's 0-dim inputs (a
    scalar output gradient not among the forward's outputs means the graph computes the loss)."""
    outs = set(fw_output_names)
    loss = any(n not in outs for n in scalar_inputs)
    return Reading(step_peak(fw, bw, fw_output_names, bw_input_names, True),
                   step_peak(fw, bw, fw_output_names, bw_input_names, False), loss)
