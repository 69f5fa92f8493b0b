"""Step time of ``remat.checkpoint(model, backend="eager")`` against the plain model (CPU).

    python benchmarks/eager_overhead.py [--threads 1] [--steps 40] [--out out/]

Three small models a new user tries first (issue 15): a ``nn.TransformerEncoder`` with dropout,
a CNN with BatchNorm, ``ReLU(inplace=True)`` and ``MaxPool2d``, and an MLP with GELU. One step
is forward, ``y.float().square().mean()``, backward, with gradients set to None first; the
number is the fastest of ``--steps`` steps after 3 warm-up steps, the two models' steps
alternating (the machine may be shared: both see the same load, and the minimum is the least
disturbed). Writes ``eager-overhead-cpu.json`` with ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import torch
import torch.nn as nn

import remat


def models() -> list[tuple[str, nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True)
    cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    mlp = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
    return [("transformer", nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(8, 32, 64)),
            ("cnn", cnn, torch.randn(16, 3, 32, 32)), ("mlp", mlp, torch.randn(64, 256))]


def step(model: nn.Module, x: torch.Tensor) -> None:
    for p in model.parameters():
        p.grad = None
    model(x).float().square().mean().backward()


def fastest_ms(models: list[nn.Module], x: torch.Tensor, steps: int) -> list[float]:
    """The fastest step of each model; their steps alternate, so that both see the same load."""
    for _ in range(3):
        for model in models:
            step(model, x)
    best = [float("inf")] * len(models)
    for _ in range(steps):
        for k, model in enumerate(models):
            t = time.perf_counter()
            step(model, x)
            best[k] = min(best[k], time.perf_counter() - t)
    return [b * 1e3 for b in best]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for name, model, x in models():
        eager, wrapped = fastest_ms([model, remat.checkpoint(copy.deepcopy(model), backend="eager")], x, args.steps)
        rows.append({"model": name, "eager_ms": eager, "remat_eager_ms": wrapped})
        print(f"{name}: eager {eager:.2f} ms, remat backend='eager' {wrapped:.2f} ms ({wrapped / eager:.2f}x)",
              flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        doc = {"torch": torch.__version__, "device": "cpu", "threads": args.threads, "steps": args.steps,
               "load_average": list(os.getloadavg()), "rows": rows}
        with open(os.path.join(args.out, "eager-overhead-cpu.json"), "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
