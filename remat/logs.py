"""The ``remat`` logger and the ``REMAT_LOG`` environment variable.

remat logs through the standard ``logging`` logger named ``remat``: at INFO, each plan's
summary when its graph is planned (``plan.summary()``); at DEBUG, the full table of every plan,
and the flow network of a cut that failed. Configure it like any logger
(``logging.getLogger("remat").setLevel(logging.INFO)``), or set ``REMAT_LOG`` to ``debug``,
``info``, ``warning`` or ``error`` before importing remat: the logger then gets that level and,
if it has no handler yet, one that writes to stderr.

Planning progress goes to the child logger ``remat.progress`` (``planning``): a line every
few seconds while one graph's planning runs, and one line per graph that took over a second
(nodes, time, saved bytes against eager autograd's, predicted peak). Without ``REMAT_LOG`` it
prints at INFO to stderr by default, so a slow first step is never silent; ``REMAT_LOG`` (or
``configure``) routes it through the ``remat`` logger with the rest, and
``logging.getLogger("remat.progress").setLevel(logging.WARNING)`` silences it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import sysconfig
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["LOGGER_NAME", "PROGRESS_LOGGER_NAME", "ENV_VAR", "LEVELS", "SLOW_PLAN_SECONDS", "configure",
           "configure_from_env", "planning", "user_frame", "warn_at_user"]

LOGGER_NAME = "remat"
ENV_VAR = "REMAT_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
PROGRESS_LOGGER_NAME = "remat.progress"
_HANDLER_NAME = "remat-stderr"
SLOW_PLAN_SECONDS = 1.0
"""Planning a graph for longer than this is reported on ``remat.progress`` (see ``planning``)."""
HEARTBEAT_SECONDS = 5.0
"""While a graph's planning runs on, a progress line this often."""


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (redirections and test
    capture included), not the stream of import time."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _stderr_handler() -> logging.Handler:
    handler = _Stderr()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("[%(name)s %(levelname)s] %(message)s"))
    return handler


def _progress_by_default() -> None:
    """``remat.progress`` at INFO on stderr, unless the user set it (or ``remat``) up."""
    logger, parent = logging.getLogger(PROGRESS_LOGGER_NAME), logging.getLogger(LOGGER_NAME)
    if logger.handlers or logger.level != logging.NOTSET or parent.handlers or parent.level != logging.NOTSET:
        return
    handler = _Stderr()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("[remat] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _progress_through_remat() -> None:
    """Undo ``_progress_by_default``: ``remat.progress`` inherits the ``remat`` logger's setup."""
    logger = logging.getLogger(PROGRESS_LOGGER_NAME)
    logger.handlers[:] = [h for h in logger.handlers if h.get_name() != _HANDLER_NAME]
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


def configure(level: str | int) -> logging.Logger:
    """Set the ``remat`` logger's level (a name of ``LEVELS`` or a ``logging`` level) and give it a
    stderr handler unless it already has one of its own."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(LEVELS[level.lower()] if isinstance(level, str) else level)
    if not any(h.get_name() == _HANDLER_NAME for h in logger.handlers):
        logger.addHandler(_stderr_handler())
    _progress_through_remat()
    return logger


def configure_from_env(environ: Mapping[str, str] | None = None) -> logging.Logger | None:
    """Apply ``REMAT_LOG`` if set; warns (and does nothing) on an unknown level."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if not value:
        _progress_by_default()
        return None
    if value.lower() not in LEVELS:
        warnings.warn(f"remat: {ENV_VAR} must be one of {', '.join(LEVELS)}, got {value!r}; ignoring it. "
                      f"Set {ENV_VAR}=info to log each plan's summary.", stacklevel=2)
        _progress_by_default()
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


@contextmanager
def planning(label: str, nodes: int, clock: Callable[[], float] = time.monotonic) -> Iterator[Callable[[str], None]]:
    """Report one graph's planning on ``remat.progress``: a line every ``HEARTBEAT_SECONDS``
    while it runs (from a timer thread, so a long frontier sweep shows signs of life). Yields
    ``done(result)``: call it with a one-line
    description of the plan; it is logged with the elapsed time if planning took over
    ``SLOW_PLAN_SECONDS``."""
    logger = logging.getLogger(PROGRESS_LOGGER_NAME)
    start = clock()
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            logger.info("planning %s (%d nodes): %.0f s so far...", label, nodes, clock() - start)

    thread = None
    if logger.isEnabledFor(logging.INFO):
        thread = threading.Thread(target=heartbeat, name="remat-planning-progress", daemon=True)
        thread.start()

    def done(result: str) -> None:
        stop.set()
        if thread is not None:
            thread.join()
        elapsed = clock() - start
        if elapsed > SLOW_PLAN_SECONDS:
            logger.info("planned %s (%d nodes) in %.1f s: %s", label, nodes, elapsed, result)

    try:
        yield done
    finally:
        stop.set()
        if thread is not None:
            thread.join()
