"""``plan.to_json()``: a versioned JSON document of a plan, and its JSON Schema.

Schema version 1 (``SCHEMA`` below is the machine-readable form; bump ``VERSION`` on any
incompatible change). Top-level keys:

``version``      int, the schema version (1).
``graphs``       int, how many captured graphs the plan covers.
``fallback``     str or null: why planning failed and autograd's choice was kept instead.
``saved``        list of the values kept for the backward, in graph order. Each has ``name``
                 (fx node name), ``op`` (``aten.mm.default``, ``input`` or ``parameter``),
                 ``module`` (module path, ``""`` if unknown), ``shape`` (list of ints),
                 ``dtype``, ``bytes`` (0 for parameters and buffers: they live anyway),
                 ``reason`` (``min-cut boundary`` or the rule name) and ``source``
                 (``file:line``, ``""`` if unknown).
``recomputed``   list of the forward ops the backward computes again: ``name``, ``op``,
                 ``module``, ``source``, ``times`` (how many times the backward computes it:
                 2 for an op a nested-checkpoint plan recomputes twice).
``totals``       ``saved_tensors``, ``free_saved``, ``saved_bytes``, ``eager_saved_bytes``,
                 ``activation_bytes`` (bytes if everything were saved, null for a fallback;
                 see ``remat.report.totals``), ``recomputed_ops``, ``recompute_flops``,
                 ``recompute_seconds``, ``predicted_peak_bytes``, ``eager_peak_bytes``,
                 ``peak_floor_bytes``, ``measured_peak_bytes`` (0 unless a budget's step was
                 measured on CUDA).
``modules``      the rows of ``plan.summary()``: ``module``, ``blocks``, ``saved``,
                 ``saved_bytes``, ``recomputed``, ``reasons`` (object: reason -> count),
                 ``depth``.
``nodes``        every node of the joint graph in graph order: ``name``, ``op``, ``status``,
                 ``reason``, ``inputs``, ``shape``, ``dtype``, ``bytes``, ``module``,
                 ``source`` (omitted with ``nodes=False``).
``checkpoints``  list of str: the separators a checkpoint-segment plan never recomputes
                 through (``remat.core.segments``); empty for min-cut plans.
``nested``       list of str: a nested plan's inner checkpoints, recomputed from
                 ``checkpoints`` (``remat.planning.nesting``); empty for other plans.
``offloaded``    list of the saved values kept in host memory between the halves (``offload=``):
                 ``name``, ``bytes``, ``copy_out`` and ``copy_in`` (estimated [start, end]
                 seconds from the step's start), ``stall_seconds``, ``issue_seconds`` (the host's
                 time to issue its copies), ``reload_before`` (the
                 backward op the copy back is issued before), ``released_after`` (compiled:
                 the forward op its device copy is let go after; empty op by op); empty
                 without offload.
``budget_bytes`` int or null: the peak budget the plan was chosen under.
``notes``        list of str.
``compiled_for`` str: the inputs the graph was compiled for (``Plan.compiled_for``); empty
                 for ``explain``'s plans.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .summary import module_rows
from .totals import totals

if TYPE_CHECKING:
    from ..plan_data import PlanData

__all__ = ["VERSION", "SCHEMA", "to_dict", "to_json"]

VERSION = 1

_STR = {"type": "string"}
_INT = {"type": "integer", "minimum": 0}
_SHAPE = {"type": "array", "items": {"type": "integer"}}


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": sorted(props), "properties": props}


SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "remat plan",
    **_obj({
        "version": {"const": VERSION},
        "graphs": _INT,
        "fallback": {"type": ["string", "null"]},
        "saved": {"type": "array", "items": _obj({
            "name": _STR, "op": _STR, "module": _STR, "shape": _SHAPE, "dtype": _STR,
            "bytes": _INT, "reason": _STR, "source": _STR})},
        "recomputed": {"type": "array", "items": _obj({
            "name": _STR, "op": _STR, "module": _STR, "source": _STR, "times": {"type": "integer", "minimum": 1}})},
        "totals": _obj({
            "saved_tensors": _INT, "free_saved": _INT, "saved_bytes": _INT, "eager_saved_bytes": _INT,
            "activation_bytes": {"type": ["integer", "null"]}, "recomputed_ops": _INT,
            "recompute_flops": _INT, "recompute_seconds": {"type": "number"},
            "predicted_peak_bytes": _INT, "eager_peak_bytes": _INT, "peak_floor_bytes": _INT,
            "measured_peak_bytes": _INT}),
        "modules": {"type": "array", "items": _obj({
            "module": _STR, "blocks": _INT, "saved": _INT, "saved_bytes": _INT, "recomputed": _INT,
            "reasons": {"type": "object", "additionalProperties": _INT}, "depth": _INT})},
        "checkpoints": {"type": "array", "items": _STR},
        "nested": {"type": "array", "items": _STR},
        "offloaded": {"type": "array", "items": _obj({
            "name": _STR, "bytes": _INT, "copy_out": {"type": "array", "items": {"type": "number"}},
            "copy_in": {"type": "array", "items": {"type": "number"}}, "stall_seconds": {"type": "number"},
            "issue_seconds": {"type": "number"}, "reload_before": _STR, "released_after": _STR})},
        "budget_bytes": {"type": ["integer", "null"]},
        "notes": {"type": "array", "items": _STR},
        "compiled_for": _STR,
    }),
}
SCHEMA["properties"]["nodes"] = {"type": "array", "items": _obj({
    "name": _STR, "op": _STR, "status": {"enum": ["saved", "recomputed", "forward", "backward",
                                                   "backward-only", "input", "parameter", "tangent"]},
    "reason": _STR, "inputs": {"type": "array", "items": _STR}, "shape": _SHAPE, "dtype": _STR,
    "bytes": _INT, "module": _STR, "source": _STR})}


def to_dict(plan: PlanData, *, nodes: bool = True) -> dict[str, Any]:
    """The plan as plain data (see the module docstring for the schema)."""
    by_name = {n.name: n for n in plan.nodes}
    recomputed = []
    for name, op, k in zip(plan.recomputed, plan.recomputed_ops or ("",) * len(plan.recomputed), plan.times()):
        n = by_name.get(name)
        recomputed.append({"name": name, "op": op, "module": n.module if n else "",
                           "source": n.source if n else "", "times": k})
    out: dict[str, Any] = {
        "version": VERSION,
        "graphs": plan.graphs,
        "fallback": plan.fallback,
        "saved": [{"name": s.name, "op": s.op, "module": s.module, "shape": list(s.shape), "dtype": s.dtype,
                   "bytes": s.nbytes, "reason": s.reason, "source": s.source} for s in plan.saved],
        "recomputed": recomputed,
        "totals": asdict(totals(plan)),
        "modules": [{"module": r.module.strip(), "blocks": r.blocks, "saved": r.saved,
                     "saved_bytes": r.saved_bytes, "recomputed": r.recomputed,
                     "reasons": dict(r.reasons), "depth": r.depth} for r in module_rows(plan)],
        "checkpoints": list(plan.checkpoints),
        "nested": list(plan.nested),
        "offloaded": [{"name": o.name, "bytes": o.nbytes, "copy_out": list(o.copy_out), "copy_in": list(o.copy_in),
                       "stall_seconds": o.stall_seconds, "issue_seconds": o.issue_seconds,
                       "reload_before": o.reload_before,
                       "released_after": o.released_after} for o in plan.offloaded],
        "budget_bytes": plan.budget_bytes,
        "notes": list(plan.notes),
        "compiled_for": plan.compiled_for,
    }
    if nodes:
        out["nodes"] = [{"name": n.name, "op": n.op, "status": n.status, "reason": n.reason,
                         "inputs": list(n.inputs), "shape": list(n.shape), "dtype": n.dtype,
                         "bytes": n.nbytes, "module": n.module, "source": n.source} for n in plan.nodes]
    return out


def to_json(plan: PlanData, path: str | None = None, *, nodes: bool = True, indent: int | None = 2) -> str:
    """The plan as JSON text; also written to ``path`` when given."""
    text = json.dumps(to_dict(plan, nodes=nodes), indent=indent)
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return text
