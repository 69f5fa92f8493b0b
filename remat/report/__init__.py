"""Reports of a plan: the per-module summary, why-queries, JSON, Graphviz DOT, and a
self-contained HTML file. ``Plan``'s methods (``summary``, ``explain``, ``to_json``,
``to_dot``, ``to_html``) delegate here; each concept has its own module."""

from .dot import have_dot, render_svg, to_dot
from .html import render_html, to_html
from .schema import SCHEMA, VERSION, to_dict, to_json
from .summary import ModuleRow, module_rows
from .summary import render as summary
from .svg import draw_svg
from .totals import Totals, activation_bytes, format_flops, totals
from .why import why

__all__ = [
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
]
