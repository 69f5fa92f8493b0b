"""The CUDA caching allocator at the device's memory limit: whether expandable segments are
configured, and the warning a measured step that made the allocator retry gives.

Note [Allocator retries at the limit]
A budget bounds the bytes the step allocates (the protocol's peak); the caching allocator
reserves more, in segments it keeps and splits. When a request fails against the device's memory
(or the process's ``set_per_process_memory_fraction``), the allocator frees its cached segments,
synchronizing the device, and retries: the step runs at the limit. A segment partly in use
cannot be freed, so fragmentation can then make a step run out of memory below its budget
(issue 28: HF Llama at 20 GiB held 3.0-3.4 GiB reserved and unallocated when it failed), and
each retry stalls the step. remat cannot lay out the allocator's segments and does not change
the process's allocator settings. It measures instead: the measured step's window counts the
allocator's retries (``Meter.retries``), and if there were any, and expandable segments (which
grow a segment in place instead of splitting many) are not configured, it warns once, naming the
count, the measured peak and ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, the setting
torch's own out-of-memory message recommends for reserved but unallocated memory.

A step can also fail outright, before any retry is counted: on an H100, HF Llama at 88,064 tokens
under a 20 GiB cap, with a budget the plan's compiled reading kept, ran out of memory in the
backward asking for a logits-sized buffer with gigabytes reserved but unallocated, and the same
plan trained with expandable segments (benchmarks/README.md, the long-context run). So a budget
planned for CUDA without expandable segments also warns, once per process, when its graph is
compiled (``warn_fragmentation``): the setting must be made before CUDA is initialised, so the
first step is the last moment remat can name it.
"""

from __future__ import annotations

import os
import warnings

from ..logs import warn_at_user
from ..units import format_bytes

__all__ = ["expandable_segments", "warn_fragmentation", "warn_retries"]


def expandable_segments() -> bool:
    """Whether the process configured the CUDA allocator's expandable segments (the environment
    variables torch reads at initialisation)."""
    conf = ",".join(os.environ.get(k, "") for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"))
    return "expandable_segments:true" in conf.replace(" ", "").lower()


_RETRIES_WARNED = False


def warn_retries(retries: int, peak: int, budget: int | None) -> None:
    """Once per process: the measured step ran at the device's memory limit (Note [Allocator
    retries at the limit])."""
    global _RETRIES_WARNED
    if retries <= 0 or _RETRIES_WARNED or expandable_segments():
        return
    _RETRIES_WARNED = True
    of = f" under a budget of {format_bytes(budget)}" if budget else ""
    warnings.warn(
        f"remat: during a measured training step (peak {format_bytes(peak)}{of}) the CUDA caching allocator "
        f"failed {retries} allocation(s) against the device's memory limit and freed its cache to retry: each "
        "retry synchronizes the device, and reserved but unallocated memory (fragmentation) can make the step run "
        "out of memory below its budget. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA is "
        "initialised, or lower the budget.", stacklevel=2)


_FRAGMENTATION_WARNED = False


def warn_fragmentation(budget: int) -> None:
    """Once per process: a budget planned for CUDA while expandable segments are not configured
    (Note [Allocator retries at the limit])."""
    global _FRAGMENTATION_WARNED
    if _FRAGMENTATION_WARNED or expandable_segments():
        return
    _FRAGMENTATION_WARNED = True
    warn_at_user(
        f"remat: the budget of {format_bytes(budget)} bounds the bytes the step allocates; the CUDA allocator "
        "reserves more, and near the device's memory limit (or a set_per_process_memory_fraction cap) memory it "
        "reserved but cannot hand out (fragmentation) can make a step run out of memory below the budget. Set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA is initialised (in the environment, or "
        "before the first CUDA tensor), or leave room between the budget and the limit.")
