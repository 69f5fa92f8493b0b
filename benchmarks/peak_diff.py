"""Where the simulator and Inductor's memory plan part: for one zoo model and budget, the live
set at the simulated peak (each value by its fx name) and at the peak read from the compiled
graphs (each buffer with the fx nodes it came from), and the backward step by step on both
sides. A diagnostic for issue 27 item 2 (predictions that hold on the GPU).

    PYTHONPATH=$PWD python benchmarks/peak_diff.py --model llama --tiny --device cpu --budget 0.45 --out out/
    PYTHONPATH=$PWD python benchmarks/peak_diff.py --model llama --budget 0.3 --out $OUT   # H200, bf16

It compiles ``remat.checkpoint(model, budget=...)`` once (a budget refused after its first compile
still leaves that compile's reading), records the simulator's run of the plan that was compiled
(``remat.core.peak``) and the allocation trace Inductor planned for each of its graphs
(``remat.backends.inductor.wrapper_reading``), and writes ``peak-diff-<model>-<budget>.txt``.
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import pathlib
import sys
import warnings

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: `zoo`, `remat`
import remat  # noqa: E402
import remat.backends.inductor.backend as inductor_backend  # noqa: E402
import remat.plan_data as plan_data  # noqa: E402
import remat.planning.build_plan as build_plan  # noqa: E402
import remat.planning.candidates as candidates  # noqa: E402
import zoo  # noqa: E402
from remat.backends.inductor import wrapper_reading  # noqa: E402
from remat.core import allocations, peak  # noqa: E402

MiB = 2**20


class Recorder:
    """Hooks on the simulator, the wrapper reader and the plan's compiled peak."""

    def __init__(self) -> None:
        self.sims: list[tuple[peak.Schedule, set[int], peak.PeakResult]] = []
        self.origins: dict[int, dict[str, list[str]]] = {}
        """Per graph trace (by ``id``): each buffer's fx origins (buffer names repeat across graphs)."""
        self.reads: list[tuple[allocations.GraphTrace, allocations.GraphTrace, tuple, allocations.Reading]] = []
        self.compiled: list[plan_data.PlanData] = []

    def install(self) -> None:
        sim, trace_of, read_step = build_plan.simulate, wrapper_reading.trace_of, inductor_backend.read_step
        with_peak = plan_data.PlanData.with_compiled_peak

        def simulate(s, saved, offload=None):
            r = sim(s, saved, offload)
            self.sims.append((s, set(saved), r))
            return r

        def traced(graph, lines):
            t = trace_of(graph, lines)
            names = self.origins.setdefault(id(t), {})
            for e in t.events:
                if e.name and e.name not in names:
                    try:
                        names[e.name] = sorted(str(o.name) for o in graph.get_buffer(e.name).get_origins())
                    except Exception:  # an input or a name the graph does not know
                        pass
            return t

        def read(fw, bw, *args, **kwargs):
            r = read_step(fw, bw, *args, **kwargs)
            self.reads.append((fw, bw, args, r))
            return r

        def compiled_peak(plan, *args, **kwargs):
            self.compiled.append(plan)
            return with_peak(plan, *args, **kwargs)

        build_plan.simulate, wrapper_reading.trace_of, inductor_backend.read_step = simulate, traced, read
        candidates.simulate = simulate  # a candidate's peak, which the plan then takes unsimulated
        plan_data.PlanData.with_compiled_peak = compiled_peak


def simulated_timeline(s: peak.Schedule, saved: set[int]) -> tuple[list, int, dict, dict, dict]:
    """The simulator's steps with each storage's first and last step (``peak.last_uses``)."""
    fwd, bwd = peak.op_order(s, saved)
    steps, boundary, nbytes, storage = (s.model or peak.OP_BY_OP).steps(s, set(saved), fwd, bwd)
    last = peak.last_uses(s, set(saved), steps, boundary, storage)
    born = {k: t for t, st in enumerate(steps) for k in st.allocs}
    free = {k: max(last.get(k, t), t) for k, t in born.items()}
    return steps, boundary, nbytes, born, free


