"""Inductor's decomposition table, which both backends trace the joint graph with (so that the
uncompiled backend plans the same graph Inductor would compile), and the uncompiled backend's
variant that keeps random ops whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...compat import OpOverload

__all__ = ["decomposition_table", "eager_decompositions"]


def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """``torch._inductor.decomposition.select_decomp_table()`` (``versions.HOOKS["decomposition_table"]``). Some of its
    decompositions (``max_pool2d_with_indices``) call ``torch._inductor.lowering`` through the
    package attribute, which exists only once that module was imported; a process that never
    compiled with Inductor would fail on them (``AttributeError: module 'torch._inductor' has no
    attribute 'lowering'``), so it is imported here first."""
    import torch._inductor.lowering  # noqa: F401  (see the docstring)
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


# Note [Eager RNG order]
# Inductor's decomposition table rewrites random ops (dropout into ``rand_like < p``, bernoulli,
# randn_like...) into forms that draw from the generator differently from the eager kernels:
# with the same seed they give different masks. The uncompiled backend keeps these ops whole,
# so the partitioned forward runs the same random kernels as eager autograd, in program order,
# and with the same seed its losses and gradients equal eager's. Ops that are random only
# optionally (attention and RNN layers with dropout) keep their decompositions.
_OPTIONALLY_RANDOM = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                                "rnn_tanh", "rnn_relu", "lstm", "gru"})


def eager_decompositions() -> dict[Any, Callable[..., Any]]:
    """Inductor's decompositions minus those of random ops (``OpOverload._schema``:
    ``versions.HOOKS["op_classes"]``). See Note [Eager RNG order]."""
    return {
        op: fn for op, fn in decomposition_table().items()
        if not (isinstance(op, OpOverload) and torch.Tag.nondeterministic_seeded in op.tags
                and op._schema.name.split("::")[-1] not in _OPTIONALLY_RANDOM)
    }
