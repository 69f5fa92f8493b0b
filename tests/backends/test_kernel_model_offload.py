"""The Inductor step model with offloaded values (Note [Offloaded values in Inductor's kernels]):
the forward's ``ready`` of an offloaded value runs where the offload pass puts it in the graph,
right after the op the plan releases the value after, also where the model runs that op earlier
than the graph lists it (Note [Released after, in kernel order])."""

from __future__ import annotations

from remat.backends.inductor import fusion
from remat.backends.inductor.facts import Kind, NodeLowering
from remat.backends.inductor.kernel_model import KernelModel
from remat.core.peak import Moved, Offload, Schedule, op_order, simulate

# x (input) -> a (100 B, extern) -> b (10 B, extern) -> c (50 B, extern, the output); m (1 B) a
# pointwise mask of a that only the backward reads, listed last in the forward. Backward: t (the
# output's gradient), g = extern(t, m) (5 B), ga = extern(g, a) (2 B, the gradient). Saved: a, m.
NAMES = ("x", "a", "b", "c", "m", "t", "g", "ga")
KINDS = (Kind.INPUT, Kind.EXTERN, Kind.EXTERN, Kind.EXTERN, Kind.POINTWISE, Kind.INPUT, Kind.EXTERN, Kind.EXTERN)
S = Schedule(
    inputs=((), (0,), (1,), (2,), (1,), (), (5, 4), (6, 1)),
    nbytes=(0, 100, 10, 50, 1, 1, 5, 2),
    root=tuple(range(8)),
    graph_input=frozenset({0}),
    tangent=frozenset({5}),
    backward=frozenset({5, 6, 7}),
    fwd_outputs=(3,),
    bwd_outputs=(7,),
    names=NAMES,
    model=KernelModel(fusion.GPU, tuple(NodeLowering(k) for k in KINDS)),
)
SAVED = {1, 4}


def test_the_plan_lists_the_mask_last_and_the_model_runs_it_with_what_it_reads():
    fwd, _ = op_order(S, SAVED)
    assert [NAMES[v] for v in fwd] == ["a", "b", "c", "m"]
    steps, *_ = S.model.steps(S, SAVED, *op_order(S, SAVED))
    assert [st.label for st in steps][:4] == ["forward:a", "forward:m", "forward:b", "forward:c"]


def test_a_value_released_after_the_forwards_last_op_is_held_to_the_forwards_end():
    # released after m (position 3, the forward's last op): the ready runs after c, so a (100 B)
    # is alive beside b and c: a 100 + m 1 + b 10 + c 50 = 161 B (placed after m's early slot, the
    # ready ran right after a's copy out, after b, and the model read 111 B)
    r = simulate(S, SAVED, Offload({1: Moved(0, 3, 5)}))
    assert r.forward_peak_bytes == 161
    steps, *_ = S.model.steps(S, SAVED, *op_order(S, SAVED), Offload({1: Moved(0, 3, 5)}))
    labels = [st.label for st in steps]
    assert labels.index("forward:ready(a)") > labels.index("forward:c")


def test_a_value_released_early_leaves_the_device_before_the_ops_after_it():
    # released after b (position 1): the ready runs before c, and a's 100 B are gone by then
    r = simulate(S, SAVED, Offload({1: Moved(0, 1, 5)}))
    assert r.forward_peak_bytes == 111  # a 100 + m 1 + b 10, before c
    steps, *_ = S.model.steps(S, SAVED, *op_order(S, SAVED), Offload({1: Moved(0, 1, 5)}))
    labels = [st.label for st in steps]
    assert labels.index("forward:b") < labels.index("forward:ready(a)") < labels.index("forward:c")
