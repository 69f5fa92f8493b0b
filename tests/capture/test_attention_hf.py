"""Attention as eager runs it (Note [Attention as eager runs it] in remat/capture/attention.py):
the pass over Dynamo graphs turns masks computed from constants into ``attn_mask=None`` or
``is_causal=True`` and repeat_kv expansions into ``enable_gqa=True``, leaves masks that depend on
an input's values alone, and the tiny Hugging Face models' joint graphs then run the fused SDPA
kernel (no batched matmuls or softmax over scores, no length x length value saved), with eager
autograd's loss and gradients on the uncompiled backend.

Hugging Face builds its masks inside the graph where ``torch.compiler.is_exporting()`` reads as
true under Dynamo (torch before pytorch#176499; ``benchmarks/long_context.py``'s
``dynamo_sees_exporting`` asks); where it reads false transformers skips the masks itself, so the
HF tests patch transformers' check to build the masks as those releases do (``built_masks``)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import remat
import zoo
from remat.analysis import cost
from remat.analysis.op_facts import op_facts
from remat.capture.attention import AttentionReport, gqa_kernel_refusal, is_sdpa, rewrite_attention
from remat.policy import BUILTIN_RULES

FUSED_CPU = "aten._scaled_dot_product_flash_attention_for_cpu.default"
MATH_OPS = ("aten.bmm.default", "aten._softmax.default", "aten._safe_softmax.default")
SEQ = 48
"""The HF tests' sequence length: unlike the tiny models' widths (64), a length x length value is
attention's."""


# --- the pass on small modules ------------------------------------------------------------------

def _captured(fn, *inputs, dynamic=False):
    """``fn``'s Dynamo graph after the pass, its report, and its output."""
    seen = {}

    def backend(gm, example_inputs):
        seen["report"] = rewrite_attention(gm)
        seen["gm"] = gm
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*inputs)
    return seen["gm"], seen["report"], out


def _sdpa(gm):
    (node,) = [n for n in gm.graph.nodes if is_sdpa(n)]
    return node


def _qkv(heads=4, kv_heads=4, seq=8):
    torch.manual_seed(0)
    return (torch.randn(2, heads, seq, 16), torch.randn(2, kv_heads, seq, 16), torch.randn(2, kv_heads, seq, 16))


def test_an_all_true_mask_becomes_no_mask():
    def f(q, k, v):
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None].expand(2, 1, -1, -1))

    q, k, v = _qkv()
    gm, report, out = _captured(f, q, k, v)
    assert _sdpa(gm).kwargs["attn_mask"] is None and not _sdpa(gm).kwargs["is_causal"]
    assert (report.no_mask, report.causal) == (1, 0)
    assert "1 masks recognised as none" in report.note()
    assert not any(n.target is torch.ones for n in gm.graph.nodes)  # the mask's nodes are gone
    torch.testing.assert_close(out, f(q, k, v), rtol=0, atol=1e-6)


@pytest.mark.parametrize("additive", [False, True])
def test_the_causal_triangle_becomes_is_causal(additive):
    def f(q, k, v):
        i = torch.arange(q.shape[-2], device=q.device)
        allowed = i[None, :] <= i[:, None]
        mask = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, float("-inf")) if additive else allowed
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = _qkv()
    gm, report, out = _captured(f, q, k, v)
    assert _sdpa(gm).kwargs["attn_mask"] is None and _sdpa(gm).kwargs["is_causal"] is True
    assert report.causal == 1
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=0, atol=1e-6)


def test_a_mask_of_a_dynamic_length_is_left_alone():
    def f(q, k, v):
        i = torch.arange(q.shape[-2], device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=i[None, :] <= i[:, None])

    gm, report, out = _captured(f, *_qkv(), dynamic=True)
    assert isinstance(_sdpa(gm).kwargs["attn_mask"], torch.fx.Node) and report.rewritten == 0
    assert "dynamic" in report.note()


