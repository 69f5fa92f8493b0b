"""The step the peak simulator replays (``remat.core.peak.Schedule``), built from a joint graph:
every node in graph order with its inputs, the bytes it allocates, the storage it aliases, which
half computes it; the backend adds the facts its step model reads (``Backend.workspace``, ``Backend.step_model``).
For eager autograd's schedule, the intermediates of decomposed eager kernels take no memory
(Note [Eager kernels])."""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from ..core.peak import Schedule
from ..planning.nesting import copy_of
from . import cost
from .halves import Halves, is_tangent, is_unsent
from .op_facts import op_facts, view_root
from .provenance import decomposed_key

if TYPE_CHECKING:
    from ..backends.base import Backend

__all__ = ["step_schedule"]


def _inside_eager_kernels(nodes: list[fx.Node], roots: list[fx.Node], outs: set[fx.Node]) -> set[fx.Node]:
    """Note [Eager kernels]: the joint graph is traced with decompositions, so one eager kernel
    (``gelu_backward``, ``native_layer_norm_backward``) appears as several ops whose
    intermediates eager autograd never allocates: the kernel computes them in registers. A
    value every user of which comes from the same eager op (``decomposed_key``), which no
    other op's view reads, and which the graph does not return, lives only inside that kernel.
    Eager autograd's predicted peak (``Plan.eager_peak_bytes``) gives it no bytes. Measured with
    the CPU profiler (versions.HOOKS["eager_kernels"]): a two-block ViT's eager peak, 9.68 MiB, was predicted at 11.71
    MiB with these intermediates (the decomposed GELU backward's), 9.68 without."""
    inside = set()
    for n in nodes:
        k = decomposed_key(n)
        if k is not None and n not in outs and n.users and all(decomposed_key(u) == k for u in n.users):
            inside.add(n)
    escaping = {r for n, r in zip(nodes, roots) if r is not n and n not in inside}
    return inside - escaping


def _eager_kernels(nodes: list[fx.Node]) -> tuple[int, ...]:
    """The eager kernel call of each node (``Schedule.kernel``): one number per
    ``decomposed_key``, -1 for a node that is its own op."""
    kernel: dict[tuple[str, str], int] = {}
    return tuple(kernel.setdefault(k, len(kernel)) if (k := decomposed_key(n)) is not None else -1
                 for n in nodes)


def replay_state_bytes(node: fx.Node) -> int:
    """The bytes of device memory the generator state of ``node`` takes where the backward
    recomputes it by replaying that state (``Schedule.replay_state``): a CPU generator's state
    (``torch.get_rng_state``, 5,056 bytes) on a CPU; 0 on CUDA, whose state is a host tensor, and
    for every op that does not replay."""
    if not _replays(node):
        return 0
    val = node.meta.get("val")
    first = val[0] if isinstance(val, (tuple, list)) and val else val
    if not isinstance(first, torch.Tensor) or first.device.type != "cpu":
        return 0
    return _cpu_state_bytes()


def _replay_of(nodes: list[fx.Node], ids: dict[fx.Node, int]) -> tuple[int, ...]:
    """``Schedule.replay_of``: each replayable random op itself, a nested plan's copy of one its
    original (``remat.planning.nesting.copy_of``), -1 for the rest."""
    by_name = {n.name: i for n, i in ids.items()}
    out = []
    for n in nodes:
        out.append(by_name.get(copy_of(n) or n.name, -1) if _replays(n) else -1)
    return tuple(out)


def _replays(node: fx.Node) -> bool:
    """Whether ``node`` is a random op the backward recomputes by replaying its generator state."""
    return node.op == "call_function" and node.target is not operator.getitem and op_facts(node).is_replayable


@functools.cache
def _cpu_state_bytes() -> int:
    return torch.get_rng_state().numel()


def _loss_in_graph(tangents: list[fx.Node]) -> bool:
    """Whether the graph computes the loss: a scalar output's gradient is a tangent."""
    return any(getattr(n.meta.get("val"), "ndim", None) == 0 for n in tangents)


def step_schedule(gm: fx.GraphModule, h: Halves, backend: Backend | None, eager_kernels: bool = False,
                  ends_at_break: bool = False) -> tuple[Schedule, dict[fx.Node, int]]:
    """The schedule of ``gm`` and the schedule id of each of its nodes (``analyze``'s arguments)."""
    primals = set(h.primals)
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    ids = {n: i for i, n in enumerate(nodes)}
    roots = []
    for n in nodes:
        r = view_root(n) if n.op == "call_function" else n
        roots.append(r if r in ids else n)
    outs = {a for a in (*h.fwd_outs, *h.bwd_outs) if isinstance(a, fx.Node)}
    inside = _inside_eager_kernels(nodes, roots, outs) if eager_kernels else set()
    tangents = [n for n in nodes if is_tangent(n)]
    loss_in_graph = _loss_in_graph(tangents)
    if eager_kernels and loss_in_graph:
        # Eager autograd has gradients only for what the loss reads: the other outputs'
        # zero-filled gradients are AOTAutograd's (Note [What the caller holds]).
        inside |= {n for n in tangents if getattr(n.meta.get("val"), "ndim", None) != 0}
    nbytes = []
    for n, r in zip(nodes, roots):
        own = r is n and n not in primals and n not in inside and not isinstance(n.meta.get("val"), (tuple, list))
        # a gradient never sent has no bytes (Note [Gradients the caller does not send])
        own = own and not (is_tangent(n) and is_unsent(n))
        nbytes.append(cost.nbytes(n.meta.get("val")) if own and n.op != "get_attr" else 0)
    return Schedule(
        inputs=tuple(tuple(ids[a] for a in n.all_input_nodes if a in ids) for n in nodes),
        nbytes=tuple(nbytes),
        root=tuple(ids[r] for r in roots),
        graph_input=frozenset(ids[n] for n in nodes if n in primals or n.op == "get_attr"),
        tangent=frozenset(ids[n] for n in tangents),
        backward=frozenset(ids[n] for n in h.backward if n in ids),
        fwd_outputs=tuple(ids[a] for a in h.fwd_outs if isinstance(a, fx.Node) and a in ids),
        bwd_outputs=tuple(ids[a] for a in h.bwd_outs if isinstance(a, fx.Node) and a in ids),
        names=tuple(n.name for n in nodes),
        kernel=_eager_kernels(nodes) if eager_kernels else (),
        caller_keeps_outputs=not (loss_in_graph or ends_at_break),
        workspace=backend.workspace(nodes) if backend is not None else (),
        replay_state=tuple(replay_state_bytes(n) for n in nodes),
        replay_of=_replay_of(nodes, ids),
        model=backend.step_model(gm, nodes) if backend is not None else None,
    ), ids
