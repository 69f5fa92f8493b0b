"""remat under DDP and FSDP2: step time, measured peak, graphs planned and saved bytes lost to
graph splits, on HF GPT-2 124M and HF Llama (1024 wide, 12 layers), bf16, any world size.

    torchrun --nproc-per-node 1 benchmarks/distributed.py --out out/            # one H200
    torchrun --nproc-per-node 8 benchmarks/distributed.py --models llama --wrappers fsdp --out out/
    torchrun --nproc-per-node 2 benchmarks/distributed.py --tiny --out out/     # CPU smoke run (gloo)
    torchrun --nproc-per-node 1 benchmarks/distributed.py --wrappers ddp --strategies remat --remat-backend eager \
        --dtype bf16 --batch 1 256 --warmup 0 --iters 1 --out out/              # CPU: split cost at full size

Wrappers (how each strategy is composed with the distributed engine):
- ``ddp``: DistributedDataParallel with its default bucket size (25 MiB; ``--bucket-cap-mb``).
  Dynamo's DDPOptimizer splits a compiled model's graph at the bucket boundaries (remat splits
  its graphs at the same boundaries itself, after planning the whole graph: Note [Bucket pieces
  keep the whole plan] in ``remat/capture/buckets.py``), so both compiled strategies run one graph per
  bucket: ``torch.compile(DDP(model))`` and ``DDP(remat.checkpoint(model))``.
- ``fsdp``: FSDP2 per block in torchtitan's order: per-block checkpointing and compile (or
  ``remat.checkpoint`` per block), then ``fully_shard`` per block and on the root.

Strategies:
- ``compile+ckpt``: HF ``gradient_checkpointing_enable`` (non-reentrant) and torch.compile (the
  whole DDP model; each block under FSDP2, ``block.compile()``).
- ``remat``: remat's default plan.
- ``remat @ckpt peak``: remat with ``budget`` = compile+ckpt's measured peak on this rank, in
  bytes. A budget bounds the predicted peak of *each graph* remat plans (per rank): with one
  graph per block or per bucket it is looser than the same number for the whole step.

Protocol (as ``real_models.py``): each strategy gets a fresh copy of one seeded model; each rank
draws its own batch (per rank: GPT-2 8 x 1024, Llama 8 x 2048). Step = gradients set to None,
forward with the model's LM loss (``labels=input_ids``), backward (with DDP's all-reduces or
FSDP2's reduce-scatters). After ``--warmup`` steps, "step ms" is the median of ``--iters`` steps
timed with CUDA events (wall clock on CPU); "peak" is ``max_memory_allocated`` during one step
minus ``memory_allocated`` just before it, the largest over ranks (on CPU: the profiler's
allocation timeline, ``remat.compat.measure_cpu_peak_bytes``). "graphs" is the
number of plans remat made on a rank (``remat.compiled_plans``); "saved" is the bytes those
plans keep for the backward, and "unsplit saved" the bytes remat's plan of the same model, not
wrapped, as one graph keeps (``remat.explain`` on one rank's batch, with the same budget). Under
DDP, "kept" is what the bucket graphs really keep: the distinct storages autograd saves during
one forward (``kept_bytes``; a tensor that two bucket graphs both save, one's output and the
next one's input, counts once, while the plans' sum counts it twice). The "split cost" is what
graph splits cost in saved bytes: DDP's kept bytes minus the unsplit plan's saved bytes
(``split_cost_plans_bytes`` is the same with the plans' sum), also given as a fraction of
remat's saving on the unsplit graph (eager autograd's saved bytes minus remat's there). Under FSDP per block remat
plans the blocks only (embeddings, head and loss run outside it), so there the split cost is
taken against the unsplit plan's saved bytes in the blocks (by module path; a value at a block
boundary counts for the block that computes it). With a budget the unsplit plan is chosen under
the same budget for the whole model as one graph, while the split model's graphs each get it
whole, so there the "split cost" also shows that a budget is per graph.

Rows run wrapper by wrapper (DDP's for every model, then FSDP2's); ``--time-limit-min`` starts no
row past that many minutes. Writes ``distributed.json`` (after every row) and ``distributed.md``
to ``--out`` (rank 0).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import remat

MODELS = ("gpt2", "llama")
WRAPPERS = ("ddp", "fsdp")
STRATEGIES = ("compile+ckpt", "remat", "remat @ckpt peak")
MiB = 2**20


# --- models --------------------------------------------------------------------------------------


def build(name: str, tiny: bool, device: torch.device, dtype: torch.dtype,
          batch: tuple[int, int] | None = None) -> tuple[nn.Module, tuple[int, int]]:
    """The seeded model (same weights on every rank) and the per-rank batch (sequences, tokens;
    ``batch`` overrides the benchmark's)."""
    import transformers

    override = batch
    torch.manual_seed(0)
    if name == "gpt2":
        kw = (dict(n_layer=2, n_embd=64, n_head=2, n_positions=64, vocab_size=512) if tiny else
              dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024))
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw, attn_implementation="sdpa"))
        batch = (2, 64) if tiny else (8, 1024)
    elif name == "llama":
        kw = (dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=512) if tiny else
              dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
                   num_key_value_heads=4, vocab_size=32000))
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw, attn_implementation="sdpa"))
        batch = (2, 64) if tiny else (8, 2048)
    else:
        raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")
    model.config.use_cache = False
    return model.to(device=device, dtype=dtype).train(), batch if override is None else override


