"""Every user-facing error remat raises. Messages start with ``remat:``, say what was expected,
what was given, and how to fix it."""

from __future__ import annotations

__all__ = ["RematError", "PolicyError", "PlanningError", "InfeasibleBudgetError"]


class RematError(Exception):
    """Base class of remat's errors."""

    def __init__(self, message: str):
        if not message.startswith("remat:"):
            message = "remat: " + message
        super().__init__(message)


class PolicyError(RematError, TypeError):
    """A ``policy`` argument is malformed, returns the wrong type, or has contradictory rules."""


class PlanningError(RematError):
    """No valid plan exists for a graph under the given rules (for example a value that can be
    neither saved nor recomputed)."""


class InfeasibleBudgetError(RematError):
    """No plan fits the requested memory budget."""
