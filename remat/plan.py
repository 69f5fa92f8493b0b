"""Plan and SavedTensor: what one joint graph saves for the backward and what it recomputes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from .units import format_bytes, format_scaled

if TYPE_CHECKING:
    from .report.totals import Totals

__all__ = ["Role", "Status", "ValueInfo", "NodeFacts", "SavedTensor", "PlanNode", "Plan", "Frontier",
           "format_bytes", "format_scaled"]


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

    def info(self) -> ValueInfo:
        """Just the shared fields."""
        return ValueInfo(self.name, self.op, self.shape, self.dtype, self.nbytes, self.module, self.source)


def _shared(v: ValueInfo) -> dict[str, Any]:
    return {f: getattr(v, f) for f in ValueInfo.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class NodeFacts(ValueInfo):
    """One value of the joint graph as graph analysis sees it (``remat.analysis.joint_graph``)."""

    role: Role = field(default=Role.FORWARD, kw_only=True)


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


@dataclass(frozen=True)
class Plan:
    """The decision for one captured graph (or several, combined; see ``Plan.combine``)."""

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
    eager_peak_bytes: int = 0
    """Predicted peak of eager autograd on the same graph: saving what autograd saves,
    recomputing nothing, run uncompiled op by op (whatever the backend). Budget fractions are
    fractions of it."""
    recompute_flops: int = 0
    """Estimated FLOPs of the recomputed ops."""
    recompute_seconds: float = 0.0
    """Estimated time of the recomputed ops on the device model (fused: no memory round trips)."""
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

    def with_compiled_peak(self, peak_bytes: int, where: str = "", caveats: tuple[str, ...] = ()) -> Plan:
        """This plan with its step's peak read from the compiled graphs (``compiled_peak_bytes``),
        which becomes ``predicted_peak_bytes``; the simulator's stays in ``simulated_peak_bytes``."""
        note = (f"peak read from Inductor's memory plan: {format_bytes(peak_bytes)}" + (f" at {where}" if where else "")
                + "".join(f" ({c})" for c in caveats))
        return replace(self, compiled_peak_bytes=peak_bytes, predicted_peak_bytes=peak_bytes,
                       simulated_peak_bytes=self.simulated_peak_bytes or self.predicted_peak_bytes,
                       peak_model=READ, notes=(*[n for n in self.notes if not n.startswith(_READ_NOTE)], note))

    @property
    def saved_bytes(self) -> int:
        """Bytes kept alive for the backward by this plan (parameters excluded)."""
        return sum(s.nbytes for s in self.saved)

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
    def combine(cls, plans: list[Plan]) -> Plan:
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
        saved, rec, ops, notes, nodes, times = [], [], [], [], [], []
        for k, p in enumerate(plans):
            saved += [replace(s, name=f"g{k}.{s.name}") for s in p.saved]
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
            before += p.saved_bytes
            eager_before += p.eager_saved_bytes
        models = sorted({p.peak_model for p in plans if p.peak_model})
        if all(p.predicted_peak_bytes for p in plans):
            notes.append(f"peak of {len(plans)} graphs: the largest over graphs of its own predicted peak plus "
                         "what the graphs before it save (forwards in order, backwards in reverse)")
        else:
            peak = eager_peak = 0  # a fallback graph has no prediction: the step's is unknown
        return cls(tuple(saved), tuple(rec), tuple(ops), sum(p.eager_saved_bytes for p in plans),
                   graphs=sum(p.graphs for p in plans), notes=tuple(notes), nodes=tuple(nodes),
                   recompute_times=tuple(times) if any(t > 1 for t in times) else (),
                   recompute_flops=sum(p.recompute_flops for p in plans),
                   recompute_seconds=sum(p.recompute_seconds for p in plans),
                   predicted_peak_bytes=peak, eager_peak_bytes=eager_peak,
                   peak_model=" + ".join(models),
                   simulated_peak_bytes=_combined(plans, "simulated_peak_bytes"),
                   compiled_peak_bytes=_combined(plans, "compiled_peak_bytes"),
                   peak_floor_bytes=max(p.peak_floor_bytes for p in plans) if peak else 0)

    def __str__(self) -> str:
        activations = sum(s.op != "parameter" for s in self.saved)
        head = [
            f"remat plan: {activations} saved tensors, {format_bytes(self.saved_bytes)} "
            f"kept for the backward (eager autograd keeps {format_bytes(self.eager_saved_bytes)}); "
            f"{len(self.recomputed)} ops recomputed in the backward"
            + (f"; {self.graphs} graphs" if self.graphs > 1 else "")
        ]
        if self.fallback:
            head.append(f"FALLBACK (saves what autograd saves): {self.fallback}")
        cols = ("name", "module", "op", "shape", "dtype", "bytes", "reason", "source")
        free = [s for s in self.saved if s.op == "parameter"]
        rows = [
            (s.name, s.module or "-", s.op, "x".join(map(str, s.shape)) or "-", s.dtype, format_bytes(s.nbytes),
             s.reason, s.source or "-")
            for s in self.saved if s.op != "parameter"
        ]
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
        lines = head + ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        if free:
            lines.append(f"(+ {len(free)} parameters/buffers saved at no cost: they live anyway)")
        counts = self.recompute_counts()
        if counts:
            lines.append("recomputed: " + ", ".join(f"{op} x{c}" for op, c in counts.items()))
        if self.checkpoints and not self.nested:
            lines.append(f"checkpoint segments: never recomputes through {', '.join(self.checkpoints)} "
                         f"({len(self.checkpoints) + 1} segments, each recomputed when the backward reaches it)")
        if self.nested:
            lines.append(f"nested checkpoints: saves {', '.join(self.checkpoints) or 'no checkpoint (the inputs)'}; "
                         f"recomputes {', '.join(self.nested)} from them when the backward reaches their "
                         f"segment, and each of their segments again just before its backward")
        twice = [(r, k) for r, k in zip(self.recomputed, self.times()) if k > 1]
        if twice:
            shown = ", ".join(f"{r} x{k}" for r, k in twice[:8]) + (", ..." if len(twice) > 8 else "")
            lines.append(f"recomputed more than once: {len(twice)} ops ({shown})")
        lines += list(self.notes)
        t = self.totals()
        lines.append(t.line())
        if t.peak_line():
            lines.append(t.peak_line())
        return "\n".join(lines)

    # --- reports (rendering lives in remat.report) ---------------------------------------------

    def totals(self) -> Totals:
        """Saved bytes, eager's saved bytes, bytes if everything were saved, recomputed ops and
        their estimated FLOPs (see ``remat.report.totals``)."""
        from .report import totals

        return totals(self)

    def summary(self) -> str:
        """Saved and recomputed values rolled up per module, identical blocks collapsed
        (``layers.0..11 (x12)``), with the totals."""
        from .report import summary

        return summary(self)

    def explain(self, name: str) -> str:
        """Why the value or op ``name`` (``"mul_3"``, ``"aten.mul.Tensor"``) was saved,
        recomputed, or neither, in a sentence naming the rule or the cut."""
        from .report import why

        return why(self, name)

    def to_dict(self, *, nodes: bool = True) -> dict[str, Any]:
        """The plan as plain data, in the schema of ``to_json``."""
        from .report import to_dict

        return to_dict(self, nodes=nodes)

    def to_json(self, path: str | None = None, *, nodes: bool = True) -> str:
        """A versioned JSON document (schema: ``remat.report.schema``); written to ``path`` if given."""
        from .report import to_json

        return to_json(self, path, nodes=nodes)

    def to_dot(self, path: str | None = None, *, parameters: bool = False) -> str:
        """Graphviz DOT text of the joint graph: forward and backward, saved values on the cut,
        recomputed ops marked. Written to ``path`` if given; a ``.svg`` path is rendered with
        Graphviz's ``dot`` (which must be installed)."""
        from .report import render_svg, to_dot

        text = to_dot(self, parameters=parameters)
        if path is not None:
            out = render_svg(text) if str(path).endswith(".svg") else text
            with open(path, "w", encoding="utf-8") as f:
                f.write(out)
        return text

    def to_html(self, path: str, *, frontier: Any = None, title: str = "remat plan") -> str:
        """Write a self-contained HTML report (table, graph drawing, and the frontier plot when
        ``frontier`` (with ``.plot(path)``) is given) to ``path``; returns the path."""
        from .report import to_html

        return to_html(self, path, frontier=frontier, title=title)


