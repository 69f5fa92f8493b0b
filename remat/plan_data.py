"""What a plan says, as plain frozen data: the values of a joint graph (``NodeFacts``,
``SavedTensor``, ``PlanNode``), their ``Role`` and ``Status``, a plan's place on the
memory/recompute trade-off (``Tradeoff``: the one definition of dominance) and the records
``PlanData`` and ``FrontierData`` (the one definition of a plan's identity: ``PlanData.key``).

Why this module and ``remat.plan`` are two: the renderers (``remat.report``) read a plan's fields,
and the public ``remat.plan.Plan`` prints and exports itself through them. With both in one
module, that module and ``remat.report`` would import each other (for annotations, at least).
Here the data imports nothing of remat's but ``units``; ``remat.report`` imports only this
module; ``remat.plan`` imports both and adds the methods that delegate to the renderers
(``Plan(PlanData)``, ``Frontier(FrontierData)``): ``plan_data <- report <- plan``, no circle.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from .units import format_bytes

__all__ = ["Role", "Status", "READ", "MEASURED", "ValueInfo", "NodeFacts", "SavedTensor", "Offloaded", "PlanNode",
           "Tradeoff", "PlanKey", "PlanData", "FrontierData", "RowChunks"]


class _Name(str, Enum):
    """A string enum whose members print, format, hash and compare as their value."""

    def __str__(self) -> str:
        return str.__str__(self)

    __format__ = str.__format__


class Role(_Name):
    """What a value of the joint graph is, before any plan."""

    INPUT = "input"
    """A caller's input (``primals_*`` that is not a parameter)."""
    PARAMETER = "parameter"
    """A parameter or buffer: lives anyway, free to save."""
    FORWARD = "forward"
    """Computed by the forward (a forward output depends on it)."""
    BACKWARD_ONLY = "backward-only"
    """Computable from forward values, needed only by the backward."""


class Status(_Name):
    """What a plan does with a node of the joint graph (``PlanNode.status``)."""

    SAVED = "saved"
    RECOMPUTED = "recomputed"
    """A forward op the backward computes again."""
    FORWARD = "forward"
    """Computed in the forward only."""
    BACKWARD = "backward"
    """Part of the backward."""
    BACKWARD_ONLY = "backward-only"
    """Computed from saved values for the backward, never in the forward."""
    INPUT = "input"
    PARAMETER = "parameter"
    TANGENT = "tangent"


READ = "read: Inductor's memory plan"
"""``Plan.peak_model`` once the peak was read from the compiled graphs."""
_READ_NOTE = "peak read from Inductor's memory plan"
MEASURED = "measured: CUDA allocator on a training step"
"""``Plan.peak_model`` once the step's peak through the graph was measured (Note [Measured
budget peak] in ``remat.capture.budget_guard``)."""
_MEASURED_NOTE = "peak measured by the CUDA allocator"


@dataclass(frozen=True, slots=True)
class ValueInfo:
    """What every report says of one value of the joint graph: the fields ``NodeFacts``,
    ``SavedTensor`` and ``PlanNode`` share (each adds its own, keyword-only)."""

    name: str
    """fx node name in the joint graph."""
    op: str
    """The op that produced it (``aten.mm.default``), ``getitem``, or a role such as ``input``."""
    shape: tuple[int, ...] = ()
    dtype: str = ""
    nbytes: int = 0
    """Bytes of storage it keeps alive (0 for parameters and buffers, which live anyway)."""
    module: str = ""
    """Module path in the user's model, when known."""
    source: str = ""
    """``file:line`` of the user code that produced it, when known."""
    role: Role = field(default=Role.FORWARD, kw_only=True)
    """What the value is before any plan (a parameter: ``op`` prints ``parameter``, but the role
    is what says so)."""

    def info(self) -> ValueInfo:
        """Just the shared fields."""
        return ValueInfo(self.name, self.op, self.shape, self.dtype, self.nbytes, self.module, self.source,
                         role=self.role)


