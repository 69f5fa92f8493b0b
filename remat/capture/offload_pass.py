"""Offload in the partitioned graphs: a saved value's device copy goes to pinned host memory
after its last forward use, and comes back before its first backward use (``offload=``).

Note [Offload copies]
The forward returns, in a saved value's place, ``to_host(value)``, inserted right after the
value's last forward use: on CUDA a pinned host tensor written on a device-to-host side stream
(after the compute queued so far), the device block held for that stream
(``Tensor.record_stream``) so that the allocator reuses it only once the copy is done. The
backward reads, in the saved value's place, ``ready(to_device(host))``: ``to_device`` is
inserted where the plan's schedule issues the copy back (``Offloaded.copy_in``'s op), allocates
the device tensor on the compute stream and fills it on a host-to-device side stream once the
compute queued so far and every copy out are done; ``ready``, just before the value's first
backward use, makes the compute stream wait for that copy's event. The host tensor is held by
autograd between the halves and dropped with the other saved values at the end of the backward.
Where the device is the host (CPU), both copies are plain copies: the plumbing runs and computes
the same gradients, and saves no memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

__all__ = ["Move", "insert_offload", "to_host", "to_device", "ready"]


@dataclass(frozen=True)
class Move:
    """One saved value to offload: its name in the partitioned graphs, and the backward op
    before which its copy back is issued (empty: at the backward's start)."""

    name: str
    reload_before: str = ""


_streams: dict[torch.device, tuple[torch.cuda.Stream, torch.cuda.Stream]] = {}
_copied: dict[int, torch.cuda.Event] = {}  # id of a tensor being copied back -> its copy's event


def _side_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
    """The device-to-host and host-to-device streams of ``device``, made once."""
    if device not in _streams:
        _streams[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
    return _streams[device]


def to_host(x: torch.Tensor) -> torch.Tensor:
    """``x`` copied to host memory (Note [Offload copies])."""
    if x.device.type != "cuda":
        return x.clone()
    d2h, _ = _side_streams(x.device)
    host = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="cpu", pin_memory=True)
    d2h.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(d2h):
        host.copy_(x, non_blocking=True)
    x.record_stream(d2h)
    return host


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` copied back to ``device``, the copy issued on a side stream (Note [Offload copies])."""
    if device.type != "cuda":
        return host.clone()
    d2h, h2d = _side_streams(device)
    compute = torch.cuda.current_stream(device)
    out = torch.empty_strided(host.size(), host.stride(), dtype=host.dtype, device=device)
    h2d.wait_stream(compute)
    h2d.wait_stream(d2h)
    with torch.cuda.stream(h2d):
        out.copy_(host, non_blocking=True)
    _copied[id(out)] = h2d.record_event()
    return out


def ready(x: torch.Tensor) -> torch.Tensor:
    """``x`` once its copy back is done: the compute stream waits for it."""
    event = _copied.pop(id(x), None)
    if event is not None:
        torch.cuda.current_stream(x.device).wait_event(event)
    return x


def _with_val(node: fx.Node, like: fx.Node, device: str | torch.device) -> fx.Node:
    val = like.meta.get("val")
    if isinstance(val, torch.Tensor):
        mode = getattr(val, "fake_mode", None)
        if mode is not None:
            with mode:
                node.meta["val"] = torch.empty_strided(val.size(), val.stride(), dtype=val.dtype, device=device)
        else:
            node.meta["val"] = val
    return node


def insert_offload(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, moves: Sequence[Move]) -> None:
    """Rewrite the partitioned ``fw`` and ``bw`` so that each value of ``moves`` (a saved value,
    not a forward output) goes to host memory between them (Note [Offload copies])."""
    if not moves:
        return
    out = fw.graph.find_nodes(op="output")[0]
    outputs = list(out.args[0])
    fw_nodes = {n.name: n for n in fw.graph.nodes}
    bw_nodes = {n.name: n for n in bw.graph.nodes}
    fw_order = {n: k for k, n in enumerate(fw.graph.nodes)}
    order = {n: k for k, n in enumerate(bw.graph.nodes)}
    for move in moves:
        value, ph = fw_nodes.get(move.name), bw_nodes.get(move.name)
        slots = [k for k, a in enumerate(outputs) if a is value]
        if value is None or ph is None or ph.op != "placeholder" or not slots or min(slots) < num_fwd_outputs:
            raise RuntimeError(f"remat: internal error, cannot offload {move.name!r}: not a saved value of both "
                               "halves apart from the outputs; please report")
        val = value.meta.get("val")
        device = val.device if isinstance(val, torch.Tensor) else torch.device("cpu")
        last = max((u for u in value.users if u is not out), key=fw_order.__getitem__, default=value)
        with fw.graph.inserting_after(last):
            host = _with_val(fw.graph.call_function(to_host, (value,)), value, "cpu")
        for k in slots:
            outputs[k] = host
        readers = sorted(ph.users, key=order.__getitem__)
        if not readers:
            continue
        anchor = bw_nodes.get(move.reload_before)
        if anchor is None or order[anchor] > order[readers[0]]:
            anchor = readers[0]
        with bw.graph.inserting_before(anchor):
            back = _with_val(bw.graph.call_function(to_device, (ph, device)), ph, device)
        with bw.graph.inserting_before(readers[0]):
            waited = _with_val(bw.graph.call_function(ready, (back,)), ph, device)
        for r in readers:
            r.replace_input_with(ph, waited)
        _with_val(ph, ph, "cpu")
    out.args = (tuple(outputs),)
    for gm in (fw, bw):
        gm.graph.lint()
        gm.recompile()
