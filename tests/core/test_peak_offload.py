"""The simulator with offloaded values (``peak.simulate``'s ``offload``): a value's device copy
lives until its copy out ends and again from its copy back's start (Note [Offload timeline])."""

from __future__ import annotations

import pytest

from remat.core.peak import Moved, Offload, Schedule, op_order, simulate

# x (input) -> a (100 B) -> b (10 B) -> c (1 B, the output); the backward: gb = dh(t, b) (100 B),
# gc = k(gb) (1 B), ga = dg(gc, a) (10 B, the gradient). Saved: a and b.
NAMES = ("x", "a", "b", "c", "t", "gb", "gc", "ga")
S = Schedule(
    inputs=((), (0,), (1,), (2,), (), (4, 2), (5,), (6, 1)),
    nbytes=(0, 100, 10, 1, 1, 100, 1, 10),
    root=tuple(range(8)),
    graph_input=frozenset({0}),
    tangent=frozenset({4}),
    backward=frozenset({4, 5, 6, 7}),
    fwd_outputs=(3,),
    bwd_outputs=(7,),
    names=NAMES,
)
SAVED = {1, 2}


def test_the_op_order_is_the_forward_then_the_backward():
    fwd, bwd = op_order(S, SAVED)
    assert [NAMES[v] for v in fwd] == ["a", "b", "c"] and [NAMES[v] for v in bwd] == ["gb", "gc", "ga"]


def test_without_offload_the_saved_value_is_held_through_the_backwards_peak():
    # a 100 + b 10 + c 1 + t 1 + gb 100 = 212 B when gb is made
    r = simulate(S, SAVED)
    assert (r.peak_bytes, r.at) == (212, "backward:gb")


def test_an_offloaded_value_leaves_the_device_between_its_copies():
    # a's copy out (issued after b, position 1) ends during c (position 2), its copy back starts at
    # ga (position 5): after c 111 - 100 = 11; t 12; gb 112 (b freed: 102); gc 103 (gb freed: 3); ga 3 + 100 + 10
    r = simulate(S, SAVED, Offload({1: Moved(1, 2, 5)}))
    assert (r.peak_bytes, r.at) == (113, "backward:ga")
    # a copy back issued at gb (position 3) holds a beside gb: no saving
    assert simulate(S, SAVED, Offload({1: Moved(1, 2, 3)})).peak_bytes == 212
    # a copy out that ends only in the backward (during gb) holds a there too
    assert simulate(S, SAVED, Offload({1: Moved(1, 3, 5)})).peak_bytes == 212


def test_where_the_host_is_the_device_the_host_copy_counts_from_its_copy_out_to_its_copy_back():
    # a's host copy (100 B) lives from b (position 1) to ga (position 5), where its copy back is
    # allocated: b 100 + 10 + 100; c 211 (a freed: 111); t 112; gb 212 (b freed: 202); gc 203 (gb
    # freed: 103); ga 103 + 100 (copy back) + 10 = 213, one byte above the plan without offload
    r = simulate(S, SAVED, Offload({1: Moved(1, 2, 5)}, host_is_device=True))
    assert (r.peak_bytes, r.at) == (213, "backward:ga")
    assert simulate(S, SAVED).peak_bytes == 212
    # without the host's bytes the same copies save 100 B
    assert simulate(S, SAVED, Offload({1: Moved(1, 2, 5)})).peak_bytes == 113


def test_offload_is_not_simulated_with_eager_autograds_kernels():
    fused = Schedule(**{**S.__dict__, "kernel": (-1, 0, 0, -1, -1, -1, -1, -1)})
    with pytest.raises(ValueError, match="not by eager autograd's kernels"):
        simulate(fused, SAVED, Offload({1: Moved(1, 2, 5)}))