def test_a_mask_from_an_input_is_left_alone():
    def f(q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])

    q, k, v = _qkv()
    keep = torch.ones(2, 8, dtype=torch.bool)  # all true, but its values are the caller's
    gm, report, _ = _captured(f, q, k, v, keep)
    assert isinstance(_sdpa(gm).kwargs["attn_mask"], torch.fx.Node)
    assert report.rewritten == 0
    assert "masks kept: the mask depends on graph input" in report.note()


@pytest.mark.parametrize("make, why", [
    (lambda q: torch.rand(8, 8) < 2.0, "random op"),  # all true, but drawn
    (lambda q: torch.ones(8, 8, dtype=torch.bool).triu(), "other positions"),  # constant, not causal
    (lambda q: torch.empty(8, 8, dtype=torch.bool) | True, "uninitialised"),
])
def test_masks_that_are_not_provably_none_or_causal_stay(make, why):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=make(q))

    gm, report, _ = _captured(f, *_qkv())
    assert isinstance(_sdpa(gm).kwargs["attn_mask"], torch.fx.Node)
    assert report.rewritten == 0 and why in report.note()


@pytest.mark.parametrize("room, rewritten", [(1 << 40, 1), (64, 0)])
def test_a_mask_too_long_for_the_device_is_evaluated_on_the_host(monkeypatch, room, rewritten):
    """Note [Long masks are evaluated on the host]: past ``MAX_MASK_ELEMENTS`` the mask's cone runs
    on the host when its bytes fit there (rows compared a block at a time), and stays otherwise,
    saying what it needed."""
    from remat.capture import attention_mask
    monkeypatch.setattr(attention_mask, "MAX_MASK_ELEMENTS", 16)
    monkeypatch.setattr(attention_mask, "BLOCK_ELEMENTS", 24)  # 3 rows of 8 keys a block
    monkeypatch.setattr(attention_mask, "host_available_bytes", lambda: room)
    seen = []
    real = attention_mask._evaluate
    monkeypatch.setattr(attention_mask, "_evaluate", lambda *a: seen.append(a[2]) or real(*a))

    def f(q, k, v):
        i = torch.arange(q.shape[-2], device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=(i[None, :] <= i[:, None])[None, None])

    q, k, v = _qkv()
    gm, report, out = _captured(f, q, k, v)
    assert report.causal == rewritten and seen == ([True] if rewritten else [])
    if not rewritten:
        assert "too large to evaluate (its ops make" in report.note()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=0, atol=1e-6)


@pytest.mark.parametrize("row", [0, 3, 7])
def test_a_triangle_off_in_one_row_stays_whichever_block_holds_it(monkeypatch, row):
    from remat.capture import attention_mask
    monkeypatch.setattr(attention_mask, "BLOCK_ELEMENTS", 24)

    def f(q, k, v):
        i = torch.arange(q.shape[-2], device=q.device)
        allowed = (i[None, :] <= i[:, None]) ^ ((i[:, None] == row) & (i[None, :] == 7))  # key 7 flipped
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    gm, report, _ = _captured(f, *_qkv())
    assert report.rewritten == 0 and "other positions" in report.note()


def test_a_mask_built_from_an_inputs_shape_only_is_a_constant():
    def f(q, k, v, ids):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones_like(ids, dtype=torch.bool)[:, None, None])

    gm, report, _ = _captured(f, *_qkv(), torch.randint(0, 9, (2, 8)))
    assert _sdpa(gm).kwargs["attn_mask"] is None and report.no_mask == 1


def _repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


