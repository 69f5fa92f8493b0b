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
import os
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
"""Masks with more distinct elements (broadcast dimensions counted once) are evaluated on the
host, not on the graph's device (Note [Long masks are evaluated on the host])."""
HOST_SHARE = 0.5
"""The share of the host's available memory a mask's evaluation may take."""
BLOCK_ELEMENTS = 1 << 26
"""A mask is compared with the triangle this many elements at a time (rows of it)."""

# Note [Long masks are evaluated on the host]
# The ops that build a mask materialise it: a length x length comparison is length squared bytes
# (7 GiB at 87,040 tokens; a float mask two or four times that). Evaluated on the graph's device
# that would be taken from the memory the step is planned for, and kept, the mask costs the same
# again in the step and keeps SDPA off its fused kernels (HF Llama at long context, where
# transformers builds its mask inside the graph: ``benchmarks/long_context.py``). So a mask with
# more than ``MAX_MASK_ELEMENTS`` distinct elements is evaluated on the host, when the bytes of
# every value its cone computes (the Dynamo graph's example values, broadcast dimensions counted
# once) fit in ``HOST_SHARE`` of the host's available memory, and compared with the triangle
# ``BLOCK_ELEMENTS`` at a time, so that no second length x length tensor is made. Otherwise it
# stays, and the verdict says how much host memory it needed. The evaluation is exact: the verdict
# is the mask's own values, at any length.


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


_HOST = torch.device("cpu")


def _evaluate(cone: list[fx.Node], metadata: list[fx.Node], on_host: bool = False) -> object:
    """Run ``cone`` with real tensors (its metadata-only inputs as empty tensors); ``on_host``:
    every tensor made on the host (Note [Long masks are evaluated on the host]), and an op that
    moves one elsewhere is an error."""
    env: dict[fx.Node, object] = {}
    for src in metadata:
        val = src.meta["example_value"]
        env[src] = torch.empty(tuple(val.shape), dtype=val.dtype, device=_HOST if on_host else val.device)
    with torch.no_grad():
        for node in cone:
            args = fx.node.map_arg(node.args, env.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
            if on_host and "device" in kwargs:
                kwargs = {**kwargs, "device": _HOST}
            if node.op == "call_function":
                env[node] = node.target(*args, **kwargs)  # type: ignore[operator]
            else:
                self_arg, *rest = args
                env[node] = getattr(self_arg, node.target)(*rest, **kwargs)  # type: ignore[arg-type]
            out = env[node]
            if on_host and isinstance(out, torch.Tensor) and out.device != _HOST:
                raise RuntimeError(f"`{node.name}` moves the mask to {out.device}")
    return env[cone[-1]]


def _matches(mask: torch.Tensor, causal: bool) -> bool:
    """``mask`` (bool, or additive float; its last two dimensions query and key) keeps exactly
    the allowed positions (every one, or ``causal``: key ``j <= `` query ``i``): True there and
    False elsewhere; or 0 there and ``-inf`` (or the dtype's lowest value) elsewhere. Compared
    ``BLOCK_ELEMENTS`` at a time."""
    if mask.dtype != torch.bool and not mask.is_floating_point():
        return False
    q_len, k_len = mask.shape[-2], mask.shape[-1]
    rows = max(1, BLOCK_ELEMENTS // max(1, mask[..., :1, :].numel()))
    keys = torch.arange(k_len, device=mask.device)
    for r0 in range(0, q_len, rows):
        block = mask[..., r0:r0 + rows, :]
        if causal:
            allowed = keys[None, :] <= torch.arange(r0, r0 + block.shape[-2], device=mask.device)[:, None]
        else:
            allowed = torch.ones((), dtype=torch.bool, device=mask.device)
        if mask.dtype == torch.bool:
            ok = (block == allowed).all()
        else:
            blocked = (block == float("-inf")) | (block == torch.finfo(mask.dtype).min)
            ok = torch.where(allowed, block == 0, blocked).all()
        if not bool(ok):
            return False
    return True


def _cone_bytes(cone: list[fx.Node]) -> int:
    """The bytes of every tensor ``cone`` computes (Dynamo's example values, broadcast dimensions
    counted once): an upper bound on what evaluating it holds at once."""
    total = 0
    for node in cone:
        val = node.meta.get("example_value")
        if isinstance(val, torch.Tensor):
            total += _core(val).numel() * val.element_size()
    return total


def host_available_bytes() -> int:
    """The host's available memory (``MemAvailable`` on Linux; else its free pages), 0 if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def classify_mask(mask: fx.Node, q_len: int, k_len: int, q_dtype: torch.dtype) -> MaskVerdict:
    """What ``mask`` (an ``attn_mask`` argument of SDPA whose query has ``q_len`` positions and
    key ``k_len``) is equivalent to."""
    val = mask.meta.get("example_value")
    if not isinstance(val, torch.Tensor):
        return MaskVerdict(MaskKind.OTHER, "is not a tensor")
    if val.dtype not in (torch.bool, q_dtype):
        return MaskVerdict(MaskKind.OTHER, f"has dtype {val.dtype}")
    if val.dim() > 4:
        return MaskVerdict(MaskKind.OTHER, f"has {val.dim()} dimensions")
    cone, metadata, why = mask_cone(mask)
    if why is not None:
        return MaskVerdict(MaskKind.OTHER, why)
    on_host = _core(val).numel() > MAX_MASK_ELEMENTS  # Note [Long masks are evaluated on the host]
    if on_host:
        need, room = _cone_bytes(cone), host_available_bytes()
        if need > HOST_SHARE * room:
            return MaskVerdict(MaskKind.OTHER, f"is too large to evaluate (its ops make {need / 2**30:.1f} GiB; "
                                               f"{room / 2**30:.1f} GiB of host memory available)")
    try:
        value = _evaluate(cone, metadata, on_host)
    except Exception as e:  # noqa: BLE001 - a mask remat cannot evaluate stays as it is
        return MaskVerdict(MaskKind.OTHER, f"could not be evaluated ({type(e).__name__})")
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(val.shape) or value.dtype != val.dtype:
        return MaskVerdict(MaskKind.OTHER, "evaluated to another shape or dtype than Dynamo's")
    value = _core(value)
    while value.dim() < 2:  # SDPA broadcasts a mask of the keys alone over the queries
        value = value.unsqueeze(0)
    if tuple(value.shape[-2:]) not in ((q_len, k_len), (1, k_len), (q_len, 1), (1, 1)):
        return MaskVerdict(MaskKind.OTHER, "does not broadcast to the query and key lengths")
    full = value.expand(*value.shape[:-2], q_len, k_len)
    if _matches(full, causal=False):
        return MaskVerdict(MaskKind.NONE)
    if _matches(full, causal=True):
        return MaskVerdict(MaskKind.CAUSAL)
    return MaskVerdict(MaskKind.OTHER, "masks other positions than none or causal")
