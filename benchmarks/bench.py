"""Side-by-side step time and peak activation memory: eager, eager + checkpoint per block,
torch.compile (default, budget 0.5, + checkpoint per block) and remat, on the reference
workloads (``zoo/workloads.py``), in one process per call.

    python benchmarks/bench.py --workloads pointwise mlp gpt --size full --out out/

Writes ``results.json``, ``results.md`` (a table) and ``results.png`` (memory against time) to
``--out``. Each variant's gradients are compared with eager's (relative L2 error over all
parameter and input grads). On CPU (``--size small``) it runs the same code for a smoke test.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.utils.checkpoint as tuc

import remat

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: `zoo`
from zoo import workloads  # noqa: E402

VARIANTS = ("eager", "eager+ckpt", "compile", "compile budget 0.5", "compile+ckpt", "remat", "remat budget 100%",
            "remat budget 75%", "remat budget 50%", "remat budget 25%", "remat @ ckpt peak",
            "remat eager-backend")


class CheckpointEach(nn.Module):
    """Run each block under torch.utils.checkpoint (non-reentrant). Shares the blocks."""

    def __init__(self, seq: nn.Sequential):
        super().__init__()
        self.blocks = seq

    def forward(self, x):
        for block in self.blocks:
            x = tuc.checkpoint(block, x, use_reentrant=False)
        return x


def make_variant(name: str, model: nn.Module, ckpt_peak: int | None = None) -> tuple[Callable, Callable | None]:
    """(callable, context factory for its first calls) for a variant. Remat budgets in % are
    fractions of remat's predicted eager peak; "@ ckpt peak" is eager + checkpoint's measured
    peak in this run."""
    if name == "eager":
        return model, None
    if name == "eager+ckpt":
        return CheckpointEach(model), None
    if name == "compile":
        return torch.compile(model), None
    if name == "compile budget 0.5":
        return torch.compile(model), lambda: torch._functorch.config.patch(activation_memory_budget=0.5)
    if name == "compile+ckpt":
        return torch.compile(CheckpointEach(model)), None
    if name == "remat":
        return remat.checkpoint(model), None
    if name == "remat eager-backend":
        return remat.checkpoint(model, backend="eager"), None
    if name.startswith("remat budget "):
        return remat.checkpoint(model, budget=int(name.split()[-1].rstrip("%")) / 100), None
    if name == "remat @ ckpt peak":
        if not ckpt_peak:
            raise RuntimeError("needs the eager+ckpt row measured first (on a GPU)")
        return remat.checkpoint(model, budget=int(ckpt_peak)), None
    raise ValueError(name)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def step(fn, model, x):
    for p in model.parameters():
        p.grad = None
    x.grad = None
    workloads.loss(fn(x)).backward()


def step_peak_bytes(fn, model, x) -> int:
    """Peak CUDA bytes allocated during one step (gradients reset first), minus those held before."""
    for p in model.parameters():
        p.grad = None
    x.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step(fn, model, x)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def grads(model, x):
    return [x.grad.float()] + [p.grad.float() for p in model.parameters()]


def rel_error(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = math.sqrt(sum(float((u - v).square().sum()) for u, v in zip(a, b)))
    den = math.sqrt(sum(float(v.square().sum()) for v in b))
    return num / max(den, 1e-30)


def projected_grads(fn, model, x, r):
    """Gradients of the well-conditioned loss (y * r).sum() for a fixed random r."""
    for p in model.parameters():
        p.grad = None
    x.grad = None
    (fn(x).float() * r).sum().backward()
    return grads(model, x)


def peak_of_backward_step(fn, x) -> int:
    """Peak bytes of out = fn(x); out.backward(g) with g allocated after the forward: the step
    remat's peak prediction describes (no loss computation)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(x)
    out.backward(torch.randn_like(out))
    del out
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def measure(name, base, x, device, warmup, iters, ref_grads, ckpt_peak=None, r=None):
    model = copy.deepcopy(base)
    fn, ctx = make_variant(name, model, ckpt_peak)
    t0 = time.perf_counter()
    if ctx is not None:
        with ctx():
            step(fn, model, x)
    else:
        step(fn, model, x)
    sync(device)
    compile_s = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step(fn, model, x)
    sync(device)
    proj = projected_grads(fn, model, x, r)
    err = rel_error(proj, ref_grads) if ref_grads is not None else 0.0
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(fn, model, x)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            step(fn, model, x)
            times.append((time.perf_counter() - t) * 1e3)
    peak = step_peak_bytes(fn, model, x) if device.type == "cuda" else 0
    row = {"variant": name, "ms": statistics.median(times), "peak_mib": peak / 2**20,
           "compile_s": compile_s, "grad_rel_err": err}
    if name.startswith("remat"):
        plans = remat.compiled_plans(fn)
        row["plan_saved_mib"] = sum(p.saved_bytes for p in plans) / 2**20
        row["plan_eager_saved_mib"] = sum(p.eager_saved_bytes for p in plans) / 2**20
        row["fallback"] = [p.fallback for p in plans if p.fallback]
        row["graphs_planned"] = len(plans)
        row["predicted_peak_mib"] = sum(p.predicted_peak_bytes for p in plans) / 2**20
        if device.type == "cuda":
            for p in model.parameters():
                p.grad = None
            x.grad = None
            row["measured_step_peak_mib"] = peak_of_backward_step(fn, x) / 2**20
    del model, fn
    return row, proj