def blocks_of(model: nn.Module) -> nn.ModuleList:
    """The repeated transformer blocks (GPT-2: ``transformer.h``; Llama: ``model.layers``)."""
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


# --- strategies under a wrapper ----------------------------------------------------------------------


def wrap(model: nn.Module, wrapper: str, strategy: str, *, budget: int | None, compile_backend: str,
         remat_backend: str, device: torch.device, bucket_cap_mb: float | None = None) -> nn.Module:
    """``model`` (changed in place) composed with ``strategy`` under ``wrapper``; returns what to call."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp_kw: dict[str, Any] = {"device_ids": [device.index]} if device.type == "cuda" else {}
    if bucket_cap_mb is not None:
        ddp_kw["bucket_cap_mb"] = bucket_cap_mb
    blocks = blocks_of(model)
    if strategy == "compile+ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if wrapper == "ddp":
            return torch.compile(DDP(model, **ddp_kw), backend=compile_backend)
        for block in blocks:
            block.compile(backend=compile_backend)
            fully_shard(block)
        fully_shard(model)
        return model
    kw = {"backend": remat_backend, "budget": budget if strategy == "remat @ckpt peak" else None}
    if wrapper == "ddp":
        return DDP(remat.checkpoint(model, **kw), **ddp_kw)
    for i, block in enumerate(blocks):
        blocks[i] = remat.checkpoint(block, **kw)
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    return model


# --- measurement -------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_step(fn: Callable, model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss = fn(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach()


def timed_ms(fn: Callable, model: nn.Module, ids: torch.Tensor, device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        one_step(fn, model, ids)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t = time.perf_counter()
    one_step(fn, model, ids)
    return (time.perf_counter() - t) * 1e3


def step_peak_bytes(fn: Callable, model: nn.Module, ids: torch.Tensor, device: torch.device) -> int | None:
    """Peak bytes allocated during one step above what was allocated before it. On CPU (smoke
    runs) from the profiler's allocation timeline (``remat.compat.measure_cpu_peak_bytes``), or
    None where the profiler's analysis fails after the step (seen under FSDP2 with gloo:
    "version mismatch"): raising on one rank only would leave the others in a collective."""
    if device.type != "cuda":
        from remat import compat

        model.zero_grad(set_to_none=True)
        try:
            return compat.measure_cpu_peak_bytes(lambda: one_step(fn, model, ids))
        except AssertionError:
            return None
    model.zero_grad(set_to_none=True)
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    one_step(fn, model, ids)
    sync(device)
    return torch.cuda.max_memory_allocated(device) - before


def saved_storage_bytes(forward: Callable[[], Any], model: nn.Module) -> tuple[int, Any]:
    """Bytes of the distinct storages autograd saves for the backward while ``forward()`` runs,
    other than ``model``'s parameters and buffers (``torch.autograd.graph.saved_tensors_hooks``):
    what the step's graphs really keep, a tensor two graphs both save counted once; and what
    ``forward()`` returned."""
    state = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in state:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    return sum(seen.values()), out


def kept_bytes(fn: Callable, model: nn.Module, ids: torch.Tensor) -> int:
    """``saved_storage_bytes`` of one LM step's forward (the step's backward runs after it)."""
    model.zero_grad(set_to_none=True)
    kept, loss = saved_storage_bytes(lambda: fn(input_ids=ids, labels=ids).loss, model)
    loss.backward()
    return kept


def max_over_ranks(value: float | None, device: torch.device) -> float | None:
    """The largest value over ranks; None if any rank has none. Every rank must call it."""
    t = torch.tensor([-1.0 if value is None else float(value), 1.0 if value is None else 0.0],
                     dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return None if t[1].item() else t[0].item()


def unsplit_plan(name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                 ids: torch.Tensor, budget: int | None) -> dict:
    """Saved bytes and graphs of remat's plan of the model alone (no wrapper: one graph), and the
    part of the saved bytes in the transformer blocks (by module path), for FSDP per block."""
    model, _ = build(name, args.tiny, device, dtype, args.batch)
    prefix = "transformer.h." if name == "gpt2" else "model.layers."
    try:
        plan = remat.explain(remat.checkpoint(model, backend=args.remat_backend), input_ids=ids, labels=ids,
                             budget=budget)
        return {"unsplit_saved_bytes": plan.saved_bytes, "unsplit_graphs": plan.graphs,
                "unsplit_eager_saved_bytes": plan.eager_saved_bytes,
                "unsplit_block_saved_bytes": sum(s.nbytes for s in plan.saved if s.module.startswith(prefix))}
    finally:
        del model
        cleanup(device)


def cleanup(device: torch.device) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(name: str, wrapper: str, strategy: str, args: argparse.Namespace, device: torch.device,
            dtype: torch.dtype, ckpt_peak: float | None) -> dict:
    rank = dist.get_rank()
    model, (batch, seq) = build(name, args.tiny, device, dtype, args.batch)
    gen = torch.Generator().manual_seed(1000 + rank)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen).to(device)
    budget = int(ckpt_peak) if strategy == "remat @ckpt peak" and ckpt_peak else None
    row: dict[str, Any] = {"model": name, "wrapper": wrapper, "strategy": strategy, "world_size": dist.get_world_size(),
                           "batch_per_rank": [batch, seq], "budget_bytes": budget}
    if strategy == "remat @ckpt peak" and budget is None:
        row["error"] = "needs compile+ckpt's measured peak first"
        return row
    fn = wrap(model, wrapper, strategy, budget=budget, compile_backend=args.compile_backend,
              remat_backend=args.remat_backend, device=device, bucket_cap_mb=args.bucket_cap_mb)
    t = time.perf_counter()
    row["loss"] = one_step(fn, model, ids).item()
    sync(device)
    row["compile_s"] = round(time.perf_counter() - t, 2)
    for _ in range(args.warmup):
        one_step(fn, model, ids)
    sync(device)
    times = [timed_ms(fn, model, ids, device) for _ in range(args.iters)]
    row["step_ms"] = round(statistics.median(times), 3)
    row["step_ms_max_over_ranks"] = max_over_ranks(row["step_ms"], device)
    peak = max_over_ranks(step_peak_bytes(fn, model, ids, device), device)
    row["peak_bytes"] = None if peak is None else int(peak)
    if strategy.startswith("remat"):
        plans = remat.compiled_plans(fn)
        row["kept_bytes"] = kept_bytes(fn, model, ids) if wrapper == "ddp" else None
        if len(remat.compiled_plans(fn)) != len(plans):  # the hooks made Dynamo recompile: not the step measured
            row["kept_bytes"] = None
        row["graphs"] = len(plans)
        row["saved_bytes"] = sum(p.saved_bytes for p in plans)
        row["eager_saved_bytes"] = sum(p.eager_saved_bytes for p in plans)
        row["predicted_peak_bytes_max_graph"] = max(p.predicted_peak_bytes for p in plans)
        del fn, model
        cleanup(device)
        row.update(unsplit_plan(name, args, device, dtype, ids, budget))
        # DDP: the same model in both; FSDP per block: remat plans the blocks only (embeddings,
        # head and loss run outside it), so compare with the unsplit plan's bytes in the blocks.
        same = row["unsplit_saved_bytes"] if wrapper == "ddp" else row["unsplit_block_saved_bytes"]
        row["split_cost_plans_bytes"] = row["saved_bytes"] - same  # a tensor two graphs save counts twice
        # DDP: what the bucket graphs keep at runtime, each storage once; FSDP: the plans' sum.
        kept = row["kept_bytes"] if wrapper == "ddp" and row["kept_bytes"] is not None else row["saved_bytes"]
        row["split_cost_bytes"] = kept - same
        saving = row["unsplit_eager_saved_bytes"] - row["unsplit_saved_bytes"]  # remat's saving, one graph
        row["split_cost_of_saving"] = round(row["split_cost_bytes"] / saving, 4) if saving > 0 else None
    return row


# --- report ------------------------------------------------------------------------------------------


def mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / MiB:.0f}" if abs(n) >= 10 * MiB else f"{n / MiB:.3f}"


def markdown(rows: list[dict]) -> str:
    lines = ["| model | wrapper | strategy | step ms | peak MiB | graphs | saved MiB (kept) "
             "| unsplit saved MiB (in blocks) | split cost MiB (of saving) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["model"], r["wrapper"], r["strategy"]]
        if "error" in r:
            lines.append("| " + " | ".join(cells + [r["error"][:100]] + [""] * 5) + " |")
            continue
        cells += [f"{r['step_ms']:.2f}", mib(r["peak_bytes"])]
        if "graphs" in r:
            cells += [str(r["graphs"]), mib(r["saved_bytes"]) + ("" if r.get("kept_bytes") is None
                                                                   else f" ({mib(r['kept_bytes'])})"),
                      f"{mib(r['unsplit_saved_bytes'])} ({mib(r['unsplit_block_saved_bytes'])})",
                      mib(r["split_cost_bytes"]) + ("" if r.get("split_cost_of_saving") is None
                                                     else f" ({r['split_cost_of_saving']:.1%})")]
        else:
            cells += ["-"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write(rows: list[dict], meta: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "distributed.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(out, "distributed.md"), "w") as f:
        f.write(markdown(rows))


# --- main --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--wrappers", nargs="+", default=list(WRAPPERS), choices=WRAPPERS)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--tiny", action="store_true",
                        help="tiny configs in float32 with uncompiled backends: a CPU smoke run (gloo)")
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; tiny: eager)")
    parser.add_argument("--remat-backend", default=None, choices=["inductor", "eager"],
                        help="remat's backend (default inductor; tiny: eager)")
    parser.add_argument("--batch", type=int, nargs=2, default=None, metavar=("SEQUENCES", "TOKENS"),
                        help="per-rank batch instead of the benchmark's (GPT-2 8 1024, Llama 8 2048)")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                        help="default: bf16 on GPUs, fp32 on CPU")
    parser.add_argument("--time-limit-min", type=float, default=None,
                        help="start no row after this many minutes (the rows left are listed as not run)")
    parser.add_argument("--bucket-cap-mb", type=float, default=None,
                        help="DDP's bucket_cap_mb (default: DDP's, 25; at least 1)")
    parser.add_argument("--ckpt-peak-mib", type=float, default=None,
                        help="budget of 'remat @ckpt peak' when compile+ckpt is not measured in this run "
                             "(e.g. from an earlier run's JSON, per model and wrapper: run them one at a time)")
    parser.add_argument("--out", default=None, help="directory for distributed.json and distributed.md")
    args = parser.parse_args(argv)
    args.compile_backend = args.compile_backend or ("eager" if args.tiny else "inductor")
    args.remat_backend = args.remat_backend or ("eager" if args.tiny else "inductor")

    cuda = torch.cuda.is_available() and not args.tiny
    if cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device, dtype = torch.device("cuda", local_rank), torch.bfloat16
    else:
        device, dtype = torch.device("cpu"), torch.float32
    if args.dtype:
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    rank = dist.get_rank()
    import transformers

    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "world_size": dist.get_world_size(),
            "device": torch.cuda.get_device_name(device) if cuda else "cpu", "dtype": str(dtype),
            "compile_backend": args.compile_backend, "remat_backend": args.remat_backend, "tiny": args.tiny,
            "warmup": args.warmup, "iters": args.iters, "bucket_cap_mb": args.bucket_cap_mb,
            "time_limit_min": args.time_limit_min,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    rows: list[dict] = []
    deadline = None if args.time_limit_min is None else time.monotonic() + 60 * args.time_limit_min
    for wrapper in args.wrappers:  # wrapper first: DDP's rows (the split cost) for every model come first
        for name in args.models:
            ckpt_peak = None if args.ckpt_peak_mib is None else args.ckpt_peak_mib * MiB
            for strategy in args.strategies:
                # every rank takes the same decision (a rank left alone in a row's collectives would hang)
                late = max_over_ranks(float(deadline is not None and time.monotonic() > deadline), device)
                if late:
                    row = {"model": name, "wrapper": wrapper, "strategy": strategy,
                           "error": f"not run: --time-limit-min {args.time_limit_min} reached"}
                else:
                    try:
                        row = measure(name, wrapper, strategy, args, device, dtype, ckpt_peak)
                    except Exception as e:  # noqa: BLE001 - record it (OOM, infeasible budget) and go on
                        row = {"model": name, "wrapper": wrapper, "strategy": strategy,
                               "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
                        if rank == 0:
                            traceback.print_exc()
                if strategy == "compile+ckpt" and row.get("peak_bytes"):
                    ckpt_peak = row["peak_bytes"]
                cleanup(device)
                rows.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
                    if args.out:
                        write(rows, meta, args.out)
    if rank == 0:
        print(markdown(rows))
    with contextlib.suppress(Exception):
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
