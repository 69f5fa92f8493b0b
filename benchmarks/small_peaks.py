"""Predicted against measured peak on CPU for the small real-model families of
``zoo/small.py`` (tiny HF GPT-2 and Llama, hand-built ViT and ResNet bottlenecks):
eager autograd's measured and predicted peak (``Plan.eager_peak_bytes``), and remat's measured
peak against ``Plan.predicted_peak_bytes`` (the peak read from Inductor's memory plan under the
Inductor backend, the op-by-op simulation under the uncompiled one) and the simulator's
(``Plan.simulated_peak_bytes``). Peaks from the CPU profiler's allocation trace
(``remat.compat.measure_cpu_peak_bytes``); several graphs are composed as ``Plan.combine`` does.

    PYTHONPATH=$PWD python benchmarks/small_peaks.py --backends inductor eager --budgets none 0.5 --out out/
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import warnings

import torch

import remat
from remat.plan import Plan
from zoo import small as small_models

MiB = 2**20


def row(name: str, backend: str, budget: float | None) -> dict:
    torch._dynamo.reset()  # each row compiles afresh
    model, loss = small_models.MODELS[name]()
    out = {"model": name, "backend": backend, "budget": budget,
           "eager_measured": small_models.measured_peak(model, model, loss)}
    rm = remat.checkpoint(copy.deepcopy(model), backend=backend, budget=budget)
    try:
        out["measured"] = small_models.measured_peak(rm, rm, loss)
    except remat.InfeasibleBudgetError as e:
        return {**out, "infeasible": str(e)[:160]}
    plan = Plan.combine(remat.compiled_plans(rm))
    return {**out, "graphs": plan.graphs, "eager_predicted": plan.eager_peak_bytes,
            "predicted": plan.predicted_peak_bytes, "simulated": plan.simulated_peak_bytes,
            "peak_model": plan.peak_model, "budget_bytes": plan.budget_bytes}


def markdown(rows: list[dict]) -> str:
    def vs(p: int | None, m: int) -> str:
        return f"{p / MiB:.2f} ({p / m - 1:+.1%})" if p else "-"

    lines = ["| model | backend | budget | measured MiB | predicted MiB | simulator MiB | model | eager measured MiB "
             "| eager predicted MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['model']} | {r['backend']} | {r['budget'] or '-'} |"
        if "infeasible" in r:
            lines.append(f"{head} infeasible |||| | {r['eager_measured'] / MiB:.2f} | |")
            continue
        lines.append(f"{head} {r['measured'] / MiB:.2f} | {vs(r['predicted'], r['measured'])} | "
                     f"{vs(r['simulated'], r['measured'])} | {r['peak_model']} | {r['eager_measured'] / MiB:.2f} | "
                     f"{vs(r['eager_predicted'], r['eager_measured'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(small_models.MODELS), choices=small_models.MODELS)
    parser.add_argument("--backends", nargs="+", default=["inductor", "eager"], choices=["inductor", "eager"])
    parser.add_argument("--budgets", nargs="+", default=["none"], help="fractions, or none")
    parser.add_argument("--out", default="out")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = [row(m, b, None if f == "none" else float(f))
            for b in args.backends for f in args.budgets for m in args.models]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "small-peaks.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(markdown(rows))


if __name__ == "__main__":
    main()
