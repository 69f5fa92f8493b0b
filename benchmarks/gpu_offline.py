"""remat's plans lowered as on a GPU, on a machine without one: the simulated peak of each plan
(``Plan.simulated_peak_bytes``, the Inductor step model with the GPU's rules) against the peak
read from the memory plan Inductor generates for CUDA (``wrapper_reading``), per model and
budget. Issue 27 item 2 (predictions that hold on the GPU) asks that the two agree within 5%;
this finds where they do not between GPU sessions. Needs torch's CUDA wheel (``fake_gpu``):

    python -m venv /tmp/v && . /tmp/v/bin/activate && pip install torch transformers && pip install -e .
    python benchmarks/gpu_offline.py --models head gpt2 llama --budgets none 0.5 0.3 --out out/

The model's joint graph is captured by Dynamo and AOTAutograd on fake CPU tensors of the full
size (nothing is allocated), moved to CUDA (``fake_gpu.to_cuda``), passed through Inductor's
joint-graph passes and remat's partition (``make_partition_fn``, the Inductor backend), and the
forward and backward are lowered by ``compile_fx_inner`` with remat's hooks, as
``remat.backends.inductor.hooks.compile_fx`` does. Inductor's joint-graph passes run before the
graph is moved (their patterns are set up with real tensors on the graph's device), so those
that act only on a GPU do not: padded matmuls (``pad_mm``, which decides by timing) and the
rewrite of attention's math into a fused kernel. Attention runs as the math path (HF
``attn_implementation="eager"``): the attention kernels Dynamo captures on a CPU are CPU
kernels. Inductor's padded matmuls (``pad_mm``) decide by timing on the GPU and are off here.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import fake_gpu  # noqa: E402
import peak_diff  # noqa: E402

MiB = 2**20


class Head(nn.Module):
    """An LM head and its cross-entropy loss after one MLP block (the region issue 27 names)."""

    def __init__(self, hidden: int = 2048, vocab: int = 32000):
        super().__init__()
        self.up = nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = nn.Linear(4 * hidden, hidden, bias=False)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = x + self.down(torch.nn.functional.silu(self.up(x)))
        logits = self.head(h).float()
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def _bf16(make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` with bfloat16 parameters (under a fake mode ``Module.to`` cannot swap them)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return make()
    finally:
        torch.set_default_dtype(old)


def _head() -> tuple[nn.Module, Callable[[], tuple]]:
    return _bf16(Head), lambda: (torch.randn(8, 2048, 2048, dtype=torch.bfloat16),
                                                torch.randint(0, 32000, (8, 2048)))


def _hf(name: str) -> tuple[nn.Module, Callable[[], tuple]]:
    import transformers as tf

    if name == "gpt2":
        cfg = tf.GPT2Config(n_layer=int(os.environ.get("LAYERS", 4)), n_positions=1024, attn_implementation="eager")
        model, vocab, batch, seq = _bf16(lambda: tf.GPT2LMHeadModel(cfg)), cfg.vocab_size, 8, 1024
    else:
        layers = int(os.environ.get("LAYERS", 4))
        cfg = tf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                             num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                             max_position_embeddings=2048, attn_implementation="eager")
        model, vocab, batch, seq = _bf16(lambda: tf.LlamaForCausalLM(cfg)), cfg.vocab_size, 8, 2048
    model.config.use_cache = False

    def inputs() -> tuple:
        ids = torch.randint(0, vocab, (batch, seq))
        return (ids, ids)

    return model, inputs


MODELS: dict[str, Callable[[], tuple[nn.Module, Callable[[], tuple]]]] = {
    "head": _head, "gpt2": lambda: _hf("gpt2"), "llama": lambda: _hf("llama")}


def _loss(model: nn.Module, args: tuple) -> torch.Tensor:
    if isinstance(model, Head):
        return model(*args)
    return model(input_ids=args[0], labels=args[1]).loss


def capture(name: str) -> list[dict[str, Any]]:
    """The joint graphs of one training step of model ``name`` on fake CPU tensors, each with
    what AOTAutograd hands its partitioner."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._subclasses.fake_tensor import FakeTensorMode

    from remat import compat
    from remat.analysis.provenance import clean_module_paths

    joints: list[dict[str, Any]] = []

    def partition(joint: Any, joint_inputs: Any, *, num_fwd_outputs: int,
                  static_lifetime_input_indices: list[int] | None = None, **kw: Any) -> Any:
        from torch._guards import detect_fake_mode
        from torch._inductor.fx_passes.joint_graph import joint_graph_passes
        from torch._inductor.virtualized import V

        with V.set_fake_mode(detect_fake_mode(joint_inputs)):  # where compile_fx runs them; on the CPU
            joint_graph_passes(joint)
        joints.append({"joint": copy.deepcopy(joint), "inputs": joint_inputs, "num_fwd_outputs": num_fwd_outputs,
                       "static": list(static_lifetime_input_indices or [])})
        return compat.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                        static_lifetime_input_indices=static_lifetime_input_indices)

    from torch._inductor.decomposition import select_decomp_table

    aot = aot_autograd(fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g, partition_fn=partition,
                       decompositions=select_decomp_table())

    def backend(gm: Any, example_inputs: list[Any]) -> Any:
        clean_module_paths(gm)
        return aot(gm, example_inputs)

    torch._dynamo.reset()
    mode = FakeTensorMode()
    with mode:
        model, make = MODELS[name]()
        args = make()
    step = torch.compile(lambda *a: _loss(model, a), backend=backend)
    with mode:
        step(*args)
    return joints


