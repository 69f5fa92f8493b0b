"""``plan.explain(name)``: why one value or op was saved, recomputed, or neither, in a sentence
that names the rule or the cut.

``name`` is a node name of the joint graph (``mul_3``; ``g1.mul_3`` in a plan combined from
several graphs) or an op overload (``aten.mul.Tensor``, ``aten.mul``), which explains every
node of that op in one line each.
"""

from __future__ import annotations

import difflib

from ..errors import RematError
from ..plan_data import PlanData, PlanNode, Role, SavedTensor
from ..policy import BUILTIN_RULES
from ..units import format_bytes

__all__ = ["why", "rule_description"]

_LIST = 4  # names listed before "and N more"


def rule_description(reason: str) -> str:
    """The description of a built-in rule, ``""`` for user rules and others."""
    for rule in BUILTIN_RULES:
        if rule.name == reason:
            return rule.description
    return ""


def _names(names: list[str]) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:_LIST])
    return shown + (f" and {len(names) - _LIST} more" if len(names) > _LIST else "")


def _what(n: PlanNode) -> str:
    where = f" in module `{n.module}`" if n.module else ""
    at = f" ({n.source})" if n.source else ""
    size = f", {format_bytes(n.nbytes)}" if n.nbytes else ""
    return f"`{n.name}` ({n.op}{where}{size}){at}"


def _rule(reason: str) -> str:
    """``rule `matmul` (matmuls ... time)`` or ``user rule `x` ``."""
    if reason.startswith("user rule"):
        return reason
    desc = rule_description(reason)
    return f"rule `{reason}`" + (f" ({desc})" if desc else "")


class _Graph:
    def __init__(self, plan: PlanData):
        self.plan = plan
        self.by_name = {n.name: n for n in plan.nodes}
        self.users: dict[str, list[str]] = {n.name: [] for n in plan.nodes}
        for n in plan.nodes:
            for u in n.inputs:
                if u in self.users:
                    self.users[u].append(n.name)
        self.saved = {s.name: s for s in plan.saved}

    def readers(self, name: str, statuses: tuple[str, ...]) -> list[str]:
        return [u for u in self.users.get(name, []) if self.by_name[u].status in statuses]

    def recomputed_from(self, name: str) -> list[str]:
        """The saved values, inputs and parameters the backward recomputes ``name`` from."""
        out, seen, stack = [], {name}, [name]
        while stack:
            for u in self.by_name[stack.pop()].inputs:
                if u in seen or u not in self.by_name:
                    continue
                seen.add(u)
                if self.by_name[u].status == "recomputed":
                    stack.append(u)
                else:
                    out.append(u)
        order = {n: i for i, n in enumerate(self.by_name)}
        return sorted(out, key=order.__getitem__)


def _saved(g: _Graph, n: PlanNode, s: SavedTensor) -> str:
    rec = g.readers(n.name, ("recomputed",))
    bw = g.readers(n.name, ("backward", "backward-only"))
    uses = ([f"recomputes {_names(rec)} from it"] if rec else []) + ([f"reads it in {_names(bw)}"] if bw else [])
    tail = ("; the backward " + " and ".join(uses)) if uses else ""
    if s.role is Role.PARAMETER:
        return f"{_what(n)} is a parameter or buffer the backward reads: saved at no cost, it lives anyway{tail}."
    if s.reason == "min-cut boundary":
        return (f"{_what(n)} is saved by the min-cut (no rule forces it): it belongs to the cheapest set "
                f"of values, in bytes, from which the backward can recompute everything it needs, and "
                f"keeping its {format_bytes(s.nbytes)} costs less than the alternatives{tail}.")
    if s.reason == "graph input":
        return f"{_what(n)} is a graph input the backward reads; it cannot be recomputed, so it is saved{tail}."
    return f"{_what(n)} is saved: {_rule(s.reason)} forbids recomputing it, and the backward needs it{tail}."


def _recomputed(g: _Graph, n: PlanNode) -> str:
    src = g.recomputed_from(n.name)
    frm = f" from {_names(src)}" if src else ""
    if n.reason.startswith("user rule") or n.reason in ("view",):
        return f"{_what(n)} is recomputed in the backward{frm}: {_rule(n.reason)} forbids saving it."
    return (f"{_what(n)} is recomputed in the backward{frm}: the min-cut found recomputing it "
            f"cheaper in bytes than saving its {format_bytes(n.nbytes)}.")


def _node(g: _Graph, n: PlanNode) -> str:
    if n.name in g.saved:
        return _saved(g, n, g.saved[n.name])
    rule = f"; {_rule(n.reason)} applies to it" if n.reason and n.reason not in ("parameter", "graph input") else ""
    st = n.status
    if st == "recomputed":
        return _recomputed(g, n)
    if st == "forward":
        return (f"{_what(n)} is computed in the forward only and not saved: the backward needs neither it "
                f"nor anything recomputed from it{rule}.")
    if st == "backward-only":
        src = [u for u in n.inputs if u in g.by_name and g.by_name[u].status != "tangent"]
        frm = f" from {_names(src)}" if src else ""
        return (f"{_what(n)} is computed in the backward{frm}, only for the backward: the forward never "
                f"computes it{rule}.")
    if st == "backward":
        return f"{_what(n)} is part of the backward: it depends on the incoming gradients."
    if st == "tangent":
        return f"`{n.name}` is an incoming gradient (tangent) of the backward."
    if st == "input":
        return f"{_what(n)} is a graph input the backward does not read, so nothing keeps it for the backward."
    if st == "parameter":
        return f"{_what(n)} is a parameter or buffer the backward does not read."
    return f"{_what(n)} has status `{st}`{rule}."  # pragma: no cover - every status is handled above


def _by_op(g: _Graph, op: str) -> list[PlanNode]:
    return [n for n in g.plan.nodes if n.op == op or n.op.rsplit(".", 1)[0] == op]


def why(plan: PlanData, name: str) -> str:
    """Why ``name`` (a node name or an op) was saved, recomputed, or neither."""
    if not isinstance(name, str):
        raise RematError(f"remat: plan.explain expects a node name (str) such as 'mul_3', got "
                         f"{type(name).__name__}. Pass one of the names in print(plan).")
    if plan.fallback:
        return (f"This plan fell back to saving what autograd saves ({plan.fallback}); "
                f"nothing was decided about `{name}`.")
    if not plan.nodes:
        raise RematError("remat: plan.explain needs a plan with nodes (from remat.explain or "
                         "remat.compiled_plans), got a plan without any. Re-create it with remat.explain.")
    g = _Graph(plan)
    if name in g.by_name:
        return _node(g, g.by_name[name])
    nodes = _by_op(g, name)
    if nodes:
        counts: dict[str, list[str]] = {}
        for n in nodes:
            counts.setdefault(n.status, []).append(n.name)
        parts = [f"{st} x{len(ns)} ({_names(ns)})" for st, ns in counts.items()]
        return f"{name}: {len(nodes)} node{'s' if len(nodes) > 1 else ''}: " + "; ".join(parts) + \
            ". Ask about one node by name for the reason."
    close = difflib.get_close_matches(name, list(g.by_name), n=3)
    hint = f" Close matches: {', '.join(close)}." if close else ""
    raise RematError(f"remat: plan.explain expects the name of a node of this plan's graph (such as "
                     f"`{plan.nodes[-1].name}`) or an op (such as `aten.mul.Tensor`), got `{name}`.{hint} "
                     "print(plan) and plan.nodes list the names.")
