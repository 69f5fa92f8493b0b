"""``plan.to_dot()``: the joint graph in Graphviz DOT, and its SVG when ``dot`` is installed.

Two clusters: ``forward`` (graph inputs and every value the forward computes) and ``backward``
(tangents, the backward, and values computed only for it). Saved values sit on the cut: filled
blue with a double border, and their edges into the backward are red. Recomputed ops are
orange and dashed. Parameters are left out unless ``parameters=True`` (they are saved at no
cost and would crowd the picture).
"""

from __future__ import annotations

import shutil
import subprocess

from ..errors import RematError
from ..plan_data import PlanData, PlanNode, Role
from ..units import format_bytes

__all__ = ["to_dot", "render_svg", "have_dot", "FORWARD", "BACKWARD"]

FORWARD = ("input", "saved", "recomputed", "forward", "parameter")
BACKWARD = ("tangent", "backward", "backward-only")

_STYLE = {
    "saved": 'style="rounded,filled,bold", fillcolor="#9ecae1", color="#08519c", peripheries=2',
    "recomputed": 'style="rounded,dashed,filled", fillcolor="#fdd0a2", color="#d94801"',
    "forward": 'style="rounded,filled", fillcolor="#f0f0f0", color="#737373"',
    "input": 'style="rounded,filled", fillcolor="#c7e9c0", color="#238b45"',
    "parameter": 'style="rounded,filled", fillcolor="#e5f5e0", color="#74c476"',
    "tangent": 'style="rounded,filled", fillcolor="#dadaeb", color="#54278f"',
    "backward": 'style="rounded,filled", fillcolor="#efedf5", color="#6a51a3"',
    "backward-only": 'style="rounded,filled", fillcolor="#fcfbfd", color="#9e9ac8"',
}


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _label(n: PlanNode) -> str:
    lines = [n.name, n.op]
    if n.shape or n.nbytes:
        lines.append(" ".join(filter(None, ["x".join(map(str, n.shape)), n.dtype,
                                            format_bytes(n.nbytes) if n.nbytes else ""])))
    if n.status in ("saved", "recomputed"):
        lines.append(n.status.upper() + (f": {n.reason}" if n.reason else ""))
    return "\\n".join(s.replace("\\", "\\\\").replace('"', '\\"') for s in lines)


def _drawn(plan: PlanData, parameters: bool) -> list[PlanNode]:
    return [n for n in plan.nodes if parameters or n.role is not Role.PARAMETER]


def to_dot(plan: PlanData, *, parameters: bool = False) -> str:
    """DOT text of the joint graph (see the module docstring)."""
    nodes = _drawn(plan, parameters)
    names = {n.name for n in nodes}
    status = {n.name: n.status for n in nodes}
    lines = [
        "digraph remat_plan {",
        "  rankdir=LR;",
        '  graph [fontname="Helvetica", fontsize=12, label="remat plan: saved values (blue) on the '
        'cut, recomputed ops (orange, dashed)", labelloc=t];',
        '  node [shape=box, fontname="Helvetica", fontsize=9];',
        '  edge [color="#969696", arrowsize=0.6];',
    ]
    for cluster, statuses in (("forward", FORWARD), ("backward", BACKWARD)):
        lines.append(f"  subgraph cluster_{cluster} {{")
        lines.append(f'    label="{cluster}"; color="#bdbdbd";')
        for n in nodes:
            if n.status in statuses:
                lines.append(f'    {_q(n.name)} [label="{_label(n)}", {_STYLE[n.status]}];')
        lines.append("  }")
    for n in nodes:
        for u in n.inputs:
            if u not in names:
                continue
            cut = status[u] == "saved" and n.status in BACKWARD
            rec = n.status == "recomputed"
            attrs = ' [color="#cb181d", penwidth=2]' if cut else (' [color="#d94801", style=dashed]' if rec else "")
            lines.append(f"  {_q(u)} -> {_q(n.name)}{attrs};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def have_dot() -> bool:
    """True when Graphviz's ``dot`` program is on PATH."""
    return shutil.which("dot") is not None


def render_svg(dot_text: str, *, timeout: float = 120.0) -> str:
    """SVG text rendered by Graphviz's ``dot``."""
    exe = shutil.which("dot")
    if exe is None:
        raise RematError("remat: rendering SVG needs Graphviz's `dot` program, which is not on PATH. "
                         "Install Graphviz (apt-get install graphviz), or write the .dot text instead.")
    run = subprocess.run([exe, "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        raise RematError(f"remat: `dot -Tsvg` failed with exit code {run.returncode}: {run.stderr.strip()}. "
                         "Please report this plan's DOT text.")
    return run.stdout
