"""Outputs, input grads, parameter grads and buffers equal eager autograd's."""

import pytest
import torch

import remat
from zoo import workloads
from zoo.modules import ConvBnRelu, InplaceViews, SharedParam

from ..conftest import assert_same_training

BACKENDS = ["eager", pytest.param("inductor", marks=[pytest.mark.inductor, pytest.mark.slow])]


def workload(name):
    def make():
        return workloads.build(name)[0]

    return make, workloads.build(name)[1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", workloads.WORKLOADS)
def test_reference_workloads(name, backend):
    make, x = workload(name)
    tol = dict(atol=2e-5, rtol=2e-4) if backend == "inductor" else {}
    rm = assert_same_training(make, [x], backend, **tol)
    plans = remat.compiled_plans(rm)
    assert len(plans) == 1 and plans[0].fallback is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_batchnorm_relu_train_mode_running_stats(backend):
    x = torch.randn(4, 3, 8, 8)
    tol = dict(atol=2e-5, rtol=2e-4) if backend == "inductor" else {}
    rm = assert_same_training(ConvBnRelu, [x.requires_grad_()], backend, steps=3, lr=0.1, **tol)
    assert int(rm.bn1.num_batches_tracked) == 3


def test_inplace_and_views():
    assert_same_training(InplaceViews, [torch.randn(8, 16, requires_grad=True)], "eager")


def test_shared_parameter():
    assert_same_training(SharedParam, [torch.randn(8, 16, requires_grad=True)], "eager")


class _Logits(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, use_cache=False).logits


def test_hf_gpt2_tiny_random():
    import transformers
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)

    def make():
        torch.manual_seed(0)
        return _Logits(transformers.GPT2LMHeadModel(cfg).train())

    ids = torch.randint(0, 97, (2, 12))
    rm = assert_same_training(make, [ids], "eager")
    plan = remat.compiled_plans(rm)[0]
    assert plan.fallback is None and plan.saved_bytes < plan.eager_saved_bytes
