"""Real models side by side: eager, per-block checkpointing, torch.compile (default, with
``activation_memory_budget=0.5``, + per-block checkpointing) and remat (default plan and
budgets), bf16 on the GPU, the models built from their own libraries and left unchanged
(``zoo``): by default the four of the headline table (HF GPT-2 124M, HF Llama 1024 wide with 12
layers, timm ViT-B/16, torchvision ResNet-50); ``--suite`` runs every model of ``zoo.SUITE``
(those four and ConvNeXt-T, EfficientNet-B0, MobileNetV3-Large, Swin-T, BERT-base MLM, T5-base,
a small Mixtral and Mamba-2), ``--models`` any of them.

    # anchors once per torch version (eager, eager+ckpt, compile b0.5, compile+ckpt; + compile)
    python benchmarks/real_models.py --anchors --out out/
    # compile + remat strategies; "remat @ckpt peak" reads compile+ckpt's peak from the anchors
    python benchmarks/real_models.py --out out/
    # a chosen set, with a kernel profile of compile vs remat default on GPT-2
    python benchmarks/real_models.py --models gpt2 llama --strategies eager compile remat "remat b0.5" \\
        compile+ckpt --profile gpt2 --time-limit 420 --out out/
    # merge the JSON of several runs (and their -profile.json) into one table, plot and profile
    # diff; --anchors here also writes the anchors file from the merged rows; --note adds lines
    python benchmarks/real_models.py --report out1/real-models.json out2/real-models.json \
        out1/real-models-profile.json --tag real-models-h200 --out benchmarks/
    # predicted (simulator, read from Inductor) against measured peaks, no torch.compile reference
    python benchmarks/real_models.py --strategies eager remat "remat b0.5" --no-compile --warmup 1 \
        --iters 3 --time-limit 330 --tag peaks --out out/
    # the whole suite against torch.compile, interleaved
    python benchmarks/real_models.py --suite --strategies compile remat --interleave 5 --out out/
    # CPU smoke test: tiny configs from the same libraries, fp32
    python benchmarks/real_models.py --tiny --out out/
    python benchmarks/real_models.py --tiny --suite --strategies eager compile remat --out out/
    # the same without Inductor's C++ compiles (capture, planning and the split graphs, uncompiled)
    python benchmarks/real_models.py --tiny --suite --strategies eager compile remat --compile-backend aot_eager \
        --remat-backend eager --out out/

Writes ``<tag>.json`` (after every strategy, so a run cut short still leaves its data),
``<tag>.md`` and ``<tag>.png`` (peak MiB against step ms) to ``--out``; with ``--profile``,
``<tag>-profile.json`` and ``<tag>-profile.md``: the GPU kernels of one step (torch.profiler,
CUDA activity; name, calls, total us) for torch.compile and remat's default plan, and their
difference by category and by kernel name with Inductor's trailing counter stripped.
``--time-limit`` shares the run's seconds equally among the models still to run and skips a
strategy that would not fit; ``--strategy-timeout`` stops one that runs over (SIGALRM: it
fires when Python regains control, so a long compile can overrun it).

Protocol. Each strategy gets a deep copy of one seeded initialisation. Step = gradients set to
None (as ``optimizer.zero_grad()``), forward, loss (HF: the model's own LM loss with
``labels=input_ids``; vision: cross-entropy of the float logits on fixed random labels),
backward (a model without per-block checkpointing skips the ``+ckpt`` strategies, the row saying
why). The first step's wall time is "compile s"; after ``--warmup`` steps, the median of
``--iters`` steps timed with CUDA events is "step ms". Measured peak = ``max_memory_allocated``
during one step (after ``reset_peak_memory_stats``) minus ``memory_allocated`` just before it.

Predicted peak. ``remat.compiled_plans(model)`` gives one plan per captured graph. With one
graph the prediction is its ``predicted_peak_bytes``. With several (graph breaks) the graphs'
forwards run in order and their backwards in reverse, so while graph k runs, the tensors the
earlier graphs saved for their backward are alive: we report ``max_k(sum_{j<k} saved_j +
peak_k)`` ("composed"; it leaves out the gradients of graphs after k that are alive during k's
backward, and the activations passed between graphs outside any plan) and also the plain sum of
the per-graph peaks (an upper bound). ``graphs`` in the JSON says how many plans there were.
The same composition gives the predicted eager peak from ``eager_peak_bytes`` and
``eager_saved_bytes``.

Gradient error: relative L2 error over all parameter gradients against eager's, one step
each from the same weights and the same seed, with the benchmark loss (cross-entropy:
well-conditioned). With dropout > 0 (GPT-2's default 0.1) compiled strategies draw other masks
than eager, so their error is dominated by the randomness: the eager row's ``grad_noise_floor``
is the error between two eager steps with different seeds, the level to compare against;
eager+ckpt replays eager's masks and should be near 0.

Timing drifts between one strategy's steps and the next one's (on the H200 two runs of the same
code put GPT-2's remat/compile ratio at 0.90 and 1.13): with ``--interleave ROUNDS`` each model's
compiled strategies stay alive after they are measured and are then timed round-robin, one step
each per round after ``WARM_ROUNDS`` untimed rounds, and that median is the row's step ms
(``timing`` says so, ``ms_rounds`` has each round's; the sequential median stays as
``ms_sequential``). Use it where ratios within a few percent matter.

"remat bX" budgets are fractions of remat's predicted eager peak; "remat @ckpt peak" is the
budget in bytes equal to compile+ckpt's measured peak (this run's, else the anchors file's), and
"remat @0.8 ckpt" 0.8x that (issue 28's target). A remat strategy's name followed by " unsliced"
("remat @ckpt peak unsliced") plans the graph as captured only (``chunking=None``): no plan runs
an LM head and its loss in slices of rows; followed by " +offload" or " +offload all" it passes
``offload="auto"`` or ``"all"`` on remat's own backend ("remat @0.8 ckpt +offload"); suffixes
combine.
Infeasible budgets, out-of-memory and per-strategy timeouts are recorded in the row.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import json
import math
import os
import pathlib
import re
import shlex
import signal
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: `zoo`, `benchmarks`
import remat  # noqa: E402
import zoo  # noqa: E402
from zoo import Workload  # noqa: E402, F401  (re-exported: tests build workloads through this module)

MODELS = ("gpt2", "llama", "vit", "resnet50")
"""The four models of the headline table (``render_real_models.MODELS``); ``zoo.SUITE`` has them all."""
STRATEGIES = ("eager", "eager+ckpt", "compile", "compile b0.5", "compile+ckpt", "remat", "remat untuned", "remat b0.75",
              "remat b0.5", "remat b0.3", "remat @ckpt peak", "remat @0.8 ckpt", "remat uncompiled",
              "remat offload auto", "remat offload all")
OFFLOAD = {"remat uncompiled": False, "remat offload auto": "auto", "remat offload all": "all"}
"""remat's uncompiled backend, untuned, without and with offload (the suffixes below offload on
remat's own backend)."""
UNSLICED = " unsliced"
"""A remat strategy's name with this suffix plans the graph as captured only (``chunking=None``):
no plan runs a row region in slices (Note [Row chunks] in ``remat/analysis/rows.py``)."""
SUFFIXES = {UNSLICED: {"chunking": None}, " +offload": {"offload": "auto"}, " +offload all": {"offload": "all"}}
"""Suffixes a remat strategy's name may end with (at most one each, any order), each adding its
``remat.checkpoint`` options: `` +offload``/`` +offload all`` keep saved activations in pinned
host memory (issue 28; ``offload="auto"``/``"all"``) on whatever backend remat runs."""