def simulated_report(s: peak.Schedule, saved: set[int], r: peak.PeakResult, top: int) -> list[str]:
    steps, boundary, nbytes, born, free = simulated_timeline(s, saved)

    def name(k) -> str:
        return f"{s.names[k[0]] if s.names else k[0]}{'' if k[1] == 0 else ' (bw)'}"

    def live_at(t: int) -> dict:
        return {k: nbytes.get(k, 0) for k, t0 in born.items() if t0 <= t <= free[k]}

    totals = [sum(live_at(t).values()) + st.scratch for t, st in enumerate(steps)]
    t_peak = max(range(len(steps)), key=totals.__getitem__)
    out = [f"SIMULATED peak {r.peak_bytes / MiB:.3f} MiB at {r.at} (step {t_peak}); forward peak "
           f"{r.forward_peak_bytes / MiB:.3f}, boundary {r.boundary_bytes / MiB:.3f}; "
           f"saved {len(saved)} values, {sum(s.nbytes[v] for v in saved) / MiB:.3f} MiB",
           f"  live at the peak (scratch {steps[t_peak].scratch / MiB:.3f}):"]
    for k, v in sorted(live_at(t_peak).items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"    {v / MiB:9.3f}  {name(k)}")
    out.append("  backward, step by step (live MiB after the step's allocations, then what it allocates):")
    for t in range(boundary, len(steps)):
        allocs = ", ".join(f"{name(k)} {nbytes.get(k, 0) / MiB:.3f}" for k in steps[t].allocs if nbytes.get(k, 0))
        out.append(f"    {t:4d} {totals[t] / MiB:9.3f}  {steps[t].label}  {allocs}")
    return out


def forward_buffers(fw: allocations.GraphTrace, fw_names: list) -> tuple[allocations._State, dict]:
    """The compiled forward replayed (its buffers' sizes in the state) and the buffer each of its
    outputs lives in, by fx name."""
    st = allocations._State()
    for n, _ in fw.inputs:
        st.bind(n, ("input", n))
    allocations.replay(fw.events, st, "forward")
    return st, {f: st.names[b] for f, b in zip(fw_names, fw.outputs) if f and b and b in st.names}


def read_report(rec: Recorder, index: int, loss_in_step: bool, top: int) -> list[str]:
    fw, bw, args, reading = rec.reads[index]
    fw_names, bw_names = args[0], args[1]
    origins = {"forward": rec.origins.get(id(fw), {}), "backward": rec.origins.get(id(bw), {})}
    keep = not loss_in_step
    chosen = reading.peak(loss_in_step)
    out = [f"READ peak {chosen.peak_bytes / MiB:.3f} MiB at {chosen.at}; forward peak "
           f"{chosen.forward_peak_bytes / MiB:.3f}, boundary {chosen.boundary_bytes / MiB:.3f} "
           f"(caller {'keeps' if keep else 'drops'} the outputs)"]
    st, by_fx = forward_buffers(fw, fw_names)
    taken, given = collections.Counter(bw_names), collections.Counter(n for n in fw_names if n)
    pinned = {k for n, k in by_fx.items() if given[n] > taken[n]} if keep else set()
    bst = allocations._State(pinned=set(pinned))
    kept = {by_fx[n] for n in bw_names if n in by_fx} | pinned
    for k, nb in st.sizes.items():
        if k in kept:
            bst.new(k, nb)
    inputs = dict(bw.inputs)
    for n in bw_names:
        if n in by_fx:
            bst.bind(n, by_fx[n])
        elif n in inputs:
            key = ("tangent", n)
            bst.new(key, inputs[n])
            bst.bind(n, key)
            if keep:
                bst.pinned.add(key)
    best = (bst.live, "start", dict(bst.sizes))
    rows = []
    for e in bw.events:
        allocations.replay([e], bst, "backward")
        here = bst.live + (e.nbytes if e.kind == "call" else 0)
        if here > best[0]:
            best = (here, e.label or e.name, dict(bst.sizes))
        if e.kind in ("alloc", "reuse"):
            src = f" <- {e.other}" if e.kind == "reuse" else ""
            rows.append(f"    {bst.live / MiB:9.3f}  {e.kind} {e.name}{src} {e.nbytes / MiB:.3f}  "
                        f"{','.join(origins['backward'].get(e.name, [])[:4])}")
        elif e.kind == "free":
            rows.append(f"    {bst.live / MiB:9.3f}  free {e.name}")
        elif e.nbytes:
            rows.append(f"    {here / MiB:9.3f}  call {e.label} +{e.nbytes / MiB:.3f} scratch")
    out.append(f"  live at the backward's peak ({best[1]}):")
    for k, v in sorted(best[2].items(), key=lambda kv: -kv[1])[:top]:
        graph, buf = k if isinstance(k, tuple) else ("backward", k)
        out.append(f"    {v / MiB:9.3f}  {k}  {','.join(origins.get(graph, {}).get(buf, [])[:4])}")
    out.append("  backward, line by line (live MiB after the line):")
    return out + rows


