"""Minimum s-t cut by Boykov-Kolmogorov max-flow, step for step networkx's. Pure Python: no torch.

``source_side(g, s, t)`` is ``nx.minimum_cut(G, s, t, flow_func=boykov_kolmogorov)[1][0]`` for
the ``nx.DiGraph`` ``G`` whose adjacency is ``g`` (``{u: {v: attrs}}``, an edge without a
``capacity`` attribute infinite), and returns the same set. See Note [Max-flow without networkx].
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from operator import itemgetter
from typing import Any

__all__ = ["source_side", "Recut", "Residual"]

# Note [Max-flow without networkx]
# The planner cuts one flow network per hull weight, per checkpoint set and per nested plan:
# dozens of max-flows on networks of ~20,000 edges. With networkx, one cut of ResNet-50's joint
# graph took 0.64 s under cProfile: 0.28 s to build the ``nx.DiGraph`` and its residual network
# (two more ``add_edge`` per edge), 0.42 s of flow reading attribute dictionaries through views
# at every step. Here the
# residual network is built as networkx builds it (``build_residual_network``: the same vertices,
# edges, capacities and "infinite" value, in the same order) into flat lists, and networkx's
# Boykov-Kolmogorov (``boykov_kolmogorov_impl``) runs on them unchanged (but for counts kept
# beside its queue of active vertices, which test membership and remove a vertex in O(1); the
# queue yields the same vertices in the same order): the same search order,
# the same arithmetic on the same numbers (flows kept as networkx keeps them, ``capacity - flow``
# recomputed at each test), so the flow, and the saturated edges the cut is read from, are the
# same to the bit; floats included. The source side is then read as ``nx.minimum_cut`` reads it:
# the vertices that cannot reach the sink through unsaturated edges. (The minimum cut it names
# does not depend on which maximum flow is found, in exact arithmetic; with float capacities the
# same steps are what keeps it the same.) ``tests/core/test_solver.py`` compares both on random
# networks, with networkx as the oracle.


def _edges(g: dict[Hashable, dict[Hashable, dict]]) -> list[tuple[Hashable, Hashable, dict]]:
    """The edges networkx's ``build_residual_network`` keeps (no loops, no zero capacities), in
    ``G.edges`` order."""
    inf = float("inf")
    return [(u, v, a) for u, nbrs in g.items() for v, a in nbrs.items() if u != v and a.get("capacity", inf) > 0]


def _big(edge_list: list[tuple[Hashable, Hashable, dict]]) -> Any:
    """networkx's finite stand-in for an infinite capacity: three times the finite ones' sum."""
    inf = float("inf")
    return 3 * sum(a["capacity"] for _, _, a in edge_list if "capacity" in a and a["capacity"] != inf) or 1


class Residual:
    """networkx's ``build_residual_network(G, "capacity")`` as lists, capacities aside: the
    vertices in ``g``'s order, ``succ[x]``/``pred[x]`` as ``(neighbour, edge)`` in the order
    networkx's adjacency holds them, ``out[x]`` as ``{neighbour: edge}`` and ``rev[edge]``. It
    serves every network with the same vertices and edges (``fits``): the hull's cuts differ only
    in capacities."""

    def __init__(self, names: list[Hashable], edge_list: list[tuple[Hashable, Hashable, dict]]):
        self.names = names
        self.keys = [(u, v) for u, v, _ in edge_list]
        index = {x: k for k, x in enumerate(names)}
        self.index = index
        n = len(index)
        out: list[dict[int, int]] = [{} for _ in range(n)]
        into: list[dict[int, int]] = [{} for _ in range(n)]
        rev: list[int] = []
        writes: list[tuple[int, int]] = []
        """(edge, k) in networkx's order of capacity writes: ``edge_list[k]``'s capacity, or 0
        (k = -1) for a reverse edge."""

        def add(a: int, b: int, k: int) -> int:  # nx: R.add_edge(a, b, capacity=...)
            e = out[a].get(b)
            if e is None:
                e = len(rev)
                rev.append(-1)
                out[a][b] = e
                into[b][a] = e
            writes.append((e, k))
            return e

        for k, (u, v) in enumerate(self.keys):
            x, y = index[u], index[v]
            if y not in out[x]:
                f, r = add(x, y, k), add(y, x, -1)
                rev[f], rev[r] = r, f
            else:
                writes.append((out[x][y], k))
        self.succ = [list(d.items()) for d in out]
        self.pred = [list(d.items()) for d in into]
        self.out, self.rev, self.writes = out, rev, writes

    def fits(self, names: list[Hashable], edge_list: list[tuple[Hashable, Hashable, dict]]) -> bool:
        return names == self.names and [(u, v) for u, v, _ in edge_list] == self.keys

    def capacities(self, edge_list: list[tuple[Hashable, Hashable, dict]], big: Any) -> list:
        """Each edge's capacity, written as networkx writes them (an infinite edge gets ``big``)."""
        cap: list = [0] * len(self.rev)
        for e, k in self.writes:
            cap[e] = 0 if k < 0 else min(edge_list[k][2].get("capacity", big), big)
        return cap


