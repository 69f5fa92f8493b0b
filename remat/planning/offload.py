"""Offload as a plan's third choice (``offload=``): which saved values go to host memory between
the forward and the backward, when their copies run, and the step's peak with them.

Note [Offload in a plan]
A saved value can move when it owns its storage (not a view, not a graph input), is not a
forward output (the caller holds those anyway), no other saved value is a view of it, and the
backward reads it. Its copy out may start when the last forward op reading its storage ends;
its copy back must end before the first backward op reading it starts. The step's timeline is
the plan's own op order (``remat.core.peak.op_order``), each op estimated as a kernel of its own
(``remat.analysis.cost.run_seconds``: the uncompiled backend runs them so) or, where the step is
compiled (``StepModel.compiled``: Inductor), as a matmul, convolution or attention kernel alone
and every other op at the vector rate with no memory traffic (``cost.fused_seconds``). That is
an approximation: Inductor's step model knows which values its kernels store but not how long
its kernels run, and the fused estimate is a lower bound (a fused kernel still reads what it
loads and writes what it stores), so under Inductor the timeline hides fewer copies than run.
The copies are timed on it by ``remat.core.offload`` (Note [Offload timeline]) over the host
link (``host_link``: measured once per CUDA device). ``"auto"`` keeps the values whose copies
the step hides (``offload.hidden``); ``"all"`` every value that can move (``offload.schedule``,
its stall in the plan). The partitioned backward can only issue a copy back once it runs, so a
copy back the timeline starts in the forward's tail starts at the backward's first op: under
``"auto"`` such a value is not offloaded, under ``"all"`` it is, and the stall is re-timed.
The plan's peak is simulated with each offloaded value's device copy freed when its copy out
is issued and allocated again when its copy back starts (``peak.simulate``'s ``offload``).

Compiled, the device copy is held until its copy out is done (Note [Offload copies]): it is
released after the op the timeline ends the copy in (``Offloaded.released_after``; the
forward's last op at the latest, where the forward waits for what is left of the copy: that
wait is in the value's stall), and ``"auto"`` keeps only values whose copy out ends in the
forward. Where the device is the host (CPU) the copies save nothing: op by op the plan keeps
its peak without them; compiled, the peak is simulated with them, the host copies counted as
the device's memory, as the peak read from the compiled code counts them.

Note [Offload and allocated bytes]
The forward drops a value's device tensor right after issuing its copy out; the caching
allocator counts its bytes as freed then (``memory_allocated``, the measurement protocol's
peak) but reuses its block only once the copy is done (``Tensor.record_stream``), so until then
the block is reserved, not allocated. The predicted peak is the protocol's; the copies' end
(``Offloaded.copy_out``) says how long the block stays reserved. Measured on the H200 (HF Llama,
uncompiled backend, ``"all"``): predicted 9,519 MiB freeing at the copy's end, measured
7,386 MiB; freeing at the copy's issue, predicted 7,384 MiB, measured 7,384 MiB
(``benchmarks/README.md``, section Offload).

Without a budget it is applied to the default plan. Under a budget (or for ``pareto``) every
candidate carries its offloads (``offloading_candidates``), so the budget takes the fastest plan
whose peak with them fits: offload weighed against recompute at the grain of candidates (what
each candidate saves is offloaded as ``mode`` says), not value by value. Under a budget ``"auto"``
also offers the candidates that can win the choice with more of their values offloaded than the
step hides, on a ladder up to every movable one, each rung's stall in its time (Note [Offload
under a budget]).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from itertools import accumulate

import torch

from .. import compat
from ..analysis import cost
from ..analysis.joint_graph import JointGraph
from ..core import offload as timeline
from ..core.peak import OP_BY_OP, Moved, Offload, Schedule, op_order, simulate
from ..device import DeviceModel
from ..plan import Plan
from ..plan_data import Offloaded
from .candidates import Candidate

__all__ = ["host_link", "with_offload", "offloading_candidates", "node_seconds"]

_LINKS: dict[str, timeline.Link] = {}


def host_link(device: torch.device) -> timeline.Link | None:
    """The pinned host link of a CUDA ``device``, measured once per device name (a 64 MiB copy
    each way, the best of three, and the host's time to issue one value's copies, Note [Copies
    the host issues]); None for a CPU, whose memory is the host's."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if name not in _LINKS:
        with compat.real_tensors():  # the partition runs under AOTAutograd's fake mode: versions.HOOKS["real_tensors"]
            _LINKS[name] = _measured(device)
    return _LINKS[name]


