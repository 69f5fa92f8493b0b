"""Which torch versions remat's Inductor knowledge was verified on, and the one warning that
says when it may have drifted.

Note [Version drift]
Everything in ``remat.backends.inductor`` reads or patches Inductor internals that change between torch
releases: the partitioner name ``compile_fx`` calls, the fusion choices handler, the C++
scheduler's ``codegen_node``, the lowering tables, the decomposition table, and the thresholds
and habits the peak model copies (``remat.backends.inductor.fusion``). Each was checked on the versions
in ``VERIFIED``. On any other version remat still runs, but says so once, naming the versions it
knows; and a hook that cannot install (a name that moved) is named in a warning of its own
instead of silently doing nothing, since its absence changes memory, not correctness.
"""

from __future__ import annotations

import warnings

import torch

from ...errors import RematError

__all__ = ["VERIFIED", "torch_version", "is_verified", "check_torch_version", "drift", "drift_error"]

VERIFIED: tuple[str, ...] = ("2.11", "2.13")
"""torch major.minor versions every hook and lowering fact here was checked on: 2.11 (CUDA, the
GPU machine) and 2.13 (CPU, CI). 2.14.1 ran the test suite without failures, manually."""

_warned: set[str] = set()


def torch_version(version: str | None = None) -> str:
    """``"2.13"`` for ``"2.13.0+cpu"``."""
    parts = (version or torch.__version__).split("+")[0].split(".")
    return ".".join(parts[:2])


def is_verified(version: str | None = None) -> bool:
    return torch_version(version) in VERIFIED


def check_torch_version(version: str | None = None) -> bool:
    """Warn once per process if this torch is not among ``VERIFIED``; True if it is."""
    v = torch_version(version)
    if v in VERIFIED:
        return True
    if v not in _warned:
        _warned.add(v)
        warnings.warn(
            f"remat: torch {v} was not verified with remat's Inductor hooks (verified: "
            f"{', '.join(VERIFIED)}). Training stays correct, but the predicted peak memory and "
            "the fusion limits remat sets may drift; any hook that cannot install is named in its "
            "own warning. Please report what you see, or use a verified torch.",
            stacklevel=3,
        )
    return False


def drift(hook: str, missing: str) -> None:
    """Warn once that ``hook`` could not install on this torch because ``missing`` is absent."""
    key = f"{hook}:{missing}"
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(
        f"remat: the Inductor hook `{hook}` could not install on torch {torch.__version__} "
        f"({missing} is missing; verified on {', '.join(VERIFIED)}). remat runs without it: "
        "gradients are unaffected, but memory may differ from the predicted peak. Please report "
        "this torch version.",
        stacklevel=3,
    )


def drift_error(hook: str, missing: str) -> RematError:
    """For a hook without which remat would silently do the wrong thing (its plan ignored)."""
    return RematError(
        f"remat: the Inductor hook `{hook}` cannot install on torch {torch.__version__}: {missing} "
        f"is missing (verified on {', '.join(VERIFIED)}). Without it Inductor would ignore remat's "
        "plan. Use backend='eager' (uncompiled) or a verified torch, and please report this version."
    )
