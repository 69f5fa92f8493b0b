import copy
import faulthandler
import hashlib
import os
import sys

import pytest
import torch
import torch._dynamo


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


_STDERR_FD = pytest.StashKey[int]()


def pytest_configure(config):
    # pytest captures fd 2 only while tests run; a copy taken now still writes to the terminal
    # (or, under pytest-xdist, to the controller's stderr) when the process dies in a test.
    config.stash[_STDERR_FD] = os.dup(sys.stderr.fileno())


def pytest_unconfigure(config):
    os.close(config.stash[_STDERR_FD])


@pytest.fixture
def hang_watchdog(request, tmp_path_factory):
    """Ends this process, every thread's stack written to the stderr pytest had before it
    captured output, if the test outlives ``WATCHDOG_S`` of its module: a hang fails instead of
    waiting forever. ``faulthandler``'s thread needs no GIL, so it fires even when the test
    waits in C++ holding the GIL. Under pytest-xdist the test is then reported as crashing its
    worker, and xdist gives it to a fresh worker (``--dist loadgroup`` queues a crashed group
    again): a mark left in the session's base temporary directory makes it fail there at once
    instead of waiting its time out again."""
    mark = None
    if hasattr(request.config, "workerinput"):  # a pytest-xdist worker: the parent is the session's
        marks = tmp_path_factory.getbasetemp().parent / "hang-watchdog"
        marks.mkdir(exist_ok=True)
        mark = marks / hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
        if mark.exists():
            pytest.fail(f"not run again: {request.node.nodeid} ended an earlier worker (it ran past "
                        f"{request.module.WATCHDOG_S} s, or crashed)", pytrace=False)
        mark.write_text(request.node.nodeid)
    faulthandler.dump_traceback_later(request.module.WATCHDOG_S, exit=True, file=request.config.stash[_STDERR_FD])
    yield
    faulthandler.cancel_dump_traceback_later()
    if mark is not None:
        mark.unlink()


def train_step(model, *inputs, loss_fn=None, steps=1, lr=0.0):
    """Run ``steps`` forward+backward steps; returns (output, input grads, param grads) of the last."""
    out = None
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        ins = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
               for x in inputs]
        out = model(*ins)
        y = out if isinstance(out, torch.Tensor) else out[0]
        loss = loss_fn(y) if loss_fn else y.float().square().mean()
        loss.backward()
        if lr:
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= lr * p.grad
    grads_in = [x.grad for x in ins if isinstance(x, torch.Tensor) and x.requires_grad]
    grads_p = {n: p.grad for n, p in model.named_parameters()}
    return out, grads_in, grads_p


def assert_same_training(make_model, inputs, backend, *, steps=1, lr=0.0, atol=None, rtol=None,
                         loss_fn=None, **kwargs):
    """Train a copy eagerly and a remat-wrapped copy; outputs, input and parameter grads, and
    buffers must match."""
    import remat

    torch.manual_seed(0)
    base = make_model()
    ref_model = copy.deepcopy(base)
    rm = remat.checkpoint(copy.deepcopy(base), backend=backend, **kwargs)
    ref = train_step(ref_model, *inputs, steps=steps, lr=lr, loss_fn=loss_fn)
    got = train_step(rm, *inputs, steps=steps, lr=lr, loss_fn=loss_fn)
    tol = {} if atol is None else {"atol": atol, "rtol": rtol}
    torch.testing.assert_close(got[0], ref[0], **tol)
    assert len(got[1]) == len(ref[1])
    for a, b in zip(got[1], ref[1]):
        torch.testing.assert_close(a, b, **tol)
    assert got[2].keys() == ref[2].keys()
    for k in ref[2]:
        if ref[2][k] is None:
            assert got[2][k] is None, k
        else:
            torch.testing.assert_close(got[2][k], ref[2][k], **tol, msg=lambda m, k=k: f"{k}: {m}")
    for (ka, a), (kb, b) in zip(rm.named_buffers(), ref_model.named_buffers()):
        assert ka == kb
        torch.testing.assert_close(a, b, **tol)
    return rm


@pytest.fixture(scope="session")
def report_plan():
    """The plan of ``zoo/report_model.py:factory`` (planned once per session)."""
    import remat
    from zoo.report_model import factory

    torch._dynamo.reset()
    model, args = factory()
    return remat.explain(model, *args)
