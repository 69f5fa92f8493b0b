"""remat: save fewer activations for the backward and recompute cheap ones, chosen by a
bytes-weighted min-cut over the joint forward+backward graph."""

from .api import checkpoint, compiled_plans, explain, pareto
from .budget import Budget
from .capture.dynamo_backend import remat_backend
from .chunking import Chunking
from .core.regime import Regime
from .device import DeviceModel
from .errors import InfeasibleBudgetError, PlanningError, PolicyError, RematError
from .options import Options
from .plan import Frontier, Plan, SavedTensor
from .policy import MUST_RECOMPUTE, MUST_SAVE, Decision, OpInfo, Rule, recompute, save
from .regime import regime
from .tuning import Tuning

__all__ = [
    "checkpoint",
    "explain",
    "pareto",
    "regime",
    "Regime",
    "Frontier",
    "Budget",
    "Chunking",
    "compiled_plans",
    "remat_backend",
    "Options",
    "DeviceModel",
    "Tuning",
    "Plan",
    "SavedTensor",
    "Decision",
    "MUST_SAVE",
    "MUST_RECOMPUTE",
    "OpInfo",
    "Rule",
    "save",
    "recompute",
    "RematError",
    "PolicyError",
    "PlanningError",
    "InfeasibleBudgetError",
]

__version__ = "0.1.0"


def _register() -> None:
    from . import compat, logs

    compat.register_backend("remat", remat_backend)
    logs.configure_from_env()


_register()
