"""Public entry points: ``checkpoint``, ``compiled_plans``, ``explain`` and ``pareto``. They
validate arguments and wire the stages together: wrapping a model is ``remat.capture.wrap``'s,
explain's probe ``remat.capture.probe``'s, and the algorithms live in ``analysis``, ``planning``
and ``core``."""

from __future__ import annotations

from typing import Any, TypeVar

import torch.nn as nn

from .capture.dynamo_backend import RematBackend
from .capture.probe import probe
from .capture.wrap import backend_of, remat_modules, wrap_function, wrap_module
from .chunking import DEFAULT_CHUNKING, Chunking
from .errors import RematError
from .options import Options
from .plan import Frontier, Plan

__all__ = ["checkpoint", "explain", "pareto", "compiled_plans"]

T = TypeVar("T")


def _check_model(model: Any, entry: str, example: str) -> None:
    """``model`` is a module or a function: not a class (``remat.checkpoint(nn.Linear)`` was
    wrapped as a function and failed at the call), nor anything else."""
    if isinstance(model, type):
        inputs = "" if entry == "checkpoint" else ", *example_inputs"
        raise RematError(
            f"remat: {entry} expects an nn.Module instance or a function, got the class {model.__name__} itself. "
            f"Pass an instance: remat.{entry}({model.__name__}(...){inputs})."
        )
    if not isinstance(model, nn.Module) and not callable(model):
        raise RematError(f"remat: {entry} expects an nn.Module or a callable, got {type(model).__name__}. {example}")


def checkpoint(
    model: T,
    *,
    backend: str = "inductor",
    policy: Any = None,
    strict: bool = False,
    dynamic: bool | None = None,
    budget: int | float | str | None = None,
    device_model: Any = None,
    tune: Any = "auto",
    offload: bool | str = False,
    chunking: Chunking | None = DEFAULT_CHUNKING,
    output_grads: str = "auto",
) -> T:
    """Wrap ``model`` (an ``nn.Module`` or a function) so that training saves less.

    A module comes back as a shallow copy sharing its parameters, buffers and submodules
    with ``model``: the same ``state_dict()`` keys, usable with any optimizer, ``.train()``
    and ``.eval()`` (in eval mode the module runs as written, uncompiled and unplanned; they
    set the original's top-level ``training`` flag too, as they set its submodules'). A
    function comes back as a function. Each captured training graph is
    planned by a bytes-weighted min-cut; ``remat.compiled_plans(wrapped)`` lists the plans.
    With ``budget`` (bytes, ``"6GiB"``, or a fraction of eager's peak) each graph takes the
    plan with the least estimated recompute whose predicted peak fits (``remat.budget``).
    With ``tune`` (``"auto"``: on CUDA) the first training steps measure the plan prediction
    chose against a smaller frontier plan and torch.compile's own partition, and keep the
    smallest within 2% of the fastest (``remat.tuning``; the decision is cached on disk).
    With ``offload`` (``"auto"`` or ``"all"``, either backend) saved activations move to pinned
    host memory between the forward and the backward, copied on side streams behind compute
    (``remat.planning.offload``; under Inductor the copies are compiled in place, Note [Offload
    copies] in ``remat.capture.offload_pass``). With ``chunking`` (a ``remat.Chunking``;
    ``None``: never) a budget may also take a plan that runs a region widening each row (an LM
    head and its loss) one slice of rows at a time (Note [Row chunks] in ``remat.analysis.rows``).
    With ``output_grads="auto"`` (the default) a graph that returns a loss beside other tensors
    is planned as trained through the loss, without zero-filled gradients for the others; a
    gradient sent for one anyway is still used (Note [Gradients the caller does not send] in
    ``remat.capture.unsent_grads``); ``"all"`` plans every output's gradient.

    Warns once if Dynamo breaks the model into several graphs (each is planned on its own),
    and turns off Hugging Face gradient checkpointing flags on the model, with a warning.
    A backward with ``create_graph=True`` through the outputs raises ``RematError``.
    """
    _check_model(model, "checkpoint", "Pass the model itself (remat.checkpoint(model)) or a function of tensors.")
    options = Options(backend=backend, policy=policy, strict=strict, dynamic=dynamic, budget=budget,
                      device_model=device_model, tune=tune, offload=offload, chunking=chunking,
                      output_grads=output_grads)
    rb = RematBackend(options)
    if isinstance(model, nn.Module):
        return wrap_module(model, rb)  # type: ignore[return-value]
    return wrap_function(model, rb)  # type: ignore[return-value]


