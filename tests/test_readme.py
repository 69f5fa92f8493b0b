"""README's two set-up commands exist and CI runs the test command."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)


def test_two_setup_commands_and_ci_runs_the_test_command():
    demo, tests = commands()[:2]
    assert "examples/quickstart.py" in demo
    assert "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.replace("pip install ", "pip install -q ") in ci


def test_numpy_is_a_dependency():
    """torch does not depend on numpy but prints "Failed to initialize NumPy" on import without
    it (the demo's first output line in a fresh environment): remat declares it."""
    deps = re.search(r"^dependencies = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert "numpy" in re.findall(r'"([A-Za-z0-9_.-]+)', deps)
