"""Human-readable sizes, shared by plans and reports."""

from __future__ import annotations

__all__ = ["format_bytes", "format_scaled"]


def format_scaled(n: int, units: tuple[tuple[str, int], ...], base: str) -> str:
    """``n`` in the largest unit of ``units`` (name, scale; largest first) it reaches."""
    for unit, scale in units:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} {base}"


def format_bytes(n: int) -> str:
    """``1.50 GiB``, ``12 B``."""
    return format_scaled(n, (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)), "B")
