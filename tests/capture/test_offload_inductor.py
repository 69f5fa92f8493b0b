"""Offload under the Inductor backend (``offload=`` with ``backend="inductor"``, Note [Offload
copies], Note [Offloaded values in Inductor's kernels]): gradients equal eager autograd's; in the
code Inductor generates, each offloaded value's ``to_host`` comes after its last forward use and
its device buffer lives until the forward's ``ready`` (no buffer takes it before), the copy back
is allocated by ``to_device`` where the plan issues it and waited for before its first backward
use; host copies are freed with the step; the predicted peak equals the one read from the
compiled code."""

from __future__ import annotations

import copy
import gc
import re
import weakref

import pytest
import torch
import torch.nn as nn
from torch._inductor.utils import run_and_get_code

import remat

from .test_offload import cuda_offload_peaks

pytestmark = pytest.mark.inductor


def _mlp(depth=4, width=256):
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())])


def _step(mod, x):
    mod(x).square().mean().backward()


def _call_lines(code: str) -> list[str]:
    """The body of the generated ``call``, one stripped line each, without its argument
    unpacking and size checks."""
    body = code[code.index("def call(self, args):"):]
    lines = [ln.strip() for ln in body[:body.index("return (")].splitlines()[1:]]
    return [ln for ln in lines if ln and not ln.endswith("= args") and not ln.startswith("assert_")]


def _refs(line: str, name: str) -> bool:
    return re.search(rf"\b{name}\b", line) is not None


def _aliases(lines: list[str], name: str) -> set[str]:
    """``name`` and the buffers the wrapper binds to it (``buf4 = buf3``)."""
    out = {name}
    for ln in lines:
        m = re.fullmatch(r"(buf\d+) = (buf\d+)", ln)
        if m and m.group(2) in out:
            out.add(m.group(1))
    return out


def _check_forward(lines: list[str]) -> int:
    """Each copy out: nothing but its ``ready`` reads the value after it, no buffer takes the
    value's before that ``ready``, and the value is freed (or reused) right after it. Returns the count."""
    copies = [(k, m) for k, ln in enumerate(lines)
              if (m := re.fullmatch(r"(buf\d+) = torch\.ops\.remat\.to_host\.default\((\w+), True, \[[\d, ]+\]\)", ln))]
    for k, m in copies:
        host, value = _aliases(lines, m.group(1)), m.group(2)
        later = [ln for ln in lines[k + 1:] if _refs(ln, value)]
        ready, free = later[0], later[1:]
        assert re.fullmatch(rf"buf\d+ = torch\.ops\.remat\.ready\.default\((\w+), {value}\)", ready), later
        assert re.search(r"default\((\w+),", ready).group(1) in host
        # freed (or handed to a later buffer: torch 2.14 reuses it) right after the ready, never before
        # it: the ready makes the compute stream wait for the copy, so what runs after it may write
        # there; or, the ready being the forward's last kernel to read it, freed as the forward returns
        assert len(free) <= 1 and all(re.fullmatch(rf"(buf\d+ = {value}; )?del {value}(  # reuse)?", ln)
                                      for ln in free), later
    return len(copies)


