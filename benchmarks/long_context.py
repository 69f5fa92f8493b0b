"""Longest context under a memory cap (issue 13, item 2): for HF Llama (1024 wide, 12 layers,
16 heads, 4 KV heads, vocab 32000, SDPA attention, bf16) at batch 1, the longest sequence length,
a multiple of ``--granularity`` (1024), that trains without running out of memory under a hard
cap of ``--cap-gib`` (20) GiB for the process, and its tokens per second, for eager, eager +
per-block checkpointing, torch.compile, torch.compile + per-block checkpointing, remat's default
plan and remat with a budget set from the cap ("remat @cap").

    # H200, the whole table in one run of at most nine minutes (imports and writing included)
    python benchmarks/long_context.py --cap-gib 20 --time-limit 510 --tag long-context-h200 --out $OUT
    # CPU smoke test: tiny Llama in fp32, an emulated cap, the uncompiled remat backend
    python benchmarks/long_context.py --tiny --out out/

Writes ``<tag>.json`` (after every strategy, so a run cut short still leaves its data: device,
versions, date, argv, config, and per strategy every probe and the result), ``<tag>.md`` (strategy
| longest seq | tokens/s at it | peak MiB at it | compile s | note) and ``<tag>.png`` (tokens/s
against sequence length, one line per strategy, x at the shortest length that failed). Copy the
JSON (``--tag long-context-<name>``) into ``benchmarks/`` and run ``python benchmarks/render.py``:
benchmarks/README.md shows the newest such run and draws its plot (``render_long_context.py``).

Model and steps. ``zoo.build("llama")`` with batch (1, length) and
``max_position_embeddings`` raised to ``--max-seq``, built once on the CPU from one seed; each
strategy copies it to the GPU (so no second copy of the weights sits under the cap). The
strategies are ``real_models.make``'s: eager, eager+ckpt (the model's own
``gradient_checkpointing_enable``, non-reentrant), compile, compile+ckpt, remat. A step is
``real_models.step``: gradients set to None, forward, the model's LM loss (``labels=input_ids``),
backward. Token ids are drawn from a generator seeded with the length, the same for every
strategy.

The cap. ``torch.cuda.set_per_process_memory_fraction(cap / total)``: the caching allocator
raises ``torch.OutOfMemoryError`` when its reserved memory (weights, gradients, activations,
workspaces and cached free blocks; after it has released its cache and retried) would pass the
cap. CUDA's own context is outside it. A probe "fits" when its steps all ran; an out-of-memory
error (``torch.OutOfMemoryError``, or an error whose text says out of memory, however wrapped)
or ``remat.InfeasibleBudgetError`` (remat @cap: no plan is predicted under the budget at that
length) is a failure; so is any other error at a length longer than one that trained (noted:
cuDNN or a kernel may refuse a length), while an error before any length trained ends the
strategy (recorded). After a failure the step's tensors are dropped (``gc.collect()``,
``torch.cuda.empty_cache()``) and the search goes on.

Search (``find_longest``). Grow geometrically from the start length (doubling, the last step
clamped to ``--max-seq``) until a length fails, then close the bracket (longest fit, shortest
failure) to one ``--granularity``; a start that fails halves instead until a length fits. The
bracket's next probe is its midpoint (``--search bisect``) or, with ``--search guided`` (the
default), the length where the line through the two longest fits' memory (the reserved
high-water mark on the GPU) reaches the cap, when that lies inside the bracket; after two guided
probes in a row that did not halve the bracket the next is a midpoint, so it never takes more
than about three times bisection's probes, and usually two or three near the boundary instead
of six. Both keep the invariant (the low end fits, the high end fails), so both find the same
length when fitting is monotone in the length. The answer is the longest length that fit, with
the next multiple failing (or ``--max-seq`` fitting).

Compiling. compile, compile+ckpt and remat compile once: the first probe's token ids have the
sequence dimension marked dynamic (``torch._dynamo.mark_dynamic``), so one graph serves every
length (remat plans it with the first length as the size hint). If that compile fails, the
strategy falls back to a static compile per probe and says so in its notes; if Dynamo compiles
again at another length (its graph count grows), the note names the lengths: expect one past
65536 tokens, where the logits (length x 32000) outgrow Inductor's 32-bit indexing, which it
guarded at the first length's hint. remat @cap compiles
afresh at every probe length, because a budget is compared with the plan's predicted peak at the
traced sizes: a plan chosen at one length says nothing about another. It compiles with static
shapes (``--cap-shapes static``, the default): where transformers builds its causal mask inside
the graph, remat can turn it into SDPA's ``is_causal`` only at a static length (a mask is
evaluated at one size: Note [Long masks are evaluated on the host] in
``remat/capture/attention_mask.py``), and a kept mask costs length squared bytes and the fused
kernel. ``--cap-shapes dynamic`` marks the sequence dimension dynamic (the hint being the probe's
length), so Inductor's kernels do not bake the length in and later probes reuse them from its
cache, with any such mask kept. Its first probe is ``--cap-start``, by default
compile+ckpt's longest length in this run (else the longest any earlier strategy reached), so
that the comparison the issue asks for is measured at compile+ckpt's own length.

remat @cap's budget. ``remat.checkpoint(model, budget=B)`` bounds the predicted peak of a step,
counted as this benchmark counts it: bytes allocated during the step above what was allocated
before it (gradients, activations, outputs; not the weights). So ``B = cap - held - margin``,
where ``held`` is ``torch.cuda.memory_allocated()`` just before the probe's compile (weights,
token ids, library workspaces) and ``margin`` covers what the cap counts beyond allocated bytes
(the allocator's rounding, fragmentation and cached blocks): ``--budget-margin auto`` (default)
takes the ``reserved - allocated`` high-water difference of remat's default plan at its longest
fitting length in this run, at least 2% of the cap (5% when remat did not run; 0 with ``--tiny``,
whose emulated cap counts allocations as the budget does); a number is a fraction of the cap.

Measuring a probe. ``--warmup`` step(s) (the first compiles when needed; its wall time is the
probe's ``first_s``), then up to ``--iters`` timed steps (CUDA events), stopping early once
``--timing-s`` seconds were timed (at least one). remat's measured plans (``remat.tuning``) are
chosen on the first steps, a candidate a step: the probe steps on until every graph chose
(``real_models.finish_tuning``, at most 16 steps; ``tuning_steps``, ``tuning_s`` in its
``extra``) before it times any. Step ms = their median; tokens/s = length / step seconds.
Measured peak (``real_models`` protocol): gradients set to None before the step,
``reset_peak_memory_stats()``, peak = ``max_memory_allocated`` during the step minus
``memory_allocated`` before it; the maximum over the timed steps. ``reserved_mib`` is the highest
``max_memory_reserved`` of the probe, what the cap bounds.

Offload (issue 28). ``--cap-offload auto|all`` passes ``offload=`` to remat @cap, so its budget
may be met by keeping saved activations in pinned host memory between the forward and the
backward (``remat.planning.offload``) as well as by recomputing them; ``off`` (default) never.

Time. ``--time-limit`` seconds for the whole run: each strategy gets a share of what is left,
weighted by what it is expected to need (``WEIGHTS``), and is skipped (with a note) if its share
is below what it needs to start; within its share the search does not start a probe it expects
to overrun (the longest fit's step time scaled by the square of the length, plus a compile per
probe for remat @cap), and a SIGALRM (``real_models.StrategyTimeout``) stops a strategy that
overruns by more than a grace period. A search stopped early reports its bracket.

Splitting the table over runs. ``--start`` sets the first length of every strategy but remat
@cap (a search that starts near its answer skips the short probes and, for the compiled ones, a
compile); ``--reuse FILE`` copies into this run's JSON the strategies of an earlier run (same GPU,
torch, cap and model) that ``--strategies`` leaves out, each noted with the file and date it comes
from, so one JSON holds the whole table; remat @cap's default start then reads compile+ckpt's
length from whichever run measured it.

``--tiny``: a tiny Llama in fp32 on the CPU (``zoo.build("llama", tiny=True)``) with an
emulated cap: there is no allocator cap on the CPU, so a probe fails when its measured step peak
(``remat.compat.measure_cpu_peak_bytes``: storages allocated during the step, weights excluded)
exceeds ``--cap-mib``; torch.compile uses ``--compile-backend aot_eager`` and remat its uncompiled
backend (``--remat-backend eager``) unless told otherwise, to stay at a few seconds a strategy.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import gc
import json
import math
import os
import pathlib
import shlex
import signal
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository: `benchmarks` as a package
import remat  # noqa: E402
import zoo  # noqa: E402
from benchmarks import real_models as rm  # noqa: E402
from benchmarks import render_long_context as rlc  # noqa: E402
from remat import compat  # noqa: E402

STRATEGIES = ("eager", "eager+ckpt", "compile", "compile+ckpt", "remat", "remat @cap")
CAP = "remat @cap"
WEIGHTS = {"eager": 0.5, "eager+ckpt": 0.7, "compile": 1.3, "compile+ckpt": 2.8, "remat": 1.4, CAP: 4.0}
"""Shares of ``--time-limit``: about what each needs on an H200. A compile takes ~50 s;
compile+ckpt compiles twice when it reaches 65536 tokens (Inductor guards its 32-bit indexing of
the length x vocabulary logits at the first length's hint, so past 2**31 elements it compiles
again, with 64-bit indices); remat @cap compiles at every probe."""
MiB, GiB = 2**20, 2**30
OOM_TEXT = ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED")


# ---------------------------------------------------------------------------------------------
# The search


@dataclass
class Probe:
    """One length tried: whether its steps ran, and what they measured."""

    seq: int
    fits: bool
    why: str = "ok"
    """ok, oom, infeasible (remat: no plan under the budget), over the cap (emulated, CPU), error."""
    ms: float | None = None
    times_ms: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    peak_mib: float | None = None
    """The protocol's peak: allocated during the step above what was allocated before it."""
    reserved_mib: float | None = None
    held_mib: float | None = None
    """Allocated just before the measured step (weights, token ids, workspaces)."""
    capped_bytes: int | None = None
    """What the cap bounds (GPU: the reserved high-water mark; CPU: the step's peak)."""
    first_s: float | None = None
    """Wall time of the probe's first step (with the compile, when it compiled)."""
    compiled: bool = False
    wall_s: float | None = None
    graphs: int | None = None
    guided: bool = False
    error: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class Search:
    """The state of one search: the probes so far and the bracket they give. ``lo`` fits (0:
    no length fitted yet), ``hi`` fails (None: no length failed yet)."""

    granularity: int
    max_len: int
    probes: list[Probe] = field(default_factory=list)
    lo: int = 0
    hi: int | None = None
    stopped: str | None = None

    def record(self, p: Probe) -> None:
        self.probes.append(p)
        if p.fits:
            self.lo = max(self.lo, p.seq)
        else:
            self.hi = p.seq if self.hi is None else min(self.hi, p.seq)

    @property
    def complete(self) -> bool:
        """The answer is known: the next multiple fails, or the upper bound fits."""
        if self.hi is None:
            return self.lo >= self.max_len
        return self.hi - self.lo <= self.granularity


