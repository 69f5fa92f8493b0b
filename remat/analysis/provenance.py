"""Where an op of a joint graph comes from in the user's code: its module path (from Dynamo's
``nn_module_stack``), the repeated block it belongs to, and its source line."""

from __future__ import annotations

import os
import re

import torch.fx as fx

__all__ = ["module_path", "block_of", "source"]

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
    (``layers.3.attn`` -> ``layers.3``, ``0.fc1`` -> ``0``); None outside indexed blocks."""
    parts = module_path(node).split(".")
    for k, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: k + 1])
    return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WRAPPER_FILES = {os.path.join(_PACKAGE, f) for f in ("api.py", os.path.join("capture", "dynamo_backend.py"))}


def source(node: fx.Node) -> str:
    """``file:line`` of the innermost user frame (remat's own wrapper frames skipped)."""
    trace = node.meta.get("stack_trace") or ""
    frames = [f for f in _FRAME.findall(trace) if os.path.abspath(f[0]) not in _WRAPPER_FILES]
    if not frames:
        return ""
    file, line = frames[-1]
    return f"{file.rsplit('/', 1)[-1]}:{line}"
