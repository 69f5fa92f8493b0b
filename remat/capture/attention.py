"""Attention as eager runs it: a pass over each Dynamo graph, before AOTAutograd traces it, that
gives every ``F.scaled_dot_product_attention`` call the arguments eager autograd would have run.

Note [Attention as eager runs it]
Under Dynamo, Hugging Face models may build their attention masks inside the graph (eager skips
them when nothing is padded): an all-true mask (BERT), an explicit causal mask instead of
``is_causal`` (Llama, GPT-2), and with a mask, ``repeat_kv`` copies of the keys and values instead
of ``enable_gqa``. SDPA then picks a slower kernel than eager's, or its math path (scores of
length x length materialised, saved and recomputed), and the plan pays memory eager never pays.
The pass gives each call the arguments with which it computes the same values:

* a mask computed from constants alone (``remat.capture.attention_mask``) is evaluated once; all
  true (or zeros) becomes ``attn_mask=None``, the causal lower triangle ``is_causal=True``;
* where its keys and values are grouped-query expansions (``remat.capture.attention_kv``), it
  reads the unexpanded ones with ``enable_gqa=True``, where this torch's SDPA takes it
  (``compat.sdpa_takes_enable_gqa``) and a fused kernel runs it (``gqa_kernel_refusal``): on
  CUDA only without a mask and with head dims up to 256, as transformers' own choice says
  (``versions.HOOKS["sdpa_kernel_choice"]``); otherwise the expansions stay.

A mask that depends on an input's values (a padding mask) is left alone: the graph is rewritten
only where the rewritten call provably computes the same values. The graph is specialised to its
shapes already (a mask of a dynamic shape is not evaluated). The report (``AttentionReport``)
becomes a note of the graph's plan.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn.functional as F

from .. import compat
from ..errors import RematError
from .attention_kv import Expansion, kv_expansion
from .attention_mask import MaskKind, MaskVerdict, classify_mask, mask_cone

__all__ = ["AttentionReport", "rewrite_attention", "is_sdpa", "gqa_kernel_refusal"]

_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
"""SDPA's positional parameters; ``scale`` and ``enable_gqa`` are keyword-only."""
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


@dataclass(frozen=True)
class AttentionReport:
    """What ``rewrite_attention`` did to one graph."""

    calls: int = 0
    """SDPA calls in the graph."""
    no_mask: int = 0
    """Masks recognised as no mask (``attn_mask=None``)."""
    causal: int = 0
    """Masks recognised as causal (``is_causal=True``)."""
    gqa: int = 0
    """Calls that read unexpanded keys and values (``enable_gqa=True``)."""
    kept: tuple[tuple[str, int], ...] = field(default=())
    """Why masks or expansions stayed, with how many calls each."""

    @property
    def rewritten(self) -> int:
        return self.no_mask + self.causal + self.gqa

    def note(self) -> str | None:
        """``attention: 12 SDPA calls, 12 masks recognised as causal (is_causal=True), ...``;
        None where there was nothing to rewrite (no attention, or calls already as eager's)."""
        if not self.calls or not self.rewritten and not self.kept:
            return None
        done = [f"{n} {what}" for n, what in (
            (self.no_mask, "masks recognised as none (attn_mask=None)"),
            (self.causal, "masks recognised as causal (is_causal=True)"),
            (self.gqa, "K/V expansions kept unexpanded (enable_gqa=True)")) if n]
        kept = [f"{n} {why}" for why, n in self.kept]
        parts = [f"{self.calls} SDPA call{'s' if self.calls != 1 else ''}", *done]
        if kept:
            parts.append("not rewritten: " + "; ".join(kept))
        return "attention: " + ", ".join(parts)


