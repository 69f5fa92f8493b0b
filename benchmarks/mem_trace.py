"""Where does a compiled remat step's peak come from? Records every CUDA allocation of one step
and lists what is live at its peak, each block with the line of generated code that made it.

    TORCH_LOGS=output_code python benchmarks/mem_trace.py --workload gpt --budget 0.25 --out out/
    python benchmarks/mem_trace.py --model llama --budget 0.3 --out $OUT   # a suite model (zoo), bf16

For one workload and budget (``None``: the default plan) it compiles ``remat.checkpoint`` with
the Inductor backend, runs one step to compile, then records ``out = f(x); out.backward(g)``
with ``torch.cuda.memory._record_memory_history``. It replays the trace's allocations and frees,
and at the peak prints every live block: its size and the innermost frame of generated or user
code that allocated it (Inductor's wrapper code names the buffer there, ``buf12 = empty...``).
It also prints the plan's predicted peak and the model's kernel at its peak, so that the two
can be compared buffer by buffer. Writes ``trace-<workload>.txt`` and the Inductor output code
files the trace refers to (``code-<workload>.tar.gz``) under ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import io
import linecache
import os
import pathlib
import sys
import tarfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: `remat`, `zoo`
import remat  # noqa: E402
import zoo  # noqa: E402
from benchmarks.real_models import tuning_pending  # noqa: E402
from zoo import workloads  # noqa: E402


def _frame(frames: list[dict]) -> tuple[str, int, str]:
    """The innermost frame in generated code (torchinductor) or, failing that, outside torch."""
    inner = f" (innermost: {os.path.basename(frames[0]['filename'])}:{frames[0]['line']} {frames[0]['name']})" \
        if frames else ""
    for f in frames:
        if "torchinductor" in f["filename"] or "/tmp/" in f["filename"]:
            return f["filename"], f["line"], f["name"] + (inner if f is not frames[0] else "")
    for f in frames:
        if "/torch/" not in f["filename"]:
            return f["filename"], f["line"], f["name"]
    f = frames[0] if frames else {"filename": "?", "line": 0, "name": "?"}
    return f["filename"], f["line"], f["name"]


def peak_blocks(snapshot: dict) -> tuple[int, list[tuple[int, tuple[str, int, str]]], int]:
    """(peak bytes, live blocks at the peak, index of the peak event) of the recorded step."""
    live: dict[int, tuple[int, tuple[str, int, str]]] = {}
    total = peak = at = 0
    best: list = []
    events = snapshot["device_traces"][torch.cuda.current_device()]
    for k, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], _frame(e.get("frames", [])))
            total += e["size"]
            if total > peak:
                peak, at, best = total, k, list(live.values())
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    return peak, best, at


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--workload", choices=workloads.WORKLOADS)
    which.add_argument("--model", choices=zoo.SUITE, help="a suite model, its loss and inputs as real_models runs it")
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--size", default="full")
    parser.add_argument("--dropout", action="store_true", help="with --model: keep its dropout (default: off)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    a = parser.parse_args(argv)
    if a.model:
        wl = zoo.build(a.model, tiny=False, device="cuda", dtype=torch.bfloat16, no_dropout=not a.dropout)
        fn = remat.checkpoint(copy.deepcopy(wl.model), backend="inductor", budget=a.budget)

        def step() -> None:
            wl.loss(fn, wl.inputs).backward()
        name = a.model
    else:
        model, x = workloads.build(a.workload, a.size, dtype=torch.bfloat16, device="cuda")
        fn = remat.checkpoint(copy.deepcopy(model), backend="inductor", budget=a.budget)

        def step() -> None:
            out = fn(x)
            out.backward(torch.randn_like(out))
        name = a.workload
    def zero_grads() -> None:
        for p in fn.parameters():
            p.grad = None

    step()
    n = 0  # measured plans (remat.tuning) run their candidates on the first steps: record after them
    while n < 60 and tuning_pending(fn):
        zero_grads()
        step()
        n += 1
    print(f"{n} step(s) until every graph chose its plan")
    zero_grads()
    step()
    zero_grads()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, blocks, at = peak_blocks(snap)
    plans = remat.compiled_plans(fn)
    lines = [f"{name} budget={a.budget}: measured peak of the step {peak / 2**20:.1f} MiB (event {at}), "
             f"predicted {sum(p.predicted_peak_bytes for p in plans) / 2**20:.1f} MiB, "
             f"simulated {sum(p.simulated_peak_bytes for p in plans) / 2**20:.1f} MiB, "
             f"read {sum(p.compiled_peak_bytes for p in plans) / 2**20:.1f} MiB"]
    files = set()
    for size, (fname, line, func) in sorted(blocks, key=lambda b: -b[0])[:80]:  # the largest
        files.add(fname)
        src = linecache.getline(fname, line).strip()
        lines.append(f"{size / 2**20:10.2f} MiB  {os.path.basename(fname)}:{line} {func}: {src[:140]}")
    from remat.backends import cuda_scratch  # the measured library scratch (Note [Measured library scratch])

    scratch = sorted(cuda_scratch._CACHE.items(), key=lambda kv: -kv[1])[:16]
    lines.append("measured library scratch, largest first (op, argument shapes and strides):")
    lines += [f"{v / 2**20:10.2f} MiB  {k[0]} {[x[1][:2] if x[0] == 'tensor' else x[1] for x in k[1]]}"
              for k, v in scratch]
    text = "\n".join(lines)
    print(text)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"trace-{name}.txt"), "w") as f:
        f.write(text + "\n")
    with tarfile.open(os.path.join(a.out, f"code-{name}.tar.gz"), "w:gz") as tar:
        for fname in sorted(files):
            if os.path.isfile(fname) and "/torch/" not in fname:
                data = open(fname, "rb").read()
                info = tarfile.TarInfo(os.path.basename(fname))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main()
