"""What the first training step costs (CPU, Inductor): remat against torch.compile on the same model.

    python benchmarks/first_step.py [--models demo,mlp,pointwise] [--repeats 2]
        [--out benchmarks/results/cpu-torch<version>/first-step-cpu.json]

Each measurement is a fresh Python process with a new Inductor cache folder (no FX-graph,
kernel or in-memory code cache hit): the wall time of its first forward and backward, which
compiles them (remat also plans), after the model is built. The strategies alternate (compile,
remat, compile, remat, ...) so that machine noise falls on both; the JSON keeps every sample and
the medians. README's
"first step" line is rendered from it (``benchmarks/render.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import remat  # noqa: E402
from zoo import workloads  # noqa: E402


def _model(name: str):
    if name == "demo":  # examples/quickstart.py's model
        torch.manual_seed(0)
        return workloads.build("gpt", "small")
    return workloads.build(name, "small")


def _first_step(name: str, strategy: str) -> float:
    model, x = _model(name)
    torch._inductor.config.fx_graph_cache = False
    wrapped = torch.compile(model) if strategy == "torch.compile" else remat.checkpoint(model)
    t0 = time.perf_counter()
    workloads.loss(wrapped(x)).backward()
    return time.perf_counter() - t0


def _in_fresh_process(name: str, strategy: str) -> float:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, __file__, "--one", name, strategy], env=env, check=True,
                             capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,mlp,pointwise")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "STRATEGY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(_first_step(*args.one))
        return 0
    version = torch.__version__.split("+")[0]
    out = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / f"cpu-torch{version}" / "first-step-cpu.json")
    rows = []
    for name in args.models.split(","):
        samples: dict[str, list[float]] = {"torch.compile": [], "remat": []}
        for _ in range(args.repeats):
            for strategy in samples:
                samples[strategy].append(_in_fresh_process(name, strategy))
        med = {k: statistics.median(v) for k, v in samples.items()}
        rows.append({"model": name, "samples_s": samples, "median_s": med,
                     "ratio": med["remat"] / med["torch.compile"]})
        print(f"{name}: torch.compile {med['torch.compile']:.1f} s, remat {med['remat']:.1f} s "
              f"({rows[-1]['ratio']:.2f}x)", flush=True)
    command = "python benchmarks/first_step.py " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = {"torch": torch.__version__, "device": "cpu", "dtype": "float32", "device_name": "CPU",
           "threads": torch.get_num_threads(), "command": command.strip(), "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
