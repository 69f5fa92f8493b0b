"""Which lowering choices cost remat its speed on real models: remat's default plan compiled
with one choice changed at a time, against torch.compile, timed interleaved in one process.

    python benchmarks/variant_probe.py --models resnet50 gpt2 --out out/   # GPU, ~7 minutes

Variants (each only changes how the first step compiles):
- ``compile``: torch.compile, the denominator.
- ``remat``: remat's default plan as shipped.
- ``remat notags``: no stage tags, so Inductor fuses across blocks freely (upper bound of what
  stage-local fusion costs; the predicted peak no longer models the kernels).
- ``remat noemul``: without ``emulate_precision_casts`` (Note [Recompute precision]).
- ``remat extsave``: values whose backward reader is an extern kernel (matmul, convolution,
  attention) and that the forward materialises anyway are saved, not recomputed (a recompute
  there cannot fuse into its consumer, so it runs as its own kernel).

Steps are timed in rounds (every variant once per round, ``--rounds`` rounds of ``--iters``
steps), the median over all of a variant's steps is reported, with the CPU time the step takes to
return without synchronising ("host ms": near "step ms" means the step is launch-bound).
Generated wrappers of each variant's graphs are copied to ``<out>/code/<model>/<variant>/``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import glob
import json
import os
import shutil
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real_models as rm  # noqa: E402  (it puts the repository root on sys.path)

import remat  # noqa: E402
import zoo  # noqa: E402

VARIANTS = ("compile", "remat", "remat notags", "remat noemul", "remat extsave")


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _no_emulation():
    import torch._inductor.compile_fx as cfx

    original = cfx.compile_fx

    def compile_fx(gm, inputs, **kw):
        patches = dict(kw.pop("config_patches", None) or {})
        patches.pop("emulate_precision_casts", None)
        return original(gm, inputs, config_patches=patches, **kw)

    return _patched(cfx, "compile_fx", compile_fx)


def _extern_fed_saved():
    from remat.backends.inductor.lowering import _runs_extern
    from remat.planning import planner

    original = planner._decisions

    def decisions(jg, options):
        no_recompute, no_save, reasons = original(jg, options)
        for i, (node, op) in enumerate(zip(jg.nodes, jg.ops)):
            if (i not in jg.forward or node.op != "call_function" or i in no_recompute or i in no_save
                    or op.is_view or op.is_matmul or op.is_attention or op.is_random or op.reduction_ratio):
                continue
            fwd_extern = bwd_extern = False
            todo, seen = list(node.users), set()
            while todo:
                u = todo.pop()
                if u in seen:
                    continue
                seen.add(u)
                j = jg.index.get(u)
                if j is not None and jg.ops[j].is_view:
                    todo.extend(u.users)
                    continue
                forward = j is not None and j in jg.forward
                if _runs_extern(u):
                    fwd_extern |= forward
                    bwd_extern |= not forward
            if fwd_extern and bwd_extern:
                no_recompute[i] = reasons[i] = "matmul"  # a cost rule: budgets may relax it
        return no_recompute, no_save, reasons

    return _patched(planner, "_decisions", decisions)


def variant_context(name: str):
    stack = contextlib.ExitStack()
    if name in ("remat notags",):
        import remat.backends.inductor.backend as ib

        stack.enter_context(_patched(ib, "tag_stages", lambda *m: None))
    if name in ("remat noemul",):
        stack.enter_context(_no_emulation())
    if name in ("remat extsave",):
        stack.enter_context(_extern_fed_saved())
    return stack


def timed_steps(fn, model, wl, iters):
    walls, hosts = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        rm.step(fn, model, wl)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        hosts.append((t1 - t0) * 1e3)
        walls.append((t2 - t0) * 1e3)
    return walls, hosts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["resnet50", "gpt2"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default="out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    device, dtype = torch.device("cuda"), torch.bfloat16
    results = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "models": {}}
    for name in args.models:
        wl = zoo.build(name, tiny=False, device=device, dtype=dtype)
        built = {}
        for v in args.variants:
            model = copy.deepcopy(wl.model)
            before = set(glob.glob(f"{cache}/**/*.py", recursive=True)) if cache else set()
            t0 = time.perf_counter()
            with variant_context(v):
                fn = torch.compile(model) if v == "compile" else remat.checkpoint(model)
                rm.step(fn, model, wl)
                torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            if cache:
                dest = os.path.join(args.out, "code", name, v.replace(" ", "_"))
                os.makedirs(dest, exist_ok=True)
                for f in sorted(set(glob.glob(f"{cache}/**/*.py", recursive=True)) - before):
                    if "def call(" in open(f).read():
                        shutil.copy(f, dest)
            for _ in range(3):
                rm.step(fn, model, wl)
            peak = rm.step_peak_bytes(fn, model, wl)
            info = {"compile_s": round(compile_s, 1), "peak_mib": round(peak / 2**20)}
            if v != "compile":
                plans = remat.compiled_plans(fn)
                info["saved_mib"] = round(sum(p.saved_bytes for p in plans) / 2**20)
                info["recomputed_ops"] = sum(len(p.recomputed) for p in plans)
            built[v] = (fn, model, info)
            print(name, v, info, flush=True)
        walls = {v: [] for v in built}
        hosts = {v: [] for v in built}
        for _ in range(args.rounds):
            for v, (fn, model, _) in built.items():
                w, h = timed_steps(fn, model, wl, args.iters)
                walls[v] += w
                hosts[v] += h
        rows = {}
        base = statistics.median(walls["compile"]) if "compile" in walls else None
        for v, (_, _, info) in built.items():
            ms = statistics.median(walls[v])
            rows[v] = {**info, "step_ms": round(ms, 2), "host_ms": round(statistics.median(hosts[v]), 2),
                       "x_compile": round(ms / base, 3) if base else None}
            print(name, v, rows[v], flush=True)
        results["models"][name] = rows
        with open(os.path.join(args.out, "variant-probe.json"), "w") as f:
            json.dump(results, f, indent=1)
        del built
        rm.cleanup(device)


if __name__ == "__main__":
    main()
