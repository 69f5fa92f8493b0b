"""Row regions: the parts of a joint graph that can run in chunks of rows.

Note [Row chunks]
An LM head widens each row (token) from the model's width ``d`` to the vocabulary ``V``: its
logits, their float copy, the log-softmax and their gradients are ``V`` wide, tens of times the
rows that go in (``h``, ``[N, d]``) and come out (``dh``). Every op between ``h`` and the loss
treats rows independently (pointwise ops, reductions along ``V``, a gather of each row's
target), the loss sums over rows, and the backward mirrors it, ending in ``dh`` (rows) and the
head's weight gradient (a matmul that sums over rows). Such a region computes the same values
when it runs on a slice of rows at a time, with its row-summed results added up over the slices:
only one slice of the wide tensors is alive at once, and what crosses the forward/backward
boundary (what the plan saves or recomputes) is per slice, so a plan can recompute one slice's
logits just before that slice's backward. This is rematerialization at a finer grain, the
fused linear-cross-entropy kernels' idea, found from the graph and not from a model's names.

``row_regions`` finds them by propagating a *row layout* along the graph's edges from each
*widening matmul* (``mm(a, w)`` whose output row is at least ``WIDENING`` times ``a``'s):
which consecutive dims of each tensor index the ``N`` rows (``Rows``), a row-summed result
(``SUM``: a full reduction, or a matmul contracting the rows), an input used whole by every
slice (``BROADCAST``: a weight, a scalar), or a tensor factory that can be made slice-sized
(``FACTORY``). An op joins only when a rule below says how its slice is computed; anything else
(random ops, attention, ops mixing rows) stops the propagation. The region is the connected set
of *wide* tensors (a row of at least ``WIDE`` times the widening matmul's input row) around the
widening matmul, the narrow ops on paths between them (a softmax's row statistics), and the
row sums they feed. Its narrow inputs are sliced (views), its narrow row outputs concatenated,
its sums added (``remat.planning.chunking`` rewrites the graph).

Shapes must be static: a symbolic row count is left unchunked.

Note [Padded matmuls in a row region]
On a GPU Inductor pads a matmul whose dims are not multiples of the alignment before the
partitioner sees the graph (``pad_mm``): ``mm(h, pad(W))[:, :V]``, and in the backward the
logits' gradient padded for both of the head's gradient matmuls. Slicing or padding dims other
than the rows keeps rows independent, so these ops join the region; without them the region
stopped at the slice, nothing was chunked, and HF GPT-2 (50,257 words, padded to 50,264) kept
its whole float32 log-probabilities: its smallest plan on an H100 predicted 3.53 GiB, read from
Inductor's memory plan at 3.52 GiB, against compile + per-block checkpointing's 1.86 GiB. With
them, its plan at that peak measured 1,886 MiB (predicted 1,885) against checkpointing's 1,900,
its head and loss in 8 slices (benchmarks/README.md). Padding that touches the rows (a row count
not a multiple of the alignment) stops the region.

Note [Narrow results stored per slice]
A narrow result the region hands on (a gather of each row's log-probability) is concatenated
from its slices. Inductor computes an element-wise value where it is read, so the concatenation,
after the last slice, would read every slice's logits: under its model, a 4,096-row head of
16,384 words held all 16 slices' logits at the end of the forward (128 MiB against a slice's
8 MiB). So the element-wise ops after such a result belong to the region up to the reduction that
stores them (the loss's sum over rows, itself a row sum added over the slices); a matmul's or a
reduction's narrow result is stored where it runs and is concatenated as it is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..compat import OpOverload
from .ops import RANDOM_OPS, op_name

__all__ = ["Rows", "SUM", "BROADCAST", "FACTORY", "Layout", "Region", "row_regions", "WIDENING", "WIDE", "CHUNK_OF",
           "chunk_of", "pad_pairs", "slice_dim"]

CHUNK_OF = "remat_row_chunk"
"""``node.meta`` key of an op a row-chunked graph computes for one slice (``remat.planning.chunking``):
``(seed, k)``, its region's widening matmul and the slice."""


def chunk_of(node: fx.Node) -> tuple[str, int] | None:
    """The region and slice ``node`` computes a part of (``CHUNK_OF``), or None."""
    return node.meta.get(CHUNK_OF)