def boundary_report(sim: tuple | None, rec: Recorder, index: int, top: int) -> list[str]:
    """What crosses the forward/backward boundary on each side: the simulator's saved values and the
    buffers the compiled forward hands the backward (by fx name), the names only one side has and
    the names whose bytes differ, largest first."""
    if sim is None:
        return []
    fw, _, args, _ = rec.reads[index]
    fw_names, bw_names = args[0], args[1]
    st, by_fx = forward_buffers(fw, fw_names)
    read = {n: st.sizes.get(by_fx[n], 0) for n in bw_names if n in by_fx}
    s, saved, _ = sim
    simulated = {(s.names[v] if s.names else str(v)): s.nbytes[v] for v in saved}
    rows = []
    for n in set(read) | set(simulated):
        a, b = simulated.get(n), read.get(n)
        if a != b:
            rows.append((max(a or 0, b or 0), n, a, b))
    bufs = {by_fx[n] for n in read}
    out = [f"BOUNDARY: simulated saves {len(simulated)} values, {sum(simulated.values()) / MiB:.3f} MiB; "
           f"the compiled forward hands the backward {len(read)} names, {sum(read.values()) / MiB:.3f} MiB "
           f"({len(bufs)} buffers, {sum(st.sizes.get(k, 0) for k in bufs) / MiB:.3f} MiB)",
           "  names that differ (simulated MiB, read MiB; - where a side lacks the name):"]
    for _, n, a, b in sorted(rows, reverse=True)[:top]:
        fa = "-" if a is None else f"{a / MiB:.3f}"
        fb = "-" if b is None else f"{b / MiB:.3f}"
        out.append(f"    {fa:>10} {fb:>10}  {n}")
    return out


def budget_arg(text: str) -> float | str | None:
    """A budget as the command line gives it: ``none``, a fraction (``0.3``), or bytes (``3.6GiB``)."""
    if text == "none":
        return None
    return float(text) if text.replace(".", "").isdigit() else text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama", choices=zoo.SUITE)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 elsewhere")
    parser.add_argument("--budget", default="none", help="a fraction, bytes ('3.6GiB'), or none")
    parser.add_argument("--dropout", action="store_true", help="keep the model's dropout (default: off)")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    a = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if a.device == "cuda" else torch.float32)
    budget = budget_arg(a.budget)
    rec = Recorder()
    rec.install()
    wl = zoo.build(a.model, tiny=a.tiny, device=a.device, dtype=dtype, no_dropout=not a.dropout)
    model = remat.checkpoint(copy.deepcopy(wl.model), backend="inductor", budget=budget)
    lines = [f"{a.model}{' (tiny)' if a.tiny else ''} on {a.device}, {dtype}, budget {a.budget}"
             f"{', dropout' if a.dropout else ''}"]
    try:
        wl.loss(model, wl.inputs).backward()
    except remat.InfeasibleBudgetError as e:
        lines.append(f"refused after its first compile: {e}")
    loss_in_step = any(r[3].loss_in_graph for r in rec.reads)
    plans = list({p.key: p for p in rec.compiled}.values())  # readings are re-applied as graphs compile
    for i, plan in enumerate(plans[:len(rec.reads)]):
        want = plan.simulated_peak_bytes or plan.predicted_peak_bytes
        sims = [x for x in rec.sims if x[2].peak_bytes == want]
        lines.append(f"\n=== graph {i + 1}: simulated {want / MiB:.3f} MiB, read "
                     f"{rec.reads[i][3].peak(loss_in_step).peak_bytes / MiB:.3f} MiB")
        if sims:
            lines += simulated_report(*sims[-1], a.top)
        lines += read_report(rec, i, loss_in_step, a.top)
    text = "\n".join(lines)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"peak-diff-{a.model}-{a.budget}.txt")
    with open(path, "w") as f:
        f.write(text + "\n")
    print("\n".join(lines[:2] + [x for x in lines[2:] if x.startswith(("\n===", "SIMULATED", "READ"))]))
    print("wrote", path)


if __name__ == "__main__":
    main()
