"""What the rules decide for one joint graph before any cut: per value, whether it may not be
recomputed or may not be saved, and why (``Decisions``, of ``Reason``s).

A ``Reason`` is the text a plan prints (``matmul``, ``user rule `x` ``, ``graph input``...) and
its ``Kind``, the identity the planner acts on: a budget relaxes the ``COST`` ones (rules that
forbid recompute because it is slow, not because it is unsafe), nothing else. Plans carry the
text only (``SavedTensor.reason``, ``PlanNode.reason``).
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass

from ..analysis.joint_graph import JointGraph
from ..backends.base import Backend
from ..core.solver import Problem
from ..options import Options
from ..plan_data import Role
from ..policy import Decision, Rule, decide

__all__ = ["Kind", "Reason", "Decisions", "decisions", "GRAPH_INPUT", "PARAMETER", "MULTI_OUTPUT", "MIN_CUT",
           "CHECKPOINT", "INNER", "AGAIN"]


class Kind(enum.Enum):
    """Where a constraint on a value comes from."""

    INPUT = "input"
    """A graph input or parameter: nothing in the graph computes it."""
    MULTI_OUTPUT = "multi-output"
    """A multi-output op: its outputs are saved one by one, never the op's result."""
    RULE = "rule"
    """A built-in rule about correctness or storage (random op, side effect, view...)."""
    COST = "cost"
    """A built-in rule, or a backend's ``keep_saved``, that forbids recompute because it is slow:
    under a budget it gives way to the estimated recompute cost."""
    USER = "user"
    """A rule of the user's policy."""
    SEGMENT = "segment"
    """A candidate plan's structure: a checkpoint, a nested plan's inner checkpoint or copy."""


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a value is constrained: ``text`` as plans print it, ``kind`` as the planner reads it."""

    text: str
    kind: Kind

    def __str__(self) -> str:
        return self.text

    @classmethod
    def of_rule(cls, rule: Rule, user: bool) -> Reason:
        """The reason a policy rule gives: its name, or ``user rule `name` `` for one of the
        user's policy (``user``)."""
        if user:
            return cls(f"user rule `{rule.name}`", Kind.USER)
        return cls(rule.name, Kind.COST if rule.cost else Kind.RULE)


GRAPH_INPUT = Reason("graph input", Kind.INPUT)
PARAMETER = Reason("parameter", Kind.INPUT)
MULTI_OUTPUT = Reason("multi-output op (its outputs are saved one by one)", Kind.MULTI_OUTPUT)
MIN_CUT = "min-cut boundary"
"""The reason plans print for a value saved because the cut chose it (no rule forces it)."""
CHECKPOINT = Reason("checkpoint (segment boundary)", Kind.SEGMENT)
INNER = Reason("nested checkpoint (recomputed by the sweep)", Kind.SEGMENT)
AGAIN = Reason("recomputed again (nested checkpoint)", Kind.SEGMENT)


def _texts(reasons: dict[int, Reason]) -> dict[int, str]:
    return {i: r.text for i, r in reasons.items()}


@dataclass(frozen=True)
class Decisions:
    """Per value index of one joint graph: what may not be recomputed, what may not be saved,
    and the reason a plan prints for each value a rule or role constrains (``reasons``)."""

    no_recompute: dict[int, Reason]
    no_save: dict[int, Reason]
    reasons: dict[int, Reason]

    def relaxed(self) -> Decisions:
        """These decisions under a budget: the cost rules give way (their reasons stay printed)."""
        kept = {i: r for i, r in self.no_recompute.items() if r.kind is not Kind.COST}
        return Decisions(kept, self.no_save, self.reasons)

    def cost_ruled(self, jg: JointGraph, recomputed: tuple[str, ...]) -> tuple[str, ...]:
        """The values of ``recomputed`` (names) that these decisions' cost rules keep saved: what
        a relaxed plan recomputes that the default plan may not."""
        ruled = {jg.facts[i].name for i, r in self.no_recompute.items() if r.kind is Kind.COST}
        return tuple(n for n in recomputed if n in ruled)

    def problem(self, jg: JointGraph) -> Problem:
        """The min-cut problem of ``jg`` under these decisions, recompute time as its cost."""
        return jg.problem(_texts(self.no_recompute), _texts(self.no_save), recompute_cost=jg.recompute_seconds)

    def saved_reason(self, i: int) -> str:
        """What a plan saving value ``i`` prints as the reason."""
        return self.reasons[i].text if i in self.no_recompute else MIN_CUT

    def node_reason(self, i: int) -> str:
        """What a plan prints as the rule that constrained value ``i`` (``""``: none)."""
        r = self.reasons.get(i)
        return r.text if r is not None else ""


def decisions(jg: JointGraph, options: Options, backend: Backend) -> Decisions:
    """The graph's inputs, the policy's rules, then what ``backend`` runs faster saved
    (``Backend.keep_saved``: cost rules). Warns of a policy rule that matched no op."""
    no_recompute: dict[int, Reason] = {}
    no_save: dict[int, Reason] = {}
    reasons: dict[int, Reason] = {}
    used: set[str] = set()
    for i, (node, op, facts) in enumerate(zip(jg.nodes, jg.ops, jg.facts)):
        if facts.role in (Role.INPUT, Role.PARAMETER):
            no_recompute[i] = reasons[i] = PARAMETER if facts.role is Role.PARAMETER else GRAPH_INPUT
            continue
        if isinstance(node.meta.get("val"), (tuple, list)):
            no_save[i] = MULTI_OUTPUT
        decision, rule = decide(op, options.policy, used)
        if rule is None:
            continue
        reason = reasons[i] = Reason.of_rule(rule, user=rule in options.policy)
        if decision is Decision.MUST_SAVE:
            no_recompute[i] = reason
        elif decision is Decision.MUST_RECOMPUTE:
            no_save.setdefault(i, reason)
    if jg.nodes:
        index = {n: i for i, n in enumerate(jg.nodes)}
        graph = [n for n in jg.nodes[0].graph.nodes if n.op != "output"]
        for node, text in backend.keep_saved(graph).items():
            i = index.get(node)
            if i is not None and i in jg.forward and i not in no_save and i not in no_recompute:
                no_recompute[i] = reasons[i] = Reason(text, Kind.COST)
    for rule in options.policy:
        if rule.name not in used:
            warnings.warn(f"remat: policy rule `{rule.name}` matched no op in this graph; "
                          "check its ops=/modules= patterns.", stacklevel=2)
    return Decisions(no_recompute, no_save, reasons)