def _measured(device: torch.device) -> timeline.Link:
    """The device's pinned host link, each way: the best of three 64 MiB copies."""
    n = 64 << 20
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    rates = []
    for dst, src in ((host, dev), (dev, host)):
        best = float("inf")
        for _ in range(3):
            torch.cuda.synchronize(device)
            t = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t)
        rates.append(n / best)
    from ..capture.offload_pass import issue_seconds  # the runtime's own ops, timed as a step issues them

    return timeline.Link(d2h=rates[0], h2d=rates[1], issue_seconds=issue_seconds(device))


def _device(jg: JointGraph) -> torch.device:
    for n in jg.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device
    return torch.device("cpu")


def _candidates(jg: JointGraph, saved: set[int], fwd: list[int], bwd: list[int]) -> list[timeline.OffloadCandidate]:
    """The saved values that can move (Note [Offload in a plan]), each with the position of the
    last forward op reading its storage and of the first backward op reading it: one pass over
    the step's ops."""
    s = jg.schedule
    last_read: dict[int, int] = {}  # storage -> last forward position reading it
    for k, w in enumerate(fwd):
        last_read[w] = max(last_read.get(w, k), k)
        for u in s.inputs[w]:
            last_read[s.root[u]] = k
    first_read: dict[int, int] = {}  # value -> first backward position reading it
    for k, w in enumerate(bwd, start=len(fwd)):
        for u in s.inputs[w]:
            first_read.setdefault(u, k)
    out_roots = {s.root[v] for v in s.fwd_outputs}
    viewed = {s.root[u] for u in saved if s.root[u] != u}
    return [timeline.OffloadCandidate(v, s.nbytes[v], last_read[v], first_read[v]) for v in sorted(saved)
            if s.root[v] == v and s.nbytes[v] and v not in s.graph_input and v not in out_roots and v not in viewed
            and v in last_read and v in first_read]


def _timed(mode: str, cands: list[timeline.OffloadCandidate], seconds: list[float], boundary: int,
           link: timeline.Link, held: bool) -> timeline.OffloadSchedule:
    """The offload schedule of ``mode`` whose copies back all start in the backward and, where
    the forward holds a device copy until its copy out ends (``held``), whose copies out under
    ``"auto"`` end in the forward (Note [Offload in a plan])."""
    if mode == "all":
        return timeline.schedule(cands, seconds, boundary, link)

    def fits(e: timeline.Entry) -> bool:
        return e.reloaded_at >= boundary and (not held or e.freed_after < boundary)

    chosen = timeline.hidden(cands, seconds, boundary, link)
    while not all(fits(e) for e in chosen.entries):
        keep = {e.node for e in chosen.entries if fits(e)}
        chosen = timeline.hidden([c for c in cands if c.node in keep], seconds, boundary, link)
    return chosen


def node_seconds(jg: JointGraph, dev: DeviceModel) -> list[float]:
    """Each schedule node's estimated seconds (0 for a view): run as its own kernel op by op
    (``cost.run_seconds``), inside Inductor's fused code where the step is compiled
    (``cost.fused_seconds``, ``StepModel.compiled``): the step's timeline, whatever the plan's
    op order."""
    s = jg.schedule
    estimate = cost.fused_seconds if _compiled(s) else cost.run_seconds
    nodes = [n for n in jg.nodes[0].graph.nodes if n.op != "output"]
    return [estimate(n, dev) if s.root[v] == v else 0.0 for v, n in enumerate(nodes)]


def _compiled(s: Schedule) -> bool:
    return bool(getattr(s.model or OP_BY_OP, "compiled", False))


