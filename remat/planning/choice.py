"""How a budget decides a graph's plan, all of it: the choice by predicted peak among the
candidates (``choose``, through ``within_budget``), the re-plan on the compiled step's peak
(``compile_within_budget``, Note [Budget re-plan], at most ``MAX_COMPILES`` compiles), and the
one text of ``InfeasibleBudgetError`` (``infeasible``).

From ``remat.checkpoint(budget=)``: ``Options.budget`` (``remat.budget.Budget``) reaches capture
(``RematBackend._compile``), which runs ``compile_within_budget`` with a callable that compiles
the graph once; each compile plans the graph (``remat.planning.planner.plan_joint_graph``),
which calls ``within_budget`` with the candidates and the compile's ``Attempt``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from ..budget import Budget
from ..errors import InfeasibleBudgetError
from ..plan_data import PlanData, PlanKey
from ..units import format_bytes
from .build_plan import EagerBaseline
from .candidates import Candidate

__all__ = ["MAX_COMPILES", "EAGER_PEAK_SLACK", "Attempt", "Earlier", "FIRST", "choose", "above_eager",
           "budget_share", "default_first", "judged_peak", "within_budget", "compile_within_budget", "infeasible",
           "missed_budget", "peak_allowed"]

MAX_COMPILES = 2
"""At most this many compiles of one graph under a budget (Note [Budget re-plan])."""

EAGER_PEAK_SLACK = 0.02
"""How far above eager autograd's own peak a budget of at least that peak lets its smallest plan
be, when no plan fits it (Note [A budget at eager's peak])."""

# Note [A budget at eager's peak]
# A budget of eager autograd's own predicted peak (``budget=1.0``) asks for no more than eager:
# eager's plan, saving what autograd saves and run as eager runs it, keeps it by definition.
# remat's plans run as the backend runs them and are predicted by the backend's model of the
# step, which can put even the smallest plan a few bytes above eager's op-by-op model: the
# README's demo under the Inductor model, smallest 453.62 KiB against eager's 453.50 KiB, measured
# on CPU at 448,008 B against eager's 448,776 B (examples/quickstart.py's model). So when the
# budget is at least eager's peak and no candidate fits it, the candidate of the smallest peak is
# taken if that peak is within ``EAGER_PEAK_SLACK`` of eager's, and its plan says so (the compiled
# re-plan judges the read peak the same way, ``_missed``); further above, the budget raises as
# any other. A budget below eager's peak never gets the slack.

# Note [Budget re-plan]
# Under a budget, the planner takes the default plan when its *predicted* peak fits, else the
# fastest candidate whose predicted peak fits (``choose``). With a backend that reads the
# compiled step's peak (Inductor: ``remat.core.allocations``), the backward is compiled with the forward,
# and if the peak read from the compiled graphs misses the budget, the graph is planned once more
# and compiled again, at most ``MAX_COMPILES`` (two) compiles of the graph in all. The second
# choice is driven by what the first compile read: that candidate's read peak replaces its
# prediction (``Attempt.known_peaks``), and every other candidate is predicted higher by the
# amount the reading exceeded the prediction (``Attempt.gap``), so the fastest candidate that
# fits with that correction is compiled. What the model of the step misses on the GPU is mostly
# code the backend generates whatever is saved (HF GPT-2 on the H200: the logits gradient's
# buffer and padded matmul copies, +0.6 GiB on each of four plans predicted at 2.1 to 2.4 GiB), so
# a constant correction is what the reading says of the plans not compiled; for a plan smaller
# than the one read, adding the gap is above scaling by the reading's ratio. If no candidate fits
# with the correction, ``InfeasibleBudgetError`` is raised at once, naming the reading (an HF
# encoder-decoder at ``budget=0.5`` once spent four compiles reading 2.72-2.76 GiB whatever the
# plan). If the second compile misses too, it names both readings: a budget remat accepts is
# one its compiled step was read to keep. On CUDA the first training step's allocator peak is
# then compared with the budget too (Note [Measured budget peak] in ``remat.capture.budget_guard``).
#
# A plan kept over its budget would be a budget accepted and not kept. Before the last compile
# raised, HF GPT-2 at budget 0.75 on the H200 kept, after four compiles, a plan read at 5.31 GiB
# against its first graph's budget of 4.86 GiB, 1.2 GiB above the default plan's measured peak
# (benchmarks/real-models-h200-s8-gpt2-budgets.json). Its first compile was the default plan,
# read at 5.30 GiB because Dynamo breaks GPT-2 before the loss and the loss graph was not compiled
# yet, so the caller was taken to hold the first graph's outputs (the logits) through the
# backward; a graph ended at a break hands them to the next graph (``RematBackend._hands_over``),
# and read so that plan's peak is 4.15 GiB, under the budget.


# Note [Step budget]
# A budget bounds the step, not each graph: Dynamo may break a model into several graphs, which
# the step runs forwards in order and backwards in reverse, so while graph k runs, what graphs
# 0..k-1 saved is alive (``PlanData.combine`` composes the step's peak the same way). Each graph
# is planned when the step first reaches it, so graph k's share of a budget is the budget less
# what the graphs the step ran before it save (``Earlier``), and a fraction is of eager
# autograd's peak of the step so far (composed the same way). The first graph takes what its own
# choice needs: a later graph that cannot fit what is left raises ``InfeasibleBudgetError``,
# naming what the earlier graphs hold, rather than letting the step exceed the budget (on CPU a
# two-graph model at 0.7x its default peak measured 46% over the budget when each graph was given
# all of it). A graph whose candidate plans are still measured on the first steps
# (``remat.capture.tuned``) counts as saving the most any of them saves, so that whichever wins,
# the later graphs' shares still add up to the budget.


@dataclass(frozen=True)
class Earlier:
    """What the graphs the step ran before this one leave alive while it runs (Note [Step budget])."""

    graphs: int = 0
    saved_bytes: int = 0
    """The bytes their plans save (alive until their backwards, which run after this graph's)."""
    eager_saved_bytes: int = 0
    """The bytes eager autograd saves for them."""
    eager_peak_bytes: int = 0
    """Eager autograd's predicted peak of those graphs, composed (``PlanData.combine``)."""

    least_saved_bytes: int = 0
    """The least those graphs' plans could have saved (the smallest on each one's frontier)."""

    @classmethod
    def of(cls, plans: list[PlanData], frontiers: list[tuple[PlanData, ...] | None],
           saved: list[int] | None = None) -> Earlier:
        """``saved``: the bytes each plan may leave saved, where more than its own (a graph whose
        candidate plans are measured on the first steps: the most any of them saves)."""
        saved = [p.saved_bytes for p in plans] if saved is None else saved
        peak = before = 0
        for p in plans:
            peak = max(peak, before + p.eager_peak_bytes)
            before += p.eager_saved_bytes
        least = sum(min((q.saved_bytes for q in (f or ())), default=p.saved_bytes)
                    for p, f in zip(plans, [*frontiers, *[None] * len(plans)]))
        return cls(len(plans), sum(saved), before, peak, min(least, sum(saved)))


@dataclass(frozen=True)
class Attempt:
    """One compile of a graph under a budget (Note [Budget re-plan]): the peaks read from the
    earlier compiles' plans (``PlanData.key`` -> bytes), used instead of their predictions, the
    correction of every other prediction (``gap``), and whether it is the last compile."""

    known_peaks: Mapping[PlanKey, int] = field(default_factory=dict)
    last: bool = False
    compiles: int = 0
    gap: int = 0
    """How far the earlier compiles' readings (or measurements) were above their predictions at
    most: added to the prediction of every candidate not read yet."""
    """How many compiles of this graph came before it."""
    earlier: Earlier = Earlier()
    """The graphs the step ran before this one (Note [Step budget])."""


FIRST = Attempt()
"""The first (and, without a budget, only) compile of a graph."""


def infeasible(budget_bytes: int, smallest: int, *, eager_peak: int = 0, floor: int = 0,
               missed: tuple[str, ...] = (), earlier: Earlier | None = None,
               step_budget: int = 0, gap: int = 0) -> InfeasibleBudgetError:
    """The error for a budget of ``budget_bytes`` that no plan keeps, ``smallest`` the least peak
    seen. ``missed``: the re-plan's compiles, each read over the budget (Note [Budget re-plan]);
    otherwise no candidate's predicted peak fits (``eager_peak`` for scale, and ``floor``,
    ``remat.core.peak.floor_bytes``, named when the budget is below it), each prediction raised
    by ``gap`` where an earlier compile read that much more than predicted."""
    if earlier is not None and earlier.graphs:
        finding = (f"the step's budget of {format_bytes(step_budget)} leaves this graph (graph "
                   f"{earlier.graphs + 1} of the step, after a graph break) {format_bytes(budget_bytes)}: the "
                   f"{earlier.graphs} graph(s) before it save {format_bytes(earlier.saved_bytes)}, alive until "
                   f"their backwards, and this graph's smallest predicted peak is "
                   f"{format_bytes(smallest - earlier.saved_bytes)} (eager autograd's: {format_bytes(eager_peak)}); "
                   "the step needs at least what the earlier graphs save plus that")
        if earlier.least_saved_bytes < earlier.saved_bytes:
            finding += (f" (had the earlier graphs taken their smallest plans, saving "
                        f"{format_bytes(earlier.least_saved_bytes)}, it would need "
                        f"{format_bytes(smallest - earlier.saved_bytes + earlier.least_saved_bytes)}: "
                        "each graph is planned when the step first reaches it, so the first graphs "
                        "cannot yet leave room for later ones; removing the graph break lets one plan "
                        "see the whole step)")
    elif missed:
        finding = (f"no plan of this graph compiled under its budget of {format_bytes(budget_bytes)} in "
                   f"{len(missed)} compiles ({'; '.join(missed)}): their compiled peaks exceed their predictions")
    elif gap > 0:
        finding = (f"no plan fits a peak of {format_bytes(budget_bytes)}: a compile of this graph read "
                   f"{format_bytes(gap)} more than its plan's predicted peak, and with that added the smallest "
                   f"peak for this graph is {format_bytes(smallest)} (eager autograd's: {format_bytes(eager_peak)}); "
                   "no further compile is spent on it")
    else:
        finding = (f"no plan fits a peak of {format_bytes(budget_bytes)}: the smallest predicted peak for this "
                   f"graph is {format_bytes(smallest)} (eager autograd's: {format_bytes(eager_peak)})")
        if floor and budget_bytes < floor:
            finding += (f"; none of remat's plans can fit it: in remat's model of this step the gradients, "
                        f"outputs and output gradients, with the operands of the backward's largest op, need "
                        f"{format_bytes(floor)} whatever is saved or recomputed (a differently scheduled "
                        "backward may need less)")
    return InfeasibleBudgetError(f"remat: {finding}. Raise the budget to at least {format_bytes(smallest)}, "
                                 "or use remat.pareto(model, *inputs) to see every trade-off.")


def choose(candidates: list[Candidate], budget_bytes: int, eager_peak: int, floor: int = 0,
           attempt: Attempt = FIRST) -> Candidate:
    """The default plan (``candidates[0]``) when its peak fits the budget; otherwise the fastest
    candidate whose peak fits it (ties to the lower peak), whose peak is then below the default
    plan's. A budget never trades the default plan's memory, or its speed, for an estimate: the
    estimates that rank candidates of nearly equal predicted peak are not worth the risk that
    the compiled step misses (Note [Budget re-plan]). Raises InfeasibleBudgetError if nothing
    fits (``infeasible``).

    Monotone: lowering the budget only removes candidates, so the chosen peak never rises and
    the estimated time cost never falls.

    ``attempt``: the peaks read from compiled candidates, used instead of their predictions,
    and the correction the readings call for added to every other prediction (Note [Budget
    re-plan])."""

    def peak(c: Candidate) -> int:
        return judged_peak(c, attempt)

    if peak(candidates[0]) <= budget_bytes:
        return candidates[0]
    fitting = [c for c in candidates if peak(c) <= budget_bytes]
    if not fitting:
        smallest = min(candidates, key=lambda c: (peak(c), c.time, c.saved_bytes))
        if peak(smallest) <= peak_allowed(budget_bytes, eager_peak):
            note = (f"no plan's predicted peak fits the budget of {format_bytes(budget_bytes)}, at least eager "
                    f"autograd's own peak ({format_bytes(eager_peak)}): the smallest plan, predicted at "
                    f"{format_bytes(peak(smallest))} ({peak(smallest) / eager_peak - 1:+.2%} of eager's), is taken "
                    f"(Note [A budget at eager's peak])")
            return replace(smallest, plan=replace(smallest.plan, notes=(*smallest.plan.notes, note)))
        raise infeasible(budget_bytes, min(peak(c) for c in candidates), eager_peak=eager_peak, floor=floor,
                         gap=attempt.gap)
    return min(fitting, key=lambda c: (c.time, peak(c), c.saved_bytes))


# Note [The default at most eager's peak]
# Without a budget a graph takes the min-cut plan of least bytes and recompute traffic (Note
# [Default plan: bytes and recompute traffic] in ``remat/planning/planner.py``). Its objective,
# ``saved bytes + bandwidth / 2 x recompute seconds``, is the time cost in bytes: the plan is the
# one of least estimated time cost (``PlanData.cost_seconds``: recompute time plus writing and
# reading what it saves) that the cost rules allow, so no plan keeping those rules beats it on
# both peak and time cost (a tie in time at most). The frontier's time axis is that time cost
# (before, the recompute time alone: a plan saving 96 KiB more with less recompute and the same
# peak was listed as beating the README's demo's default, though it pays for those bytes in
# traffic).
#
# Its predicted peak can still be above eager autograd's: the backend's model of the step can
# put it there, and remat must not ask for more memory than eager to save less. Where it is more
# than ``EAGER_PEAK_SLACK`` above eager's, the default is the fastest candidate (least time cost,
# then peak) predicted at most at eager's peak; if none is, the fastest within the slack (the plan
# ``budget=1.0`` would choose: Note [A budget at eager's peak]); if none is, the min-cut plan stays
# and its notes say so. The chosen plan goes first among the candidates, so that a budget still
# takes the default whenever its peak fits. Within the slack the min-cut plan stays: the
# difference is inside the model's error, and trading recompute for it made small graphs slower
# for nothing. The README's demo under the Inductor model is such a graph: its min-cut plan is
# predicted at 461.62 KiB against eager's 453.50 KiB (+1.8%) and every plan of remat's is above
# eager's (the smallest, 453.62 KiB, recomputes 100 ops); measured on CPU it is below eager's
# (448,008 B against 448,776 B). A test model of the DDP tests, inside the slack, took a nested
# plan (every op of a segment run twice) when the rule gave way at any margin.
#
# A budget's candidate that recomputes what the cost rules keep saved (a convolution, a matmul, a
# reduction) can be estimated to beat the default on both: on the small ResNet's CPU graph a hull
# vertex recomputing two convolutions is estimated at 15.03 MiB and 1.24 ms against the min-cut
# plan's 16.01 MiB and 1.45 ms. It is not taken on the estimates, which are what the rules
# distrust. Its notes say what it recomputes (``RECOMPUTES_RULED``), ``pareto`` says why it is not
# the default, and where the first steps are measured (``remat.tuning``; CUDA by default) it is
# measured beside the default (``remat.planning.measured``) and the faster is kept.


def above_eager(peak: int, eager_peak: int) -> bool:
    """Whether a min-cut plan's ``peak`` is far enough above eager's (beyond ``EAGER_PEAK_SLACK``)
    for the default to be another plan (Note [The default at most eager's peak])."""
    return eager_peak > 0 and peak > peak_allowed(eager_peak, eager_peak)


def _noted(c: Candidate, note: str) -> Candidate:
    return replace(c, plan=replace(c.plan, notes=(*c.plan.notes, note)))


def default_first(candidates: list[Candidate], eager_peak: int) -> list[Candidate]:
    """``candidates`` (the min-cut default first) with the default plan first (Note [The default
    at most eager's peak])."""
    mincut = candidates[0]
    if not above_eager(mincut.peak, eager_peak):
        return candidates
    above = (f"the min-cut plan's predicted peak ({format_bytes(mincut.peak)}) is "
             f"{mincut.peak / eager_peak - 1:.1%} above eager autograd's ({format_bytes(eager_peak)})")
    fitting = ([c for c in candidates if c.peak <= eager_peak]
               or [c for c in candidates if c.peak <= peak_allowed(eager_peak, eager_peak)])
    if not fitting:
        smallest = min(c.peak for c in candidates)
        return [_noted(mincut, f"{above}, and so is every plan of remat's (the smallest: {format_bytes(smallest)}); "
                               "the min-cut plan is kept (Note [The default at most eager's peak])"), *candidates[1:]]
    picked = min(fitting, key=lambda c: (c.time, c.peak, c.saved_bytes))
    within = (" (within the slack of eager's peak: no plan is predicted at or below it)"
              if picked.peak > eager_peak else "")
    default = _noted(picked, f"{above}: the default is the fastest plan predicted at "
                             f"{format_bytes(picked.peak)}{within} (Note [The default at most eager's peak])")
    return [default, *[c for c in candidates if c is not picked]]


def judged_peak(c: Candidate, attempt: Attempt = FIRST) -> int:
    """``c``'s peak as ``attempt`` judges it: read by an earlier compile, else predicted and
    raised by the readings' ``gap`` (Note [Budget re-plan])."""
    return attempt.known_peaks.get(c.plan.key, c.peak + attempt.gap)


def budget_share(budget: Budget, eager: EagerBaseline, attempt: Attempt = FIRST) -> int:
    """This graph's share of ``budget`` (a fraction of ``eager``'s peak, or bytes) in bytes: the
    budget less what the graphs the step ran before it save (Note [Step budget])."""
    e = attempt.earlier
    step_eager = max(e.eager_peak_bytes, e.eager_saved_bytes + eager.peak_bytes)
    return budget.resolve(step_eager) - e.saved_bytes


def within_budget(candidates: list[Candidate], budget: Budget, eager: EagerBaseline,
                  attempt: Attempt = FIRST) -> Candidate:
    """The candidate ``budget`` (a fraction of ``eager``'s peak, or bytes) chooses, its plan
    marked with the budget in bytes (``Plan.budget_bytes``)."""
    e = attempt.earlier
    limit = budget_share(budget, eager, attempt)
    if e.graphs and limit < min(c.plan.predicted_peak_bytes for c in candidates):
        smallest = min(c.plan.predicted_peak_bytes for c in candidates)
        raise infeasible(max(limit, 0), smallest + e.saved_bytes, eager_peak=eager.peak_bytes,
                         earlier=e, step_budget=limit + e.saved_bytes)
    chosen = choose(candidates, limit, eager.peak_bytes, eager.floor_bytes, attempt)
    return replace(chosen, plan=replace(chosen.plan, budget_bytes=limit))


def missed_budget(plan: PlanData, peak: int, how: str = "measured on a training step") -> str:
    """What a compile of ``plan`` missing its budget by ``peak`` is called in an error."""
    return (f"a plan predicted at {format_bytes(plan.simulated_peak_bytes or plan.predicted_peak_bytes)} {how} at "
            f"{format_bytes(peak)}, over the budget")


def peak_allowed(budget_bytes: int, eager_peak: int) -> int:
    """The most a plan's peak may be under ``budget_bytes``: the budget itself, or, for a budget
    of at least eager autograd's own peak, that peak and ``EAGER_PEAK_SLACK`` (Note [A budget at
    eager's peak])."""
    if eager_peak <= 0 or budget_bytes < eager_peak:
        return budget_bytes
    return max(budget_bytes, int(eager_peak * (1 + EAGER_PEAK_SLACK)))


def _missed(plan: PlanData) -> bool:
    """Whether the peak read from ``plan``'s compiled graphs is over its budget."""
    return (plan.budget_bytes is not None
            and plan.compiled_peak_bytes > peak_allowed(plan.budget_bytes, plan.eager_peak_bytes))


def compile_within_budget(compile_once: Callable[[Attempt], PlanData | None]) -> str | None:
    """Compile a graph until its plan's compiled peak keeps its budget (Note [Budget re-plan]).
    ``compile_once(attempt)`` plans and compiles the graph afresh and returns the plan to judge,
    or None when there is none or the graph cannot be compiled again (one compile, then). Returns
    the note a re-planned plan carries, None without a re-plan; raises InfeasibleBudgetError
    when the last compile misses too."""
    known: dict[PlanKey, int] = {}
    missed: list[str] = []
    gap = 0
    while True:
        attempt = Attempt(dict(known), last=len(known) + 1 >= MAX_COMPILES, compiles=len(known), gap=gap)
        plan = compile_once(attempt)
        if plan is None or not _missed(plan):
            break
        missed.append(f"a plan predicted at {format_bytes(plan.simulated_peak_bytes)} compiled to "
                      f"{format_bytes(plan.compiled_peak_bytes)}, over the budget")
        if attempt.last:
            raise infeasible(plan.budget_bytes, min([plan.compiled_peak_bytes, *known.values()]), missed=tuple(missed))
        known[plan.key] = plan.compiled_peak_bytes
        gap = max(gap, plan.compiled_peak_bytes - plan.simulated_peak_bytes)
    return f"budget re-plan ({len(known) + 1} compiles): " + "; ".join(missed) if missed else None
