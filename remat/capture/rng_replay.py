"""Recomputing random ops exactly: the forward saves the generator state each recomputed random
op drew from, and the backward replays it.

Note [Replayed random ops]
A random op recomputed in the backward would draw fresh numbers: a dropout mask unlike the
forward's, and wrong gradients. Per-block checkpointing (``torch.utils.checkpoint``, and
torch.compile's partitioner in checkpointed regions) replays the generator state instead, and so
does remat, for the random ops that run as a kernel of their own and draw from their device's
default generator alone (``OpFacts.is_replayable``: attention with dropout, whose fused kernels
on CUDA keep the dropout inside; ``native_dropout``, which the uncompiled backend keeps whole).
Without it, attention with dropout was saved whatever the budget: on HF GPT-2 (dropout 0.1) on
the H100 remat's smallest plan predicted 3.03 GiB against compile + checkpointing's measured
1.86 GiB (``benchmarks/README.md``, section "0.8x compile+ckpt's peak on the H100").

``insert_rng_replay`` rewrites the partitioned halves: each such op the backward computes (its
name, or for a nested plan's copy the name it copies, ``remat.planning.nesting.copy_of``, is the
forward's) runs in the forward under ``run_and_save_rng_state``, which returns the generator
state it started from with the op's outputs; the state becomes one more saved value (a host
tensor: the CUDA generator's seed and offset, 16 bytes; the CPU generator's whole state, 5,056
bytes); the backward runs the op under ``run_with_rng_state`` from that state, which restores
the generator after, so the random stream is consumed exactly as without remat. Both are torch's
operators (``versions.HOOKS["rng_replay"]``); Inductor runs them as fallback kernels around the
op, which is an extern kernel already. Any other random op the backward would compute is an
internal error (the partition falls back to autograd's), never wrong gradients; one nobody
reads (the backward's extraction copies every op it can compute) is erased. The states are
not counted in the predicted peak (host memory on CUDA; on a CPU, 5,056 bytes per replayed op).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import compat
from ..analysis.op_facts import op_facts
from ..planning.nesting import copy_of

__all__ = ["insert_rng_replay"]


def _random(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is not operator.getitem and op_facts(node).is_random


def _dead(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``node`` (of ``gm``) is read by nothing but unread getitems; then it and they are
    erased. The backward's extraction copies every op it can compute from its inputs, and fx
    keeps random ops nobody reads (they are impure): such a copy would draw numbers for nothing."""
    if any(u.target is not operator.getitem or u.users for u in node.users):
        return False
    for u in list(node.users):
        gm.graph.erase_node(u)
    gm.graph.erase_node(node)
    return True


def _state_val(like: fx.Node) -> torch.Tensor | None:
    """A fake value for the generator state of ``like``'s device, in the fake mode of its value."""
    val = like.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    t = next((v for v in vals if isinstance(v, torch.Tensor)), None)
    mode = getattr(t, "fake_mode", None)
    if t is None:
        return None
    with compat.real_tensors():
        state = torch.cuda.get_rng_state(t.device) if t.device.type == "cuda" else torch.get_rng_state()
    return mode.from_tensor(state) if mode is not None else state


def insert_rng_replay(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> int:
    """Rewrite ``fw`` and ``bw`` so that every random op ``bw`` recomputes replays the generator
    state its forward run drew from (Note [Replayed random ops]); the number of forward ops
    replayed. Raises ``RuntimeError`` for a random op ``bw`` computes that cannot replay."""
    fw_nodes = {n.name: n for n in fw.graph.nodes}
    # the forward's random ops the backward computes again (a backward op of its own, such as
    # attention's backward with dropout, draws nothing: it reads the forward's seed and offset)
    recomputed = [n for n in bw.graph.nodes if _random(n) and (copy_of(n) or n.name) in fw_nodes]
    recomputed = [n for n in recomputed if not _dead(n, bw)]
    if not recomputed:
        return 0
    ops = compat.rng_replay_ops()
    pairs: list[tuple[fx.Node, fx.Node]] = []
    for n in recomputed:
        source = fw_nodes[copy_of(n) or n.name]
        if ops is None or not op_facts(n).is_replayable or source.target != n.target:
            raise RuntimeError(f"remat: internal error, the backward recomputes the random op {n.name!r} "
                               f"({n.target}) and cannot replay the numbers its forward drew; please report")
        pairs.append((source, n))
    run_and_save, run_with = ops
    out = fw.graph.find_nodes(op="output")[0]
    outputs = list(out.args[0])
    n_sym = 0
    while n_sym < len(outputs) - num_fwd_outputs and compat.is_sym(getattr(outputs[-1 - n_sym], "meta", {}).get("val")):
        n_sym += 1
    n_saved = len(outputs) - num_fwd_outputs - n_sym
    placeholders = bw.graph.find_nodes(op="placeholder")
    # the backward's inputs: saved symbols, saved tensors, then tangents (``compat.extract_fwd_bwd``)
    last_saved = placeholders[n_sym + n_saved - 1] if n_sym + n_saved else None
    states: dict[fx.Node, fx.Node] = {}
    new_outputs: list[fx.Node] = []
    for source, n in pairs:
        if source not in states:
            with fw.graph.inserting_before(source):
                both = fw.graph.call_function(run_and_save, (source.target, *source.args), dict(source.kwargs))
                state = fw.graph.call_function(operator.getitem, (both, 0))
                result = fw.graph.call_function(operator.getitem, (both, 1))
            state.meta["val"] = _state_val(source)
            both.meta["val"] = (state.meta["val"], source.meta.get("val"))
            result.meta = dict(source.meta)
            source.replace_all_uses_with(result)
            fw.graph.erase_node(source)
            new_outputs.append(state)
            if last_saved is None:
                with bw.graph.inserting_before(placeholders[0] if placeholders else None):
                    ph = bw.graph.placeholder(f"rng_state_{len(states)}")
            else:
                with bw.graph.inserting_after(last_saved):
                    ph = bw.graph.placeholder(f"rng_state_{len(states)}")
            ph.meta["val"] = state.meta["val"]
            last_saved = ph
            states[source] = ph
        with bw.graph.inserting_before(n):
            replayed = bw.graph.call_function(run_with, (states[source], n.target, *n.args), dict(n.kwargs))
        replayed.meta = dict(n.meta)
        n.replace_all_uses_with(replayed)
        bw.graph.erase_node(n)
    k = num_fwd_outputs + n_saved
    out.args = (tuple(outputs[:k] + new_outputs + outputs[k:]),)
    for gm in (fw, bw):
        gm.graph.lint()
        gm.recompile()
    return len(states)
