"""Where a step's time goes outside GPU kernels: one torch.profiler trace (CPU and CUDA) of a few
training steps of torchvision ResNet-50 (bf16, batch 128) under torch.compile and under remat, with
the top CPU ops by self time, GPU busy time and the step's wall time.

    python benchmarks/overhead_probe.py --out out/   # GPU; ~3 minutes on an H200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

import remat


def build(device: str, tiny: bool):
    import torchvision

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = (torchvision.models.resnet18(weights=None, num_classes=10) if tiny else
             torchvision.models.resnet50(weights=None)).to(device).to(dtype)
    batch, side = (4, 32) if tiny else (128, 224)
    x = torch.randn(batch, 3, side, side, device=device, dtype=next(model.parameters()).dtype)
    y = torch.randint(0, 10 if tiny else 1000, (batch,), device=device)
    return model.train(), x, y


def run(name: str, fn, model, x, y, device: str, steps: int) -> dict:
    def step():
        for p in model.parameters():
            p.grad = None
        F.cross_entropy(fn(x).float(), y).backward()

    t0 = time.perf_counter()
    step()
    if device == "cuda":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(3):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
    events = prof.key_averages()
    cpu_top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
    gpu_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in events) / 3
    return {
        "strategy": name, "compile_s": round(compile_s, 1), "step_ms_median": round(statistics.median(times), 2),
        "gpu_busy_ms_per_step": round(gpu_us / 1e3, 2),
        "cpu_top": [{"name": e.key, "calls": e.count // 3,
                     "self_cpu_ms_per_step": round(e.self_cpu_time_total / 3e3, 3)} for e in cpu_top],
        "table": events.table(sort_by="self_cpu_time_total", row_limit=30),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    device = "cpu" if args.tiny else "cuda"
    os.makedirs(args.out, exist_ok=True)
    results = []
    for name in ("compile", "remat"):
        torch._dynamo.reset()
        model, x, y = build(device, args.tiny)
        fn = torch.compile(model) if name == "compile" else remat.checkpoint(model)
        r = run(name, fn, model, x, y, device, args.steps)
        print(f"== {name}: step {r['step_ms_median']} ms, GPU busy {r['gpu_busy_ms_per_step']} ms, "
              f"compile {r['compile_s']} s", flush=True)
        print(r.pop("table"), flush=True)
        results.append(r)
        del model, fn
        torch.cuda.empty_cache() if device == "cuda" else None
    with open(os.path.join(args.out, "overhead-probe.json"), "w") as f:
        json.dump({"torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
