"""Which ops may be recomputed: the Decision enum, built-in rules, and user rules.

A rule is a small named predicate over an :class:`OpInfo` (a torch-free description of one op
of the joint graph) with a :class:`Decision`. Built-in rules encode what is unsafe or
unprofitable to recompute; user rules (``remat.save(...)``, ``remat.recompute(...)``, or any
callable ``OpInfo -> Decision | None``) override the profitable ones. Unsafe ops (random,
side effects, collectives, data-dependent) are never recomputed, whatever a user rule says; a
random op whose draws can be replayed (``OpFacts.is_replayable``, Note [Replayed random ops] in
``remat.capture.rng_replay``) is not unsafe, only slow: it is recomputed under a budget.

See Note [Normalization boundary] for the one rule that is about where recompute stops.
"""

from __future__ import annotations

import difflib
import enum
import fnmatch
import inspect
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from .errors import PolicyError
from .logs import user_frame

__all__ = [
    "Decision",
    "MUST_SAVE",
    "MUST_RECOMPUTE",
    "OpFacts",
    "OpInfo",
    "Rule",
    "save",
    "recompute",
    "BUILTIN_RULES",
    "Policy",
    "normalize_policy",
    "decide",
]


class Decision(enum.Enum):
    MUST_SAVE = "must_save"
    """Never recompute this op in the backward; save its output if the backward needs it."""
    MUST_RECOMPUTE = "must_recompute"
    """Never save this op's output; recompute it in the backward if needed."""


MUST_SAVE = Decision.MUST_SAVE
MUST_RECOMPUTE = Decision.MUST_RECOMPUTE


@dataclass(frozen=True, slots=True, kw_only=True)
class OpFacts:
    """What one op is, from its target, schema and tensor metadata alone (no torch objects);
    computed once per op by ``remat.analysis.op_facts.op_facts``."""

    is_view: bool = False
    is_random: bool = False
    is_replayable: bool = False
    """A random op that runs as a kernel of its own and draws from its device's default
    generator alone (attention with dropout, ``native_dropout``): recomputed, it replays the
    generator state it drew from in the forward, saved there (Note [Replayed random ops])."""
    is_mutating: bool = False
    is_collective: bool = False
    is_data_dependent: bool = False
    is_matmul: bool = False
    is_attention: bool = False
    is_reduction: bool = False
    """A reduction op (``sum``, ``amax``, ``var_mean`` ...), whatever its ``reduction_ratio``."""
    reduction_ratio: float = 0.0
    """Input elements per output element for reductions; 0 for other ops."""

    @property
    def unsafe_to_recompute(self) -> str | None:
        """The reason recomputing this op would change results or side effects, if any."""
        if self.is_random and not self.is_replayable:
            return "random op"
        if self.is_mutating:
            return "side effect"
        if self.is_collective:
            return "collective"
        if self.is_data_dependent:
            return "data-dependent"
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class OpInfo(OpFacts):
    """What a rule sees of one op of the joint graph (no torch objects): its ``OpFacts`` and
    its place in the graph."""

    name: str
    """The fx node name, e.g. ``"mm_3"``."""
    op: str
    """Overload name, e.g. ``"aten.mm.default"``; ``""`` for graph inputs."""
    module: str
    """Module path of the op in the user's model, e.g. ``"layers.0.mlp.fc1"``; ``""`` if unknown."""
    forward: bool
    """True if the forward computes this op (it is an ancestor of a forward output)."""
    is_normalization_boundary: bool = False
    written_as: str = ""
    """The op the user wrote, where decompositions split it and this op produces its value (the
    last ``aten.mul.Tensor`` of a decomposed ``aten.gelu.default``); ``""`` otherwise (Note
    [Rules match the op the user wrote])."""

    @property
    def packet(self) -> str:
        """``"aten.mm"`` for ``"aten.mm.default"``."""
        return _packet(self.op)

    def names(self) -> tuple[str, ...]:
        """The names an ``ops=`` pattern is matched against: the overload and packet of the op,
        and of the op the user wrote (``written_as``)."""
        names = (self.op, self.packet)
        return names + (self.written_as, _packet(self.written_as)) if self.written_as else names


def _packet(op: str) -> str:
    parts = op.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else op


# Note [Rules match the op the user wrote]
# Inductor's decompositions (which both backends trace the joint graph with) split ops before
# planning: ``aten.gelu`` becomes mul, erf, add, mul. A rule names the op as the user wrote it
# (``remat.save(ops="aten.gelu")``), so each decomposed node keeps the op it came from
# (``meta["original_aten"]``, ``remat.analysis.provenance.decomposed_outputs``), and the node that
# produces the value the user's op returned, the last of its decomposition that anything else
# reads, answers to that op's name too (``OpInfo.written_as``). Saving the user's op saves that
# value; recomputing it recomputes that value (its intermediates follow the cut as before).


