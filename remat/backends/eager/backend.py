"""The uncompiled backend: the partitioned forward and backward run op by op, for debugging and
fast tests. Its peak is simulated op by op (``remat.core.peak.OP_BY_OP``), which is exact.

The joint graph is traced with Inductor's decompositions (``remat.backends.inductor.decompositions``), so
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

Note [Eager GELU]
Inductor decomposes ``gelu`` into ``x * 0.5 * (1 + erf(x / sqrt 2))`` and ``gelu_backward`` into
six pointwise ops. Fused by Inductor they cost nothing; run op by op every one of them allocates
a tensor of the activation's size, and two or three are alive at once. When a checkpointed
block's MLP is recomputed, that is where the step peaks: on the mlp workload (``medium``, per-block
checkpoint segments) the recomputed GELU held three temporaries of 1 MiB next to the matmul's
input, output and gradient, and remat's smallest plan predicted 6.32 MiB against per-block
``torch.utils.checkpoint``'s measured 4.34 MiB (gpt ``medium``: 3.19 against 2.77). Kept whole,
as eager runs them, the same plans predict (and measure) 4.32 and 2.19 MiB
(``benchmarks/ckpt_floor.py``). The other activations
were measured too and stay decomposed: keeping ``silu`` whole raised the smallest plan on a tiny
Llama (3.69 to 3.81 MiB), ``threshold_backward`` on a bottleneck ResNet (3.32 to 3.50 MiB).
``tanh_backward`` is kept whole for exactness: decomposed, ``grad * (1 - y * y)`` rounds
differently from eager's kernel, and gradients through a ``tanh`` differed from eager's in the
last bits.

Note [Eager dropout]
The uncompiled backend runs ``native_dropout`` whole (Note [Eager RNG order]): it returns the
dropped tensor and the mask, both random, so both were saved: on GPT-2 (dropout 0.1) the
attention probabilities after dropout, a float tensor of batch x heads x seq x seq per layer, are
saved whatever the plan: on a 4-layer GPT-2 (``benchmarks/ckpt_floor.py``) remat's smallest plan
predicted 17.9 MiB (measured 19.9) against per-block checkpointing's measured 11.6 MiB (which
replays the RNG instead). The dropped tensor is a function of the input and the mask:
``native_dropout``'s CPU kernel computes ``input.mul(mask).mul_(1 / (1 - p))``. So before planning,
``dropout_from_mask`` makes every reader of the dropped tensor read
``mul(mul(input, mask), 1 / (1 - p))`` instead, the same arithmetic, equal bit for bit in float32 and
float64 (in bfloat16 the kernel rounds differently; those keep the dropped tensor). Only the mask
(one byte an element) must be saved; the product is recomputed or saved as the cut decides. The
forward computes the product twice (the kernel's, unread, and the graph's). The same GPT-2's
smallest plan then predicts 13.4 MiB (measured 13.4); the rest of the gap is attention with
dropout, traced as its decomposed math (the scores materialised; Note [Eager RNG order]).
Keeping ``native_dropout_backward`` whole does not help: its CPU kernel allocates temporaries of
its own (measured 1.5 MiB above the prediction).

Note [Eager fma]
Inductor decomposes ``_softmax_backward_data`` into ``grad * y``, its sum and
``prims.fma(-y, sum, grad * y)``. Fused, the ``fma`` is one kernel; run op by op through its Python
reference it computes ``(a * b) + c``, and ``a * b`` (the size of the softmax) lives next to the
result. On an attention that stays in its math path (a small HF T5 on CPU, relative position
bias, budget 0.8) the step peaked there, 16% above the prediction and 2.6% above the accepted
budget. The simulator counts the product as the op's scratch (``reference_temporary_bytes``).

Note [Eager casts]
Inductor's decompositions convert dtypes with ``prims.convert_element_type`` (layer norm's and
softmax's upcasts, masks turned into floats), which in eager runs through the prim's Python
reference: about 40 us a call on CPU against 8 us for ``aten._to_copy(x, dtype=...)``, the same
conversion with the same strides. The split forward and backward graphs run the aten op.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ... import compat
from ...analysis.cost import nbytes
from ...analysis.ops import op_name
from ..aten_scratch import scratch_bytes
from ..base import Backend, WrapBackward
from ..inductor.decompositions import eager_decompositions

__all__ = ["EagerBackend", "KEPT_WHOLE", "decompositions"]

KEPT_WHOLE = frozenset({
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
    "max_pool3d_with_indices", "max_pool3d_with_indices_backward",
    "gelu", "gelu_backward", "tanh_backward",
})
"""Ops whose Inductor decomposition the uncompiled backend does not apply (Note [Eager pooling],
Note [Eager GELU])."""


def decompositions() -> dict[Any, Callable[..., Any]]:
    """The uncompiled backend's decompositions: Inductor's, minus random ops (Note [Eager RNG
    order]) and ``KEPT_WHOLE`` (Note [Eager pooling], Note [Eager GELU]); ops by their schema
    (``OpOverload._schema``: ``versions.HOOKS["op_classes"]``)."""
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


_EXACT = (torch.float32, torch.float64)


def dropout_from_mask(gm: fx.GraphModule) -> int:
    """Readers of ``native_dropout``'s dropped tensor read it recomputed from the input and the
    mask (Note [Eager dropout]); returns how many were rewritten. Before planning."""
    graph = gm.graph
    mul = torch.ops.aten.mul.Tensor
    rewritten = 0
    for node in graph.find_nodes(op="call_function", target=torch.ops.aten.native_dropout.default):
        x, p = node.args[0], float(node.args[1])
        outs = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        dropped = outs.get(0)
        if dropped is None or node.args[2:3] == (False,) or p >= 1.0 or dropped.meta["val"].dtype not in _EXACT:
            continue
        mask = outs.get(1)
        if mask is None:
            with graph.inserting_after(node):
                mask = graph.call_function(operator.getitem, (node, 1))
            mask.meta = {**node.meta, "val": node.meta["val"][1]}
        with graph.inserting_after(max(dropped, mask, key=lambda n: _position(graph, n))):
            kept = graph.call_function(mul, (x, mask))
        with graph.inserting_after(kept):
            scaled = graph.call_function(mul, (kept, 1.0 / (1.0 - p)))
        for n in (kept, scaled):
            n.meta = {k: v for k, v in dropped.meta.items() if k != "partitioner_tag"}
        dropped.replace_all_uses_with(scaled)
        graph.erase_node(dropped)
        rewritten += 1
    if rewritten:
        graph.lint()
        gm.recompile()
    return rewritten


def _position(graph: fx.Graph, node: fx.Node) -> int:
    return next(i for i, n in enumerate(graph.nodes) if n is node)


def reference_temporary_bytes(node: fx.Node) -> int:
    """Bytes of the temporary a prim run through its Python reference allocates while it runs
    (Note [Eager fma]): ``prims.fma(a, b, c)`` is ``(a * b) + c``, so ``a * b`` (the broadcast of
    ``a`` and ``b``, in the result's dtype) exists next to the result."""
    val = node.meta.get("val")
    if op_name(node) != "prims.fma.default" or not isinstance(val, torch.Tensor):  # Inductor's prim
        return 0
    factors = [x.meta.get("val") for x in node.args[:2] if isinstance(x, fx.Node)]
    shape = torch.broadcast_shapes(*(t.shape for t in factors if isinstance(t, torch.Tensor)))
    return math.prod(int(d) for d in shape) * val.element_size()


def multi_output_bytes(node: fx.Node) -> int:
    """Bytes of the outputs of a multi-output op, all of which exist when its kernel ends. The
    simulator allocates an output a ``getitem`` reads at that getitem's step, just after the op,
    and one nothing reads never (a recomputed ``max_pool2d_with_indices`` whose backward needs
    only the indices, say: freed as soon as the op returns), so the op's own step holds them all
    as scratch. Counting only the unread ones left a recomputed ``native_dropout``'s mask out of
    the peak while its kernel ran (Note [Replayed random ops]: 128 KiB under the measured peak
    of a 512 x 256 dropout). Outputs that alias an input allocate nothing."""
    val = node.meta.get("val")
    if not (node.op == "call_function" and isinstance(val, (tuple, list))
            and isinstance(node.target, compat.OpOverload)):
        return 0
    rets = node.target._schema.returns
    return sum(nbytes(v) for k, v in enumerate(val) if not (k < len(rets) and rets[k].alias_info is not None))


class EagerBackend(Backend):
    name = "eager"
    keeps_op_order = True

    def step_model(self, gm: fx.GraphModule, nodes: list[fx.Node]) -> None:
        return None  # op by op: exact

    def workspace(self, nodes: list[fx.Node]) -> tuple[int, ...]:
        """The scratch library kernels (convolution, attention) hold while they run, an op's
        outputs while it runs (``multi_output_bytes``) and the temporaries of prims run
        through their Python reference (``reference_temporary_bytes``)."""
        return tuple(scratch_bytes(n) + multi_output_bytes(n) + reference_temporary_bytes(n) for n in nodes)

    def annotate(self, forward: fx.GraphModule, backward: fx.GraphModule) -> None:
        return None

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], partition: Callable[..., Any],
                on_peak: Callable[[Any], None] | None = None, *, stock: bool = False,
                wrap_backward: WrapBackward | None = None) -> Any:
        def split(joint: fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
            dropout_from_mask(joint)
            return partition(joint, *args, **kwargs)

        def backward(gm: fx.GraphModule, example_inputs: Any) -> Any:
            if wrap_backward is None:
                return _run_uncompiled(gm, example_inputs)
            return wrap_backward(gm, lambda: _run_uncompiled(gm, example_inputs))

        lower = compat.aot_autograd(
            fw_compiler=_run_uncompiled,
            bw_compiler=backward,
            partition_fn=split,
            decompositions=decompositions(),
        )
        with compat.no_autograd_cache():
            return lower(gm, example_inputs)
