"""Split a joint forward+backward graph into a forward and a backward module per a plan.

``make_partition_fn(options, sink, backend, reference)`` returns the function AOTAutograd calls
with the joint graph. It asks the planner for the graph's plan
(``remat.planning.planner.plan_joint_graph``, with the backends capture resolved), splits the
graph into a forward that returns the saved values and a backward that recomputes the rest,
places each recomputed op just before its first use in the backward, lets the backend annotate
the two modules, and hands the ``Plan`` to ``sink``. If planning fails unexpectedly, the graph
saves what autograd would save (or, with ``strict``, raises).
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch.fx as fx

from .. import compat
from ..backends.base import Backend
from ..core.peak import lazy_order
from ..errors import RematError
from ..options import Options
from ..plan import Plan, Role
from ..plan_data import PlanKey
from ..planning.choice import FIRST, Attempt
from ..planning.planner import plan_joint_graph, plan_of_saved
from ..units import format_bytes
from .offload_pass import Move, insert_offload
from .rng_replay import insert_rng_replay
from .unsent_grads import stand_in_zeros, unsent_tangents

__all__ = ["make_partition_fn", "make_stock_partition_fn", "place_recompute", "STOCK"]

log = logging.getLogger("remat")


def place_recompute(bw: fx.GraphModule, recomputed: set[str]) -> None:
    """Move each op of ``recomputed`` (every op the backward computes from saved values alone:
    recomputed forward ops and backward-only ones such as an activation's derivative) to just
    before its first use (fx frees values after their last use), so these tensors live only as
    long as the backward needs them. The same ordering as the simulator's (``peak.lazy_order``)."""
    nodes = list(bw.graph.nodes)

    def movable(n: fx.Node) -> bool:
        return n.op == "call_function" and n.name in recomputed

    anchors = [n for n in nodes if n.op not in ("placeholder", "output") and not movable(n)]
    anchors += [n for n in nodes if movable(n)]  # movable ops nobody reads keep a place at the end
    order = lazy_order(anchors, lambda n: n.all_input_nodes, movable)
    output = bw.graph.find_nodes(op="output")[0]
    for n in order:
        output.prepend(n)
    bw.graph.lint()
    bw.recompile()


def make_partition_fn(options: Options, sink: Callable[[Plan, tuple[Plan, ...] | None], None],
                      backend: Backend, reference: Backend, want_frontier: bool = False,
                      ends_at_break: bool = False, attempt: Attempt = FIRST,
                      pick: PlanKey | None = None) -> Callable[..., Any]:
    """The partition function for AOTAutograd (and Inductor's partitioner hook). ``sink``
    receives each graph's plan and, with a budget or ``want_frontier``, its frontier. ``backend``
    is the one that lowers the graph; it plans it too. ``reference``: the uncompiled backend
    eager autograd's baseline is simulated with. ``ends_at_break``: Dynamo ended this graph at a
    graph break, so its outputs go to the code that resumes after it, not to the caller
    (``remat.analysis.joint_graph.analyze``). ``attempt``: the budget's compile of this graph
    (``remat.planning.choice``); ``pick``: the candidate to use (``remat.tuning``)."""

    def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                  static_lifetime_input_indices: list[int] | None = None, **_: Any):
        static = list(static_lifetime_input_indices or [])
        unsent = _stand_ins(joint, num_fwd_outputs, options, ends_at_break)
        try:
            planned = plan_joint_graph(joint, num_fwd_outputs, static, options, want_frontier, backend,
                                       reference=reference, ends_at_break=ends_at_break, attempt=attempt,
                                       pick=pick)
            jg, saved_ids, plan, frontier = planned.jg, planned.saved_ids, planned.plan, planned.frontier
            joint = planned.gm or joint  # a nested plan splits the graph with its copies (remat.planning.nesting)
            values = [jg.nodes[i] for i in saved_ids]
            saved_sym = [n for n in values if compat.is_sym(n.meta.get("val"))]
            saved_tensors = [n for n in values if not compat.is_sym(n.meta.get("val"))]
            static_nodes = {jg.nodes[i] for i, f in enumerate(jg.facts) if f.role is Role.PARAMETER
                            and jg.nodes[i].op == "placeholder"}
            fw, bw = compat.extract_fwd_bwd(joint, saved_tensors, saved_sym, num_fwd_outputs,
                                            compat.ordered_set(n for n in joint.graph.nodes
                                                               if n in static_nodes))
            place_recompute(bw, {n.name for n in jg.nodes if n.op == "call_function"})
            insert_offload(fw, bw, num_fwd_outputs, [Move(o.name, o.reload_before, o.released_after)
                                                    for o in plan.offloaded], backend.channels_last)
            replayed = insert_rng_replay(fw, bw, num_fwd_outputs)
            if unsent:
                plan = replace(plan, notes=(*plan.notes, unsent))
            if replayed:
                plan = replace(plan, notes=(*plan.notes, f"{replayed} random op(s) recomputed by replaying the "
                                                         "generator state the forward drew from (Note [Replayed "
                                                         "random ops])"))
            backend.annotate(fw, bw)
        except RematError:
            raise
        except Exception as e:  # noqa: BLE001 - any unexpected failure falls back
            if options.strict:
                raise RematError(f"remat: planning failed ({type(e).__name__}: {e}). "
                                 "strict=True forbids the fallback; please report this graph.") from e
            warnings.warn(f"remat: planning failed ({type(e).__name__}: {e}); this graph saves "
                          "what autograd would save instead. Pass strict=True to raise.", stacklevel=2)
            fw, bw = compat.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                              static_lifetime_input_indices=static)
            plan, frontier = Plan(saved=(), recomputed=(), fallback=f"{type(e).__name__}: {e}"), None
        if log.isEnabledFor(logging.INFO):
            log.info("%s", plan.summary())
        log.debug("%s", plan)
        sink(plan, frontier)
        return fw, bw

    return partition