def _check_backward(lines: list[str], reload_before: dict[str, str]) -> int:
    """Each copy back: its host copy read by ``to_device`` alone; ``ready`` of it before any
    kernel reads it, and ``to_device`` before the op the plan issues it at (found by the
    ``Source Nodes`` comment Inductor writes above a kernel). Returns the count."""
    copies = [(k, m) for k, ln in enumerate(lines)
              if (m := re.fullmatch(r"(buf\d+) = torch\.ops\.remat\.to_device\.default\((\w+), device\(.*\)\)", ln))]
    for k, m in copies:
        back, host = _aliases(lines, m.group(1)), m.group(2)
        assert [ln for ln in lines if _refs(ln, host)] == [lines[k], f"del {host}"]
        (r, ready), = [(j, ln) for j, ln in enumerate(lines) if ln.startswith("buf") and "remat.ready" in ln
                       and re.search(r"default\((buf\d+)\)", ln) and re.search(r"default\((buf\d+)\)", ln).group(1)
                       in back]
        assert k < r
        waited = _aliases(lines, ready.split(" = ")[0])
        readers = [j for j, ln in enumerate(lines) if any(_refs(ln, b) for b in waited | back)
                   and not re.fullmatch(r"del buf\d+|buf\d+ = buf\d+|.*remat\.(to_device|ready).*", ln)]
        assert readers and min(readers) > r, (ready, readers)
        planned = [j for j, ln in enumerate(lines) if ln.startswith("# Topologically Sorted Source Nodes:")
                   and re.search(rf"[\[ ,]{reload_before[host]}[\],]", ln)]
        assert not planned or k < min(planned), (host, reload_before[host])
    return len(copies)


def _eager_grads_equal(m: nn.Module, base: nn.Module, x: torch.Tensor, where: str = "") -> nn.Module:
    """Check ``m``'s gradients against eager autograd's on a copy of ``base``; the copy."""
    ref = copy.deepcopy(base)
    _step(ref, x)
    for (k, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=f"{k}{where}")
    return ref


def _offloaded_step(base: nn.Module, x: torch.Tensor):
    """One step of ``base`` under remat with ``offload="all"`` (Inductor), its gradients checked
    against eager autograd's: the wrapped model, its reference and the code Inductor generated."""
    m = remat.checkpoint(copy.deepcopy(base), offload="all", strict=True)
    _, codes = run_and_get_code(_step, m, x)
    return m, _eager_grads_equal(m, base, x), codes


def test_gradients_equal_eagers_and_the_copies_stay_where_the_pass_put_them():
    base, x = _mlp(), torch.randn(512, 256)
    m, ref, codes = _offloaded_step(base, x)
    (plan,) = remat.compiled_plans(m)
    assert [o.name for o in plan.offloaded] == ["tanh", "tanh_1", "tanh_2", "sub"]
    assert all(o.released_after and o.reload_before for o in plan.offloaded)
    (bw,) = [c for c in codes if "tangents_1" in c]
    (fw,) = [c for c in codes if c is not bw]
    assert _check_forward(_call_lines(fw)) == len(plan.offloaded)
    assert _check_backward(_call_lines(bw), {o.name: o.reload_before for o in plan.offloaded}) == len(plan.offloaded)
    # the next step runs the same code
    for p in m.parameters():
        p.grad = None
    _step(m, x)
    torch.testing.assert_close(next(m.parameters()).grad, next(ref.parameters()).grad)


def test_host_copies_have_the_graphs_strides_where_inductor_pads_rows():
    """Note [Offload copies]: with Inductor's padding on (a GPU's default; on the CPU switched on
    here) a 1100-wide row is padded to 1120 floats; ``to_host`` is given the graph's strides, so
    the forward returns each host copy as ``to_host`` made it (no copy of it on the host, which
    on a GPU would race the copy from the device), the device value stays held until its
    ``ready``, and the gradients equal eager's."""
    from torch._inductor import config as inductor_config

    if not hasattr(inductor_config, "disable_padding_cpu"):
        pytest.skip("this torch has no switch for Inductor's padding on the CPU")
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(1100, 1100), nn.GELU(), nn.Linear(1100, 1100), nn.GELU(), nn.Linear(1100, 8))
    x = torch.randn(64, 1100)
    with inductor_config.patch(disable_padding_cpu=False, comprehensive_padding=True):  # not monkeypatch: its undo
        m, _, codes = _offloaded_step(base, x)  # deletes a config entry on some torch versions
    (plan,) = remat.compiled_plans(m)
    (fw,) = [c for c in codes if "tangents_1" not in c]
    lines = _call_lines(fw)
    assert re.search(r"empty_strided_cpu\(\(64, 1100\), \(1120, 1\)", fw), "Inductor pads (else this shows nothing)"
    copies = [(k, m_) for k, ln in enumerate(lines)
              if (m_ := re.fullmatch(r"(buf\d+) = torch\.ops\.remat\.to_host\.default\((\w+), True(, .*)?\)", ln))]
    assert len(copies) == len(plan.offloaded) >= 2
    for k, m_ in copies:  # the buffer copied is held, unwritten, until its ready
        value = m_.group(2)
        later = [ln for ln in lines[k + 1:] if _refs(ln, value)]
        ready = rf"buf\d+ = torch\.ops\.remat\.ready\.default\(\w+, {value}\)"
        r = [j for j, ln in enumerate(later) if re.fullmatch(ready, ln)]
        assert r and not any("reuse" in ln or f"del {value}" in ln for ln in later[:r[0]]), later
    body = fw[fw.index("def call(self, args):"):]
    returned = body[body.index("return ("):].split("\n")[0]
    for ln in lines:
        if r := re.fullmatch(r"(buf\d+) = torch\.ops\.remat\.ready\.default\(.*", ln):
            assert any(_refs(returned, n) for n in _aliases(lines, r.group(1))), "returned as made, not copied"
    assert not [ln for ln in lines if re.match(r"cpp_fused_\w*(clone|copy)", ln)], "no host copy of a host copy"


