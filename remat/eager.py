"""The uncompiled backend: the partitioned forward and backward run op by op, for debugging and
fast tests. Its peak is simulated op by op (``remat.peak.OP_BY_OP``), which is exact.

The joint graph is traced with Inductor's decompositions (``remat.inductor.decompositions``), so
that the uncompiled backend plans the graph Inductor would plan, minus random ops (Note [Eager
RNG order]) and the ops below.

Note [Eager pooling]
Inductor decomposes ``max_pool2d_with_indices`` (and 3d) into ``_low_memory_max_pool_with_offsets``
and ``_low_memory_max_pool_offsets_to_indices`` (int8 offsets kept instead of int64 indices, the
backward a ``scatter_add``). Fused by Inductor that is cheap; run op by op it runs the pooling
kernel twice plus integer divisions and a scatter, and its lowering needs ``torch._inductor.lowering``
imported. Measured on a small CNN (two conv/BatchNorm/ReLU/MaxPool2d blocks, batch 16 of 3x32x32,
one CPU thread): a training step took 4.5x plain eager's with the decomposition, 2.5x without.
The uncompiled backend keeps these ops whole: its plans save the pooling's int64 indices, as
eager autograd does, and its predicted peak (which follows the backend) counts them.

Note [Eager casts]
Inductor's decompositions convert dtypes with ``prims.convert_element_type`` (layer norm's and
softmax's upcasts, masks turned into floats), which in eager runs through the prim's Python
reference: about 40 us a call on CPU against 8 us for ``aten._to_copy(x, dtype=...)``, the same
conversion with the same strides. The split forward and backward graphs run the aten op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from . import compat
from .backend import Backend
from .inductor.decompositions import eager_decompositions
from .inductor.lowering import extern_workspace

__all__ = ["EagerBackend", "KEPT_WHOLE", "decompositions"]

KEPT_WHOLE = frozenset({
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
    "max_pool3d_with_indices", "max_pool3d_with_indices_backward",
})
"""Ops whose Inductor decomposition the uncompiled backend does not apply (Note [Eager pooling])."""


def decompositions() -> dict[Any, Callable[..., Any]]:
    """The uncompiled backend's decompositions: Inductor's, minus random ops (Note [Eager RNG
    order]) and ``KEPT_WHOLE`` (Note [Eager pooling])."""
    return {op: fn for op, fn in eager_decompositions().items()
            if getattr(op, "_schema", None) is None or op._schema.name.split("::")[-1] not in KEPT_WHOLE}


def _aten_casts(gm: fx.GraphModule) -> int:
    """Run dtype conversions as ``aten._to_copy`` instead of ``prims.convert_element_type``
    (Note [Eager casts]); returns how many were rewritten. After partitioning: plans are
    unchanged."""
    prim = torch.ops.prims.convert_element_type.default
    rewritten = 0
    for node in gm.graph.find_nodes(op="call_function", target=prim):
        source, dtype = node.args
        node.target, node.args, node.kwargs = torch.ops.aten._to_copy.default, (source,), {"dtype": dtype}
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def _run_uncompiled(gm: fx.GraphModule, example_inputs: Any) -> Any:
    _aten_casts(gm)
    return compat.run_uncompiled(gm)


class EagerBackend(Backend):
    name = "eager"

    def schedule_fields(self, gm: fx.GraphModule, nodes: list[fx.Node]) -> dict[str, Any]:
        """The scratch library kernels (convolution, attention) hold while they run."""
        return {"workspace": tuple(extern_workspace(n) for n in nodes)}

    def annotate(self, forward: fx.GraphModule, backward: fx.GraphModule) -> None:
        return None

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], partition: Callable[..., Any],
                on_peak: Callable[[Any], None] | None = None) -> Any:
        lower = compat.aot_autograd(
            fw_compiler=_run_uncompiled,
            bw_compiler=_run_uncompiled,
            partition_fn=partition,
            decompositions=decompositions(),
        )
        with compat.no_autograd_cache():
            return lower(gm, example_inputs)