def is_sdpa(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is F.scaled_dot_product_attention


def _arguments(node: fx.Node) -> dict[str, object] | None:
    """The call's arguments by name, or None if they do not fit SDPA's signature."""
    if len(node.args) > len(_PARAMS) or set(node.kwargs) - set(_PARAMS) - set(_DEFAULTS):
        return None
    named = dict(zip(_PARAMS, node.args))
    if set(named) & set(node.kwargs):
        return None
    return {**_DEFAULTS, **named, **node.kwargs}


def _shape(x: object) -> tuple[int, ...] | None:
    val = x.meta.get("example_value") if isinstance(x, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return tuple(val.shape)


GQA_MAX_HEAD_DIM = 256
"""CUDA's flash kernel, the one that takes ``enable_gqa``, takes head dims up to this."""


def gqa_kernel_refusal(device: str, masked: bool, k_dim: int, v_dim: int) -> str | None:
    """Why a fused kernel would not run ``enable_gqa`` on ``device`` where the expanded call's
    could (``versions.HOOKS["sdpa_kernel_choice"]``): on CUDA only the flash kernel takes it, with
    no mask and equal head dims up to ``GQA_MAX_HEAD_DIM`` (transformers' own rule); the
    memory-efficient kernel that runs the expanded call otherwise would give way to the math
    path. CPU's fused kernel takes a mask too."""
    if device == "cpu":
        return None
    if masked:
        return "a mask remains (CUDA's fused kernels that take one take no enable_gqa)"
    if k_dim != v_dim or k_dim > GQA_MAX_HEAD_DIM:
        return f"head dims {k_dim}/{v_dim} (CUDA's flash kernel takes equal ones up to {GQA_MAX_HEAD_DIM})"
    return None


def _is_tensor(x: object) -> bool:
    return isinstance(x, fx.Node) and isinstance(x.meta.get("example_value"), torch.Tensor)


class _Rewriter:
    """One graph's rewrite: masks classified once each, then each call's arguments changed."""

    def __init__(self, gm: fx.GraphModule, gqa: bool):
        self.gm = gm
        self.gqa = gqa
        self.counts: Counter[str] = Counter()
        self.kept: Counter[str] = Counter()
        self.verdicts: dict[fx.Node, MaskVerdict] = {}
        self.touched: list[fx.Node] = []
        """Nodes that may have lost their last user (masks, expansions), in graph order."""

    def rewrite(self, node: fx.Node) -> None:
        args = _arguments(node)
        q = _shape(args["query"]) if args else None
        k = _shape(args["key"]) if args else None
        if args is not None and (q is None or k is None) and _is_tensor(args["query"]) and _is_tensor(args["key"]):
            self.kept["calls with dynamic shapes (a mask is evaluated at one size only)"] += 1
            return
        if args is None or q is None or k is None or len(q) != 4 or len(k) != 4:
            self.kept["calls of an unexpected form"] += 1
            return
        given = dict(args)
        self._mask(args, q[2], k[2], args["query"].meta["example_value"].dtype)
        self._kv(args, q)
        if args != given:
            kwargs = {n: args[n] for n in ("attn_mask", "dropout_p", "is_causal", "scale")}
            if args["enable_gqa"] or "enable_gqa" in node.kwargs:  # a torch without it takes no such keyword
                kwargs["enable_gqa"] = args["enable_gqa"]
            node.args, node.kwargs = (args["query"], args["key"], args["value"]), kwargs

    def _mask(self, args: dict, q_len: int, k_len: int, dtype: torch.dtype) -> None:
        mask = args["attn_mask"]
        if not isinstance(mask, fx.Node):
            return
        if args["is_causal"]:
            self.kept["masks given with is_causal"] += 1
            return
        if mask not in self.verdicts:
            self.verdicts[mask] = classify_mask(mask, q_len, k_len, dtype)
        verdict = self.verdicts[mask]
        if verdict.kind is MaskKind.OTHER:
            self.kept[f"masks kept: the mask {verdict.why}"] += 1
            return
        args["attn_mask"] = None
        args["is_causal"] = verdict.kind is MaskKind.CAUSAL
        self.counts["causal" if args["is_causal"] else "no_mask"] += 1
        self.touched.append(mask)

    def _kv(self, args: dict, q: tuple[int, ...]) -> None:
        k, v = kv_expansion(args["key"]), kv_expansion(args["value"])
        if k is None or v is None or args["enable_gqa"]:
            return
        why = self._gqa_refusal(args, q, k, v)
        if why is not None:
            self.kept[f"K/V expansions kept: {why}"] += 1
            return
        args["key"], args["value"], args["enable_gqa"] = k.source, v.source, True
        self.counts["gqa"] += 1
        self.touched.extend((*k.nodes, *v.nodes))

    def _gqa_refusal(self, args: dict, q: tuple[int, ...], k: Expansion, v: Expansion) -> str | None:
        if not self.gqa:
            return "this torch's SDPA takes no enable_gqa"
        device = args["query"].meta["example_value"].device.type
        why = gqa_kernel_refusal(device, args["attn_mask"] is not None, _shape(k.source)[-1], _shape(v.source)[-1])
        if why is not None:
            return why
        kv_heads = _shape(k.source)[1]
        if k.repeats != v.repeats or _shape(v.source)[1] != kv_heads or q[1] != kv_heads * k.repeats:
            return "keys and values are expanded differently"
        return None

    def drop_dead(self) -> None:
        """Erase the masks and expansions no call reads any more, with the nodes that only
        computed them (all pure: ``attention_mask.mask_cone`` and the matchers checked)."""
        erasable = set(self.touched)
        for mask, verdict in self.verdicts.items():
            if verdict.kind is not MaskKind.OTHER:
                erasable.update(mask_cone(mask)[0])
        for node in reversed(list(self.gm.graph.nodes)):
            if node in erasable and not node.users:
                self.gm.graph.erase_node(node)


def rewrite_attention(gm: fx.GraphModule, *, strict: bool = False) -> AttentionReport:
    """Rewrite ``gm``'s SDPA calls in place (Note [Attention as eager runs it]); the report. A
    call the pass fails on stays as captured (``strict``: raises ``RematError``)."""
    calls = [n for n in gm.graph.nodes if is_sdpa(n)]
    if not calls:
        return AttentionReport()
    rw = _Rewriter(gm, compat.sdpa_takes_enable_gqa())
    for node in calls:
        counts, kept = rw.counts.copy(), rw.kept.copy()
        try:
            rw.rewrite(node)
        except Exception as e:  # noqa: BLE001 - the call stays as Dynamo captured it
            if strict:
                raise RematError(f"remat: internal error: rewriting attention `{node.name}` failed "
                                 f"({type(e).__name__}: {e}); please report (strict=False keeps it as captured)") from e
            rw.counts, rw.kept = counts, kept
            rw.kept[f"calls the rewrite failed on ({type(e).__name__}; please report)"] += 1
    if rw.touched:
        rw.drop_dead()
        gm.graph.lint()
        gm.recompile()
    return AttentionReport(calls=len(calls), no_mask=rw.counts["no_mask"], causal=rw.counts["causal"],
                           gqa=rw.counts["gqa"], kept=tuple(sorted(rw.kept.items())))
