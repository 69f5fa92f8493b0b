"""Quick start: plan and train a small GPT-style model on CPU with remat.

    python examples/quickstart.py [--backend inductor|eager] [--steps N]
    python -m remat explain examples/quickstart.py:factory     # the plan, from the command line

Prints the plan table (every tensor kept for the backward, its bytes and why), then trains a
few steps with the default backend (Inductor: the first step compiles C++ kernels, which takes
a few seconds on CPU) and checks the gradients against eager autograd.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

import remat
from remat.plan import format_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from zoo import workloads  # noqa: E402  (the reference models live in zoo/, not in the package)


def factory() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """The demo's model and input, for ``python -m remat explain examples/quickstart.py:factory``."""
    torch.manual_seed(0)
    model, x = workloads.build("gpt", "small")  # 2 pre-LN blocks, d=64, 4 heads, seq 16
    return model, (x,)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor", choices=["inductor", "eager"])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    model, (x,) = factory()
    reference = copy.deepcopy(model)

    plan = remat.explain(model, x)
    print(plan)
    print()
    ratio = plan.saved_bytes / plan.eager_saved_bytes
    print(f"saved for backward: remat {format_bytes(plan.saved_bytes)} vs eager autograd "
          f"{format_bytes(plan.eager_saved_bytes)} ({ratio:.0%})")

    model = remat.checkpoint(model, backend=args.backend)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=1e-2)
    for step in range(args.steps):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            workloads.loss(m(x)).backward()
        worst = max((a.grad - b.grad).abs().max().item()
                    for a, b in zip(model.parameters(), reference.parameters()))
        opt.step()
        ref_opt.step()
        # The differences are float32 rounding, different in their last bits on every machine
        # and backend: the demo prints whether they are within it, the same text everywhere.
        agree = "gradients equal eager autograd's within 1e-06" if worst < 1e-6 else (
            f"gradients differ from eager autograd's by {worst:.2e}, more than float32 rounding")
        print(f"step {step}: loss {workloads.loss(model(x)).item():.5f}, {agree}")


if __name__ == "__main__":
    main()
