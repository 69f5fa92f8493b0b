"""Op tables: the one place that says which aten ops are matmuls, attention, reductions,
data-dependent, random or collectives, and how an fx node's op is named. Used by graph analysis
(``remat.analysis.joint_graph``), common-subexpression elimination (``remat.analysis.cse``) and Inductor's
lowering facts (``remat.backends.inductor.lowering``)."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..compat import HigherOrderOperator, OpOverload

__all__ = ["MATMUL_OPS", "ATTENTION_OPS", "REDUCTION_OPS", "DATA_DEPENDENT_OPS", "RANDOM_OPS", "REPLAYABLE_OPS",
           "COLLECTIVE_NAMESPACES", "MUTATING_HOPS", "CAST_OPS", "op_name", "packet", "is_collective",
           "is_impure", "schema_arg"]


def _aten(names: str) -> frozenset[str]:
    return frozenset("aten." + n for n in names.split())


MATMUL_OPS = _aten(
    "mm addmm bmm baddbmm matmul mv addmv dot vdot _int_mm _scaled_mm _grouped_mm _scaled_grouped_mm convolution "
    "_convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d "
    "cudnn_convolution cudnn_convolution_transpose mkldnn_convolution miopen_convolution "
    "_weight_int4pack_mm _weight_int8pack_mm linear"
)
ATTENTION_OPS = _aten(
    "scaled_dot_product_attention _scaled_dot_product_attention_math "
    "_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu "
    "_scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention "
    "_scaled_dot_product_fused_attention_overrideable _flash_attention_forward "
    "_efficient_attention_forward"
) | {"higher_order.flex_attention"}
REDUCTION_OPS = _aten(
    "sum mean amax amin var var_mean std std_mean prod logsumexp max min norm "
    "linalg_vector_norm any all nansum"
) | frozenset({"prims.sum", "prims.var", "prims.amax", "prims.amin", "prims.prod"})
DATA_DEPENDENT_OPS = _aten(
    "topk sort argsort argmax argmin nonzero nonzero_static unique_dim _unique _unique2 "
    "unique_consecutive kthvalue mode median nanmedian masked_select searchsorted "
    "bucketize _local_scalar_dense histc"
) | frozenset({"aten.max.dim", "aten.min.dim", "aten.cummax", "aten.cummin"})
RANDOM_OPS = _aten(
    "native_dropout bernoulli rand randn rand_like randn_like randint randint_like normal "
    "uniform exponential multinomial randperm"
) | frozenset(
    {"prims.inductor_random", "prims.inductor_seeds", "rngprims.philox_rand",
     "higher_order.run_and_save_rng_state", "higher_order.run_with_rng_state"}
)
REPLAYABLE_OPS = _aten("native_dropout")
"""Random ops besides attention with dropout that run as a kernel of their own where they appear
(Inductor decomposes ``native_dropout``; the uncompiled backend keeps it whole, Note [Eager RNG
order]): recomputed, they replay their generator state (Note [Replayed random ops])."""
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d"})
"""Namespaces of collective ops: never recomputed, never merged by CSE."""
MUTATING_HOPS = frozenset({"higher_order.with_effects", "higher_order.auto_functionalized",
                           "higher_order.triton_kernel_wrapper_mutation"})
CAST_OPS = frozenset({"prims.convert_element_type.default", "aten._to_copy.default"})


def op_name(node: fx.Node) -> str:
    """``aten.mm.default``, ``getitem``, ``higher_order.flex_attention``; ``""`` for placeholders."""
    t = node.target
    if node.op != "call_function":
        return ""
    if isinstance(t, OpOverload):
        return f"{t.namespace}.{t._schema.name.split('::')[-1]}.{t._overloadname}"
    if isinstance(t, HigherOrderOperator):
        return f"higher_order.{t.name()}"
    if t is operator.getitem:
        return "getitem"
    return getattr(t, "__name__", str(t))


def packet(op: str) -> str:
    """``aten.mm.default`` -> ``aten.mm``."""
    return ".".join(op.split(".")[:2])


def is_collective(target: object) -> bool:
    return isinstance(target, OpOverload) and target.namespace in COLLECTIVE_NAMESPACES


def is_impure(node: fx.Node) -> bool:
    """Ops whose two calls with the same arguments may differ or act: mutations, random ops,
    collectives (of every namespace) and anything that is not an op overload or ``getitem``."""
    t = node.target
    if isinstance(t, OpOverload):
        return t._schema.is_mutable or torch.Tag.nondeterministic_seeded in t.tags or is_collective(t)
    return t is not operator.getitem


def schema_arg(node: fx.Node, name: str, default: object = None) -> object:
    """The argument ``name`` of an op overload's call, by its schema (an attention kernel's
    ``dropout_p`` or ``is_causal``); ``default`` when the op has no such argument or the call
    leaves it out."""
    t = node.target
    if not isinstance(t, OpOverload):
        return default
    for i, arg in enumerate(t._schema.arguments):
        if arg.name == name:
            return node.kwargs.get(name, node.args[i] if i < len(node.args) else default)
    return default
