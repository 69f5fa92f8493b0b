"""The ``remat`` logger and the ``REMAT_LOG`` environment variable.

remat logs through the standard ``logging`` logger named ``remat``: at INFO, each plan's
summary when its graph is planned (``plan.summary()``); at DEBUG, the full table of every plan,
and the flow network of a cut that failed. Configure it like any logger
(``logging.getLogger("remat").setLevel(logging.INFO)``), or set ``REMAT_LOG`` to ``debug``,
``info``, ``warning`` or ``error`` before importing remat: the logger then gets that level and,
if it has no handler yet, one that writes to stderr.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import sysconfig
import types
import warnings
from collections.abc import Mapping

__all__ = ["LOGGER_NAME", "ENV_VAR", "LEVELS", "configure", "configure_from_env", "user_frame", "warn_at_user"]

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


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    import torch

    dirs = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(torch.__file__)),
            sysconfig.get_paths()["stdlib"]]
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


def _is_library(filename: str) -> bool:
    return filename.startswith("<") or os.path.realpath(filename).startswith(_library_dirs())


def user_frame(tb: types.TracebackType | None) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the innermost frame of a traceback that is the user's code
    (not remat, torch or the standard library); None if there is none."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_library(code.co_filename):
            found = (os.path.relpath(code.co_filename) if not code.co_filename.startswith("<") else code.co_filename,
                     tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found


def warn_at_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the innermost caller outside remat, torch and the
    standard library (the user's ``model(x)`` or ``remat.explain`` line), however deep inside
    Dynamo the warning is raised. (Python 3.12's ``skip_file_prefixes`` does the same; this
    works on 3.10 too.)"""
    frame, level = sys._getframe(1), 1
    while frame is not None and _is_library(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1 if frame is not None else 2)
