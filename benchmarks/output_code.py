"""One step of a real model under torch.compile or remat's default plan, with Inductor's debug
trace on, so that the generated code of the two can be compared kernel by kernel (the profile in
``real-models-h200-profile.md`` names kernels; this shows what they compute and which graph
nodes they came from).

    TORCH_COMPILE_DEBUG=1 TORCH_COMPILE_DEBUG_DIR=out/compile python benchmarks/output_code.py gpt2 compile
    TORCH_COMPILE_DEBUG=1 TORCH_COMPILE_DEBUG_DIR=out/remat python benchmarks/output_code.py gpt2 remat \
        --plan out/plan.txt
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import real_models  # noqa: E402  (it puts the repository root on sys.path)

import remat  # noqa: E402
import zoo  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=zoo.SUITE)
    ap.add_argument("strategy", choices=["compile", "remat"])
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU in fp32")
    ap.add_argument("--plan", help="write remat's plans (print(plan)) here")
    args = ap.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    wl = zoo.build(args.model, tiny=args.tiny, device=device, dtype=torch.float32 if args.tiny else torch.bfloat16)
    fn = torch.compile(wl.model) if args.strategy == "compile" else remat.checkpoint(wl.model)
    real_models.step(fn, wl.model, wl)
    if args.plan and args.strategy == "remat":
        pathlib.Path(args.plan).write_text("\n\n".join(str(p) for p in remat.compiled_plans(fn)))


if __name__ == "__main__":
    main()
