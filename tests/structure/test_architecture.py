"""The package's shape, checked from its source with ``ast`` (see ARCHITECTURE.md):

* only ``remat/backends/inductor/`` imports ``torch._inductor``;
* only ``remat/backends/inductor/`` and ``remat/compat.py`` touch any other private torch API (a module
  path with a ``_``-prefixed part, a ``_``-prefixed name imported from torch, or an attribute
  chain such as ``torch._dynamo.reset``);
* the pure core (every module of ``remat/core/``, and Inductor's pure models ``backends/inductor/facts``,
  ``backends/inductor/fusion/`` and ``backends/inductor/kernel_model``) imports no torch at all;
* no import cycle inside ``remat/``, lazy imports inside functions and imports under
  ``if TYPE_CHECKING:`` included (an annotation's import is a dependency too);
* below capture (planning, analysis, the core, the partition) nothing resolves a backend by
  name: the backend is handed down (``remat.backends.registry`` is capture's);
* the renderers (``remat.report``) read a plan's data (``remat.plan_data``), never ``remat.plan``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2] / "remat"
INDUCTOR_PACKAGE = "remat.backends.inductor"
COMPAT = "remat.compat"
PURE_PACKAGE = "remat.core"
PURE_ELSEWHERE = ("remat.backends.inductor.facts", "remat.backends.inductor.fusion",
                  "remat.backends.inductor.kernel_model", "remat.units", "remat.device")
"""Pure modules outside the core (a package here covers its modules)."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(name: str) -> bool:
    return (ROOT.parent / name.replace(".", "/") / "__init__.py").exists()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of statements inside ``if TYPE_CHECKING:`` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                out.update(id(n) for n in ast.walk(stmt))
    return out


def _imports(name: str, tree: ast.AST, type_checking: bool = False) -> list[tuple[str, tuple[str, ...]]]:
    """(imported module, names imported from it) for every runtime import of module ``name``;
    with ``type_checking``, the imports under ``if TYPE_CHECKING:`` too."""
    skip = set() if type_checking else _type_checking_nodes(tree)
    package = name if _is_package(name) else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = tuple(a.name for a in node.names)
            out.append((mod, names))
    return out


def _modules() -> dict[str, ast.AST]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(ROOT.rglob("*.py"))}


def _private(module: str) -> bool:
    """A private torch module or attribute; ``torch.ops.<namespace>.<op>`` names ops (some
    public ops start with ``_``, such as ``aten._to_copy``), not private API."""
    parts = module.split(".")
    return parts[0] == "torch" and parts[1:2] != ["ops"] and any(p.startswith("_") for p in parts[1:])


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


MODULES = _modules()


def test_the_scan_sees_the_package():
    assert {"remat.api", "remat.planning.planner", "remat.capture.partition", "remat.backends.inductor.hooks",
            "remat.backends.inductor.fusion.allocation", "remat.backends.base", "remat.backends.eager.backend",
            "remat.core.solver", "remat.core.peak"} <= set(MODULES)
    hooks = dict(_imports("remat.backends.inductor.hooks", MODULES["remat.backends.inductor.hooks"]))
    assert "torch._inductor" in hooks  # the scan finds what it is meant to forbid elsewhere


def test_only_the_inductor_package_imports_torch_inductor():
    offenders = sorted(
        f"{name} imports {mod}"
        for name, tree in MODULES.items() if not name.startswith(INDUCTOR_PACKAGE)
        for mod, names in _imports(name, tree)
        if mod.startswith("torch._inductor") or (mod == "torch" and "_inductor" in names)
    )
    assert not offenders, "move these into remat/backends/inductor/: " + "; ".join(offenders)


def test_private_torch_apis_live_in_inductor_or_compat():
    offenders = []
    for name, tree in MODULES.items():
        if name.startswith(INDUCTOR_PACKAGE) or name == COMPAT:
            continue
        for mod, names in _imports(name, tree):
            if _private(mod) or (mod.split(".")[0] == "torch" and any(n.startswith("_") for n in names)):
                offenders.append(f"{name} imports {mod} {names}")
        for node in ast.walk(tree):
            dotted = _dotted(node) if isinstance(node, ast.Attribute) else None
            if dotted and _private(dotted) and not dotted.split(".")[-1].startswith("__"):
                offenders.append(f"{name} uses {dotted} (line {node.lineno})")
    assert not offenders, ("route these through remat/compat.py or remat/backends/inductor/: "
                           + "; ".join(sorted(set(offenders))))


PURE = tuple(sorted(n for n in MODULES
                    if any(n == p or n.startswith(p + ".") for p in (PURE_PACKAGE, *PURE_ELSEWHERE))))


@pytest.mark.parametrize("name", PURE)
def test_solver_core_is_torch_free(name):
    mods = [m for m, _ in _imports(name, MODULES[name])]
    assert not [m for m in mods if m.split(".")[0] in ("torch", "functorch")], mods


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for name, tree in MODULES.items():
        g.add_node(name)
        for mod, names in _imports(name, tree, type_checking=True):
            if not mod.startswith("remat"):
                continue
            targets = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in MODULES] or [mod]
            for t in targets:
                if t in MODULES and t != name:
                    g.add_edge(name, t)
    return g


def test_no_import_cycles():
    """Counting the imports under ``if TYPE_CHECKING:``: a module whose annotations name another's
    types depends on it as much as one that calls it."""
    g = _graph()
    # The package's __init__ files re-export their modules; an edge from a module to its own
    # package's __init__ would be the only way back, and none exists.
    cycles = [c for c in nx.simple_cycles(g)]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles[:5])


def test_the_cycle_check_can_fail():
    g = _graph()
    g.add_edge("remat.core.solver", "remat.planning.planner")  # planner imports solver: this closes a cycle
    assert list(nx.simple_cycles(g))


def test_the_cycle_check_counts_type_checking_imports():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..plan import Plan\n")
    assert _imports("remat.report.why", tree) == [("typing", ("TYPE_CHECKING",))]
    assert ("remat.plan", ("Plan",)) in _imports("remat.report.why", tree, type_checking=True)


BELOW_CAPTURE = [n for n in MODULES if n.split(".")[1:2] in (["planning"], ["analysis"], ["core"])] + [
    "remat.capture.partition"]


def test_planner_and_simulator_reach_inductor_only_through_the_backend_interface():
    """Planning, analysis, the core and the partition never import ``remat.backends.inductor``: the
    backend (``remat.backends.base.Backend``) is their only way to Inductor's knowledge."""
    for name in BELOW_CAPTURE:
        mods = [m for m, _ in _imports(name, MODULES[name])]
        assert not [m for m in mods if m.startswith(INDUCTOR_PACKAGE)], (name, mods)


def test_nothing_below_capture_resolves_a_backend_by_name():
    """Capture resolves the backends once (``RematBackend``) and hands them down."""
    offenders = [f"{name} imports {mod} {names}" for name in BELOW_CAPTURE
                 for mod, names in _imports(name, MODULES[name], type_checking=True)
                 if mod == "remat.backends.registry" or (mod == "remat.backends" and "registry" in names)]
    assert not offenders, "; ".join(offenders)


def test_reports_read_plan_data_not_plan():
    """``remat.plan`` imports ``remat.report`` (its methods delegate there); the renderers read
    ``remat.plan_data``, so the two never import each other."""
    offenders = [f"{name} imports {mod}" for name in MODULES if name.startswith("remat.report")
                 for mod, _ in _imports(name, MODULES[name], type_checking=True) if mod == "remat.plan"]
    assert not offenders, "; ".join(offenders)