def with_offload(jg: JointGraph, saved_ids: list[int], plan: Plan, mode: str, dev: DeviceModel,
                 per_node: list[float] | None = None, extra: int | None = None,
                 hidden: frozenset[str] | None = None) -> Plan:
    """``plan`` with the saved values ``mode`` offloads (Note [Offload in a plan]): its
    ``offloaded``, its peak simulated with them, and a note when nothing moves. ``per_node``:
    ``node_seconds(jg, dev)`` where the caller has it. ``extra`` (with ``"all"``): only the values
    ``"auto"`` would offload and the ``extra`` largest others (Note [Offload under a budget]);
    ``hidden``: the names of those ``"auto"`` offloads, where the caller has them."""
    s = jg.schedule
    saved = jg.to_schedule_ids(saved_ids)
    device = _device(jg)
    measured = host_link(device)
    if measured is None and mode == "auto":
        return replace(plan, notes=(*plan.notes, "offload='auto': nothing offloaded, the device is the host (CPU)"))
    link = measured or timeline.Link(d2h=dev.bandwidth, h2d=dev.bandwidth)  # the host path where the device is the host
    fwd, bwd = op_order(s, saved)
    cands = _candidates(jg, saved, fwd, bwd)
    if not cands:
        return replace(plan, notes=(*plan.notes,
                                    f"offload={mode!r}: no saved value can move (Note [Offload in a plan])"))
    compiled = _compiled(s)
    per_node = per_node if per_node is not None else node_seconds(jg, dev)
    order = fwd + bwd
    seconds = [per_node[v] for v in order]
    if extra is not None and mode == "all":  # the hidden ones and the largest others (Note [Offload under a budget])
        hid = ({c.node for c in cands if s.names[c.node] in hidden} if hidden is not None
               else set(_timed("auto", cands, seconds, len(fwd), link, held=compiled).nodes))
        rest = sorted((c for c in cands if c.node not in hid), key=lambda c: (-c.nbytes, c.ready, c.node))
        keep = hid | {c.node for c in rest[:extra]}
        movable, cands = len(cands), [c for c in cands if c.node in keep]
    else:
        movable = len(cands)
    chosen = _timed(mode, cands, seconds, len(fwd), link, held=compiled)
    if mode == "all" and any(e.reloaded_at < len(fwd) for e in chosen.entries):
        chosen = _started_in_backward(chosen, seconds, len(fwd), link)
    if not chosen.entries:
        small = sum(not link.worth_a_copy(c.nbytes) for c in cands)
        return replace(plan, notes=(*plan.notes, f"offload={mode!r}: no copy is hidden behind the step's compute "
                                                 "(estimated), nothing offloaded"
                                    + (f"; {small} of {movable} movable values too small to be worth the host's time "
                                       "to issue their copies (Note [Copies the host issues])" if small else "")))
    ready = {c.node: c.ready for c in cands}
    ends = list(accumulate(seconds))
    moves, waits = {}, {}
    for e in chosen.entries:
        # Note [Offload and allocated bytes]: op by op the device copy is dropped when the copy out
        # is issued; compiled, it is held until the op the copy out ends in (the forward's end at the latest)
        released = min(e.freed_after, len(fwd) - 1) if compiled else ready[e.node]
        moves[e.node] = Moved(ready[e.node], released, max(e.reloaded_at, len(fwd)))
        waits[e.node] = max(0.0, e.out_end - ends[released]) if compiled else 0.0
    if compiled or measured is not None:
        peak = simulate(s, saved, Offload(moves, host_is_device=measured is None)).peak_bytes
    else:  # op by op where the device is the host: the plan's peak (the uncompiled backend's first slice)
        peak = plan.predicted_peak_bytes
    offloaded = tuple(Offloaded(s.names[e.node], e.nbytes, (e.out_start, e.out_end), (e.in_start, e.in_end),
                                e.stall + waits[e.node], reload_before=s.names[order[moves[e.node].reloaded_at]],
                                released_after=s.names[order[moves[e.node].released_after]] if compiled else "",
                                issue_seconds=link.issue_seconds)
                      for e in chosen.entries)
    note = (f"offload={mode!r}: {len(offloaded)} of {movable} movable saved values, timed on the step's estimated "
            f"{sum(seconds[:len(fwd)]) * 1e3:.3f} ms forward and {sum(seconds[len(fwd):]) * 1e3:.3f} ms backward"
            + (" (compiled: FLOPs only outside matmuls)" if compiled else "")
            + f" over a {link.d2h / 1e9:.1f}/{link.h2d / 1e9:.1f} GB/s host link (to/from)"
            + (f", {link.issue_seconds * 1e6:.0f} us of host time to issue each value's copies"
               if link.issue_seconds else ""))
    if measured is None:
        note += ("; the device is the host (CPU): the copies save no memory, "
                 + ("their host copies count in the peak" if compiled else "the peak is the plan's without them"))
    return replace(plan, offloaded=offloaded, predicted_peak_bytes=peak, simulated_peak_bytes=peak,
                   notes=(*plan.notes, note))