def lower(g: Any, is_backward: bool) -> Any:
    """Inductor's memory plan of the CUDA graph ``g`` (``wrapper_reading.GraphTrace``)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    from remat.backends.inductor.hooks import copies_in_place, stage_local_fusion
    from remat.backends.inductor.wrapper_reading import read_allocations

    traces: list[Any] = []
    inputs = [n.meta["val"] for n in g.graph.find_nodes(op="placeholder")]
    with stage_local_fusion(), copies_in_place(g), read_allocations(traces.append), \
            inductor_config.patch(emulate_precision_casts=True):
        compile_fx_inner(g, inputs, is_backward=is_backward, is_inference=False)
    return traces[-1]


def plan_and_read(j: dict[str, Any], budget: float | None) -> dict[str, Any]:
    """remat's plan of one CUDA joint graph under ``budget`` and the peak read from Inductor's
    CUDA memory plan of its forward and backward."""
    from remat.backends.inductor import backend as inductor_backend
    from remat.backends.inductor.backend import InductorBackend
    from remat.backends.inductor.hooks import graph_io_names
    from remat.backends.registry import backend_for
    from remat.capture.graph_copy import copy_graph
    from remat.capture.partition import make_partition_fn
    from remat.options import Options

    plans: list[Any] = []
    joint = copy_graph(j["joint"]) or copy.deepcopy(j["joint"])
    partition = make_partition_fn(Options(backend="inductor", budget=budget, strict=True),
                                  lambda p, f: plans.append(p), InductorBackend(), backend_for("eager"))
    fw, bw = partition(joint, j["cuda_inputs"], num_fwd_outputs=j["num_fwd_outputs"],
                       static_lifetime_input_indices=j["static"])
    fw_trace, bw_trace = lower(fw, False), lower(bw, True)
    outs, _, _ = graph_io_names(fw)
    _, bw_inputs, scalars = graph_io_names(bw)
    reading = inductor_backend.read_step(fw_trace, bw_trace, outs, bw_inputs, scalars)
    peak = reading.peak(reading.loss_in_graph)
    plan = plans[-1]
    if RECORDER is not None:
        want = plan.simulated_peak_bytes
        sims = [x for x in RECORDER.sims if x[2].peak_bytes == want]
        lines = [f"=== {budget}: simulated {want / MiB:.3f} MiB, read {peak.peak_bytes / MiB:.3f} MiB"]
        if sims:
            lines += peak_diff.simulated_report(*sims[-1], 30)
        lines += peak_diff.read_report(RECORDER, len(RECORDER.reads) - 1, reading.loss_in_graph, 30)
        DIFFS.append("\n".join(lines))
        RECORDER.sims.clear()
    return {"budget": budget, "simulated": plan.simulated_peak_bytes, "read": peak.peak_bytes,
            "read_at": peak.at, "saved_bytes": plan.saved_bytes,
            "error": (plan.simulated_peak_bytes - peak.peak_bytes) / peak.peak_bytes if peak.peak_bytes else None}


RECORDER: Any = None
"""With ``--diff``: ``peak_diff.Recorder``, the simulator's and the reader's records."""
DIFFS: list[str] = []
"""With ``--diff``: each row's live sets, simulated and read (``peak_diff``'s reports)."""


def run(name: str, budgets: list[float | None]) -> list[dict[str, Any]]:
    from torch._inductor import config as inductor_config
    from torch._subclasses.fake_tensor import FakeTensorMode

    rows = []
    for k, j in enumerate(capture(name)):
        mode = FakeTensorMode()
        flat, spec = torch.utils._pytree.tree_flatten(j["inputs"])
        with fake_gpu.patched(), inductor_config.patch(shape_padding=False):
            fakes = fake_gpu.to_cuda(j["joint"], flat, mode)
            j["cuda_inputs"] = torch.utils._pytree.tree_unflatten(fakes, spec)
            for b in budgets:
                try:
                    with mode:
                        row = plan_and_read(j, b)
                except Exception as e:  # noqa: BLE001 - an infeasible budget is a row too
                    if os.environ.get("TRACE"):
                        import traceback
                        traceback.print_exc()
                    row = {"budget": b, "failed": f"{type(e).__name__}: {str(e)[:200]}"}
                row.update(model=name, graph=k + 1)
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def _line(r: dict[str, Any]) -> str:
    head = f"{r['model']:6} graph {r['graph']} budget {r['budget']!s:5}"
    if "failed" in r:
        return f"{head}  {r['failed']}"
    return (f"{head}  simulated {r['simulated'] / MiB:9.1f} MiB  read {r['read'] / MiB:9.1f} MiB  "
            f"({100 * r['error']:+.1f}%)  read peak at {r['read_at']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["head", "gpt2", "llama"], choices=sorted(MODELS))
    ap.add_argument("--budgets", nargs="+", default=["none", "0.5"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--diff", action="store_true", help="write peak_diff's live sets of each row to --out")
    a = ap.parse_args()
    global RECORDER
    if a.diff:
        RECORDER = peak_diff.Recorder()
        RECORDER.install()
    budgets = [None if b == "none" else float(b) for b in a.budgets]
    rows = [r for m in a.models for r in run(m, budgets)]
    if a.out:
        out = pathlib.Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"torch": torch.__version__, "device": "fake H100 (fake_gpu.py)",
                "layers": os.environ.get("LAYERS", "4")}
        (out / "gpu-offline.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        if DIFFS:
            (out / "gpu-offline-diff.txt").write_text("\n\n".join(DIFFS) + "\n")


if __name__ == "__main__":
    main()
