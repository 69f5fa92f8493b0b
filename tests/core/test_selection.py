"""Choosing among candidate plans by measured time (``remat.core.selection``)."""

import pytest

from remat.core.selection import Measured, select

MiB = 2**20


def test_smallest_peak_within_tolerance_of_the_fastest():
    got = select([
        Measured("default", (10.10e-3, 10.0e-3, 10.2e-3), 500 * MiB),
        Measured("compile", (9.9e-3, 10.0e-3, 9.95e-3), 900 * MiB),
        Measured("hull 1", (10.5e-3, 10.6e-3, 10.4e-3), 300 * MiB),  # 5.5% slower: out
    ])
    assert got.index == 0 and got.fastest == 1
    assert "within 2% of the fastest (compile" in got.reason


def test_the_fastest_wins_when_nothing_near_it_is_smaller():
    got = select([Measured("default", (12e-3,) * 3, 100 * MiB), Measured("compile", (10e-3,) * 3, 900 * MiB)])
    assert got.index == 1 and got.fastest == 1
    assert got.reason.startswith("compile is the fastest")


def test_tolerance_is_an_option():
    ms = [Measured("default", (10.4e-3,), 100), Measured("compile", (10e-3,), 900)]
    assert select(ms, tolerance=0.05).index == 0
    assert select(ms, tolerance=0.01).index == 1
    assert select(ms, tolerance=0.0).index == 1


def test_median_resists_one_slow_step():
    got = select([Measured("default", (10e-3, 10e-3, 90e-3), 100), Measured("compile", (10.1e-3,) * 3, 900)])
    assert got.index == 0


def test_ties_are_deterministic():
    ms = [Measured("a", (1e-3,), 100), Measured("b", (1e-3,), 100)]
    assert select(ms).index == 0
    assert select(list(reversed(ms))).index == 0  # the earlier candidate, whatever its name


def test_untimed_candidates_are_never_chosen():
    got = select([Measured("default", (), 1), Measured("compile", (5e-3,), 900)])
    assert got.index == 1
    assert select([Measured("default", (), 1), Measured("x", (), 0)]).index == 0


def test_bad_input():
    with pytest.raises(ValueError, match="at least one candidate"):
        select([])
    with pytest.raises(ValueError, match="tolerance"):
        select([Measured("a", (1.0,), 1)], tolerance=-0.1)
