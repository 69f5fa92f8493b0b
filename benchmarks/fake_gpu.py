"""Inductor's CUDA code generation on a machine without a GPU (a development tool, not remat).

With torch's CUDA wheel installed on a CPU-only machine (the registry here serves torch 2.14.1
as one), Inductor can lower a graph whose tensors are fake CUDA tensors and emit its Triton
kernels and its Python wrapper, whose memory plan remat reads (``wrapper_reading``), as long as
nothing asks the CUDA driver: ``patched()`` answers the device-property, RNG-state and stream
queries with an H100's values and replaces Triton's kernel compilation with a stub, so the
wrapper module loads and is never run. Autograd itself cannot run on fake CUDA tensors
(building its input metadata asks for the current CUDA stream), so graphs are differentiated on
the CPU first and moved to CUDA afterwards (``to_cuda``): ``gpu_offline.py`` captures the joint
graph of a model on fake CPU tensors and plans and lowers it as on the GPU.

It patches private torch and Triton names (the ones listed in ``patched``), checked with torch
2.14.1 and Triton 3.8 only; the machine that measures (torch 2.11) generates its code with an
older Inductor, so what this shows is evidence of what Inductor does on a GPU, not a
measurement of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch
import torch.fx as fx

H100 = SimpleNamespace(
    name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132, total_memory=80 * 2**30,
    regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, warp_size=32,
    L2_cache_size=50 * 2**20, gcnArchName="", shared_memory_per_block_optin=227 * 1024,
    max_threads_per_block=1024, clock_rate=1_980_000, memory_clock_rate=2_619_000, memory_bus_width=5120)
"""What ``torch.cuda.get_device_properties`` answers inside ``patched``."""

CUDA = torch.device("cuda", 0)


class _Kernel:
    """A Triton kernel that is never compiled and never runs."""

    def run(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("fake_gpu: a kernel of an offline CUDA compile was called")


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Inside this context Inductor believes an H100 is present (see the module docstring)."""
    import torch.cuda.graphs as cuda_graphs
    import torch.cuda.random as cuda_random
    import torch.utils._triton as torch_triton
    from torch._dynamo.device_interface import CudaInterface
    from torch._inductor import config as inductor_config
    from torch._inductor.async_compile import AsyncCompile
    from torch._subclasses import fake_tensor
    from triton.backends.compiler import GPUTarget

    class _Backend:
        target = GPUTarget("cuda", 90, 32)

        def hash(self) -> str:
            return "fake-gpu"

    rng = torch.zeros(16, dtype=torch.uint8)
    changes: list[tuple[Any, str, Any]] = [
        (torch.cuda, "get_device_properties", lambda *a, **k: H100),
        (torch.cuda, "get_device_capability", lambda *a, **k: (9, 0)),
        (torch.cuda, "is_available", lambda: True),
        (torch.cuda, "device_count", lambda: 1),
        (torch.cuda, "current_device", lambda: 0),
        (torch.cuda, "_lazy_init", lambda: None),
        (torch.cuda, "_exchange_device", lambda idx: -1),
        (torch.cuda, "_maybe_exchange_device", lambda idx: -1),
        (torch.cuda, "set_device", lambda *a, **k: None),
        (torch.cuda, "get_rng_state", lambda *a, **k: rng),
        (torch.cuda, "set_rng_state", lambda *a, **k: None),
        (cuda_random, "get_rng_state", lambda *a, **k: rng),
        (cuda_random, "set_rng_state", lambda *a, **k: None),
        (torch.cuda, "is_current_stream_capturing", lambda: False),
        (cuda_graphs, "is_current_stream_capturing", lambda: False),
        (torch.accelerator, "is_available", lambda: False),
        (torch_triton, "triton_backend", lambda: _Backend()),
        (torch_triton, "triton_hash_with_backend", lambda: "fake-gpu"),
        (AsyncCompile, "triton", lambda self, *a, **k: _Kernel()),
        (AsyncCompile, "wait", lambda self, scope: None),
        # torch 2.11's fake CUDA tensors allocate one real tensor first when CUDA says it is available
        (fake_tensor, "init_gpu_context", lambda device: None),
    ]
    for name, value in dict(get_device_properties=lambda *a, **k: H100, get_compute_capability=lambda *a, **k: 90,
                            is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
                            is_bf16_supported=lambda *a, **k: True, is_triton_capable=lambda *a, **k: True,
                            raise_if_triton_unavailable=lambda *a, **k: None).items():
        changes.append((CudaInterface, name, staticmethod(value)))
    saved = [(owner, name, owner.__dict__.get(name, getattr(owner, name))) for owner, name, _ in changes]
    try:
        for owner, name, value in changes:
            setattr(owner, name, value)
        torch_triton.has_triton.cache_clear()  # answered before the patches: no GPU
        with inductor_config.patch(compile_threads=1, fx_graph_cache=False):
            yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
        torch_triton.has_triton.cache_clear()


