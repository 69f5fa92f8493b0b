"""A stored value that loads nothing (index arithmetic from positions) is recomputed by the
kernels that read it (Note [Stored values that load nothing] in
``remat.backends.inductor.fusion.realization``): the model's counts of its readers' expressions
against Inductor's ``inner_fn_opcount``."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import remat
from remat.backends.inductor import kernel_model
from remat.backends.inductor.fusion import realization


def _buckets(n: int) -> torch.Tensor:
    """T5-like relative position buckets: computed from positions alone (no buffer read)."""
    pos = torch.arange(n)
    rel = pos[None, :] - pos[:, None]
    far = (torch.log(rel.abs().float() + 1.0) * 4).long().clamp(max=15)
    return (rel > 0).long() * 16 + far


class PositionBias(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.bias = nn.Embedding(32, heads)
        self.qk = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        bias = self.bias(_buckets(t)).permute(2, 0, 1)[None]
        q = self.qk(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
        return torch.softmax(q @ q.transpose(-1, -2) + bias, dim=-1).sum()


@pytest.mark.inductor
def test_readers_of_a_stored_index_recompute_it_as_inductor_does(monkeypatch):
    import torch._inductor.graph as inductor_graph
    from torch._inductor import ir

    counted: dict[str, int] = {}
    run_node = inductor_graph.GraphLowering.run_node

    def record(self, n):
        result = run_node(self, n)
        if n.name == "embedding" and isinstance(result, ir.TensorBox) and isinstance(result.data, ir.StorageBox):
            data = result.data.data
            data = data.data if isinstance(data, ir.ComputedBuffer) else data
            if isinstance(data, ir.Pointwise):
                counted.setdefault(n.name, data.inner_fn_opcount().num_ops)
        return result

    names: list[tuple[str, ...]] = []
    graph = kernel_model.KernelModel.graph

    def named_graph(self, s, *a, **k):
        names.append(s.names)
        return graph(self, s, *a, **k)

    modelled: dict[str, tuple[int, frozenset]] = {}
    realize = realization._realize_pointwise

    def note(v, e, readers, is_output, g, rules, store):
        if names[-1][v] in ("embedding", "add_3") or names[-1][v].startswith("add"):
            modelled.setdefault(names[-1][v], (e.ops, frozenset(names[-1][r] for r in e.reads)))
        return realize(v, e, readers, is_output, g, rules, store)

    monkeypatch.setattr(inductor_graph.GraphLowering, "run_node", record)
    monkeypatch.setattr(kernel_model.KernelModel, "graph", named_graph)
    monkeypatch.setattr(realization, "_realize_pointwise", note)
    torch._dynamo.reset()
    torch.manual_seed(0)
    wrapped = remat.checkpoint(PositionBias(), backend="inductor", budget=None)
    wrapped(torch.randn(2, 16, 32)).backward()
    ops, reads = modelled["embedding"]
    # The buckets are saved for the embedding's backward (a graph output, so stored), yet the
    # gather recomputes them: it loads only the table, and counts the buckets' ops (a load of a
    # stored index, 1 op, before the Note), within Inductor's count.
    assert len(reads) == 1 and all(r.startswith("primals") for r in reads), reads
    assert counted["embedding"] > 10
    assert abs(ops - counted["embedding"]) <= 2, (ops, counted["embedding"])