@pytest.mark.parametrize("expand", [_repeat_kv, lambda x, n: x.repeat_interleave(n, dim=1)])
def test_expanded_keys_and_values_are_read_unexpanded_with_enable_gqa(expand):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, expand(k, 2), expand(v, 2), is_causal=True)

    q, k, v = _qkv(heads=4, kv_heads=2)
    gm, report, out = _captured(f, q, k, v)
    node = _sdpa(gm)
    assert node.kwargs["enable_gqa"] is True and node.args[1].meta["example_value"].shape[1] == 2
    assert not any(n.target in ("expand", "reshape", "repeat_interleave") for n in gm.graph.nodes)
    assert report.gqa == 1
    torch.testing.assert_close(out, f(q, k, v), rtol=0, atol=1e-6)


def test_with_a_mask_left_cpu_reads_unexpanded_keys_and_values_too():
    """CPU's fused kernel takes a mask with ``enable_gqa``: the expansions go, the mask stays."""
    def f(q, k, v, keep):
        return F.scaled_dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2), attn_mask=keep[:, None, None])

    q, k, v = _qkv(heads=4, kv_heads=2)
    keep = torch.rand(2, 8) < 0.7
    keep[:, 0] = True
    gm, report, out = _captured(f, q, k, v, keep)
    assert _sdpa(gm).kwargs["enable_gqa"] is True and isinstance(_sdpa(gm).kwargs["attn_mask"], torch.fx.Node)
    torch.testing.assert_close(out, f(q, k, v, keep), rtol=0, atol=1e-6)


@pytest.mark.parametrize("device, masked, dims, why", [
    ("cuda", True, (64, 64), "a mask remains"),
    ("cuda", False, (512, 512), "head dims 512/512"),
    ("cuda", False, (64, 32), "head dims 64/32"),
    ("cuda", False, (128, 128), None),
    ("cpu", True, (512, 512), None),
])
def test_where_a_fused_kernel_runs_enable_gqa(device, masked, dims, why):
    got = gqa_kernel_refusal(device, masked, *dims)
    assert got is None if why is None else why in got


def test_a_graph_whose_attention_is_already_eagers_has_no_note():
    assert AttentionReport().note() is None
    gm, report, _ = _captured(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), *_qkv())
    assert report.calls == 1 and report.note() is None


# --- analysis: fused kernels are matmul-like, their dropout random, causal FLOPs half ----------

def _fused_node(op, *args):
    g = torch.fx.Graph()
    node = g.call_function(op, args)
    node.meta["val"] = None
    return node


@pytest.mark.parametrize("op, args", [
    (torch.ops.aten._scaled_dot_product_flash_attention.default, (None, None, None, 0.1, True)),
    (torch.ops.aten._scaled_dot_product_efficient_attention.default, (None, None, None, None, True, 0.1, True)),
    (torch.ops.aten._scaled_dot_product_cudnn_attention.default, (None, None, None, None, True, 0.1, True)),
    (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, (None, None, None, 0.1, True)),
])
def test_fused_attention_with_dropout_is_random_and_replayed_so_saved_as_attention(op, args):
    """With dropout, attention is random but replayable (Note [Replayed random ops]): not unsafe,
    so the attention rule (a cost rule) decides it, with or without dropout; a generator argument
    would make it unsafe."""
    with_dropout = op_facts(_fused_node(op, *args))
    assert with_dropout.is_attention and with_dropout.is_random and with_dropout.is_replayable
    assert with_dropout.unsafe_to_recompute is None
    without = op_facts(_fused_node(op, *[0.0 if a == 0.1 else a for a in args]))
    assert without.is_attention and not without.is_random and without.unsafe_to_recompute is None
    (rule,) = [r for r in BUILTIN_RULES if r.name == "attention"]
    assert rule.cost  # matmul-like: saved by default, recomputed only when a budget asks
    fixed = _fused_node(op, *args)
    fixed.kwargs = {"generator": object()}
    assert op_facts(fixed).unsafe_to_recompute == "random op"


def test_causal_attention_costs_half_the_flops():
    q = torch.empty(2, 4, 128, 64, device="meta")
    full = cost.flops("aten._scaled_dot_product_flash_attention.default", q, [q, q, q])
    assert full == 4 * 2 * 4 * 128 * 128 * 64
    assert cost.flops("aten._scaled_dot_product_flash_attention.default", q, [q, q, q], causal=True) == full // 2