WIDENING = 8
"""A matmul widens rows when its output row has at least this many times its input row's bytes
(LM heads: 31x for Llama's 32,000 / 1,024, 65x for GPT-2; a transformer MLP's up-projection is
2.75-4x, a vision classifier's head under 2x)."""

WIDE = 4
"""A tensor of the region is wide when its row has at least this many times the bytes of the
widening matmul's input row."""


@dataclass(frozen=True, slots=True)
class Rows:
    """The consecutive dims of a tensor that index the region's rows, in row-major order."""

    dims: tuple[int, ...]

    def shifted(self, by: int) -> Rows:
        return Rows(tuple(d + by for d in self.dims))


class _Tag(str):
    pass


SUM = _Tag("sum")
"""A result summed over the rows: each slice computes its part, the parts are added."""
BROADCAST = _Tag("broadcast")
"""An input every slice reads whole (it carries no rows)."""
FACTORY = _Tag("factory")
"""A tensor factory (``full``) whose slice is made at the slice's size."""

Layout = Rows | _Tag


@dataclass(frozen=True)
class Region:
    """One row region of a joint graph (Note [Row chunks])."""

    rows: int
    """N, the number of rows."""
    seed: str
    """The widening matmul the region grew from."""
    layout: dict[str, Layout]
    """Every node of the region by name: its output's ``Rows`` (a factory's: the rows its readers
    see), or ``SUM``."""
    inputs: dict[str, dict[str, Layout]]
    """For every node of the region, the layout each of its tensor inputs is read with
    (``Rows`` for a row input, ``BROADCAST`` for a whole one), by input name."""
    wide_bytes: int
    """Bytes of the region's wide tensors (what no longer lives at once)."""
    wide: frozenset[str] = frozenset()
    """The names of its wide tensors."""
    widest_bytes: int = 0
    """Bytes of its largest wide tensor."""


