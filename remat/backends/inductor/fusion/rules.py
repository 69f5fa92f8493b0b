"""Inductor's realization thresholds and allocation habits on one device, as the fusion model
copies them: each threshold has its home here (Note [Inductor realization] names Inductor's own
settings; ``versions.HOOKS["realization"]``, ``["mix_order_reduction"]``,
``["persistent_reductions"]``). Pure: no torch import."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["FusionRules", "MixOrder", "CPU", "GPU", "rules_for", "replace_rules"]


@dataclass(frozen=True, slots=True)
class MixOrder:
    """When Inductor (GPU) fuses a reduction over the batch with a sibling row reduction into a
    mix-order reduction kernel, and the splits its workspace is sized by (Note [Mix-order
    workspace]; ``scheduler.py: MixOrderReduction.can_fuse``, ``codegen/simd.py:
    _codegen_mix_order_reduction``)."""

    min_rows: int = 4096
    """At least this many rows (the batch)..."""
    rows_per_col: int = 2
    """...and at least this many per column..."""
    max_cols: int = 16384
    """...of at most this many columns..."""
    min_elements: int = 5 * 2**20
    """...and at least this many elements in all."""
    rows_per_sm: int = 8
    """A split is the largest power of two at most rows / (this x SMs)..."""
    split_range: tuple[int, int] = (16, 128)
    """...clamped to this range."""

    def fuses(self, rows: int, cols: int) -> bool:
        """Whether a batch reduction of ``rows`` x ``cols`` is large enough for a mix-order kernel."""
        return (rows >= self.min_rows and rows >= self.rows_per_col * cols and rows * cols >= self.min_elements
                and cols <= self.max_cols)

    def split(self, rows: int, sm_count: int) -> int:
        """Rows per split of the kernel's workspace."""
        n = rows // (self.rows_per_sm * sm_count)
        lo, hi = self.split_range
        return min(max(1 << (n.bit_length() - 1) if n > 0 else 0, lo), hi)


@dataclass(frozen=True, slots=True)
class FusionRules:
    """Inductor's realization thresholds and allocation habits on one device."""

    device: str
    reads_threshold: int = 4
    """A value with several readers and more buffer reads than this is stored."""
    acc_reads_threshold: int = 8
    """An expression reading more buffers than this is stored."""
    opcount_threshold: int = 30
    """An expression with more ops than this is stored (if it has several readers, or reads
    more than one buffer)."""
    max_inline_ops: int = 100
    """An expression with more ops than this is always stored."""
    realize_heavy_reuse: bool = False
    """Store a value with several readers whose expression has an exp/log/tanh/sigmoid (CPU)."""
    kernel_groups: bool = False
    """Stored values between two extern kernels share one fused kernel's allocation."""
    stage_local: bool = False
    """Work of two different blocks is never fused (remat compiles with stage-local fusion)."""
    one_kernel_between_externs: bool = False
    """All fused kernels between two extern kernels are emitted as one kernel that allocates
    every buffer before it runs and frees after it (the C++ backend's kernel groups; with
    ``stage_local``, one per block, since remat flushes the group between blocks); in-place
    writes are still decided per fused kernel."""
    one_iteration_space: bool = False
    """A fused kernel loops over one iteration space: work between two extern kernels is split
    where its sizes differ (Triton; Note [One iteration space]; ``versions.HOOKS["iteration_space"]``)."""
    random_at_reader: bool = False
    """A random value is computed in its first reader's kernel (Note [Random values at their
    readers]; ``versions.HOOKS["random_at_reader"]``)."""
    mix_order_splits: bool = False
    """A reduction over leading dimensions sharing a full read with a row reduction starts a new
    group (GPU: Inductor's mix-order reduction kernels)."""
    mix_order: MixOrder = MixOrder()
    """Which of those kernels hold a workspace, and its size (with ``sm_count``)."""
    local_buffers: bool = False
    """A stored pointwise value read only by row-wise work of its own group is never allocated
    (registers, or a C++ per-row local buffer)."""
    registers: bool = False
    """Kernel-local values live in registers (Triton): one that row reductions and pointwise
    work of its kernel both read stays local. The C++ backend's per-row local buffers need
    readers of one kind."""
    persistent_rows: int | None = None
    """Rows of at most this many elements are reduced by a persistent kernel that holds the
    whole row in registers. A longer row is reduced in a loop, one pass per dependent row
    reduction, and a value one pass computes and a later pass reads is stored in memory (Triton;
    ``None``: every row fits, as in the C++ backend's per-row local buffers)."""
    horizontal_fusion: bool = False
    """A later kernel that shares a read with an earlier one of its size, and reads nothing
    computed between them, is fused into it (Note [Sibling kernels fused])."""
    inplace: bool = True
    """A pointwise kernel writes into a same-sized buffer it reads for the last time."""
    sm_count: int = 0
    """Streaming multiprocessors of the GPU (132 on an H200): sizes a mix-order reduction's
    workspace (Note [Mix-order workspace]); 0: no workspace."""
    inplace_in_kernel: bool = False
    """A fused kernel's later pass writes into a same-sized buffer an earlier pass of it stored
    and it reads for the last time (Triton's ``in_out_ptr``, Note [Looped reductions])."""
    reuse: bool = True
    """A freed buffer is held for a later one of its size when Inductor's peak estimate allows."""
    reuse_estimate_buffers: bool = False
    """Inductor's peak estimate, which decides buffer reuse, counts the graph's own buffers. It
    does only where its peak-memory reordering sized them; remat compiles its plans with that
    reordering off (Note [remat's order kept]), so the estimate is the freeable inputs alone
    (Note [Reuse estimate])."""
    reuse_margin: float = 0.01
    """Holding a freed buffer counts as allowed when it raises the model's copy of Inductor's
    peak estimate by at most this fraction. The copy differs from Inductor's own by small
    buffers, and decisions at the margin decide whether a large buffer stays allocated: the gpt
    workload's MLP buffer missed Inductor's own limit by 256 bytes in the model (CPU, medium)
    yet is held in the generated code. With 0.01 the gpt predictions move from -10.7% to -2.9%
    (CPU, medium, default plan); see benchmarks/README.md."""


CPU = FusionRules("cpu", acc_reads_threshold=12, opcount_threshold=50, realize_heavy_reuse=True,
                  kernel_groups=True, local_buffers=True, stage_local=True, one_kernel_between_externs=True)
GPU = FusionRules("cuda", kernel_groups=True, local_buffers=True, mix_order_splits=True, stage_local=True,
                  persistent_rows=1024, inplace_in_kernel=True, sm_count=132, registers=True,
                  horizontal_fusion=True, one_iteration_space=True, random_at_reader=True)


def rules_for(device: str) -> FusionRules:
    """The rules of a device type (``"cpu"``, ``"cuda"``; other GPUs use the CUDA rules)."""
    return CPU if device == "cpu" else GPU


def replace_rules(rules: FusionRules, **changes: object) -> FusionRules:
    """``rules`` with some fields changed (a GPU's own multiprocessor count, say)."""
    return replace(rules, **changes)
