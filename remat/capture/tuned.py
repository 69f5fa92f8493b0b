"""Compiling a graph's candidate plans and measuring them on the user's steps (``remat.tuning``).

``compile_tuned`` compiles, from copies of the captured graph taken first: the plan prediction
chooses (the default plan, or a budget's choice; its frontier planned with it), up to
``Tuning.frontier`` smaller frontier plans and, under a budget, up to ``Tuning.faster`` faster
ones the simulator put just over it (``remat.planning.measured``), and torch.compile's own
partition of the same graph (``Tuning.compile_candidate``), each with its backward compiled at
once so that its peak is read before any step runs. Under a budget a candidate whose read peak or
simulated peak misses it is not measured (Note [Candidates under a budget]). While a graph's
candidates are measured, a graph the step runs after it is given the budget less the most any of
them saves (``saved_while_measuring``, Note [Step budget]): whichever wins, the step keeps the
budget. The winner keeps the budget it was
measured under (``Plan.budget_bytes``), also when it comes from the cache. The callable
handed to Dynamo is a ``TunedGraph`` (``remat.capture.measure``): it runs the candidates
round-robin on the first training steps and keeps the smallest within ``Tuning.tolerance`` of
the fastest. The graph's plan (``compiled_plans``) is the prediction's until then, and the
winner's after, with every candidate's measurement (``Plan.measured``) and the reason (``Plan.chosen_by``).

With ``Tuning.cache`` the decision is kept on disk (``remat.planning.decision_cache``), keyed by
the graph's code and inputs, the options, the device and the torch version; the next run of
the same script compiles only the chosen candidate. A cached choice that planning no longer
produces is measured again.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
import torch.fx as fx

from ..core.selection import Selection
from ..plan import Plan
from ..plan_data import PlanKey
from ..planning.choice import infeasible, peak_allowed
from ..planning.decision_cache import Decision, DecisionCache, decision_key
from ..planning.measured import faster_picks, measured_picks
from ..tuning import Tuning
from . import budget_guard
from .allocator import warn_fragmentation
from .graph_copy import copy_graph
from .measure import TunedGraph, timer_for
from .partition import STOCK

__all__ = ["compile_tuned", "graph_key"]


class _Compiler(Protocol):
    """What ``compile_tuned`` needs of ``remat.capture.dynamo_backend.RematBackend``."""

    plans: list[Plan]
    frontiers: list[tuple[Plan, ...] | None]
    readings: dict[int, Any]
    saved_while_measuring: dict[int, int]
    options: Any

    def compile_plan(self, gm: fx.GraphModule, example_inputs: list[Any], *, pick: PlanKey | None = None,
                     stock: bool = False, want_frontier: bool = False, backward_now: bool = False,
                     measure: bool = True) -> Any: ...


@dataclass
class _Entry:
    """One compiled candidate: its name, the callable Dynamo runs, its plan and its reading."""

    name: str
    run: Callable[..., Any]
    plan: Plan
    reading: Any = None

    @property
    def peak(self) -> int:
        return self.plan.predicted_peak_bytes


def _device(example_inputs: list[Any]) -> tuple[str, str]:
    """(device type, device name) of the graph's inputs: the GPU's name, or the CPU's."""
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return "cuda", torch.cuda.get_device_name(t.device)
    return "cpu", platform.processor() or platform.machine()


def graph_key(gm: fx.GraphModule, example_inputs: list[Any], options: Any, tuning: Tuning) -> str:
    """The decision cache's key of a graph (``remat.planning.decision_cache``)."""
    inputs = [(tuple(t.shape), tuple(t.stride()), str(t.dtype), t.device.type, t.requires_grad)
              if isinstance(t, torch.Tensor) else repr(t) for t in example_inputs]
    opts = (f"backend={options.backend} budget={options.budget} "
            f"policy={[r.name for r in options.policy]} frontier={tuning.frontier} faster={tuning.faster} "
            f"tolerance={tuning.tolerance} compile_candidate={tuning.compile_candidate} offload={options.offload}")
    return decision_key(gm.code + repr(inputs), _device(example_inputs)[1], torch.__version__, opts)


