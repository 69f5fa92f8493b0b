"""Offload in the partitioned graphs: a saved value's device copy goes to pinned host memory
after its last forward use, and comes back before its first backward use (``offload=``).

Note [Offload copies]
The forward returns, in a saved value's place, ``to_host(value)``, inserted right after the
value's last forward use: on CUDA a pinned host tensor written on a device-to-host side stream
(after the compute queued so far). The device copy must outlive the copy. Run op by op (the
uncompiled backend), the forward drops it at once and the caching allocator holds its block for
that stream (``Tensor.record_stream``), reusing it only once the copy is done. Compiled code
hands a freed buffer to a later one itself, bypassing the allocator (Inductor's ``# reuse``
lines), so there ``to_host(value, held=True)`` records the copy's event instead and the
forward returns ``ready(host, value)``, inserted after the op the plan names
(``Offloaded.released_after``: the op during which the copy out is estimated to end): the
compute stream waits for the copy there, and the graph holds ``value`` until then. The
backward reads, in the saved value's place, ``ready(to_device(host))``: ``to_device`` is
inserted where the plan's schedule issues the copy back (``Offloaded.copy_in``'s op), allocates
the device tensor on the compute stream and fills it on a host-to-device side stream once the
compute queued so far and every copy out are done; ``ready``, just before the value's first
backward use, makes the compute stream wait for that copy's event. The host tensor is held by
autograd between the halves and dropped with the other saved values at the end of the backward.
Where the device is the host (CPU), both copies are plain copies: the plumbing runs and computes
the same gradients, and saves no memory.

The host copy has the strides the graph gives the value (``to_host``'s ``stride``), not those of
the buffer Inductor hands it: on a GPU Inductor pads a row whose stride is not a multiple of 128
bytes (``config.comprehensive_padding``), and a host copy with the padded strides had to be copied
again to the graph's strides before the forward returned it (``config.keep_output_stride``), on the
host, into pageable memory, while the copy to it was still in flight (reproduced on the CPU with
padding on, tests/capture/test_offload_inductor.py; on an H100, 22 of 126 copies back of HF Llama
at 88,064 tokens came from pageable memory, a shape padding does not touch, so some other layout
choice; not measured since). The same holds wherever Inductor lays a value out otherwise than the
graph. Where the two layouts differ, ``to_host`` first copies the value, on the side stream, into
a device buffer laid out as the host tensor, so the copy out stays one asynchronous memcpy (a copy
between two layouts would go through pageable memory, synchronously); that buffer, one value's
bytes while the copy runs, is not in the peak model. It is allocated on the compute stream and
released to it once the copy is done (``record_stream``): a block allocated on the side stream goes
back to that stream's pool, where the compute stream's allocations never find it, so under a hard
cap each such block was memory the step could not use. ``to_device`` refuses a host tensor that is
not pinned: on CUDA that can only be such a copy, and training on it could read a half-written
copy.

The three are operators of the ``remat`` library (``torch.library``, Note [Offload ops' host
cost]), with fake implementations, so that Inductor compiles the partitioned graphs with them: each is a fallback
kernel that stays where the graph puts it, ``to_host`` and ``to_device`` allocate their results
and ``ready`` returns its input (an alias: Inductor frees the buffer after the alias's last
reader). Events are keyed by the data pointer of the copy's result, taken by ``ready``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

__all__ = ["Move", "insert_offload", "to_host", "to_device", "ready", "issue_seconds"]


@dataclass(frozen=True)
class Move:
    """One saved value to offload: its name in the partitioned graphs, the backward op before
    which its copy back is issued (empty: at the backward's start), and the forward op after
    which its device copy is released once its copy out is done (empty: when the copy out is
    issued, the allocator holding the block; Note [Offload copies])."""

    name: str
    reload_before: str = ""
    released_after: str = ""


_copies: dict[int, torch.cuda.Event] = {}  # data pointer of a copy's result -> the copy's event, until ``ready``


_streams: dict[torch.device, tuple[torch.cuda.Stream, torch.cuda.Stream]] = {}


def _side_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
    """The device-to-host and host-to-device streams of ``device``, made once."""
    if device not in _streams:
        _streams[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
    return _streams[device]


def _laid_out(x: torch.Tensor, stride: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """A copy of ``x`` on ``device`` with ``stride`` (a ``clone`` keeps neither a given layout nor
    a padded one)."""
    return torch.empty_strided(x.size(), stride, dtype=x.dtype, device=device).copy_(x)


def _same_layout(size: Sequence[int], a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether strides ``a`` and ``b`` lay out a tensor of ``size`` alike (a dimension of size 1
    may have any stride)."""
    return all(n == 1 or x == y for n, x, y in zip(size, a, b))


# Note [Offload ops' host cost]
# Each offloaded value costs the host a few operator calls a step (``to_host``, ``ready`` twice,
# ``to_device``), whatever its bytes: on an H100 (HF GPT-2, 82 values) about
# 0.4 ms of CPU a value, profiled, against 40 us of copy each way, and a step that was already
# bound by the host took that time on top (benchmarks/README.md, section Gradients the caller does
# not send). So the three are plain operators of the ``remat`` library (``Library.define`` with
# one implementation for every backend), not ``torch.library.custom_op``s, whose Python wrapper
# costs several microseconds more a call (measured on a CPU: 10 against 3 us). What a
# value's copies still cost the host is measured once per device (``issue_seconds``, through
# ``remat.planning.offload.host_link``) and counted in the plans that offload (Note [Copies the
# host issues] in ``remat.core.offload``).
_LIB = torch.library.Library("remat", "FRAGMENT")
_LIB.define("to_host(Tensor x, bool held=False, int[]? stride=None) -> Tensor")
_LIB.define("to_device(Tensor host, Device device) -> Tensor")
# ``ready`` returns its input: an alias, defined with an alias annotation (as ``torch.library``
# documents); the partitioned graphs are not functionalized again, and Inductor runs it as a
# fallback whose output shares its input's buffer.
_LIB.define("ready(Tensor(a) x, Tensor? held=None) -> Tensor(a)")


@torch.library.impl("remat::to_host", "CompositeExplicitAutograd", lib=_LIB)
def _to_host(x: torch.Tensor, held: bool = False, stride: Sequence[int] | None = None) -> torch.Tensor:
    """``x`` copied to host memory, with ``stride`` (the graph's strides of the value; ``x``'s when
    not given) (Note [Offload copies]). ``held``: the graph keeps ``x`` until a ``ready`` of the
    result (the compiled forward); otherwise the allocator holds its block for the copy
    (``Tensor.record_stream``)."""
    stride = x.stride() if stride is None else stride
    if x.device.type != "cuda":
        return _laid_out(x, stride, x.device)
    d2h, _ = _side_streams(x.device)
    compute = torch.cuda.current_stream(x.device)
    host = torch.empty_strided(x.size(), stride, dtype=x.dtype, device="cpu", pin_memory=True)
    # a copy between two layouts is no memcpy: torch would stage it through pageable memory,
    # synchronously; laid out as the host tensor on the device first, it is one. That buffer is
    # allocated on the compute stream (a block allocated on the side stream would go back to that
    # stream's pool, which the compute stream's allocations never reuse) and filled on the side one
    src = None if _same_layout(x.size(), x.stride(), stride) else torch.empty_strided(
        x.size(), stride, dtype=x.dtype, device=x.device)
    d2h.wait_stream(compute)
    with torch.cuda.stream(d2h):
        if src is not None:
            src.copy_(x)
            src.record_stream(d2h)
        host.copy_(x if src is None else src, non_blocking=True)
    if held:
        _copies[host.data_ptr()] = d2h.record_event()
    else:
        x.record_stream(d2h)
    return host


@torch.library.register_fake("remat::to_host", lib=_LIB)
def _(x: torch.Tensor, held: bool = False, stride: Sequence[int] | None = None) -> torch.Tensor:
    return torch.empty_strided(x.size(), x.stride() if stride is None else stride, dtype=x.dtype, device="cpu")


@torch.library.impl("remat::to_device", "CompositeExplicitAutograd", lib=_LIB)
def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` copied back to ``device``, the copy issued on a side stream (Note [Offload copies])."""
    if device.type != "cuda":
        return _laid_out(host, host.stride(), device)
    if not host.is_pinned():
        raise RuntimeError(
            "remat: internal error: an offloaded value came back from pageable host memory, so it was copied "
            "on the host after its copy from the device was issued (perhaps before that copy finished); the "
            "gradients could be wrong, so the step stops here (Note [Offload copies]). Train without offload "
            "(offload=False) and please report this with your torch version")
    d2h, h2d = _side_streams(device)
    compute = torch.cuda.current_stream(device)
    out = torch.empty_strided(host.size(), host.stride(), dtype=host.dtype, device=device)
    h2d.wait_stream(compute)
    h2d.wait_stream(d2h)
    with torch.cuda.stream(h2d):
        out.copy_(host, non_blocking=True)
    _copies[out.data_ptr()] = h2d.record_event()
    return out


@torch.library.register_fake("remat::to_device", lib=_LIB)
def _(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.empty_strided(host.size(), host.stride(), dtype=host.dtype, device=device)


@torch.library.impl("remat::ready", "CompositeExplicitAutograd", lib=_LIB)
def _ready(x: torch.Tensor, held: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` once its copy is done: the compute stream waits for it. ``held``: the tensor the copy
    read, kept until here (the compiled forward's device copy)."""
    event = _copies.pop(x.data_ptr(), None)
    if event is not None:
        stream = held.device if held is not None and held.device.type == "cuda" else x.device
        torch.cuda.current_stream(stream).wait_event(event)
    return x


@torch.library.register_fake("remat::ready", lib=_LIB)
def _(x: torch.Tensor, held: torch.Tensor | None = None) -> torch.Tensor:
    return x


to_host = torch.ops.remat.to_host.default
to_device = torch.ops.remat.to_device.default
ready = torch.ops.remat.ready.default


def issue_seconds(device: torch.device, values: int = 32) -> float:
    """The host's seconds to issue one offloaded value's ops on CUDA ``device`` (``to_host`` of a
    held copy, its ``ready``, ``to_device`` and its ``ready``): ``values`` values of 4 KiB issued
    one after another, as a step issues them, the best of three rounds after a warm-up (Note
    [Offload ops' host cost]). The copies' own time is the link's, not counted here."""
    x = torch.empty(4096, dtype=torch.uint8, device=device)
    rounds = []
    for _ in range(4):  # the first round warms up (pinned blocks, streams) and is not counted
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        hosts = [ready(to_host(x, True, None), x) for _ in range(values)]
        backs = [ready(to_device(h, device)) for h in hosts]
        rounds.append(time.perf_counter() - start)
        torch.cuda.synchronize(device)
        del hosts, backs
    return min(rounds[1:]) / values


def _with_val(node: fx.Node, like: fx.Node, device: str | torch.device,
              stride: Sequence[int] | None = None) -> fx.Node:
    """``node`` with a fake value like ``like``'s on ``device`` (with ``stride``, where given)."""
    val = like.meta.get("val")
    if isinstance(val, torch.Tensor):
        mode = getattr(val, "fake_mode", None)
        if mode is not None:
            with mode:
                node.meta["val"] = torch.empty_strided(val.size(), val.stride() if stride is None else tuple(stride),
                                                       dtype=val.dtype, device=device)
        else:
            node.meta["val"] = val
    return node


def insert_offload(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, moves: Sequence[Move],
                   channels_last: Callable[[fx.GraphModule], frozenset[str]] | None = None) -> None:
    """Rewrite the partitioned ``fw`` and ``bw`` so that each value of ``moves`` (a saved value,
    not a forward output) goes to host memory between them (Note [Offload copies]).
    ``channels_last``: the backend's ``Backend.channels_last`` (Note [Host copy layout])."""
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
        held = bool(move.released_after)
        stride = list(val.stride()) if isinstance(val, torch.Tensor) else None
        with fw.graph.inserting_after(last):
            host = _with_val(fw.graph.call_function(to_host, (value, held, stride)), value, "cpu")
        returned = host
        if held:
            anchor = fw_nodes.get(move.released_after)
            after = anchor if anchor is not None and fw_order[anchor] > fw_order[last] else host
            if anchor is None:  # not in the forward: released at its end
                after = out.prev
            with fw.graph.inserting_after(after):
                returned = _with_val(fw.graph.call_function(ready, (host, value)), value, "cpu")
        for k in slots:
            outputs[k] = returned
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
    if channels_last is not None:
        _lay_out_host_copies(fw, outputs[num_fwd_outputs:], channels_last(fw))
    for gm in (fw, bw):
        gm.graph.lint()
        gm.recompile()


# Note [Host copy layout]
# A backend may lay a forward output out otherwise than traced: Inductor's layout optimization
# (a training graph with convolutions, versions.HOOKS["channels_last_outputs"]) makes a dense 4-D
# output downstream of a convolution channels-last, and where the output is a fallback's result
# laid out otherwise (a host copy in the traced, contiguous strides) it copies it into a new
# buffer first: on the host, into pageable memory, while the copy out may still be in flight
# (read on a fake H100 for ResNet-50: 160 host copies of up to 196 MiB each copied again, read as
# device memory, 4,335 MiB read against 1,445 simulated; on CUDA ``to_device`` refuses such a copy).
# So a host copy whose returned node the backend lays out channels-last (``Backend.channels_last``,
# asked of the forward with the copies in it) is made channels-last: its ``to_host`` stride and the
# copy's traced value are those strides, the forward returns it as it is, and AOTAutograd gives the
# backward's input the strides the forward returned (as it does for any saved value whose layout
# Inductor changed). The device value is channels-last there too, so the copy out stays one memcpy.


def _lay_out_host_copies(fw: fx.GraphModule, saved: Sequence[Any], channels_last: frozenset[str]) -> None:
    """The host copies among the forward's ``saved`` outputs that ``channels_last`` names, with
    channels-last strides (Note [Host copy layout])."""
    for returned in saved:
        if not (isinstance(returned, fx.Node) and returned.target in (to_host, ready)
                and returned.name in channels_last):
            continue
        host = returned if returned.target is to_host else returned.args[0]
        if not (isinstance(host, fx.Node) and host.target is to_host):
            continue
        val = host.meta.get("val")
        if not (isinstance(val, torch.Tensor) and val.dim() == 4 and val.is_contiguous()):
            continue  # dense in the traced layout (a layout already channels-last stays)
        n, c, h, w = val.shape
        stride = [c * h * w, 1, w * c, c]
        host.args = (host.args[0], host.args[1], stride)
        for node in {host, returned}:
            _with_val(node, node, val.device, stride)
