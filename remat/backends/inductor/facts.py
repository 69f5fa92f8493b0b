"""What Inductor's peak model knows about each node of a joint graph: the typed facts
``lowering`` reads from fx nodes and ``fusion`` and ``kernel_model`` read back. Pure: no torch
import.

A new lowering fact is one field of ``NodeLowering`` here and its value in
``lowering.node_lowering``; the core's ``Schedule`` never sees it (the step model,
``kernel_model.KernelModel``, carries the facts).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import RematError

__all__ = ["Kind", "NodeLowering", "FusionGraph", "check_facts", "itemsize"]


class Kind(enum.Enum):
    """How Inductor lowers an op."""

    INPUT = "input"
    """A placeholder: exists before the graph runs."""
    VIEW = "view"
    """Aliases its first input."""
    POINTWISE = "pointwise"
    """An expression inlined into its readers unless realized (Note [Inductor realization])."""
    REDUCTION = "reduction"
    """A stored reduction over the trailing dimensions, as in a layer norm."""
    OUTER_REDUCTION = "outer-reduction"
    """A stored reduction over leading dimensions, as in a bias gradient."""
    EXTERN = "extern"
    """A library or fallback kernel: stored output, stored inputs."""
    RANDOM = "random"
    """A stored random value."""


def check_facts(facts: Sequence[NodeLowering], n: int) -> None:
    """Facts cover a schedule of ``n`` nodes exactly (no node without a kind)."""
    if len(facts) != n:
        raise RematError(f"remat: internal error: lowering facts for {len(facts)} nodes, a schedule of {n} "
                         "(please report)")


_ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1,
             "uint8": 1, "int8": 1}


def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` (1 if unknown)."""
    return _ITEMSIZE.get(dtype, 1)


@dataclass(frozen=True, slots=True)
class NodeLowering:
    """How Inductor lowers one node, as the peak model reads it."""

    kind: Kind
    ops: int = 1
    """Ops the node adds to an inlined expression (Note [Inductor realization])."""
    consts: frozenset[tuple[str, str]] = frozenset()
    """The scalar constants it writes into an inlined expression, as (value as written, dtype):
    each counted once per expression (Note [Inlined op counts])."""
    load_ops: int = 0
    """Ops an expression that reads this stored value adds besides the load and ``load_consts``:
    a variance's scaling (Note [Inlined op counts])."""
    load_consts: frozenset[tuple[str, str]] = frozenset()
    """The constants that scaling writes."""
    dtype: str = ""
    """Element type of its value (a freed buffer is reused only for the same one); "": unknown."""
    block: str | None = None
    """The repeated block it belongs to (``remat.analysis.joint_graph.block_of``): remat compiles with
    stage-local fusion, so no kernel spans two blocks (Note [Stage-local fusion])."""
    heavy: bool = False
    """Its op is one Inductor's CPU backend counts as expensive to repeat (exp, tanh, ...)."""
    at_reader: bool = False
    """A matmul Inductor fuses with the add that reads it into one ``addmm``, which runs where
    the add does (Note [Matmuls fused into the add that reads them])."""
    stores_operand: bool = False
    """Inductor stores the value it reads before lowering it: a 2-D pad whose one reader is a
    matmul (Note [A padded matmul operand is stored])."""
    own_buffer: bool = False
    """A fallback kernel that allocates its output itself (remat's offload copies, Note
    [Offloaded values in Inductor's kernels]): its output never takes a freed buffer, and no
    kernel writes into it in place (its readers read it through an alias)."""

    padded_nbytes: int = 0
    """The bytes of its buffer where Inductor pads its strides (a GPU's comprehensive padding; 0:
    unpadded), stored by a pointwise or reduction kernel (Note [Padded strides] in
    ``remat.backends.inductor.padding``)."""
    copy_nbytes: int = 0
    """A view that cannot be expressed over its base's padded strides: the bytes of the copy
    Inductor makes for an extern kernel that reads it (0: none is made)."""
    unpadded_in_backward: bool = False
    """A forward value the backward, where it recomputes it, stores unpadded (the backward's
    convolutions mark it: Note [Padded strides])."""
    fixes_layout: bool = False
    """An op that fixes the layout of an operand with several readers (``mm``, a convolution's
    backward): Inductor gives such an operand its traced strides, copying a view the padded
    strides cannot express (Note [Padded strides])."""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, Kind):
            raise RematError(f"remat: internal error: a node's lowering kind is {self.kind!r}, not a Kind "
                             "(please report)")


@dataclass(frozen=True)
class FusionGraph:
    """One graph as the fusion model lowers it: the forward, or the backward with its recompute.
    Node ids are the joint graph's (``remat.core.peak.Schedule``); ``inputs``, ``facts`` and
    ``nbytes`` cover every node of it, the graph's own nodes are ``order``."""

    order: tuple[int, ...]
    """The graph's nodes in execution order."""
    inputs: Sequence[Sequence[int]]
    """Operands of each node."""
    facts: Sequence[NodeLowering]
    """How each node is lowered."""
    nbytes: Sequence[int]
    """Storage bytes each node allocates (0 for views, inputs and non-tensors)."""
    given: frozenset[int]
    """Nodes that exist before the graph runs (its inputs)."""
    outputs: frozenset[int]
    """Nodes the graph returns."""
    output_storages: frozenset[int] = frozenset()
    """The storages its outputs live in (a returned gradient may view a buffer), kept to the end."""
    numel: Sequence[int] = ()
    """Elements of each node's value, a view counting its base's (0 or absent: unknown); shows
    where a pointwise op broadcasts an operand (Note [Broadcast realization])."""
    nonfreeable: frozenset[int] = frozenset()
    """Inputs Inductor never frees inside the graph (the output gradients), which its own peak
    estimate leaves out (Note [Reuse estimate])."""

    def __post_init__(self) -> None:
        check_facts(self.facts, len(self.inputs))
        check_facts(self.facts, len(self.nbytes))

    def kind(self, v: int) -> Kind:
        return self.facts[v].kind

    def is_extern(self, v: int) -> bool:
        return self.facts[v].kind is Kind.EXTERN

    def dtype(self, v: int) -> str:
        return self.facts[v].dtype

    def elements(self, v: int) -> int:
        """Elements of the buffer ``v`` allocates itself (0 for a view, an input, a tuple); a
        padded buffer's are its value's, not its storage's."""
        if self.facts[v].padded_nbytes and self.numel_of(v):
            return self.numel_of(v)
        return self.nbytes[v] // itemsize(self.facts[v].dtype)

    def numel_of(self, v: int) -> int:
        return self.numel[v] if v < len(self.numel) else 0