def compiled_plans(model: Any) -> list[Plan]:
    """The plans of the graphs a ``checkpoint``-wrapped model has compiled so far, in capture
    order. Works through wrappers: a model that contains remat-wrapped modules (``DDP(wrapped)``,
    remat per block, FSDP2's ``fully_shard`` on either) gives each wrapped module's plans,
    modules in ``named_modules`` order (the outermost wrapped ones). A Dynamo recompile (new input
    shapes, a failed guard) adds its graph's plan after the first; each plan's ``compiled_for``
    says the inputs it was compiled for, and a step runs the plan whose inputs it matches."""
    subs = remat_modules(model) if isinstance(model, nn.Module) else []
    rb = backend_of(subs[0] if len(subs) == 1 else model)
    compiled_by_torch = isinstance(model, nn.Module) and isinstance(model._modules.get("_orig_mod"), nn.Module)
    if rb is None and not subs and compiled_by_torch:
        raise RematError(
            f"remat: compiled_plans expects a model returned by remat.checkpoint, got the {type(model).__name__} "
            "torch.compile returned: with torch.compile(model, backend='remat') Dynamo hands remat each graph, "
            "not the module it came from, so its plans belong to no model remat can name. Use "
            "model = remat.checkpoint(model) instead: the same planning and Inductor lowering, with "
            "remat's options, and compiled_plans lists its plans."
        )
    if rb is None and not subs:
        raise RematError(
            f"remat: compiled_plans expects a model returned by remat.checkpoint (or a module "
            f"containing one: remat per block, DDP, FSDP2), got {type(model).__name__} with no "
            "remat-wrapped module in it. Wrap it first: model = remat.checkpoint(model)."
        )
    if rb is not None:
        return list(rb.plans)
    return [p for m in subs for p in backend_of(m).plans]


def explain(
    model: Any,
    *args: Any,
    budget: int | float | str | None = None,
    backend: str | None = None,
    policy: Any = None,
    device_model: Any = None,
    **kwargs: Any,
) -> Plan:
    """Plan ``model`` for these inputs without training: the same capture and solve path as
    ``checkpoint`` (with the wrapped model's options, or the defaults), returning the Plan.

    ``budget``, ``backend``, ``policy`` and ``device_model`` are ``checkpoint``'s options and
    override the wrapped model's where given; every other keyword argument goes to the model.
    The forward runs once, uncompiled, and the model is left as it was: parameters, buffers
    (BatchNorm statistics), ``.grad`` and the CPU/CUDA random generators are restored. Nothing
    is compiled or trained. An infeasible ``budget`` raises ``remat.InfeasibleBudgetError``
    here, before any training step.

    Through wrappers as ``compiled_plans``: a model containing remat-wrapped modules
    (``DDP(wrapped)``, remat per block under FSDP2) runs once as written, each wrapped module
    planned with its own options; their plans are combined in call order. The wrappers' forward
    runs too (FSDP2's all-gathers are collectives: call explain on every rank). Under DDP the
    model is planned as one graph, not split at gradient buckets as in training
    (``remat.distributed.unsplit_by_ddp``)."""
    _check_model(model, "explain", "Call remat.explain(model, *example_inputs).")
    overrides = {"budget": budget, "backend": backend, "policy": policy, "device_model": device_model}
    return Plan.combine(probe(model, args, kwargs, overrides, want_frontier=False).plans)


def pareto(
    model: Any,
    *args: Any,
    backend: str | None = None,
    policy: Any = None,
    device_model: Any = None,
    **kwargs: Any,
) -> Frontier:
    """The memory/recompute frontier of ``model`` for these inputs: the default plan and every
    plan on the lower convex hull of (saved bytes, estimated recompute time), each with its
    predicted peak. Needs a single captured graph. Options and the model's state as in
    ``explain``."""
    _check_model(model, "pareto", "Call remat.pareto(model, *example_inputs).")
    overrides = {"backend": backend, "policy": policy, "device_model": device_model}
    found = probe(model, args, kwargs, overrides, want_frontier=True)
    if len(found.plans) != 1 or found.frontiers[0] is None:
        raise RematError(
            f"remat: pareto needs exactly one captured training graph, got {len(found.plans)} "
            "(graph breaks split the model). Call remat.pareto on a part without graph breaks."
        )
    return Frontier(points=found.frontiers[0], eager_peak_bytes=found.plans[0].eager_peak_bytes,
                    peak_floor_bytes=found.plans[0].peak_floor_bytes, default=found.plans[0])
