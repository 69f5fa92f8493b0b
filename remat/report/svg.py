"""A drawing of the joint graph as inline SVG, for the HTML report; needs neither network nor
Graphviz.

Layout (a simple layered drawing, see Note [Plan drawing layout]): the forward runs left to
right on top, the backward right to left below it, so that each value the backward reads from
the forward sits above the backward ops that read it. Saved values (blue, dark border) are the
cut; red edges carry them into the backward. Recomputed ops are orange with a dashed border.
Parameters are not drawn. Every node has a tooltip with its name, op, status, reason, module,
shape and bytes.
"""

from __future__ import annotations

from html import escape

from ..plan_data import PlanData, PlanNode, Role
from ..units import format_bytes
from .dot import BACKWARD, FORWARD

__all__ = ["draw_svg", "layout", "COLORS", "LabelSpace"]

# Note [Plan drawing layout]
# Forward nodes get a column: their longest-path depth from the graph inputs (through values
# computed only for the backward too, which a saved value may follow), then moved as far right
# as their forward users allow, so a weight's transpose or a dropout mask sits with the layer
# that uses it. A backward node's column is the smallest column among the forward values it
# reads or, if it reads none, among the backward nodes it reads (tangents start right of the
# forward); so the backward walks right to left and each op sits under the forward values it
# reads. Nodes sharing a column
# stack downwards in graph order. Everything is a function of graph order: the drawing is stable.

COLORS = {
    "saved": ("#9ecae1", "#08519c"),
    "recomputed": ("#fdd0a2", "#d94801"),
    "forward": ("#f0f0f0", "#737373"),
    "input": ("#c7e9c0", "#238b45"),
    "tangent": ("#dadaeb", "#54278f"),
    "backward": ("#efedf5", "#6a51a3"),
    "backward-only": ("#fcfbfd", "#9e9ac8"),
}
DX, DY, R = 18, 14, 5
LEFT, TOP, GAP = 30, 150, 60
MAX_EDGES_NODES = 2500  # above this many nodes only the cut's edges are drawn


class LabelSpace:
    """The saved values' labels drawn so far, each a strip along its -40 degree baseline: a label
    whose strip would cross one already drawn is left out (its node's tooltip still names it),
    so that labels of saved values in neighbouring columns never print over each other."""

    SIN, COS = 0.6428, 0.7660  # of 40 degrees
    HEIGHT, CHAR = 10.0, 5.2  # the strip's width across the baseline and a character's length at 9 px

    def __init__(self) -> None:
        self.strips: list[tuple[float, float, float]] = []
        """(offset across the baseline, start and end along it) of each label drawn."""

    def strip(self, x: float, y: float, text: str) -> tuple[float, float, float]:
        along = x * self.COS - y * self.SIN
        return x * self.SIN + y * self.COS, along, along + len(text) * self.CHAR

    def take(self, x: float, y: float, text: str) -> bool:
        """Whether a label at ``(x, y)`` is drawn (it crosses none drawn so far); records it if so."""
        d, a, b = self.strip(x, y, text)
        if any(abs(d - d2) < self.HEIGHT and a < b2 and a2 < b for d2, a2, b2 in self.strips):
            return False
        self.strips.append((d, a, b))
        return True


def _columns(nodes: list[PlanNode]) -> dict[str, int]:
    status = {n.name: n.status for n in nodes}
    computable = [n for n in nodes if n.status in FORWARD or n.status == "backward-only"]
    depth: dict[str, int] = {}
    for n in computable:  # longest path; backward-only values count (a saved value may follow one)
        ins = [depth[u] for u in n.inputs if u in depth]
        depth[n.name] = 1 + max(ins) if ins else 0
    users: dict[str, list[int]] = {}
    for n in reversed(computable):  # then as late as possible: just before the first forward user
        if n.status in FORWARD:
            if users.get(n.name):
                depth[n.name] = max(depth[n.name], min(users[n.name]) - 1)
            for u in n.inputs:
                users.setdefault(u, []).append(depth[n.name])
    col = {n.name: depth[n.name] for n in nodes if n.status in FORWARD}
    end = max(col.values(), default=0) + 1
    for n in nodes:
        if n.status in BACKWARD:
            fwd = [col[u] for u in n.inputs if u in col and status[u] in FORWARD]
            bwd = [col[u] for u in n.inputs if u in col and status[u] in BACKWARD and status[u] != "tangent"]
            col[n.name] = min(fwd) if fwd else (min(bwd) if bwd else end)
    return col


def layout(plan: PlanData) -> dict[str, tuple[float, float]]:
    """Centre ``(x, y)`` of every drawn node (parameters are not drawn)."""
    nodes = [n for n in plan.nodes if n.role is not Role.PARAMETER]
    col = _columns(nodes)
    rows: dict[tuple[bool, int], int] = {}
    placed: dict[str, tuple[bool, int, int]] = {}
    for n in nodes:
        bw = n.status in BACKWARD
        k = rows.get((bw, col[n.name]), 0)
        rows[(bw, col[n.name])] = k + 1
        placed[n.name] = (bw, col[n.name], k)
    fwd_rows = max((k for (bw, _), k in rows.items() if not bw), default=0)
    out = {}
    for name, (bw, c, k) in placed.items():
        y = TOP + k * DY if not bw else TOP + fwd_rows * DY + GAP + k * DY
        out[name] = (LEFT + c * DX, y)
    return out


