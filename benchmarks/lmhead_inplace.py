"""Simulated against read peak of an LM head and its cross-entropy alone, the head's matmul
recomputed (``remat.recompute(ops="aten.mm")``) and the logits output dropped before the
backward (as an HF model's caller does), for several vocabulary sizes and dtypes: does the
simulator model the loss backward's buffers there (issue 27 item 2)?

    PYTHONPATH=$PWD python benchmarks/lmhead_inplace.py        # H200 (torch 2.11): equal in all six cases
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import remat  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"


class Head(nn.Module):
    def __init__(self, h, v):
        super().__init__()
        self.norm, self.w = nn.LayerNorm(h), nn.Linear(h, v, bias=False)

    def forward(self, x, y):
        logits = self.w(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1)), logits


for dtype in (torch.bfloat16, torch.float32):
    for v in (512, 4096, 32000):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = Head(256, v).to(dev, dtype)
        x = torch.randn(8, 1024, 256, device=dev, dtype=dtype, requires_grad=True)
        y = torch.randint(0, v, (8, 1024), device=dev)
        r = remat.checkpoint(m, policy=remat.recompute(ops="aten.mm"))
        for _ in range(2):
            loss, logits = r(x, y)
            del logits
            loss.backward()
        (p,) = remat.compiled_plans(r)
        sim, read = p.simulated_peak_bytes, p.compiled_peak_bytes
        print(f"{dtype} V={v}: simulated {sim / 2**20:.1f} MiB, read {read / 2**20:.1f} MiB, "
              f"ratio {sim / max(read, 1):.3f}, recomputed {len(p.recomputed)}", flush=True)
