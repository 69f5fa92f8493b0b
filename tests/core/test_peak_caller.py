"""The simulator's two callers (Note [What the caller holds] in ``remat.core.allocations``): one that
keeps the forward's outputs through the backward, and one that keeps only the loss, whose other
outputs are gone before the backward's first step allocates their gradients."""

from __future__ import annotations

import dataclasses

from remat.core.peak import Schedule, simulate

# x (input) -> a (10 B, saved) -> c (100 B, the output: a graph's logits); the backward: t (the
# output's gradient, 100 B) -> g = dg(t, a) (10 B, the gradient).
S = Schedule(
    inputs=((), (0,), (1,), (), (3, 1)),
    nbytes=(0, 10, 100, 100, 10),
    root=tuple(range(5)),
    graph_input=frozenset({0}),
    tangent=frozenset({3}),
    backward=frozenset({3, 4}),
    fwd_outputs=(2,),
    bwd_outputs=(4,),
    names=("x", "a", "c", "t", "g"),
)


def test_a_caller_that_keeps_the_outputs_holds_them_beside_their_gradients():
    r = simulate(S, {1})
    assert (r.peak_bytes, r.at) == (220, "backward:g")  # a, c, t, g


def test_outputs_the_caller_drops_are_gone_before_their_gradients_are_made():
    # the logits die when the forward returns (the caller computes nothing from them, or hands them
    # to the next graph, whose backward is over by then): a, t and g, never c beside t
    r = simulate(dataclasses.replace(S, caller_keeps_outputs=False), {1})
    assert (r.peak_bytes, r.at) == (120, "backward:g")
    assert r.boundary_bytes == 10  # only what the backward takes
