"""Note [Operands as the backend lays them out]: a convolution's cuDNN scratch is measured with its
operands in the layouts Inductor passes them (aten.convolution's input and weight in its output's
stride order, channels-last under the layout optimization), checked against the operands
Inductor's own lowering hands its extern convolution."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from remat.backends import cuda_scratch
from remat.backends.inductor.backend import InductorBackend
from remat.backends.inductor.extern_layouts import (
    CHANNELS_LAST_ORDER,
    compiled_operand_strides,
    dense_strides,
    operand_strides,
    stride_order,
)

aten = torch.ops.aten


def test_stride_order_ranks_dimensions_innermost_first():
    nchw = torch.empty(2, 3, 4, 5)
    nhwc = nchw.to(memory_format=torch.channels_last)
    assert stride_order(nchw.stride()) == (3, 2, 1, 0)
    assert stride_order(nhwc.stride()) == CHANNELS_LAST_ORDER
    assert dense_strides((2, 3, 4, 5), CHANNELS_LAST_ORDER) == nhwc.stride()
    assert dense_strides((2, 3, 4, 5), (3, 2, 1, 0)) == nchw.stride()


def conv_graph(x: torch.Tensor, w: torch.Tensor, groups: int = 1) -> tuple[fx.GraphModule, fx.Node]:
    """A graph of one convolution of ``x`` by ``w`` (no bias), its values' strides traced."""
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return (aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], groups),)
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(f)(x, w)
    (node,) = gm.graph.find_nodes(op="call_function", target=aten.convolution.default)
    return gm, node


def test_an_input_traced_contiguous_beside_a_channels_last_weight_is_passed_channels_last():
    # EfficientNet-B0's recomputed depthwise convolutions: the input traced in eager's
    # contiguous strides, the weight channels-last, so the output channels-last
    x = torch.empty(2, 8, 6, 6)
    w = torch.empty(8, 1, 3, 3).to(memory_format=torch.channels_last)
    _, node = conv_graph(x, w, groups=8)
    assert node.meta["val"].is_contiguous(memory_format=torch.channels_last)
    got = operand_strides(node, channels_last=False)
    assert got == (x.to(memory_format=torch.channels_last).stride(), w.stride())
    both_nchw = conv_graph(torch.empty(2, 8, 6, 6), torch.empty(8, 1, 3, 3), groups=8)[1]
    assert operand_strides(both_nchw, channels_last=False) == (torch.empty(2, 8, 6, 6).stride(),
                                                               torch.empty(8, 1, 3, 3).stride())
    cl = torch.empty(2, 8, 6, 6).to(memory_format=torch.channels_last).stride()
    assert operand_strides(both_nchw, channels_last=True)[0] == cl, "the layout optimization: channels-last"


def test_other_ops_keep_their_traced_strides():
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2, 3)
    node = g.call_function(aten.relu.default, (x,))
    assert operand_strides(node, channels_last=True) is None


def test_the_simulator_measures_the_scratch_with_inductors_layouts(monkeypatch: pytest.MonkeyPatch):
    """The probe of a CUDA convolution runs on operands in Inductor's layout, not the traced one."""
    made: list[list[Any]] = []

    def fake_measure(run: Any, meter: Any, allocated: Any, sync: Any = None) -> int:
        made.append(run)
        return 7
    monkeypatch.setattr(cuda_scratch, "_CACHE", {})
    monkeypatch.setattr(cuda_scratch.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_scratch, "device_meter", lambda device: None)
    monkeypatch.setattr(cuda_scratch, "measure_scratch", fake_measure)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4, 16, 10, 10, device="cuda")
        w = torch.empty(16, 1, 3, 3, device="cuda").to(memory_format=torch.channels_last)
        out = torch.empty(4, 16, 10, 10, device="cuda").to(memory_format=torch.channels_last)
    g = fx.Graph()
    xs, ws = g.placeholder("x"), g.placeholder("w")
    xs.meta["val"], ws.meta["val"] = x, w
    conv = g.call_function(aten.convolution.default, (xs, ws, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 16))
    conv.meta["val"] = out
    g.output(conv)
    gm = fx.GraphModule(torch.nn.Module(), g)
    monkeypatch.setattr("remat.backends.inductor.backend.channels_last_nodes", lambda gm: frozenset())
    assert InductorBackend().workspace(list(gm.graph.nodes)[:-1]) == (0, 0, 7)
    (key,) = cuda_scratch._CACHE
    specs = [s[1] for s in key[1] if s[0] == "tensor"]
    assert specs[0][1] == torch.empty(4, 16, 10, 10).to(memory_format=torch.channels_last).stride(), \
        "the input was measured in its traced (contiguous) strides"
    assert specs[1][1] == w.stride()


class ConvCalls:
    """The operands Inductor's compiled code hands its extern convolution."""

    def __init__(self) -> None:
        self.seen: list[tuple[tuple[int, ...], ...]] = []

    def __enter__(self) -> ConvCalls:
        from torch._inductor.select_algorithm import extern_kernels
        self.ns, self.conv = extern_kernels, extern_kernels.convolution

        def conv(x: torch.Tensor, w: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
            self.seen.append((x.stride(), w.stride()))
            return self.conv(x, w, *a, **k)
        extern_kernels.convolution = conv
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ns.convolution = self.conv


@pytest.mark.inductor
@pytest.mark.parametrize("layout_opt", [False, True])
def test_the_rule_is_what_inductor_passes_its_extern_convolution(layout_opt: bool):
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.graph import GraphLowering

    x = torch.randn(2, 8, 6, 6)
    w = torch.randn(8, 1, 3, 3).to(memory_format=torch.channels_last)  # a depthwise weight
    gm, node = conv_graph(x, w, groups=8)
    with config.patch(layout_optimization=layout_opt, force_layout_optimization=layout_opt):
        decided = GraphLowering.decide_layout_opt(gm, is_inference=False)
        assert decided is layout_opt
        want = operand_strides(node, channels_last=decided)
        compiled = compile_fx_inner(gm, [x, w], is_inference=False)
        with ConvCalls() as calls:
            compiled([x, w])
    assert calls.seen, "Inductor ran no extern convolution (it lowered it otherwise)"
    assert calls.seen[0] == want


def test_the_reading_takes_the_compiled_inputs_strides():
    class Buffer:
        def __init__(self, stride: tuple[int, ...]) -> None:
            self.stride = stride

        def get_stride(self) -> tuple[int, ...]:
            return self.stride

    class Kernel:
        inputs = [Buffer((10, 1, 5, 2)), Buffer((9, 9, 3, 1))]
    assert compiled_operand_strides(Kernel()) == ((10, 1, 5, 2), (9, 9, 3, 1))


def test_a_kernel_without_inputs_warns(monkeypatch: pytest.MonkeyPatch):
    from remat import versions
    monkeypatch.setattr(versions, "_warned", set())
    with pytest.warns(UserWarning, match="extern_operand_layouts"):
        assert compiled_operand_strides(object()) is None
