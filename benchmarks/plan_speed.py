"""Planning speed on a deep transformer's joint graph (CPU, no compilation).

    python benchmarks/plan_speed.py --blocks 24

Times, for the joint graph of a ``blocks``-deep GPT (the gpt workload's block), the whole
default planning step (analysis, CSE, policy, min-cut, plan) and the full frontier (the same
plus every hull vertex and its predicted peak), median of ``--repeats`` runs. Prints a table
and writes JSON to ``--out`` if given.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
import torch.nn as nn
import workloads

from remat import planner
from remat.options import Options


def capture_joint(blocks: int):
    """The joint graph AOTAutograd hands to the partitioner, with its arguments."""
    from remat import compat
    from remat.inductor.decompositions import decomposition_table

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="eager", choices=["eager", "inductor"],
                        help="whose peak model scores the plans (inductor: remat.fusion's kernels)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
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
