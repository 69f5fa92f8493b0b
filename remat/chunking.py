"""The ``chunking`` option: how a region that widens each row (an LM head and its loss) is cut
into slices of rows when a budget or the frontier asks for smaller plans (Note [Row chunks] in
``remat.analysis.rows``; the rewrite in ``remat.planning.chunking``)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import RematError

__all__ = ["Chunking", "DEFAULT_CHUNKING"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Chunking:
    """How a row region is sliced (``Options.chunking``)."""

    min_rows: int = 1024
    """A slice holds at least this many rows: narrower slices make the widening matmul's slices
    small enough to lose speed on a GPU (a 1,024 x 1,024 x 32,000 matmul still runs near peak)."""
    max_chunks: int = 16
    """At most this many slices per region (each is a copy of the region's ops to compile)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.min_rows, int) and self.min_rows >= 1):
            raise RematError(f"remat: Chunking.min_rows must be a positive int, got {self.min_rows!r}.")
        if not (isinstance(self.max_chunks, int) and self.max_chunks >= 2):
            raise RematError(f"remat: Chunking.max_chunks must be an int of at least 2, got {self.max_chunks!r}.")

    def count(self, rows: int) -> int:
        """How many slices ``rows`` rows are cut into (1: not cut)."""
        return max(1, min(self.max_chunks, rows // self.min_rows))


DEFAULT_CHUNKING = Chunking()
"""The ``chunking`` option's default."""