def _take(rb: _Compiler, k: int, name: str, run: Callable[..., Any]) -> _Entry:
    """The plan (and reading) graph index ``k`` just got, removed so that the next candidate's
    compile plans at ``k`` too."""
    plan = rb.plans.pop(k)
    del rb.frontiers[k:]
    return _Entry(name, run, plan, rb.readings.pop(k, None))


def _put(rb: _Compiler, k: int, entry: _Entry, **changes: Any) -> None:
    rb.plans.insert(k, replace(entry.plan, **changes))
    rb.frontiers.insert(k, None)
    if entry.reading is not None:
        rb.readings[k] = entry.reading


def _name(plan: Plan) -> str:
    return f"remat {plan.origin or 'default'}"


def _cached(rb: _Compiler, k: int, gm: fx.GraphModule, example_inputs: list[Any], hit: Decision) -> Any:
    """The cached choice compiled alone; None (and nothing kept) when planning no longer has it."""
    stock = hit.name == STOCK
    run = rb.compile_plan(gm, example_inputs, stock=stock, pick=None if stock else hit.chosen)
    if k >= len(rb.plans) or (not stock and rb.plans[k].key != hit.chosen):
        del rb.plans[k:], rb.frontiers[k:]
        rb.readings.pop(k, None)
        return None
    table = ", ".join(f"{n} {s * 1e3:.3f} ms" for n, s, _ in hit.table)
    rb.plans[k] = replace(rb.plans[k], measured=hit.table, chosen_by=f"decision cache: {hit.reason}",
                          budget_bytes=hit.budget_bytes,
                          notes=(*rb.plans[k].notes, f"chosen by an earlier run's measurement ({table})"))
    return run


# Note [Candidates under a budget]
# A candidate is measured by running it on a training step, and under a hard memory cap (a
# process's memory fraction, the long-context benchmark's) a step over the cap fails with an
# out-of-memory error rather than being measured over the budget. Inductor's memory plan can
# read below the step (HF Llama's sliced plan: read 2,705 MiB, measured 3,109), so a candidate
# other than the chosen plan is measured only if both its read peak and the simulator's fit the
# budget. Seen on an H100 at 43,008 tokens under a 20 GiB cap: torch.compile's own partition was
# planned as a candidate at a simulated 27.83 GiB against an 18.62 GiB budget, and a step ran out
# of memory (which candidate's step it was is not recorded). A faster plan the simulator put over
# the budget (Note [Faster plans the simulator put over the budget] in ``remat.planning.measured``)
# was picked because its simulated peak times the choice's read over its simulated peak fits (no
# such plan is compiled where the simulator under-predicted the choice), so its read alone decides.