# --- tiny Hugging Face models on the uncompiled backend -----------------------------------------

@pytest.fixture
def built_masks(monkeypatch):
    """transformers builds its SDPA masks inside Dynamo graphs (see the module docstring)."""
    import transformers.masking_utils as masking

    monkeypatch.setattr(masking, "is_torchdynamo_exporting", lambda: True)


def _grads(model):
    return [p.grad for p in model.parameters() if p.grad is not None]


def _step(wl, model, fn, seed, **extra):
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = wl.loss(fn, {**wl.inputs, **extra}) if not extra else _loss_with(wl, fn, extra)
    loss.backward()
    return loss.detach(), _grads(model)


def _loss_with(wl, fn, extra):
    kwargs = {"input_ids": wl.inputs["ids"], "labels": wl.inputs["ids"]} if "ids" in wl.inputs else dict(wl.inputs)
    return fn(**kwargs, **extra).loss


def _assert_close(got, want, rtol=1e-4):
    """Each gradient within ``rtol`` of eager's, relative to the larger of its own norm and a
    thousandth of the step's gradient scale (a key bias's gradient is zero up to rounding)."""
    scale = max(float(w.norm()) for w in want)
    for g, w in zip(got, want, strict=True):
        assert float((g - w).norm()) <= rtol * max(float(w.norm()), 1e-3 * scale)


def _against_eager(name, *, no_dropout, extra=None):
    """remat's plan (uncompiled backend) and its loss and gradients, checked against eager's with
    the same seed on the second step (the first captures)."""
    wl = zoo.build(name, tiny=True, device="cpu", dtype=torch.float32, no_dropout=no_dropout, batch=(2, SEQ))
    model = copy.deepcopy(wl.model)
    wrapped = remat.checkpoint(model, backend="eager")
    extra = extra or {}
    _step(wl, model, wrapped, 1, **extra)
    loss, grads = _step(wl, model, wrapped, 2, **extra)
    want_loss, want = _step(wl, wl.model, wl.model, 2, **extra)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=0)
    _assert_close(grads, want)
    return remat.compiled_plans(wrapped), wl


def _ops(plans):
    return [n.op for p in plans for n in p.nodes]


def _fused(plans):
    return [n for p in plans for n in p.nodes if n.op == FUSED_CPU]


def _note(plans):
    return " ".join(n for p in plans for n in p.notes if n.startswith("attention:"))


def _no_scores_saved(plans, seq):
    saved = [s for p in plans for s in p.saved]
    assert saved and not [s for s in saved if tuple(s.shape[-2:]) == (seq, seq)]


@pytest.mark.slow
@pytest.mark.parametrize("name, kind", [("bert", "none"), ("gpt2", "causal")])
def test_hf_masks_are_recognised_and_the_fused_kernel_runs(built_masks, name, kind):
    plans, wl = _against_eager(name, no_dropout=True)
    ops = _ops(plans)
    assert FUSED_CPU in ops and not any(op in ops for op in MATH_OPS)
    assert [len(n.inputs) for n in _fused(plans)] == [3, 3]  # query, key, value: no mask
    assert f"2 masks recognised as {kind}" in _note(plans)
    _no_scores_saved(plans, SEQ)


@pytest.mark.slow
def test_without_the_rewrite_the_captured_masks_take_the_math_path(built_masks, monkeypatch):
    """The test above can fail: with the pass off, the fused kernel reads the built mask (CPU's
    takes one; CUDA's flash kernel does not, and its dropout then runs the math path)."""
    monkeypatch.setattr("remat.capture.dynamo_backend.rewrite_attention", lambda gm, strict=False: AttentionReport())
    wl = zoo.build("bert", tiny=True, device="cpu", dtype=torch.float32, no_dropout=True, batch=(2, SEQ))
    wrapped = remat.checkpoint(wl.model, backend="eager")
    wl.loss(wrapped, wl.inputs).backward()
    assert [len(n.inputs) for n in _fused(remat.compiled_plans(wrapped))] == [4, 4]


