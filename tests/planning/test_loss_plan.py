"""An LM loss computed in the graph (HF's ``labels=``): its log-softmax is recomputed in the
backward from the logits and the two row statistics, as torch.compile does, and no float32
tensor of vocabulary width is saved (Note [Normalization boundary]; ``graph._reaches_reduction_pointwise``)."""

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
    loss_graph = [s for s in plan.saved if s.name.startswith("g1.")]  # HF computes the loss after a graph break
    wide = [s for s in loss_graph if s.shape and s.shape[-1] == 5000]
    assert [(s.op, s.dtype) for s in wide] == [("input", "bfloat16")], "the logits, as the loss graph received them"
    rows = sorted(s.op for s in loss_graph if s.shape == (128, 1))
    assert rows == ["aten.amax.default", "aten.log.default"]
    assert not any(s.reason == "normalization boundary" for s in loss_graph)


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


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_under_a_budget_the_loss_stays_in_the_graph(backend):
    # HF's loss logs a warning_once: Dynamo breaks the graph there, unless a budget asks for the
    # step as one graph (Note [Logging does not split the graph] in remat/compat.py)
    model, ids = gpt2()
    unbudgeted = remat.explain(remat.checkpoint(model, backend=backend), input_ids=ids, labels=ids)
    budgeted = remat.explain(remat.checkpoint(model, backend=backend, budget=1.0), input_ids=ids, labels=ids)
    assert (unbudgeted.graphs, budgeted.graphs) == (2, 1)
    assert budgeted.budget_bytes is not None
