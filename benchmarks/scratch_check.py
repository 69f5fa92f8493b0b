"""Is the cuDNN scratch remat measured before compiling what the convolutions hold inside the step?
For a suite model and budget on CUDA: compiles ``remat.checkpoint`` with Inductor, steps until every
graph has chosen its plan, then runs one step with each convolution call the compiled code makes
wrapped, measuring the allocator's peak inside the call above its start, less what the call
returns (the scratch it held), and the memory allocated when it started. Lists each call beside
the scratch measured before compiling for the same key (Note [Measured library scratch] in
``remat.backends.cuda_scratch``) and the same key measured again now, after the steps.

    python benchmarks/scratch_check.py --model efficientnet --budget 0.5 --out $OUT
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: `remat`, `zoo`
import remat  # noqa: E402
import zoo  # noqa: E402
from benchmarks.real_models import tuning_pending  # noqa: E402
from remat.backends import cuda_scratch  # noqa: E402

CONV = ("input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups")
"""``aten.convolution``'s arguments in order (Inductor's extern call passes some by keyword)."""


def _spec(a: Any) -> tuple:
    if isinstance(a, torch.Tensor):
        return ("tensor", (tuple(a.shape), tuple(a.stride()), a.dtype))
    return ("value", tuple(a) if isinstance(a, (list, tuple)) else a)


def _key(op: str, args: tuple) -> tuple:
    """The call's key as remat keeps its measurement (``cuda_scratch.call_key``)."""
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    return cuda_scratch.call_key(op, tuple(_spec(a) for a in args), device)


def _loose(key: tuple) -> tuple:
    """The key without strides: calls whose layouts differ from what was measured still pair."""
    return (key[0], tuple((s[0], (s[1][0], s[1][2])) if s[0] == "tensor" else s for s in key[1]))


class Calls:
    """Wraps the convolution entry points the compiled code calls; records each call's scratch."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rows: list[dict[str, Any]] = []
        self.undo: list[Callable[[], None]] = []

    def _measured(self, op: str, fn: Callable, args: tuple) -> Any:
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        out = fn()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        held = torch.cuda.memory_allocated(self.device) - before
        self.rows.append({"key": _key(op, args), "before": before,
                          "scratch": max(0, peak - before - held)})
        return out

    def __enter__(self) -> Calls:
        from torch._inductor.select_algorithm import extern_kernels

        conv = extern_kernels.convolution

        def convolution(*args: Any, **kwargs: Any) -> Any:
            full = list(args) + [kwargs[n] for n in CONV[len(args):] if n in kwargs]
            assert len(full) == len(CONV), (args, kwargs)
            return self._measured("aten.convolution.default", lambda: conv(*args, **kwargs), tuple(full))

        extern_kernels.convolution = convolution
        self.undo.append(lambda: setattr(extern_kernels, "convolution", conv))
        packet = torch.ops.aten.convolution_backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            assert not kwargs, kwargs
            return self._measured("aten.convolution_backward.default", lambda: packet.default(*args), args)

        # the generated code looks up torch.ops.aten.convolution_backward.default on each call
        torch.ops.aten.convolution_backward = types.SimpleNamespace(default=backward)  # type: ignore[attr-defined]
        self.undo.append(lambda: setattr(torch.ops.aten, "convolution_backward", packet))
        return self

    def __exit__(self, *exc: Any) -> None:
        for u in reversed(self.undo):
            u()


def reprobe(key: tuple, device: torch.device) -> int:
    """``key``'s scratch measured again as remat measures it before compiling, in today's allocator."""
    return cuda_scratch.measure_call(getattr(torch.ops.aten, key[0].split(".")[1]).default, key[1], device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=zoo.SUITE, required=True)
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    a = parser.parse_args(argv)
    device = torch.device("cuda")
    wl = zoo.build(a.model, tiny=False, device="cuda", dtype=torch.bfloat16, no_dropout=True)
    fn = remat.checkpoint(copy.deepcopy(wl.model), backend="inductor", budget=a.budget)

    def step() -> None:
        for p in fn.parameters():
            p.grad = None
        wl.loss(fn, wl.inputs).backward()

    step()
    n = 0
    while n < 60 and tuning_pending(fn):
        step()
        n += 1
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    with Calls(device) as calls:
        step()
    probed = dict(cuda_scratch._CACHE)
    loose: dict[tuple, list[int]] = {}
    for k, v in probed.items():
        loose.setdefault(_loose(k), []).append(v)
    plans = remat.compiled_plans(fn)
    mib = 2 ** 20
    lines = [f"{a.model} budget={a.budget}: measured step peak {peak / mib:.1f} MiB above the step's start; "
             f"predicted {sum(p.predicted_peak_bytes for p in plans) / mib:.1f}, simulated "
             f"{sum(p.simulated_peak_bytes for p in plans) / mib:.1f}, read "
             f"{sum(p.compiled_peak_bytes for p in plans) / mib:.1f} MiB; {len(calls.rows)} convolution calls, "
             f"{len(probed)} keys measured before compiling",
             "   in-step  probed(exact) probed(no strides)  re-probed   allocated  op shapes"]
    rows = []
    again: dict[tuple, int] = {}
    for r in calls.rows:
        k = r["key"]
        if k not in again:
            again[k] = reprobe(k, device)
        exact = probed.get(k)
        near = loose.get(_loose(k), [])
        row = {"op": k[0].split(".")[1], "shapes": [s[1][:2] if s[0] == "tensor" else s[1] for s in k[1]],
               "in_step": r["scratch"], "probed": exact, "probed_loose": near, "reprobed": again[k],
               "allocated": r["before"] - base}
        rows.append(row)
        lines.append(f"{r['scratch'] / mib:9.2f} {'-' if exact is None else f'{exact / mib:.2f}':>14} "
                     f"{','.join(f'{v / mib:.2f}' for v in near) or '-':>18} {again[k] / mib:10.2f} "
                     f"{(r['before'] - base) / mib:11.1f}  {row['op']} {[s for s in row['shapes'] if s][:3]}")
    text = "\n".join(lines)
    print(text)
    os.makedirs(a.out, exist_ok=True)
    tag = f"{a.model}-{a.budget}"
    with open(os.path.join(a.out, f"scratch-{tag}.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, f"scratch-{tag}.json"), "w") as f:
        json.dump({"peak": peak, "rows": rows}, f, default=str)


if __name__ == "__main__":
    main()