def offloading_candidates(found: list[Candidate], jg: JointGraph, mode: str, dev: DeviceModel, *,
                          fits: Callable[[Candidate], bool] | None = None) -> list[Candidate]:
    """Every candidate with what ``mode`` offloads of its saved values, so that a budget chooses
    among save, recompute and offload at once: the fastest plan (time cost with the copies'
    stall) whose peak with its offloads fits. ``fits`` (``"auto"`` under a budget: whether the
    budget's choice takes a candidate's peak): followed by the ladders of more offloads of the
    candidates that can win the choice (``_ladder``, Note [Offload under a budget])."""
    timelines: dict[int, list[float]] = {}  # id of a joint graph -> its node_seconds
    out = []
    for c in found:
        g = c.jg or jg
        if id(g) not in timelines:
            timelines[id(g)] = node_seconds(g, dev)
        out.append(replace(c, plan=with_offload(g, list(c.saved), c.plan, mode, dev, timelines[id(g)])))
    if fits is None or host_link(_device(jg)) is None:  # where the device is the host, moving saves nothing
        return out
    # where hidden copies cost the host time, the default plan is the one without them, and the
    # candidates are also offered without theirs (Note [Copies the host issues])
    costly = out[0].time > found[0].time
    if fits(out[0]) and not costly:  # the budget takes the default plan (``choose``)
        return out
    if costly and fits(found[0]):  # the budget takes the default plan without copies
        return [found[0], *out]
    plain = [c for k, (c, h) in enumerate(zip(found, out)) if k and h.time > c.time]
    fastest = min((h.time for h in (*out, *plain) if fits(h)), default=math.inf)
    more: list[tuple[int, list[Candidate]]] = []
    for k in sorted(range(len(found)), key=lambda k: found[k].time):  # the fastest first: ``fastest`` falls early
        c, h = found[k], out[k]
        if c.time >= fastest:
            break  # a rung costs at least its candidate's time: no later ladder can win (nor does one that fits)
        g = c.jg or jg
        rungs = _ladder(c, h, g, dev, timelines[id(g)], fits)
        more.append((k, rungs))
        fastest = min((fastest, *(r.time for r in rungs if fits(r))))
    return [found[0]] * costly + out + plain + [r for _, rungs in sorted(more, key=lambda m: m[0]) for r in rungs]


# Note [Offload under a budget]
# ``offload="auto"`` offloads what the step's compute hides, so that without a budget a plan never
# waits for a copy. Under a budget the issue's rule is the least time that fits: a copy the step
# cannot hide costs its stall, which may still be less than the recompute a smaller cut pays, and
# below the smallest cut it is the only way down. So under a budget each candidate is offered with
# its hidden offloads (as without a budget) and, after all of those, on a ladder of more
# (``offloading_candidates(..., fits=)``): the hidden values and the 1, 2, 4, ... largest
# other movable values, up to every one (``"all"``), each with its stall in its time cost. The
# budget takes the fastest that fits (``choose``), so a plan waits for copies only where nothing
# faster fits, and for about as few as it must: offload weighed against recompute value by value
# along each candidate's ladder (largest first: what moves the most bytes per copy; a logarithmic
# number of rungs, each a simulation of the peak). ``PlanData.key`` names an offloaded value with
# ``HOST_MARK``, so a cut with and without a value in host memory are two plans to tuning's pick,
# to a compile's reading and to the decision cache. Where the device is the host (CPU) nothing is
# added: moving a value there saves nothing.
#
# A rung's time cost is its candidate's with the copies' stall added, never less, so a ladder can
# win the budget's choice only where its candidate's own plan (its hidden offloads) does not fit
# and is faster than every plan that fits; no ladder where the default fits (the budget takes
# it). The other ladders are not built: each rung is a simulation of the step's peak, and on HF
# GPT-2 at budget 0.5 (CPU, 44 candidates, offload="auto" over a GPU-like link) planning took
# 30 s with every candidate's ladder and 12 s with these, choosing the same plan. (A rung
# without stall that ties its candidate's time is one of those not built: the tie goes to the
# lower peak in ``choose``, a difference inside the peak model's error.) The ladders are built
# fastest candidate first, and a rung that fits is the bar for the candidates after it; a ladder
# stops after its first rung that fits and those as fast as it (its more offloaded rungs wait no
# less: they can win no choice), with ``"all"`` always built (the smallest it knows, for an
# infeasible budget's message). On ResNet-50 (fake H100, offload="auto", budget 0.3: 47
# ladders, 434 plans with offloads simulated) planning took 123 s with every rung of those ladders
# (under cProfile); the same plan was chosen with these (``tests/capture/test_offload.py``
# checks the choice against every ladder). The frontier a budgeted graph keeps lacks the rungs
# not built, so tuning's smaller plans (``Tuning.frontier``) come from the ladders built;
# ``pareto`` plans without a budget and builds none.
#
# Where issuing a copy costs the host time (``Link.issue_seconds``, measured on CUDA: Note [Copies
# the host issues] in ``remat.core.offload``), hidden copies are no longer free: a candidate is
# also offered without its hidden offloads (faster, larger; the default plan without them is the
# one the budget takes where it fits), its ladder's rungs are the 1, 2, 4,
# ... largest movable values, hidden or not (a rung pays for every copy it makes, so it starts
# from the fewest bytes-heaviest ones), and a ladder is built for a candidate only while its plan
# without offloads is faster than every plan that fits.