Predicate = Callable[[OpInfo], object]


@dataclass(frozen=True, slots=True)
class Rule:
    """A named rule. With ``predicate``, the predicate returns a Decision or None; otherwise
    the rule applies ``decision`` to ops matching any of ``ops`` (fnmatch patterns over the
    overload name ``aten.mm.default`` or packet ``aten.mm``, or those of the op the user wrote:
    ``OpInfo.written_as``) and any of ``modules`` (fnmatch
    patterns over the module path). An empty ``ops`` or ``modules`` matches everything."""

    name: str
    decision: Decision | None = None
    ops: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    predicate: Predicate | None = None
    description: str = ""
    cost: bool = False
    """A built-in rule that forbids recompute because it is slow, not because it is unsafe: under
    a budget it gives way to the estimated recompute cost."""

    def apply(self, op: OpInfo) -> Decision | None:
        if self.predicate is not None:
            out = self.predicate(op)
            if out is None or isinstance(out, Decision):
                return out
            raise PolicyError(
                f"remat: policy rule `{self.name}` returned {out!r} ({type(out).__name__}) for op "
                f"{op.name} ({op.op}); expected remat.MUST_SAVE, remat.MUST_RECOMPUTE or None. "
                "Fix the rule's return value."
            )
        if self.ops and not any(fnmatch.fnmatchcase(n, p) for n in op.names() for p in self.ops):
            return None
        if self.modules and not any(fnmatch.fnmatchcase(op.module, p) for p in self.modules):
            return None
        return self.decision

    def __reduce__(self) -> tuple[type[Rule], tuple[object, ...]]:
        """Pickling a rule (with the options of a pickled remat-wrapped model) pickles its
        predicate: one pickle cannot save (a lambda, a nested function) raises a ``remat:`` error
        naming the rule, rather than pickle's error about a function. Copies share the rule."""
        if self.predicate is not None:
            try:
                pickle.dumps(self.predicate)
            except Exception as e:  # noqa: BLE001 - pickle raises PicklingError, TypeError or AttributeError
                raise PolicyError(
                    f"remat: pickling policy rule `{self.name}` needs its function pickled, and pickle cannot save "
                    f"it ({type(e).__name__}: {e}). Expected a function defined at the top level of a module; "
                    "define the rule there, or save model.state_dict() and call remat.checkpoint again after "
                    "loading it."
                ) from None
        return Rule, tuple(getattr(self, f.name) for f in fields(self))

    def __copy__(self) -> Rule:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Rule:
        return self


def _unknown_op(pattern: str) -> str | None:
    """Why an op pattern without wildcards names no op in torch's registry (``torch.ops``), or
    None if it names one: a packet ``aten.gelu``, an overload ``aten.mm.default``, a higher-order
    op ``higher_order.flex_attention``, or a word that is not an ATen op's name (``getitem``)."""
    import torch  # the registry; policy's data stays torch-free

    parts = pattern.split(".")
    if len(parts) == 1:
        return f"it has no namespace (did you mean 'aten.{pattern}'?)" if hasattr(torch.ops.aten, pattern) else None
    if len(parts) > 3:
        return "an op name has at most three parts (namespace.op.overload)"
    space = getattr(torch.ops, parts[0])
    try:
        packet = getattr(space, parts[1])
    except (AttributeError, RuntimeError):
        close = difflib.get_close_matches(parts[1], dir(space), n=1)
        hint = f" (did you mean '{parts[0]}.{close[0]}'?)" if close else ""
        return f"torch.ops.{parts[0]} has no op {parts[1]!r}{hint}"
    overloads = packet.overloads() if hasattr(packet, "overloads") else []
    if len(parts) == 3 and parts[2] not in overloads:
        return f"{parts[0]}.{parts[1]} has no overload {parts[2]!r} (it has {', '.join(overloads) or 'none'})"
    return None


def _check_ops(ops: tuple[str, ...]) -> None:
    for p in ops:
        why = None if any(c in p for c in "*?[") else _unknown_op(p)
        if why is not None:
            raise PolicyError(
                f"remat: policy op pattern {p!r} names no op: {why}. Expected an op as the joint graph "
                "names it, such as 'aten.gelu' or 'aten.mm.default' (a pattern with a wildcard, 'aten.gelu*', "
                "is not checked). Fix the name, or load the library that defines the op first."
            )


