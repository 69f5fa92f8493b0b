"""The min-cut against brute force on random DAGs, determinism, and conflicts."""

import random

import pytest

from remat.core.solver import ConflictError, Problem, brute_force, solve


def random_problem(rng: random.Random, n: int) -> Problem:
    inputs = []
    for v in range(n):
        k = rng.randint(0, min(v, 3))
        inputs.append(tuple(sorted(rng.sample(range(v), k))))
    cost = tuple(rng.choice([0, 1, 2, 3, 4, 8, 16, 100]) for _ in range(n))
    needed = frozenset(rng.sample(range(n), rng.randint(1, n)))
    no_recompute = {v: "input" for v in range(n) if not inputs[v] and rng.random() < 0.7}
    no_recompute.update({v: "matmul" for v in range(n) if rng.random() < 0.15})
    no_save = {v: "view" for v in range(n) if rng.random() < 0.15}
    return Problem(tuple(inputs), cost, needed, no_recompute, no_save)


def test_min_cut_equals_brute_force_on_random_dags():
    rng = random.Random(1234)
    solved = conflicts = 0
    for _ in range(300):
        p = random_problem(rng, rng.randint(1, 14))
        best = brute_force(p)
        try:
            sol = solve(p)
        except ConflictError:
            assert best is None
            conflicts += 1
            continue
        assert best is not None
        assert sol.cost == best
        assert sol.cost == sum(p.cost[v] for v in sol.saved)
        assert not set(sol.saved) & set(p.no_save)
        assert not set(sol.recomputed) & set(p.no_recompute)
        solved += 1
    assert solved >= 200 and conflicts >= 10


def test_same_graph_twice_gives_same_plan():
    rng = random.Random(7)
    for _ in range(50):
        p = random_problem(rng, 14)
        try:
            assert solve(p) == solve(p)
        except ConflictError:
            pass


def test_chain_saves_cheapest_value():
    # input(8) -> a(4) -> b(16) -> c(16); backward reads c.
    p = Problem(((), (0,), (1,), (2,)), (8, 4, 16, 16), frozenset({3}), {0: "graph input"})
    sol = solve(p)
    assert sol.saved == (1,) and sol.recomputed == (2, 3) and sol.cost == 4


def test_equal_bytes_prefer_later_value():
    p = Problem(((), (0,), (1,)), (4, 4, 4), frozenset({2}), {0: "graph input"})
    assert solve(p).saved == (2,)


def test_conflict_names_the_chain():
    # a matmul that may not be recomputed feeds a value that may not be saved.
    p = Problem(((), (0,), (1,)), (4, 4, 4), frozenset({2}), {0: "graph input", 1: "matmul"},
                {1: "user rule `r`", 2: "view"}, names=("x", "mm", "v"))
    with pytest.raises(ConflictError) as e:
        solve(p)
    assert [v for v, _ in e.value.chain] == [1, 2]
    assert "matmul" in e.value.chain[0][1] and "user rule `r`" in e.value.chain[0][1]


def _nx_source_side(g: dict, s, t) -> tuple[set, float]:
    """networkx's minimum cut of the same network (the oracle for ``remat.core.maxflow``)."""
    import networkx as nx

    G = nx.DiGraph()  # noqa: N806
    G.add_nodes_from(g)
    G.add_edges_from((u, v, dict(a)) for u, nbrs in g.items() for v, a in nbrs.items())
    value, (side, _) = nx.minimum_cut(G, s, t, flow_func=nx.algorithms.flow.boykov_kolmogorov)
    return side, value


def test_max_flow_is_networkx_boykov_kolmogorov_on_random_networks():
    """``remat.core.maxflow.source_side`` gives networkx's cut on random networks with integer, float
    and infinite capacities (Note [Max-flow without networkx])."""
    import networkx as nx

    from remat.core.maxflow import source_side

    rng = random.Random(7)
    checked = 0
    for trial in range(400):
        n = rng.randint(2, 40)
        g: dict = {x: {} for x in ["s", "t", *range(n)]}
        for _ in range(rng.randint(1, 4 * n)):
            u, v = rng.choice(["s", *range(n)]), rng.choice([*range(n), "t"])
            if u == v or u in g[v]:
                continue
            kind = rng.random()
            g[u][v] = {} if kind < 0.2 else {"capacity": rng.choice([0, 1, 2, 5, 10**9 + 7])
                                               if kind < 0.6 else rng.random() * 10 ** rng.randint(-3, 9)}
        try:
            want, _ = _nx_source_side(g, "s", "t")
        except nx.NetworkXUnbounded:  # an infinite path: remat.core.maxflow raises too
            with pytest.raises(AssertionError, match="infinite capacity path"):
                source_side(g, "s", "t")
            continue
        assert source_side(g, "s", "t") == want, trial
        checked += 1
    assert checked > 300


def test_weighted_cuts_are_networkx_cuts():
    """The solver's own networks, weighted (float capacities) and not, cut as networkx cuts them."""
    from remat.core.maxflow import source_side
    from remat.core.solver import SINK, SOURCE, _build, _find_conflict, _free

    rng = random.Random(11)
    checked = 0
    for _ in range(200):
        p = random_problem(rng, rng.randint(2, 30))
        p = Problem(p.inputs, p.cost, p.needed, p.no_recompute, p.no_save,
                    recompute_cost=tuple(rng.random() * 1e-3 for _ in range(p.n)))
        for weight in (None, rng.random() * 1e6, 1e-9):
            g = _build(p, weight, _free(p))
            if _find_conflict(p, g) is not None or not p.needed:
                continue
            assert source_side(g, SOURCE, SINK) == _nx_source_side(g, SOURCE, SINK)[0]
            checked += 1
    assert checked > 200


def test_weighted_cuts_share_work_not_plans():
    """``WeightedCuts`` (one residual network for many weights, ``remat.core.frontier.hull``) finds
    the plan ``solve_weighted`` finds at every weight, also when a weight of 0 drops edges."""
    from remat.core.solver import WeightedCuts, solve_weighted

    rng = random.Random(5)
    checked = 0
    for _ in range(100):
        p = random_problem(rng, rng.randint(2, 30))
        p = Problem(p.inputs, p.cost, p.needed, p.no_recompute, p.no_save,
                    recompute_cost=tuple(rng.choice([0.0, rng.random() * 1e-3]) for _ in range(p.n)))
        cuts = WeightedCuts(p)
        for weight in (rng.random() * 1e6, 0.0, rng.random(), 1e3, 0.0):
            try:
                want = solve_weighted(p, weight)
            except ConflictError:
                with pytest.raises(ConflictError):
                    cuts(weight)
                continue
            assert cuts(weight) == want
            checked += 1
    assert checked > 200


def test_problems_sharing_a_flow_cache_get_their_own_plans():
    """A residual network cached for one problem is reused only where another problem's network
    has the same vertices and edges (``remat.core.maxflow.Residual.fits``)."""
    from remat.core.solver import WeightedCuts, solve_weighted

    rng = random.Random(9)
    cache: dict = {}
    base = random_problem(rng, 25)
    rc = tuple(rng.random() * 1e-3 for _ in range(base.n))
    checked = 0
    for _ in range(60):
        extra = {v: "checkpoint" for v in rng.sample(range(base.n), 3)}
        p = Problem(base.inputs, base.cost, base.needed, {**base.no_recompute, **extra}, {}, recompute_cost=rc)
        try:
            want = solve_weighted(p, 0.5)
        except ConflictError:
            continue
        assert WeightedCuts(p, cache)(0.5) == want
        checked += 1
    assert checked > 10
