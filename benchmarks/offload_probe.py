"""What the offload model assumes against what runs (issue 28): the measured host link, the
step timeline's estimated forward and backward seconds against the measured ones, and each
offloaded value's estimated copies, for one model under ``offload="auto"`` on the uncompiled
backend. One CUDA device.

    python benchmarks/offload_probe.py --model llama --out out/
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import remat  # noqa: E402
import zoo  # noqa: E402
from remat.planning.offload import host_link  # noqa: E402


def _copy(o) -> tuple:
    """An offloaded value: name, bytes, copy out and copy back (start, end) in ms."""
    return (o.name, o.nbytes, *(1e3 * t for t in o.copy_out), *(1e3 * t for t in o.copy_in))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama")
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--out", default="out")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    link = host_link(torch.device("cuda"))
    wl = zoo.build(args.model, tiny=False, device="cuda", dtype=torch.bfloat16, no_dropout=True)
    rows = {"link_gbps": [link.d2h / 1e9, link.h2d / 1e9], "issue_us": link.issue_seconds * 1e6}
    for mode in (False, args.mode):
        torch._dynamo.reset()
        m = remat.checkpoint(wl.model, backend="eager", tune=False, offload=mode)
        times = []
        for _ in range(4):
            for p in m.parameters():
                p.grad = None
            a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            a.record()
            loss = wl.loss(m, wl.inputs)
            b.record()
            loss.backward()
            c.record()
            torch.cuda.synchronize()
            times.append((a.elapsed_time(b), b.elapsed_time(c)))
        plans = remat.compiled_plans(m)
        row = {"fwd_bwd_ms": times[1:], "graphs": len(plans)}
        for k, p in enumerate(plans):
            row[f"g{k}"] = {"offloaded": len(p.offloaded), "host_mib": p.host_bytes / 2**20,
                            "stall_ms": p.offload_stall_seconds * 1e3, "predicted_mib": p.predicted_peak_bytes / 2**20,
                            "copies": [_copy(o) for o in p.offloaded[:12]],
                            "last_copy": [_copy(o) for o in p.offloaded[-4:]],
                            "notes": [n for n in p.notes if "offload" in n]}
        rows[str(mode)] = row
    (out / f"offload-probe-{args.model}.json").write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1)[:6000])


if __name__ == "__main__":
    main()
