"""What remat's plan for one zoo model keeps, without compiling it: ``remat.explain`` on the
model's training loss (dropout as the zoo builds it) at each budget, and for each plan the
predicted peak, the floor, the saved bytes grouped by the op that made them, and the count of
the captured graph's ops of interest (attention, dropout, random ops). A diagnostic for the
smallest plan of a model with random ops (issue 27's GPT-2 at compile + checkpointing's peak).
The step is captured as a module returning the loss alone: outputs a training call also returns
and drops (an HF model's logits, whose zero gradients autograd materializes) are not in it, so
its plans can predict less than training's (``peak_diff.py`` compiles the step as trained).

    PYTHONPATH=$PWD python benchmarks/plan_probe.py --model gpt2 --tiny --device cpu
    PYTHONPATH=$PWD python benchmarks/plan_probe.py --model gpt2 --budgets none 3.6GiB --out $OUT
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: `zoo`, `remat`
import peak_diff  # noqa: E402

import remat  # noqa: E402
import zoo  # noqa: E402

MiB = 2**20
INTEREST = ("attention", "dropout", "rand", "bernoulli", "philox", "seed")


class Loss(torch.nn.Module):
    """The workload's loss as a module, so ``explain`` captures the step as training runs it."""

    def __init__(self, wl: zoo.Workload) -> None:
        super().__init__()
        self.model, self.wl = wl.model, wl

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.wl.loss(self.model, inputs)


def describe(plan: remat.Plan, top: int) -> dict:
    d = plan.to_dict(nodes=True)
    by_op: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for s in d["saved"]:
        if s["bytes"]:
            by_op[s["op"]][0] += 1
            by_op[s["op"]][1] += s["bytes"]
    ops = collections.Counter(n["op"] for n in d["nodes"])
    return {
        "predicted_peak_mib": plan.predicted_peak_bytes / MiB,
        "eager_peak_mib": plan.eager_peak_bytes / MiB,
        "floor_mib": plan.peak_floor_bytes / MiB,
        "saved_mib": plan.saved_bytes / MiB,
        "notes": d["notes"],
        "saved_by_op": sorted(([op, n, b / MiB] for op, (n, b) in by_op.items()), key=lambda r: -r[2])[:top],
        "ops_of_interest": {op: n for op, n in ops.items() if any(w in op.lower() for w in INTEREST)},
        "largest_saved": sorted(([s["name"], s["op"], s["shape"], s["dtype"], s["bytes"] / MiB, s["reason"]]
                                 for s in d["saved"]), key=lambda r: -r[4])[:top],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=zoo.SUITE, default="gpt2")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--budgets", nargs="+", default=["none"], help="none, a fraction, or bytes ('3.6GiB')")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", default=None)
    a = parser.parse_args(argv)
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    wl = zoo.build(a.model, tiny=a.tiny, device=a.device, dtype=dtype)
    found = {"model": a.model, "tiny": a.tiny, "device": a.device, "torch": torch.__version__, "plans": {}}
    for b in a.budgets:
        budget = peak_diff.budget_arg(b)
        try:
            plan = remat.explain(Loss(wl), budget=budget, **wl.inputs)
            found["plans"][b] = describe(plan, a.top)
        except remat.RematError as e:
            found["plans"][b] = {"error": str(e)}
    text = json.dumps(found, indent=1)
    for b, d in found["plans"].items():
        print(b, json.dumps(d))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"plan-probe-{a.model}.json"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
