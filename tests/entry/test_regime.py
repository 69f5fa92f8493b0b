"""``remat.regime`` (issue 25's regime report): the pure summary of a profiled step's kernels
(``remat.core.regime``: overlaps counted once, the three parts adding up to the step), and on the
CPU a real step: its matmul FLOPs counted exactly, the model left as it was, the CLI."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import remat
from remat.core.regime import KernelRun, Kind, kind_of, summarize


def test_overlapping_kernels_count_once_and_the_parts_add_up():
    runs = [KernelRun("sm90_xmma_gemm_bf16", 0.0, 2.0, flops=4e12), KernelRun("flash_fwd_kernel", 1.0, 3.0, 2e12),
            KernelRun("triton_poi_fused_add_3", 2.5, 4.0), KernelRun("triton_red_fused_sum_1", 3.5, 4.5)]
    r = summarize(runs, step_seconds=6.0, peak_flops=1e13, peak_bandwidth=1e12)
    assert r.compute_seconds == pytest.approx(3.0)  # [0, 3]
    assert r.bandwidth_seconds == pytest.approx(1.5)  # [2.5, 4.5] outside [0, 3]
    assert r.overhead_seconds == pytest.approx(1.5)
    assert r.compute_fraction + r.bandwidth_fraction + r.overhead_fraction == pytest.approx(1.0)
    assert r.achieved_flops == pytest.approx(2e12) and r.dominant == "compute"
    assert [t[0] for t in r.top][:2] == ["sm90_xmma_gemm_bf16", "flash_fwd_kernel"]
    text = str(r)
    assert "compute-bound" in text and "2.0 TFLOP/s" in text and "20%" in text


def test_kernel_kinds_by_name():
    for name in ("void cutlass::Kernel2<gemm>", "nvjet_tst_128x64", "aten::mm", "aten::convolution",
                 "fmha_cutlassB_f16", "cudnn_conv_dgrad", "aten::_grouped_mm"):
        assert kind_of(name) is Kind.COMPUTE, name
    for name in ("triton_poi_fused_mm_relu_0", "cpp_fused_add_mul_1", "aten::gelu", "Memcpy DtoD", "aten::sum"):
        assert kind_of(name) is Kind.BANDWIDTH, name


def test_a_step_longer_than_its_kernels_is_overhead_and_never_negative():
    r = summarize([KernelRun("aten::add", 0.0, 1.0)], step_seconds=0.5, peak_flops=1.0, peak_bandwidth=1.0)
    assert r.step_seconds == 1.0 and r.overhead_seconds == 0.0 and r.dominant == "bandwidth"
    assert r.achieved_flops is None and "FLOPs not known" in str(r)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 512)
        self.bn = nn.BatchNorm1d(512)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.bn(self.fc(x))))


@pytest.mark.parametrize("wrap", [False, True], ids=["eager", "remat"])
def test_a_cpu_step_counts_its_matmul_flops_and_leaves_the_model_as_it_was(wrap):
    torch.manual_seed(0)
    net = Net()
    model = remat.checkpoint(net, backend="eager") if wrap else net
    x = torch.randn(64, 256)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    rng = torch.get_rng_state()
    r = remat.regime(model, x)
    # the forward's addmm and the weight gradient's mm (x needs no gradient): 2 x 64 x 256 x 512 each
    assert r.flops == 2 * (2 * 64 * 256 * 512)
    assert r.compute_seconds > 0 and r.bandwidth_seconds > 0 and r.device == "cpu"
    assert r.compute_seconds + r.bandwidth_seconds + r.overhead_seconds == pytest.approx(r.step_seconds)
    assert all(p.grad is None for p in net.parameters())
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k  # BatchNorm's statistics and num_batches_tracked too
    assert torch.equal(torch.get_rng_state(), rng)


def test_regime_rejects_bad_input():
    with pytest.raises(remat.RematError, match="^remat: regime expects a model instance"):
        remat.regime(nn.Linear, torch.randn(2, 2))
    with pytest.raises(remat.RematError, match="warmup"):
        remat.regime(nn.Linear(2, 2), torch.randn(2, 2), warmup=-1)
    with pytest.raises(remat.RematError, match="loss_fn"):
        remat.regime(lambda x: x.detach(), torch.randn(2, 2))
    with pytest.raises(remat.RematError, match="unknown device model"):
        remat.regime(nn.Linear(2, 2), torch.randn(2, 2), device_model="tpu")


def test_cli_regime_prints_the_three_parts():
    demo = pathlib.Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
    out = subprocess.run([sys.executable, "-m", "remat", "regime", f"{demo}:factory"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for part in ("regime of one training step on cpu", "compute", "bandwidth", "overhead", "kernel runs"):
        assert part in out.stdout
