"""The ``remat`` logger and the ``REMAT_LOG`` environment variable.

remat logs through the standard ``logging`` logger named ``remat``: at INFO, each plan's
summary when its graph is planned (``plan.summary()``); at DEBUG, the full table of every plan,
and the flow network of a cut that failed. Configure it like any logger
(``logging.getLogger("remat").setLevel(logging.INFO)``), or set ``REMAT_LOG`` to ``debug``,
``info``, ``warning`` or ``error`` before importing remat: the logger then gets that level and,
if it has no handler yet, one that writes to stderr.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping

__all__ = ["LOGGER_NAME", "ENV_VAR", "LEVELS", "configure", "configure_from_env"]

LOGGER_NAME = "remat"
ENV_VAR = "REMAT_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_HANDLER_NAME = "remat-stderr"


def configure(level: str | int) -> logging.Logger:
    """Set the ``remat`` logger's level (a name of ``LEVELS`` or a ``logging`` level) and give it a
    stderr handler unless it already has one of its own."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(LEVELS[level.lower()] if isinstance(level, str) else level)
    if not any(h.get_name() == _HANDLER_NAME for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter("[%(name)s %(levelname)s] %(message)s"))
        logger.addHandler(handler)
    return logger


def configure_from_env(environ: Mapping[str, str] | None = None) -> logging.Logger | None:
    """Apply ``REMAT_LOG`` if set; warns (and does nothing) on an unknown level."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if not value:
        return None
    if value.lower() not in LEVELS:
        warnings.warn(f"remat: {ENV_VAR} must be one of {', '.join(LEVELS)}, got {value!r}; ignoring it. "
                      f"Set {ENV_VAR}=info to log each plan's summary.", stacklevel=2)
        return None
    return configure(value)
