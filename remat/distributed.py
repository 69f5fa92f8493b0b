"""remat under ``torch.distributed``: a fingerprint of each plan, and the check that every rank
chose the same plan for the same graph.

Note [Ranks agree on plans]: under DDP and FSDP2 every rank traces the same model on inputs of
the same shapes, so every rank captures the same graphs in the same order and the planner,
which is deterministic, chooses the same plan on each. If they ever differ (a rank traced other
shapes, took another code path, or ran with other options), ranks run different graphs: with
collectives inside the graphs that can deadlock, and at best each rank keeps different memory.
So after each training graph is planned, while a process group of more than one rank is
initialised, remat compares the plan's fingerprint across ranks and raises ``RematError`` where
they differ.

The comparison goes through the process group's key-value store, not through a collective:

- a collective issued while a graph compiles would be one more collective in the stream of the
  ranks' communicator; a rank that plans a graph the others do not (it alone recompiled, say
  for an uneven last batch) would wait in it forever, or match it against FSDP2's or DDP's own
  collectives. A store exchange never waits: each rank writes its fingerprint for graph ``n``
  (the ``n``-th training graph this process planned) and increments a counter for ``n``;
- the rank whose increment completes the count (the last to plan graph ``n``) reads every
  rank's fingerprint and raises if any differs. Every other rank has written its fingerprint
  before incrementing, so the last one always sees them all: a disagreement is always reported,
  on that rank; under ``torchrun`` its failure stops the others;
- no tensors move, so it does not matter that planning runs inside AOTAutograd's tracing, nor
  which device or stream the collectives use.

What it does not see: a graph that some ranks never plan is never compared (the count for it
never completes), and every later graph is then compared with a different one, which reports
a disagreement. Processes that legitimately plan different graphs (pipeline stages, or remat
used on some ranks only) must turn the check off with the environment variable
``REMAT_CHECK_RANKS=0``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import warnings
from collections.abc import Iterator
from typing import Any

from . import compat
from .errors import RematError
from .plan import Plan

__all__ = ["fingerprint", "check_ranks_agree", "unsplit_by_ddp", "remat_splits_ddp", "ENV_SWITCH"]

ENV_SWITCH = "REMAT_CHECK_RANKS"
"""Set to ``0`` to turn the rank-agreement check off."""

_KEY = "remat/plan"
_exchanges = itertools.count()
"""Training graphs this process has compared: the ``n`` of each store key (same on every rank
that plans the same graphs in the same order)."""


def fingerprint(plan: Plan) -> str:
    """A stable hash (16 hex digits) of what ``plan`` saves and recomputes: the names and ops of
    its saved values and recomputed ops, in plan order, and whether it fell back. Names are the
    joint graph's fx names, so two processes that traced the same graph and chose the same plan
    get the same fingerprint; shapes are left out, so one symbolic plan has one fingerprint."""
    data = {
        "saved": [[s.name, s.op] for s in plan.saved],
        "recomputed": [list(p) for p in zip(plan.recomputed, plan.recomputed_ops)],
        "fallback": plan.fallback is not None,
    }
    return hashlib.sha256(json.dumps(data, separators=(",", ":")).encode()).hexdigest()[:16]


def _describe(plan: Plan) -> str:
    return f"{len(plan.saved)} saved, {len(plan.recomputed)} recomputed" + (", fallback" if plan.fallback else "")


def _default_store() -> Any:
    """The default process group's key-value store (``compat.default_store``)."""
    return compat.default_store()


def unsplit_by_ddp() -> Any:
    """A context in which Dynamo does not split graphs at DDP's gradient buckets
    (``torch._dynamo.config.optimize_ddp = False``, a private torch setting,
    versions.HOOKS["dynamo_config"]). ``remat.explain`` plans under it: Dynamo's DDPOptimizer needs each bucket's graph
    compiled through AOTAutograd to trace the next one, and explain stops after planning. So
    explain shows DDP models planned as one graph; ``compiled_plans`` shows the bucket graphs
    training planned."""
    return compat.dynamo_config_patch(optimize_ddp=False)


