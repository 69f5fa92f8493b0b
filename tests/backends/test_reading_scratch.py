"""The reading of Inductor's memory plan adds an extern kernel's scratch from the fx node of the
ATen op it runs: its ``origin_node``, else the origin that calls its ``op_overload`` (Inductor's IR
for a convolution and for a fallback kernel, such as a convolution's backward, leaves
``origin_node`` unset and names every op it was lowered from)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.fx as fx

from remat.backends.inductor import wrapper_reading

aten = torch.ops.aten


@pytest.fixture
def graph_nodes():
    g = fx.Graph()
    x, w, grad = g.placeholder("x"), g.placeholder("w"), g.placeholder("grad")
    conv = g.call_function(aten.convolution.default, (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
    view = g.call_function(aten.view.default, (grad, [2, 4, 8, 8]))
    back = g.call_function(aten.convolution_backward.default,
                           (view, x, w, [0], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]))
    return conv, view, back


def test_a_kernel_without_origin_node_takes_the_origin_calling_its_op(monkeypatch, graph_nodes):
    conv, view, back = graph_nodes
    monkeypatch.setattr(wrapper_reading, "scratch_bytes", lambda node, strides=None: {back: 11, conv: 7}.get(node, 0))
    fallback = SimpleNamespace(origin_node=None, op_overload=aten.convolution_backward.default,
                               origins=[view, back], inputs=[])
    assert wrapper_reading._scratch(fallback) == 11
    extern = SimpleNamespace(origin_node=None, op_overload=aten.convolution.default, origins=[conv], inputs=[])
    assert wrapper_reading._scratch(extern) == 7


def test_origin_node_wins_and_two_callers_count_nothing(monkeypatch, graph_nodes):
    conv, view, back = graph_nodes
    other = back.graph.call_function(aten.convolution_backward.default, back.args)
    sizes = {back: 11, conv: 7, other: 13}
    monkeypatch.setattr(wrapper_reading, "scratch_bytes", lambda node, strides=None: sizes.get(node, 0))
    assert wrapper_reading._scratch(SimpleNamespace(origin_node=conv, op_overload=aten.convolution_backward.default,
                                                    origins=[back], inputs=[])) == 7
    two = SimpleNamespace(origin_node=None, op_overload=aten.convolution_backward.default, origins=[back, other])
    assert wrapper_reading._scratch(two) == 0, "which of two calls the kernel runs is not known"
    assert wrapper_reading._scratch(SimpleNamespace(origin_node=None, op_overload=None, origins=[back])) == 0


def test_a_convolution_is_measured_with_its_operands_as_compiled(monkeypatch, graph_nodes):
    """Note [Operands as the backend lays them out]: the reading passes the strides of the extern
    kernel's inputs as Inductor compiled them, not the traced ones."""
    conv, _, back = graph_nodes
    seen = []
    monkeypatch.setattr(wrapper_reading, "scratch_bytes", lambda node, strides=None: seen.append(strides) or 5)

    def buffer(stride):
        return SimpleNamespace(get_stride=lambda: stride)
    kernel = SimpleNamespace(origin_node=None, op_overload=aten.convolution_backward.default, origins=[back],
                             inputs=[buffer((4, 1, 2, 3)), buffer((9, 1, 3, 1))])
    assert wrapper_reading._scratch(kernel) == 5
    assert seen == [((4, 1, 2, 3), (9, 1, 3, 1))]
    mm = back.graph.call_function(aten.mm.default, (conv, conv))
    assert wrapper_reading._scratch(SimpleNamespace(origin_node=mm, inputs=[buffer((1, 1))])) == 5
    assert seen[-1] is None, "only convolutions are measured with their compiled operands"