def _shape(n: object) -> tuple[int, ...] | None:
    val = n.meta.get("val") if isinstance(n, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    if any(not isinstance(s, int) for s in val.shape):
        return None
    return tuple(val.shape)


def _nbytes(n: fx.Node) -> int:
    val = n.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def _tensor_inputs(n: fx.Node) -> list[fx.Node]:
    return [a for a in n.all_input_nodes if _shape(a) is not None]


def _norm(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _consecutive(dims: Iterable[int]) -> bool:
    ds = list(dims)
    return bool(ds) and ds == list(range(ds[0], ds[0] + len(ds)))


# --- rules: given what is known of a node's and its inputs' layouts, all of them, or None ---------

Known = dict[fx.Node, Layout]
Assignment = dict[fx.Node, Layout]

_IDENTITY = {"aten.alias.default", "aten.detach.default", "aten.clone.default", "aten._to_copy.default",
             "prims.convert_element_type.default", "aten.lift_fresh_copy.default"}
_REDUCTIONS = {"aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default", "aten.mean.dim",
               "aten.logsumexp.default", "aten.any.dims", "aten.any.dim", "aten.prod.dim_int"}
_SUMMABLE = {"aten.sum.dim_IntList", "aten.sum.default"}
_FACTORIES = {"aten.full.default", "aten.zeros.default", "aten.ones.default", "aten.empty.memory_format"}


def _rows_of(x: Layout | None) -> Rows | None:
    return x if isinstance(x, Rows) else None


def _elementwise(n: fx.Node, known: Known, rows: int) -> Assignment | None:
    """Pointwise ops (broadcasting), identity-like copies and ``expand``: the output's row dims,
    right-aligned, are each row input's; other inputs must not vary along them."""
    out = _shape(n)
    ins = _tensor_inputs(n)
    lo = _rows_of(known.get(n))
    if lo is None:
        for a in ins:
            li = _rows_of(known.get(a))
            if li is not None:
                off = len(out) - len(_shape(a))
                cand = li.shifted(off)
                if all(0 <= d < len(out) and out[d] == _shape(a)[d - off] for d in cand.dims):
                    lo = cand
                    break
    if lo is None or math.prod(out[d] for d in lo.dims) != rows:
        return None
    got: Assignment = {n: lo}
    for a in ins:
        s = _shape(a)
        off = len(out) - len(s)
        di = [d - off for d in lo.dims]
        if all(d >= 0 for d in di) and all(s[d] == out[d + off] for d in di):
            lay: Layout = Rows(tuple(di))
        elif all(d < 0 or s[d] == 1 for d in di):
            lay = BROADCAST
        else:
            return None
        if known.get(a) not in (None, lay):
            return None
        got[a] = lay
    return got


def _view(n: fx.Node, known: Known, rows: int) -> Assignment | None:
    """A view with the rows leading (after size-1 dims) on both sides."""
    x = n.args[0]
    si, so = _shape(x), _shape(n)

    def group(shape: tuple[int, ...]) -> Rows | None:
        j = 0
        while j < len(shape) and shape[j] == 1:
            j += 1
        k, p = j, 1
        while k < len(shape) and p < rows:
            p *= shape[k]
            k += 1
        return Rows(tuple(range(j, k))) if p == rows and k > j else None

    gi, go = group(si), group(so)
    if gi is None or go is None:
        return None
    if known.get(x) not in (None, gi) or known.get(n) not in (None, go):
        return None
    return {x: gi, n: go}


def _permute(n: fx.Node, known: Known, rows: int) -> Assignment | None:
    x = n.args[0]
    rank = len(_shape(x))
    name = op_name(n)
    if name == "aten.permute.default":
        perm = [_norm(d, rank) for d in n.args[1]]
    elif name == "aten.t.default":
        perm = [1, 0] if rank == 2 else [0]
    else:  # transpose.int
        d0, d1 = _norm(n.args[1], rank), _norm(n.args[2], rank)
        perm = list(range(rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    li, lo = _rows_of(known.get(x)), _rows_of(known.get(n))
    if li is not None:
        out_dims = [perm.index(d) for d in li.dims]
        if not _consecutive(out_dims):
            return None
        cand = Rows(tuple(out_dims))
        if lo not in (None, cand):
            return None
        return {x: li, n: cand}
    if lo is not None:
        in_dims = [perm[d] for d in lo.dims]
        if not _consecutive(in_dims):
            return None
        return {x: Rows(tuple(in_dims)), n: lo}
    return None


def _reduction(n: fx.Node, known: Known, rows: int) -> Assignment | None:
    x = n.args[0]
    rank = len(_shape(x))
    name = op_name(n)
    if name == "aten.sum.default":
        li = _rows_of(known.get(x))
        return {x: li, n: SUM} if li is not None else None
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    dims = [dims] if isinstance(dims, int) else list(dims or range(rank))
    dims = sorted(_norm(d, rank) for d in dims)
    keep = bool(n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False))
    kept = [d for d in range(rank) if d not in dims]
    li, lo = _rows_of(known.get(x)), known.get(n)
    if li is None and isinstance(lo, Rows):
        li = Rows(lo.dims if keep else tuple(kept[d] for d in lo.dims))
        if not _consecutive(li.dims):
            return None
    if li is None:
        return None
    if not set(li.dims) & set(dims):
        out = li if keep else Rows(tuple(d - sum(r < d for r in dims) for d in li.dims))
        return {x: li, n: out} if lo in (None, out) else None
    if set(li.dims) <= set(dims) and name in _SUMMABLE:
        return {x: li, n: SUM}
    return None


def _matmul(n: fx.Node, known: Known, rows: int) -> Assignment | None:
    name = op_name(n)
    if name == "aten.addmm.default":
        bias, a, b = n.args[:3]
    else:
        bias, (a, b) = None, n.args[:2]
    la, lb, lo = known.get(a), known.get(b), known.get(n)
    sa, sb = _shape(a), _shape(b)
    if Rows((0,)) in (la, lo) and sa[0] == rows:
        got = {a: Rows((0,)), b: BROADCAST, n: Rows((0,))}
    elif Rows((1,)) in (lb, lo) and sb[1] == rows:
        got = {a: BROADCAST, b: Rows((1,)), n: Rows((1,))}
    elif (la == Rows((1,)) or lb == Rows((0,))) and sa[1] == rows and sb[0] == rows:
        if bias is not None:
            return None
        return {a: Rows((1,)), b: Rows((0,)), n: SUM}
    else:
        return None
    if bias is not None:
        sbias = _shape(bias)
        if sbias is None or (len(sbias) == 2 and sbias[0] != 1 and got[n] == Rows((0,))):
            return None
        got[bias] = BROADCAST
    if any(known.get(k) not in (None, v) for k, v in got.items()):
        return None
    return got


def _indexing(n: fx.Node, known: Known, rows: int) -> Assignment | None:
    """``gather(x, dim, index)``, ``scatter(x, dim, index, value|src)``: rows shared by every
    tensor, ``dim`` not among them."""
    x, dim = n.args[0], n.args[1]
    rank = len(_shape(x))
    ins = _tensor_inputs(n)
    lay = next((known[a] for a in (n, *ins) if isinstance(known.get(a), Rows)), None)
    if lay is None or _norm(dim, rank) in lay.dims:
        return None
    if any(len(_shape(a)) != rank for a in ins):
        return None
    got: Assignment = {n: lay}
    for a in ins:
        if any(_shape(a)[d] != _shape(n)[d] for d in lay.dims):
            return None
        got[a] = lay
    if any(known.get(k) not in (None, v) for k, v in got.items()):
        return None
    return got


def _unsqueeze(n: fx.Node, known: Known, rows: int) -> Assignment | None:
    x = n.args[0]
    rank_out = len(_shape(n))
    name = op_name(n)
    li, lo = _rows_of(known.get(x)), _rows_of(known.get(n))
    if name == "aten.unsqueeze.default":
        d = _norm(n.args[1], rank_out)
        to_out = lambda i: i + (1 if i >= d else 0)
        to_in = lambda o: o - (1 if o > d else 0)
        if (lo and d in lo.dims) or (li and d in [to_out(i) for i in li.dims][1:]):
            return None
    else:  # squeeze.dim / squeeze.dims
        rank_in = len(_shape(x))
        ds = n.args[1] if len(n.args) > 1 else list(range(rank_in))
        ds = [ds] if isinstance(ds, int) else list(ds)
        ds = [_norm(d, rank_in) for d in ds if _shape(x)[_norm(d, rank_in)] == 1]
        keep = [i for i in range(rank_in) if i not in ds]
        to_out = lambda i: keep.index(i)
        to_in = lambda o: keep[o]
        if li and any(i in ds for i in li.dims):
            return None
    if li is not None:
        out = Rows(tuple(to_out(i) for i in li.dims))
    elif lo is not None:
        li = Rows(tuple(to_in(o) for o in lo.dims))
        out = lo
    else:
        return None
    if not _consecutive(out.dims) or not _consecutive(li.dims) or lo not in (None, out):
        return None
    return {x: li, n: out}


def pad_pairs(pad: list[int], rank: int) -> dict[int, tuple[int, int]]:
    """``constant_pad_nd``'s ``pad`` (pairs from the last dim backwards) by dim: what each dim
    gains (or, negative, loses) before and after."""
    return {rank - 1 - i: (pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)}


def slice_dim(n: fx.Node) -> int:
    """The dim an ``aten.slice.Tensor`` node slices, as written (it may be negative)."""
    return n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)


def _within_rows(n: fx.Node, known: Known, rows: int) -> Assignment | None:
    """``slice`` along, or ``constant_pad_nd`` of, dims other than the rows: each row's result is
    the op on that row alone. Inductor pads a misaligned matmul so (``pad_mm``: GPT-2's 50,257-word
    head runs 50,264 wide on a GPU, its logits a slice of the result, the logits' gradient padded
    for the backward's matmuls): Note [Padded matmuls in a row region]."""
    x = n.args[0]
    si, so = _shape(x), _shape(n)
    if si is None or len(si) != len(so):
        return None
    rank = len(si)
    if op_name(n) == "aten.slice.Tensor":
        touched = {_norm(slice_dim(n), rank)}
    else:
        touched = {d for d, p in pad_pairs(list(n.args[1]), rank).items() if any(p)}
    li, lo = _rows_of(known.get(x)), _rows_of(known.get(n))
    lay = li or lo
    if lay is None or set(lay.dims) & touched or li not in (None, lay) or lo not in (None, lay):
        return None
    if math.prod(so[d] for d in lay.dims) != rows:
        return None
    return {x: lay, n: lay}


def _factory(n: fx.Node, known: Known, rows: int) -> Assignment | None:
    lo = _rows_of(known.get(n))
    return {n: FACTORY} if lo is not None else None


def _rule(n: fx.Node):
    name = op_name(n)
    if n.op != "call_function" or name in RANDOM_OPS or _shape(n) is None:
        return None
    if isinstance(n.target, OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags:
        return None
    if name in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"):
        return _view
    if name in ("aten.permute.default", "aten.t.default", "aten.transpose.int"):
        return _permute
    if name in _REDUCTIONS or name == "aten.sum.default":
        return _reduction
    if name in ("aten.mm.default", "aten.addmm.default"):
        return _matmul
    if name in ("aten.gather.default", "aten.scatter.value", "aten.scatter.src"):
        return _indexing
    if name in ("aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims"):
        return _unsqueeze
    if name in _FACTORIES:
        return _factory
    if name in ("aten.slice.Tensor", "aten.constant_pad_nd.default"):
        return _within_rows
    if name in _IDENTITY or name == "aten.expand.default":
        return _elementwise
    target = n.target
    if isinstance(target, OpOverload) and torch.Tag.pointwise in target.tags:
        return _elementwise
    return None


# --- the search ---------------------------------------------------------------------------------


def _widening(n: fx.Node) -> bool:
    if op_name(n) not in ("aten.mm.default", "aten.addmm.default"):
        return False
    a = n.args[1] if op_name(n) == "aten.addmm.default" else n.args[0]
    sa, so = _shape(a), _shape(n)
    if sa is None or so is None or len(sa) != 2:
        return False
    ratio = (so[1] * n.meta["val"].element_size()) / (sa[1] * a.meta["val"].element_size())
    return ratio >= WIDENING


def _propagate(seed: fx.Node, rows: int) -> tuple[Known, dict[fx.Node, Assignment]]:
    """Row layouts reachable from the widening matmul ``seed``: each node's layout and the
    assignment its rule made (for the nodes a rule admitted)."""
    a = seed.args[1] if op_name(seed) == "aten.addmm.default" else seed.args[0]
    known: Known = {}
    assigned: dict[fx.Node, Assignment] = {}
    start = _matmul(seed, {a: Rows((0,))}, rows)
    if start is None:
        return known, assigned
    known.update(start)
    assigned[seed] = start
    work = [seed, *start]
    blocked: set[fx.Node] = set()
    while work:
        v = work.pop()
        if known.get(v) is SUM:
            continue  # a row sum carries no rows on
        for u in (v, *v.users, *v.all_input_nodes):
            if u in assigned or u in blocked or u.op != "call_function":
                continue
            rule = _rule(u)
            got = rule(u, known, rows) if rule is not None else None
            if got is None:
                continue
            if any(isinstance(known.get(k), Rows) and known[k] != lay and isinstance(lay, Rows)
                   for k, lay in got.items()):
                blocked.add(u)
                continue
            assigned[u] = got
            work.append(u)
            for k, lay in got.items():
                if lay is BROADCAST:
                    known.setdefault(k, BROADCAST)
                elif k not in known or known[k] is BROADCAST:
                    known[k] = lay
                    work.append(k)
    return known, assigned


def _grow(seed: fx.Node, known: Known, assigned: dict[fx.Node, Assignment], wide_row: float) -> set[fx.Node]:
    """The region around ``seed``: wide row tensors connected to it, the narrow row ops on paths
    between them, factories only they read, and the row sums they feed."""
    rows_nodes = {n for n in assigned if isinstance(assigned[n][n], Rows)}
    rows_of = {n: assigned[n][n] for n in rows_nodes}
    wide = {n for n in rows_nodes if _nbytes(n) >= wide_row * _rows_total(n, rows_of)}
    region = _component(seed, wide)
    while True:
        down = _reach(region, rows_nodes, forward=True)
        up = _reach(region, rows_nodes, forward=False)
        bridges = (down & up) - region
        grown = _component(seed, wide | region | bridges)
        if grown == region:
            break
        region = grown
    # the ops that narrow a wide tensor (a row statistic, a gather, dh's matmul) run per slice too,
    # so that only their narrow results are concatenated
    region |= {u for n in region for u in n.users if u in rows_nodes}
    # and a narrow result computed element by element from a wide one (a gather of the
    # log-probabilities) is followed to the reduction that stores it (the loss's sum): Inductor
    # computes such a value where it is read, and a concatenation at the end of the forward read
    # every slice's logits there, all of them alive (Note [Narrow results stored per slice])
    region |= _to_reduction(region, rows_nodes | {n for n in assigned if assigned[n][n] is SUM})
    factories = {u for n in region for u in n.all_input_nodes
                 if assigned.get(u, {}).get(u) is FACTORY and all(w in region for w in u.users)}
    sums = {u for n in region for u in n.users if u in assigned and assigned[u][u] is SUM}
    return region | factories | sums


def _stores(n: fx.Node) -> bool:
    """Whether ``n`` stores its result (a matmul or a reduction), not computed where it is read."""
    name = op_name(n)
    return name in _REDUCTIONS or name in ("aten.sum.default", "aten.mm.default", "aten.addmm.default")


def _to_reduction(region: set[fx.Node], within: set[fx.Node]) -> set[fx.Node]:
    """The ops after ``region``'s narrow element-wise exits, up to the reductions they reach
    (``within`` the row-aligned ops), on paths that end in one."""
    starts = {n for n in region if not _stores(n) and any(u not in region for u in n.users)}
    seen: set[fx.Node] = set()
    work = [u for n in starts for u in n.users if u in within and u not in region]
    while work:
        v = work.pop()
        if v in seen:
            continue
        seen.add(v)
        if not _stores(v):
            work.extend(u for u in v.users if u in within and u not in region)
    ends = {v for v in seen if _stores(v)}
    return ends | (_reach(ends, seen, forward=False) & seen)


def _rows_total(n: fx.Node, rows_of: dict[fx.Node, Rows]) -> float:
    s = _shape(n)
    return math.prod(s[d] for d in rows_of[n].dims)


def _component(seed: fx.Node, nodes: set[fx.Node]) -> set[fx.Node]:
    if seed not in nodes:
        return {seed}
    seen, work = {seed}, [seed]
    while work:
        v = work.pop()
        for u in (*v.users, *v.all_input_nodes):
            if u in nodes and u not in seen:
                seen.add(u)
                work.append(u)
    return seen


def _reach(start: set[fx.Node], within: set[fx.Node], forward: bool) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    work = list(start)
    while work:
        v = work.pop()
        for u in (v.users if forward else v.all_input_nodes):
            if u in within and u not in seen and u not in start:
                seen.add(u)
                work.append(u)
    return seen


def row_regions(gm: fx.GraphModule) -> list[Region]:
    """The row regions of joint graph ``gm`` (Note [Row chunks]), in graph order of their
    widening matmuls; a node belongs to at most one region."""
    taken: set[fx.Node] = set()
    out: list[Region] = []
    for seed in gm.graph.nodes:
        if seed in taken or not _widening(seed):
            continue
        a = seed.args[1] if op_name(seed) == "aten.addmm.default" else seed.args[0]
        rows = _shape(a)[0]
        known, assigned = _propagate(seed, rows)
        if seed not in assigned:
            continue
        wide_row = WIDE * _nbytes(a) / rows
        region = _grow(seed, known, assigned, wide_row) - taken
        region = {n for n in region if n in assigned}
        # a region whose wide tensors all leave it (a weight gradient's matmul and its views) has
        # nothing to keep from living whole
        inside = [n for n in region if isinstance(assigned[n][n], Rows) and _nbytes(n) >= wide_row * rows
                  and all(u in region for u in n.users)]
        if not inside:
            continue
        taken |= region
        order = [n for n in gm.graph.nodes if n in region]
        inputs = {n.name: {a.name: assigned[n][a] for a in _tensor_inputs(n) if a in assigned[n]} for n in order}
        out.append(Region(
            rows=rows, seed=seed.name,
            layout={n.name: known[n] if assigned[n][n] is FACTORY else assigned[n][n] for n in order},
            inputs=inputs,
            wide_bytes=sum(_nbytes(n) for n in order if isinstance(assigned[n][n], Rows)
                           and _nbytes(n) >= wide_row * rows),
            wide=frozenset(n.name for n in order if isinstance(assigned[n][n], Rows) and _nbytes(n) >= wide_row * rows),
            widest_bytes=max((_nbytes(n) for n in order if isinstance(assigned[n][n], Rows)), default=0),
        ))
    return out

