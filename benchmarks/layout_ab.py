"""One model under one budget with and without the recomputed-layout pass (Note [Recomputed values
in the forward's layout] in ``remat.backends.inductor.hooks``), torch.compile as the denominator:
all three compiled in one process, each step's peak measured as ``real_models.py`` does, then timed
round-robin.

    python benchmarks/layout_ab.py --model resnet50 --budget 0.5 --out $OUT   # a GPU

Writes ``layout-ab-<model>.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # real_models
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # remat, zoo
import real_models as rm  # noqa: E402

import remat  # noqa: E402
import remat.backends.inductor.backend as inductor_backend  # noqa: E402
import zoo  # noqa: E402
from remat.backends.inductor import hooks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50", choices=zoo.SUITE)
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    device = torch.device("cuda")
    wl = zoo.build(a.model, tiny=False, device=device, dtype=torch.bfloat16)
    kept, rows = {}, {}
    for name in ("compile", "pass on", "pass off"):
        t0 = time.perf_counter()
        inductor_backend.recomputed_in_forward_layout = ((lambda bw: 0) if name == "pass off"
                                                         else hooks.recomputed_in_forward_layout)
        model = copy.deepcopy(wl.model)
        fn = torch.compile(model) if name == "compile" else remat.checkpoint(model, budget=a.budget)
        rm.step(fn, model, wl)
        if name != "compile":
            rm.finish_tuning(fn, model, wl, device)
        for _ in range(3):
            rm.step(fn, model, wl)
        row = {"peak_mib": rm.step_peak_bytes(fn, model, wl) / 2**20, "compile_s": time.perf_counter() - t0}
        if name != "compile":
            row.update(rm.plan_fields(fn))
        rows[name], kept[name] = {"strategy": name, "ms": None, **row}, (fn, model)
    rm.interleave(kept, list(rows.values()), wl, device, a.rounds)
    for n in kept:
        rows[n]["x_compile"] = rows[n]["ms"] / rows["compile"]["ms"]
        print(f"{n}: {rows[n]['ms']:.2f} ms ({rows[n]['x_compile']:.3f}x compile), peak {rows[n]['peak_mib']:.0f} MiB, "
              f"simulated {rows[n].get('simulated_peak_mib', 0):.0f}, read {rows[n].get('read_peak_mib', 0):.0f}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"layout-ab-{a.model}.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": a.model,
                   "budget": a.budget, "rounds": a.rounds, "rows": rows}, f, default=str, indent=1)


if __name__ == "__main__":
    main()
