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
that act only on a GPU do not: padded matmuls (``pad_mm``, which decides by timing on the GPU;
``--pad-mm force`` pads every misaligned one) and the rewrite of attention's math into a fused
kernel. Inductor's padded strides (``comprehensive_padding``) apply as on a GPU. The CPU's
flash attention becomes CUDA's (``fake_gpu.cuda_attention``); a GPU may pick another fused
kernel (cuDNN's, memory-efficient).
Models are ``zoo``'s at the benchmark's size in bfloat16 without dropout (on a CPU, attention
with dropout runs as its math path); ``head`` is an LM head and its loss alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._inductor.lowering  # noqa: F401 - imported before a fake mode is entered (a model build
import torch.nn as nn  # that fails under it could leave it half imported)

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


Loss = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
Built = tuple[nn.Module, dict[str, torch.Tensor], Loss]
"""A model, its inputs and its loss (``loss(model, inputs)``, as ``zoo.Workload.loss``)."""


def _head() -> Built:
    inputs = {"x": torch.randn(8, 2048, 2048), "labels": torch.randint(0, 32000, (8, 2048))}
    return Head(), inputs, lambda m, i: m(i["x"], i["labels"])


def _zoo(name: str) -> Built:
    import zoo

    extra: dict[str, Any] = {"batch": BATCH} if BATCH else {}
    if BATCH and name == "llama":  # as long_context.py builds it: positions for the whole sequence
        extra["config"] = {"max_position_embeddings": max(BATCH[1], 2048)}
    if DROPOUT and name == "gpt2":  # attention's dropout would run as its math path on a CPU
        extra["config"] = {**extra.get("config", {}), "attn_pdrop": 0.0}
    wl = zoo.build(name, tiny=False, device="cpu", dtype=torch.bfloat16, no_dropout=not DROPOUT, **extra)
    return wl.model, wl.inputs, wl.loss


def _faked(mode: Any, model: nn.Module, inputs: dict[str, torch.Tensor], loss: Loss) -> Built:
    """A model and inputs built with real tensors, their parameters, buffers and inputs made fake
    tensors of ``mode``."""
    for m in model.modules():
        for k, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[k] = nn.Parameter(mode.from_tensor(p.detach()), requires_grad=p.requires_grad)
        for k, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[k] = mode.from_tensor(b)
    return model, {k: mode.from_tensor(v) for k, v in inputs.items()}, loss


def build(name: str) -> Built:
    """Model ``name`` in bfloat16 (called under a fake mode, where ``Module.to`` cannot swap
    parameters: they are made in bfloat16 and a conversion to it is skipped), its inputs and loss."""
    old, real_to = torch.get_default_dtype(), nn.Module.to

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        dtype = kwargs.get("dtype") or next((a for a in args if isinstance(a, torch.dtype)), None)
        if dtype is not None and all(p.dtype == dtype for p in self.parameters()):
            return self
        return real_to(self, *args, **kwargs)

    torch.set_default_dtype(torch.bfloat16)
    nn.Module.to = to
    try:
        return _head() if name == "head" else _zoo(name)
    finally:
        torch.set_default_dtype(old)
        nn.Module.to = real_to


@contextlib.contextmanager
def _padded_matmuls(on: bool) -> Iterator[None]:
    """With ``on``, Inductor's ``pad_mm`` pass pads every matmul whose sizes are not multiples of
    the alignment, on this CPU graph as on a GPU; a GPU pads only where its timing says padding
    is faster, so this is the most padding it may do."""
    if not on:
        yield
        return
    from torch._inductor import config as inductor_config
    from torch._inductor.fx_passes import pad_mm

    saved = pad_mm.check_device, pad_mm.has_triton
    pad_mm.check_device, pad_mm.has_triton = (lambda a, b: True), (lambda: True)
    try:
        with inductor_config.patch(shape_padding=True, force_shape_pad=True):
            yield
    finally:
        pad_mm.check_device, pad_mm.has_triton = saved


def capture(name: str, pad_mm: bool = False, one_graph: bool = False) -> list[dict[str, Any]]:
    """The joint graphs of one training step of model ``name`` on fake CPU tensors, each with
    what AOTAutograd hands its partitioner; ``pad_mm``: every misaligned matmul padded
    (``_padded_matmuls``); ``one_graph``: logger calls do not split the graph, as under a budget
    (Note [Logging does not split the graph]: HF GPT-2's loss in its one graph)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._subclasses.fake_tensor import FakeTensorMode

    from remat import compat
    from remat.analysis.provenance import clean_module_paths
    from remat.capture.attention import rewrite_attention
    from remat.capture.graph_copy import copy_graph

    joints: list[dict[str, Any]] = []

    ends_at_break = [False]

    def partition(joint: Any, joint_inputs: Any, *, num_fwd_outputs: int,
                  static_lifetime_input_indices: list[int] | None = None, **kw: Any) -> Any:
        from torch._guards import detect_fake_mode
        from torch._inductor.fx_passes.joint_graph import joint_graph_passes
        from torch._inductor.virtualized import V

        with V.set_fake_mode(detect_fake_mode(joint_inputs)), _padded_matmuls(pad_mm):  # where compile_fx runs
            joint_graph_passes(joint)  # them, on the CPU
        joints.append({"joint": copy_graph(joint) or joint, "inputs": joint_inputs, "num_fwd_outputs": num_fwd_outputs,
                       "ends_at_break": ends_at_break[0],
                       "static": list(static_lifetime_input_indices or [])})
        return compat.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                        static_lifetime_input_indices=static_lifetime_input_indices)

    from torch._inductor.decomposition import select_decomp_table

    aot = aot_autograd(fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g, partition_fn=partition,
                       decompositions=select_decomp_table())

    def backend(gm: Any, example_inputs: list[Any]) -> Any:
        clean_module_paths(gm)
        rewrite_attention(gm)  # as remat's Dynamo backend does (Note [Attention as eager runs it])
        ends_at_break[0] = compat.graph_break(gm) is not None
        return aot(gm, example_inputs)

    torch._dynamo.reset()
    mode = FakeTensorMode()
    try:
        with mode:
            model, inputs, loss = build(name)
    except Exception:  # noqa: BLE001 - an initialisation that reads values (timm): built for real
        model, inputs, loss = _faked(mode, *build(name))
    compiled = torch.compile(model, backend=backend)
    from torch._inductor import config as inductor_config
    # traced as remat's compile traces it: the rounding marks of Note [Emulated rounding]
    with mode, (compat.logging_in_graph() if one_graph else contextlib.nullcontext()), \
            inductor_config.patch(emulate_precision_casts=not STOCK):
        loss(compiled, inputs)
    return joints


def lower(g: Any, is_backward: bool, user_outputs: int | None = None, stock: bool = False) -> tuple[Any, list[Any]]:
    """Inductor's memory plan of the CUDA graph ``g`` (``wrapper_reading.GraphTrace``) and the
    strides of its compiled outputs (None where unknown). As ``compile_fx`` does, the outputs the
    caller sees keep their traced strides (every output of a backward; a forward's first
    ``user_outputs``) and the rest, saved activations, take the layout Inductor picks."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    from remat.backends.inductor.hooks import in_remat_order, stage_local_fusion
    from remat.backends.inductor.wrapper_reading import read_allocations

    out, outs = _outputs(g)
    out.meta["original_output_strides"] = [getattr(n.meta.get("val"), "stride", lambda: None)()
                                           if isinstance(n, torch.fx.Node) else None for n in outs]
    shown = len(outs) if is_backward or user_outputs is None else user_outputs
    out.meta["user_visible_output_idxs"] = [i for i in range(shown) if isinstance(outs[i], torch.fx.Node)]
    traces: list[Any] = []
    inputs = [n.meta["val"] for n in g.graph.find_nodes(op="placeholder")]
    casts = {} if stock else {"emulate_precision_casts": True}  # as remat's compile_fx
    with stage_local_fusion(), in_remat_order(not stock), read_allocations(traces.append), \
            inductor_config.patch(**casts, **PATCHES):
        compiled = compile_fx_inner(g, inputs, is_backward=is_backward, is_inference=False)
    strides = [tuple(int(x) for x in st) if st is not None else None
               for st in (getattr(compiled, "output_strides", None) or [None] * len(outs))]
    return traces[-1], strides


def _outputs(g: Any) -> tuple[Any, list[Any]]:
    """The output node of graph module ``g`` and the values it returns, in order."""
    out = g.graph.find_nodes(op="output")[0]
    return out, list(out.args[0]) if isinstance(out.args[0], (tuple, list)) else [out.args[0]]


def restride_saved(fw: Any, bw: Any, strides: list[Any]) -> None:
    """The backward's inputs that the forward saved, with the strides the compiled forward gave them:
    AOTAutograd restrides them so before it compiles the backward (``graph_compile.py``: "saved
    activations can have different stride to eager if the compiler does layout optimization")."""
    from torch._guards import detect_fake_mode

    _, outs = _outputs(fw)
    given = {n.name: st for n, st in zip(outs, strides) if isinstance(n, torch.fx.Node) and st is not None}
    for ph in bw.graph.find_nodes(op="placeholder"):
        val, st = ph.meta.get("val"), given.get(ph.name)
        if isinstance(val, torch.Tensor) and st is not None and tuple(val.stride()) != st:
            with detect_fake_mode([val]):
                ph.meta["val"] = torch.empty_strided(val.shape, st, dtype=val.dtype, device=val.device)


def plan_and_read(j: dict[str, Any], budget: float | str | None, offload: bool | str = False,
                  pick: Any = None, frontiers: list[Any] | None = None) -> dict[str, Any]:
    """remat's plan of one CUDA joint graph under ``budget`` and the peak read from Inductor's
    CUDA memory plan of its forward and backward. ``pick``: the key of the candidate to plan
    instead (as tuning compiles it); ``frontiers``: where the graph's frontier is appended."""
    from remat.backends.inductor import backend as inductor_backend
    from remat.backends.inductor.backend import InductorBackend
    from remat.backends.inductor.hooks import graph_io_names
    from remat.backends.registry import backend_for
    from remat.capture.graph_copy import copy_graph
    from remat.capture.partition import make_partition_fn, make_stock_partition_fn
    from remat.options import Options

    plans: list[Any] = []
    joint = copy_graph(j["joint"]) or j["joint"]
    make = make_stock_partition_fn if STOCK else make_partition_fn
    def sink(p: Any, f: Any) -> None:
        plans.append(p)
        if frontiers is not None:
            frontiers.append(f)

    kw = {} if STOCK else {"want_frontier": frontiers is not None, "pick": pick}
    partition = make(Options(backend="inductor", budget=budget, strict=True, offload=offload),
                     sink, InductorBackend(), backend_for("eager"), ends_at_break=j["ends_at_break"], **kw)
    fw, bw = partition(joint, j["cuda_inputs"], num_fwd_outputs=j["num_fwd_outputs"],
                       static_lifetime_input_indices=j["static"])
    fw_trace, strides = lower(fw, False, j["num_fwd_outputs"], stock=STOCK)
    restride_saved(fw, bw, strides)
    bw_trace, _ = lower(bw, True, stock=STOCK)
    outs, _, _ = graph_io_names(fw)
    _, bw_inputs, scalars = graph_io_names(bw)
    reading = inductor_backend.read_step(fw_trace, bw_trace, outs, bw_inputs, scalars)
    # the caller keeps only the loss where this graph computes it or hands its outputs on at a
    # graph break (Note [What the caller holds]); a loss computed outside every graph keeps them
    dropped = reading.loss_in_graph or j["ends_at_break"]
    peak = reading.peak(dropped)
    plan = plans[-1]
    if RECORDER is not None:
        want = plan.simulated_peak_bytes
        sims = sorted(RECORDER.sims, key=lambda x: abs(x[2].peak_bytes - want))[:1]  # the plan's, or nearest
        lines = [f"=== {budget}: simulated {want / MiB:.3f} MiB, read {peak.peak_bytes / MiB:.3f} MiB"]
        if sims:
            lines += peak_diff.simulated_report(*sims[-1], 30)
        lines += peak_diff.read_report(RECORDER, len(RECORDER.reads) - 1, dropped, 30)
        lines += peak_diff.boundary_report(sims[-1] if sims else None, RECORDER, len(RECORDER.reads) - 1, 40)
        DIFFS.append("\n".join(lines))
        RECORDER.sims.clear()
    return {"budget": budget, "plan": plan, "simulated": plan.simulated_peak_bytes, "read": peak.peak_bytes,
            "read_at": peak.at, "saved_bytes": plan.saved_bytes, "origin": plan.origin,
            "cost_ms": plan.cost_seconds * 1e3, "recompute_ms": plan.recompute_seconds * 1e3,
            "offloaded": [[o.name, o.nbytes, o.released_after, o.reload_before] for o in plan.offloaded],
            "error": (plan.simulated_peak_bytes - peak.peak_bytes) / peak.peak_bytes if peak.peak_bytes else None}


PATCHES: dict[str, Any] = {}
"""Inductor config changes for the lowering (a probe: ``REORDER=1`` turns Inductor's reorder_for_peak_memory
back on, which remat's compile turns off: Note [remat's order kept])."""
if os.environ.get("REORDER") == "1":
    PATCHES["reorder_for_peak_memory"] = True
RECORDER: Any = None
"""With ``--diff``: ``peak_diff.Recorder``, the simulator's and the reader's records."""
STOCK = False
"""With ``--stock``: torch.compile's own partition (``make_stock_partition_fn``), compiled as remat compiles that
candidate (Inductor's order and precision), instead of remat's plan; the budget does not change that partition."""
BATCH: tuple[int, int] | None = None
"""With ``--batch``: the model's batch (rows, sequence length) instead of the benchmark's."""
PICKS = False
"""With ``--picks``: each budget's other tuning candidates planned and read too (``_picks``)."""
DROPOUT = False
"""With ``--dropout``: the model keeps its dropout (GPT-2's attention dropout off: on a CPU it would run as
attention's math path, where a GPU runs a fused kernel with dropout)."""
DIFFS: list[str] = []
"""With ``--diff``: each row's live sets, simulated and read (``peak_diff``'s reports)."""


def run(name: str, budgets: list[float | str | None], pad_mm: bool = False, one_graph: bool = False,
        offload: bool | str = False) -> list[dict[str, Any]]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    rows = []
    for k, j in enumerate(capture(name, pad_mm, one_graph)):
        mode = FakeTensorMode()
        flat, spec = torch.utils._pytree.tree_flatten(j["inputs"])
        with fake_gpu.patched():
            fake_gpu.cuda_attention(j["joint"])
            fakes = fake_gpu.to_cuda(j["joint"], flat, mode)
            j["cuda_inputs"] = torch.utils._pytree.tree_unflatten(fakes, spec)
            for b in budgets:
                frontiers: list[Any] = []
                try:
                    with mode:
                        row = plan_and_read(j, b, offload, frontiers=frontiers if PICKS else None)
                except Exception as e:  # noqa: BLE001 - an infeasible budget is a row too
                    if os.environ.get("TRACE"):
                        import traceback
                        traceback.print_exc()
                    row = {"budget": b, "failed": f"{type(e).__name__}: {str(e)[:200]}"}
                row.update(model=name, graph=k + 1, pad_mm=pad_mm, one_graph=one_graph)
                rows.append(row)
                print(_line(row), flush=True)
                if PICKS and "failed" not in row and b is not None:
                    rows += _picks(j, b, offload, row, frontiers[-1] or (), mode, name, k)
    return rows


def _picks(j: dict[str, Any], budget: Any, offload: bool | str, chosen_row: dict[str, Any], frontier: Any,
           mode: Any, name: str, k: int) -> list[dict[str, Any]]:
    """The other candidates tuning compiles under ``budget`` (``remat.planning.measured``: one
    smaller frontier plan, one faster plan the simulator put over the budget), each planned by
    its key and read as the choice was; the choice's read peak stands for its compile."""
    from remat.planning.measured import faster_picks, measured_picks

    chosen = chosen_row["plan"]
    read = chosen.with_compiled_peak(chosen_row["read"])
    limit = read.budget_bytes
    out = []
    for kind, picked in (("smaller", measured_picks(read, frontier, 1, limit)),
                         ("faster", faster_picks(read, frontier, 1, limit))):
        for p in picked:
            try:
                with mode:
                    row = plan_and_read(j, budget, offload, pick=p.key)
            except Exception as e:  # noqa: BLE001 - reported as a row
                row = {"budget": budget, "failed": f"{type(e).__name__}: {str(e)[:200]}"}
            row.update(model=name, graph=k + 1, pick=kind, budget_bytes=limit)
            out.append(row)
            print(f"  {kind} pick: " + _line(row), flush=True)
    return out


def _line(r: dict[str, Any]) -> str:
    head = f"{r['model']:6} graph {r['graph']} budget {r['budget']!s:5}"
    if "failed" in r:
        return f"{head}  {r['failed']}"
    return (f"{head}  simulated {r['simulated'] / MiB:9.1f} MiB  read {r['read'] / MiB:9.1f} MiB  "
            f"({100 * r['error']:+.1f}%)  read peak at {r['read_at']}  {r['origin'] or 'default'} plan, "
            f"cost {r['cost_ms']:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["head", "gpt2", "llama"], help="head, or zoo.SUITE's names")
    ap.add_argument("--budgets", nargs="+", default=["none", "0.5"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--pad-mm", default="off", choices=["off", "force"],
                    help="force: every misaligned matmul padded, as a GPU may (default: none)")
    ap.add_argument("--offload", default="false", choices=["false", "auto", "all"], help="remat's offload option")
    ap.add_argument("--issue-us", type=float, default=0.0,
                    help="the host's time to issue one offloaded value's copies (Link.issue_seconds), in us")
    ap.add_argument("--link", default="53.6,54.0", help="the host link's GB/s to and from the host (default: "
                    "an H100's, real-models-h100-08-llama.json; real_models.py's offload notes give a run's)")
    ap.add_argument("--one-graph", action="store_true",
                    help="logger calls do not split the graph, as under a budget (HF GPT-2's loss in its graph)")
    ap.add_argument("--stock", action="store_true", help="torch.compile's own partition, as remat measures it")
    ap.add_argument("--diff", action="store_true", help="write peak_diff's live sets of each row to --out")
    ap.add_argument("--batch", default=None, help="ROWSxLENGTH, e.g. 1x88064 (long_context.py's Llama)")
    ap.add_argument("--dropout", action="store_true",
                    help="keep the model's dropout (GPT-2's attention dropout off: on a CPU it is a math path)")
    ap.add_argument("--picks", action="store_true",
                    help="also plan and read the other candidates tuning compiles under each budget")
    a = ap.parse_args()
    global RECORDER, STOCK, BATCH, PICKS, DROPOUT
    STOCK, PICKS, DROPOUT = a.stock, a.picks, a.dropout
    BATCH = tuple(int(x) for x in a.batch.split("x")) if a.batch else None
    if DROPOUT:  # captured on a CPU, bernoulli stays whole (a GPU's trace decomposes it into rand and a compare);
        PATCHES["fallback_random"] = True  # Inductor lowers it for CUDA only as a fallback kernel
    if a.diff:
        RECORDER = peak_diff.Recorder()
        RECORDER.install()
    budgets = [peak_diff.budget_arg(b) for b in a.budgets]
    if a.offload != "false":  # the H100's pinned host link as measured there (real-models-h100-08-llama.json)
        from remat.core.offload import Link
        from remat.planning import offload
        d2h, h2d = (float(x) * 1e9 for x in a.link.split(","))
        offload._LINKS[fake_gpu.H100.name] = Link(d2h=d2h, h2d=h2d, issue_seconds=a.issue_us * 1e-6)
    rows = [r for m in a.models for r in run(m, budgets, a.pad_mm == "force", a.one_graph,
                                                       False if a.offload == "false" else a.offload)]
    if a.out:
        out = pathlib.Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"torch": torch.__version__, "device": "fake H100 (fake_gpu.py)", "dtype": "bfloat16",
                "command": "python benchmarks/gpu_offline.py " + " ".join(sys.argv[1:])}
        rows = [{k: v for k, v in r.items() if k != "plan"} for r in rows]
        (out / "gpu-offline.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        if DIFFS:
            (out / "gpu-offline-diff.txt").write_text("\n\n".join(DIFFS) + "\n")


if __name__ == "__main__":
    main()
