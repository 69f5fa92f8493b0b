"""What an attention mask in a Dynamo graph is worth: a mask computed from constants alone (an
``arange`` compared with an ``arange``, expanded) is evaluated once, with real tensors, and
compared with no mask and with SDPA's causal mask for the query and key lengths.

A mask whose values depend on a graph input (a padding mask from ``attention_mask``), on a module
attribute, on a random or in-place op, or on a dynamic size is never evaluated: it stays in the
graph, and the verdict says why. Graph inputs read only for their shape, dtype and device
(``torch.ones_like(input_ids)``) count as constants: they are replaced by empty tensors of the same
metadata. Used by ``remat.capture.attention``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.fx as fx

__all__ = ["MaskKind", "MaskVerdict", "classify_mask", "mask_cone"]


class MaskKind(enum.Enum):
    """What a mask is equivalent to."""

    NONE = "none"
    """Every position attends (all True, or an additive mask of zeros)."""
    CAUSAL = "causal"
    """SDPA's ``is_causal`` mask: query ``i`` attends to keys ``j <= i`` (upper-left aligned)."""
    OTHER = "other"
    """Anything else, or not known: the mask stays."""


@dataclass(frozen=True)
class MaskVerdict:
    kind: MaskKind
    why: str = ""
    """For ``OTHER``: why the mask stays (``depends on graph input `mask```)."""


_SHAPE_ONLY_FUNCTIONS = frozenset({torch.ones_like, torch.zeros_like, torch.full_like})
_SHAPE_ONLY_METHODS = frozenset({"new_ones", "new_zeros", "new_full", "size", "dim", "numel"})
_RANDOM_WORDS = ("rand", "bernoulli", "dropout", "normal", "multinomial", "poisson", "uniform", "exponential")
MAX_MASK_ELEMENTS = 1 << 28
"""Masks with more distinct elements (broadcast dimensions counted once) are not evaluated: the
ops that build one may materialise it (a length x length comparison) at compile time."""


def _core(t: torch.Tensor) -> torch.Tensor:
    """``t`` with each broadcast dimension (stride 0) narrowed to one element: the same values."""
    for d in range(t.dim()):
        if t.stride(d) == 0 and t.shape[d] > 1:
            t = t.narrow(d, 0, 1)
    return t


def _shape_only(node: fx.Node) -> bool:
    """The node reads its first argument's metadata only (``ones_like(x)``, ``x.new_zeros(...)``)."""
    if node.op == "call_function":
        return node.target in _SHAPE_ONLY_FUNCTIONS
    return node.op == "call_method" and node.target in _SHAPE_ONLY_METHODS


def _name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _refusal(node: fx.Node) -> str | None:
    """Why ``node`` cannot be evaluated as a constant, or None."""
    if node.op == "placeholder":
        return f"depends on graph input `{node.name}`"
    if node.op not in ("call_function", "call_method"):
        return f"reads `{node.name}` ({node.op})"
    name = _name(node)
    if node.op == "call_method" and name.endswith("_") and not name.startswith("__"):
        return f"runs the in-place op `{name}`"
    if any(w in name.lower() for w in _RANDOM_WORDS):
        return f"runs the random op `{name}`"
    if "empty" in name.lower():
        return f"reads uninitialised memory (`{name}`)"
    val = node.meta.get("example_value")
    if isinstance(val, torch.Tensor) and any(not isinstance(s, int) for s in val.shape):
        return "has a dynamic shape"
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return "depends on a dynamic size"
    return None


def mask_cone(mask: fx.Node) -> tuple[list[fx.Node], list[fx.Node], str | None]:
    """The nodes that compute ``mask``, in graph order, and the graph inputs they read for
    metadata only; or the reason they cannot be evaluated."""
    seen: set[fx.Node] = set()
    cone: list[fx.Node] = []
    candidates: list[fx.Node] = []
    stack = [mask]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        why = _refusal(node)
        if why is not None:
            return [], [], why
        cone.append(node)
        inputs = node.all_input_nodes
        source = node.args[0] if node.args else None
        others: list[fx.Node] = []
        fx.node.map_arg((node.args[1:], node.kwargs), others.append)
        if _shape_only(node) and isinstance(source, fx.Node) and source not in others \
                and isinstance(source.meta.get("example_value"), torch.Tensor):
            candidates.append(source)
            inputs = [a for a in inputs if a is not source]
        stack.extend(inputs)
    metadata = [n for n in dict.fromkeys(candidates) if n not in seen]
    order = {n: i for i, n in enumerate(mask.graph.nodes)}
    return sorted(cone, key=order.__getitem__), metadata, None


def _evaluate(cone: list[fx.Node], metadata: list[fx.Node]) -> object:
    """Run ``cone`` with real tensors (its metadata-only inputs as empty tensors)."""
    env: dict[fx.Node, object] = {}
    for src in metadata:
        val = src.meta["example_value"]
        env[src] = torch.empty(tuple(val.shape), dtype=val.dtype, device=val.device)
    with torch.no_grad():
        for node in cone:
            args = fx.node.map_arg(node.args, env.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
            if node.op == "call_function":
                env[node] = node.target(*args, **kwargs)  # type: ignore[operator]
            else:
                self_arg, *rest = args
                env[node] = getattr(self_arg, node.target)(*rest, **kwargs)  # type: ignore[arg-type]
    return env[cone[-1]]


def _matches(mask: torch.Tensor, allowed: torch.Tensor) -> bool:
    """``mask`` (bool, or additive float) keeps exactly the ``allowed`` positions: True there and
    False elsewhere; or 0 there and ``-inf`` (or the dtype's lowest value) elsewhere."""
    if mask.dtype == torch.bool:
        return bool((mask == allowed).all())
    if not mask.is_floating_point():
        return False
    blocked = (mask == float("-inf")) | (mask == torch.finfo(mask.dtype).min)
    return bool(torch.where(allowed, mask == 0, blocked).all())


def classify_mask(mask: fx.Node, q_len: int, k_len: int, q_dtype: torch.dtype) -> MaskVerdict:
    """What ``mask`` (an ``attn_mask`` argument of SDPA whose query has ``q_len`` positions and
    key ``k_len``) is equivalent to."""
    val = mask.meta.get("example_value")
    if not isinstance(val, torch.Tensor):
        return MaskVerdict(MaskKind.OTHER, "is not a tensor")
    if val.dtype not in (torch.bool, q_dtype):
        return MaskVerdict(MaskKind.OTHER, f"has dtype {val.dtype}")
    if val.dim() > 4 or _core(val).numel() > MAX_MASK_ELEMENTS:
        return MaskVerdict(MaskKind.OTHER, "is too large to evaluate")
    cone, metadata, why = mask_cone(mask)
    if why is not None:
        return MaskVerdict(MaskKind.OTHER, why)
    try:
        value = _evaluate(cone, metadata)
    except Exception as e:  # noqa: BLE001 - a mask remat cannot evaluate stays as it is
        return MaskVerdict(MaskKind.OTHER, f"could not be evaluated ({type(e).__name__})")
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(val.shape) or value.dtype != val.dtype:
        return MaskVerdict(MaskKind.OTHER, "evaluated to another shape or dtype than Dynamo's")
    value = _core(value)
    full = torch.ones(q_len, k_len, dtype=torch.bool, device=value.device)
    if _matches(value, full):
        return MaskVerdict(MaskKind.NONE)
    if _matches(value, full.tril()):
        return MaskVerdict(MaskKind.CAUSAL)
    return MaskVerdict(MaskKind.OTHER, "masks other positions than none or causal")
