"""Gradients the caller does not send (Note [Gradients the caller does not send]): a graph that
returns its loss beside its logits is planned and run without the logits' zero-filled gradient;
gradients equal eager autograd's, the step's measured peak is lower by exactly that gradient's
bytes, and a gradient sent anyway is still used (a warning; under a budget, an error)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.fx as fx

import remat
from remat import compat
from remat.capture import unsent_grads
from remat.capture.unsent_grads import UnsentDispatch, general_backward
from remat.errors import RematError

VOCAB = 500
INDUCTOR = pytest.param("inductor", marks=[pytest.mark.inductor, pytest.mark.slow])
BACKENDS = ["eager", INDUCTOR]


class LossAndLogits(torch.nn.Module):
    """An LM head and its loss, returning both as HF models do."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, VOCAB)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.b(torch.relu(self.a(x)))
        return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), y.view(-1)), logits


class LogitsOnly(LossAndLogits):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x, y)[1]


class OutputBesideAuxLoss(LossAndLogits):
    """An output and an auxiliary scalar not computed from it (a balance loss, as mixtures of
    experts return): the caller's loss reads the output, so its gradient is sent."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        h = torch.relu(self.a(x))
        return self.b(h), h.float().square().mean()


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 64, 16, generator=g), torch.randint(0, VOCAB, (4, 64), generator=g)


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def _dispatch_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[object]]:
    """What each backward dispatch was handed at its unread positions."""
    seen: list[list[object]] = []
    call = UnsentDispatch.__call__

    def spy(self: UnsentDispatch, args: list[object]) -> object:
        seen.append([args[i] for i in sorted(self.unread)])
        return call(self, args)

    monkeypatch.setattr(UnsentDispatch, "__call__", spy)
    return seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_loss_beside_logits_trains_without_the_logits_gradient(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = LossAndLogits()
    ref = copy.deepcopy(model)
    x, y = _inputs()
    seen = _dispatch_calls(monkeypatch)
    wrapped = remat.checkpoint(model, backend=backend)
    for _ in range(2):
        model.zero_grad()
        ref.zero_grad()
        wrapped(x, y)[0].backward()
        ref(x, y)[0].backward()
        _close(_grads(model), _grads(ref))
    plan = remat.compiled_plans(wrapped)[0]
    assert any("trained through its loss: 1 other output gradient(s) (500.00 KiB)" in n for n in plan.notes)
    assert seen == [[None], [None]]  # autograd sent None: no zeros were filled


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_sent_anyway_is_used_with_a_warning(backend: str) -> None:
    torch.manual_seed(0)
    model = LossAndLogits()
    ref = copy.deepcopy(model)
    x, y = _inputs()
    wrapped = remat.checkpoint(model, backend=backend)
    wrapped(x, y)[0].backward()  # compiled and run as planned
    for step in range(2):
        model.zero_grad()
        ref.zero_grad()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss, logits = wrapped(x, y)
            (loss + logits.square().mean()).backward()
        messages = [str(w.message) for w in caught if str(w.message).startswith("remat:")]
        assert len(messages) == (1 if step == 0 else 0)  # once per graph
        if messages:
            assert "sent a gradient for 1 other output(s) of shape (4, 64, 500)" in messages[0]
            assert "output_grads='all'" in messages[0]
        loss, logits = ref(x, y)
        (loss + logits.square().mean()).backward()
        _close(_grads(model), _grads(ref))


def test_a_gradient_sent_anyway_under_a_budget_raises() -> None:
    torch.manual_seed(0)
    model = LossAndLogits()
    x, y = _inputs()
    wrapped = remat.checkpoint(model, backend="eager", budget=1.0)
    loss, logits = wrapped(x, y)
    with pytest.raises(RematError, match=r"^remat: this graph returns a loss.*Pass output_grads='all'"):
        (loss + logits.sum()).backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_measured_peak_is_lower_by_the_logits_gradient(backend: str) -> None:
    """The step's peak (the CPU profiler's) without the zero-filled gradient, against
    ``output_grads="all"``: lower by exactly the logits' bytes on the uncompiled backend (the
    gradient is alive at the peak there), and each predicted to the byte."""
    peaks = {}
    for mode in ("auto", "all"):
        torch.manual_seed(0)
        model = LossAndLogits()
        x, y = _inputs()
        wrapped = remat.checkpoint(model, backend=backend, output_grads=mode)

        def step() -> None:
            wrapped(x, y)[0].backward()

        step()
        peaks[mode] = compat.measure_cpu_peak_bytes(step)
        assert remat.compiled_plans(wrapped)[0].predicted_peak_bytes == pytest.approx(peaks[mode], abs=64)
    logits_bytes = 4 * 64 * VOCAB * 4
    if backend == "eager":
        assert peaks["all"] - peaks["auto"] == pytest.approx(logits_bytes, abs=64)
    else:
        assert peaks["auto"] <= peaks["all"]


def test_all_plans_every_output_gradient_and_a_model_without_a_loss_keeps_them() -> None:
    x, y = _inputs()
    for model, mode in ((LossAndLogits(), "all"), (LogitsOnly(), "auto")):
        wrapped = remat.checkpoint(model, backend="eager", output_grads=mode)
        out = wrapped(x, y)
        (out[0] if isinstance(out, tuple) else out.sum()).backward()
        assert not any("trained through its loss" in n for n in remat.compiled_plans(wrapped)[0].notes)


def test_an_output_the_scalar_does_not_read_keeps_its_gradient() -> None:
    torch.manual_seed(0)
    model = OutputBesideAuxLoss()
    ref = copy.deepcopy(model)
    x, y = _inputs()
    wrapped = remat.checkpoint(model, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no gradient sent against the plan
        out, aux = wrapped(x, y)
        (torch.nn.functional.cross_entropy(out.view(-1, VOCAB), y.view(-1)) + aux).backward()
    out, aux = ref(x, y)
    (torch.nn.functional.cross_entropy(out.view(-1, VOCAB), y.view(-1)) + aux).backward()
    _close(_grads(model), _grads(ref))
    assert not any("trained through its loss" in n for n in remat.compiled_plans(wrapped)[0].notes)


def test_output_grads_must_be_auto_or_all() -> None:
    with pytest.raises(RematError, match=r"^remat: output_grads must be one of \('auto', 'all'\), got 'loss'"):
        remat.checkpoint(LossAndLogits(), output_grads="loss")


def _backward_with_stand_in() -> fx.GraphModule:
    """A backward whose tangent ``tangents_1`` a stand-in replaced (as the partition leaves it)."""
    g = fx.Graph()
    saved = g.placeholder("saved")
    t = g.placeholder("tangents_1")
    saved.meta["val"] = torch.empty(3)
    t.meta["val"] = torch.empty(3)
    t.meta[unsent_grads.UNSENT] = unsent_grads.PLANNED
    z = g.call_function(torch.ops.aten.full.default, ([3], 0), {"dtype": torch.float32})
    z.meta[unsent_grads.UNSENT] = "tangents_1"
    g.output((g.call_function(torch.ops.aten.add.Tensor, (z, saved)),))
    return fx.GraphModule(torch.nn.Module(), g)


def test_general_backward_reads_the_tangent_again() -> None:
    bw = _backward_with_stand_in()
    general = general_backward(bw)
    assert [n.target for n in general.graph.nodes if n.op == "call_function"] == [torch.ops.aten.add.Tensor]
    assert general(torch.ones(3), torch.full((3,), 2.0))[0].tolist() == [3.0, 3.0, 3.0]
    assert len([n for n in bw.graph.nodes if n.op == "call_function"]) == 2  # the original is unchanged


def _fake(*shape: int) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.empty(shape)


def test_a_sum_with_the_stand_in_becomes_an_alias_and_the_general_backward_sums_again() -> None:
    g = fx.Graph()
    x = g.placeholder("primals_1")
    t = g.placeholder("tangents_1")
    x.meta["val"], t.meta["val"] = _fake(3), _fake(3)
    s = g.call_function(torch.ops.aten.add.Tensor, (t, x))
    s.meta["val"] = _fake(3)
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (s, 2.0)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert unsent_grads.stand_in_zeros(gm, [t], budgeted=False) == 12
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ops == [torch.ops.aten.alias.default, torch.ops.aten.mul.Tensor]  # no zeros left
    assert not t.users and t.meta[unsent_grads.UNSENT] == unsent_grads.PLANNED
    assert gm(torch.ones(3), None)[0].tolist() == [2.0, 2.0, 2.0]
    general = general_backward(gm)
    assert general(torch.ones(3), torch.full((3,), 2.0))[0].tolist() == [6.0, 6.0, 6.0]


def test_zeros_autograd_filled_are_left_unread_and_a_meta_tensor_stands_for_none() -> None:
    bw = _backward_with_stand_in()
    dispatch = UnsentDispatch(bw)
    handed: list[list[object]] = []

    def compiled(args: list[object]) -> object:
        handed.append(list(args))
        return bw(*args)

    dispatch.compiled = compiled
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither call takes the general path
        assert dispatch([torch.ones(3), torch.zeros(3)])[0].tolist() == [1.0, 1.0, 1.0]
        assert dispatch([torch.ones(3), None])[0].tolist() == [1.0, 1.0, 1.0]
    assert handed[1][1].device.type == "meta" and handed[1][1].shape == (3,)
    assert dispatch.sent_anyway == 0
    with pytest.warns(UserWarning, match="sent a gradient"):
        assert dispatch([torch.ones(3), torch.full((3,), 2.0)])[0].tolist() == [3.0, 3.0, 3.0]
    assert dispatch.sent_anyway == 1
