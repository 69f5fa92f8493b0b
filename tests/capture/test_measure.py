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


class Meter:
    """A fake allocator: candidates allocate in their forward and free in their backward; windows
    nest (``remat.capture.budget_guard.Meter``)."""

    def __init__(self):
        self.live, self.windows = 0, []

    def add(self, n):
        self.live += n
        for w in self.windows:
            w["peak"] = max(w["peak"], self.live)

    def open(self):
        w = {"start": self.live, "peak": self.live}
        self.windows.append(w)
        return w

    def close(self, w):
        self.windows.remove(w)
        return w["peak"] - w["start"]

    def retries(self, w):
        return 0


def holding(meter, nbytes):
    """A candidate that holds ``nbytes`` from its forward to its backward."""

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            meter.add(nbytes)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            meter.add(-nbytes)
            return g * 2

    return CompiledFunction.apply


def test_a_graph_measures_its_peak_once_the_graphs_inside_its_window_have_chosen():
    # The step runs graph A, then graph B on A's output; B's backward runs inside A's window.
    # B's candidates take the same time, "big" holds 100 bytes more: B keeps "small". A's peak is
    # its own 1,000 bytes plus B's winner, never B's losing candidate.
    clock, meter = Clock(), Meter()
    chosen = {}
    a = TunedGraph([("a1", holding(meter, 1000), lambda: 0), ("a2", holding(meter, 1000), lambda: 0)], clock,
                   samples=2, tolerance=0.02, on_decided=lambda k, s: chosen.setdefault("a", s), meter=meter)
    b = TunedGraph([("big", holding(meter, 110), lambda: 0), ("small", holding(meter, 10), lambda: 0)], clock,
                   samples=2, tolerance=0.02, on_decided=lambda k, s: chosen.setdefault("b", s), meter=meter)
    for _ in range(40):
        x = torch.ones(3, requires_grad=True)
        b(a(x)).sum().backward()
        if len(chosen) == 2:
            break
    assert chosen["b"].measured[chosen["b"].index].name == "small"
    assert [m.peak_bytes for m in chosen["b"].measured] == [110, 10]
    assert [m.peak_bytes for m in chosen["a"].measured] == [1010, 1010]  # a mixed step would read 1,110


def test_a_graph_whose_inner_graph_never_chooses_still_decides():
    import remat.capture.measure as measure

    clock, meter, chosen = Clock(), Meter(), []
    a = TunedGraph([("a1", holding(meter, 1000), lambda: 0), ("a2", holding(meter, 1000), lambda: 0)], clock,
                   samples=2, tolerance=0.02, on_decided=lambda k, s: chosen.append(s), meter=meter)
    b = TunedGraph([("b1", holding(meter, 110), lambda: 0), ("b2", holding(meter, 10), lambda: 0)], clock,
                   samples=1000, tolerance=0.02, on_decided=lambda k, s: None, meter=meter)
    steps = 0
    while not chosen and steps < 100:
        x = torch.ones(3, requires_grad=True)
        b(a(x)).sum().backward()
        steps += 1
    assert chosen and steps <= 2 * (measure.PATIENCE * 2 + 1) + 1
    assert max(m.peak_bytes for m in chosen[0].measured) == 1110  # mixed peaks, the only ones it had
