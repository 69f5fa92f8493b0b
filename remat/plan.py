"""Plan and Frontier: what one joint graph saves for the backward and what it recomputes, and
the trade-offs a budget chooses among; printable, comparable, exportable.

The data is ``remat.plan_data`` (``PlanData``, ``FrontierData`` and the value types, re-exported
here); the renderers are ``remat.report``. This module joins them: each method below is one call
into ``remat.report``, which imports only ``remat.plan_data`` (see its docstring for why the
two modules are two)."""

from __future__ import annotations

from typing import Any

from . import report
from .plan_data import (
    MEASURED,
    READ,
    FrontierData,
    NodeFacts,
    PlanData,
    PlanNode,
    Role,
    SavedTensor,
    Status,
    Tradeoff,
    ValueInfo,
)
from .report.totals import Totals
from .units import format_bytes, format_scaled

__all__ = ["Role", "Status", "ValueInfo", "NodeFacts", "SavedTensor", "PlanNode", "Plan", "Frontier", "Tradeoff",
           "READ", "MEASURED", "format_bytes", "format_scaled"]


class Plan(PlanData):
    """The decision for one captured graph (or several, combined; see ``Plan.combine``): the
    fields of ``remat.plan_data.PlanData``, with its reports (rendering lives in ``remat.report``)."""

    def __str__(self) -> str:
        return report.table(self)

    def totals(self) -> Totals:
        """Saved bytes, eager's saved bytes, bytes if everything were saved, recomputed ops and
        their estimated FLOPs (see ``remat.report.totals``)."""
        return report.totals(self)

    def summary(self) -> str:
        """Saved and recomputed values rolled up per module, identical blocks collapsed
        (``layers.0..11 (x12)``), with the totals."""
        return report.summary(self)

    def explain(self, name: str) -> str:
        """Why the value or op ``name`` (``"mul_3"``, ``"aten.mul.Tensor"``) was saved,
        recomputed, or neither, in a sentence naming the rule or the cut."""
        return report.why(self, name)

    def to_dict(self, *, nodes: bool = True) -> dict[str, Any]:
        """The plan as plain data, in the schema of ``to_json``."""
        return report.to_dict(self, nodes=nodes)

    def to_json(self, path: str | None = None, *, nodes: bool = True) -> str:
        """A versioned JSON document (schema: ``remat.report.schema``); written to ``path`` if given."""
        return report.to_json(self, path, nodes=nodes)

    def to_dot(self, path: str | None = None, *, parameters: bool = False) -> str:
        """Graphviz DOT text of the joint graph: forward and backward, saved values on the cut,
        recomputed ops marked. Written to ``path`` if given; a ``.svg`` path is rendered with
        Graphviz's ``dot`` (which must be installed)."""
        text = report.to_dot(self, parameters=parameters)
        if path is not None:
            out = report.render_svg(text) if str(path).endswith(".svg") else text
            with open(path, "w", encoding="utf-8") as f:
                f.write(out)
        return text

    def to_html(self, path: str, *, frontier: Any = None, title: str = "remat plan") -> str:
        """Write a self-contained HTML report (table, graph drawing, and the frontier plot when
        ``frontier`` (with ``.plot(path)``) is given) to ``path``; returns the path."""
        return report.to_html(self, path, frontier=frontier, title=title)


class Frontier(FrontierData):
    """The memory/recompute frontier of one graph (the fields of
    ``remat.plan_data.FrontierData``), printable and plottable (``remat.report.frontier``)."""

    def __str__(self) -> str:
        return report.frontier_table(self)

    def plot(self, path: str) -> str:
        """Predicted peak (MiB) against estimated recompute time (ms), as PNG or SVG by the
        file's extension. Needs matplotlib."""
        return report.plot_frontier(self, path)
