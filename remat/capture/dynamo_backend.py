"""Capture: the Dynamo backend that hands each captured graph to the chosen backend
(``remat.backends.base``: Inductor or uncompiled), which traces it with AOTAutograd and splits it
with remat's partition function."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx

from .. import compat, distributed
from ..analysis.provenance import clean_module_paths
from ..backends.registry import backend_for
from ..errors import RematError
from ..logs import planning, warn_at_user
from ..options import Options
from ..plan import Plan, format_bytes
from ..plan_data import PlanKey
from ..planning.choice import (
    MAX_COMPILES,
    Attempt,
    Earlier,
    compile_within_budget,
    infeasible,
    missed_budget,
    peak_allowed,
)
from ..tuning import Tuning
from . import buckets, budget_guard, unsent_grads
from .allocator import warn_fragmentation
from .attention import AttentionReport, rewrite_attention
from .graph_copy import copy_graph
from .partition import make_partition_fn, make_stock_partition_fn
from .tuned import compile_tuned

__all__ = ["RematBackend", "remat_backend"]


class _Planned(Exception):
    """Raised after planning in explain-only mode, to skip compiling the planned graph."""


def _plan_line(plan: Plan) -> str:
    """``saves 161.50 KiB vs eager autograd 258.00 KiB (63%), predicted peak 1.20 MiB``."""
    if plan.fallback:
        return f"fell back to autograd's saved tensors ({plan.fallback})"
    ratio = f" ({plan.saved_bytes / plan.eager_saved_bytes:.0%})" if plan.eager_saved_bytes else ""
    return (f"saves {format_bytes(plan.saved_bytes)} vs eager autograd {format_bytes(plan.eager_saved_bytes)}"
            f"{ratio}, predicted peak {format_bytes(plan.predicted_peak_bytes)}")


def _watched(partition: Callable[..., Any], backend: RematBackend) -> Callable[..., Any]:
    """The partition function, timed and with its warnings at the user's line.

    Planning runs deep inside Dynamo and AOTAutograd: a ``remat:`` warning it raises (a
    policy rule that matched nothing, a fallback) is re-raised at the user's line
    (``logs.warn_at_user``) rather than inside remat; other warnings pass through unchanged.
    A slow planning is reported on ``remat.progress`` (``logs.planning``)."""

    @functools.wraps(partition)
    def run(joint: fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        label = f"graph {len(backend.plans) + 1}"
        if backend.joints is not None:
            backend.joints.append(joint)
        try:
            with warnings.catch_warnings(record=True) as caught, planning(label, len(joint.graph.nodes)) as done:
                warnings.simplefilter("always")
                backend._planned = done
                fw_bw = partition(joint, *args, **kwargs)
                backend._stand_ins |= unsent_grads.has_stand_ins(fw_bw)
                return fw_bw
        finally:  # also when explain-only planning stops with _Planned
            backend._planned = None
            for w in caught:
                if str(w.message).startswith("remat:"):
                    warn_at_user(str(w.message), w.category)
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)

    return run


class RematBackend:
    """A Dynamo backend. ``plans`` collects one Plan per captured training graph, in capture
    order. With ``explain_only``, graphs are planned but run uncompiled and never trained."""

    def __init__(self, options: Options, *, explain_only: bool = False, want_frontier: bool = False,
                 keep_joints: bool = False):
        self.options = options
        self.backend = backend_for(options.backend)
        """The backend that plans and lowers every graph."""
        self.reference = backend_for("eager")
        """The uncompiled backend eager autograd's baseline is simulated with (op by op)."""
        self.explain_only = explain_only
        self.want_frontier = want_frontier
        self.plans: list[Plan] = []
        self.frontiers: list[tuple[Plan, ...] | None] = []
        self.graph_breaks: list[str] = []
        """Where Dynamo broke the model's graphs (``file:line (why)``), in capture order."""
        self._warned_breaks = False
        self._planned: Callable[[str], None] | None = None
        self._stand_ins = False
        """Whether the graph being lowered was planned without the gradients of outputs beside its
        loss (Note [Gradients the caller does not send] in ``remat.capture.unsent_grads``)."""
        self._break: str | None = None
        """Where Dynamo ended the graph being compiled, if at a graph break."""
        self.split_ddp = False
        """Whether remat splits graphs at DDP's gradient buckets itself (set per call by
        ``distributed.remat_splits_ddp``; with ``torch.compile(backend="remat")`` Dynamo does)."""
        self.joints: list[fx.GraphModule] | None = [] if keep_joints else None
        """With ``keep_joints``: each planned joint graph, as planned (for DDP's split)."""
        self.readings: dict[int, Any] = {}
        """Plan index -> ``remat.core.allocations.Reading`` of its compiled graphs (Inductor)."""
        self.saved_while_measuring: dict[int, int] = {}
        """Plan index -> the most any of its candidates saves, while they are measured on the
        first steps (``remat.capture.tuned``): what a later graph's share of the budget leaves
        for it (Note [Step budget])."""
        self._step_start = 0
        """Index of the first plan compiled in the current step (``begin_step``): the plans from
        there on are the graphs the step ran before the one being compiled (Note [Step budget])."""
        self._hands_over: set[int] = set()
        """Plan indices of graphs Dynamo ended at a graph break: their outputs go to the code
        that resumes after it, not to the caller (Note [What the caller holds])."""
        self.attention: AttentionReport = AttentionReport()
        """What the attention rewrite did to the graph being compiled (Note [Attention as eager
        runs it]); its note goes into each plan of that graph."""

    def begin_step(self) -> None:
        """A training step of the wrapped model starts: graphs compiled from now on share its
        budget with each other, not with graphs of an earlier step (a recompile's)."""
        self._step_start = len(self.plans)

    def _apply_readings(self) -> None:
        """Give each plan the peak read from its compiled graphs, under the caller the step's
        graphs show (Note [What the caller holds] in ``remat.core.allocations``)."""
        loss_in_step = any(r.loss_in_graph for r in self.readings.values())
        for k, reading in self.readings.items():
            if k < len(self.plans) and not self.plans[k].fallback:
                # A graph ended at a break hands its outputs to the next graph, which keeps only
                # what it saves, wherever the loss is: so also before the next graph is compiled
                # (the budget's re-plan judges this graph's read peak then).
                peak = reading.peak(loss_in_step or k in self._hands_over)
                self.plans[k] = self.plans[k].with_compiled_peak(peak.peak_bytes, peak.at, peak.notes)

    def warn_graph_breaks(self, stacklevel: int = 2) -> None:
        """One warning per wrapped model listing its graph breaks, if it has any."""
        if self._warned_breaks or not self.graph_breaks:
            return
        self._warned_breaks = True
        warnings.warn(
            f"remat: Dynamo broke the model into several graphs at {len(self.graph_breaks)} graph "
            f"break(s): {'; '.join(self.graph_breaks)}. Each captured graph is planned on its own "
            "(remat.compiled_plans lists them): nothing is recomputed across a break, and tensors "
            "that cross it stay alive. Remove the breaks to plan the step as one graph "
            "(torch._dynamo.explain(model)(*inputs) explains each).",
            stacklevel=stacklevel + 1,
        )

    def _sink(self, plan: Plan, frontier: tuple[Plan, ...] | None) -> None:
        note = self.attention.note()
        if note is not None and note not in plan.notes:
            plan = replace(plan, notes=(*plan.notes, note))
        if self._planned is not None:
            self._planned(_plan_line(plan))
        self.plans.append(plan)
        self.frontiers.append(frontier)
        if self.explain_only:
            raise _Planned()
        distributed.check_ranks_agree(plan)  # Note [Ranks agree on plans]; no-op outside torch.distributed

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        clean_module_paths(gm)
        self.attention = rewrite_attention(gm, strict=self.options.strict)
        where = compat.graph_break(gm)
        if where is not None and where not in self.graph_breaks:
            self.graph_breaks.append(where)
        self._break = where
        ddp = compat.active_ddp_module() if self.split_ddp and not self.explain_only else None
        if ddp is not None:
            return self._compile_by_bucket(gm, example_inputs, ddp.bucket_bytes_cap)
        return self._compile(gm, example_inputs)

    def _compile_by_bucket(self, gm: fx.GraphModule, example_inputs: list[Any], bucket_bytes_cap: int) -> Any:
        """Split ``gm`` at DDP's gradient buckets as Dynamo would, after letting the pieces that
        read a value the whole graph's plan recomputes compute it themselves; compile each piece.
        See Note [Bucket pieces keep the whole plan] (``remat.capture.buckets``)."""

        def regroup(g: fx.GraphModule, piece: dict[fx.Node, int]) -> dict[fx.Node, int]:
            # called only when there are two buckets or more: a one-bucket graph is planned once
            return buckets.regroup(g, piece, *self._whole_plan_values(gm, example_inputs))

        return compat.ddp_bucket_split(gm, example_inputs, bucket_bytes_cap, self._compile, regroup)

    def _whole_plan_values(self, gm: fx.GraphModule, example_inputs: list[Any]) -> tuple[set[str], set[str]]:
        """``buckets.whole_plan_values`` of ``gm``'s default plan (a budget bounds each piece's
        plan, README: per graph; the whole graph may not fit a budget each piece fits), planned
        on a copy (Inductor's passes change graphs in place) without compiling it. Empty sets
        (split as Dynamo does) when there is no training graph or its planning fell back."""
        whole = RematBackend(dataclasses.replace(self.options, budget=None), explain_only=True, keep_joints=True)
        copied = copy_graph(gm)
        if copied is None:
            return set(), set()
        whole(copied, example_inputs)
        if not whole.plans or not whole.joints or whole.plans[0].fallback is not None:
            return set(), set()
        plan = whole.plans[0]
        return buckets.whole_plan_values(whole.joints[0], {s.name for s in plan.saved}, set(plan.recomputed), gm)

    def _compile(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        """Plan and compile one graph: by measuring candidates on the first training steps where
        the options ask for it (``remat.capture.tuned``), else the plan prediction chooses."""
        tuning = self._tuning(example_inputs)
        if tuning is not None:
            return compile_tuned(self, gm, example_inputs, tuning)
        return self.compile_plan(gm, example_inputs)

    def _tuning(self, example_inputs: list[Any]) -> Tuning | None:
        """The options' ``Tuning`` when this graph is measured: it trains (not ``explain``), it
        runs on a device the tuning measures, and no process group of several ranks would need
        every rank to measure alike (each process would time its own steps and might choose
        another plan: the ranks' graphs must agree, Note [Ranks agree on plans])."""
        tuning = self.options.tune
        if tuning is None or self.explain_only or distributed.world_size() > 1:
            return None
        devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
        device = "cuda" if "cuda" in devices else next(iter(sorted(devices - {"cpu"})), "cpu")
        return tuning if tuning.measures(device) else None

    def compile_plan(self, gm: fx.GraphModule, example_inputs: list[Any], *, pick: PlanKey | None = None,
                     stock: bool = False, want_frontier: bool = False, backward_now: bool = False,
                     measure: bool = True) -> Any:
        """Plan and compile one graph with this backend's options; under a budget, again while
        the compiled step misses it (``remat.planning.choice.compile_within_budget``), and on
        CUDA while its measured step does (``measure``, Note [Measured budget peak]). ``pick``:
        the candidate plan to compile (``remat.tuning``; no re-plan); ``stock``: torch.compile's
        own partition instead of a plan; ``want_frontier``: the frontier is planned too;
        ``backward_now``: the backward is compiled with the forward (its peak read at once)."""
        k = len(self.plans)  # the index this graph's plan gets
        if self._break is not None:
            self._hands_over.add(k)

        def read_peak(reading: Any) -> None:  # the compiled step's peak (remat.core.allocations)
            self.readings[k] = reading
            self._apply_readings()

        budgeted = self.options.budget is not None and not self.explain_only
        replans = budgeted and pick is None and not stock
        pristine = copy_graph(gm) if replans else None  # to compile again from: Inductor changes gm
        compiled = None

        start = self._step_start  # Note [Step budget]
        earlier = Earlier.of(self.plans[start:k], self.frontiers[start:k],
                             [max(p.saved_bytes, self.saved_while_measuring.get(i, 0))
                              for i, p in enumerate(self.plans[start:k], start)])

        compiles = 0

        def compile_once(attempt: Attempt) -> Plan | None:
            nonlocal gm, pristine, compiled, compiles
            compiles += 1
            attempt = replace(attempt, earlier=earlier)
            if attempt.compiles:  # the last compile missed the budget: its plan goes
                del self.plans[k:], self.frontiers[k:]
                self.readings.pop(k, None)
                gm, pristine = pristine, copy_graph(pristine)
            if stock:
                partition = make_stock_partition_fn(self.options, self._sink, self.backend, self.reference,
                                                    ends_at_break=self._break is not None)
            else:
                partition = make_partition_fn(self.options, self._sink, self.backend, self.reference,
                                              self.want_frontier or want_frontier,
                                              ends_at_break=self._break is not None, attempt=attempt, pick=pick)
            now = budgeted or backward_now
            with compat.backward_compiled_now() if now else contextlib.nullcontext():
                compiled = self._lower(gm, example_inputs, _watched(partition, self), read_peak, stock)
            if pristine is None:  # no re-plan, or no copy to compile again from: nothing to judge
                return None
            return self.plans[k] if k < len(self.plans) else None

        note = compile_within_budget(compile_once)
        if note is not None and k < len(self.plans):
            self.plans[k] = replace(self.plans[k], notes=(*self.plans[k].notes, note))
        if k < len(self.plans) and not self.explain_only:  # the inputs it runs for: a recompile adds a plan
            self.plans[k] = replace(self.plans[k], compiled_for=_compiled_for(gm, example_inputs))
        # Several ranks would each measure their own step and might plan differently (Note [Ranks
        # agree on plans]): there the reading alone decides.
        meter = (budget_guard.meter_for(example_inputs)
                 if replans and measure and distributed.world_size() <= 1 else None)
        if meter is not None and k < len(self.plans) and self.plans[k].budget_bytes:
            warn_fragmentation(self.plans[k].budget_bytes)  # Note [Allocator retries at the limit]
        if meter is None or pristine is None or k >= len(self.plans) or self.plans[k].fallback:
            return compiled
        return self._guarded(k, compiled, meter, pristine, budget_guard.lookalike_inputs(example_inputs),
                             earlier, compiles, read_peak)

    def _guarded(self, k: int, compiled: Any, meter: budget_guard.Meter, source: fx.GraphModule,
                 inputs: Callable[[], list[Any]], earlier: Earlier, compiles: int,
                 read_peak: Callable[[Any], None]) -> budget_guard.BudgetGuard:
        """``compiled``, measured on a training step and planned again when it misses its budget
        (Note [Measured budget peak]); ``source``: an uncompiled copy of the graph."""
        state: dict[str, Any] = {"compiles": compiles, "attempt": None, "missed": []}
        ends_at_break = k in self._hands_over

        def judge(peak: int) -> bool:
            plan = self.plans[k]
            self.plans[k] = plan.with_measured_peak(peak)
            limit = plan.budget_bytes or 0
            if peak <= (1 + budget_guard.MEASURED_SLACK) * peak_allowed(limit, plan.eager_peak_bytes):
                return False
            state["missed"].append(missed_budget(plan, peak))
            if state["compiles"] >= MAX_COMPILES:
                raise infeasible(limit, peak, missed=tuple(state["missed"]))
            gap = max(0, peak - (plan.simulated_peak_bytes or plan.predicted_peak_bytes))
            state["attempt"] = Attempt({plan.key: peak}, last=True, compiles=state["compiles"], gap=gap,
                                       earlier=earlier)
            return True

        def replan() -> Any:
            state["compiles"] += 1
            tail = (self.plans[k + 1:], self.frontiers[k + 1:], {i: r for i, r in self.readings.items() if i > k})
            del self.plans[k:], self.frontiers[k:]
            self.readings = {i: r for i, r in self.readings.items() if i < k}
            partition = make_partition_fn(self.options, self._sink, self.backend, self.reference, self.want_frontier,
                                          ends_at_break=ends_at_break, attempt=state["attempt"])
            try:
                with compat.backward_compiled_now():
                    run = self._lower(copy_graph(source) or source, inputs(), _watched(partition, self), read_peak)
            finally:
                self.plans[k + 1:], self.frontiers[k + 1:] = tail[0], tail[1]
                self.readings.update(tail[2])
                self._apply_readings()
            plan = self.plans[k]
            note = f"budget re-plan on a measured step ({state['compiles']} compiles): {'; '.join(state['missed'])}"
            self.plans[k] = replace(plan, notes=(*plan.notes, note))
            allowed = (1 + budget_guard.MEASURED_SLACK) * peak_allowed(plan.budget_bytes or 0, plan.eager_peak_bytes)
            if plan.budget_bytes is not None and plan.compiled_peak_bytes > allowed:
                raise infeasible(plan.budget_bytes, plan.compiled_peak_bytes,
                                 missed=(*state["missed"], missed_budget(plan, plan.compiled_peak_bytes, "read")))
            return run

        return budget_guard.BudgetGuard(compiled, meter, judge, replan, budget=self.plans[k].budget_bytes)

    def _lower(self, gm: fx.GraphModule, example_inputs: list[Any], partition: Callable[..., Any],
               read_peak: Callable[[Any], None], stock: bool = False) -> Any:
        self._stand_ins = False
        try:
            compiled = self.backend.compile(gm, example_inputs, partition, read_peak, stock=stock,
                                            wrap_backward=unsent_grads.wrapped_backward)
            return unsent_grads.ForwardWithoutZeroFill(compiled) if self._stand_ins else compiled
        except _Planned:
            return gm.forward
        except Exception as e:  # Dynamo wraps backend errors; unwrap our own _Planned
            cause = e
            while cause is not None:
                if isinstance(cause, _Planned):
                    return gm.forward
                cause = cause.__cause__
            raise


def _compiled_for(gm: fx.GraphModule, example_inputs: list[Any]) -> str:
    """``Plan.compiled_for``: the inputs a graph was compiled for."""
    shown = []
    for node, real in zip([n for n in gm.graph.nodes if n.op == "placeholder"], example_inputs):
        val = node.meta.get("example_value", real)
        if isinstance(real, torch.nn.Parameter):
            continue
        if isinstance(val, torch.Tensor):
            dims = "x".join(str(d) for d in val.shape) or "scalar"
            shown.append(f"{dims} {str(val.dtype).removeprefix('torch.')}")
        elif isinstance(val, (int, float, torch.SymInt, torch.SymFloat)):
            shown.append(f"{type(val).__name__} {val}")
    more = f" and {len(shown) - 6} more" if len(shown) > 6 else ""
    return f"{', '.join(shown[:6]) or 'none besides parameters'}{more}"


def remat_backend(gm: fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None) -> Any:
    """``torch.compile(model, backend="remat")``: remat with default options (Inductor), or
    ``remat.checkpoint``'s options given as torch.compile's ``options={...}``."""
    given = dict(options or {})
    known = {f.name for f in dataclasses.fields(Options)}
    if set(given) - known:
        raise RematError(
            f"remat: torch.compile(backend='remat', options=...) takes remat.checkpoint's options "
            f"({', '.join(sorted(known))}); got {', '.join(sorted(set(given) - known))}. Pass only those, "
            "e.g. options={'backend': 'eager'}, or use remat.checkpoint(model, ...).")
    return RematBackend(Options(**given))(gm, example_inputs)
