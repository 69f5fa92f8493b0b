"""Common-subexpression elimination (``remat.analysis.cse``): identical pure ops merge; collectives of every
namespace in ``remat.analysis.ops.COLLECTIVE_NAMESPACES`` never do (two all-reduces of the same tensor are
two communications, and every rank must run both)."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from remat.analysis.cse import cse
from remat.analysis.ops import COLLECTIVE_NAMESPACES

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without distributed")
if torch.distributed.is_available():
    import torch.distributed._functional_collectives  # noqa: F401  (registers the functional collective ops)

# One op of each collective namespace whose schema is not marked mutable: only its namespace
# tells CSE that two identical calls are not the same value.
COLLECTIVES = {
    "_c10d_functional": ("all_reduce", ("sum", "0")),
    "c10d_functional": ("all_reduce", ("sum", "0", [0], 1)),
    "_c10d_functional_autograd": ("all_to_all_single", ([4], [4], "0")),
    "c10d": ("allreduce_", ()),
}


def _twice(target, extra) -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(target, (x, *extra))
    b = g.call_function(target, (x, *extra))
    g.output((a, b))
    return fx.GraphModule(torch.nn.Module(), g)


def _calls(gm: fx.GraphModule) -> int:
    return sum(n.op == "call_function" for n in gm.graph.nodes)


def test_every_collective_namespace_is_covered():
    assert set(COLLECTIVES) == set(COLLECTIVE_NAMESPACES)


@pytest.mark.parametrize("namespace", sorted(COLLECTIVES))
def test_cse_never_merges_two_collectives(namespace):
    name, extra = COLLECTIVES[namespace]
    op = getattr(getattr(torch.ops, namespace), name).default
    assert not op._schema.is_mutable or namespace == "c10d"
    gm = _twice(op, extra)
    assert cse(gm) == 0
    assert _calls(gm) == 2


def test_cse_merges_identical_pure_ops():
    gm = _twice(torch.ops.aten.mul.Tensor, (2.0,))
    assert cse(gm) == 1
    assert _calls(gm) == 1


def test_cse_never_merges_random_ops():
    gm = _twice(torch.ops.aten.rand_like.default, ())
    assert cse(gm) == 0
    assert _calls(gm) == 2
