"""Version drift (Note [Version drift] in ``remat/backends/inductor/versions.py``): remat warns once on a
torch it was not verified on, names every hook that cannot install, and refuses to compile when
Inductor would silently ignore its plan. Also: the uncompiled backend works in a fresh process
that never imported Inductor's lowering (a decomposition reads it through the package)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import remat
from remat.backends.inductor import hooks, versions


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(versions, "_warned", set())


def _caught(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(m.message) for m in w if str(m.message).startswith("remat:")]


def test_verified_versions_are_silent():
    for v in versions.VERIFIED:
        ok, msgs = _caught(lambda v=v: versions.check_torch_version(f"{v}.0+cpu"))
        assert ok and not msgs


def test_unverified_version_warns_once_naming_the_verified_ones():
    ok, msgs = _caught(lambda: versions.check_torch_version("2.99.1+cu130"))
    assert not ok and len(msgs) == 1
    assert "2.99" in msgs[0] and all(v in msgs[0] for v in versions.VERIFIED)
    _, again = _caught(lambda: versions.check_torch_version("2.99.1+cu130"))
    assert again == []


def test_running_torch_is_checked_when_compiling(monkeypatch):
    seen = []
    monkeypatch.setattr("remat.backends.inductor.backend.check_torch_version", lambda: seen.append(1) or True)
    monkeypatch.setattr("remat.backends.inductor.backend.compile_fx", lambda gm, inputs, *_: gm.forward)
    fn = remat.checkpoint(lambda x: (x * 2).sum())
    fn(torch.randn(3, requires_grad=True))
    assert seen


def test_a_hook_that_cannot_install_warns_with_its_name(monkeypatch):
    from torch._inductor.virtualized import V

    monkeypatch.delattr(type(V), "set_choices_handler", raising=False)
    if hasattr(V, "set_choices_handler"):
        pytest.skip("set_choices_handler is not a class attribute on this torch")

    def enter():
        with hooks.stage_local_fusion():
            return True

    ok, msgs = _caught(enter)
    assert ok and len(msgs) == 1 and "stage_local_fusion" in msgs[0] and "set_choices_handler" in msgs[0]


def test_missing_partitioner_name_raises_instead_of_ignoring_the_plan(monkeypatch):
    import torch._inductor.compile_fx as cfx

    monkeypatch.delattr(cfx, "min_cut_rematerialization_partition")
    with pytest.raises(remat.RematError, match=r"^remat: the Inductor hook `inductor_partitioner` cannot install"):
        with hooks.inductor_partitioner(lambda *a, **k: None):
            pass


def test_pooling_model_in_a_fresh_process():
    """``max_pool2d_with_indices``' decomposition calls ``torch._inductor.lowering`` through the
    package; the uncompiled backend must work before anything else imported it."""
    code = textwrap.dedent("""
        import torch, torch.nn as nn, remat
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.MaxPool2d(2))
        x = torch.randn(2, 3, 8, 8, requires_grad=True)
        out = remat.checkpoint(model, backend="eager")(x).sum()
        out.backward()
        print("ok", float(out))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("ok")


def test_compat_fallbacks_warn_instead_of_silently_changing_behaviour(monkeypatch):
    import contextlib

    from torch._functorch import config as functorch_config

    from remat import compat

    compat.drift.cache_clear()
    compat.can_split_ddp.cache_clear()
    monkeypatch.delattr(functorch_config, "force_non_lazy_backward_lowering", raising=False)
    with pytest.warns(UserWarning, match="budget re-plan needs .*force_non_lazy_backward_lowering"):
        ctx = compat.backward_compiled_now()
    assert isinstance(ctx, contextlib.nullcontext)

    from torch._dynamo.backends import distributed as dynamo_ddp

    monkeypatch.setattr(dynamo_ddp.DDPOptimizer, "compile_fn", lambda self, gm, inputs: gm)
    with pytest.warns(UserWarning, match="own DDP bucket split .*Dynamo splits DDP graphs itself"):
        assert compat.can_split_ddp() is False
    compat.drift.cache_clear()
    compat.can_split_ddp.cache_clear()
