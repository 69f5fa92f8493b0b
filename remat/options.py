"""Options: the one place where ``checkpoint``/``explain`` arguments are normalised and validated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import RematError
from .policy import Policy, normalize_policy

__all__ = ["Options", "BACKENDS"]

BACKENDS = ("inductor", "eager")


@dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    backend: str = "inductor"
    """``"inductor"``: forward and backward (with its recompute) compiled by Inductor (Triton on
    GPU, C++ on CPU). ``"eager"``: the partitioned forward and backward graphs run uncompiled,
    op by op: for debugging and fast tests."""

    policy: Policy | None = None
    """User rules that force ops or modules to be saved or recomputed (see ``remat.policy``)."""

    strict: bool = False
    """If planning fails for an unexpected reason: ``False`` falls back to saving what autograd
    would save, with one warning; ``True`` raises."""

    dynamic: bool | None = None
    """Passed to ``torch.compile``: ``True`` traces symbolic shapes up front, ``None`` lets
    Dynamo decide after a recompile, ``False`` specialises on every shape."""

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str) or self.backend not in BACKENDS:
            raise RematError(
                f"remat: backend must be one of {BACKENDS}, got {self.backend!r}. "
                "Use backend='inductor' to compile, or backend='eager' to debug uncompiled."
            )
        if not isinstance(self.strict, bool):
            raise RematError(f"remat: strict must be True or False, got {self.strict!r}.")
        if self.dynamic not in (None, True, False):
            raise RematError(f"remat: dynamic must be None, True or False, got {self.dynamic!r}.")
        object.__setattr__(self, "policy", normalize_policy(self.policy))

    @classmethod
    def create(cls, **kwargs: Any) -> Options:
        return cls(**kwargs)
