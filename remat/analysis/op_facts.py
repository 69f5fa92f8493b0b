"""What one op of a joint graph is, from its target, schema and tensor metadata alone
(``remat.policy.OpFacts``, computed once per op by ``op_facts``): the facts graph analysis
(``remat.analysis.joint_graph``), the normalization rule and Inductor's lowering facts
(``remat.backends.inductor.lowering``) read; and the view facts: which ops alias their input, and
the storage a view chain aliases."""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from .. import compat
from ..policy import OpFacts, OpInfo
from . import cost
from .ops import (
    ATTENTION_OPS,
    DATA_DEPENDENT_OPS,
    MATMUL_OPS,
    MUTATING_HOPS,
    RANDOM_OPS,
    REDUCTION_OPS,
    REPLAYABLE_OPS,
    is_collective,
    op_name,
    packet,
    schema_arg,
)

__all__ = ["NO_FACTS", "op_facts", "stops_free_recompute", "through_getitem", "op_info",
           "tensor_inputs", "returns_alias", "view_root", "ALIAS_NAMES", "aliases_by_name"]


NO_FACTS = OpFacts()
"""The facts of a graph input or constant."""


def op_facts(node: fx.Node, op: str | None = None) -> OpFacts:
    """The facts of one ``call_function`` node; ``op`` is its ``op_name``, if known."""
    op = op_name(node) if op is None else op
    t = node.target
    pk = packet(op)
    attention = pk in ATTENTION_OPS or op in ATTENTION_OPS
    if isinstance(t, compat.OpOverload):
        random = torch.Tag.nondeterministic_seeded in t.tags or pk in RANDOM_OPS
        view, mutating, collective = returns_alias(t), t._schema.is_mutable, is_collective(t)
    else:
        random, view, mutating, collective = op in RANDOM_OPS, False, op in MUTATING_HOPS, False
    if attention:
        # Attention kernels are tagged as seeded for their optional dropout.
        random = _attention_dropout(node) > 0
    # Note [Replayed random ops]; where torch cannot replay, random ops are saved (versions.HOOKS["rng_replay"])
    replayable = random and (attention or pk in REPLAYABLE_OPS) and _default_generator(node) and compat.can_replay_rng()
    reduction = pk in REDUCTION_OPS
    return OpFacts(is_view=view, is_random=random, is_replayable=replayable, is_mutating=mutating,
                   is_collective=collective,
                   is_data_dependent=pk in DATA_DEPENDENT_OPS or op in DATA_DEPENDENT_OPS,
                   is_matmul=pk in MATMUL_OPS, is_attention=attention, is_reduction=reduction,
                   reduction_ratio=_reduction_ratio(node) if reduction else 0.0)


def _reduction_ratio(node: fx.Node) -> float:
    ins = tensor_inputs(node)
    out_numel = cost.numel(node.meta.get("val"))
    in_numel = cost.numel(ins[0].meta.get("val")) if ins else 0
    return in_numel / max(out_numel, 1)


def _default_generator(node: fx.Node) -> bool:
    """Whether ``node`` draws from its device's default generator (no ``generator`` argument)."""
    return node.kwargs.get("generator") is None


def _attention_dropout(node: fx.Node) -> float:
    return float(schema_arg(node, "dropout_p", 0.0) or 0.0)


_FIELDS = dataclasses.fields(OpFacts)


def stops_free_recompute(f: OpFacts) -> bool:
    """A matmul, attention, random, mutating, collective or data-dependent op: recompute
    through it is not free (the normalization rule's paths stop at it)."""
    return f.is_matmul or f.is_attention or f.unsafe_to_recompute is not None


def through_getitem(own: OpFacts, parent: OpFacts, parent_is_statistic: bool) -> OpFacts:
    """A getitem's facts as rules see them: it takes one output of ``parent``, so it is random,
    mutating, a matmul, a view ... when ``parent`` is, and has ``parent``'s reduction ratio when
    ``parent`` is a statistic (``remat.analysis.normalization``)."""
    flags = {f.name: getattr(own, f.name) or getattr(parent, f.name) for f in _FIELDS if f.name.startswith("is_")}
    ratio = parent.reduction_ratio if parent_is_statistic and parent.reduction_ratio else own.reduction_ratio
    return OpFacts(**flags, reduction_ratio=ratio)


def op_info(facts: OpFacts, *, name: str, op: str, module: str, forward: bool,
            is_normalization_boundary: bool, written_as: str = "") -> OpInfo:
    """The ``OpInfo`` rules see of an op: its ``facts`` and its place in the graph."""
    return OpInfo(**{f.name: getattr(facts, f.name) for f in _FIELDS}, name=name, op=op, module=module,
                  forward=forward, is_normalization_boundary=is_normalization_boundary,
                  written_as=written_as)


def tensor_inputs(node: fx.Node) -> list[fx.Node]:
    return [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]


# --- views ---------------------------------------------------------------------------------------


def returns_alias(t: compat.OpOverload) -> bool:
    """Whether the op's schema says its (first) result aliases an input, without writing it."""
    rets = t._schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def view_root(node: fx.Node) -> fx.Node:
    """The node whose storage a view (chain) aliases."""
    while node.op == "call_function":
        t = node.target
        if t is operator.getitem and isinstance(node.args[0], fx.Node):
            parent = node.args[0].target
            if isinstance(parent, compat.OpOverload) and returns_alias(parent):
                node = node.args[0].args[0]
                continue
            return node
        is_view = isinstance(t, compat.OpOverload) and returns_alias(t)
        if is_view and node.args and isinstance(node.args[0], fx.Node):
            node = node.args[0]
            continue
        return node
    return node


ALIAS_NAMES = frozenset({"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "squeeze",
                         "unsqueeze", "alias", "slice", "select", "as_strided", "unflatten", "flatten"})
"""Ops, by name, whose result shares their first argument's storage (``aliases_by_name``)."""


def aliases_by_name(node: fx.Node) -> bool:
    """Whether ``node``'s op is named in ``ALIAS_NAMES`` (any overload, any namespace). Not the
    schema's test (``returns_alias``, which graph analysis uses): it also counts ``_unsafe_view``,
    whose schema declares no alias, and leaves out multi-output views (``split``, ``unbind``) and
    rarer ones (``diagonal``, ``unfold``). Used by DDP's bucket split
    (``remat.capture.buckets``), which asks whether a value is a view of one the plan saves."""
    name = getattr(node.target, "__name__", "")
    return name.split(".")[0] in ALIAS_NAMES