def _boykov_kolmogorov(succ, pred, out, cap, rev, s: int, t: int, INF) -> list:  # noqa: N803 - networkx's name
    """networkx's ``boykov_kolmogorov_impl`` on a ``Residual``'s lists; the flow per edge."""
    search = _Search(succ, pred, out, cap, rev, s, t, INF)
    flow_value = 0
    while flow_value < INF:
        u, v = search.grow()
        if u is None:
            break
        search.time += 1
        flow_value += search.augment(u, v)
        search.adopt()
    if flow_value * 2 > INF:  # pragma: no cover - the solver rejects infinite paths first
        raise AssertionError("remat: internal error, infinite capacity path in the flow network; please report")
    return search.flow


class _Search:
    """The two search trees of Boykov-Kolmogorov and the flow they push (networkx's closures in
    ``boykov_kolmogorov_impl``, here as methods over the same state)."""

    def __init__(self, succ, pred, out, cap, rev, s: int, t: int, INF) -> None:  # noqa: N803
        self.succ, self.pred, self.out, self.cap, self.rev = succ, pred, out, cap, rev
        self.s, self.t, self.INF = s, t, INF
        self.flow: list = [0] * len(cap)
        self.source_tree: dict = {s: None}
        self.target_tree: dict = {t: None}
        self.active = deque([s, t])
        self.queued = {s: 1, t: 1}  # how many times each vertex is in active: a membership test in O(1)
        self.dead: dict = {}  # how many of a vertex's first occurrences in the deque were removed from active
        self.orphans: deque = deque()
        self.time = 1
        self.timestamp = {s: 1, t: 1}
        self.dist = {s: 0, t: 0}

    def grow(self):
        active, queued, dead, dist, timestamp = self.active, self.queued, self.dead, self.dist, self.timestamp
        cap, flow = self.cap, self.flow
        while active:
            u = active[0]
            if dead.get(u):  # removed from active by adopt (nx: active.remove(u))
                dead[u] -= 1
                active.popleft()
                continue
            if u in self.source_tree:
                this_tree, other_tree, neighbors = self.source_tree, self.target_tree, self.succ
            else:
                this_tree, other_tree, neighbors = self.target_tree, self.source_tree, self.pred
            for v, e in neighbors[u]:
                if cap[e] - flow[e] > 0:
                    if v not in this_tree:
                        if v in other_tree:
                            return (u, v) if this_tree is self.source_tree else (v, u)
                        this_tree[v] = u
                        dist[v] = dist[u] + 1
                        timestamp[v] = timestamp[u]
                        active.append(v)
                        queued[v] = queued.get(v, 0) + 1
                    elif timestamp[v] <= timestamp[u] and dist[v] > dist[u] + 1:  # nx: _is_closer
                        this_tree[v] = u
                        dist[v] = dist[u] + 1
                        timestamp[v] = timestamp[u]
            queued[active.popleft()] -= 1
        return None, None

    def _bottleneck(self, u: int, v: int) -> tuple[list[int], Any]:
        """The augmenting path through the edge ``u -> v`` joining the trees, and its capacity."""
        out, cap, flow = self.out, self.cap, self.flow
        e = out[u][v]
        f = min(self.INF, cap[e] - flow[e])
        path = [u]
        w = u
        while w != self.s:
            n = w
            w = self.source_tree[n]
            e = out[w][n]
            f = min(f, cap[e] - flow[e])
            path.append(w)
        path.reverse()
        path.append(v)
        w = v
        while w != self.t:
            n = w
            w = self.target_tree[n]
            e = out[n][w]
            f = min(f, cap[e] - flow[e])
            path.append(w)
        return path, f

    def augment(self, u: int, v: int):
        path, f = self._bottleneck(u, v)
        out, cap, flow, rev = self.out, self.cap, self.flow, self.rev
        it = iter(path)
        u = next(it)
        these_orphans = []
        for v in it:
            e = out[u][v]
            flow[e] += f
            flow[rev[e]] -= f
            if flow[e] == cap[e]:
                if v in self.source_tree:
                    self.source_tree[v] = None
                    these_orphans.append(v)
                if u in self.target_tree:
                    self.target_tree[u] = None
                    these_orphans.append(u)
            u = v
        self.orphans.extend(sorted(these_orphans, key=self.dist.get))
        return f

    def adopt(self):
        cap, flow, dist, queued = self.cap, self.flow, self.dist, self.queued
        while self.orphans:
            u = self.orphans.popleft()
            if u in self.source_tree:
                tree, neighbors = self.source_tree, self.pred
            else:
                tree, neighbors = self.target_tree, self.succ
            nbrs = [(n, e, dist[n]) for n, e in neighbors[u] if n in tree]
            for v, e, _ in sorted(nbrs, key=itemgetter(2)):
                if cap[e] - flow[e] > 0 and self._has_valid_root(v, tree):
                    tree[u] = v
                    dist[u] = dist[v] + 1
                    self.timestamp[u] = self.time
                    break
            else:
                nbrs = [(n, e, dist[n]) for n, e in neighbors[u] if n in tree]
                for v, e, _ in sorted(nbrs, key=itemgetter(2)):
                    if cap[e] - flow[e] > 0 and not queued.get(v):  # nx: v not in active
                        self.active.append(v)
                        queued[v] = queued.get(v, 0) + 1
                    if tree[v] == u:
                        tree[v] = None
                        self.orphans.appendleft(v)
                if queued.get(u):  # nx: active.remove(u), its first occurrence: marked dead
                    self.dead[u] = self.dead.get(u, 0) + 1
                    queued[u] -= 1
                del tree[u]

    def _has_valid_root(self, n: int, tree: dict) -> bool:
        timestamp, dist, time = self.timestamp, self.dist, self.time
        path = []
        v = n
        while v is not None:
            path.append(v)
            if v == self.s or v == self.t:
                base_dist = 0
                break
            elif timestamp[v] == time:
                base_dist = dist[v]
                break
            v = tree[v]
        else:
            return False
        length = len(path)
        for i, u in enumerate(path, 1):
            dist[u] = base_dist + length - i
            timestamp[u] = time
        return True


