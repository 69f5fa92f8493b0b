"""Row chunks in the joint graph: a row region (``remat.analysis.rows``, Note [Row chunks]) run
one slice of rows at a time.

``chunk_rows`` returns a copy of the joint graph in which every op of each region is computed
once per slice of rows (named ``<op>_c<k>``): row inputs are sliced (views), whole inputs read as
they are, tensor factories made slice-sized, row outputs concatenated where an op outside the
region (or the graph's output) reads them, and row sums added slice by slice (in float32 when the
parts are of lower precision: each part rounds once to its own dtype, where the unsliced matmul
rounded the total once). The copy is ordered slice by slice: all of slice 0's ops of one half
(forward or backward) before slice 1's, placed where the region's last op of that half was, so
that the simulator (``remat.core.peak``) and the partition see one slice's wide tensors alive at
a time; the plan then decides per slice what to save and what to recompute
(``remat.planning.planner``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import torch
import torch.fx as fx

from .. import compat
from ..analysis.halves import is_tangent
from ..analysis.ops import op_name
from ..analysis.rows import CHUNK_OF, SUM, Region, Rows, chunk_of, pad_pairs, row_regions, slice_dim
from ..chunking import Chunking
from ..errors import RematError
from ..plan_data import RowChunks

__all__ = ["CHUNK_OF", "chunk_of", "chunk_rows", "chunkable", "describe"]

def chunkable(gm: fx.GraphModule, chunking: Chunking | None) -> list[tuple[Region, int]]:
    """The regions of ``gm`` with the number of slices each is cut into; empty when none is
    worth cutting (or ``chunking`` is None)."""
    if chunking is None:
        return []
    return [(r, k) for r in row_regions(gm) if (k := chunking.count(r.rows, r.widest_bytes)) >= 2]


def _flat_dim(d: int, rows: Rows) -> int:
    """Where dim ``d`` of a tensor with ``rows`` is once its row dims are one dim."""
    if d < rows.dims[0]:
        return d
    if d <= rows.dims[-1]:
        return rows.dims[0]
    return d - (len(rows.dims) - 1)


def _flat_shape(shape: tuple[int, ...], rows: Rows, size: int) -> list[int]:
    return [*shape[:rows.dims[0]], size, *shape[rows.dims[-1] + 1:]]


def _flat_pad(pad: list[int], rank: int, rows: Rows) -> list[int]:
    """``constant_pad_nd``'s ``pad`` for the tensor once its row dims are one dim (rows unpadded,
    ``remat.analysis.rows._within_rows``)."""
    flat = {_flat_dim(d, rows): p for d, p in pad_pairs(pad, rank).items() if d not in rows.dims}
    out: list[int] = []
    for d in range(rank - len(rows.dims), min(flat, default=rank) - 1, -1):
        out += flat.get(d, (0, 0))
    return out


def _shape(n: fx.Node) -> tuple[int, ...]:
    return tuple(n.meta["val"].shape)


# Note [Wide outputs computed whole]
# A wide tensor the forward returns (an HF model's logits, beside its loss) must exist whole.
# Concatenated from the slices, it would be alive twice at the end of the forward: every slice
# (the concatenation reads them all) and the result. So the forward computes it a second time,
# whole, as the graph as captured did (the head's matmul from the whole hidden states), and the
# slices feed the loss and the backward alone: one more matmul in the forward, against a
# logits-sized buffer less at the forward's peak (HF Llama at 87,552 tokens: 5.3 GiB).


# Note [Row sums of matmuls]
# A matmul that contracts the rows (the head's weight gradient, ``grad^T @ h``) is summed over the
# slices as a chain of ``addmm``: slice k adds its product to the sum of slices before it, in one
# extern kernel that stores the sum, so one sum is alive and each slice's product never is. Added
# as pointwise ops instead, the parts are inlined by Inductor into one expression that reads
# every part (``remat.backends.inductor.fusion.realization``): under the Inductor model, HF Llama
# at 2,048 rows in 16 slices held 13 of its 62.5 MiB parts at once, 1,742 MiB against the graph's
# own 1,021 MiB. The sum is kept in the matmul's dtype, as fused linear-cross-entropy kernels keep
# it: in bf16 it rounds once per slice where the whole matmul rounded once. Other row sums (a
# loss, a bias gradient) are small and are added pointwise, in float32 below it (``_sum_exit``).


class _Builder:
    """Builds the chunked copy of one joint graph."""

    def __init__(self, gm: fx.GraphModule, regions: list[tuple[Region, int]]):
        self.gm = gm
        self.old = list(gm.graph.nodes)
        self.pos = {n: i for i, n in enumerate(self.old)}
        self.by_name = {n.name: n for n in self.old}
        self.member: dict[fx.Node, tuple[Region, int]] = {}
        for r, k in regions:
            for name in r.layout:
                self.member[self.by_name[name]] = (r, k)
        backward: set[fx.Node] = set()
        for n in self.old:
            if is_tangent(n) or any(a in backward for a in n.all_input_nodes):
                backward.add(n)
        self.backward = backward
        self.anchor: dict[tuple[str, bool], int] = {}
        for n, (r, _) in self.member.items():
            half = (r.seed, n in backward)
            self.anchor[half] = max(self.anchor.get(half, -1), self.pos[n])
        self.graph = fx.Graph()
        self.env: dict[fx.Node, fx.Node] = {}
        self.copies: dict[tuple[fx.Node, int], fx.Node] = {}
        self.views: dict[tuple[fx.Node, object], fx.Node] = {}
        self.key: dict[fx.Node, tuple] = {}
        self.like = next(n.meta["val"] for n in self.old if isinstance(n.meta.get("val"), torch.Tensor))

    # -- nodes ----------------------------------------------------------------------------------

    def _add(self, target: Callable, args: tuple, kwargs: dict, name: str, key: tuple,
             meta_from: fx.Node | None = None) -> fx.Node:
        vals = fx.map_arg((args, kwargs), lambda a: a.meta["val"])
        node = self.graph.create_node("call_function", target, args, kwargs, name=name)
        if meta_from is not None:
            node.meta = {k: v for k, v in meta_from.meta.items() if k not in ("val", "tensor_meta")}
        node.meta["val"] = compat.fake_value(target, vals[0], vals[1], self.like)  # versions.HOOKS["fake_value"]
        self.key[node] = key
        return node

    def _half_key(self, n: fx.Node, *rest) -> tuple:
        r, _ = self.member[n]
        return (self.anchor[(r.seed, n in self.backward)], 1, *rest)

    # -- inputs of a slice ------------------------------------------------------------------------

    def _slice_input(self, a: fx.Node, rows: Rows, k: int, start: int, stop: int, consumer: fx.Node) -> fx.Node:
        """Slice ``k`` (rows ``start:stop``) of ``a``, an input the region reads by rows."""
        if a in self.member:
            return self.copies[(a, k)]
        src = self.env[a]
        shape = _shape(a)
        if len(rows.dims) > 1:
            key = (a, ("flat", rows.dims))
            if key not in self.views:
                self.views[key] = self._add(torch.ops.aten.view.default,
                                            (src, _flat_shape(shape, rows, math.prod(shape[d] for d in rows.dims))),
                                            {}, f"{a.name}_rows", (self.pos[a], 0, 1))
            src = self.views[key]
        key = (a, ("slice", rows.dims, k))
        if key not in self.views:
            self.views[key] = self._add(torch.ops.aten.slice.Tensor, (src, rows.dims[0], start, stop), {},
                                        f"{a.name}_s{k}", self._half_key(consumer, k, -1))
        return self.views[key]

    def _broadcast_input(self, a: fx.Node, n: fx.Node, out_rows: Rows) -> fx.Node:
        """``a`` read whole by an elementwise op whose output has ``out_rows``: when ``a`` spans
        several of the row dims (all of size 1), they become one."""
        src = self.env[a] if a not in self.member else None
        if src is None or len(out_rows.dims) < 2 or not isinstance(n.meta.get("val"), torch.Tensor):
            return src
        shape = _shape(a)
        off = len(_shape(n)) - len(shape)
        covered = [d - off for d in out_rows.dims if d - off >= 0]
        if len(covered) < 2:
            return src
        key = (a, ("bcast", tuple(covered)))
        if key not in self.views:
            new_shape = [*shape[:covered[0]], 1, *shape[covered[-1] + 1:]]
            self.views[key] = self._add(torch.ops.aten.view.default, (src, new_shape), {}, f"{a.name}_b",
                                        (self.pos[a], 0, 1))
        return self.views[key]

    # -- one slice of one op ----------------------------------------------------------------------

    def _copy(self, n: fx.Node, r: Region, k: int, start: int, stop: int) -> fx.Node:
        size = stop - start
        lay = r.layout[n.name]
        ins = r.inputs[n.name]

        def arg(a: object) -> object:
            if not isinstance(a, fx.Node):
                return a
            la = ins.get(a.name)
            if isinstance(la, Rows):
                return self._slice_input(a, la, k, start, stop, n)
            if a in self.member:
                return self.copies[(a, k)]
            return self._broadcast_input(a, n, lay) if isinstance(lay, Rows) else self.env[a]

        args = list(fx.map_arg(n.args, arg))
        kwargs = dict(fx.map_arg(n.kwargs, arg))
        target = n.target
        name = op_name(n)
        x = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        lin = ins.get(x.name) if x is not None else None
        if name in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default"):
            args[1] = _flat_shape(_shape(n), lay, size)
        elif name in ("aten.full.default", "aten.zeros.default", "aten.ones.default", "aten.empty.memory_format"):
            args[0] = _flat_shape(_shape(n), lay, size)
        elif name in ("aten.permute.default", "aten.t.default", "aten.transpose.int"):
            target, args = torch.ops.aten.permute.default, [args[0], self._flat_perm(n, lin, lay)]
        elif name == "aten.sum.default":
            pass
        elif name in ("aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default", "aten.mean.dim",
                      "aten.logsumexp.default", "aten.any.dims", "aten.any.dim", "aten.prod.dim_int"):
            dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
            rank = len(_shape(x))
            single = isinstance(dims, int)
            dims = [dims] if single else list(dims or range(rank))
            flat = sorted({_flat_dim(d % rank, lin) for d in dims})
            new = flat[0] if single and len(flat) == 1 else flat
            if len(n.args) > 1:
                args[1] = new
            else:
                kwargs["dim"] = new
        elif name in ("aten.gather.default", "aten.scatter.value", "aten.scatter.src"):
            args[1] = _flat_dim(n.args[1] % len(_shape(x)), lin)
        elif name == "aten.unsqueeze.default":
            args[1] = _flat_dim(n.args[1] % len(_shape(n)), lay)
        elif name == "aten.squeeze.dim":
            args[1] = _flat_dim(n.args[1] % len(_shape(x)), lin)
        elif name == "aten.slice.Tensor":
            new = _flat_dim(slice_dim(n) % len(_shape(x)), lin)
            if len(n.args) > 1:
                args[1] = new
            else:
                kwargs["dim"] = new
        elif name == "aten.constant_pad_nd.default":
            args[1] = _flat_pad(list(n.args[1]), len(_shape(x)), lin)
        elif name == "aten.squeeze.dims":
            args[1] = sorted({_flat_dim(d % len(_shape(x)), lin) for d in n.args[1]})
        if lay is SUM and name == "aten.mm.default" and k > 0:  # Note [Wide outputs computed whole]
# A wide tensor the forward returns (an HF model's logits, beside its loss) must exist whole.
# Concatenated from the slices, it would be alive twice at the end of the forward: every slice
# (the concatenation reads them all) and the result. So the forward computes it a second time,
# whole, as the graph as captured did (the head's matmul from the whole hidden states), and the
# slices feed the loss and the backward alone: one more matmul in the forward, against a
# logits-sized buffer less at the forward's peak (HF Llama at 87,552 tokens: 5.3 GiB).


# Note [Row sums of matmuls]
            target, args = torch.ops.aten.addmm.default, [self.copies[(n, k - 1)], *args]
        node = self._add(target, tuple(args), kwargs, f"{n.name}_c{k}", self._half_key(n, k, self.pos[n]), n)
        node.meta[CHUNK_OF] = (r.seed, k)
        if node.meta.get("seq_nr") is not None:  # one eager kernel per slice (provenance.decomposed_key)
            node.meta["seq_nr"] = f"{node.meta['seq_nr']}/c{k}"
        return node

    def _flat_perm(self, n: fx.Node, lin: Rows, lay: Rows) -> list[int]:
        x = n.args[0]
        rank = len(_shape(x))
        name = op_name(n)
        if name == "aten.permute.default":
            perm = [d % rank for d in n.args[1]]
        elif name == "aten.t.default":
            perm = [1, 0] if rank == 2 else [0]
        else:
            d0, d1 = n.args[1] % rank, n.args[2] % rank
            perm = list(range(rank))
            perm[d0], perm[d1] = perm[d1], perm[d0]
        out = []
        for j, src in enumerate(perm):
            if j in lay.dims[1:]:
                continue
            out.append(_flat_dim(src, lin))
        return out

    # -- what leaves a region ---------------------------------------------------------------------

    def _exit(self, n: fx.Node, r: Region, count: int) -> fx.Node:
        lay = r.layout[n.name]
        parts = [self.copies[(n, k)] for k in range(count)]
        if lay is SUM and op_name(n) == "aten.mm.default":
            return parts[-1]  # the chain of addmm (Note [Row sums of matmuls])
        if lay is SUM:
            return self._sum_exit(n, parts)
        cat = self._add(torch.ops.aten.cat.default, (parts, lay.dims[0]), {}, f"{n.name}_rows",
                        (self.anchor[(r.seed, n in self.backward)], 2, self.pos[n]), n)
        if len(lay.dims) > 1:
            cat = self._add(torch.ops.aten.view.default, (cat, list(_shape(n))), {}, f"{n.name}_whole",
                            (self.anchor[(r.seed, n in self.backward)], 2, self.pos[n], 1), n)
        return cat

    def _whole(self, n: fx.Node) -> fx.Node:
        """``n`` computed whole, as the graph as captured computes it, from the region's inputs:
        a wide forward output (Note [Wide outputs computed whole])."""
        if n not in self.member:
            return self.env[n]
        if n not in self.env:
            new = self.graph.node_copy(n, self._whole)
            self.env[n] = new
            self.key[new] = (self.pos[n], 0, 0)
        return self.env[n]

    def _sum_exit(self, n: fx.Node, parts: list[fx.Node]) -> fx.Node:
        dtype = n.meta["val"].dtype
        wider = dtype in (torch.bfloat16, torch.float16)
        conv = torch.ops.prims.convert_element_type.default
        acc = None
        seed = chunk_of(parts[0])[0]
        for k, p in enumerate(parts):
            key = self._half_key(n, k, self.pos[n], 1)
            if wider:
                p = self._add(conv, (p, torch.float32), {}, f"{n.name}_f{k}", key, n)
                p.meta[CHUNK_OF] = (seed, k)
            if acc is not None:  # each slice's sum stored before the next: one accumulator, not all parts
                acc = self._add(torch.ops.aten.add.Tensor, (acc, p), {}, f"{n.name}_acc{k}", (*key, 1), n)
                acc.meta[CHUNK_OF] = (seed, k)
            else:
                acc = p
        if wider:
            acc = self._add(conv, (acc, dtype), {}, f"{n.name}_sum", self._half_key(n, len(parts), -1), n)
        if tuple(acc.meta["val"].shape) != _shape(n):  # a kept row dim: one of size 1 per original row dim
            acc = self._add(torch.ops.aten.view.default, (acc, list(_shape(n))), {}, f"{n.name}_whole",
                            self._half_key(n, len(parts), 0), n)
        return acc

    # -- the whole graph ----------------------------------------------------------------------------

    def build(self) -> fx.GraphModule:
        pending: dict[fx.Node, tuple[Region, int]] = {}
        for n in self.old:
            if n in self.member:
                r, count = self.member[n]
                step = math.ceil(r.rows / count)
                for k in range(count):
                    self.copies[(n, k)] = self._copy(n, r, k, k * step, min(r.rows, (k + 1) * step))
                pending[n] = (r, count)
                continue
            for a in n.all_input_nodes:
                if a in pending and a not in self.env:
                    wide = a.name in pending[a][0].wide and n.op == "output" and a not in self.backward
                    self.env[a] = self._whole(a) if wide else self._exit(a, *pending[a])
            new = self.graph.node_copy(n, lambda a: self.env[a])
            self.env[n] = new
            self.key[new] = (self.pos[n], 0, 0)
        self._order()
        self.graph.lint()
        out = fx.GraphModule(self.gm, self.graph)
        out.meta = dict(self.gm.meta)
        return out

    def _order(self) -> None:
        """Reorders the graph by priority (``key``), inputs first (Kahn's algorithm)."""
        nodes = [n for n in self.graph.nodes if n.op not in ("placeholder", "output")]
        indeg = {n: sum(1 for a in n.all_input_nodes if a.op != "placeholder") for n in nodes}
        seq = {n: i for i, n in enumerate(nodes)}
        heap = [(self.key[n], seq[n], n) for n in nodes if indeg[n] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, _, n = heapq.heappop(heap)
            order.append(n)
            for u in n.users:
                if u in indeg:
                    indeg[u] -= 1
                    if indeg[u] == 0:
                        heapq.heappush(heap, (self.key[u], seq[u], u))
        if len(order) != len(nodes):
            raise RematError("remat: internal error: the row-chunked graph has a cycle (please report)")
        output = self.graph.find_nodes(op="output")[0]
        for n in order:
            output.prepend(n)


def chunk_rows(gm: fx.GraphModule, regions: list[tuple[Region, int]]) -> fx.GraphModule:
    """A copy of joint graph ``gm`` with each ``(region, count)`` computed in ``count`` slices of
    rows (module docstring); ``gm`` is unchanged."""
    return _Builder(gm, regions).build()


def describe(regions: list[tuple[Region, int]]) -> tuple[RowChunks, ...]:
    """What ``print(plan)`` says of each region a plan runs in slices."""
    return tuple(RowChunks(r.seed, r.rows, k, len(r.layout), r.wide_bytes) for r, k in regions)
