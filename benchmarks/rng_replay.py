"""Replayed random ops on the device (Note [Replayed random ops] in ``remat/capture/rng_replay.py``):
a small HF GPT-2 (dropout 0.1, attention's too) compiled by remat twice, with its default plan and
under a budget near its smallest predicted peak (``--factor`` times it: a compiled plan may read
above its prediction), the second recomputing attention by replaying its generator state. Same
seeds, numbers drawn between the forward and the backward: the two steps' losses and gradients
must agree (float32), and the budget's plan must say how many random ops it replayed.

    python benchmarks/rng_replay.py [--device cuda] [--factor 1.3] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import torch
import transformers

import remat


class _Loss(torch.nn.Module):
    """The model's logits squared and averaged (HF's own loss would break the graph)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits.float().square().mean()


def _steps(base: torch.nn.Module, ids: torch.Tensor, budget: int | None):
    torch._dynamo.reset()
    model = _Loss(copy.deepcopy(base))
    rm = remat.checkpoint(model, **({} if budget is None else {"budget": budget}))
    for seed in (1, 2):  # the second step runs the compiled code again
        for p in model.parameters():
            p.grad = None
        torch.manual_seed(seed)
        loss = rm(ids)
        torch.rand(3, device=ids.device)
        loss.backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    return loss.detach().float(), grads, remat.compiled_plans(rm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--factor", type=float, default=1.3)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=512, vocab_size=1024,
                                  attn_implementation="sdpa")
    base = transformers.GPT2LMHeadModel(cfg).to(args.device).train()
    ids = torch.randint(0, 1024, (8, 512), device=args.device)
    t = time.time()
    loss0, grads0, _ = _steps(base, ids, None)
    smallest = min(p.predicted_peak_bytes for p in remat.pareto(_Loss(copy.deepcopy(base)), ids).points)
    budget = int(smallest * args.factor)
    loss1, grads1, plans = _steps(base, ids, budget)
    row = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "smallest_predicted_bytes": smallest, "budget_bytes": budget,
        "loss_default": loss0.item(), "loss_budget": loss1.item(),
        "grad_rel_err": ((grads1 - grads0).norm() / grads0.norm()).item(),
        "attention_recomputed": sum(v for p in plans for k, v in p.recompute_counts().items() if "attention" in k),
        "replay_notes": [n for p in plans for n in p.notes if "replaying" in n], "seconds": time.time() - t,
    }
    print(json.dumps(row, indent=1))
    with open(os.path.join(args.out, "rng-replay.json"), "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
