"""Gradients the caller does not send: outputs beside a loss whose gradients the backward never reads.

Note [Gradients the caller does not send]: a graph that returns its loss beside other tensors
(HF models return the logits with the loss) is trained through the loss: ``loss.backward()``
sends a gradient for the loss only. Autograd still hands AOTAutograd's backward a gradient for
every differentiable output, filled with zeros where none was sent (``materialize_grads``),
and the backward adds it to what the loss's gradient gives: for HF GPT-2 at 8 x 1,024 tokens a
785 MiB buffer of zeros held through the whole backward, for HF Llama 1,000 MiB, which no
plan can recompute or slice and which eager autograd never allocates (its gradients exist only
for what the loss reads). Under ``output_grads="auto"`` (the default) such a graph is planned as
trained through its loss:

* before planning, each non-scalar output gradient of a graph that returns a 0-dim gradient-
  carrying output (a loss) computed from that output, and does not end at a graph break, is read
  through a stand-in: a ``full`` of zeros of its shape placed just before its first reader
  (``stand_in_zeros``; ``unsent_tangents`` says which); a reader that adds it to a value of its
  own shape and dtype (the gradient the loss sends the same output) becomes an ``alias`` of that
  value, and a stand-in nobody reads then goes, so neither backend computes the zeros. The
  planner sees no tangent bytes (``is_unsent``), Inductor folds zeros left into the kernel that
  reads them, and the tangent placeholder stays, read by nothing;
* at run time the compiled forward turns zero-filling off on its autograd node
  (``ForwardWithoutZeroFill``): an output nobody differentiated gets ``None``;
* the compiled backward (``UnsentDispatch``) passes an unread ``None`` as a meta tensor of the
  placeholder's size and strides (no memory; Inductor checks only those), fills ``None`` with
  zeros where its graph reads the gradient (what autograd did), and, if the caller did send a
  gradient the plan took as unsent (``out.logits.sum().backward()`` as well as the loss, say),
  runs the graph as partitioned *with* that gradient, uncompiled, and warns once: correct
  gradients, slower, and under a budget the step may not fit the plan's peak, so there it raises.
  ``output_grads="all"`` plans every output's gradient.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from .. import compat
from ..analysis.halves import UNSENT, is_tangent, is_unsent
from ..analysis.op_facts import view_root
from ..core.reach import reachable
from ..errors import RematError
from ..units import format_bytes

__all__ = ["UNSENT", "PLANNED", "BUDGETED", "ForwardWithoutZeroFill", "UnsentDispatch", "general_backward",
           "has_stand_ins", "is_unsent", "stand_in_zeros", "unsent_tangents", "wrapped_backward"]

PLANNED, BUDGETED = "planned", "budgeted"
"""``UNSENT`` on a tangent placeholder a stand-in replaced: planned without a budget, or with one."""


def _val(node: fx.Node) -> Any:
    return node.meta.get("val")


def unsent_tangents(joint: fx.GraphModule, num_fwd_outputs: int, ends_at_break: bool) -> list[fx.Node]:
    """The tangents ``stand_in_zeros`` replaces in ``joint``: none where the graph ends at a graph
    break (its outputs go to the code after the break) or returns no loss (a 0-dim floating
    output with a gradient); else each non-scalar floating tangent with readers and static sizes
    whose output the loss is computed from: every forward output of its shape and dtype (a
    tangent names no output) is, or views, an ancestor of a 0-dim floating forward output. A model that
    returns an auxiliary scalar beside an output the scalar does not read (a mixture of experts'
    balance loss beside its logits, say) keeps that output's gradient."""
    if ends_at_break:
        return []
    tangents = [n for n in joint.graph.nodes if is_tangent(n)]
    if not any(_floating(t) and _val(t).ndim == 0 for t in tangents):
        return []
    out = joint.graph.find_nodes(op="output")[0]
    fwd_outs = [a for a in compat.tree_leaves(out.args)[:num_fwd_outputs] if isinstance(a, fx.Node)]
    scalars = [o for o in fwd_outs if _floating(o) and _val(o).ndim == 0]
    feeds = reachable(scalars, lambda n: n.all_input_nodes)

    def feeds_the_loss(t: fx.Node) -> bool:
        alike = [o for o in fwd_outs if _floating(o) and _alike(_val(o), _val(t))]
        return bool(alike) and all(o in feeds or _root(o) in feeds for o in alike)

    return [t for t in tangents if _floating(t) and _val(t).ndim > 0 and t.users
            and not any(compat.is_sym(d) for d in _val(t).shape) and feeds_the_loss(t)]


