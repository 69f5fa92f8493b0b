"""Peak activation memory of one training step of a workload under remat, for several
lowering settings (a diagnostic for where a plan's predicted bytes and the measured peak part).

    python benchmarks/peak_probe.py --workload pointwise
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import pathlib
import sys

import torch
from bench import step_peak_bytes  # this folder's benchmark script (run from benchmarks/ or the repo root)

import remat

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: `zoo`
from zoo import workloads  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="pointwise")
    args = parser.parse_args(argv)
    base, x = workloads.build(args.workload, "full", dtype=torch.bfloat16, device="cuda")
    import torch._inductor.config as ic

    settings = {
        "remat eager backend": ("eager", contextlib.nullcontext),
        "remat inductor": ("inductor", contextlib.nullcontext),
        "remat inductor, no locality reorder": ("inductor", lambda: ic.patch(reorder_for_locality=False)),
    }
    for name, (backend, ctx) in settings.items():
        torch._dynamo.reset()
        model = copy.deepcopy(base)
        with ctx():
            fn = remat.checkpoint(model, backend=backend)
            peaks = [step_peak_bytes(fn, model, x) / 2**20 for _ in range(3)]
        plan = remat.compiled_plans(fn)[0]
        print(f"{name}: peak {peaks[-1]:.0f} MiB (plan saves {plan.saved_bytes / 2**20:.0f} MiB)", flush=True)


if __name__ == "__main__":
    main()
