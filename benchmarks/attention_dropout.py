"""An encoder with attention dropout in training (issue: remat must never be worse than eager
autograd): ``nn.TransformerEncoder`` (6 layers, d=512, 8 heads, dropout 0.1, batch-first), bf16,
batch 32 x 512 tokens, eager vs torch.compile vs remat, with the attention ops each captured
graph runs (a fused attention op, or the math path's matmuls and softmax over materialised
scores).

    python benchmarks/attention_dropout.py --out out/   # GPU, about a minute
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics

import torch
import torch.nn as nn

import remat


def build(device: str, dtype: torch.dtype, tiny: bool = False):
    torch.manual_seed(0)
    d, heads, layers, (batch, seq) = (32, 4, 2, (2, 16)) if tiny else (512, 8, 6, (32, 512))
    layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(device, dtype).train()
    x = torch.randn(batch, seq, d, device=device, dtype=dtype)
    return model, x


def attention_ops(plans) -> list[str]:
    """The ops of the plans that compute attention: fused attention ops, or softmax and the
    batched matmuls of the math path."""
    keep = ("attention", "softmax", "bmm")
    return sorted({n.op for p in plans for n in p.nodes if n.op and any(k in n.op for k in keep)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model, x = build("cuda", torch.bfloat16)
    rows = {}
    for name in ("eager", "compile", "remat"):
        m = copy.deepcopy(model)
        fn = {"eager": m, "compile": torch.compile(m), "remat": remat.checkpoint(m)}[name]

        def step():
            for p in m.parameters():
                p.grad = None
            fn(x).float().square().mean().backward()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        times = []
        for _ in range(args.iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        rows[name] = {"step_ms": round(statistics.median(times), 2), "peak_mib": round(peak / 2**20)}
        if name == "remat":
            plans = remat.compiled_plans(fn)
            rows[name]["attention_ops"] = attention_ops(plans)
            rows[name]["predicted_mib"] = round(sum(p.predicted_peak_bytes for p in plans) / 2**20)
        print(name, rows[name], flush=True)
    with open(os.path.join(args.out, "attention-dropout.json"), "w") as f:
        json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
