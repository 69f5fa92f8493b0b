"""``print(frontier)`` and ``frontier.plot(path)``: the memory/time frontier of one graph as a table
(saved bytes, predicted peak, its ratio to eager autograd's, estimated recompute time and time
cost: recompute plus saved traffic) and as a plot of predicted peak (MiB) against estimated time
cost (ms)."""

from __future__ import annotations

from ..errors import RematError
from ..plan_data import FrontierData, PlanData
from ..units import format_bytes

__all__ = ["render", "plot"]

_MIB = 2**20


def _row(frontier: FrontierData, k: int, p: PlanData) -> tuple[str, ...]:
    eager = frontier.eager_peak_bytes
    ratio = f"{p.predicted_peak_bytes / eager:.2f}" if eager else "-"
    kind = f"{len(p.checkpoints)} checkpoints" if p.checkpoints else "min-cut"
    if frontier.is_default(p):
        kind += " (default)"
    return (str(k), kind, format_bytes(p.saved_bytes), format_bytes(p.predicted_peak_bytes), ratio,
            f"{p.recompute_seconds * 1e3:.3f} ms", f"{p.cost_seconds * 1e3:.3f} ms", str(len(p.recomputed)))


def render(frontier: FrontierData) -> str:
    """The frontier as ``print(frontier)`` shows it."""
    rows = [("#", "kind", "saved", "predicted peak", "x eager peak", "recompute (est.)", "time cost (est.)",
             "recomputed ops")]
    rows += [_row(frontier, k, p) for k, p in enumerate(frontier.points)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"remat frontier: {len(frontier.points)} plans no other plan beats on both predicted peak and "
             "time cost (recompute plus writing and reading what it saves) (eager autograd's predicted peak: "
             f"{format_bytes(frontier.eager_peak_bytes)})"]
    for j, r in enumerate(rows):
        lines.append("  ".join(v.rjust(w) for v, w in zip(r, widths)))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    beaten = frontier.dominating_default()
    d = frontier.default
    if beaten is not None and d is not None:
        lines.append(f"default plan (no budget): predicted peak {format_bytes(d.predicted_peak_bytes)}, time cost "
                     f"{d.cost_seconds * 1e3:.3f} ms; plan #{frontier.points.index(beaten)} is estimated to beat it on "
                     "both by recomputing what the default plan's cost rules keep saved (its notes say what): the "
                     "default is not changed on estimates the rules distrust; where the first steps are measured "
                     "(remat.Tuning; CUDA by default) that plan is measured beside it and the faster is kept "
                     "(Note [The default at most eager's peak])")
    return "\n".join(lines)


def _xy(plans: tuple[PlanData, ...]) -> tuple[list[float], list[float]]:
    return [p.cost_seconds * 1e3 for p in plans], [p.predicted_peak_bytes / _MIB for p in plans]


def plot(frontier: FrontierData, path: str) -> str:
    """Predicted peak (MiB) against estimated time cost (ms), as PNG or SVG by the file's
    extension; returns ``path``. Needs matplotlib."""
    try:  # a Figure of its own, not pyplot: a notebook's or script's matplotlib backend is left alone
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RematError("remat: Frontier.plot needs matplotlib, which remat does not install; got an "
                         "environment without it. Install it: pip install matplotlib.") from e
    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(*_xy(frontier.points), "-", color="C0", label="frontier")
    for plans, style, label in ((frontier.hull, "o", "min-cut plans"), (frontier.segments, "s", "checkpoint segments")):
        if plans:
            ax.plot(*_xy(plans), style, label=label)
    if frontier.default is not None:
        ax.plot(*_xy((frontier.default,)), "*", color="C3", markersize=12, label="default plan")
    if frontier.eager_peak_bytes:
        ax.axhline(frontier.eager_peak_bytes / _MIB, color="gray", ls="--", label="eager autograd")
    ax.set_xlabel("estimated time cost: recompute + saved traffic (ms)")
    ax.set_ylabel("predicted peak memory of a step (MiB)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return path
