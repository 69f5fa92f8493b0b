"""The regime of each model's training step (``remat.regime``): time in compute kernels (with
achieved TFLOP/s), in bandwidth-bound kernels and in overhead, for torch.compile and remat, each
model's strategies alive in one process.

    python benchmarks/regime.py --models gpt2 resnet50 --out out/          # H200, bf16
    python benchmarks/regime.py --tiny --models gpt2 --out /tmp/regime     # CPU smoke run

Writes ``regime-<device>.json`` and ``.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import remat  # noqa: E402
import zoo  # noqa: E402

STRATEGIES = ("compile", "remat", "remat untuned")


class _Step(nn.Module):
    """One workload's loss under a strategy as a module without inputs (its parameters are the
    model's, so regime finds the device and restores the model)."""

    def __init__(self, fn, model: nn.Module, wl: zoo.Workload):
        super().__init__()
        self.model, self.wl = model, wl
        self.__dict__["fn"] = fn

    def forward(self) -> torch.Tensor:
        return self.wl.loss(self.fn, self.wl.inputs)


def make(name: str, model: nn.Module):
    if name == "compile":
        return torch.compile(model)
    if name == "remat":
        return remat.checkpoint(model)
    if name == "remat untuned":
        return remat.checkpoint(model, tune=False)
    raise SystemExit(f"unknown strategy {name!r}; expected some of {STRATEGIES}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2"], choices=zoo.SUITE)
    parser.add_argument("--strategies", nargs="+", default=["compile", "remat"], choices=STRATEGIES)
    parser.add_argument("--tiny", action="store_true", help="tiny configs on the CPU in fp32")
    parser.add_argument("--warmup", type=int, default=15, help="steps before the profiled one (tuning included)")
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    results: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                     "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "models": {}}
    lines = ["| model | strategy | step ms | compute | bandwidth | overhead | TFLOP/s | regime |",
             "|---|---|---|---|---|---|---|---|"]
    for name in args.models:
        wl = zoo.build(name, tiny=args.tiny, device=device, dtype=dtype)
        rows = {}
        for strategy in args.strategies:
            import copy

            model = copy.deepcopy(wl.model)
            r = remat.regime(_Step(make(strategy, model), model, wl), loss_fn=lambda out: out, warmup=args.warmup)
            rows[strategy] = dataclasses.asdict(r)
            tf = f"{r.achieved_flops / 1e12:.0f}" if r.achieved_flops else "-"
            lines.append(f"| {name} | {strategy} | {r.step_seconds * 1e3:.2f} | {r.compute_fraction:.0%} | "
                         f"{r.bandwidth_fraction:.0%} | {r.overhead_fraction:.0%} | {tf} | {r.dominant} |")
            print(lines[-1], flush=True)
            del model
        results["models"][name] = rows
    os.makedirs(args.out, exist_ok=True)
    tag = "cpu" if device == "cpu" else "h200"
    with open(os.path.join(args.out, f"regime-{tag}.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, f"regime-{tag}.md"), "w") as f:
        f.write(f"{results['device']}, torch {results['torch']}, {results['date']}\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