def _tip(n: PlanNode) -> str:
    parts = [n.name, n.op, n.status + (f" ({n.reason})" if n.reason else "")]
    if n.module:
        parts.append(f"module {n.module}")
    if n.shape:
        parts.append("x".join(map(str, n.shape)) + f" {n.dtype}")
    if n.nbytes:
        parts.append(format_bytes(n.nbytes))
    if n.source:
        parts.append(n.source)
    return escape(" | ".join(parts))


def _legend() -> list[str]:
    out, x = [], 10
    for status in ("input", "forward", "saved", "recomputed", "tangent", "backward", "backward-only"):
        fill, stroke = COLORS[status]
        dash = ' stroke-dasharray="2,1.5"' if status == "recomputed" else ""
        width = 2.5 if status == "saved" else 1
        out.append(f'<circle cx="{x + R}" cy="16" r="{R}" fill="{fill}" stroke="{stroke}" '
                   f'stroke-width="{width}"{dash}/>')
        out.append(f'<text x="{x + 2 * R + 4}" y="20">{status}</text>')
        x += 14 + 8 * len(status) + 16
    out.append(f'<line x1="{x}" y1="16" x2="{x + 24}" y2="16" stroke="#cb181d" stroke-width="2"/>')
    out.append(f'<text x="{x + 30}" y="20">saved value read by the backward (the cut)</text>')
    return out


def draw_svg(plan: PlanData) -> str:
    """The SVG text (an ``<svg>`` element, no XML prolog) of the plan's joint graph."""
    nodes = [n for n in plan.nodes if n.role is not Role.PARAMETER]
    if not nodes:
        return ('<svg xmlns="http://www.w3.org/2000/svg" width="420" height="40"><text x="10" y="24">'
                'no graph to draw (a fallback plan has no nodes)</text></svg>')
    pos = layout(plan)
    status = {n.name: n.status for n in nodes}
    width = max(x for x, _ in pos.values()) + 160
    height = max(y for _, y in pos.values()) + 40
    fwd_bottom = max((y for n, (_, y) in pos.items() if status[n] in FORWARD), default=TOP)
    body = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="remat-graph" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica,Arial,sans-serif" '
        'font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        *_legend(),
        f'<text x="{LEFT}" y="{TOP - 100}" font-weight="bold">forward (left to right) &#8594;</text>',
        f'<line x1="0" y1="{fwd_bottom + GAP / 2}" x2="{width}" y2="{fwd_bottom + GAP / 2}" '
        'stroke="#bdbdbd" stroke-dasharray="6,4"/>',
        f'<text x="{LEFT}" y="{fwd_bottom + GAP / 2 - 6}" font-weight="bold">&#8592; backward (right to left, '
        'below)</text>',
    ]
    cut_only = len(nodes) > MAX_EDGES_NODES
    edges = []
    for n in nodes:
        x2, y2 = pos[n.name]
        for u in n.inputs:
            if u not in pos:
                continue
            x1, y1 = pos[u]
            cut = status[u] == "saved" and n.status in BACKWARD
            if cut:
                style = 'stroke="#cb181d" stroke-width="1.4" stroke-opacity="0.75"'
            elif cut_only:
                continue
            elif n.status == "recomputed":
                style = 'stroke="#d94801" stroke-width="0.8" stroke-dasharray="3,2" stroke-opacity="0.6"'
            elif n.status in BACKWARD:
                style = 'stroke="#9e9ac8" stroke-width="0.6" stroke-opacity="0.5"'
            else:
                style = 'stroke="#969696" stroke-width="0.6" stroke-opacity="0.6"'
            edges.append(f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" {style}/>')
    body += edges
    for n in nodes:
        x, y = pos[n.name]
        fill, stroke = COLORS[n.status]
        extra = ' stroke-dasharray="2,1.5"' if n.status == "recomputed" else ""
        width_ = 2.5 if n.status == "saved" else 1
        r = R + 1 if n.status == "saved" else R
        body.append(f'<g class="node {n.status}"><title>{_tip(n)}</title><circle cx="{x:.0f}" cy="{y:.0f}" '
                    f'r="{r}" fill="{fill}" stroke="{stroke}" stroke-width="{width_}"{extra}/></g>')
    labels = LabelSpace()
    for n in nodes:
        x, y = pos[n.name]
        if n.status == "saved" and labels.take(x + 4, y - 8, n.name):
            body.append(f'<text x="{x + 4:.0f}" y="{y - 8:.0f}" font-size="9" fill="#08519c" '
                        f'transform="rotate(-40 {x + 4:.0f} {y - 8:.0f})">{escape(n.name)}</text>')
    body.append("</svg>")
    return "\n".join(body)