def _combined(plans: list[Plan], attr: str) -> int:
    """``Plan.combine``'s composition of one peak field (0 unless every graph has it)."""
    peak = before = 0
    for p in plans:
        value = getattr(p, attr)
        if not value:
            return 0
        peak = max(peak, before + value)
        before += p.saved_bytes
    return peak


@dataclass(frozen=True)
class Frontier:
    """The plans no other plan beats on both predicted peak and estimated recompute time, for one
    graph, sorted from the least recompute time to the most (so their peaks fall): drawn from
    the default plan, every vertex of the lower convex hull of (saved bytes, recompute seconds),
    and the checkpoint-segment plans (``remat.core.segments``; ``checkpoints`` set). A budget chooses
    among all candidates (``remat.planning.planner.choose``). ``default`` is the plan used without a
    budget, which may itself be dominated; ``eager_peak_bytes`` is autograd's predicted peak."""

    points: tuple[Plan, ...]
    eager_peak_bytes: int = 0
    peak_floor_bytes: int = 0
    """No plan of this graph is predicted under it (``Plan.peak_floor_bytes``)."""
    default: Plan | None = None

    @property
    def hull(self) -> tuple[Plan, ...]:
        """The frontier's min-cut plans (the default plan or the hull's vertices)."""
        return tuple(p for p in self.points if not p.checkpoints)

    @property
    def segments(self) -> tuple[Plan, ...]:
        """The checkpoint-segment plans."""
        return tuple(p for p in self.points if p.checkpoints)

    def _is_default(self, p: Plan) -> bool:
        d = self.default
        return d is not None and (p is d or ({s.name for s in p.saved} == {s.name for s in d.saved}
                                             and p.recomputed == d.recomputed))

    def dominating_default(self) -> Plan | None:
        """The listed plan that beats the default plan on both peak and recompute time, if the
        default plan is not itself on the frontier."""
        d = self.default
        if d is None or any(self._is_default(p) for p in self.points):
            return None
        return next((p for p in self.points if p.predicted_peak_bytes <= d.predicted_peak_bytes
                     and p.recompute_seconds <= d.recompute_seconds), None)

    def __str__(self) -> str:
        rows = [("#", "kind", "saved", "predicted peak", "x eager peak", "recompute (est.)", "recomputed ops")]
        for k, p in enumerate(self.points):
            ratio = f"{p.predicted_peak_bytes / self.eager_peak_bytes:.2f}" if self.eager_peak_bytes else "-"
            kind = f"{len(p.checkpoints)} checkpoints" if p.checkpoints else "min-cut"
            if self._is_default(p):
                kind += " (default)"
            rows.append((str(k), kind, format_bytes(p.saved_bytes), format_bytes(p.predicted_peak_bytes), ratio,
                         f"{p.recompute_seconds * 1e3:.3f} ms", str(len(p.recomputed))))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"remat frontier: {len(self.points)} plans no other plan beats on both predicted peak and "
                 f"recompute time (eager autograd's predicted peak: {format_bytes(self.eager_peak_bytes)})"]
        for j, r in enumerate(rows):
            lines.append("  ".join(v.rjust(w) for v, w in zip(r, widths)))
            if j == 0:
                lines.append("  ".join("-" * w for w in widths))
        beaten = self.dominating_default()
        if beaten is not None and self.default is not None:
            d = self.default
            lines.append(f"default plan (no budget): predicted peak {format_bytes(d.predicted_peak_bytes)}, recompute "
                         f"{d.recompute_seconds * 1e3:.3f} ms; plan #{self.points.index(beaten)} beats it on both")
        return "\n".join(lines)

    def plot(self, path: str) -> str:
        """Predicted peak (MiB) against estimated recompute time (ms), as PNG or SVG by the
        file's extension. Needs matplotlib."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:  # pragma: no cover - depends on the environment
            from .errors import RematError

            raise RematError("remat: Frontier.plot needs matplotlib; pip install matplotlib.") from e
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([p.recompute_seconds * 1e3 for p in self.points],
                [p.predicted_peak_bytes / 2**20 for p in self.points], "-", color="C0", label="frontier")
        for plans, style, label in ((self.hull, "o", "min-cut plans"), (self.segments, "s", "checkpoint segments")):
            if plans:
                ax.plot([p.recompute_seconds * 1e3 for p in plans],
                        [p.predicted_peak_bytes / 2**20 for p in plans], style, label=label)
        if self.default is not None:
            ax.plot([self.default.recompute_seconds * 1e3], [self.default.predicted_peak_bytes / 2**20], "*",
                    color="C3", markersize=12, label="default plan")
        if self.eager_peak_bytes:
            ax.axhline(self.eager_peak_bytes / 2**20, color="gray", ls="--", label="eager autograd")
        ax.set_xlabel("estimated recompute time (ms)")
        ax.set_ylabel("predicted peak memory of a step (MiB)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path