def _floating(n: fx.Node) -> bool:
    v = _val(n)
    return isinstance(v, torch.Tensor) and v.dtype.is_floating_point


def _root(n: fx.Node) -> fx.Node:
    """The node whose storage ``n`` views (an output returned as a view of what the loss reads)."""
    return view_root(n) if n.op == "call_function" else n


def _alike(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)


def stand_in_zeros(joint: fx.GraphModule, tangents: list[fx.Node], budgeted: bool) -> int:
    """Replace each of ``tangents``' reads by a ``full`` of zeros of its shape, dtype and device,
    placed before its first reader (Note [Gradients the caller does not send]); the bytes of
    the tangents replaced. ``budgeted``: the graph is planned under a budget."""
    graph, total = joint.graph, 0
    order = {n: i for i, n in enumerate(graph.nodes)}
    for t in tangents:
        v = _val(t)
        first = min(t.users, key=order.__getitem__)
        args = (list(v.shape), 0)
        kwargs = {"dtype": v.dtype, "layout": torch.strided, "device": v.device, "pin_memory": False}
        with graph.inserting_before(first):
            z = graph.call_function(torch.ops.aten.full.default, args, kwargs)
        z.meta["val"] = compat.fake_value(torch.ops.aten.full.default, args, kwargs, v)
        z.meta[UNSENT] = t.name
        t.replace_all_uses_with(z)
        t.meta[UNSENT] = BUDGETED if budgeted else PLANNED
        total += v.numel() * v.element_size()
        for u, other in [(u, o) for u in z.users if (o := _added_to(u, z)) is not None]:
            with graph.inserting_before(u):
                a = graph.call_function(torch.ops.aten.alias.default, (other,))
            a.meta = {**u.meta, "val": compat.fake_value(torch.ops.aten.alias.default, (_val(other),), {}, _val(other)),
                      UNSENT: t.name}
            u.replace_all_uses_with(a)
            graph.erase_node(u)
        if not z.users:
            graph.erase_node(z)
    graph.lint()
    joint.recompile()
    return total


def _added_to(u: fx.Node, z: fx.Node) -> fx.Node | None:
    """The value ``u`` adds stand-in ``z`` to, where it has ``u``'s own shape and dtype (``u`` is
    then that value: an alias of it); else None."""
    if u.target is not torch.ops.aten.add.Tensor or len(u.args) != 2 or list(u.args).count(z) != 1:
        return None
    other = u.args[1] if u.args[0] is z else u.args[0]
    if not isinstance(other, fx.Node) or not isinstance(_val(other), torch.Tensor):
        return None
    if u.args[0] is z and u.kwargs.get("alpha", 1) != 1:  # 0 + alpha * other
        return None
    return other if _alike(_val(other), _val(u)) and set(u.kwargs) <= {"alpha"} else None


def general_backward(bw: fx.GraphModule) -> fx.GraphModule:
    """A copy of backward ``bw`` that reads each tangent its stand-ins replaced: a stand-in
    ``full`` becomes the tangent, a folded sum (an ``alias`` of the other addend) the sum again."""
    graph = copy.deepcopy(bw.graph)
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    for z in [n for n in graph.nodes if n.op == "call_function" and isinstance(n.meta.get(UNSENT), str)]:
        tangent = placeholders[z.meta[UNSENT]]
        if z.target is torch.ops.aten.alias.default:
            with graph.inserting_before(z):
                summed = graph.call_function(torch.ops.aten.add.Tensor, (z.args[0], tangent))
            z.replace_all_uses_with(summed)
        else:
            z.replace_all_uses_with(tangent)
        graph.erase_node(z)
    graph.lint()
    return fx.GraphModule(bw, graph)


