"""Options: the one place where ``checkpoint``/``explain`` arguments are normalised and validated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .backends.base import BACKENDS
from .budget import Budget, parse_budget
from .chunking import DEFAULT_CHUNKING, Chunking
from .device import DEVICE_MODELS, DeviceModel
from .errors import RematError
from .policy import Policy, normalize_policy
from .tuning import Tuning, parse_tune

__all__ = ["Options", "BACKENDS", "OFFLOAD_MODES", "OUTPUT_GRADS"]

OFFLOAD_MODES = (False, "auto", "all")
"""The values of ``offload``."""

OUTPUT_GRADS = ("auto", "all")
"""The values of ``output_grads``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    backend: str = "inductor"
    """``"inductor"``: forward and backward (with its recompute) compiled by Inductor (Triton on
    GPU, C++ on CPU). ``"eager"``: the partitioned forward and backward graphs run uncompiled,
    op by op: for debugging and fast tests."""

    policy: Policy | None = None
    """User rules that force ops or modules to be saved or recomputed (see ``remat.policy``)."""

    strict: bool = False
    """If planning fails for an unexpected reason: ``False`` falls back to saving what autograd
    would save, with one warning; ``True`` raises."""

    dynamic: bool | None = None
    """Passed to ``torch.compile``: ``True`` traces symbolic shapes up front, ``None`` lets
    Dynamo decide after a recompile, ``False`` specialises on every shape."""

    budget: Budget | int | float | str | None = None
    """Bound on the predicted peak activation memory of a step: bytes (``int`` or ``"6GiB"``)
    or a fraction in (0, 1] of eager autograd's predicted peak, as a ``float`` (a string is
    bytes: ``"0.5"`` raises). ``None``: the default plan."""

    device_model: DeviceModel | str | None = None
    """Roofline numbers for recompute-time estimates: ``"h200"``, ``"cpu"`` or a
    ``remat.DeviceModel``; ``None`` picks by the graph's device."""

    tune: Tuning | bool | str | None = "auto"
    """Choose each graph's plan by measuring candidates on the first training steps
    (``remat.tuning``): ``"auto"`` on CUDA, ``True`` on every device, ``False`` never, or a
    ``remat.Tuning``. Normalised to a ``Tuning`` or ``None``."""

    offload: bool | str = False
    """Saved activations kept in pinned host memory between the forward and the backward,
    copied on side streams (``remat.planning.offload``): ``False`` never; ``"auto"`` those whose
    copies the step's compute hides (none where the device is the host, on CPU), and under a
    budget also copies it cannot hide where no faster plan fits (their stall counted: Note
    [Offload under a budget]); ``"all"`` every
    saved activation that can move, hidden or not (the copies' estimated stall is in the plan).
    Both backends: the copies run as operators Inductor compiles in place (Note [Offload copies]
    in ``remat.capture.offload_pass``)."""

    output_grads: str = "auto"
    """Which output gradients a graph is planned with. ``"auto"``: a graph that returns a loss (a
    0-dim output with a gradient) beside other tensors is planned as trained through the loss,
    without the zero-filled gradients autograd would hand its backward for the others (HF
    models' logits); a gradient sent for one anyway is still used, by an uncompiled backward and
    with a warning (under a budget it raises): Note [Gradients the caller does not send] in
    ``remat.capture.unsent_grads``. ``"all"``: every output's gradient is planned and read."""

    chunking: Chunking | None = DEFAULT_CHUNKING
    """Regions that widen each row (an LM head and its loss: Note [Row chunks] in
    ``remat.analysis.rows``) also planned in slices of rows, so that a budget (or ``pareto``) can
    take a plan that never holds their wide tensors whole: a ``remat.Chunking`` says how they are
    cut; ``None`` never. The default plan, without a budget, is planned on the graph as captured
    (a sliced frontier plan may still be measured and kept by ``tune``)."""

    def __post_init__(self) -> None:
        if self.chunking is not None and not isinstance(self.chunking, Chunking):
            raise RematError(f"remat: chunking must be a remat.Chunking or None, got {type(self.chunking).__name__}. "
                             "Use remat.Chunking(min_rows=..., max_chunks=...), or None to plan the graph unsliced.")
        if not isinstance(self.backend, str) or self.backend not in BACKENDS:
            raise RematError(
                f"remat: backend must be one of {BACKENDS}, got {self.backend!r}. "
                "Use backend='inductor' to compile, or backend='eager' to debug uncompiled."
            )
        if not isinstance(self.strict, bool):
            raise RematError(f"remat: strict must be True or False, got {self.strict!r}.")
        if self.dynamic not in (None, True, False):
            raise RematError(f"remat: dynamic must be None, True or False, got {self.dynamic!r}.")
        if self.offload not in OFFLOAD_MODES or self.offload is True:
            raise RematError(f"remat: offload must be one of {OFFLOAD_MODES}, got {self.offload!r}. "
                             "Use offload='auto' to offload what the step's compute hides, offload='all' to offload "
                             "every saved activation that can move (either backend), or offload=False.")
        if self.output_grads not in OUTPUT_GRADS:
            raise RematError(f"remat: output_grads must be one of {OUTPUT_GRADS}, got {self.output_grads!r}. Use "
                             "output_grads='auto' to plan a graph that returns a loss as trained through it, or "
                             "'all' when the caller also differentiates the other outputs.")
        object.__setattr__(self, "policy", normalize_policy(self.policy))
        object.__setattr__(self, "budget", parse_budget(self.budget))
        object.__setattr__(self, "tune", parse_tune(self.tune))
        dm = self.device_model
        if isinstance(dm, str):
            if dm not in DEVICE_MODELS:
                raise RematError(f"remat: device_model must be one of {sorted(DEVICE_MODELS)} or a "
                                 f"remat.DeviceModel, got {dm!r}.")
            object.__setattr__(self, "device_model", DEVICE_MODELS[dm])
        elif dm is not None and not isinstance(dm, DeviceModel):
            raise RematError(f"remat: device_model must be a name or a remat.DeviceModel, got "
                             f"{type(dm).__name__}.")

    @classmethod
    def create(cls, **kwargs: Any) -> Options:
        return cls(**kwargs)
