"""Where an op of a joint graph comes from in the user's code: its module path (from Dynamo's
``nn_module_stack``), the repeated block it belongs to, and its source line. ``clean_module_paths``
takes out the step Dynamo adds to paths reached through a wrapped module's own ``forward``; the
capture stage applies it to Dynamo's graph, before AOTAutograd copies the paths to the joint graph."""

from __future__ import annotations

import os
import re

import torch.fx as fx

__all__ = ["module_path", "block_of", "source", "clean_module_paths", "decomposed_key", "decomposed_outputs"]

_PATH_KEY = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]")


def module_path(node: fx.Node) -> str:
    """The module path of the innermost module ``node`` was traced in (``layers.0.mlp.fc1``);
    ``""`` if unknown."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    path = re.sub(r"^L\[['\"][^'\"]*['\"]\]", "", path)
    path = _PATH_KEY.sub(r".\1", path)
    path = re.sub(r"^self\.|^_orig_mod\.", "", path.lstrip("."))
    return path.lstrip(".")


def block_of(node: fx.Node) -> str | None:
    """The repeated block an op belongs to: its module path up to the first numeric component
    (``layers.3.attn`` -> ``layers.3``, ``0.fc1`` -> ``0``); None outside indexed blocks. An op a
    row-chunked graph computes for one slice (``remat.analysis.rows.chunk_of``) belongs to that
    slice: ``<seed>[k]``."""
    part = node.meta.get("remat_row_chunk")
    if part is not None:
        return f"{part[0]}[{part[1]}]"
    parts = module_path(node).split(".")
    for k, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: k + 1])
    return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WRAPPER_FILES = {os.path.join(_PACKAGE, "capture", f) for f in ("wrap.py", "dynamo_backend.py")}


def source(node: fx.Node) -> str:
    """``file:line`` of the innermost user frame (remat's own wrapper frames skipped)."""
    trace = node.meta.get("stack_trace") or ""
    frames = [f for f in _FRAME.findall(trace) if os.path.abspath(f[0]) not in _WRAPPER_FILES]
    if not frames:
        return ""
    file, line = frames[-1]
    return f"{file.rsplit('/', 1)[-1]}:{line}"


_WEAK_SELF_STEP = re.compile(r"(?:\.forward\.__self__|(?<=^L\['self'\]))\.ref\(\)")
"""The step Dynamo puts in the module paths of modules reached through a wrapped module's own
``forward``: ``.forward.__self__.ref()`` where it inlines that method, ``L['self'].ref()`` where
it compiles the method's own frame."""


def clean_module_paths(gm: fx.GraphModule) -> None:
    """Drop the step Dynamo puts in the module paths of modules it reached through a wrapped
    module's own ``forward`` method (Note [One frame per wrapped module] in ``remat/capture/wrap.py``),
    bound to a weak reference to the module: ``m.forward.__self__.ref()`` is ``m``, and in the
    method's own frame ``self.ref()`` is the module, named as ``self`` would be."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack and any(_WEAK_SELF_STEP.search(v[0]) for v in stack.values()):
            node.meta["nn_module_stack"] = {k: (_WEAK_SELF_STEP.sub("", v[0]), *v[1:]) for k, v in stack.items()}


def decomposed_key(n: fx.Node) -> tuple[str, str] | None:
    """The eager op a node was decomposed from (``meta["original_aten"]``) and that op's
    autograd sequence number (``meta["seq_nr"]``): one key per eager kernel call; None for a node
    that is its own op."""
    original, seq = n.meta.get("original_aten"), n.meta.get("seq_nr")
    if n.op != "call_function" or original is None or seq is None or str(original) == str(n.target):
        return None
    return str(original), str(seq)


def decomposed_outputs(nodes: list[fx.Node]) -> dict[fx.Node, str]:
    """The op the user wrote, for each node that produces that op's value after decomposition:
    of the nodes one call of ``aten.gelu`` became (``decomposed_key``), the last in graph order
    that a node outside them reads (or the last of them, if none is read outside). A policy rule
    naming ``aten.gelu`` matches that node (Note [Rules match the op the user wrote] in
    ``remat/policy.py``)."""
    groups: dict[tuple[str, str], list[fx.Node]] = {}
    for n in nodes:
        k = decomposed_key(n)
        if k is not None:
            groups.setdefault(k, []).append(n)
    out: dict[fx.Node, str] = {}
    for (original, _), members in groups.items():
        inside = set(members)
        read_outside = [n for n in members if not n.users or any(u not in inside for u in n.users)]
        out[(read_outside or members)[-1]] = original
    return out