class UnsentDispatch:
    """A compiled backward of a graph with stand-ins, called with AOTAutograd's boxed arguments
    (saved values, then the gradients, ``None`` where autograd sent none)."""

    def __init__(self, bw: fx.GraphModule):
        """Built before ``bw`` is compiled (Inductor changes the graph it compiles); ``compiled``
        is set after."""
        # AOTAutograd calls a backward with ``_boxed_call`` with the argument list; Dynamo's
        # disable wrapper copies the instance's __dict__, not its class's attributes.
        self._boxed_call = True
        placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"]
        self.compiled: Callable[[list[Any]], Any] | None = None
        self.fill: dict[int, Any] = {}
        """Argument index -> the value (size, stride, dtype, device) of a gradient placeholder."""
        self.unread: set[int] = set()
        """Indices of the gradients the compiled graph does not read (its stand-ins replaced them)."""
        self.budgeted = False
        """Whether the plan is a budget's: a gradient sent anyway raises (the step could exceed it)."""
        for i, p in enumerate(placeholders):
            v = _val(p)
            if is_tangent(p) and isinstance(v, torch.Tensor):
                self.fill[i] = v
                if is_unsent(p):
                    self.unread.add(i)
                    self.budgeted |= p.meta[UNSENT] == BUDGETED
        self.general_source = general_backward(bw) if self.unread else None
        self._general: Callable[[list[Any]], Any] | None = None
        self.sent_anyway = 0
        """Backward calls that were sent a gradient the plan took as unsent (the general path)."""

    @staticmethod
    def needed(bw: fx.GraphModule) -> bool:
        """Whether backward ``bw`` has stand-ins (and so needs this dispatch)."""
        return any(is_unsent(n) for n in bw.graph.nodes if n.op == "placeholder")

    def __call__(self, args: list[Any]) -> Any:
        # A gradient autograd filled with zeros (its node not found) adds nothing: left unread.
        sent = [i for i in self.unread if args[i] is not None and bool(args[i].any())]
        if sent:
            return self._run_general(args, sent)
        for i, v in self.fill.items():
            if args[i] is None:
                args[i] = (torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
                           if i in self.unread else torch.zeros(v.shape, dtype=v.dtype, device=v.device))
        assert self.compiled is not None
        return self.compiled(args)

    def _run_general(self, args: list[Any], sent: list[int]) -> Any:
        shapes = ", ".join(f"{tuple(self.fill[i].shape)}" for i in sorted(sent))
        nbytes = sum(self.fill[i].numel() * self.fill[i].element_size() for i in sent)
        what = (f"this graph returns a loss, so remat planned it as trained through the loss, but the caller also "
                f"sent a gradient for {len(sent)} other output(s) of shape {shapes} "
                f"({format_bytes(nbytes)}; Note [Gradients the caller does not send])")
        if self.budgeted:
            raise RematError(f"remat: {what}. The budget's plan does not hold those gradients, so the step could "
                             "exceed it. Pass output_grads='all' to remat.checkpoint to plan every output's gradient.")
        if not self.sent_anyway:
            warnings.warn(f"remat: {what}: this backward runs uncompiled, with them, from now on. Pass "
                          "output_grads='all' to remat.checkpoint to plan and compile it with them.", stacklevel=2)
        self.sent_anyway += 1
        if self._general is None:
            assert self.general_source is not None
            self._general = compat.run_uncompiled(self.general_source)
        for i, v in self.fill.items():
            if args[i] is None:
                args[i] = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        return self._general(args)


def wrapped_backward(bw: fx.GraphModule, compile: Callable[[], Any]) -> Any:
    """What AOTAutograd gets for backward ``bw``: ``compile()`` itself, or behind an
    ``UnsentDispatch`` where ``bw`` has stand-ins (``remat.backends.base.Backend.compile``)."""
    if not UnsentDispatch.needed(bw):
        return compile()
    dispatch = UnsentDispatch(bw)
    dispatch.compiled = compile()
    return dispatch


def has_stand_ins(fw_bw: Any) -> bool:
    """Whether a partition function's result ``(forward, backward)`` has stand-ins."""
    return isinstance(fw_bw, tuple) and len(fw_bw) == 2 and UnsentDispatch.needed(fw_bw[1])


class ForwardWithoutZeroFill:
    """A compiled forward whose autograd node sends ``None`` for the gradients of outputs nobody
    differentiated instead of zeros (``materialize_grads``; ``versions.HOOKS["unsent_grads"]``)."""

    def __init__(self, run: Callable[..., Any]):
        self.run = run

    def __call__(self, *args: Any) -> Any:
        out = self.run(*args)
        node = compat.compiled_function_node(out)
        if node is not None:
            node.materialize_grads = False
        return out