def compile_tuned(rb: _Compiler, gm: fx.GraphModule, example_inputs: list[Any], tuning: Tuning) -> Any:
    """Compile the graph's candidates and return the callable that measures them (module
    docstring); a graph that cannot be copied, or whose planning fell back, is compiled once."""
    k = len(rb.plans)
    copies = [copy_graph(gm) for _ in range(tuning.frontier + tuning.faster + tuning.compile_candidate + 1)]
    if any(c is None for c in copies):
        return rb.compile_plan(gm, example_inputs)
    cache = DecisionCache(tuning.cache_dir) if tuning.cache else None
    key = graph_key(gm, example_inputs, rb.options, tuning)
    hit = cache.load(key) if cache is not None else None
    if hit is not None:
        run = _cached(rb, k, copies.pop(), example_inputs, hit)
        if run is not None:
            return run
    first = rb.compile_plan(gm, example_inputs, want_frontier=True, backward_now=True, measure=False)
    if k >= len(rb.plans) or rb.plans[k].fallback:
        return first
    frontier = rb.frontiers[k] or ()
    entries = [_take(rb, k, _name(rb.plans[k]), first)]
    chosen = entries[0].plan
    faster = faster_picks(chosen, frontier, tuning.faster, chosen.budget_bytes)
    for p in [*measured_picks(chosen, frontier, tuning.frontier, chosen.budget_bytes), *faster]:
        run = rb.compile_plan(copies.pop(), example_inputs, pick=p.key, backward_now=True)
        if k < len(rb.plans) and rb.plans[k].key == p.key:
            entries.append(_take(rb, k, _name(rb.plans[k]), run))
        else:
            del rb.plans[k:], rb.frontiers[k:]
            rb.readings.pop(k, None)
    if tuning.compile_candidate:
        run = rb.compile_plan(copies.pop(), example_inputs, stock=True, backward_now=True)
        if k < len(rb.plans):
            entries.append(_take(rb, k, STOCK, run))
    if chosen.budget_bytes is not None:  # Note [Candidates under a budget]
        stretched = {p.key for p in faster}  # their scaled simulation fits (faster_picks): their read decides

        def judged(e: _Entry) -> int:
            return e.peak if e.plan.key in stretched else max(e.peak, e.plan.simulated_peak_bytes)

        entries = [e for i, e in enumerate(entries) if i == 0 or judged(e) <= chosen.budget_bytes]
    budget = chosen.budget_bytes
    meter = budget_guard.meter_for(example_inputs) if budget is not None else None
    if meter is not None and budget:
        warn_fragmentation(budget)  # Note [Allocator retries at the limit]
    if len(entries) == 1 and meter is None:  # one candidate under a budget on CUDA is still measured
        _put(rb, k, entries[0])
        return first
    names = ", ".join(e.name for e in entries)
    rb.saved_while_measuring[k] = max(e.plan.saved_bytes for e in entries)
    _put(rb, k, entries[0], notes=(*entries[0].plan.notes, f"measuring {len(entries)} candidates on the first "
                                   f"training steps ({names}); this plan runs until then"))

    def decided(index: int, selection: Selection) -> None:
        if index < 0:
            raise infeasible(chosen.budget_bytes or 0, min(m.peak_bytes for m in selection.measured),
                             missed=tuple(f"{m.name} measured on training steps at {m.peak_bytes / 2**20:.1f} MiB"
                                          for m in selection.measured))
        winner = entries[index]
        rb.saved_while_measuring.pop(k, None)
        ran = [i for i, m in enumerate(selection.measured) if m.seconds]  # Note [A candidate out of memory]
        table = tuple((m.name, m.median, m.peak_bytes) for m in (selection.measured[i] for i in ran))
        shown = ", ".join(f"{n} {s * 1e3:.3f} ms / {b / 2**20:.1f} MiB" for n, s, b in table)
        plan = winner.plan.with_measured_peak(table[ran.index(index)][2]) if meter is not None else winner.plan
        rb.plans[k] = replace(plan, measured=table, chosen_by=f"measured: {selection.reason}",
                              budget_bytes=chosen.budget_bytes,
                              notes=(*winner.plan.notes, f"measured on the first training steps ({shown}): "
                                     f"{selection.reason}"))
        rb.readings.pop(k, None)
        if winner.reading is not None:
            rb.readings[k] = winner.reading
        if cache is not None:
            cache.store(key, Decision(winner.plan.key, winner.name, selection.reason, table, chosen.budget_bytes))

    device = _device(example_inputs)[0]

    def allowed(peak: int) -> bool:  # Note [Measured budget peak]
        return peak <= (1 + budget_guard.MEASURED_SLACK) * peak_allowed(budget or 0, chosen.eager_peak_bytes)

    return TunedGraph([(e.name, e.run, lambda e=e: e.peak) for e in entries], timer_for(device),
                      tuning.samples, tuning.tolerance, decided, meter=meter,
                      allowed=allowed if meter is not None else None)

