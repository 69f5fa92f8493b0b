"""A remat-wrapped module is freed when its last reference goes, by reference counting, without
Python's cycle collector (Note [No reference cycle] in remat/capture/wrap.py): ``del model`` frees it, its
parameters and the original module, so a DDP module under remat can be freed before its process
group is destroyed (README: Tearing down)."""

from __future__ import annotations

import contextlib
import copy
import datetime
import gc
import traceback
import weakref
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import remat
from zoo.modules import InplaceViews

WATCHDOG_S = 300
"""Longest a test of this file may take (the ``hang_watchdog`` fixture in conftest.py): the DDP
test builds a gloo process group, whose teardown once hung (Note [No hang in the distributed
tests] in test_distributed.py)."""


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Wide(nn.Module):
    """2.1 MB of parameters: DDP with 1 MB buckets splits its graph."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 512)
        self.fc2 = nn.Linear(512, 1024)
        self.fc3 = nn.Linear(1024, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


@contextlib.contextmanager
def no_cycle_collector() -> Iterator[None]:
    """Python's cycle collector off for the block: what dies inside it dies by reference counting."""
    was_enabled = gc.isenabled()
    gc.collect()  # nothing from earlier code is left for a collection inside the block
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def train(model: nn.Module, steps: int = 2) -> None:
    x = torch.randn(8, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()


def weak_refs(*objects: object) -> list[weakref.ref]:
    return [weakref.ref(o) for o in objects]


def assert_freed(refs: list[weakref.ref]) -> None:
    alive = [type(r()).__name__ for r in refs if r() is not None]  # names: the failure holds no module
    assert not alive, f"still alive after del, without the cycle collector: {alive}"


@pytest.mark.parametrize("make", [Blocks, InplaceViews], ids=["blocks", "inplace_views"])
def test_del_frees_a_wrapped_module_and_its_parameters(make: Callable[[], nn.Module]):
    """The collector is off from before the module is built: neither remat's wrapper nor its
    training steps (Dynamo's capture, planning, the compiled graphs) leave a cycle that holds it."""
    with no_cycle_collector():
        model = make()
        wrapped = remat.checkpoint(model, backend="eager")
        train(wrapped)
        plans = remat.compiled_plans(wrapped)
        refs = weak_refs(wrapped, model, *model.parameters())
        del model, wrapped
        assert_freed(refs)
    assert plans and all(p.fallback is None for p in plans)  # the plans outlive the module


def test_del_frees_a_module_after_eval_train_and_explain():
    model = Blocks()
    wrapped = remat.checkpoint(model, backend="eager")
    train(wrapped)
    with no_cycle_collector():
        wrapped.eval()
        with torch.no_grad():
            wrapped(torch.randn(8, 16))
        wrapped.train()
        remat.explain(wrapped, torch.randn(8, 16, requires_grad=True))
        refs = weak_refs(wrapped, model, *model.parameters())
        del model, wrapped
        assert_freed(refs)


def test_del_frees_a_model_wrapped_per_block():
    model = Blocks()
    blocks = list(model.blocks)
    for i, b in enumerate(blocks):
        model.blocks[i] = remat.checkpoint(b, backend="eager")
    train(model)
    with no_cycle_collector():
        assert len(remat.compiled_plans(model)) == 2
        remat.explain(model, torch.randn(8, 16, requires_grad=True))  # probes each wrapped block
        refs = weak_refs(model, *model.blocks, *blocks, *model.parameters())
        del model, blocks, b
        assert_freed(refs)


def test_a_deep_copy_of_a_model_wrapped_per_block_trains_its_own_plans_and_del_frees_it():
    """A deep copy (an EMA copy, say) is wrapped anew, block by block, with no reference cycle
    (Note [Copies are wrapped anew] in remat/capture/wrap.py)."""
    model = Blocks()
    for i, b in enumerate(list(model.blocks)):
        model.blocks[i] = remat.checkpoint(b, backend="eager")
    with no_cycle_collector():
        copied = copy.deepcopy(model)
        train(copied)
        assert len(remat.compiled_plans(copied)) == 2 and remat.compiled_plans(model) == []
        refs = weak_refs(copied, *copied.blocks, *copied.parameters())
        del copied
        assert_freed(refs)


@pytest.mark.inductor
@pytest.mark.slow
def test_del_frees_a_module_compiled_by_inductor():
    model = Blocks()
    wrapped = remat.checkpoint(model)
    train(wrapped)
    with no_cycle_collector():
        refs = weak_refs(wrapped, model, *model.parameters())
        del model, wrapped
        assert_freed(refs)


@contextlib.contextmanager
def one_rank_gloo_group() -> Iterator[None]:
    """A gloo process group of one rank in this process for the block. On the way out, also
    when the block raised (the frames of its exception cleared: their locals may hold a DDP
    module), what is left is freed before the group is destroyed (Note [No hang in the
    distributed tests] in test_distributed.py)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        yield
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        torch._dynamo.reset()
        gc.collect()
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
@pytest.mark.xdist_group("distributed")  # with test_distributed.py's tests: one gloo group at a time
@pytest.mark.usefixtures("hang_watchdog")
def test_del_frees_a_wrapped_ddp_module_before_its_group_is_destroyed():
    """README (Tearing down): ``del model`` frees the DDP module under
    ``remat.checkpoint(DDP(model))``, with its Reducer (which would otherwise free the process
    group later, from its destructor), once the garbage Dynamo's trace of DDP's forward leaves
    is collected: that trace breaks the graph, and its cyclic garbage refers to the module, under
    ``torch.compile(DDP(model))`` too (``no_cycle_collector`` collects it first)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train_and_free() -> None:  # its own frame: one_rank_gloo_group clears it if it raises
        net = Wide()  # a module of its own: Dynamo compiles its forward after DDP's graph break
        ddp = DDP(net, bucket_cap_mb=1)
        model = remat.checkpoint(ddp, backend="eager")
        train(model)
        with no_cycle_collector():
            assert len(remat.compiled_plans(model)) > 1  # split at the buckets
            refs = weak_refs(model, ddp, net, *net.parameters())
            del net, ddp, model
            assert_freed(refs)

    with one_rank_gloo_group():
        train_and_free()