def _rule(decision: Decision, ops, modules, name: str | None) -> Rule:
    ops = (ops,) if isinstance(ops, str) else tuple(ops)
    modules = (modules,) if isinstance(modules, str) else tuple(modules)
    for p in (*ops, *modules):
        if not isinstance(p, str):
            raise PolicyError(f"remat: op and module patterns must be strings, got {p!r}.")
    _check_ops(ops)
    if not ops and not modules:
        raise PolicyError(
            "remat: a rule needs ops=... or modules=... patterns, got neither. "
            "Example: remat.save(ops='aten.gelu') or remat.recompute(modules='layers.*.mlp')."
        )
    if name is None:
        name = f"{decision.value}(" + ", ".join(ops + modules) + ")"
    return Rule(name=name, decision=decision, ops=ops, modules=modules)


def save(*, ops: str | Sequence[str] = (), modules: str | Sequence[str] = (), name: str | None = None) -> Rule:
    """A rule that saves (never recomputes) matching ops, e.g. ``save(ops="aten.gelu")``."""
    return _rule(Decision.MUST_SAVE, ops, modules, name)


def recompute(
    *, ops: str | Sequence[str] = (), modules: str | Sequence[str] = (), name: str | None = None
) -> Rule:
    """A rule that recomputes (never saves) matching ops, e.g. ``recompute(modules="layers.*.mlp.*")``."""
    return _rule(Decision.MUST_RECOMPUTE, ops, modules, name)


# Note [Normalization boundary]
# A min-cut that only counts bytes will recompute a whole deep network from its input when
# nothing but pointwise ops separate its layers: after every layer norm's statistics are saved
# (they are tiny), layer k's input is a pointwise function of layer 0's input, so saving one
# tensor "suffices". The backward would then hold every recomputed layer from the start of the
# backward until that layer's gradient, which saves nothing at peak and recomputes the deepest
# layers many times under fusion. The rule below stops recompute at each op that applies a
# statistic (a reduction's output) to a full tensor when a path of freely recomputable ops leads
# from it into the next reduction: the last step of a layer/RMS norm or softmax whose result
# feeds the next normalisation directly. (Where a matmul or attention lies on every such path,
# as in a transformer block, the matmul's saved output already bounds the chain and no boundary
# is needed.) If the op's only user is a cast to a narrower dtype, the cast is the boundary.
# The next reduction must belong to a *next* normalisation: one whose statistic is applied to a
# value that is not computed from the op alone (a softmax's sum, after its max is subtracted, is
# the same normalisation; a layer's norm, after the residual add, is the next), and whose
# statistic is applied to a tensor at all (a loss summed to a scalar ends the work). Without that
# an LM loss's log-softmax saved its float32 probabilities, twice the logits' bytes, where
# torch.compile saves the logits and two row statistics.


def _builtin(name: str, decision: Decision, predicate: Predicate, description: str, cost: bool = False) -> Rule:
    return Rule(name=name, decision=decision, predicate=lambda op: decision if predicate(op) else None,
                description=description, cost=cost)


BUILTIN_RULES: tuple[Rule, ...] = (
    _builtin("view", MUST_RECOMPUTE, lambda op: op.is_view,
             "a view keeps its base's storage alive; recomputing it from the base is free"),
    _builtin("random op", MUST_SAVE, lambda op: op.forward and op.is_random and not op.is_replayable,
             "recomputing would draw fresh random numbers and give wrong gradients"),
    _builtin("side effect", MUST_SAVE, lambda op: op.forward and op.is_mutating,
             "mutations and side effects must happen exactly once"),
    _builtin("collective", MUST_SAVE, lambda op: op.forward and op.is_collective,
             "collectives are never recomputed (communication, and every rank must agree)"),
    _builtin("data-dependent", MUST_SAVE, lambda op: op.forward and op.is_data_dependent,
             "outputs that depend on data values (indices, sizes) are saved"),
    _builtin("matmul", MUST_SAVE, lambda op: op.forward and op.is_matmul,
             "matmuls and convolutions are compute-bound: recomputing costs real time", cost=True),
    _builtin("attention", MUST_SAVE, lambda op: op.forward and op.is_attention,
             "attention kernels are compute-bound: recomputing costs real time (with dropout, it replays "
             "the generator state the forward drew from)", cost=True),
    _builtin("replayed random op", MUST_SAVE, lambda op: op.forward and op.is_replayable,
             "recomputing replays the generator state the forward drew from (saved there), so it runs "
             "again: recomputed only under a budget", cost=True),
    _builtin("reduction", MUST_SAVE, lambda op: op.forward and op.reduction_ratio >= 4,
             "a reduction's output is small and it cannot be fused into its consumers", cost=True),
    _builtin("normalization boundary", MUST_SAVE,
             lambda op: op.forward and op.is_normalization_boundary,
             "keeps recompute within one layer (see Note [Normalization boundary])", cost=True),
)