def fake_like(mode: Any, t: torch.Tensor, device: torch.device = CUDA) -> torch.Tensor:
    """A fake tensor of ``mode`` on ``device`` with ``t``'s sizes, strides and dtype."""
    from torch._subclasses.fake_tensor import FakeTensor

    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return FakeTensor(mode, meta, device)


def to_cuda(gm: fx.GraphModule, inputs: list[Any], mode: Any) -> list[Any]:
    """Move the already-differentiated ATen graph ``gm`` to CUDA in place: every device argument
    becomes ``cuda:0`` and every node's ``meta["val"]`` is propagated again from fake CUDA
    tensors like ``inputs`` (names, stack traces and module paths are kept). Returns the fake
    CUDA inputs."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    def move(a: Any) -> Any:
        if isinstance(a, torch.device):
            return CUDA
        if isinstance(a, (list, tuple)):
            return type(a)(move(x) for x in a)
        return a

    for n in gm.graph.nodes:
        n.args = move(n.args)
        n.kwargs = {k: move(v) for k, v in n.kwargs.items()}
    gm.recompile()
    from torch._subclasses.fake_tensor import FakeTensor

    class _Prop(FakeTensorProp):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            if isinstance(result, torch.Tensor) and not isinstance(result, FakeTensor):
                # flash attention's meta function makes its random state on "meta"
                result = fake_like(mode, result)
                n.meta["val"] = result
            return result

    fakes = [fake_like(mode, t) if isinstance(t, torch.Tensor) else t for t in inputs]
    with mode:
        _Prop(gm, mode=mode).propagate_dont_convert_inputs(*fakes)
    return fakes


def cuda_attention(gm: fx.GraphModule) -> int:
    """Give the joint graph ``gm``, captured on a CPU, the attention kernels a GPU runs: each
    ``_scaled_dot_product_flash_attention_for_cpu`` and its backward become CUDA's flash
    attention forward and backward, which also return and read the sequence bookkeeping and the
    random state (new ``getitem`` nodes; the rest are constants for dense inputs). A mask (which
    CUDA's flash kernel does not take) raises. Returns how many forward calls were changed."""
    import operator

    aten = torch.ops.aten
    cpu_fw, cpu_bw = aten._scaled_dot_product_flash_attention_for_cpu.default, \
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    extras: dict[fx.Node, list[Any]] = {}

    def arg(n: fx.Node, i: int, name: str, default: Any) -> Any:
        return n.args[i] if len(n.args) > i else n.kwargs.get(name, default)

    for n in list(gm.graph.nodes):
        if n.target is cpu_fw:
            if n.kwargs.get("attn_mask") is not None:
                raise ValueError(f"fake_gpu: {n.name} has a mask; CUDA's flash attention takes none")
            q, k, v = n.args[:3]
            n.target = aten._scaled_dot_product_flash_attention.default
            n.args = (q, k, v, arg(n, 3, "dropout_p", 0.0), arg(n, 4, "is_causal", False), False)
            n.kwargs = {"scale": n.kwargs.get("scale")}
            with gm.graph.inserting_after(n):  # the random state; the rest are constants for dense inputs
                seed, offset = [gm.graph.call_function(operator.getitem, (n, i)) for i in (7, 6)][::-1]
            # no cumulative sequence lengths (None), the longest sequences are the lengths
            extras[n] = [None, None, q.meta["val"].shape[-2], k.meta["val"].shape[-2], seed, offset]
        elif n.target is cpu_bw:
            if n.kwargs.get("attn_mask") is not None:
                raise ValueError(f"fake_gpu: {n.name} has a mask; CUDA's flash attention takes none")
            g, q, k, v, out, lse = n.args[:6]
            fw = lse.args[0]
            cum_q, cum_k, max_q, max_k, seed, offset = extras[fw]
            n.target = aten._scaled_dot_product_flash_attention_backward.default
            n.args = (g, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, arg(n, 6, "dropout_p", 0.0),
                      arg(n, 7, "is_causal", False), seed, offset)
            n.kwargs = {"scale": n.kwargs.get("scale")}
    gm.graph.lint()
    gm.recompile()
    return len(extras)
