"""The decision cache: which candidate plan measured best for a graph, kept on disk so that the
next run of the same script compiles only that plan.

A decision is keyed by everything that could change it: the joint graph's structure (its
code, op by op, with shapes and dtypes), the device (its name), the torch version, and the
options that shape the candidates (backend, budget, policy, tolerance). A graph that differs in
any of these is a new key; nothing is ever looked up by a partial match. The entry holds the
chosen candidate's identity (``PlanData.key``: its saved values' and recomputed ops' names,
which planning produces deterministically for the same graph) and the measured table, so a
cache hit can be reported with the numbers that decided it.

Files are JSON, one per key, written atomically (a temporary file renamed into place): two
processes tuning the same graph at once each write a whole entry, and the later one wins.
A file that cannot be read or parsed is a miss, never an error: the cache only saves time.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Decision", "DecisionCache", "decision_key", "default_cache_dir", "SCHEMA_VERSION", "ENV_VAR"]

SCHEMA_VERSION = 1
ENV_VAR = "REMAT_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$REMAT_CACHE_DIR``, else ``$XDG_CACHE_HOME/remat``, else ``~/.cache/remat``."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "remat"


def decision_key(graph: str, device: str, torch_version: str, options: str) -> str:
    """A stable hex key of the four parts (each a string the caller builds deterministically)."""
    h = hashlib.sha256()
    for part in (graph, device, torch_version, options):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class Decision:
    """What was chosen for one key: the candidate's ``PlanData.key`` (its saved values' and
    recomputed ops' names) and name, and each candidate's measured median seconds and peak
    bytes, in candidate order."""

    chosen: tuple[tuple[str, ...], tuple[str, ...]]
    name: str
    reason: str
    table: tuple[tuple[str, float, int], ...] = field(default=())
    """(candidate name, median seconds, peak bytes) per candidate."""
    budget_bytes: int | None = None
    """The graph's share of the budget the candidates were measured under (None: no budget)."""


class DecisionCache:
    """Decisions under ``root/decisions/``. ``root=None``: ``default_cache_dir()``."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()

    def _path(self, key: str) -> Path:
        return self.root / "decisions" / f"{key}.json"

    def load(self, key: str) -> Decision | None:
        try:
            data = json.loads(self._path(key).read_text())
            if data.get("schema") != SCHEMA_VERSION:
                return None
            saved, recomputed = data["chosen"]
            return Decision((tuple(saved), tuple(recomputed)), data["name"], data["reason"],
                            tuple((str(n), float(s), int(b)) for n, s, b in data["table"]),
                            None if data.get("budget_bytes") is None else int(data["budget_bytes"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, key: str, decision: Decision) -> Path | None:
        """Write ``decision``; returns its path, or None when the directory cannot be written
        (a read-only home, say: tuning then runs again next time)."""
        path = self._path(key)
        data = {"schema": SCHEMA_VERSION, **asdict(decision)}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError:
            return None
        return path
