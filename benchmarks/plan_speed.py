"""Planning speed (CPU, no compilation): how long ``remat.planning.planner.plan_joint_graph`` takes.

    python benchmarks/plan_speed.py --blocks 24
    python benchmarks/plan_speed.py --models gpt2,llama,vit,resnet50 [--budgets default,0.75,0.5,0.3]
        [--profile gpt2:0.5] [--fingerprints before.json] [--check before.json] [--offload auto]

``--blocks``: for the joint graph of a ``blocks``-deep GPT (the gpt workload's block), the whole
default planning step (analysis, CSE, policy, min-cut, plan) and the full frontier (the same
plus every hull vertex and its predicted peak), median of ``--repeats`` runs.

``--models``: the joint graphs of the real-model families at their benchmark sizes
(``benchmarks/real_models.py``; graph size does not depend on the batch, so the batch is small,
but large enough that the budgets are feasible): HF GPT-2 124M and HF Llama (hidden 1024, 12
layers, SDPA) from ``transformers``, and ViT-B/16 and ResNet-50 built here layer for layer (timm
and torchvision have no wheels for the CPU torch). Each is captured once through
``remat.explain`` (the same partition path a compile takes; the joint graph is grabbed where the
planner receives it), then planned again for each budget with the Inductor peak model.
``--fingerprints`` writes each plan's fingerprint (the
chosen plan, its saved values and the frontier); ``--check`` compares with such a file and
exits 1 on any difference. ``--profile model:budget`` prints cProfile's top functions.
``--offload auto`` plans with ``offload="auto"`` over a host link of ``--link-gbs`` GB/s (the CPU
has none, so the planner is given a GPU's): under a budget the candidates then carry their
offloads, and some their ladders of more (Note [Offload under a budget]).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import dataclasses
import hashlib
import json
import os
import pathlib
import pstats
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import remat
from remat.capture import partition
from remat.options import Options
from remat.planning import planner

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: `zoo`
from zoo import workloads  # noqa: E402
from zoo.standins import ResNet50, ViTB16  # noqa: E402

MODELS = ("gpt2", "llama", "vit", "resnet50")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def capture_joint(blocks: int):
    """The joint graph AOTAutograd hands to the partitioner, with its arguments."""
    from remat import compat
    from remat.backends.inductor.decompositions import decomposition_table

    grabbed = {}

    def part(gm, joint_inputs, *, num_fwd_outputs, static_lifetime_input_indices=None, **_):
        grabbed["args"] = (copy.deepcopy(gm), num_fwd_outputs, list(static_lifetime_input_indices or []))
        return compat.default_partition(gm, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                        static_lifetime_input_indices=static_lifetime_input_indices)

    backend = compat.aot_autograd(fw_compiler=lambda g, _: compat.make_boxed_func(g.forward),
                                  partition_fn=part, decompositions=decomposition_table())
    torch.manual_seed(0)
    model = nn.Sequential(*[workloads.GptBlock(64, 4, 256) for _ in range(blocks)])
    x = torch.randn(2, 16, 64, requires_grad=True)
    torch.compile(model, backend=backend)(x)
    return grabbed["args"]


def timed(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


# ---------------------------------------------------------------------------------------------
# Real-model families


class _Step(nn.Module):
    """The step's loss as one module (so that remat captures the loss too)."""

    def __init__(self, net: nn.Module, hf: bool):
        super().__init__()
        self.net, self.hf = net, hf

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.hf:  # the LM loss written out: the models' own loss breaks the graph under Dynamo
            logits = self.net(input_ids=x, use_cache=False).logits
            return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
        return F.cross_entropy(self.net(x), y)


def build_model(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``name`` (``MODELS``) at its benchmark size, seeded, with a small batch."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if name in ("gpt2", "llama"):
        import transformers

        if name == "gpt2":
            cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024,
                                          attn_implementation="sdpa")
            net = transformers.GPT2LMHeadModel(cfg)
        else:
            cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                                           num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                                           attn_implementation="sdpa")
            net = transformers.LlamaForCausalLM(cfg)
        ids = torch.randint(0, cfg.vocab_size, (4, 1024) if name == "gpt2" else (2, 1024), generator=gen)
        return _Step(net.train(), hf=True), (ids, ids)
    net = ViTB16() if name == "vit" else ResNet50()
    x = torch.randn(32, 3, 224, 224, generator=gen)
    y = torch.randint(0, 1000, (x.shape[0],), generator=gen)
    return _Step(net.train(), hf=False), (x, y)


@dataclasses.dataclass
class Captured:
    name: str
    gm: torch.fx.GraphModule
    args: tuple
    kwargs: dict
    explain_plan_s: float
    """The planner's own seconds inside ``remat.explain`` (default options), all graphs."""
    graphs: int
    """How many graphs explain planned (the largest is kept)."""


def capture_model(name: str) -> Captured:
    """``name``'s largest joint graph, grabbed where ``remat.explain``'s partition hands it to
    the planner."""
    model, inputs = build_model(name)
    grabbed: dict = {"s": 0.0, "n": 0}
    real = partition.plan_joint_graph

    def grab(gm, *args, **kwargs):
        grabbed["n"] += 1
        if "gm" not in grabbed or len(gm.graph.nodes) > len(grabbed["gm"].graph.nodes):
            grabbed.update(gm=copy.deepcopy(gm), args=args, kwargs=kwargs)
        t = time.perf_counter()
        try:
            return real(gm, *args, **kwargs)
        finally:
            grabbed["s"] += time.perf_counter() - t

    partition.plan_joint_graph = grab
    try:
        remat.explain(remat.checkpoint(model), *inputs)
    finally:
        partition.plan_joint_graph = real
    return Captured(name, grabbed["gm"], grabbed["args"], grabbed["kwargs"], grabbed["s"], grabbed["n"])


