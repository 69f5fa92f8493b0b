"""An LM loss computed in the graph (HF's ``labels=``): its log-softmax is recomputed in the
backward from the logits and the two row statistics under Inductor, as torch.compile does, and no
float32 tensor of vocabulary width is saved (op by op, the log-softmax's exp is saved instead) (Note [Normalization boundary]; ``graph._reaches_reduction_pointwise``)."""

from __future__ import annotations

import pytest
import torch
import transformers

import remat


def gpt2(vocab: int = 5000) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=vocab, n_positions=128,
                                  attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16).train()
    return model, torch.randint(0, vocab, (2, 64), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_lm_loss_saves_the_logits_and_row_statistics(backend):
    model, ids = gpt2()
    plan = remat.explain(remat.checkpoint(model, backend=backend), input_ids=ids, labels=ids)
    assert plan.graphs == 1  # HF's loss logs a warning_once: no graph break (Note [Logging does not split the graph])
    wide = [s for s in plan.saved if s.shape and s.shape[-1] == 5000]
    assert len(wide) == 1, "one tensor of vocabulary width kept for the backward"
    if backend == "eager":  # op by op, the log-softmax's five kernels cost more than saving its exp
        assert [(s.op, s.dtype) for s in wide] == [("aten.exp.default", "float32")]
        return
    # fused, the log-softmax is recomputed from the bf16 logits and its two row statistics
    assert [(s.op, s.dtype) for s in wide] == [("aten.mm.default", "bfloat16")], "the logits, as the head made them"
    rows = sorted(s.op for s in plan.saved if s.shape == (128, 1))
    assert rows == ["aten.amax.default", "aten.log.default"]
    assert not any(s.reason == "normalization boundary" for s in plan.saved if s.shape == (128, 1))


def test_lm_loss_gradients_match_eager():
    model, ids = gpt2()
    ref = transformers.GPT2LMHeadModel(model.config).to(torch.bfloat16).train()
    ref.load_state_dict(model.state_dict())
    for m in (model, ref):
        m.config.resid_pdrop = m.config.embd_pdrop = m.config.attn_pdrop = 0.0
    for mod in list(model.modules()) + list(ref.modules()):
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    remat.checkpoint(model, backend="eager")(input_ids=ids, labels=ids).loss.backward()
    ref(input_ids=ids, labels=ids).loss.backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-2, rtol=1e-2)
