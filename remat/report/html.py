"""``plan.to_html(path)``: one self-contained HTML file (no network needed to view it) with the
totals, the per-module summary, the saved-tensor table, a drawing of the joint graph (inline
SVG, ``remat.report.svg``), Graphviz's drawing when ``dot`` is installed, and the memory/time
frontier plot when a ``frontier`` (anything with ``.plot(path)`` writing a PNG) is given.
"""

from __future__ import annotations

import base64
import os
import tempfile
from html import escape
from typing import Any

from ..plan_data import PlanData, Role
from ..units import format_bytes
from .dot import have_dot, render_svg, to_dot
from .summary import module_rows
from .svg import draw_svg
from .totals import format_flops, totals

__all__ = ["to_html", "render_html"]

GRAPHVIZ_MAX_NODES = 600  # Graphviz's drawing is embedded only for graphs up to this size

_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 20px; margin: 4px 0 8px; } h2 { font-size: 16px; margin: 22px 0 6px; }
table { border-collapse: collapse; font-size: 12px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; white-space: nowrap; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.group td { font-weight: bold; } tr.sub td:first-child { padding-left: 24px; }
tr.total td { border-top: 2px solid #999; font-weight: bold; }
.totals td:first-child { color: #555; } .note { color: #555; font-size: 12px; }
.graph { overflow: auto; border: 1px solid #ddd; max-height: 720px; }
code { background: #f6f6f6; padding: 0 3px; }
"""


def _td(v: Any, num: bool = False) -> str:
    return f'<td class="num">{escape(str(v))}</td>' if num else f"<td>{escape(str(v))}</td>"


def _totals_table(plan: PlanData) -> str:
    t = totals(plan)
    everything = "unknown" if t.activation_bytes is None else format_bytes(t.activation_bytes)
    rows = [
        ("saved for the backward", f"{format_bytes(t.saved_bytes)} in {t.saved_tensors} tensors"),
        ("eager autograd saves", format_bytes(t.eager_saved_bytes)),
        ("saving every activation", everything),
        ("recomputed ops", f"{t.recomputed_ops} ({format_flops(t.recompute_flops)}, estimated)"),
        ("predicted peak (eager)", f"{format_bytes(t.predicted_peak_bytes)} "
                                   f"({format_bytes(t.eager_peak_bytes)})"),
        ("parameters/buffers saved at no cost", str(t.free_saved)),
    ]
    return '<table class="totals">' + "".join(f"<tr>{_td(k)}{_td(v)}</tr>" for k, v in rows) + "</table>"


def _summary_table(plan: PlanData) -> str:
    head = "<tr><th>module</th><th>saved</th><th>saved bytes</th><th>recomputed</th><th>why saved</th></tr>"
    rows = []
    for r in module_rows(plan):
        reasons = ", ".join(k if c == 1 else f"{k} x{c}" for k, c in r.reasons) or "-"
        cls = "sub" if r.depth else ("group" if r.blocks > 1 else "")
        rows.append(f'<tr class="{cls}">{_td(r.module.strip())}{_td(r.saved, True)}'
                    f'{_td(format_bytes(r.saved_bytes), True)}{_td(r.recomputed, True)}{_td(reasons)}</tr>')
    t = totals(plan)
    rows.append(f'<tr class="total">{_td("total")}{_td(t.saved_tensors, True)}'
                f'{_td(format_bytes(t.saved_bytes), True)}{_td(t.recomputed_ops, True)}{_td("")}</tr>')
    return f"<table>{head}{''.join(rows)}</table>"


def _saved_table(plan: PlanData) -> str:
    cols = ("name", "module", "op", "shape", "dtype", "bytes", "reason", "source")
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"
    rows = []
    for s in plan.saved:
        if s.role is Role.PARAMETER:
            continue
        rows.append("<tr>" + "".join([
            _td(s.name), _td(s.module or "-"), _td(s.op), _td("x".join(map(str, s.shape)) or "-"),
            _td(s.dtype), _td(format_bytes(s.nbytes), True), _td(s.reason), _td(s.source or "-")]) + "</tr>")
    return f'<table class="saved">{head}{"".join(rows)}</table>'


def _offloaded_table(plan: PlanData) -> str:
    cols = ("name", "bytes", "copy out (ms)", "copy back (ms)", "issued before", "stall (ms)", "host (ms)")
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"
    rows = ["<tr>" + "".join([
        _td(o.name), _td(format_bytes(o.nbytes), True),
        _td(f"{o.copy_out[0] * 1e3:.3f}-{o.copy_out[1] * 1e3:.3f}", True),
        _td(f"{o.copy_in[0] * 1e3:.3f}-{o.copy_in[1] * 1e3:.3f}", True), _td(o.reload_before),
        _td(f"{o.stall_seconds * 1e3:.3f}", True), _td(f"{o.issue_seconds * 1e3:.3f}", True)]) + "</tr>"
        for o in plan.offloaded]
    return f'<table class="saved">{head}{"".join(rows)}</table>'


def _frontier_img(frontier: Any) -> str:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "frontier.png")
        frontier.plot(path)
        with open(path, "rb") as f:
            data = base64.b64encode(f.read()).decode("ascii")
    return f'<img alt="memory/time frontier" src="data:image/png;base64,{data}">'


def render_html(plan: PlanData, *, title: str = "remat plan", frontier: Any = None,
                graphviz: bool | None = None) -> str:
    """The HTML text. ``graphviz=None`` embeds Graphviz's drawing when ``dot`` is installed and
    the graph has at most ``GRAPHVIZ_MAX_NODES`` nodes."""
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
    ]
    if plan.fallback:
        parts.append(f'<p class="note"><b>Fallback:</b> {escape(plan.fallback)} (autograd\'s choice is kept)</p>')
    parts += ['<h2 id="totals">Totals</h2>', _totals_table(plan),
              '<h2 id="saved">Saved tensors</h2>', _saved_table(plan)]
    if plan.offloaded:
        parts += ['<h2 id="offloaded">Offloaded to host memory</h2>',
                  f'<p class="note">{format_bytes(plan.host_bytes)} in host memory during the step; copies estimated '
                  f"on the step's op timeline (stall {plan.offload_stall_seconds * 1e3:.3f} ms; host time to issue "
                  f"them {plan.offload_issue_seconds * 1e3:.3f} ms)</p>",
                  _offloaded_table(plan)]
    counts = plan.recompute_counts()
    if counts:
        parts.append('<p class="note">recomputed: ' + escape(", ".join(f"{op} x{c}" for op, c in counts.items()))
                     + "</p>")
    parts += ['<h2 id="modules">By module</h2>', _summary_table(plan),
              '<h2 id="graph">Graph</h2>',
              '<p class="note">Forward on top (left to right), backward below (right to left). Hover a node '
              "for its name, op, status and reason.</p>",
              f'<div class="graph">{draw_svg(plan)}</div>']
    drawn = sum(n.role is not Role.PARAMETER for n in plan.nodes)
    if graphviz is None:
        graphviz = have_dot() and 0 < drawn <= GRAPHVIZ_MAX_NODES
    if graphviz:
        svg = render_svg(to_dot(plan))
        svg = svg[svg.find("<svg"):]
        parts.append(f'<details><summary>Graphviz drawing</summary><div class="graph">{svg}</div></details>')
    if frontier is not None:
        parts += ['<h2 id="frontier">Memory/time frontier</h2>', _frontier_img(frontier)]
    if plan.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{escape(n)}</li>" for n in plan.notes) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def to_html(plan: PlanData, path: str | os.PathLike[str], **kwargs: Any) -> str:
    """Write the report to ``path``; returns the path written."""
    text = render_html(plan, **kwargs)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return os.fspath(path)
