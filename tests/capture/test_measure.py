"""``remat.capture.measure.TunedGraph``: candidates taken round-robin on the user's steps, timed
forward and backward with an injected clock, the winner kept (Note [Tuning on the user's steps])."""

import pytest
import torch

from remat.capture.measure import TunedGraph, _compiled_node


class Clock:
    """A fake timer: time moves only when a candidate runs."""

    def __init__(self):
        self.now = 0.0

    def mark(self):
        return self.now

    def seconds(self, start, end):
        return end - start


def candidate(clock, fwd_cost, bwd_cost, calls):
    """A differentiable function whose autograd node is named like a compiled function's."""

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            clock.now += fwd_cost
            calls.append("fwd")
            return x * 2

        @staticmethod
        def backward(ctx, g):
            clock.now += bwd_cost
            calls.append("bwd")
            return g * 2

    return CompiledFunction.apply


def run_steps(graph, n):
    for _ in range(n):
        x = torch.ones(3, requires_grad=True)
        graph(x).sum().backward()
        assert torch.equal(x.grad, torch.full((3,), 2.0))  # every candidate's gradient is right


def test_round_robin_then_the_smallest_peak_within_tolerance():
    clock, log = Clock(), {"a": [], "b": [], "c": []}
    decided = []
    graph = TunedGraph([("a", candidate(clock, 5.0, 5.1, log["a"]), lambda: 100),   # 10.1 s
                        ("b", candidate(clock, 4.0, 6.0, log["b"]), lambda: 300),   # 10.0 s, fastest
                        ("c", candidate(clock, 6.0, 6.0, log["c"]), lambda: 50)],   # 12.0 s
                       clock, samples=2, tolerance=0.02, on_decided=lambda k, s: decided.append((k, s)))
    run_steps(graph, 9)  # 3 candidates x (1 untimed + 2 timed) calls
    assert [len(v) for v in log.values()] == [6, 6, 6] and not decided
    run_steps(graph, 2)
    (k, sel), = decided
    assert k == 0 and sel.fastest == 1  # a: within 2% of b, smaller peak
    assert [m.seconds for m in sel.measured] == [pytest.approx((10.1,) * 2), (10.0,) * 2, (12.0,) * 2]
    assert len(log["a"]) == 10 and len(log["b"]) == 6 and len(log["c"]) == 6  # only the winner runs


def test_a_step_without_backward_is_not_a_sample():
    clock, calls = Clock(), []
    graph = TunedGraph([("a", candidate(clock, 1.0, 1.0, calls), lambda: 1),
                        ("b", candidate(clock, 2.0, 2.0, []), lambda: 1)], clock, samples=1, tolerance=0.0,
                       on_decided=lambda k, s: None)
    with torch.no_grad():
        for _ in range(6):
            graph(torch.ones(3))
    assert graph.selection is None  # never decided: no backward ran
    run_steps(graph, 5)
    assert graph.selection is not None and graph.selection.index == 0


def test_one_candidate_runs_directly():
    clock, calls = Clock(), []
    graph = TunedGraph([("a", candidate(clock, 1.0, 1.0, calls), lambda: 1)], clock, samples=3, tolerance=0.02,
                       on_decided=lambda k, s: None)
    run_steps(graph, 2)
    assert graph.selection is None and calls == ["fwd", "bwd"] * 2


def test_the_compiled_node_is_found_through_views_only():
    clock = Clock()
    f = candidate(clock, 0, 0, [])
    x = torch.ones(4, requires_grad=True)
    y = f(x)
    assert _compiled_node(y) is y.grad_fn
    assert _compiled_node(y.view(2, 2).t()) is y.grad_fn
    assert _compiled_node(y * 3) is None  # another op: could be an earlier graph's output
    assert _compiled_node(torch.ones(2)) is None