def _source_side(res: Residual, edge_list: list[tuple[Hashable, Hashable, dict]], s: Hashable, t: Hashable) -> set:
    big = _big(edge_list)
    cap = res.capacities(edge_list, big)
    flow = _boykov_kolmogorov(res.succ, res.pred, res.out, cap, res.rev, res.index[s], res.index[t], big)
    sink_side = {res.index[t]}  # nx.minimum_cut: what reaches t through unsaturated edges
    stack = [res.index[t]]
    pred = res.pred
    while stack:
        x = stack.pop()
        for u, e in pred[x]:
            if flow[e] != cap[e] and u not in sink_side:
                sink_side.add(u)
                stack.append(u)
    return {x for k, x in enumerate(res.names) if k not in sink_side}


def source_side(g: dict[Hashable, dict[Hashable, dict]], s: Hashable, t: Hashable,
                cache: dict[str, Residual] | None = None) -> set:
    """The source side of ``g``'s minimum ``s``-``t`` cut, as ``nx.minimum_cut`` with
    Boykov-Kolmogorov gives it: every vertex that cannot reach ``t`` through an unsaturated
    residual edge. ``g``: ``{u: {v: attrs}}``, every vertex a key, ``attrs["capacity"]``
    absent for an infinite edge. ``t`` must not be reachable from ``s`` through infinite edges.
    ``cache``: a dict kept between cuts of networks that may differ only in capacities, to
    build the residual network's structure once."""
    return _source_side(*_residual(g, cache), s, t)


def _residual(g: dict[Hashable, dict[Hashable, dict]],
              cache: dict[str, Residual] | None) -> tuple[Residual, list[tuple[Hashable, Hashable, dict]]]:
    """``g``'s residual network (``cache``'s if it fits) and edges."""
    names = list(g)
    edge_list = _edges(g)
    res = cache.get("residual") if cache is not None else None
    if res is None or not res.fits(names, edge_list):
        res = Residual(names, edge_list)
        if cache is not None:
            cache["residual"] = res
    return res, edge_list


class Recut:
    """Minimum cuts of one network ``g`` (as ``source_side``'s) whose finite capacities the
    caller rewrites in place between cuts, never to or from 0 (to networkx an edge of capacity
    0 is no edge): its edges are listed and its residual network built once (or taken from
    ``cache``, as ``source_side``)."""

    def __init__(self, g: dict[Hashable, dict[Hashable, dict]], s: Hashable, t: Hashable,
                 cache: dict[str, Residual] | None = None):
        self.s, self.t = s, t
        self.residual, self.edge_list = _residual(g, cache)

    def source_side(self) -> set:
        return _source_side(self.residual, self.edge_list, self.s, self.t)