def test_the_predicted_peak_is_the_compiled_ones():
    # On CPU the host is the device: the host copies count, and the copies save nothing (the
    # plan without offload reads the same peak); the step model replays them kernel by kernel.
    base, x = _mlp(), torch.randn(512, 256)
    torch._dynamo.reset()
    moved = remat.checkpoint(copy.deepcopy(base), offload="all", strict=True)
    _step(moved, x)
    (plan,) = remat.compiled_plans(moved)
    assert plan.offloaded and plan.compiled_peak_bytes > 0
    assert plan.simulated_peak_bytes == plan.compiled_peak_bytes == plan.predicted_peak_bytes
    assert any("their host copies count in the peak" in n for n in plan.notes), plan.notes
    torch._dynamo.reset()
    plain = remat.checkpoint(copy.deepcopy(base), strict=True)
    _step(plain, x)
    (before,) = remat.compiled_plans(plain)
    assert before.saved == plan.saved and before.compiled_peak_bytes == plan.compiled_peak_bytes


def test_host_copies_live_between_the_halves_and_are_freed_with_the_step(monkeypatch):
    torch._dynamo.reset()
    base, x = _mlp(), torch.randn(512, 256)
    m = remat.checkpoint(copy.deepcopy(base), offload="all", strict=True)
    _step(m, x)  # compiles both halves; their code calls torch.ops.remat.to_host.default by name
    made, real = [], torch.ops.remat.to_host.default

    def to_host(*args):
        out = real(*args)
        made.append(weakref.ref(out))
        return out

    monkeypatch.setattr(torch.ops.remat.to_host, "default", to_host)
    loss = m(x).square().mean()
    gc.collect()
    assert len(made) == 4 and all(r() is not None for r in made)  # held by autograd for the backward
    loss.backward()
    del loss
    gc.collect()
    assert all(r() is None for r in made)


def test_offload_auto_on_cpu_moves_nothing_and_says_why():
    torch._dynamo.reset()
    base, x = _mlp(), torch.randn(512, 256)
    m = remat.checkpoint(copy.deepcopy(base), offload="auto", strict=True)
    _step(m, x)
    (plan,) = remat.compiled_plans(m)
    assert plan.offloaded == ()
    assert "offload='auto': nothing offloaded, the device is the host (CPU)" in plan.notes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: copies on side streams to pinned memory")
