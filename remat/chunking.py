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
    slice_bytes: int = 256 * 2**20
    """Slices are made until the region's widest tensor (an LM head's float32 log-probabilities)
    is at most this many bytes a slice, within ``min_rows`` and ``max_chunks``: HF Llama's 16,384
    tokens make 8 slices, 87,552 tokens 32."""
    max_chunks: int = 32
    """At most this many slices per region (each is a copy of the region's ops to plan and compile)."""

    def __post_init__(self) -> None:
        for name, least in (("min_rows", 1), ("slice_bytes", 1), ("max_chunks", 2)):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
                raise RematError(f"remat: Chunking.{name} must be an int of at least {least}, got {value!r}.")

    def count(self, rows: int, widest_bytes: int) -> int:
        """How many slices ``rows`` rows are cut into when the region's widest tensor has
        ``widest_bytes`` (1: not cut)."""
        wanted = -(-widest_bytes // self.slice_bytes)
        return max(1, min(self.max_chunks, rows // self.min_rows, max(wanted, 2)))


DEFAULT_CHUNKING = Chunking()
"""The ``chunking`` option's default."""