def _shared(v: ValueInfo) -> dict[str, Any]:
    return {f: getattr(v, f) for f in ValueInfo.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class NodeFacts(ValueInfo):
    """One value of the joint graph as graph analysis sees it (``remat.analysis.joint_graph``)."""


@dataclass(frozen=True, slots=True)
class SavedTensor(ValueInfo):
    """One value kept alive from the forward to the backward."""

    reason: str = field(default="", kw_only=True)
    """Why it is saved: ``min-cut boundary`` or the rule that forbids recomputing it."""

    @classmethod
    def of(cls, v: ValueInfo, *, reason: str, **changes: Any) -> SavedTensor:
        return cls(**{**_shared(v), **changes}, reason=reason)


@dataclass(frozen=True, slots=True)
class PlanNode(ValueInfo):
    """One node of the joint graph as the plan sees it (for reports and ``Plan.explain``)."""

    status: Status = field(default=Status.FORWARD, kw_only=True)
    reason: str = field(default="", kw_only=True)
    """The rule that constrained this node (``matmul``, ``user rule `x` ``...) or ``""``."""
    inputs: tuple[str, ...] = field(default=(), kw_only=True)

    @classmethod
    def of(cls, v: ValueInfo, *, status: Status, reason: str, inputs: tuple[str, ...], **changes: Any) -> PlanNode:
        return cls(**{**_shared(v), **changes}, status=status, reason=reason, inputs=inputs)


@dataclass(frozen=True, slots=True)
class Tradeoff:
    """Where a plan sits on the memory/time trade-off: its predicted peak and estimated time
    cost (``PlanData.cost_seconds``: recompute time plus the time of writing and reading what it
    saves). The one definition of dominance between plans."""

    peak_bytes: int
    seconds: float

    def no_worse(self, other: Tradeoff) -> bool:
        """Whether this point is at most ``other``'s on both peak and time cost."""
        return self.peak_bytes <= other.peak_bytes and self.seconds <= other.seconds

    def dominates(self, other: Tradeoff) -> bool:
        """No worse than ``other`` on both, and not the same point."""
        return self.no_worse(other) and self != other


@dataclass(frozen=True, slots=True)
class Offloaded:
    """One saved value kept in host memory between the forward and the backward: copied out
    after its last forward use and back before its first backward use, on side streams
    (``remat.planning.offload``). Times are estimates, in seconds from the step's start."""

    name: str
    nbytes: int
    copy_out: tuple[float, float]
    """When its device-to-host copy runs (start, end); its device memory is freed at the end."""
    copy_in: tuple[float, float]
    """When its host-to-device copy runs (start, end); its device memory is taken at the start."""
    stall_seconds: float = 0.0
    """How long the step is estimated to wait for its copies (0: hidden behind compute): the
    backward for its copy back and, compiled (``released_after``), the forward for its copy out."""
    reload_before: str = ""
    """The backward op its copy back is issued before."""
    released_after: str = ""
    """Compiled (Inductor): the forward op after which the forward waits for its copy out and
    lets its device copy go (Note [Offload copies] in ``remat.capture.offload_pass``). Empty op
    by op: its device copy is dropped when the copy out is issued, the allocator holding the
    block until the copy ends."""
    issue_seconds: float = 0.0
    """The host's time to issue its copies and their waits, measured per device (Note [Copies
    the host issues] in ``remat.core.offload``): in the plan's time cost, never hidden."""


@dataclass(frozen=True, slots=True)
class RowChunks:
    """A region of the joint graph the plan runs one slice of rows at a time (an LM head and its
    loss, say: Note [Row chunks] in ``remat.analysis.rows``)."""

    seed: str
    """The widening matmul the region grew from."""
    rows: int
    chunks: int
    ops: int
    """Ops of the region, each computed once per slice (its copies are named ``<op>_c<k>``)."""
    wide_bytes: int
    """Bytes of the region's wide tensors, no longer alive at once."""

    def describe(self) -> str:
        rows = -(-self.rows // self.chunks)
        return (f"{self.seed}'s region ({self.ops} ops, {format_bytes(self.wide_bytes)} of wide tensors) "
                f"in {self.chunks} slices of {rows} rows")


PlanKey = tuple[tuple[str, ...], tuple[str, ...]]
"""``PlanData.key``: the sorted names of a plan's saved values (an offloaded one's name followed
by ``HOST_MARK``), and its recomputed ops' names."""
HOST_MARK = "@host"
"""Follows an offloaded saved value's name in ``PlanData.key``: the same cut with and without a
value in host memory are two plans (Note [Offload under a budget] in ``remat.planning.offload``)."""


@dataclass(frozen=True)
class PlanData:
    """The decision for one captured graph (or several, combined; see ``combine``), as data:
    ``remat.plan.Plan`` is this record with its reports."""

    saved: tuple[SavedTensor, ...]
    recomputed: tuple[str, ...]
    """Names of forward ops the backward computes again."""
    recomputed_ops: tuple[str, ...] = ()
    """The op of each entry of ``recomputed`` (same order)."""
    eager_saved_bytes: int = 0
    """What eager autograd keeps for the same graph (parameters excluded)."""
    graphs: int = 1
    fallback: str | None = None
    """Set when planning failed and the graph saves what autograd would save instead."""
    notes: tuple[str, ...] = field(default=())
    compiled_for: str = field(default="", compare=False)
    """The inputs its graph was compiled for (parameters left out; sizes as Dynamo traced them,
    symbolic where it made them dynamic): a Dynamo recompile adds a plan, and a step runs the one
    whose inputs it matches. Empty for ``explain``'s plans, which nothing compiled (and not
    compared: explain's plan equals the compiled one)."""
    nodes: tuple[PlanNode, ...] = field(default=(), repr=False)
    """Every node of the joint graph with its status, in graph order (empty for a fallback)."""
    predicted_peak_bytes: int = 0
    """Predicted peak activation memory of one step under this plan, as the chosen backend runs
    it: the best prediction available, named by ``peak_model``. Before compiling, the simulator's
    (``remat.core.peak``): op by op (``"eager"``) or Inductor's kernels as remat models them
    (``"inductor"``); once Inductor has compiled the forward and the backward, the peak read
    from the memory plan it generated (``compiled_peak_bytes``)."""
    peak_model: str = ""
    """What produced ``predicted_peak_bytes``: ``"simulated: op by op"``, ``"simulated: Inductor
    step model"`` or ``"read: Inductor's memory plan"``."""
    simulated_peak_bytes: int = 0
    """The simulator's prediction (``remat.core.peak``), kept when a compiled reading replaces it."""
    compiled_peak_bytes: int = 0
    """The step's peak read from the allocations Inductor planned for the compiled forward and
    backward (``remat.core.allocations``); 0 until both are compiled (AOTAutograd compiles the
    backward at the first backward call unless a budget asks for it at once)."""
    measured_peak_bytes: int = 0
    """Under a budget on CUDA: the allocator's peak from the graph's forward call to the end of
    its backward, less what was allocated at the call, on the training step that measured it
    (Note [Measured budget peak] in ``remat.capture.budget_guard``); it then becomes
    ``predicted_peak_bytes``. 0 where not measured."""
    eager_peak_bytes: int = 0
    """Predicted peak of eager autograd on the same graph: saving what autograd saves,
    recomputing nothing, run uncompiled op by op (whatever the backend). Budget fractions are
    fractions of it."""
    recompute_flops: int = 0
    """Estimated FLOPs of the recomputed ops."""
    recompute_seconds: float = 0.0
    """Estimated time of the recomputed ops on the device model (fused: no memory round trips)."""
    traffic_seconds: float = 0.0
    """Estimated time of writing the saved bytes in the forward and reading them in the backward
    (twice ``saved_bytes`` over the device model's bandwidth): what saving costs in time, as
    ``recompute_seconds`` is what recomputing costs (Note [Default plan: bytes and recompute
    traffic] in ``remat/planning/planner.py``)."""
    budget_bytes: int | None = None
    """The peak budget this plan was chosen under, if any."""
    peak_floor_bytes: int = 0
    """No remat plan for this graph has a smaller *predicted* peak (``remat.core.peak.floor_bytes``):
    in remat's model of the step (the same backward ops, each forward value recomputed at most
    once) the gradients, outputs and output gradients, and each backward op's operands with its
    result, coexist whatever is saved or recomputed. It bounds remat's predictions, not measured
    memory: a differently scheduled or fused backward (torch.compile with checkpointing, say)
    can measure lower."""
    checkpoints: tuple[str, ...] = ()
    """Separator values this plan never recomputes through (checkpoint segments, see
    ``remat.core.segments``); empty for the default plan and the min-cut frontier's plans."""
    nested: tuple[str, ...] = ()
    """A nested plan's inner checkpoints (``remat.planning.nesting``): recomputed from the saved
    ``checkpoints`` when the backward reaches their segment, kept until their own segment's
    backward; empty for other plans."""
    recompute_times: tuple[int, ...] = ()
    """How many times the backward computes each entry of ``recomputed`` (same order): 2 for an
    op a nested plan recomputes in the sweep and again before its segment's backward. Empty when
    every recomputed op runs once."""
    origin: str = ""
    """Where the plan came from: ``"default"``, a budget's candidate (``"hull"``, ``"segments"``,
    ``"nested"``), or ``"torch.compile"`` (torch.compile's own partition of the same graph,
    measured as a candidate: ``remat.tuning``); empty where no choice was made."""
    measured: tuple[tuple[str, float, int], ...] = ()
    """When the plan was chosen by measuring candidates on the first training steps
    (``remat.tuning``): each candidate's name, median seconds of its graph's forward and backward,
    and peak bytes, in the order measured; empty otherwise."""
    chosen_by: str = ""
    """Why this plan runs, when it was measured or taken from the decision cache."""
    offloaded: tuple[Offloaded, ...] = ()
    """The saved values kept in host memory between the halves (``offload=``); each is also in
    ``saved``. Empty unless offload was asked for and found something to move."""
    row_chunks: tuple[RowChunks, ...] = ()
    """The regions this plan's graph runs in slices of rows (``remat.planning.chunking``); empty
    for the graph as captured."""

    def with_compiled_peak(self, peak_bytes: int, where: str = "", caveats: tuple[str, ...] = ()) -> PlanData:
        """This plan with its step's peak read from the compiled graphs (``compiled_peak_bytes``),
        which becomes ``predicted_peak_bytes``; the simulator's stays in ``simulated_peak_bytes``."""
        note = (f"peak read from Inductor's memory plan: {format_bytes(peak_bytes)}" + (f" at {where}" if where else "")
                + "".join(f" ({c})" for c in caveats))
        measured = self.measured_peak_bytes  # a measurement stays the best prediction
        return replace(self, compiled_peak_bytes=peak_bytes, predicted_peak_bytes=measured or peak_bytes,
                       simulated_peak_bytes=self.simulated_peak_bytes or self.predicted_peak_bytes,
                       peak_model=MEASURED if measured else READ,
                       notes=(*[n for n in self.notes if not n.startswith(_READ_NOTE)], note))

    def with_measured_peak(self, peak_bytes: int) -> PlanData:
        """This plan with its step's peak measured on CUDA (``measured_peak_bytes``), which becomes
        ``predicted_peak_bytes``; the simulator's stays in ``simulated_peak_bytes``."""
        before = f"{format_bytes(self.predicted_peak_bytes)} ({self.peak_model})" if self.peak_model else \
            format_bytes(self.predicted_peak_bytes)
        note = f"{_MEASURED_NOTE} on a training step: {format_bytes(peak_bytes)}, predicted {before}"
        return replace(self, measured_peak_bytes=peak_bytes, predicted_peak_bytes=peak_bytes,
                       simulated_peak_bytes=self.simulated_peak_bytes or self.predicted_peak_bytes,
                       peak_model=MEASURED,
                       notes=(*[n for n in self.notes if not n.startswith(_MEASURED_NOTE)], note))

    @property
    def saved_bytes(self) -> int:
        """Bytes kept alive for the backward by this plan (parameters excluded), on the device or
        offloaded to host memory."""
        return sum(s.nbytes for s in self.saved)

    @property
    def host_bytes(self) -> int:
        """Bytes of the saved values kept in host memory (``offloaded``)."""
        return sum(o.nbytes for o in self.offloaded)

    @property
    def device_saved_bytes(self) -> int:
        """Saved bytes held on the device between the halves: ``saved_bytes`` less ``host_bytes``."""
        return self.saved_bytes - self.host_bytes

    @property
    def offload_stall_seconds(self) -> float:
        """How long the step is estimated to wait for offloaded values' copies (``Offloaded.stall_seconds``)."""
        return sum(o.stall_seconds for o in self.offloaded)

    @property
    def offload_issue_seconds(self) -> float:
        """The host's time to issue the offloaded values' copies (``Offloaded.issue_seconds``)."""
        return sum(o.issue_seconds for o in self.offloaded)

    @property
    def key(self) -> PlanKey:
        """What identifies this plan among the plans of one graph, across traces of it: the
        names of its saved values (``HOST_MARK`` after those it offloads) and of the ops it
        recomputes."""
        host = {o.name for o in self.offloaded}
        return tuple(sorted(s.name + HOST_MARK if s.name in host else s.name for s in self.saved)), self.recomputed

    @property
    def cost_seconds(self) -> float:
        """Its estimated time cost: recompute time plus saved traffic (``traffic_seconds``), the
        quantity the default plan's cut minimises and the time axis of the frontier and of a
        budget's choice; with offload, the copies' stall and the host's time to issue them."""
        return (self.recompute_seconds + self.traffic_seconds + self.offload_stall_seconds
                + self.offload_issue_seconds)

    @property
    def tradeoff(self) -> Tradeoff:
        """Its predicted peak and estimated time cost (``Tradeoff``)."""
        return Tradeoff(self.predicted_peak_bytes, self.cost_seconds)

    def recompute_counts(self) -> dict[str, int]:
        """Recomputations counted by op overload, e.g. ``{"aten.mul.Tensor": 4}`` (an op
        recomputed twice counts twice; see ``times``)."""
        counts: Counter[str] = Counter()
        for op, k in zip(self.recomputed_ops, self.times()):
            counts[op] += k
        return dict(sorted(counts.items()))

    def times(self) -> tuple[int, ...]:
        """``recompute_times``, with the 1s filled in: one count per entry of ``recomputed``."""
        return self.recompute_times or (1,) * len(self.recomputed)

    @classmethod
    def combine(cls, plans: list[PlanData]) -> PlanData:
        """One plan for several graphs (graph breaks): names get a ``g<k>.`` prefix.

        The step's predicted peak composes the graphs as the step runs them: the graphs' forwards
        in capture order, then their backwards in reverse, so while graph ``k`` runs (either
        way) the tensors every earlier graph saved are alive. The combined peak is the largest,
        over ``k``, of graph ``k``'s own predicted peak plus the bytes graphs ``0..k-1`` save
        (and the same for eager autograd's peak); a note says so. Activations passed from one
        graph to the next are counted in both graphs' own peaks, not twice across them.

        Each graph's own peak keeps its outputs alive to the end of its backward, as for the
        last graph (the loss) it must; an earlier graph's outputs may die sooner (once the next
        graph has saved what it needs), so the combination can over-predict: measured on CPU,
        two linear+tanh halves split by a graph break, 28.3 MB against 33.5 MB predicted."""
        if len(plans) == 1:
            return plans[0]
        saved, rec, ops, notes, nodes, times, offloaded = [], [], [], [], [], [], []
        for k, p in enumerate(plans):
            saved += [replace(s, name=f"g{k}.{s.name}") for s in p.saved]
            offloaded += [replace(o, name=f"g{k}.{o.name}") for o in p.offloaded]
            rec += [f"g{k}.{r}" for r in p.recomputed]
            ops += list(p.recomputed_ops)
            times += list(p.times())
            notes += [f"g{k}: {n}" for n in p.notes]
            nodes += [replace(n, name=f"g{k}.{n.name}", inputs=tuple(f"g{k}.{u}" for u in n.inputs))
                      for n in p.nodes]
            if p.fallback:
                notes.append(f"g{k}: fell back: {p.fallback}")
        peak = eager_peak = before = eager_before = 0
        for p in plans:
            peak = max(peak, before + p.predicted_peak_bytes)
            eager_peak = max(eager_peak, eager_before + p.eager_peak_bytes)
            before += p.device_saved_bytes
            eager_before += p.eager_saved_bytes
        models = sorted({p.peak_model for p in plans if p.peak_model})
        if all(p.predicted_peak_bytes for p in plans):
            notes.append(f"peak of {len(plans)} graphs: the largest over graphs of its own predicted peak plus "
                         "what the graphs before it save (forwards in order, backwards in reverse)")
        else:
            peak = eager_peak = 0  # a fallback graph has no prediction: the step's is unknown
        return cls(tuple(saved), tuple(rec), tuple(ops), sum(p.eager_saved_bytes for p in plans),
                   graphs=sum(p.graphs for p in plans), notes=tuple(notes), nodes=tuple(nodes),
                   compiled_for="; ".join(f"g{k}: {p.compiled_for}" for k, p in enumerate(plans) if p.compiled_for),
                   recompute_times=tuple(times) if any(t > 1 for t in times) else (),
                   recompute_flops=sum(p.recompute_flops for p in plans),
                   recompute_seconds=sum(p.recompute_seconds for p in plans),
                   traffic_seconds=sum(p.traffic_seconds for p in plans),
                   predicted_peak_bytes=peak, eager_peak_bytes=eager_peak,
                   peak_model=" + ".join(models),
                   simulated_peak_bytes=_combined(plans, "simulated_peak_bytes"),
                   compiled_peak_bytes=_combined(plans, "compiled_peak_bytes"),
                   measured_peak_bytes=_combined(plans, "measured_peak_bytes"),
                   peak_floor_bytes=max(p.peak_floor_bytes for p in plans) if peak else 0,
                   offloaded=tuple(offloaded))


def _combined(plans: list[PlanData], attr: str) -> int:
    """``Plan.combine``'s composition of one peak field (0 unless every graph has it)."""
    peak = before = 0
    for p in plans:
        value = getattr(p, attr)
        if not value:
            return 0
        peak = max(peak, before + value)
        before += p.device_saved_bytes
    return peak



@dataclass(frozen=True)
class FrontierData:
    """The plans no other plan beats on both predicted peak and estimated time cost
    (``PlanData.cost_seconds``), for one graph, sorted from the least time cost to the most (so
    their peaks fall): drawn from
    the default plan, every vertex of the lower convex hull of (saved bytes, recompute seconds),
    and the checkpoint-segment plans (``remat.core.segments``; ``checkpoints`` set). A budget chooses
    among all candidates (``remat.planning.choice.choose``). ``default`` is the plan used without a
    budget, which may itself be dominated; ``eager_peak_bytes`` is autograd's predicted peak.
    ``remat.plan.Frontier`` is this record with its text and plot."""

    points: tuple[PlanData, ...]
    eager_peak_bytes: int = 0
    peak_floor_bytes: int = 0
    """No plan of this graph is predicted under it (``Plan.peak_floor_bytes``)."""
    default: PlanData | None = None

    @property
    def hull(self) -> tuple[PlanData, ...]:
        """The frontier's min-cut plans (the default plan or the hull's vertices)."""
        return tuple(p for p in self.points if not p.checkpoints)

    @property
    def segments(self) -> tuple[PlanData, ...]:
        """The checkpoint-segment plans."""
        return tuple(p for p in self.points if p.checkpoints)

    def is_default(self, p: PlanData) -> bool:
        """Whether ``p`` is the default plan (``PlanData.key``)."""
        return self.default is not None and p.key == self.default.key

    def dominating_default(self) -> PlanData | None:
        """The listed plan that beats the default plan on both peak and time cost, if the
        default plan is not itself on the frontier."""
        d = self.default
        if d is None or any(self.is_default(p) for p in self.points):
            return None
        return next((p for p in self.points if p.tradeoff.no_worse(d.tradeoff)), None)

