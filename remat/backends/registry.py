"""The backends by name: ``backend_for("eager")``, ``backend_for("inductor")``. (The interface
is ``remat.backends.base.Backend``; this registry imports its implementations, which import the
interface.)"""

from __future__ import annotations

from .base import BACKENDS, Backend
from .eager.backend import EagerBackend
from .inductor import InductorBackend

__all__ = ["backend_for"]

_BY_NAME: dict[str, type[Backend]] = {"eager": EagerBackend, "inductor": InductorBackend}
assert set(_BY_NAME) == set(BACKENDS)


def backend_for(name: str) -> Backend:
    """The backend named ``name`` (validated by ``remat.options.Options``)."""
    try:
        return _BY_NAME[name]()
    except KeyError:
        raise ValueError(f"remat: unknown backend {name!r}; expected one of {BACKENDS} (please report)") from None
