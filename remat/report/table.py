"""``print(plan)``: the saved tensors as a table (name, module, op, shape, dtype, bytes, reason,
source), what is recomputed, the plan's notes and its totals."""

from __future__ import annotations

from ..plan_data import PlanData, Role, SavedTensor
from ..units import format_bytes
from .totals import totals

__all__ = ["render"]

_COLUMNS = ("name", "module", "op", "shape", "dtype", "bytes", "reason", "source")
_TWICE_SHOWN = 8  # ops recomputed more than once, listed before "..."


def _row(s: SavedTensor) -> tuple[str, ...]:
    return (s.name, s.module or "-", s.op, "x".join(map(str, s.shape)) or "-", s.dtype, format_bytes(s.nbytes),
            s.reason, s.source or "-")


def _table(plan: PlanData) -> list[str]:
    """The header line, the column names, a rule and one row per saved activation."""
    activations = [s for s in plan.saved if s.role is not Role.PARAMETER]
    head = [
        f"remat plan: {len(activations)} saved tensors, {format_bytes(plan.saved_bytes)} "
        f"kept for the backward (eager autograd keeps {format_bytes(plan.eager_saved_bytes)}); "
        f"{len(plan.recomputed)} ops recomputed in the backward"
        + (f"; {plan.graphs} graphs" if plan.graphs > 1 else "")
    ]
    if plan.fallback:
        head.append(f"FALLBACK (saves what autograd saves): {plan.fallback}")
    rows = [_row(s) for s in activations]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(_COLUMNS)]
    lines = head + ["  ".join(c.ljust(w) for c, w in zip(_COLUMNS, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return lines


def _recompute_lines(plan: PlanData) -> list[str]:
    """What the backward recomputes: counts per op, checkpoints, ops recomputed more than once."""
    lines = []
    counts = plan.recompute_counts()
    if counts:
        lines.append("recomputed: " + ", ".join(f"{op} x{c}" for op, c in counts.items()))
    if plan.checkpoints and not plan.nested:
        lines.append(f"checkpoint segments: never recomputes through {', '.join(plan.checkpoints)} "
                     f"({len(plan.checkpoints) + 1} segments, each recomputed when the backward reaches it)")
    if plan.nested:
        lines.append(f"nested checkpoints: saves {', '.join(plan.checkpoints) or 'no checkpoint (the inputs)'}; "
                     f"recomputes {', '.join(plan.nested)} from them when the backward reaches their "
                     f"segment, and each of their segments again just before its backward")
    twice = [(r, k) for r, k in zip(plan.recomputed, plan.times()) if k > 1]
    if twice:
        shown = ", ".join(f"{r} x{k}" for r, k in twice[:_TWICE_SHOWN]) + (", ..." if len(twice) > _TWICE_SHOWN else "")
        lines.append(f"recomputed more than once: {len(twice)} ops ({shown})")
    return lines


def render(plan: PlanData) -> str:
    """The plan as ``print(plan)`` shows it."""
    lines = _table(plan)
    free = sum(s.role is Role.PARAMETER for s in plan.saved)
    if free:
        lines.append(f"(+ {free} parameters/buffers saved at no cost: they live anyway)")
    lines += _recompute_lines(plan)
    if plan.offloaded:
        stall, issue = plan.offload_stall_seconds, plan.offload_issue_seconds
        lines.append(f"offloaded to host memory: {', '.join(o.name for o in plan.offloaded)} "
                     f"({format_bytes(plan.host_bytes)} in host memory during the step; copies "
                     + (f"estimated to stall the step {stall * 1e3:.3f} ms" if stall
                        else "hidden behind compute, estimated")
                     + (f"; {issue * 1e3:.3f} ms of host time to issue them, measured per copy)" if issue else ")"))
    lines += list(plan.notes)
    if plan.compiled_for:
        lines.append(f"compiled for inputs: {plan.compiled_for}")
    t = totals(plan)
    lines.append(t.line())
    if t.peak_line():
        lines.append(t.peak_line())
    return "\n".join(lines)