@pytest.mark.parametrize("mode", ["auto", "all"])
def test_offload_on_cuda_keeps_gradients_and_lowers_the_measured_peak(mode):
    plan, peaks = cuda_offload_peaks("inductor", mode)
    if mode == "auto" and not plan.offloaded:
        assert any("no copy is hidden" in n for n in plan.notes), plan.notes
        return
    assert plan.offloaded and all(o.released_after for o in plan.offloaded)
    if mode == "auto":
        assert plan.offload_stall_seconds == 0.0  # only what the step hides
    assert peaks[2] < peaks[1], peaks
    # the read peak counts no host buffer: the step model's prediction, with the copies
    assert plan.compiled_peak_bytes == pytest.approx(plan.simulated_peak_bytes, rel=0.02), plan.notes
    assert plan.compiled_peak_bytes == pytest.approx(peaks[2], rel=0.05), (plan.compiled_peak_bytes, peaks)


def test_offload_with_dynamic_shapes_keeps_gradients_across_sizes():
    """The host copies' strides are symbolic where the graph's are (``to_host``'s ``stride``):
    one compile serves three batch sizes, each step's gradients equal eager's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    m = remat.checkpoint(copy.deepcopy(base), offload="all", dynamic=True, strict=True)
    for n in (32, 48, 80):
        x = torch.randn(n, 64)
        for p in m.parameters():
            p.grad = None
        _step(m, x)
        _eager_grads_equal(m, base, x, f" at batch {n}")
    (plan,) = remat.compiled_plans(m)
    assert plan.offloaded


def _convnet():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, 4))


def _copied_host_copies(lines: list[str]) -> list[str]:
    """The host kernels of a generated forward that read a ``ready``'s result: a host copy copied
    again (Note [Host copy layout])."""
    readies = {b for ln in lines if (r := re.fullmatch(r"(buf\d+) = torch\.ops\.remat\.ready\.default.*", ln))
               for b in _aliases(lines, r.group(1))}
    return [ln for ln in lines if re.match(r"cpp_fused_\w*\(", ln) and any(_refs(ln, b) for b in readies)]


def test_host_copies_of_a_convnet_take_inductors_channels_last_layout(monkeypatch):
    """Note [Host copy layout]: Inductor lays a conv net's forward outputs out channels-last (its
    layout optimization, on for this graph on the CPU as on a GPU); each 4-D host copy it keeps
    so is made channels-last, so the forward returns it as ``to_host`` made it, with no copy of it
    on the host (on a GPU, a copy into pageable memory that ``to_device`` refuses), and the
    gradients equal eager's. Without the layout the host copies are copied again."""
    from remat.backends.inductor.backend import InductorBackend

    base, x = _convnet(), torch.randn(8, 3, 24, 24)
    torch._dynamo.reset()
    m, _, codes = _offloaded_step(base, x)
    (plan,) = remat.compiled_plans(m)
    (fw,) = [c for c in codes if "tangents_1" not in c]
    lines = _call_lines(fw)
    made = {m_.group(1): m_.group(2) for ln in lines
            if (m_ := re.fullmatch(r"(buf\d+) = torch\.ops\.remat\.to_host\.default\(\w+, True, (\[[\d, ]+\])\)", ln))}
    assert len(made) == len(plan.offloaded) >= 3
    # those Inductor keeps channels-last (up to the last convolution) are made so; the rest as traced
    assert any(re.fullmatch(r"\[\d+, 1, \d+, \d+\]", s) and not s.endswith(", 1]") for s in made.values()), made
    body = fw[fw.index("def call(self, args):"):]
    returned = body[body.index("return ("):].split("\n")[0]
    for ln in lines:
        if r := re.fullmatch(r"(buf\d+) = torch\.ops\.remat\.ready\.default\(.*", ln):
            assert any(_refs(returned, n) for n in _aliases(lines, r.group(1))), f"{ln}: returned copied"
    assert not _copied_host_copies(lines)
    torch._dynamo.reset()
    monkeypatch.setattr(InductorBackend, "channels_last", lambda self, forward: frozenset())
    _, _, codes = _offloaded_step(base, x)
    (fw,) = [c for c in codes if "tangents_1" not in c]
    assert _copied_host_copies(_call_lines(fw)), "without the layout Inductor copies them (else this shows nothing)"