def _ladder(c: Candidate, hidden: Candidate, g: JointGraph, dev: DeviceModel, seconds: list[float],
            fits: Callable[[Candidate], bool]) -> list[Candidate]:
    """``c`` with what ``hidden`` (its ``"auto"`` plan) offloads and the 1, 2, 4, ... largest other
    movable values, up to every one (``"all"``); where the host's time to issue a copy counts
    (``Link.issue_seconds``), the 1, 2, 4, ... largest movable values, hidden or not (Note
    [Copies the host issues]). Each offload set once, none equal to the hidden one's (Note
    [Offload under a budget]). The rungs stop after the first that ``fits`` and those as fast as
    it (more offloads wait no less: only a tie in time can still win, on its lower peak);
    ``"all"`` is always among them."""
    everything = replace(c, plan=with_offload(g, list(c.saved), c.plan, "all", dev, seconds))
    hid = frozenset(o.name for o in hidden.plan.offloaded)
    base = frozenset() if any(o.issue_seconds for o in everything.plan.offloaded) else hid
    seen, out = {hid}, []

    def add(rung: Candidate) -> None:
        names = frozenset(o.name for o in rung.plan.offloaded)
        if names and names not in seen:
            seen.add(names)
            out.append(rung)

    extra, fitted = 1, None
    while True:
        rung = replace(c, plan=with_offload(g, list(c.saved), c.plan, "all", dev, seconds, extra=extra, hidden=base))
        if len(rung.plan.offloaded) >= len(everything.plan.offloaded):
            break
        if fitted is not None and rung.time > fitted.time:
            break
        add(rung)
        if fitted is None and fits(rung):
            fitted = rung
        extra *= 2
    add(everything)
    return out


def _started_in_backward(chosen: timeline.OffloadSchedule, seconds: list[float], boundary: int,
                         link: timeline.Link) -> timeline.OffloadSchedule:
    """``chosen`` with every copy back that starts in the forward started at the backward's first
    op instead, and its stall re-timed (serial copies back from there)."""
    start = [0.0, *accumulate(seconds)]
    entries, free = [], start[boundary]
    for e in sorted(chosen.entries, key=lambda e: e.in_start):
        if e.reloaded_at >= boundary and e.in_start >= free:
            entries.append(e)
            free = e.in_end
            continue
        s0 = max(start[boundary], free, e.out_end)
        end = s0 + e.nbytes / link.h2d
        due = e.in_end - e.stall  # when its first backward op starts
        entries.append(replace(e, in_start=s0, in_end=end, reloaded_at=max(e.reloaded_at, boundary),
                               stall=max(0.0, end - due)))
        free = end
    return replace(chosen, entries=tuple(sorted(entries, key=lambda e: (e.out_start, e.node))),
                   stall_seconds=sum(e.stall for e in entries))
