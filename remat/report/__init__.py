"""Reports of a plan: the table ``print(plan)`` shows, the per-module summary, why-queries, JSON,
Graphviz DOT, a self-contained HTML file, and the frontier's table and plot. ``Plan``'s and
``Frontier``'s methods (``remat.plan``) delegate here; each concept has its own module. The
renderers read the plan's data (``remat.plan_data``) and never import ``remat.plan``."""

from .dot import have_dot, render_svg, to_dot
from .frontier import plot as plot_frontier
from .frontier import render as frontier_table
from .html import render_html, to_html
from .schema import SCHEMA, VERSION, to_dict, to_json
from .summary import ModuleRow, module_rows
from .summary import render as summary
from .svg import draw_svg
from .table import render as table
from .totals import Totals, activation_bytes, format_flops, totals
from .why import why

__all__ = [
    "table",
    "summary",
    "module_rows",
    "ModuleRow",
    "totals",
    "Totals",
    "activation_bytes",
    "format_flops",
    "why",
    "to_dict",
    "to_json",
    "SCHEMA",
    "VERSION",
    "to_dot",
    "render_svg",
    "have_dot",
    "draw_svg",
    "to_html",
    "render_html",
    "frontier_table",
    "plot_frontier",
]