UNSAFE_RULES = frozenset({"random op", "side effect", "collective", "data-dependent"})

Policy = tuple[Rule, ...]


def _check_signature(fn: Callable[..., object]) -> None:
    """A callable rule is called as ``rule(op)``: reject one that cannot take exactly that, when
    ``checkpoint`` is called rather than in the middle of planning."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    try:
        signature.bind(None)
    except TypeError:
        name = getattr(fn, "__name__", repr(fn))
        raise PolicyError(
            f"remat: a policy callable is called with one argument, a remat.OpInfo, and returns "
            f"remat.MUST_SAVE, remat.MUST_RECOMPUTE or None; got `{name}{signature}`, which cannot be "
            f"called as {name}(op). Example: def {name}(op): return remat.MUST_SAVE if op.is_matmul else None"
        ) from None


def normalize_policy(policy: object) -> Policy:
    """``None``, a Rule, a callable ``OpInfo -> Decision | None``, or a list of those."""
    if policy is None:
        return ()
    if isinstance(policy, tuple) and all(isinstance(r, Rule) for r in policy):
        return policy
    items = list(policy) if isinstance(policy, (list, tuple)) else [policy]
    out = []
    for item in items:
        if isinstance(item, Rule):
            out.append(item)
        elif callable(item) and not isinstance(item, (str, bytes)):
            _check_signature(item)
            out.append(Rule(name=getattr(item, "__name__", repr(item)), predicate=item))
        else:
            raise PolicyError(
                f"remat: policy must be None, a rule (remat.save/remat.recompute), a callable "
                f"taking remat.OpInfo and returning a remat.Decision or None, or a list of those; "
                f"got {item!r} ({type(item).__name__})."
            )
    return tuple(out)


def _apply_user_rule(rule: Rule, op: OpInfo) -> Decision | None:
    """``rule.apply(op)``; a user's function that raises is a broken rule, not a planning failure
    to fall back from: a ``remat:`` error naming the rule, the op and the line that raised."""
    try:
        return rule.apply(op)
    except PolicyError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's rule failed, reported below
        frame = user_frame(e.__traceback__)
        where = f" at {frame[0]}:{frame[1]} ({frame[2]})" if frame else ""
        first = (str(e).strip().splitlines() or [""])[0]
        kind = op.op or "a graph input"
        raise PolicyError(
            f"remat: policy rule `{rule.name}` raised {type(e).__name__}{where} on op {op.name} ({kind}, module "
            f"'{op.module}'): {first}. A rule is called on every op of the joint graph, and returns "
            "remat.MUST_SAVE, remat.MUST_RECOMPUTE or None for each; fix the rule for ops like this one."
        ) from e


def decide(op: OpInfo, policy: Policy, used: set[str]) -> tuple[Decision | None, Rule | None]:
    """The decision for one op and the rule that made it (a user rule first, else a built-in
    one; ``(None, None)``: no rule applies). Adds matching user rule names to ``used`` (rules
    that match nothing get a warning from the caller)."""
    hits = [(r, d) for r in policy if (d := _apply_user_rule(r, op)) is not None]
    for r, _ in hits:
        used.add(r.name)
    decisions = {d for _, d in hits}
    if len(decisions) > 1:
        a = next(r for r, d in hits if d is Decision.MUST_SAVE)
        b = next(r for r, d in hits if d is Decision.MUST_RECOMPUTE)
        raise PolicyError(
            f"remat: contradictory policy rules for op {op.name} ({op.op}, module "
            f"'{op.module}'): `{a.name}` says must_save, `{b.name}` says must_recompute. "
            "Narrow one rule's ops= or modules= patterns so they do not overlap."
        )
    if hits:
        rule, decision = hits[0]
        unsafe = op.unsafe_to_recompute if op.forward else None
        if decision is Decision.MUST_RECOMPUTE and unsafe is not None:
            raise PolicyError(
                f"remat: policy rule `{rule.name}` asks to recompute op {op.name} ({op.op}), "
                f"which is a {unsafe}; recomputing it would give wrong results. "
                "Exclude this op from the rule's patterns."
            )
        return decision, rule
    for r in BUILTIN_RULES:
        d = r.apply(op)
        if d is not None:
            return d, r
    return None, None