def split_suffixes(name: str) -> tuple[str, dict]:
    """(the strategy's base name, the options its suffixes add)."""
    extra: dict = {}
    while name.startswith("remat"):
        hit = next((s for s in sorted(SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)
        if hit is None:
            break
        name, extra = name[: -len(hit)], {**SUFFIXES[hit], **extra}
    return name, extra
ANCHORS = ("eager", "eager+ckpt", "compile b0.5", "compile+ckpt")
NORMAL = ("eager", "compile", "remat", "remat b0.75", "remat b0.5", "remat b0.3", "remat @ckpt peak")
COMPILED = ("compile", "compile b0.5", "compile+ckpt")
MiB = 2**20


# ---------------------------------------------------------------------------------------------
# Strategies


def make(name: str, model: nn.Module, wl: Workload, ckpt_peak: int | None, *, compile_kw: dict | None = None,
         remat_kw: dict | None = None) -> tuple[Callable, Any]:
    """(what to call, a context the whole strategy runs in) for strategy ``name`` on ``model``
    (a fresh copy the strategy may change). ``compile_kw`` goes to ``torch.compile`` and
    ``remat_kw`` to ``remat.checkpoint`` (``long_context.py``: backends, ``dynamic``, a budget)."""
    nothing = contextlib.nullcontext()
    ck, rk = compile_kw or {}, remat_kw or {}
    name, extra = split_suffixes(name)  # unsliced (Note [Row chunks]), offload (issue 28)
    rk = {**rk, **extra}
    if name == "eager":
        return model, nothing
    if name in ("eager+ckpt", "compile+ckpt") and wl.with_ckpt is None:
        raise NoAnchor(f"{wl.name} has no per-block checkpointing: {wl.info.get('ckpt', 'none offered')}")
    if name == "eager+ckpt":
        return wl.with_ckpt(model), nothing
    if name == "compile":
        return torch.compile(model, **ck), nothing
    if name == "compile b0.5":
        return torch.compile(model, **ck), torch._functorch.config.patch(activation_memory_budget=0.5)
    if name == "compile+ckpt":
        return torch.compile(wl.with_ckpt(model), **ck), nothing
    if name == "remat":
        return remat.checkpoint(model, **rk), nothing
    if name == "remat untuned":  # the plan prediction chose, nothing measured (tune=False)
        return remat.checkpoint(model, **{**rk, "tune": False}), nothing
    if name.startswith("remat b"):
        return remat.checkpoint(model, **{"budget": float(name[len("remat b"):]), **rk}), nothing
    if name in OFFLOAD:
        return remat.checkpoint(model, **{**rk, "backend": "eager", "tune": False, "offload": OFFLOAD[name]}), nothing
    if name == "remat @ckpt peak":
        if not ckpt_peak:
            raise NoAnchor("needs compile+ckpt's measured peak: measure compile+ckpt in this run (before this "
                           "strategy) or run --anchors on a GPU first")
        return remat.checkpoint(model, **{"budget": int(ckpt_peak), **rk}), nothing
    if name == "remat @0.8 ckpt":  # issue 28's target: 0.8x compile+ckpt's measured peak
        if not ckpt_peak:
            raise NoAnchor("needs compile+ckpt's measured peak: measure compile+ckpt in this run (before this "
                           "strategy) or run --anchors on a GPU first")
        return remat.checkpoint(model, **{"budget": int(0.8 * ckpt_peak), **rk}), nothing
    raise ValueError(f"unknown strategy {name!r}; expected one of {STRATEGIES}")


class NoAnchor(Exception):
    pass


class StrategyTimeout(BaseException):
    """Not an ``Exception``: remat's planner falls back on any ``Exception`` (with a warning), and
    Dynamo wraps a backend's; a time limit must end the row, not turn it into a fallback's."""


def _alarm(signum, frame):
    raise StrategyTimeout("per-strategy time limit reached")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def zero_grads(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def step(fn: Callable, model: nn.Module, wl: Workload) -> None:
    zero_grads(model)
    wl.loss(fn, wl.inputs).backward()


def grads(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().float().clone() for p in model.parameters()]


def rel_error(a: list, b: list) -> float:
    """Relative L2 error of gradient list ``a`` against ``b`` (a missing gradient counts as 0)."""
    num = den = 0.0
    for u, v in zip(a, b):
        if v is not None:
            den += float(v.square().sum())
        if u is None and v is None:
            continue
        d = (u if v is None else -v if u is None else u - v)
        num += float(d.square().sum())
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)


def seeded_grads(fn: Callable, model: nn.Module, wl: Workload, seed: int) -> list:
    torch.manual_seed(seed)
    step(fn, model, wl)
    return grads(model)


def step_peak_bytes(fn: Callable, model: nn.Module, wl: Workload) -> int:
    zero_grads(model)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step(fn, model, wl)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def compose(plans: list, peak: str, saved: str) -> int:
    """Peak of several graphs run forward in order, backward in reverse (see the module doc)."""
    held, best = 0, 0
    for p in plans:
        best = max(best, held + getattr(p, peak))
        held += getattr(p, saved)
    return best


def plan_fields(fn: Callable) -> dict:
    plans = remat.compiled_plans(fn)
    if not plans:
        return {"graphs": 0}
    row = {
        "graphs": len(plans),
        "predicted_peak_mib": compose(plans, "predicted_peak_bytes", "device_saved_bytes") / MiB,
        "predicted_eager_peak_mib": compose(plans, "eager_peak_bytes", "eager_saved_bytes") / MiB,
        # the simulator's prediction, and the peak read from Inductor's memory plan (0: not read)
        "simulated_peak_mib": compose(plans, "simulated_peak_bytes", "device_saved_bytes") / MiB,
        "read_peak_mib": (compose(plans, "compiled_peak_bytes", "saved_bytes") / MiB
                          if all(p.compiled_peak_bytes for p in plans) else None),
        "peak_model": sorted({p.peak_model for p in plans}),
        # the CUDA allocator's peak of a budgeted graph on a training step (Note [Measured budget peak])
        "plan_measured_peak_mib": (compose(plans, "measured_peak_bytes", "device_saved_bytes") / MiB
                                   if all(p.measured_peak_bytes for p in plans) else None),
        "replans": [n for p in plans for n in p.notes if n.startswith("budget re-plan")],
        "plan_saved_mib": sum(p.saved_bytes for p in plans) / MiB,
        "plan_eager_saved_mib": sum(p.eager_saved_bytes for p in plans) / MiB,
        "recompute_ms_estimate": sum(p.recompute_seconds for p in plans) * 1e3,
        "peak_floor_mib": compose(plans, "peak_floor_bytes", "saved_bytes") / MiB,
        "fallback": [p.fallback for p in plans if p.fallback],
        "budget_mib": [p.budget_bytes / MiB if p.budget_bytes else None for p in plans],
        "recompute_counts": [p.recompute_counts() for p in plans],
        # measured plans (remat.tuning): each graph's candidates (name, median s, peak bytes) and winner
        "origin": [p.origin for p in plans],
        "row_chunks": [[r.describe() for r in p.row_chunks] for p in plans],
        "chosen_by": [p.chosen_by for p in plans],
        "measured": [[list(m) for m in p.measured] for p in plans],
        # offload (remat.planning.offload): host bytes, estimated stall, values moved
        "host_mib": sum(p.host_bytes for p in plans) / MiB,
        "offload_stall_ms_estimate": sum(p.offload_stall_seconds for p in plans) * 1e3,
        "offloaded": sum(len(p.offloaded) for p in plans),
        "offload_notes": [n for p in plans for n in p.notes if n.startswith("offload")],
    }
    if len(plans) > 1:
        row["predicted_peak_sum_mib"] = sum(p.predicted_peak_bytes for p in plans) / MiB
        row["predicted_eager_peak_sum_mib"] = sum(p.eager_peak_bytes for p in plans) / MiB
        row["per_graph_predicted_peak_mib"] = [p.predicted_peak_bytes / MiB for p in plans]
    return row


def tuning_pending(fn: Callable) -> bool:
    """Whether a graph of ``fn`` still measures its candidate plans on the training steps."""
    return any(not p.chosen_by and any(n.startswith("measuring ") for n in p.notes)
               for p in remat.compiled_plans(fn))


def finish_tuning(fn: Callable, model: nn.Module, wl: Workload, device: torch.device, limit: int = 60) -> dict:
    """Step until every graph of ``fn`` has chosen its plan by measurement (at most ``limit``
    steps): the steps' count and wall time, the first-step cost tuning adds on top of compiling."""
    sync(device)
    t0, n = time.perf_counter(), 0
    while tuning_pending(fn) and n < limit:
        step(fn, model, wl)
        n += 1
    sync(device)
    return {"tuning_steps": n, "tuning_s": time.perf_counter() - t0, "tuning_done": not tuning_pending(fn)}


def unique_graphs() -> int | None:
    try:
        return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    except Exception:
        return None


def tune_kw(tune: str | None) -> dict:
    """remat's ``tune=`` for ``--tune``: ``everywhere`` measures on any device (a CPU smoke run)."""
    return {"tune": remat.Tuning(devices=("*",))} if tune == "everywhere" else {}


def backend_kw(backend: str | None) -> dict:
    return {"backend": backend} if backend else {}


def measure(name: str, wl: Workload, args, device, ref: list | None, ckpt_peak: int | None,
            profile: bool, kept: dict | None = None) -> tuple[dict, list | None, dict | None]:
    """One strategy: (row, its gradients, its kernel table if ``profile``). With ``kept``, the
    compiled step stays alive there (``kept[name] = (fn, model)``) for ``interleave``."""
    model = copy.deepcopy(wl.model)
    fn, ctx = make(name, model, wl, ckpt_peak, compile_kw=backend_kw(args.compile_backend),
                   remat_kw={**backend_kw(args.remat_backend), **tune_kw(args.tune)})
    row: dict[str, Any] = {"strategy": name, "status": "ok"}
    prof = None
    with ctx, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch._dynamo.utils.counters.clear()
        sync(device)
        t0 = time.perf_counter()
        step(fn, model, wl)
        sync(device)
        row["compile_s"] = time.perf_counter() - t0
        if name in COMPILED or name.startswith("remat"):
            row["dynamo_graphs"] = unique_graphs()
        for _ in range(args.warmup):
            step(fn, model, wl)
        if name.startswith("remat"):  # measured plans (remat.tuning): step on until every graph chose
            row.update(finish_tuning(fn, model, wl, device))
        sync(device)
        g = seeded_grads(fn, model, wl, 1234)
        if ref is not None:
            row["grad_rel_err"] = rel_error(g, ref)
        if name == "eager" and wl.dropout > 0:
            row["grad_noise_floor"] = rel_error(seeded_grads(fn, model, wl, 4321), g)
        times = [timed_step(fn, model, wl, device) for _ in range(args.iters)]
        row["ms"] = statistics.median(times)
        row["ms_min"] = min(times)
        row["peak_mib"] = step_peak_bytes(fn, model, wl) / MiB if device.type == "cuda" else None
        if profile:
            try:
                prof = kernel_table(fn, model, wl, device)
            except Exception as e:  # the measurement stands without the profile
                prof = {"error": f"{type(e).__name__}: {e}"[:400]}
    if name.startswith("remat"):
        row.update(plan_fields(fn))
    msgs = sorted({str(w.message)[:300] for w in caught if str(w.message).startswith("remat")})
    if msgs:
        row["remat_warnings"] = msgs[:5]
    if kept is not None:
        kept[name] = (fn, model)
    del fn, model
    return row, g, prof


def timed_step(fn: Callable, model: nn.Module, wl: Workload, device: torch.device) -> float:
    """One step's milliseconds: CUDA events on a GPU, the wall clock on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(fn, model, wl)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)
    t = time.perf_counter()
    step(fn, model, wl)
    return (time.perf_counter() - t) * 1e3


WARM_ROUNDS = 2
"""Untimed round-robin rounds before ``interleave`` times any (recompiles after a switch)."""


def interleave(kept: dict, rows: list[dict], wl: Workload, device: torch.device, rounds: int) -> None:
    """Time the kept strategies' steps round-robin (one step each per round, the order rotated
    every round) and make the median of those the rows' ``ms``; the sequential median stays as
    ``ms_sequential``. Steps a few seconds apart share the machine's state (clocks, other jobs),
    so their ratios are not moved by drift between one strategy's timing and the next one's:
    on the H200 two sequential runs of the same code put GPT-2's remat/compile ratio at 0.90
    and 1.13."""
    names = list(kept)
    times: dict[str, list[float]] = {n: [] for n in names}
    # Untimed rounds first: strategies built on one model class share its code objects, and
    # Dynamo recompiles a strategy's frames the first time or two it runs after another's (HF
    # GPT-2's compile after compile+ckpt: 3,013 and 862 ms, then 9 ms, on a CPU; the H100's
    # interleaved GPT-2 compile median was 4,064.78 ms against 29.79 sequential before this).
    for r in range(WARM_ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            fn, model = kept[n]
            timed_step(fn, model, wl, device)
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            fn, model = kept[n]
            times[n].append(timed_step(fn, model, wl, device))
    for row in rows:
        got = times.get(row["strategy"])
        if got:
            row["ms_sequential"] = row["ms"]
            row["ms"], row["ms_min"] = statistics.median(got), min(got)
            row["ms_rounds"] = got
            row["timing"] = f"interleaved: {rounds} rounds"


# ---------------------------------------------------------------------------------------------
# Profile


def kernel_category(kernel: str) -> str:
    k = kernel.lower()
    if k.startswith("triton_"):  # Inductor's kernels name the ops they fused, attention's mask included
        return "triton (Inductor)"
    if any(s in k for s in ("flash", "fmha", "attention", "sdpa", "attn", "cudnn::fusion", "unpack_cudnn")):
        return "attention"
    if any(s in k for s in ("conv", "fprop", "dgrad", "wgrad", "implicit", "winograd", "cudnn")):
        return "convolution"
    if k in ("aten::mm", "aten::bmm") or any(s in k for s in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul",
                                                              "splitk", "addmm", "mm_")):
        return "matmul"
    if any(s in k for s in ("memcpy", "memset", "fill", "copy")):
        return "copy/fill"
    return "other (aten)"


def base_name(kernel: str) -> str:
    """A Triton kernel's name without Inductor's trailing counter (``triton_poi_fused_add_3`` ->
    ``triton_poi_fused_add``), so the same fusion matches across two compiles."""
    return re.sub(r"_\d+$", "", kernel) if kernel.startswith("triton_") else kernel


def kernel_table(fn: Callable, model: nn.Module, wl: Workload, device: torch.device) -> dict:
    """GPU kernels of one step (CPU ops on CPU): name -> calls, total us."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    step(fn, model, wl)
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as p:
        step(fn, model, wl)
        sync(device)
    kernels: dict[str, dict] = {}

    def add(name: str, calls: int, us: float) -> None:
        if us > 0:
            k = kernels.setdefault(name, {"calls": 0, "us": 0.0})
            k["calls"] += calls
            k["us"] += float(us)

    if cuda:  # each device event is one kernel (or memcpy/memset) run
        for e in p.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                add(e.name, 1, e.time_range.elapsed_us())
    else:
        for e in p.key_averages():
            add(e.key, e.count, e.self_cpu_time_total)
    return {"kind": "cuda kernels" if cuda else "cpu ops", "total_us": sum(k["us"] for k in kernels.values()),
            "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1]["us"]))}


def _group(table: dict, key: Callable[[str], str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name, k in table["kernels"].items():
        g = out.setdefault(key(name), {"calls": 0, "us": 0.0})
        g["calls"] += k["calls"]
        g["us"] += k["us"]
    return out


def profile_markdown(profiles: dict, top: int = 40) -> str:
    """Per model: kernel time by category and the kernels (Triton counters stripped) whose total
    time differs most between torch.compile and remat's default plan."""
    lines = []
    for model, runs in profiles.items():
        a, b = runs.get("compile"), runs.get("remat")
        if not a or not b or "error" in a or "error" in b:
            errors = json.dumps({k: v.get("error") for k, v in runs.items()})
            lines += [f"## {model}", "", f"profile incomplete: {errors}", ""]
            continue
        lines += [f"## {model}: one step, {a['kind']}, compile {a['total_us'] / 1e3:.2f} ms vs remat "
                  f"{b['total_us'] / 1e3:.2f} ms of kernel time ({(b['total_us'] - a['total_us']) / 1e3:+.2f} ms)", "",
                  "| category | compile calls | compile ms | remat calls | remat ms | remat - compile ms |",
                  "|---|---|---|---|---|---|"]
        ca, cb = _group(a, kernel_category), _group(b, kernel_category)
        for cat in sorted(set(ca) | set(cb), key=lambda c: -abs(cb.get(c, {}).get("us", 0)
                                                                 - ca.get(c, {}).get("us", 0))):
            x, y = ca.get(cat, {"calls": 0, "us": 0.0}), cb.get(cat, {"calls": 0, "us": 0.0})
            lines.append(f"| {cat} | {x['calls']} | {x['us'] / 1e3:.3f} | {y['calls']} | {y['us'] / 1e3:.3f} | "
                         f"{(y['us'] - x['us']) / 1e3:+.3f} |")
        ga, gb = _group(a, base_name), _group(b, base_name)
        names = sorted(set(ga) | set(gb), key=lambda n: -abs(gb.get(n, {}).get("us", 0) - ga.get(n, {}).get("us", 0)))
        lines += ["", f"Top {top} kernels by |time difference| (Triton counters stripped):", "",
                  "| kernel | category | where | compile calls | compile us | remat calls | remat us | diff us |",
                  "|---|---|---|---|---|---|---|---|"]
        for n in names[:top]:
            x, y = ga.get(n), gb.get(n)
            where = "both" if x and y else ("compile only" if x else "remat only")
            x, y = x or {"calls": 0, "us": 0.0}, y or {"calls": 0, "us": 0.0}
            shown = n if len(n) <= 90 else n[:87] + "..."
            lines.append(f"| `{shown}` | {kernel_category(n)} | {where} | {x['calls']} | {x['us']:.0f} | "
                         f"{y['calls']} | {y['us']:.0f} | {y['us'] - x['us']:+.0f} |")
        only_a = sum(v["us"] for n, v in ga.items() if n not in gb)
        only_b = sum(v["us"] for n, v in gb.items() if n not in ga)
        lines += ["", f"Kernel names only in compile: {sum(1 for n in ga if n not in gb)} ({only_a / 1e3:.2f} ms); "
                  f"only in remat: {sum(1 for n in gb if n not in ga)} ({only_b / 1e3:.2f} ms).", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Reporting


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _fmt(x: Any, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(results: dict) -> str:
    head = (f"{results['device']}, torch {results['torch']}, {results['dtype']}, {results.get('date', '')}; "
            f"{', '.join(results.get('libraries', []))}")
    lines = [head, "",
             "step ms: median over the timed steps (CUDA events); MiB: measured peak of one step (protocol in "
             "`real_models.py`); predicted: remat's plan(s) (composed over graphs if several); "
             "x compile: against torch.compile in the same run.", ""]
    cols = ("| model | strategy | step ms | measured MiB | predicted MiB | pred/meas | pred. eager MiB "
            "(vs eager meas.) | time x compile | mem x compile | compile s | grad rel err | graphs | note |")
    lines += [cols, "|" + "---|" * 13]
    ratios_t, ratios_m = [], []
    for model, data in results["models"].items():
        rows = data["rows"]
        comps = {r.get("run", 0): r for r in rows if r["strategy"] == "compile" and r.get("status") == "ok"}
        eager = next((r for r in rows if r["strategy"] == "eager" and r.get("status") == "ok"), None)
        for r in rows:
            note = r.get("note", "")
            comp = comps.get(r.get("run", 0)) or next(iter(comps.values()), None)
            if len(results.get("runs", ())) > 1:
                note = f"run {r.get('run', 0) + 1}. {note}".strip()
            if r.get("status") != "ok":
                lines.append(f"| {model} | {r['strategy']} | {r['status']} ||||||||||| "
                             f"{(r.get('error') or '')[:160].replace('|', '/')} |")
                continue
            peak = r.get("peak_mib")
            pred = r.get("predicted_peak_mib")
            pm = f"{pred / peak:.3f}" if pred and peak else "-"
            pe = r.get("predicted_eager_peak_mib")
            pes = "-" if pe is None else (f"{pe:.0f} ({pe / eager['peak_mib']:.3f})" if eager and eager.get("peak_mib")
                                          else f"{pe:.0f}")
            tx = f"{r['ms'] / comp['ms']:.3f}" if comp else "-"
            mx = f"{peak / comp['peak_mib']:.3f}" if comp and peak and comp.get("peak_mib") else "-"
            err = r.get("grad_rel_err")
            if r["strategy"] == "eager" and "grad_noise_floor" in r:
                note = f"{note} dropout noise floor (eager vs eager, other seed): {r['grad_noise_floor']:.1e}".strip()
            if r.get("fallback"):
                note = (note + f" fallback: {r['fallback']}").strip()
            if r.get("simulated_peak_mib") and r.get("read_peak_mib"):
                note = (note + f" simulated {r['simulated_peak_mib']:.0f}, read {r['read_peak_mib']:.0f}").strip()
            if r.get("replans"):
                note = (note + " " + "; ".join(r["replans"])[:200].replace("|", "/")).strip()
            if r.get("graphs", 1) > 1:
                note = (note + f" {r['graphs']} graphs: predicted sum {r.get('predicted_peak_sum_mib', 0):.0f}").strip()
            lines.append(f"| {model} | {r['strategy']} | {r['ms']:.2f} | {_fmt(peak, '.0f')} | {_fmt(pred, '.0f')} | "
                         f"{pm} | {pes} | {tx} | {mx} | {r['compile_s']:.1f} | {_fmt(err, '.1e')} | "
                         f"{r.get('graphs', r.get('dynamo_graphs', '')) or ''} | {note} |")
            if r["strategy"] == "remat" and comp and peak and comp.get("peak_mib"):
                ratios_t.append(r["ms"] / comp["ms"])
                ratios_m.append(peak / comp["peak_mib"])
    if ratios_t:
        lines += ["", f"remat default vs torch.compile, geomean over {len(ratios_t)} models: "
                  f"time {geomean(ratios_t):.3f}x, memory {geomean(ratios_m):.3f}x"]
    for k, run in enumerate(results.get("runs", ())):
        cmd = shlex.join(run.get("argv") or [])
        lines.append(f"{'' if k else chr(10)}run {k + 1}: {run.get('date')}, `{cmd}`")
    lines += [f"{'' if k else chr(10)}{n}" for k, n in enumerate(results.get("notes", ()))]
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = [m for m, d in results["models"].items() if any(r.get("peak_mib") for r in d["rows"])]
    if not names:
        return
    cols = min(len(names), 4)
    rows_n = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 4.2 * rows_n), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, model in zip(axes.flat, names):
        rows = [r for r in results["models"][model]["rows"] if r.get("status") == "ok" and r.get("peak_mib")]
        rm = sorted((r for r in rows if r["strategy"].startswith("remat")), key=lambda r: r["ms"])
        if rm:
            ax.plot([r["ms"] for r in rm], [r["peak_mib"] for r in rm], "-o", color="C3", label="remat")
            for r in rm:
                if r.get("predicted_peak_mib"):
                    ax.scatter(r["ms"], r["predicted_peak_mib"], marker="x", color="C3", alpha=0.6)
        for r in rows:
            if not r["strategy"].startswith("remat"):
                ax.scatter(r["ms"], r["peak_mib"], color="C0")
            ax.annotate(r["strategy"], (r["ms"], r["peak_mib"]), fontsize=7)
        ax.set_title(model)
        ax.set_xlabel("median step time (ms)")
        ax.set_ylabel("measured peak (MiB); x = remat predicted")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_report(results: dict, out: str, tag: str) -> None:
    table = markdown(results)
    print(table)
    with open(os.path.join(out, f"{tag}.md"), "w") as f:
        f.write(table + "\n")
    plot(results, os.path.join(out, f"{tag}.png"))


def merge(paths: list[str]) -> tuple[dict, dict]:
    """(results, profiles) from several runs' JSON files (``<tag>.json``, ``<tag>-profile.json``);
    each row gets ``run``, the index of its results file."""
    results: dict = {}
    profiles: dict = {}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        if "models" not in r:  # a profile file
            for m, d in r.items():
                profiles.setdefault(m, {}).update(d)
            continue
        if not results:
            results = {k: v for k, v in r.items() if k != "models"}
            results["models"] = {}
            results["runs"] = []
        k = len(results["runs"])
        results["runs"].append({key: r.get(key) for key in ("date", "argv", "torch", "device")})
        for m, d in r["models"].items():
            rows = results["models"].setdefault(m, {"rows": [], "info": d.get("info", {})})["rows"]
            rows += [dict(row, run=k) for row in d["rows"]]
    return results, profiles


def write_anchors(results: dict, out: str, name: str) -> None:
    keep = ANCHORS + ("compile",)
    anchors = {k: v for k, v in results.items() if k != "models"}
    anchors["models"] = {m: {"info": d["info"], "rows": [r for r in d["rows"] if r["strategy"] in keep]}
                         for m, d in results["models"].items()}
    with open(os.path.join(out, name), "w") as f:
        json.dump(anchors, f, indent=1)


# ---------------------------------------------------------------------------------------------
# Driver


def anchors_name(device: torch.device) -> str:
    where = "h200" if device.type == "cuda" else "cpu-tiny"
    return f"anchors-{where}-torch{torch.__version__.split('+')[0]}.json"


def anchors_path(args, device: torch.device) -> str:
    return args.anchors_file or os.path.join(os.path.dirname(os.path.abspath(__file__)), anchors_name(device))


def load_anchor_peaks(path: str) -> dict[str, int]:
    """compile+ckpt's measured peak (bytes) per model from an anchors file, if there is one."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        data = json.load(f)
    peaks = {}
    for m, d in data.get("models", {}).items():
        for r in d["rows"]:
            if r["strategy"] == "compile+ckpt" and r.get("peak_mib"):
                peaks[m] = int(r["peak_mib"] * MiB)
    return peaks


def strategy_list(args) -> list[str]:
    names = list(args.strategies or (ANCHORS if args.anchors else NORMAL))
    for n in names:
        if split_suffixes(n)[0] not in STRATEGIES:
            raise SystemExit(f"unknown strategy {n!r}; expected some of {STRATEGIES}, optionally ending with some "
                             f"of {tuple(SUFFIXES)}")
    if "compile" not in names and not args.no_compile:  # the denominator of every ratio
        names.insert(1 if names and names[0] == "eager" else 0, "compile")
    if "eager" in names:  # the gradient reference first
        names.remove("eager")
        names.insert(0, "eager")
    needs = [n for n in names if split_suffixes(n)[0] in ("remat @ckpt peak", "remat @0.8 ckpt")]
    if "compile+ckpt" in names and needs:  # measured before the strategies whose budget it sets
        names.remove("compile+ckpt")
        names.insert(min(names.index(n) for n in needs), "compile+ckpt")
    return names


def cleanup(device: torch.device) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=None, choices=zoo.SUITE,
                        help=f"default: {' '.join(MODELS)}")
    parser.add_argument("--suite", action="store_true", help=f"every model of zoo.SUITE: {' '.join(zoo.SUITE)}")
    parser.add_argument("--strategies", nargs="+", help=f"some of {STRATEGIES}")
    parser.add_argument("--anchors", action="store_true",
                        help="measure the anchor strategies and write anchors-h200-torch<version>.json to --out")
    parser.add_argument("--anchors-file", help="where to read compile+ckpt's peak (default: next to this script)")
    parser.add_argument("--tiny", action="store_true", help="tiny configs on the CPU in fp32 (smoke test)")
    parser.add_argument("--profile", nargs="*", default=None, choices=zoo.SUITE,
                        help="kernel table of one step for compile and remat default of these models")
    parser.add_argument("--no-dropout", action="store_true",
                        help="dropout (and stochastic depth) probabilities 0: GPT-2, BERT, T5, MobileNetV3, Swin "
                             "(gradient errors then compare like for like)")
    parser.add_argument("--no-compile", action="store_true",
                        help="do not add torch.compile as the reference of the ratios (saves its compile time)")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile's backend (default inductor); aot_eager keeps a CPU smoke run short")
    parser.add_argument("--tune", default=None, choices=("everywhere",),
                        help="measure remat's candidate plans on any device (default: on CUDA only)")
    parser.add_argument("--remat-backend", default=None, choices=("inductor", "eager"),
                        help="remat's backend (default inductor); eager runs the split graphs uncompiled")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds for the whole run; each model gets an equal share of what is left")
    parser.add_argument("--strategy-timeout", type=float, default=300.0)
    parser.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                        help="after a model's strategies are measured, keep them all and time them round-robin "
                             "for ROUNDS rounds; their median becomes 'step ms' (the sequential one is kept)")
    parser.add_argument("--report", nargs="+", help="merge these JSON results into one table and plot; run nothing")
    parser.add_argument("--note", nargs="*", default=[], help="with --report: lines added under the tables")
    parser.add_argument("--tag", default="real-models")
    parser.add_argument("--out", default="out")
    args = parser.parse_args(argv)
    if args.suite and args.models:
        parser.error("--suite runs every model; give either it or --models")
    args.models = list(zoo.SUITE if args.suite else args.models or MODELS)
    os.makedirs(args.out, exist_ok=True)
    if args.report:
        results, profiles = merge(args.report)
        if results:
            results["notes"] = args.note
            with open(os.path.join(args.out, f"{args.tag}.json"), "w") as f:
                json.dump(results, f, indent=1)
            write_report(results, args.out, args.tag)
            if args.anchors:
                cuda = "H200" in results["device"]
                version = results["torch"].split("+")[0]
                write_anchors(results, args.out, f"anchors-{'h200' if cuda else 'cpu-tiny'}-torch{version}.json")
        if profiles:
            with open(os.path.join(args.out, f"{args.tag}-profile.json"), "w") as f:
                json.dump(profiles, f, indent=1)
            with open(os.path.join(args.out, f"{args.tag}-profile.md"), "w") as f:
                f.write(profile_markdown(profiles) + "\n\n" + "\n".join(args.note) + "\n")
        return
    t_start = time.monotonic()
    from tqdm import tqdm

    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    args.warmup = args.warmup if args.warmup is not None else (1 if device.type == "cpu" else 2)
    args.iters = args.iters if args.iters is not None else (2 if device.type == "cpu" else 10)
    names = strategy_list(args)
    profile_models = set(args.models if args.profile == [] else args.profile or ())
    anchor_peaks = load_anchor_peaks(anchors_path(args, device))
    libs = []
    for lib in ("transformers", "timm", "torchvision"):
        try:
            libs.append(f"{lib} {__import__(lib).__version__}")
        except Exception as e:
            libs.append(f"{lib} unavailable ({type(e).__name__})")
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "dtype": str(dtype), "tiny": args.tiny, "no_dropout": args.no_dropout,
               "backends": {"compile": args.compile_backend or "inductor", "remat": args.remat_backend or "inductor"},
               "libraries": libs,
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "argv": argv if argv is not None else __import__("sys").argv[1:],
               "warmup": args.warmup, "iters": args.iters, "models": {}}
    profiles: dict[str, dict] = {}
    tag = args.tag
    json_path = os.path.join(args.out, f"{tag}.json")

    def save() -> None:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
        if profiles:
            with open(os.path.join(args.out, f"{tag}-profile.json"), "w") as f:
                json.dump(profiles, f, indent=1)

    deadline = t_start + args.time_limit if args.time_limit else math.inf
    signal.signal(signal.SIGALRM, _alarm)
    bar = tqdm(total=len(args.models) * len(names), desc="real models")
    for mi, model_name in enumerate(args.models):
        model_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(args.models) - mi)
        try:
            wl = zoo.build(model_name, tiny=args.tiny, device=device, dtype=dtype, no_dropout=args.no_dropout)
        except ImportError as e:
            results["models"][model_name] = {"info": {}, "rows": [{"strategy": n, "status": "skipped",
                                                                   "error": f"not importable: {e}"} for n in names]}
            bar.update(len(names))
            save()
            continue
        rows: list[dict] = []
        results["models"][model_name] = {"info": wl.info, "rows": rows}
        ref, ckpt_peak, slowest = None, anchor_peaks.get(model_name), 0.0
        kept: dict = {}
        ckpt_from = "anchors file" if ckpt_peak else None
        for name in names:
            bar.set_postfix_str(f"{model_name}: {name}")
            left = model_deadline - time.monotonic()
            need = 15.0 if name.startswith("eager") else max(30.0, 1.1 * slowest)
            if left < need:
                rows.append({"strategy": name, "status": "skipped",
                             "error": f"time limit: {left:.0f} s left for this model, about {need:.0f} s needed"})
                bar.update(1)
                save()
                continue
            alarm = max(1, int(min(args.strategy_timeout, left)))
            profile = model_name in profile_models and name in ("compile", "remat")
            t0 = time.monotonic()
            signal.alarm(alarm)
            try:
                row, g, prof = measure(name, wl, args, device, ref, ckpt_peak, profile,
                                       kept if args.interleave else None)
                signal.alarm(0)
                if name == "eager":
                    ref = g
                if name == "compile+ckpt" and row.get("peak_mib"):
                    ckpt_peak, ckpt_from = int(row["peak_mib"] * MiB), "this run"
                base = split_suffixes(name)[0]
                if base in ("remat @ckpt peak", "remat @0.8 ckpt"):
                    share = 0.8 if base == "remat @0.8 ckpt" else 1.0
                    row["note"] = f"budget {share * ckpt_peak / MiB:.0f} MiB ({share:g}x compile+ckpt, {ckpt_from})"
                if prof is not None:
                    profiles.setdefault(model_name, {})[name] = prof
                del g
            except remat.InfeasibleBudgetError as e:
                row = {"strategy": name, "status": "infeasible", "error": str(e)[:600]}
            except torch.cuda.OutOfMemoryError as e:
                row = {"strategy": name, "status": "oom", "error": str(e)[:300]}
            except StrategyTimeout:
                row = {"strategy": name, "status": "timeout", "error": f"over {alarm} s"}
            except NoAnchor as e:
                row = {"strategy": name, "status": "skipped", "error": str(e)}
            except Exception as e:  # keep going; the table shows the failure
                tb = traceback.format_exc(limit=-3)
                row = {"strategy": name, "status": "error", "error": f"{type(e).__name__}: {e}"[:600],
                       "trace": tb[-1500:]}
            finally:
                signal.alarm(0)
            row["wall_s"] = time.monotonic() - t0
            if not name.startswith("eager"):
                slowest = max(slowest, row["wall_s"])
            rows.append(row)
            bar.update(1)
            cleanup(device)
            save()
        if args.interleave and len(kept) > 1:
            bar.set_postfix_str(f"{model_name}: interleaved timing")
            interleave(kept, rows, wl, device, args.interleave)
            save()
        kept.clear()
        del wl, ref
        cleanup(device)
    bar.close()
    save()
    write_report(results, args.out, tag)
    if profiles:
        with open(os.path.join(args.out, f"{tag}-profile.md"), "w") as f:
            f.write(profile_markdown(profiles) + "\n")
    if args.anchors:
        write_anchors(results, args.out, anchors_name(device))
    print(f"total {time.monotonic() - t_start:.0f} s")


if __name__ == "__main__":
    main()
