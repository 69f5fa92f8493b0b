"""Where an offload plan's step spends its time: one suite model under a budget in bytes, with
``offload="auto"`` and without, each step profiled with ``torch.profiler`` after warm-up; prints
(and writes to ``--out``) each run's step time and its top CUDA kernels and CPU-side calls by
total time, with the counts of the calls offload adds (stream waits, event records, host copies,
pinned allocations). Issue 28: HF GPT-2 at 0.8x compile+ckpt's peak ran 1.61x its time with 83
small copies each way that the step timeline had estimated hidden.

    python benchmarks/offload_profile.py --model gpt2 --budget 1519MiB --dropout --out out/
"""

from __future__ import annotations

import argparse
import copy
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import remat  # noqa: E402
import zoo  # noqa: E402

WATCH = ("cudaStreamWaitEvent", "cudaEventRecord", "cudaMemcpyAsync", "cudaHostAlloc", "cudaFreeHost",
         "cudaStreamSynchronize", "cudaEventSynchronize", "Memcpy DtoH", "Memcpy HtoD")


def profile(model: str, budget: str, offload: str | bool, dropout: bool, steps: int) -> str:
    wl = zoo.build(model, tiny=False, device="cuda", dtype=torch.bfloat16, no_dropout=not dropout)
    fn = remat.checkpoint(copy.deepcopy(wl.model), budget=budget, offload=offload)

    def step() -> None:
        wl.loss(fn, wl.inputs).backward()
        for p in fn.parameters():
            p.grad = None

    for _ in range(8):  # compile, tuning steps, warm-up
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    plans = remat.compiled_plans(fn)
    head = (f"{model} budget={budget} offload={offload}: {ms:.2f} ms a step ({steps} steps), "
            f"{sum(len(p.offloaded) for p in plans)} offloaded, peak predicted "
            f"{sum(p.predicted_peak_bytes for p in plans) / 2**20:.0f} MiB")
    watch = [f"  {e.key}: {e.count} calls, CPU {e.cpu_time_total / 1e3:.2f} ms, device "
             f"{getattr(e, 'device_time_total', getattr(e, 'cuda_time_total', 0)) / 1e3:.2f} ms"
             for e in events if any(w in e.key for w in WATCH)]
    table = events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)
    gpu = events.table(sort_by="self_device_time_total" if hasattr(events[0], "self_device_time_total")
                       else "self_cuda_time_total", row_limit=15, max_name_column_width=60)
    return "\n".join([head, *watch, table, gpu])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2", choices=zoo.SUITE)
    ap.add_argument("--budget", default="1519MiB", help="the offload plan's budget")
    ap.add_argument("--reference-budget", default="1900MiB", help="a budget a plan without offload fits")
    ap.add_argument("--dropout", action="store_true", help="keep the model's dropout (default: off)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args(argv)
    texts = []
    for budget, offload in ((a.budget, "auto"), (a.reference_budget, False)):
        try:
            texts.append(profile(a.model, budget, offload, a.dropout, a.steps))
        except remat.RematError as e:
            texts.append(f"{a.model} budget={budget} offload={offload}: {e}")
        print(texts[-1], flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"offload-profile-{a.model}.txt"), "w") as f:
        f.write("\n\n".join(texts) + "\n")


if __name__ == "__main__":
    main()