@contextlib.contextmanager
def remat_splits_ddp(backend: Any) -> Iterator[None]:
    """Around each call of a remat-wrapped model: remat, not Dynamo, splits its graphs at DDP's
    gradient buckets (Note [Bucket pieces keep the whole plan] in ``remat/capture/buckets.py``).
    ``backend.split_ddp`` records whether the user's Dynamo settings ask for the split (a user
    who set ``optimize_ddp = False`` gets one graph, as with torch.compile) and this torch's
    DDPOptimizer is the one remat drives (``compat.can_split_ddp``); if so, Dynamo's own split is
    off for the call, else Dynamo splits as usual."""
    if not _distributed():  # no process group, no DDP: nothing to split (and no per-step config patch)
        backend.split_ddp = False
        yield
        return
    backend.split_ddp = compat.dynamo_splits_ddp() and compat.can_split_ddp()
    if not backend.split_ddp:  # the user asked for one graph, or this torch splits otherwise: Dynamo decides
        yield
        return
    with unsplit_by_ddp():
        yield


def _distributed() -> bool:
    """Whether a default process group is initialised (DDP needs one)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """The default process group's size, 1 without one."""
    world = _world()
    return world[1] if world is not None else 1


def _world() -> tuple[int, int] | None:
    """(rank, world size) when a process group of more than one rank is initialised."""
    if not _distributed():
        return None
    import torch.distributed as dist

    if dist.get_world_size() < 2:
        return None
    return dist.get_rank(), dist.get_world_size()


def check_ranks_agree(plan: Plan) -> None:
    """Compare ``plan`` (the next training graph this process planned) with the other ranks'
    plans of the same graph; raise ``RematError`` on the last rank to plan it if any differs.
    Does nothing without an initialised process group of two or more ranks, or with
    ``REMAT_CHECK_RANKS=0``. See Note [Ranks agree on plans]."""
    world = _world()
    if world is None or os.environ.get(ENV_SWITCH, "1") == "0":
        return
    rank, size = world
    n = next(_exchanges)
    try:
        store = _default_store()
        store.set(f"{_KEY}/{n}/{rank}", f"{fingerprint(plan)} ({_describe(plan)})")
        if store.add(f"{_KEY}/{n}/count", 1) != size:
            return
        keys = [f"{_KEY}/{n}/{r}" for r in range(size)]
        values = [v.decode() for v in store.multi_get(keys)]
        for key in [*keys, f"{_KEY}/{n}/count"]:  # every rank is done with graph n: keep the store small
            store.delete_key(key)
    except (RuntimeError, OSError) as e:  # the store is gone (a rank exited): the check cannot run
        warnings.warn(f"remat: could not compare training graph #{n}'s plan across ranks through the process "
                      f"group's store ({type(e).__name__}: {e}); training goes on unchecked. Set "
                      f"{ENV_SWITCH}=0 to skip the check.", stacklevel=2)
        return
    if len(set(values)) == 1:
        return
    by_value: dict[str, list[int]] = {}
    for r, v in enumerate(values):
        by_value.setdefault(v, []).append(r)
    seen = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {_ranks(rs)}: {v}" for v, rs in by_value.items())
    raise RematError(
        f"remat: the ranks chose different plans for training graph #{n} (counted from 0 in the "
        f"order each process planned them): {seen}. Expected every rank to trace the same graph and plan it the "
        "same way; different plans mean the ranks traced different graphs (other input shapes, "
        "another code path, other remat options) and can deadlock in collectives. Give every "
        "rank the same shapes (pad or drop the last batch) and the same options. If the ranks "
        f"are meant to run different graphs (pipeline stages), set {ENV_SWITCH}=0."
    )


def _ranks(rs: list[int]) -> str:
    shown = ", ".join(map(str, rs[:8]))
    return shown + (f" and {len(rs) - 8} more" if len(rs) > 8 else "")
