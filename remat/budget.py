"""Memory budgets: what a budget is and how it is parsed. The choice of the plan that fits is
the planner's (``remat.planning.planner.choose``).

A budget is a number of bytes (an ``int``, or a string such as ``"6GiB"``, ``"800MB"``,
``"1.5 GB"``) or a fraction in (0, 1] of ``eager_peak_bytes``, the predicted peak of the same
graph saving what autograd saves. A fraction is a ``float``: a string is always bytes, and one
without a unit must be a whole number above 1 (``"0.5"`` or ``"1"`` raises and says to pass the
float; ``"1000000"`` is a million bytes). It bounds the *predicted peak* activation memory of a
training step (``remat.core.peak``), not the sum of saved bytes.

Choosing (``remat.planning.planner.choose``): among the candidate plans (the default plan and every vertex of the
memory/recompute frontier), take the one with the least estimated recompute time whose
predicted peak fits; ties go to the lower peak. The candidate set does not depend on the
budget, so a smaller budget never gives a larger peak or a shorter recompute time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import RematError
from .units import format_bytes

__all__ = ["Budget", "parse_budget"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Budget:
    """Exactly one of ``nbytes`` (absolute) and ``fraction`` (of the eager peak) is set."""

    nbytes: int | None = None
    fraction: float | None = None

    def resolve(self, eager_peak_bytes: int) -> int:
        if self.nbytes is not None:
            return self.nbytes
        assert self.fraction is not None
        return int(self.fraction * eager_peak_bytes)

    def __str__(self) -> str:
        return format_bytes(self.nbytes) if self.nbytes is not None else f"{self.fraction:.0%} of eager's peak"


def _bad(value: object, why: str) -> RematError:
    return RematError(
        f"remat: budget must be a number of bytes (an int > 0, or a string such as '6GiB' or "
        f"'800MB') or a fraction in (0, 1] of eager's peak memory; got {value!r}: {why}. "
        "Example: remat.checkpoint(model, budget='6GiB') or budget=0.5."
    )


def _check_unitless(value: str, n: float) -> None:
    """A string without a unit is bytes; a fraction or a part of a byte was meant otherwise."""
    if 0 < n <= 1:
        raise _bad(value, f"a string is a number of bytes, and this one reads as a fraction; pass the float "
                          f"budget={n!r} for that fraction of eager's peak, or name a unit ('512MiB')")
    if n != int(n):
        raise _bad(value, "a string without a unit is a whole number of bytes; name a unit ('1.5GiB')")


def parse_budget(value: object) -> Budget | None:
    """``None`` (no budget), a ``Budget``, an int (bytes), a float in (0, 1], or a string."""
    if value is None or isinstance(value, Budget):
        return value
    if isinstance(value, bool):
        raise _bad(value, "a bool is not a budget")
    if isinstance(value, int):
        if value <= 0:
            raise _bad(value, "bytes must be positive")
        return Budget(nbytes=value)
    if isinstance(value, float):
        if value != value or not 0.0 < value <= 1.0:
            raise _bad(value, "a float budget is a fraction and must lie in (0, 1]")
        return Budget(fraction=value)
    if isinstance(value, str):
        m = _PATTERN.match(value)
        if not m or m.group(2).lower() not in _UNITS:
            raise _bad(value, "unparsable; use a number and a unit among B, KB, MB, GB, KiB, MiB, GiB")
        if not m.group(2):
            _check_unitless(value, float(m.group(1)))
        n = float(m.group(1)) * _UNITS[m.group(2).lower()]
        if n < 1:
            raise _bad(value, "bytes must be positive")
        return Budget(nbytes=int(n))
    raise _bad(value, f"a {type(value).__name__} is not a budget")
