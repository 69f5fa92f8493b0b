"""Keys and values expanded for grouped-query attention, as Dynamo records them: Hugging Face's
``repeat_kv`` (``x[:, :, None].expand(b, kvh, n, s, d).reshape(b, kvh * n, s, d)``, also with
``unsqueeze(2)``, ``view`` or ``flatten``) and ``x.repeat_interleave(n, dim=1)``. Both give head
``h`` of the result the value of ``x``'s head ``h // n``, exactly what SDPA's ``enable_gqa=True``
reads from the unexpanded ``x``. The matcher reads the tensor shapes Dynamo recorded, not the
argument spellings. Used by ``remat.capture.attention``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

__all__ = ["Expansion", "kv_expansion"]


@dataclass(frozen=True)
class Expansion:
    """``expanded`` repeats each of ``source``'s heads ``repeats`` times, in order."""

    source: fx.Node
    expanded: fx.Node
    repeats: int
    nodes: tuple[fx.Node, ...]
    """The nodes between ``source`` and ``expanded`` (``expanded`` last)."""


def _shape(node: object) -> tuple[int, ...] | None:
    val = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return tuple(val.shape)


def _called(node: fx.Node, *names: str) -> bool:
    """A call of the method or the ``torch`` function named one of ``names``."""
    if node.op == "call_method":
        return node.target in names
    return node.op == "call_function" and any(node.target is getattr(torch, n, None) for n in names)


def _inserted_dim(node: fx.Node) -> fx.Node | None:
    """The input of ``node`` if ``node`` is ``x[:, :, None]`` or ``x.unsqueeze(2)`` of a 4-d ``x``."""
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    source = node.args[0]
    shape, src = _shape(node), _shape(source)
    if shape is None or src is None or len(src) != 4 or shape != (*src[:2], 1, *src[2:]):
        return None
    if _called(node, "unsqueeze"):
        return source
    if node.op == "call_function" and node.target is operator.getitem:
        index = node.args[1] if len(node.args) > 1 else None
        parts = index if isinstance(index, tuple) else (index,)
        full = all(p is None or p is Ellipsis or p == slice(None) for p in parts)
        if full and sum(p is None for p in parts) == 1:
            return source
    return None


def _repeat_kv(node: fx.Node) -> Expansion | None:
    """``node`` = reshape(expand(x[:, :, None]))."""
    if not _called(node, "reshape", "view", "flatten") or not isinstance(node.args[0], fx.Node):
        return None
    expand = node.args[0]
    if not _called(expand, "expand") or not isinstance(expand.args[0], fx.Node):
        return None
    source = _inserted_dim(expand.args[0])
    out, mid, src = _shape(node), _shape(expand), _shape(source) if source is not None else None
    if source is None or out is None or mid is None or src is None:
        return None
    b, kvh, s, d = src
    n = mid[2]
    if mid != (b, kvh, n, s, d) or out != (b, kvh * n, s, d):
        return None
    return Expansion(source, node, n, (expand.args[0], expand, node))


def _repeat_interleave(node: fx.Node) -> Expansion | None:
    """``node`` = ``x.repeat_interleave(n, dim=1)`` with an int ``n``."""
    if not _called(node, "repeat_interleave") or not isinstance(node.args[0], fx.Node):
        return None
    source = node.args[0]
    repeats = node.args[1] if len(node.args) > 1 else node.kwargs.get("repeats")
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
    src, out = _shape(source), _shape(node)
    if not isinstance(repeats, int) or dim not in (1, -3) or src is None or out is None or len(src) != 4:
        return None
    if out != (src[0], src[1] * repeats, *src[2:]):
        return None
    return Expansion(source, node, repeats, (node,))


def kv_expansion(node: object) -> Expansion | None:
    """The grouped-query expansion that computes ``node``, if it is one."""
    if not isinstance(node, fx.Node):
        return None
    return _repeat_kv(node) or _repeat_interleave(node)