def _stand_ins(joint: fx.GraphModule, num_fwd_outputs: int, options: Options, ends_at_break: bool) -> str:
    """Plan ``joint`` without the gradients of outputs beside its loss where ``options`` ask
    (``remat.capture.unsent_grads``); the plan's note saying so, or ``""``."""
    if options.output_grads != "auto":
        return ""
    tangents = unsent_tangents(joint, num_fwd_outputs, ends_at_break)
    if not tangents:
        return ""
    nbytes = stand_in_zeros(joint, tangents, budgeted=options.budget is not None)
    return (f"trained through its loss: {len(tangents)} other output gradient(s) ({format_bytes(nbytes)}) never "
            "filled with zeros nor read (Note [Gradients the caller does not send]; output_grads='all' plans them)")


STOCK = "torch.compile"
"""The name of torch.compile's own partition among the candidates a graph measures."""


def make_stock_partition_fn(options: Options, sink: Callable[[Plan, tuple[Plan, ...] | None], None],
                            backend: Backend, reference: Backend, ends_at_break: bool = False) -> Callable[..., Any]:
    """The partition function that splits the joint graph as torch.compile does
    (``compat.stock_partition``: its min-cut partitioner, as Inductor calls it), for measuring it
    as a candidate (``remat.tuning``); ``sink`` receives the Plan of what it saves
    (``remat.planning.planner.plan_of_saved``, planned on a copy of the joint graph taken first)."""

    def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                  static_lifetime_input_indices: list[int] | None = None, **_: Any):
        static = list(static_lifetime_input_indices or [])
        unsent = _stand_ins(joint, num_fwd_outputs, options, ends_at_break)
        copied = fx.GraphModule(joint, copy.deepcopy(joint.graph))
        fw, bw = compat.stock_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                        static_lifetime_input_indices=static)
        out = fw.graph.find_nodes(op="output")[0].args[0]
        saved = [a.name for a in list(out)[num_fwd_outputs:] if isinstance(a, fx.Node)]
        try:
            plan = plan_of_saved(copied, num_fwd_outputs, static, options, backend, reference=reference,
                                 saved_names=saved, origin=STOCK, ends_at_break=ends_at_break)
        except RematError:
            raise
        except Exception as e:  # noqa: BLE001 - the report of a partition that runs anyway
            plan = Plan(saved=(), recomputed=(), origin=STOCK,
                        notes=(f"{STOCK}: its partition runs; its plan could not be read ({type(e).__name__}: {e})",))
        if unsent:
            plan = replace(plan, notes=(*plan.notes, unsent))
        sink(plan, None)
        return fw, bw

    return partition
