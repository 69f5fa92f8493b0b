"""The min-cut against brute force on random DAGs, determinism, and conflicts."""

import random

import pytest

from remat.solver import ConflictError, Problem, brute_force, solve


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
