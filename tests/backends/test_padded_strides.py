"""Inductor's padded strides (Note [Padded strides] in ``remat.backends.inductor.padding``): the
arithmetic, the facts read off a joint graph, the fusion model's copy of a view an extern kernel
reads, and the buffers Inductor generates with padding on (a GPU's default, switched on for the
CPU here)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from remat.backends.inductor.facts import Kind
from remat.backends.inductor.kernel_model import KernelModel, stored_bytes
from remat.backends.inductor.lowering import node_lowerings
from remat.backends.inductor.padding import PaddingRules, padded_strides, storage_elements
from remat.core.peak import op_order, simulate

from .test_fusion_peak import graph, kernels, lowered, stored

RULES = PaddingRules(align_bytes=128, threshold=1024)


def test_a_stride_past_the_threshold_is_rounded_up_to_the_alignment():
    # Swin-T's windows: 49 x 96 = 4,704 bf16 elements a row, not a multiple of 64: padded to 4,736.
    assert padded_strides((1024, 49, 96), (4704, 96, 1), 2, RULES) == (4736, 96, 1)
    assert storage_elements((1024, 49, 96), (4736, 96, 1)) == 1023 * 4736 + 48 * 96 + 95 + 1
    # float32 aligns to 32 elements: 4,704 = 147 x 32 is aligned already.
    assert padded_strides((1024, 49, 96), (4704, 96, 1), 4, RULES) is None
    # Strides of at most 1,024 elements are not padded (7 x 7 x 20 = 980).
    assert padded_strides((64, 7, 7, 20), (980, 140, 20, 1), 2, RULES) is None


def test_padding_keeps_the_stride_order():
    # A transposed layout: the innermost dimension is the first one.
    assert padded_strides((49, 1024), (1, 49), 2, RULES) is None  # 49 <= 1024
    assert padded_strides((1100, 8), (1, 1100), 2, RULES) == (1, 1152)


def test_an_empty_tensor_spans_no_storage():
    assert storage_elements((0, 96), (96, 1)) == 0


def _facts(f, *args, padding: bool):
    from torch._inductor import config

    gm = make_fx(f)(*args)
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    with config.patch(disable_padding_cpu=not padding):
        return {n.name: fact for n, fact in zip(nodes, node_lowerings(nodes))}


def _window_matmul(x, w):
    y = x * 2
    return (y.view(-1, 96) @ w).sum() + y.permute(0, 2, 1).sum()


def _args():
    return torch.randn(8, 49, 96, dtype=torch.bfloat16), torch.randn(96, 16, dtype=torch.bfloat16)


def test_facts_give_the_padded_size_and_the_copy_of_a_view_across_the_padding():
    facts = _facts(_window_matmul, *_args(), padding=True)
    assert facts["mul"].padded_nbytes == (7 * 4736 + 49 * 96) * 2  # the last row is not padded
    assert facts["view"].copy_nbytes == 8 * 49 * 96 * 2  # (392, 96): merges the padded dimension
    assert facts["permute"].copy_nbytes == 0  # a permute is strides over any layout
    assert facts["mm"].padded_nbytes == 0  # an extern kernel's output keeps the library's layout
    assert facts["mm"].fixes_layout and not facts["mul"].fixes_layout
    off = _facts(_window_matmul, *_args(), padding=False)  # the CPU's default: no padding
    assert all(f.padded_nbytes == 0 and f.copy_nbytes == 0 for f in off.values())


def test_a_convolution_input_is_not_padded():
    def f(x, w):
        return torch.nn.functional.conv2d(x * 2, w).sum()

    facts = _facts(f, torch.randn(2, 3, 40, 40), torch.randn(4, 3, 3, 3), padding=True)
    # 40 x 40 = 1,600 float32 elements a channel, not a multiple of 32, but the convolution reads it.
    assert facts["mul"].kind is Kind.POINTWISE and facts["mul"].padded_nbytes == 0


def test_each_half_leaves_what_its_convolutions_read_unpadded():
    # y feeds the forward's sum and the backward's convolution_backward: the forward pads it
    # (39 x 39 = 1,521 float32 elements a channel, not a multiple of 32); a backward that
    # recomputes it does not (Inductor marks each graph from its own convolutions).
    def f(x, w, tangents_1):
        y = x * 2
        grads = torch.ops.aten.convolution_backward(tangents_1, y, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0],
                                                    1, [False, True, False])
        return (y * 3).sum(), grads[1]

    facts = _facts(f, torch.randn(2, 3, 39, 39), torch.randn(4, 3, 3, 3), torch.randn(2, 4, 37, 37), padding=True)
    assert facts["mul"].padded_nbytes == (5 * 1536 + 38 * 39 + 39) * 4 and facts["mul"].unpadded_in_backward
    assert facts["mul_1"].padded_nbytes and not facts["mul_1"].unpadded_in_backward
    g = dict(zip(facts, stored_bytes([0] * len(facts), tuple(facts.values()), frozenset(), True)))
    assert g["mul"] == 0 and g["mul_1"] == facts["mul_1"].padded_nbytes  # recomputed in the backward
    g = dict(zip(facts, stored_bytes([0] * len(facts), tuple(facts.values()), frozenset({3}), True)))
    assert g["mul"] == facts["mul"].padded_nbytes  # saved: the forward's padded buffer


def _padded(s, **changes):
    facts = list(s.model.facts)
    for name, kw in changes.items():
        i = s.names.index(name)
        facts[i] = dataclasses.replace(facts[i], **kw)
    return dataclasses.replace(s, model=KernelModel(s.model.rules, tuple(facts)))


SPEC = [("x", "input", (), 0), ("a", "extern", ("x",), 400), ("p", "pointwise", ("a",), 400),
        ("v", "view", ("p",), 0), ("m", "extern", ("v",), 40), ("o", "pointwise", ("m", "v"), 40)]


def test_an_extern_kernel_reads_a_view_across_padding_through_a_copy():
    s = graph(SPEC, ["o"])
    assert stored(s) == {"a", "p", "m", "o"}
    assert simulate(s, set()).peak_bytes == 440  # p written into a's buffer, then p and m
    s = _padded(s, p={"padded_nbytes": 420}, v={"copy_nbytes": 400})
    low = lowered(s)
    v, p, m = (s.names.index(n) for n in "vpm")
    assert low.copies == {v} and stored(s) == {"a", "p", "v", "m", "o"}
    assert low.reads[v] == {p}  # a pointwise reader reads the view's base, not the copy
    ks, alias = kernels(s)
    reader = next(k for k in ks if m in k.nodes)
    assert reader.reads == {alias.get(v, v)} and p not in reader.reads  # the copy (maybe in a freed buffer)
    # p (420) no longer fits a's buffer; the copy is fused into p's kernel (one iteration space),
    # as Inductor fused them (the test below), so a, p and the copy are allocated at once.
    assert simulate(s, set()).peak_bytes == 400 + 420 + 400


def test_a_padded_value_only_its_copy_reads_stays_in_the_copys_kernel():
    # On a GPU the padded value is computed inside the copy's kernel and never allocated: the
    # wrapper holds a and the copy (Swin-T's backward: one buffer for the qkv gradient and its
    # copy, as Inductor's plan has it).
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 400), ("p", "pointwise", ("a",), 400),
            ("v", "view", ("p",), 0), ("m", "extern", ("v",), 40)]
    s = _padded(graph(spec, ["m"]), p={"padded_nbytes": 420}, v={"copy_nbytes": 400})
    steps = s.model.steps(s, set(), *op_order(s, set()))[0]
    assert [[s.names[v] for v, _ in st.allocs] for st in steps] == [["a"], ["v"], ["m"]]
    assert simulate(s, set()).peak_bytes == 800


def test_a_view_a_matmul_and_others_read_is_copied_once_for_all_its_readers():
    # v is read by the matmul m and transposed (t) for the matmul n: Inductor replaces v by one
    # copy when it lowers it, which t views; without a matmul among v's readers, each extern
    # kernel gets its own copy.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 400), ("p", "pointwise", ("a",), 400),
            ("v", "view", ("p",), 0), ("m", "extern", ("v",), 40), ("t", "view", ("v",), 0),
            ("n", "extern", ("t", "m"), 40)]
    s = _padded(graph(spec, ["n"]), p={"padded_nbytes": 420}, v={"copy_nbytes": 400}, t={"copy_nbytes": 400},
                m={"fixes_layout": True})
    low = lowered(s)
    v, t = s.names.index("v"), s.names.index("t")
    assert "v" in stored(s) and "t" not in stored(s) and low.copies == frozenset()
    assert low.reads[t] == {v}
    s = _padded(s, m={"fixes_layout": False})
    assert lowered(s).copies == {v, t}


def test_no_copy_of_a_view_of_an_extern_kernels_output():
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 400), ("v", "view", ("a",), 0),
            ("m", "extern", ("v",), 40)]
    s = _padded(graph(spec, ["m"]), v={"copy_nbytes": 400})  # a matmul's output has the library's layout
    assert lowered(s).copies == frozenset()


def test_the_copy_is_made_just_before_the_extern_kernel_that_reads_it():
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 400), ("p", "pointwise", ("a",), 400),
            ("v", "view", ("p",), 0), ("q", "extern", ("a",), 40), ("m", "extern", ("v", "q"), 40)]
    s = _padded(graph(spec, ["m"]), p={"padded_nbytes": 420}, v={"copy_nbytes": 400})
    ks, _ = kernels(s)
    assert [[s.names[v] for v in k.nodes] for k in ks] == [["a"], ["p"], ["q"], ["v"], ["m"]]


def _allocated_bytes(code: str) -> list[int]:
    """Bytes of each buffer the generated wrapper allocates (``empty_strided_cpu``)."""
    out = []
    for size, stride, dtype in re.findall(r"empty_strided_cpu\(\(([^)]*)\), \(([^)]*)\), torch\.(\w+)\)", code):
        sz = [int(x) for x in size.split(",") if x.strip()]
        st = [int(x) for x in stride.split(",") if x.strip()]
        out.append(storage_elements(sz, st) * torch.empty((), dtype=getattr(torch, dtype)).element_size())
    return out


@pytest.mark.inductor
def test_inductor_allocates_the_padded_buffer_and_the_copy_the_facts_name():
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with config.patch(disable_padding_cpu=False):
        _, code = run_and_get_code(torch.compile(_window_matmul), *_args())
    facts = _facts(_window_matmul, *_args(), padding=True)
    allocated = _allocated_bytes(code[0])
    assert facts["mul"].padded_nbytes in allocated
    assert facts["view"].copy_nbytes in allocated
