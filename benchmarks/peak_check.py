"""Predicted against measured peak activation memory of remat's plans: does
``Plan.predicted_peak_bytes`` describe the step that runs?

    python benchmarks/peak_check.py                                   # GPU: full sizes, bf16, CUDA
    python benchmarks/peak_check.py --device cpu --size small --dtype float32   # CPU self-check

For each workload (``zoo/workloads.py``) it wraps a fresh copy of the model with
``remat.checkpoint(model, backend=..., budget=b)`` for the default plan (``b=None``) and for
budgets of 25, 50, 75 and 100% of eager autograd's peak, runs one step to compile it, then
measures the peak of the step the prediction describes: ``out = f(x); out.backward(g)`` with
``g`` drawn after the forward and every gradient set to ``None`` before (so gradients count).
On CUDA the peak is ``torch.cuda.max_memory_allocated()`` minus the memory held before the step
(``bench.peak_of_backward_step``); on CPU it is the profiler's allocation trace
(``remat.compat.measure_cpu_peak_bytes``). Infeasible budgets and failures are recorded, never
fatal. Prints a table and writes ``peak_check.json`` to ``--out`` (default: ``$OUT`` or ``.``).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import pathlib
import sys
import time
import traceback

import torch

import remat
from remat import compat

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: `zoo`
from zoo import workloads  # noqa: E402

BUDGETS = (None, 0.25, 0.5, 0.75, 1.0)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def step_peak_bytes(fn, model, x) -> int:
    """Peak bytes allocated by ``out = fn(x); out.backward(g)``, gradients reset first."""
    for p in model.parameters():
        p.grad = None
    x.grad = None
    if x.device.type != "cuda":
        def step():
            out = fn(x)
            out.backward(torch.randn_like(out))

        return compat.measure_cpu_peak_bytes(step)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench import peak_of_backward_step  # this folder's benchmark script

    return peak_of_backward_step(fn, x)


def check(name: str, base, x, backend: str, budget: float | None) -> dict:
    """One row: the plan's predicted peak and the measured one (bytes), or why there is none."""
    row = {"workload": name, "backend": backend, "budget": budget}
    torch._dynamo.reset()
    model = copy.deepcopy(base)
    fn = remat.checkpoint(model, backend=backend, budget=budget)
    t0 = time.perf_counter()
    try:
        out = fn(x)
        out.backward(torch.ones_like(out))  # compiles the forward and the backward
        del out
        row["compile_s"] = time.perf_counter() - t0
        row["measured_bytes"] = step_peak_bytes(fn, model, x)
        plans = remat.compiled_plans(fn)
        row["graphs"] = len(plans)
        row["predicted_bytes"] = sum(p.predicted_peak_bytes for p in plans)
        row["eager_peak_bytes"] = sum(p.eager_peak_bytes for p in plans)
        row["saved_bytes"] = sum(p.saved_bytes for p in plans)
        row["fallback"] = [p.fallback for p in plans if p.fallback]
        row["error"] = (row["predicted_bytes"] - row["measured_bytes"]) / max(row["measured_bytes"], 1)
        row["status"] = "ok"
    except remat.InfeasibleBudgetError as e:
        row["status"], row["message"] = "infeasible", str(e)
    except Exception as e:  # keep going: the table shows the failure
        row["status"], row["message"] = "failed", f"{type(e).__name__}: {e}"[:1000]
        row["traceback"] = traceback.format_exc()[-3000:]
    finally:
        del fn, model
        gc.collect()
        if x.device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def table(rows: list[dict]) -> str:
    lines = ["| workload | backend | budget | predicted MiB | measured MiB | error | eager peak MiB |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        b = "default" if r["budget"] is None else f"{r['budget']:.0%}"
        if r["status"] != "ok":
            lines.append(f"| {r['workload']} | {r['backend']} | {b} | {r['status']}: {r['message'][:100]} |||")
            continue
        lines.append(f"| {r['workload']} | {r['backend']} | {b} | {r['predicted_bytes'] / 2**20:.2f} | "
                     f"{r['measured_bytes'] / 2**20:.2f} | {r['error']:+.1%} | {r['eager_peak_bytes'] / 2**20:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(workloads.WORKLOADS))
    parser.add_argument("--size", default="full", choices=sorted({s for v in workloads.SIZES.values() for s in v}))
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backends", nargs="+", default=["inductor", "eager"],
                        help="eager runs the default plan only, as a check of the measurement")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device; pass --device cpu (with --size small for a quick check)")
    os.makedirs(args.out, exist_ok=True)
    meta = {"torch": torch.__version__, "device": args.device, "size": args.size, "dtype": args.dtype,
            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    rows: list[dict] = []
    for name in args.workloads:
        base, x = workloads.build(name, args.size, dtype=DTYPES[args.dtype], device=args.device)
        for backend in args.backends:
            for budget in BUDGETS if backend == "inductor" else (None,):
                rows.append(check(name, base, x, backend, budget))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
                with open(os.path.join(args.out, "peak_check.json"), "w") as f:
                    json.dump({**meta, "rows": rows}, f, indent=2)
        del base, x
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