def guess(search: Search, cap_bytes: float) -> int | None:
    """Where the line through the two longest fits' ``capped_bytes`` reaches ``cap_bytes``, as a
    multiple of the granularity strictly inside the bracket; None when that is not inside it
    (the line contradicts the bracket) or there are not two such fits."""
    fits = sorted({p.seq: p for p in search.probes if p.fits and p.capped_bytes}.values(), key=lambda p: p.seq)
    if len(fits) < 2 or search.hi is None:
        return None
    a, b = fits[-2], fits[-1]
    if b.capped_bytes <= a.capped_bytes:
        return None
    at = b.seq + (cap_bytes - b.capped_bytes) * (b.seq - a.seq) / (b.capped_bytes - a.capped_bytes)
    if not search.lo < at < search.hi:
        return None
    g = search.granularity
    return min(max(int(at) // g * g, search.lo + g), search.hi - g)


def find_longest(probe: Callable[[int], Probe], *, granularity: int, max_len: int, start: int | None = None,
                 cap_bytes: float | None = None, guided: bool = True,
                 may_probe: Callable[[int, Search], bool] = lambda n, s: True,
                 search: Search | None = None) -> Search:
    """The longest multiple of ``granularity`` up to ``max_len`` for which ``probe`` fits,
    assuming fitting is monotone in the length (see the module docstring). ``may_probe(n,
    search)`` False stops the search before probing ``n`` (``search.stopped`` says so). Pass
    ``search`` to keep the probes of a search an exception ends."""
    g = granularity
    top = max_len // g * g
    if top < g:
        raise ValueError(f"max_len {max_len} is below the granularity {g}")
    s = search if search is not None else Search(g, top)

    def run(n: int, guided_: bool = False) -> bool | None:
        if not may_probe(n, s):
            s.stopped = f"time limit: not probing {n}"
            return None
        p = probe(n)
        p.guided = guided_
        s.record(p)
        return p.fits

    n = min(max(start or g, g) // g * g, top)
    while True:  # the bracket: double while it fits, halve while it fails
        fits = run(n)
        if fits is None:
            return s
        if fits:
            if s.hi is not None or n >= top:
                break
            n = min(2 * n, top)
        else:
            if s.lo > 0 or n <= g:
                break
            n = max(g, n // 2 // g * g)
    misses = 0  # guided probes in a row that did not halve the bracket
    while s.hi is not None and s.hi - s.lo > g:  # close it
        width = s.hi - s.lo
        n = guess(s, cap_bytes) if guided and cap_bytes and misses < 2 else None
        if run(n if n is not None else s.lo + width // 2 // g * g, n is not None) is None:
            return s
        misses = misses + 1 if n is not None and s.hi - s.lo > width / 2 else 0
    return s


# ---------------------------------------------------------------------------------------------
# One strategy


def is_oom(e: BaseException | None) -> bool:
    """An out-of-memory error, possibly wrapped (Dynamo's BackendCompilerFailed, autograd)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, torch.OutOfMemoryError) or any(t in str(e) for t in OOM_TEXT):
            return True
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return False


def is_infeasible(e: BaseException | None) -> bool:
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, remat.InfeasibleBudgetError):
            return True
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return False


def is_compile_error(e: BaseException | None) -> bool:
    """An error raised while Dynamo, AOTAutograd or Inductor compiled (a dimension marked dynamic
    that the model specialises raises one), not by a kernel at run time."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        where = type(e).__module__
        if where.startswith(("torch._dynamo", "torch._inductor", "torch._functorch", "torch.fx")):
            return True
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return False


def short(e: BaseException, chars: int = 300) -> str:
    """The error's first line (``chars`` characters at most) and its notes (remat's: which tuning
    candidate's forward ran out of memory)."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:chars] + "".join(
        f" [{n}]" for n in getattr(e, "__notes__", ()))


def oom_detail(e: BaseException, device: torch.device) -> dict[str, Any]:
    """Where an out-of-memory error struck (the innermost frames) and the allocator's state then:
    allocated, reserved (the cap bounds it) and reserved but unallocated."""
    tb = traceback.extract_tb(e.__traceback__)[-6:]
    frames = [f"{pathlib.Path(f.filename).name}:{f.lineno} {f.name}" for f in tb]
    out: dict[str, Any] = {"frames": frames}
    if device.type == "cuda":
        allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
        out.update(allocated_mib=allocated / 2**20, reserved_mib=reserved / 2**20,
                   unallocated_mib=(reserved - allocated) / 2**20)
    return out


def free(device: torch.device, collect: bool = True) -> None:
    """Release the allocator's cached blocks (after ``gc.collect()``: a failed step's tensors
    can sit in reference cycles through its traceback; a full collection is slow after
    compiling, so it is skipped after a step that ran)."""
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def token_ids(n: int, vocab: int, device: torch.device) -> torch.Tensor:
    """Batch 1, ``n`` tokens, seeded by the length: every strategy trains on the same ids."""
    gen = torch.Generator(device).manual_seed(n)
    return torch.randint(0, vocab, (1, n), generator=gen, device=device)


@dataclass
class Setup:
    """What every strategy shares."""

    args: argparse.Namespace
    device: torch.device
    master: zoo.Workload
    """The seeded model on the CPU; each strategy copies it to the device."""
    vocab: int
    cap_bytes: int


def measure(fn: Callable, model: torch.nn.Module, wl: zoo.Workload, n: int, setup: Setup, *,
            is_remat: bool = False) -> Probe:
    """The probe's steps (see the module docstring); raises what a step raises."""
    args, device = setup.args, setup.device
    cuda = device.type == "cuda"
    rm.zero_grads(model)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    rm.step(fn, model, wl)
    rm.sync(device)
    first_s = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        rm.step(fn, model, wl)
    tuning = rm.finish_tuning(fn, model, wl, device, limit=16) if is_remat and rm.tuning_pending(fn) else {}
    reserved = torch.cuda.max_memory_reserved() if cuda else 0
    cpu_peak = None
    if not cuda:  # the emulated cap
        rm.zero_grads(model)
        cpu_peak = compat.measure_cpu_peak_bytes(lambda: rm.step(fn, model, wl))
        if cpu_peak > setup.cap_bytes:
            return Probe(n, False, "over the cap (emulated)", peak_mib=cpu_peak / MiB, capped_bytes=cpu_peak,
                         first_s=first_s)
    times, peaks, held = [], [], 0
    before = _allocator_calls() if cuda else {}
    for _ in range(args.iters):
        if cuda:
            rm.zero_grads(model)
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        times.append(rm.timed_step(fn, model, wl, device))
        if cuda:
            peaks.append(torch.cuda.max_memory_allocated() - held)
            reserved = max(reserved, torch.cuda.max_memory_reserved())
        if sum(times) / 1e3 >= args.timing_s:
            break
    ms = statistics.median(times)
    peak = max(peaks) if cuda else cpu_peak
    extra = dict(tuning)
    if cuda:  # the caching allocator at the cap (issue 28, item 5): per timed step
        extra |= {k: (v - before[k]) / len(times) for k, v in _allocator_calls().items()}
    if args.kernels:  # where a step's time goes: its longest kernels (CPU: ops), one more step
        table = rm.kernel_table(fn, model, wl, device)
        extra["kernels"] = {"kind": table["kind"], "total_ms": table["total_us"] / 1e3,
                            "top": [[name, k["calls"], k["us"] / 1e3]
                                    for name, k in list(table["kernels"].items())[:args.kernels]]}
    return Probe(n, True, ms=ms, times_ms=times, tokens_per_s=n / (ms / 1e3), peak_mib=peak / MiB,
                 reserved_mib=reserved / MiB if cuda else None, held_mib=held / MiB if cuda else None,
                 capped_bytes=reserved if cuda else cpu_peak, first_s=first_s, extra=extra)


def _allocator_calls() -> dict[str, int]:
    """The caching allocator's counts so far: allocations it retried after freeing its cache (a
    full allocation failed against the cap) and cudaMalloc / cudaFree calls."""
    stats = torch.cuda.memory_stats()
    return {"alloc_retries": stats.get("num_alloc_retries", 0), "device_allocs": stats.get("num_device_alloc", 0),
            "device_frees": stats.get("num_device_free", 0)}


class Runner:
    """One strategy: its copy of the model, its compiled step, and how it compiles.

    ``mode``: "eager" (nothing to compile), "dynamic" (compiled once, the sequence dimension
    marked dynamic) or "per-probe" (compiled afresh at every length; ``mark``: with the
    sequence dimension marked dynamic all the same)."""

    def __init__(self, name: str, setup: Setup, margin_bytes: int):
        self.name, self.setup, self.margin = name, setup, margin_bytes
        args = setup.args
        self.model = copy.deepcopy(setup.master.model).to(setup.device)
        self.wl = dataclasses.replace(setup.master, model=self.model, inputs={})
        self.mode = "eager" if name.startswith("eager") else "per-probe" if name == CAP else "dynamic"
        self.mark = self.mode == "dynamic" or args.cap_shapes == "dynamic"
        self.fn: Callable | None = None
        self.notes: list[str] = []
        self.budget: int | None = None
        self.hint: int | None = None
        """The length the step was last compiled at (remat plans with its sizes)."""
        self.first_hint: int | None = None
        self.graphs: int | None = None
        self.fitted = False

    def build(self, n: int) -> Callable:
        """The strategy's step function, compiled at length ``n`` on its first call."""
        args, cuda = self.setup.args, self.setup.device.type == "cuda"
        if self.mode == "per-probe":
            self.fn = None
            torch._dynamo.reset()
            free(self.setup.device)
        dynamic = None if self.mark else False
        remat_kw: dict[str, Any] = {"backend": args.remat_backend, "dynamic": dynamic}
        if self.name == CAP:
            held = torch.cuda.memory_allocated() if cuda else 0
            self.budget = int(self.setup.cap_bytes - held - self.margin)
            remat_kw["budget"] = self.budget
            if args.cap_offload != "off":
                remat_kw["offload"] = args.cap_offload
        fn, _ = rm.make("remat" if self.name == CAP else self.name, self.model, self.wl, None,
                        compile_kw={"backend": args.compile_backend, "dynamic": dynamic}, remat_kw=remat_kw)
        self.hint = n
        self.first_hint = self.first_hint or n
        return fn

    def probe(self, n: int) -> Probe:
        t0 = time.monotonic()
        ids = token_ids(n, self.setup.vocab, self.setup.device)
        if self.mark and self.mode != "eager":
            torch._dynamo.mark_dynamic(ids, 1)
        self.wl.inputs = {"ids": ids}
        fresh = self.fn is None or self.mode == "per-probe"
        compiled = fresh and self.mode != "eager"
        p, retry = None, False
        try:
            if fresh:
                self.fn = self.build(n)
            p = measure(self.fn, self.model, self.wl, n, self.setup, is_remat=self.name.startswith("remat"))
        except rm.StrategyTimeout:
            raise
        except Exception as e:  # noqa: BLE001 - sorted below
            if is_oom(e):
                p = Probe(n, False, "oom", error=short(e, 900), extra=oom_detail(e, self.setup.device))
            elif is_infeasible(e):
                p = Probe(n, False, "infeasible", error=short(e))
            elif self.mark and self.mode != "eager" and (compiled or is_compile_error(e)):
                self.notes.append(f"compiling with the sequence dimension dynamic failed at {n} ({short(e)}); "
                                  "compiled with static shapes at every probe from there")
                self.mode, self.mark, self.fn, retry = "per-probe", False, None, True
            elif self.fitted:  # it trained at a shorter length: this length fails, otherwise than by OOM
                p = Probe(n, False, "error", error=short(e))
                self.notes.append(f"error at {n}: {short(e)}")
            else:  # it never trained: the strategy fails
                raise
        finally:  # outside the except clause: the failed step's frames (and tensors) are gone
            self.wl.inputs = {}
            del ids
            rm.zero_grads(self.model)
            free(self.setup.device, collect=p is None or not p.fits)
        if retry:
            return self.probe(n)
        p.compiled = compiled
        p.wall_s = time.monotonic() - t0
        self.after(p)
        return p

    def after(self, p: Probe) -> None:
        """Graph counts (a recompile is a note) and, for remat, its plan."""
        if self.mode == "eager":
            self.fitted = self.fitted or p.fits
            return
        graphs = rm.unique_graphs()
        if self.mode == "dynamic" and self.graphs is not None and graphs and graphs > self.graphs:
            self.notes.append(f"Dynamo compiled again at {p.seq} (graphs {self.graphs} -> {graphs})")
        self.graphs = p.graphs = graphs
        self.fitted = self.fitted or p.fits
        if self.name.startswith("remat") and self.fn is not None:
            try:
                plans = remat.compiled_plans(self.fn)
            except Exception:  # noqa: BLE001 - a failed probe that compiled nothing has no plan
                if p.fits:
                    raise
                return
            p.extra = {**p.extra, "plan_hint_seq": self.hint, "fallback": [x.fallback for x in plans if x.fallback],
                       "predicted_peak_mib": sum(x.predicted_peak_bytes for x in plans) / MiB,
                       "plan": rm.plan_fields(self.fn)}  # what the step ran: recompute, slices, offload, tuning
            if self.budget is not None:
                p.extra["budget_mib"] = self.budget / MiB

    def mode_note(self) -> str:
        if self.mode == "eager":
            return ""
        if self.mode == "dynamic":
            return f"compiled once, sequence dimension dynamic (first length {self.first_hint})"
        how = "sequence dimension dynamic, size hint the probe's length" if self.mark else "static shapes"
        return f"compiled at every probe length ({how})"


def cost_estimate(n: int, s: Search, runner: Runner, args: argparse.Namespace) -> float:
    """Seconds a probe at ``n`` is expected to take: the longest fit's step time scaled by the
    square of the length (attention's share grows so), times the steps a probe runs, plus a
    compile when the strategy compiles per probe."""
    fits = [p for p in s.probes if p.fits and p.ms]
    if not fits:
        return 0.0
    last = max(fits, key=lambda p: p.seq)
    step_s = last.ms / 1e3 * max(1.0, n / last.seq) ** 2
    timed = min(args.iters, max(1, math.ceil(args.timing_s / max(step_s, 1e-9))))
    compile_s = max((p.first_s or 0.0) for p in s.probes if p.compiled) if runner.mode == "per-probe" else 0.0
    return compile_s + (args.warmup + timed) * step_s


def result(name: str, runner: Runner | None, s: Search, status: str, error: str | None, wall_s: float) -> dict:
    """A strategy's JSON entry."""
    at = next((p for p in s.probes if p.fits and p.seq == s.lo), None)
    notes = list(runner.notes) if runner else []
    if s.stopped:
        notes.append(f"search stopped ({s.stopped})")
    if at and at.extra.get("budget_mib"):
        notes.append(f"budget {at.extra['budget_mib']:.0f} MiB at {s.lo}")
    if at and at.extra.get("fallback"):
        notes.append(f"fell back to autograd's saved tensors: {at.extra['fallback']}")
    first = next((p for p in s.probes if p.compiled), None)
    comp = at.first_s if runner and runner.mode == "per-probe" and at else first.first_s if first else None
    return {"status": status, "error": error, "mode": runner.mode if runner else None,
            "mode_note": runner.mode_note() if runner else "", "longest": s.lo,
            "first_fail": s.hi, "complete": s.complete and status == "ok", "compile_s": comp,
            "tokens_per_s": at.tokens_per_s if at else None, "peak_mib": at.peak_mib if at else None,
            "notes": notes, "wall_s": wall_s, "probes": [dataclasses.asdict(p) for p in s.probes]}


def run_strategy(name: str, setup: Setup, start: int, deadline: float, margin_bytes: int, bar: Any,
                 hard_deadline: float = math.inf) -> dict:
    """Search one strategy's longest length before ``deadline`` (monotonic seconds); a SIGALRM
    stops it a grace period later, and no later than ``hard_deadline``."""
    args = setup.args
    t0 = time.monotonic()
    s = Search(args.granularity, args.max_seq // args.granularity * args.granularity)
    runner, status, error = None, "ok", None
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    grace = 10.0 if args.tiny else 60.0
    handler = signal.signal(signal.SIGALRM, rm._alarm)
    alarm_at = min(deadline + grace, hard_deadline)
    if alarm_at < math.inf:
        signal.alarm(max(1, int(alarm_at - time.monotonic())))

    def probe(n: int) -> Probe:
        bar.set_postfix_str(f"{name}: {n}")
        p = runner.probe(n)
        bar.write(f"{name:>13} {n:>7}: " + (f"fits, {p.ms:.1f} ms, {p.tokens_per_s:.0f} tokens/s, peak "
                                             f"{p.peak_mib:.0f} MiB" if p.fits else f"{p.why} {p.error or ''}"[:160]))
        return p

    def may_probe(n: int, search: Search) -> bool:
        return time.monotonic() + cost_estimate(n, search, runner, args) <= deadline

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            runner = Runner(name, setup, margin_bytes)
            find_longest(probe, granularity=args.granularity, max_len=args.max_seq, start=start,
                         cap_bytes=setup.cap_bytes, guided=args.search == "guided", may_probe=may_probe, search=s)
        except rm.StrategyTimeout:
            status, error = "timeout", "ran past its share of the time limit (SIGALRM)"
        except Exception as e:  # noqa: BLE001 - recorded; the other strategies still run
            status, error = "error", short(e)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, handler)
    out = result(name, runner, s, status, error, time.monotonic() - t0)
    msgs = sorted({str(w.message)[:300] for w in caught if str(w.message).startswith("remat")})
    out["notes"] += msgs[:3]
    if runner is not None:
        runner.fn = None
        del runner
    torch._dynamo.reset()
    free(setup.device)
    return out


# ---------------------------------------------------------------------------------------------
# The run


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Defaults that depend on ``--tiny``."""
    tiny = args.tiny
    for key, gpu, cpu in (("granularity", 1024, 64), ("max_seq", 131072, 4096), ("iters", 3, 1),
                          ("timing_s", 4.0, 1.0), ("compile_backend", "inductor", "aot_eager"),
                          ("remat_backend", "inductor", "eager")):
        if getattr(args, key) is None:
            setattr(args, key, cpu if tiny else gpu)
    if args.cap_mib is None:
        args.cap_mib = 6.0 if tiny else args.cap_gib * 1024
    return args


def cap_start(results: dict, granularity: int) -> int:
    """remat @cap's first length: compile+ckpt's longest in this run (the length the issue's
    comparison is made at), else the longest any earlier strategy reached."""
    base = results.get("compile+ckpt", {})
    if base.get("longest"):
        return base["longest"]
    return max([r.get("longest", 0) for r in results.values()] + [granularity])


def margin_for(results: dict, cap_bytes: int, spec: str, device: torch.device) -> tuple[int, str]:
    """remat @cap's margin in bytes and how it was chosen (see the module docstring)."""
    if spec != "auto":
        return int(float(spec) * cap_bytes), f"--budget-margin {spec}"
    if device.type != "cuda":
        return 0, "auto: the emulated cap counts the step's allocations, as the budget does"
    res = results.get("remat")
    at = next((p for p in (res or {}).get("probes", []) if p["fits"] and p["seq"] == res.get("longest")), None)
    if at and at.get("reserved_mib") is not None and at.get("held_mib") is not None:
        over = (at["reserved_mib"] - at["held_mib"] - at["peak_mib"]) * MiB
        m = max(int(over), int(0.02 * cap_bytes))
        return m, (f"auto: reserved - allocated high-water of remat at {res['longest']}: {over / MiB:.0f} MiB, at "
                   f"least 2% of the cap")
    return int(0.05 * cap_bytes), "auto: 5% of the cap (remat's default plan not measured)"


def dynamo_sees_exporting() -> bool:
    """Whether ``torch.compiler.is_exporting()`` is True inside torch.compile (torch before
    pytorch#176499): transformers then builds an explicit length x length causal mask for
    compiled strategies instead of SDPA's ``is_causal``."""
    f = torch.compile(lambda x: x + 1 if torch.compiler.is_exporting() else x, backend="eager", fullgraph=True)
    out = bool(f(torch.zeros(1)).item())
    torch._dynamo.reset()
    return out


def header(args: argparse.Namespace, argv: list[str], device: torch.device, dtype: torch.dtype, wl: zoo.Workload,
           cap_bytes: int) -> dict:
    import transformers

    cfg = wl.model.config
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "max_position_embeddings")
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        cap = (f"cap {cap_bytes / GiB:g} GiB (set_per_process_memory_fraction {cap_bytes / total:.4f} of "
               f"{total / GiB:.1f} GiB)")
    else:
        cap = f"emulated cap {cap_bytes / MiB:g} MiB on the step's measured peak"
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "transformers": f"transformers {transformers.__version__}",
            "dtype": str(dtype), "tiny": args.tiny,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "argv": argv, "config": {**{k: getattr(cfg, k) for k in keys}, "batch": 1,
                                     "attn_implementation": cfg._attn_implementation},
            "cap": cap, "cap_bytes": cap_bytes, "granularity": args.granularity, "max_seq": args.max_seq,
            "search": args.search, "warmup": args.warmup, "iters": args.iters, "timing_s": args.timing_s,
            "compile_backend": args.compile_backend, "remat_backend": args.remat_backend,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "notes": [], "strategies": {}}


def reuse(doc: dict, path: str, names: list[str]) -> None:
    """Copy into ``doc`` the strategies of the earlier run at ``path`` that this run does not
    measure (``--reuse``), each noted with the run it comes from, in ``STRATEGIES`` order; refuse a
    run of another device, torch, cap or model."""
    with open(path) as f:
        old = json.load(f)
    keys = ("device", "torch", "cap_bytes", "granularity", "config", "dtype")
    differ = [k for k in keys if old.get(k) != doc.get(k) and not (k == "config" and _same_model(old, doc))]
    if differ:
        raise SystemExit(f"--reuse {path}: that run differs from this one in {', '.join(differ)}")
    src = f"from {os.path.basename(path)} ({old.get('date')})"
    doc["reused"] = {"file": os.path.basename(path), "date": old.get("date"), "argv": old.get("argv"),
                     "strategies": [n for n in old.get("strategies", {}) if n not in names]}
    for name in STRATEGIES:
        if name in old.get("strategies", {}) and name not in names:
            res = copy.deepcopy(old["strategies"][name])
            res["notes"] = [src] + res.get("notes", [])
            res["reused_from"] = os.path.basename(path)
            doc["strategies"][name] = res


def _same_model(a: dict, b: dict) -> bool:
    """The same model, whatever the position table's length (``--max-seq``)."""
    ca, cb = dict(a.get("config", {})), dict(b.get("config", {}))
    ca.pop("max_position_embeddings", None)
    cb.pop("max_position_embeddings", None)
    return ca == cb


def write_report(doc: dict, out: str, tag: str) -> None:
    text = rlc.markdown(doc, f"{tag}.json")
    print(text)
    with open(os.path.join(out, f"{tag}.md"), "w") as f:
        f.write(text + "\n")
    with contextlib.suppress(ImportError):
        rlc.draw(rlc.points(doc), rlc.title(doc), pathlib.Path(out) / f"{tag}.png")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    p.add_argument("--cap-gib", type=float, default=20.0, help="the process's memory cap on the GPU")
    p.add_argument("--cap-mib", type=float, default=None, help="the cap in MiB (--tiny: emulated; default 6)")
    p.add_argument("--max-seq", type=int, default=None, help="the search's upper bound (default 131072; tiny 4096)")
    p.add_argument("--granularity", type=int, default=None, help="lengths are multiples of it (1024; tiny 64)")
    p.add_argument("--search", choices=("guided", "bisect"), default="guided")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per probe (the first compiles)")
    p.add_argument("--iters", type=int, default=None, help="timed steps per probe, at most (3; tiny 1)")
    p.add_argument("--timing-s", type=float, default=None, help="stop timing a probe after this many seconds (4)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds for the whole run")
    p.add_argument("--budget-margin", default="auto", help="remat @cap: 'auto' or a fraction of the cap")
    p.add_argument("--cap-offload", choices=("off", "auto", "all"), default="off",
                   help="remat @cap's offload= (issue 28): 'off' (False), 'auto' or 'all'")
    p.add_argument("--cap-start", type=int, default=None,
                   help="remat @cap's first length (default: the longest an earlier strategy reached)")
    p.add_argument("--start", type=int, default=None,
                   help="the other strategies' first length (default: the granularity)")
    p.add_argument("--reuse", default=None,
                   help="an earlier run's JSON: its strategies that --strategies leaves out are copied in")
    p.add_argument("--cap-shapes", choices=("dynamic", "static"), default="static",
                   help="remat @cap, compiled per probe: sequence dimension marked dynamic, or static shapes")
    p.add_argument("--compile-backend", default=None, help="torch.compile's backend (inductor; tiny aot_eager)")
    p.add_argument("--remat-backend", default=None, help="remat's backend (inductor; tiny eager)")
    p.add_argument("--tiny", action="store_true", help="tiny Llama in fp32 on the CPU, emulated cap (smoke test)")
    p.add_argument("--kernels", type=int, default=0,
                   help="record each fitting probe's N longest kernels of one more step (CPU: ops; 0: none)")
    p.add_argument("--tag", default="long-context")
    p.add_argument("--out", default="out")
    return resolve(p.parse_args(argv))


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    argv = argv if argv is not None else sys.argv[1:]
    os.makedirs(args.out, exist_ok=True)
    t_start = time.monotonic()
    deadline = t_start + args.time_limit if args.time_limit else math.inf
    from tqdm import tqdm

    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    cap_bytes = int(args.cap_mib * MiB)
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(cap_bytes / torch.cuda.get_device_properties(device).total_memory)
    positions = max(args.max_seq, 2048)
    master = zoo.build("llama", tiny=args.tiny, device="cpu", dtype=dtype, batch=(1, args.granularity),
                       config={"max_position_embeddings": positions})
    setup = Setup(args, device, master, master.model.config.vocab_size, cap_bytes)
    doc = header(args, argv, device, dtype, master, cap_bytes)
    if device.type == "cuda" and dynamo_sees_exporting():
        doc["notes"].append("In this torch, torch.compiler.is_exporting() is True inside torch.compile, so "
                            "transformers builds an explicit length x length causal mask for the compiled strategies "
                            "(eager ones use SDPA's is_causal).")
    path = os.path.join(args.out, f"{args.tag}.json")

    def save() -> None:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)

    names = [n for n in STRATEGIES if n in args.strategies]
    if args.reuse:
        reuse(doc, args.reuse, names)
    bar = tqdm(total=len(names), desc="long context")
    slowest = 0.0
    for i, name in enumerate(names):
        bar.set_postfix_str(name)
        share = (deadline - time.monotonic()) * WEIGHTS[name] / sum(WEIGHTS[n] for n in names[i:])
        need = (1.0 if args.tiny else 10.0) if name.startswith("eager") else (
            max(3.0 if args.tiny else 45.0, 1.1 * slowest))
        if share < need:
            doc["strategies"][name] = {"status": "skipped", "error": f"time limit: a share of {share:.0f} s, about "
                                                                     f"{need:.0f} s needed to start", "probes": []}
            bar.update(1)
            save()
            continue
        start, margin = args.start or args.granularity, 0
        if name == CAP:
            start = args.cap_start or cap_start(doc["strategies"], args.granularity)
            margin, how = margin_for(doc["strategies"], cap_bytes, args.budget_margin, device)
            doc["budget_margin"] = {"mib": margin / MiB, "how": how}
        res = run_strategy(name, setup, start, time.monotonic() + share, margin, bar, deadline + 15.0)
        res["start"] = start
        if name == CAP:
            res["notes"].insert(0, f"budget = cap - held - margin, margin {margin / MiB:.0f} MiB ({how})")
        doc["strategies"][name] = res
        if not name.startswith("eager"):
            first = next((p for p in res["probes"] if p["compiled"]), None)
            slowest = max(slowest, first["first_s"] if first and first["first_s"] else 0.0)
        bar.update(1)
        save()
    bar.close()
    doc["strategies"] = {n: doc["strategies"][n] for n in STRATEGIES if n in doc["strategies"]}
    doc["wall_s"] = time.monotonic() - t_start
    save()
    write_report(doc, args.out, args.tag)
    print(f"total {doc['wall_s']:.0f} s; `{shlex.join(argv)}`")
    return doc


if __name__ == "__main__":
    main()