def roofline(device) -> dict:
    if device.type != "cuda":
        return {}
    a = torch.empty(2**30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    bw = 2 * a.numel() * 10 / (time.perf_counter() - t)
    del a, b
    m = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        m @ m
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        m @ m
    torch.cuda.synchronize()
    flops = 2 * 8192**3 * 10 / (time.perf_counter() - t)
    return {"copy_bytes_per_s": bw, "bf16_flops_per_s": flops}


def floor_ms(name: str, size: str, roof: dict, itemsize: int) -> float | None:
    """A lower bound on step time: matmul FLOPs (forward + 2x backward; flash attention's
    backward 2.5x its forward) at the measured bf16 rate, or, for the pointwise workload, each
    layer reading its input and writing its output once forward and three times backward, at the
    measured copy bandwidth."""
    if not roof:
        return None
    s = workloads.SIZES[name][size]
    if name == "pointwise":
        return 5 * s["layers"] * s["n"] * s["d"] * itemsize / roof["copy_bytes_per_s"] * 1e3
    if name == "mlp":
        flops = 3 * s["blocks"] * 2 * 2 * s["n"] * s["d"] * s["hidden"]
    else:
        tokens, d = s["batch"] * s["seq"], s["d"]
        dense = 3 * s["blocks"] * 2 * tokens * (3 * d * d + d * d + 2 * d * s["hidden"])
        attn = 3.5 * s["blocks"] * 2 * 2 * s["batch"] * s["seq"] ** 2 * d / 2
        flops = dense + attn
    return flops / roof["bf16_flops_per_s"] * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(workloads.WORKLOADS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--size", default="full", choices=["full", "small"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default="out")
    args = parser.parse_args(argv)
    from tqdm import tqdm

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    os.makedirs(args.out, exist_ok=True)
    roof = roofline(device)
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "dtype": str(dtype), "size": args.size,
               "roofline": roof, "workloads": {}}
    bar = tqdm(total=len(args.workloads) * len(args.variants), desc="bench")
    for wl in args.workloads:
        base, x = workloads.build(wl, args.size, dtype=dtype, device=device)
        rows, ref, ckpt_peak = [], None, None
        r = torch.randn(x.shape, device=device, generator=torch.Generator(device).manual_seed(1))
        for name in args.variants:
            bar.set_postfix_str(f"{wl}: {name}")
            try:
                row, g = measure(name, base, x, device, args.warmup, args.iters, ref, ckpt_peak, r)
                if name == "eager":
                    ref = g
                if name == "eager+ckpt":
                    ckpt_peak = row["peak_mib"] * 2**20
            except Exception as e:  # keep going; the table shows the failure
                row = {"variant": name, "error": f"{type(e).__name__}: {e}"[:500]}
            rows.append(row)
            bar.update(1)
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        fl = floor_ms(wl, args.size, roof, torch.finfo(dtype).bits // 8)
        for row in rows:
            if fl and "ms" in row:
                row["x_floor"] = row["ms"] / fl
        results["workloads"][wl] = {"floor_ms": fl, "rows": rows}
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=2)
    bar.close()
    table = markdown(results)
    print(table)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n")
    plot(results, os.path.join(args.out, "results.png"))


def markdown(results: dict) -> str:
    lines = [f"device: {results['device']}, torch {results['torch']}, {results['dtype']}, size {results['size']}",
             "", "| workload | variant | ms | peak act. MiB | x compile time | x compile mem | compile s | "
             "x floor | grad rel err | plan saved MiB | predicted / measured step peak MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for wl, data in results["workloads"].items():
        comp = next((r for r in data["rows"] if r["variant"] == "compile" and "ms" in r), None)
        for r in data["rows"]:
            if "error" in r:
                lines.append(f"| {wl} | {r['variant']} | error: {r['error'][:120]} |||||||||")
                continue
            rt = f"{r['ms'] / comp['ms']:.3f}" if comp else "-"
            rm = f"{r['peak_mib'] / comp['peak_mib']:.3f}" if comp and comp["peak_mib"] else "-"
            xf = f"{r['x_floor']:.2f}" if "x_floor" in r else "-"
            ps = f"{r['plan_saved_mib']:.0f}" if "plan_saved_mib" in r else ""
            pm = (f"{r['predicted_peak_mib']:.0f} / {r['measured_step_peak_mib']:.0f}"
                  if "measured_step_peak_mib" in r else "")
            lines.append(f"| {wl} | {r['variant']} | {r['ms']:.2f} | {r['peak_mib']:.0f} | {rt} | {rm} | "
                         f"{r['compile_s']:.1f} | {xf} | {r['grad_rel_err']:.1e} | {ps} | {pm} |")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(results["workloads"])
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, wl in zip(axes[0], names):
        for r in results["workloads"][wl]["rows"]:
            if "ms" in r:
                ax.scatter(r["ms"], r["peak_mib"])
                ax.annotate(r["variant"], (r["ms"], r["peak_mib"]), fontsize=7)
        ax.set_title(wl)
        ax.set_xlabel("median step time (ms)")
        ax.set_ylabel("peak activation memory (MiB)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
