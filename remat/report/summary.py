"""``plan.summary()``: saved and recomputed values rolled up per module, identical blocks
collapsed.

Every saved value (parameters excluded) and every recomputed op counts toward the module that
produced it (the innermost module of its ``nn_module_stack``). A module path whose first
integer component names a block (``layers.3.attn``: block ``layers.3``, relative path ``attn``)
is grouped with its block. Consecutive blocks of the same container whose rows are identical
(same relative paths, counts, bytes and reasons) collapse into one group, shown as
``layers.0..11 (x12)`` with the group's totals, followed by one indented row per relative
path (also totals over the group; none when the blocks have only their own ops). Modules
outside any block get one row each. Rows appear in graph order of the first op of each group,
so the output is stable.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..plan_data import PlanData, Role
from ..units import format_bytes
from .totals import totals

__all__ = ["ModuleRow", "module_rows", "render"]

TOP = "(top level)"
OWN = "(block itself)"


@dataclass(frozen=True, slots=True)
class ModuleRow:
    """One row of the summary; numbers are totals over the ``blocks`` blocks it stands for."""

    module: str
    """Display path: ``head``, ``layers.0..11 (x12)``, or ``  .attn`` under a block group."""
    blocks: int
    saved: int
    saved_bytes: int
    recomputed: int
    reasons: tuple[tuple[str, int], ...]
    """Why values were saved, with counts, most frequent first."""
    depth: int = 0
    """0 for a group or a plain module, 1 for a row inside a block group."""


@dataclass(frozen=True, slots=True)
class _Stats:
    saved: int = 0
    saved_bytes: int = 0
    recomputed: int = 0
    reasons: tuple[tuple[str, int], ...] = ()

    def __add__(self, o: _Stats) -> _Stats:
        merged = Counter(dict(self.reasons)) + Counter(dict(o.reasons))
        return _Stats(self.saved + o.saved, self.saved_bytes + o.saved_bytes,
                      self.recomputed + o.recomputed, _sorted(merged))


def _sorted(c: Counter) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def _per_module(plan: PlanData) -> dict[str, _Stats]:
    """Stats per module path, in graph order of each module's first node."""
    order = {n.module: i for i, n in reversed(list(enumerate(plan.nodes)))}
    module_of = {n.name: n.module for n in plan.nodes}
    saved: dict[str, list] = {}
    for s in plan.saved:
        if s.role is not Role.PARAMETER:
            saved.setdefault(s.module, []).append(s)
    rec = Counter(module_of.get(r, "") for r in plan.recomputed)
    mods = sorted(set(saved) | set(rec), key=lambda m: (order.get(m, len(order)), m))
    out = {}
    for m in mods:
        ss = saved.get(m, [])
        out[m] = _Stats(len(ss), sum(s.nbytes for s in ss), rec[m], _sorted(Counter(s.reason for s in ss)))
    return out


def _block(module: str) -> tuple[str, int, str] | None:
    """``("layers", 3, "attn")`` for ``layers.3.attn``; None outside any block."""
    parts = module.split(".") if module else []
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[:i]), int(p), ".".join(parts[i + 1:])
    return None


def _join(prefix: str, rest: str) -> str:
    return f"{prefix}.{rest}" if prefix else rest


def module_rows(plan: PlanData) -> list[ModuleRow]:
    """The summary rows of ``plan`` (see the module docstring)."""
    per = _per_module(plan)
    blocks: dict[tuple[str, int], dict[str, _Stats]] = {}
    for m, st in per.items():
        b = _block(m)
        if b is not None:
            blocks.setdefault((b[0], b[1]), {})[b[2]] = st
    runs: dict[tuple[str, int], list[int]] = {}  # first block of a run -> indices in the run
    by_prefix: dict[str, list[int]] = {}
    for prefix, k in blocks:
        by_prefix.setdefault(prefix, []).append(k)
    for prefix, ks in by_prefix.items():
        ks.sort()
        start = ks[0]
        runs[(prefix, start)] = [start]
        for prev, k in zip(ks, ks[1:]):
            same = k == prev + 1 and blocks[(prefix, k)] == blocks[(prefix, start)]
            if same:
                runs[(prefix, start)].append(k)
            else:
                start = k
                runs[(prefix, start)] = [k]
    run_of = {(p, k): (p, ks[0]) for (p, _), ks in runs.items() for k in ks}
    rows: list[ModuleRow] = []
    done: set[tuple[str, int]] = set()
    for m, st in per.items():
        b = _block(m)
        if b is None:
            rows.append(ModuleRow(m or TOP, 1, st.saved, st.saved_bytes, st.recomputed, st.reasons))
            continue
        key = run_of[(b[0], b[1])]
        if key in done:
            continue
        done.add(key)
        ks = runs[key]
        rows += _group_rows(key[0], ks, [blocks[(key[0], k)] for k in ks])
    return rows


def _group_rows(prefix: str, ks: list[int], members: list[dict[str, _Stats]]) -> list[ModuleRow]:
    n = len(ks)
    label = _join(prefix, f"{ks[0]}..{ks[-1]} (x{n})" if n > 1 else str(ks[0]))
    per_rel: dict[str, _Stats] = {}
    for member in members:
        for rel, st in member.items():
            per_rel[rel] = per_rel.get(rel, _Stats()) + st
    total = _Stats()
    for st in per_rel.values():
        total = total + st
    rows = [ModuleRow(label, n, total.saved, total.saved_bytes, total.recomputed, total.reasons)]
    if list(per_rel) == [""]:  # only the block's own ops: the group row says it all
        return rows
    for rel, st in per_rel.items():
        rows.append(ModuleRow(f"  .{rel}" if rel else f"  {OWN}", n, st.saved, st.saved_bytes,
                              st.recomputed, st.reasons, depth=1))
    return rows


def _reasons(reasons: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(r if c == 1 else f"{r} x{c}" for r, c in reasons) or "-"


def render(plan: PlanData) -> str:
    """The text of ``plan.summary()``."""
    t = totals(plan)
    head = [f"remat plan summary: {t.saved_tensors} saved tensors in {plan.graphs} "
            f"graph{'s' if plan.graphs != 1 else ''}" + (f"; FALLBACK: {plan.fallback}" if plan.fallback else "")]
    cols = ("module", "saved", "saved bytes", "recomputed", "why saved")
    rows = [(r.module, str(r.saved), format_bytes(r.saved_bytes), str(r.recomputed), _reasons(r.reasons))
            for r in module_rows(plan)]
    rows.append(("total", str(t.saved_tensors), format_bytes(t.saved_bytes), str(t.recomputed_ops), ""))
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    right = (False, True, True, True, False)

    def fmt(values) -> str:
        return "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)).rstrip()

    lines = head + [fmt(cols), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows[:-1]]
    lines += ["  ".join("-" * w for w in widths), fmt(rows[-1])]
    if t.free_saved:
        lines.append(f"(+ {t.free_saved} parameters/buffers saved at no cost: they live anyway)")
    lines.append(t.line())
    if t.peak_line():
        lines.append(t.peak_line())
    return "\n".join(lines)