@pytest.mark.slow
def test_hf_llama_runs_causal_grouped_query_attention_unexpanded(built_masks):
    plans, wl = _against_eager("llama", no_dropout=True)
    assert "2 masks recognised as causal (is_causal=True), 2 K/V expansions kept unexpanded" in _note(plans)
    nodes = {n.name: n for p in plans for n in p.nodes}
    fused = _fused(plans)
    assert len(fused) == 2
    for n in fused:
        q, k, v = (nodes[i] for i in n.inputs[:3])
        assert q.shape[1] == 4 and k.shape[1] == v.shape[1] == 2  # 4 query heads read 2 K/V heads
    five_d = [n for n in nodes.values() if n.op.startswith(("aten.expand", "aten.repeat")) and len(n.shape) == 5]
    assert not five_d and not any("repeat_interleave" in op for op in _ops(plans))
    _no_scores_saved(plans, SEQ)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_hf_dropout_gives_eagers_loss_and_gradients(built_masks, name):
    """With dropout, CPU's fused kernel does not apply (it takes no dropout): SDPA runs its math
    path as eager's CPU SDPA does, with the same random draws."""
    plans, _ = _against_eager(name, no_dropout=False)
    assert "masks recognised as" in _note(plans)


@pytest.mark.slow
def test_a_padding_mask_from_the_input_is_left_alone(built_masks):
    wl = zoo.build("llama", tiny=True, device="cpu", dtype=torch.float32, batch=(2, SEQ))
    padding = torch.ones_like(wl.inputs["ids"])
    padding[0, -8:] = 0
    plans, _ = _against_eager("llama", no_dropout=True, extra={"attention_mask": padding})
    note = _note(plans)
    assert "masks kept: the mask depends on graph input" in note and "recognised" not in note
    assert "2 K/V expansions kept unexpanded (enable_gqa=True)" in note  # CPU's kernel takes the mask too


@pytest.mark.slow
@pytest.mark.inductor
def test_inductor_compiles_the_rewritten_call():
    """Causal grouped-query attention written with an explicit mask and repeat_kv, compiled by
    Inductor (C++ on CPU): the plan notes the rewrite, gradients equal eager's."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.kv = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

        def forward(self, x):
            b, s, _ = x.shape
            q = self.q(x).view(b, s, 4, 8).transpose(1, 2)
            k, v = self.kv(x).view(b, s, 4, 8).transpose(1, 2).chunk(2, dim=1)
            i = torch.arange(s, device=x.device)
            causal = i[None, :] <= i[:, None]
            out = F.scaled_dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2), attn_mask=causal)
            return out.square().mean()

    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 16, 32)
    wrapped = remat.checkpoint(copy.deepcopy(model))
    wrapped(x).backward()
    model(x).backward()
    _assert_close(_grads(wrapped), _grads(model))
    (plan,) = remat.compiled_plans(wrapped)
    assert "1 masks recognised as causal (is_causal=True), 1 K/V expansions kept unexpanded" in _note([plan])


def test_a_call_the_pass_fails_on_stays_as_captured(monkeypatch):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool))

    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr("remat.capture.attention.classify_mask", broken)
    gm, report, _ = _captured(f, *_qkv())
    assert isinstance(_sdpa(gm).kwargs["attn_mask"], torch.fx.Node) and report.rewritten == 0
    assert "1 calls the rewrite failed on (ValueError; please report)" in report.note()
    captured = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with pytest.raises(remat.RematError, match=r"^remat: internal error: rewriting attention"):
        rewrite_attention(captured.graph.owning_module, strict=True)
