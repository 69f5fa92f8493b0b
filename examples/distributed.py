"""FSDP2 with remat per block: a small Hugging Face Llama (random weights) trained a few steps.

    torchrun --nproc-per-node 2 examples/distributed.py [--steps N] [--backend eager|inductor]

torchtitan's order with remat in place of activation checkpointing + torch.compile: each decoder
layer is wrapped by ``remat.checkpoint``, then ``fully_shard`` is applied to each layer and to
the root. Runs on CPU with gloo and on GPUs with nccl (one GPU per process, bf16). Prints the
loss of every step, the plan of each layer (``plan.summary()``), whether every rank chose the
same plans, and the peak memory of a step (CUDA ``max_memory_allocated``; n/a on CPU).
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist

import remat
from remat.distributed import fingerprint
from remat.plan import format_bytes


def build_model(device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
                         attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)  # the same random weights on every rank
    return LlamaForCausalLM(config).to(device=device, dtype=dtype)


def shard_with_remat(model: torch.nn.Module, backend: str) -> None:
    """remat per decoder layer, then fully_shard per layer and on the root (in place)."""
    from torch.distributed.fsdp import fully_shard

    layers = model.model.layers
    for i, layer in enumerate(layers):
        layers[i] = remat.checkpoint(layer, backend=backend)
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--backend", choices=["eager", "inductor"], default=None,
                        help="remat's backend (default: inductor on GPUs, eager on CPU, where Inductor compiles C++)")
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank")
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    if cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device, dtype = torch.device("cuda", local_rank), torch.bfloat16
    else:
        device, dtype = torch.device("cpu"), torch.float32
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = args.backend or ("inductor" if cuda else "eager")

    model = build_model(device, dtype)
    shard_with_remat(model, backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own data
    vocab = model.config.vocab_size
    peak = None
    for step in range(args.steps):
        tokens = torch.randint(0, vocab, (args.batch, args.seq), generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step {step}: loss {mean.item() / world:.4f} (mean over {world} ranks)")

    plans = [remat.compiled_plans(layer) for layer in model.model.layers]
    mine = [fingerprint(p) for per_layer in plans for p in per_layer]
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        for i, per_layer in enumerate(plans):
            for k, plan in enumerate(per_layer):
                print(f"\nlayer {i}, graph {k} (fingerprint {fingerprint(plan)}):")
                print(plan.summary())
        agree = all(fps == every[0] for fps in every)
        print(f"\nevery rank chose the same plans: {agree} ({len(mine)} graphs)")
        print(f"peak memory of a step (rank 0): {format_bytes(peak) if peak is not None else 'n/a on CPU'}")
    del model, opt, plans
    gc.collect()  # and what Dynamo's traces left that refers to them, before the group (README: Tearing down)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