def plan_with(c: Captured, budget: str, offload: bool | str = False) -> planner.Planned:
    """Plan ``c``'s joint graph (a copy) with ``budget`` (``default``: none) and ``offload``, as
    the partition would."""
    nfo, static, options, want_frontier, backend = c.args
    options = dataclasses.replace(options, budget=None if budget == "default" else float(budget), offload=offload)
    return planner.plan_joint_graph(copy.deepcopy(c.gm), nfo, static, options, want_frontier, backend, **c.kwargs)


def fingerprint(planned: planner.Planned) -> dict:
    """What must not change when planning gets faster: the chosen plan (every field), its saved
    values, and the frontier's plans."""

    def digest(x) -> str:  # source lines name files under this checkout: not part of the plan
        return hashlib.sha256(repr(x).replace(ROOT, "<root>").encode()).hexdigest()[:16]

    return {"saved": sorted(s.name for s in planned.plan.saved), "plan": digest(dataclasses.astuple(planned.plan)),
            "frontier": [digest(dataclasses.astuple(p)) for p in planned.frontier or ()]}


def run_models(args) -> None:
    budgets = args.budgets.split(",")
    profile = dict(p.split(":") for p in args.profile.split(",")) if args.profile else {}
    rows, prints = [], {}
    copy_s = {}
    for name in args.models.split(","):
        t = time.perf_counter()
        c = capture_model(name)
        capture_s = time.perf_counter() - t
        copy_s[name] = timed(lambda: copy.deepcopy(c.gm), args.repeats)
        print(f"{name}: {len(c.gm.graph.nodes)} joint nodes ({c.graphs} graph(s)); captured in {capture_s:.1f} s "
              f"(planning inside explain {c.explain_plan_s:.2f} s)", flush=True)
        for b in budgets:
            res = {}

            def once(b=b, res=res):
                try:
                    res["p"] = plan_with(c, b, args.offload)
                except remat.InfeasibleBudgetError as e:  # the planning ran; nothing fits
                    res["p"] = e

            secs = timed(once, args.repeats) - copy_s[name]
            p = res["p"]
            ok = isinstance(p, planner.Planned)
            prints[f"{name}:{b}"] = fingerprint(p) if ok else {"infeasible": str(p)}
            rows.append({"model": name, "budget": b, "joint_nodes": len(c.gm.graph.nodes), "plan_s": secs,
                         "frontier_points": len(p.frontier or ()) if ok else None})
            what = f"{len(p.plan.saved)} saved, {len(p.frontier or ())} frontier plans" if ok else "infeasible"
            print(f"  budget {b:>7}: {secs:7.2f} s  ({what})", flush=True)
            if profile.get(name) == b:
                prof = cProfile.Profile()
                prof.enable()
                once()
                prof.disable()
                pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    if args.fingerprints:
        with open(args.fingerprints, "w") as f:
            json.dump(prints, f, indent=2, sort_keys=True)
    if args.check:
        with open(args.check) as f:
            want = json.load(f)
        bad = [k for k in prints if k in want and want[k] != prints[k]]
        print(f"plans compared with {args.check}: {len(prints)} checked, {len(bad)} differ {bad}")
        if bad:
            sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--models", default=None, help=f"comma-separated, of {MODELS}")
    parser.add_argument("--budgets", default="default,0.75,0.5,0.3")
    parser.add_argument("--offload", default=False, choices=[False, "auto", "all"],
                        type=lambda v: v if v != "off" else False,
                        help="--models: plan with offload= ('off', 'auto', 'all'), over a host link of --link-gbs")
    parser.add_argument("--link-gbs", type=float, default=25.0,
                        help="with --offload: the host link's GB/s each way, as a GPU's (the CPU has none)")
    parser.add_argument("--profile", default=None, help="model:budget[,model:budget]: cProfile that run")
    parser.add_argument("--fingerprints", default=None, help="write each plan's fingerprint here (JSON)")
    parser.add_argument("--check", default=None, help="compare fingerprints with this file; exit 1 if any differ")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="eager", choices=["eager", "inductor"],
                        help="whose peak model scores the plans (inductor: remat.fusion's kernels)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.offload:  # the CPU is its own host: give the planner a GPU's link, so that offloading saves memory
        from remat.core.offload import Link
        from remat.planning import offload as planning_offload

        link = Link(d2h=args.link_gbs * 1e9, h2d=args.link_gbs * 1e9)
        planning_offload.host_link = lambda device: link
    if args.models:
        run_models(args)
        return
    gm, nfo, static = capture_joint(args.blocks)
    nodes = len(gm.graph.nodes)
    opts = Options(backend=args.backend)
    plan_s = timed(lambda: planner.plan_joint_graph(copy.deepcopy(gm), nfo, static, opts), args.repeats)
    res = {}

    def frontier():
        res["p"] = planner.plan_joint_graph(copy.deepcopy(gm), nfo, static, opts, want_frontier=True)

    frontier_s = timed(frontier, args.repeats)
    copy_s = timed(lambda: copy.deepcopy(gm), args.repeats)
    row = {"blocks": args.blocks, "backend": args.backend, "joint_nodes": nodes, "plan_s": plan_s - copy_s,
           "frontier_s": frontier_s - copy_s, "frontier_points": len(res["p"].frontier)}
    print(f"{args.blocks}-block gpt joint graph ({args.backend} peak model): {nodes} nodes; "
          f"default plan {row['plan_s']:.2f} s; "
          f"full frontier ({row['frontier_points']} plans) {row['frontier_s']:.2f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(row, f, indent=2)


if __name__ == "__main__":
    main()
