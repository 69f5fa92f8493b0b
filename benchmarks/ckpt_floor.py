"""remat's smallest plan against per-block ``torch.utils.checkpoint`` on the CPU (issue 13).

For each family of ``zoo/families.py``: the measured peak of one training step with
each block checkpointed (eager), and remat's smallest plan (the frontier point with the lowest
predicted peak, uncompiled backend): its predicted peak and, trained with that peak as the
budget, its measured peak. Peaks are bytes allocated during the step (profiler allocation
timeline, ``remat.compat.measure_cpu_peak_bytes``), parameters and inputs excluded.

    PYTHONPATH=$PWD python benchmarks/ckpt_floor.py [--models gpt gpt2 ...] [--layers 4] [--out f.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
import torch.nn as nn

import remat
from remat import compat
from zoo import families

KiB = 1024


def step_peak(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    """Measured peak bytes of one step (after a first, warm-up step). Gradients are set to None
    before the measured step, outside it: storages freed while measuring that were allocated
    before would count against the step's own."""

    def zero() -> None:
        for p in model.parameters():
            p.grad = None
        for x in inputs:
            x.grad = None

    zero()
    model(*inputs).backward()
    zero()
    return compat.measure_cpu_peak_bytes(lambda: model(*inputs).backward())


def smallest(model: nn.Module, inputs: tuple[torch.Tensor, ...], backend: str = "eager"):
    """remat's frontier point with the smallest predicted peak (ties: least recompute)."""
    torch._dynamo.reset()
    frontier = remat.pareto(remat.checkpoint(copy.deepcopy(model), backend=backend), *inputs)
    return frontier, min(frontier.points, key=lambda p: (p.predicted_peak_bytes, p.recompute_seconds))


def row(name: str, layers: int, backend: str = "eager", dropout: float | None = None) -> dict:
    fam = families.build(name, layers, dropout=dropout)
    t0 = time.perf_counter()
    ckpt = step_peak(fam.checkpointed, fam.inputs)
    frontier, low = smallest(fam.model, fam.inputs, backend)
    torch._dynamo.reset()
    rm = remat.checkpoint(copy.deepcopy(fam.model), backend=backend, budget=low.predicted_peak_bytes)
    measured = step_peak(rm, fam.inputs)
    (plan,) = remat.compiled_plans(rm)
    return {"model": name, "ckpt_measured": ckpt, "remat_predicted": low.predicted_peak_bytes,
            "remat_measured": measured, "default_predicted": frontier.default.predicted_peak_bytes,
            "eager_predicted": frontier.eager_peak_bytes, "floor": frontier.peak_floor_bytes,
            "checkpoints": len(plan.checkpoints), "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(families.FAMILIES), choices=families.FAMILIES)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--dropout", type=float, help="GPT-2's dropout probabilities (default: 0.1, the model's)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    print(f"{'model':8} {'ckpt meas':>10} {'remat pred':>10} {'remat meas':>10} {'default':>9} "
          f"{'floor':>8} {'ratio':>6}  (KiB)")
    for name in args.models:
        r = row(name, args.layers, args.backend, args.dropout)
        rows.append(r)
        print(f"{name:8} {r['ckpt_measured'] // KiB:>10} {r['remat_predicted'] // KiB:>10} "
              f"{r['remat_measured'] // KiB:>10} {r['default_predicted'] // KiB:>9} {r['floor'] // KiB:>8} "
              f"{r['remat_measured'] / r['ckpt_measured']:>6.3f}  {r['seconds']}s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "layers": args.layers, "dropout": args.dropout, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
