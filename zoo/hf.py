"""Hugging Face ``transformers`` models, built from their configs (random weights, no download).

Every builder takes ``(tiny, device, gen, no_dropout, batch, config)`` and returns a ``Workload``
(without its name, which the registry sets). ``batch`` = (batch, sequence) replaces the input
shape; ``config`` adds keyword arguments to the model's config (``long_context.py``: batch 1,
longer positions). The models are built inside ``torch.device(device)`` by ``zoo.build``.
"""

from __future__ import annotations

import torch

from .workload import Workload, hf_ckpt, hf_lm_loss, hf_loss

__all__ = ["gpt2", "llama", "bert", "t5", "mixtral", "mamba2"]


def _info(cfg, batch: list[int], attention: bool = True, **extra) -> dict:
    import transformers

    info = {"library": f"transformers {transformers.__version__}", "batch": batch}
    if attention:
        info["attn_implementation"] = cfg._attn_implementation
    return {**info, **extra}


def _ids(vocab: int, shape: tuple[int, int], gen: torch.Generator, device) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=gen, device=device)


def _lm(model, cfg, shape: tuple[int, int], gen, device, dropout: float, **extra) -> Workload:
    """A causal LM stepped on random token ids with its own loss (``labels=input_ids``)."""
    ids = _ids(cfg.vocab_size, shape, gen, device)
    return Workload("", model, {"ids": ids}, hf_lm_loss, hf_ckpt, dropout, _info(cfg, list(shape), **extra))


def gpt2(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """GPT-2 124M (its default dropout 0.1), 8 x 1024 tokens."""
    import transformers

    kw = (dict(n_layer=2, n_embd=64, n_head=2, n_positions=64, vocab_size=512, bos_token_id=0, eos_token_id=0)
          if tiny else dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024))
    if no_dropout:
        kw.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg = transformers.GPT2Config(**{**kw, **(config or {})}, attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(cfg)
    return _lm(model, cfg, batch or ((2, 64) if tiny else (8, 1024)), gen, device, cfg.resid_pdrop)


def llama(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """Llama, 1024 wide, 12 layers, GQA (16 query, 4 key/value heads), 8 x 2048 tokens."""
    import transformers

    kw = (dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=512) if tiny else
          dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
               num_key_value_heads=4, vocab_size=32000))
    cfg = transformers.LlamaConfig(**{**kw, **(config or {})}, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg)
    return _lm(model, cfg, batch or ((2, 64) if tiny else (8, 2048)), gen, device, cfg.attention_dropout)


def mixtral(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """A small Mixtral: 8 experts, top-2 routing, GQA, 12 layers 1024 wide, 8 x 1024 tokens; the
    experts run as transformers' default ``experts_implementation`` (``grouped_mm``: tokens sorted
    by expert, one grouped matmul per projection)."""
    import transformers

    kw = (dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=512) if tiny else
          dict(hidden_size=1024, intermediate_size=1408, num_hidden_layers=12, num_attention_heads=16,
               num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000))
    cfg = transformers.MixtralConfig(**{**kw, **(config or {})}, attn_implementation="sdpa")
    model = transformers.MixtralForCausalLM(cfg)
    return _lm(model, cfg, batch or ((2, 64) if tiny else (8, 1024)), gen, device, cfg.attention_dropout,
               experts_implementation=cfg._experts_implementation)


def mamba2(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """Mamba-2 (a state-space LM, no attention), 12 layers 768 wide, 24 heads of 64, state 128,
    chunks of 256, 8 x 1024 tokens. Without the ``mamba_ssm`` and ``causal_conv1d`` kernels
    (not installed) transformers runs its torch path: a depthwise causal conv1d and the chunked
    scan written in torch ops (segment sums, broadcast products reduced over the chunk)."""
    import transformers

    kw = (dict(hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32, state_size=16, n_groups=1,
               chunk_size=16, vocab_size=512) if tiny else
          dict(hidden_size=768, num_hidden_layers=12, num_heads=24, head_dim=64, state_size=128, n_groups=1,
               chunk_size=256, vocab_size=32000))
    cfg = transformers.Mamba2Config(**{**kw, **(config or {})})
    model = transformers.Mamba2ForCausalLM(cfg)
    return _lm(model, cfg, batch or ((2, 64) if tiny else (8, 1024)), gen, device, 0.0, attention=False)


def bert(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """BERT-base masked LM (its default dropout 0.1, on attention probabilities too), 32 x 512
    tokens, the model's MLM loss on a random 15% of the positions."""
    import transformers

    kw = (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=512,
               max_position_embeddings=64) if tiny else {})  # the defaults are bert-base-uncased's
    if no_dropout:
        kw.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg = transformers.BertConfig(**{**kw, **(config or {})}, attn_implementation="sdpa")
    model = transformers.BertForMaskedLM(cfg)
    shape = batch or ((2, 64) if tiny else (32, 512))
    ids = _ids(cfg.vocab_size, shape, gen, device)
    picked = torch.rand(shape, generator=gen, device=device) < 0.15
    labels = torch.where(picked, ids, torch.full_like(ids, -100))
    dropout = max(cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob)
    return Workload("", model, {"input_ids": ids, "labels": labels}, hf_loss, hf_ckpt, dropout,
                    _info(cfg, list(shape)))


def t5(tiny, device, gen, no_dropout, batch, config) -> Workload:
    """T5-base (v1.0: ReLU feed-forward, 12 + 12 layers, relative position bias, dropout 0.1),
    32 x 512 source tokens, 32 x 128 targets, the model's seq2seq loss."""
    import transformers

    kw = (dict(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4, vocab_size=512) if tiny else
          dict(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_heads=12, vocab_size=32128))
    if no_dropout:
        kw.update(dropout_rate=0.0)
    cfg = transformers.T5Config(**{**kw, **(config or {})}, decoder_start_token_id=0, attn_implementation="sdpa")
    model = transformers.T5ForConditionalGeneration(cfg)
    b, s = batch or ((2, 64) if tiny else (32, 512))
    ids = _ids(cfg.vocab_size, (b, s), gen, device)
    labels = _ids(cfg.vocab_size, (b, max(s // 4, 1)), gen, device)
    return Workload("", model, {"input_ids": ids, "labels": labels}, hf_loss, hf_ckpt, cfg.dropout_rate,
                    _info(cfg, [b, s, labels.shape[1]]))
