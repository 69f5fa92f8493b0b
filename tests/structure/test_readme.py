"""README.md and benchmarks/README.md say what the code does: the set-up commands CI runs, the
demo's output, the options' signature, benchmark tables written from their JSON, no measured
number outside a generated table, and files they name exist."""

import inspect
import pathlib
import re
import subprocess
import sys

import torch

import remat

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BENCH_README = ROOT / "benchmarks" / "README.md"


def commands():
    text = README.read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)


def test_two_setup_commands_and_ci_runs_the_test_command():
    demo, tests = commands()[:2]
    assert "examples/quickstart.py" in demo
    assert "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.replace("pip install ", "pip install -q ") in ci
    # the newest-torch check runs the same command, with the newest torch instead of the pin
    newest = (ROOT / ".ci" / "newest-torch").read_text()
    assert "pip install -q --upgrade torch\n" in newest
    assert tests.split(" && ", 1)[1].replace("pip install ", "pip install -q ") in newest


def test_numpy_is_a_dependency():
    """torch does not depend on numpy but prints "Failed to initialize NumPy" on import without
    it (the demo's first output line in a fresh environment): remat declares it."""
    deps = re.search(r"^dependencies = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert "numpy" in re.findall(r'"([A-Za-z0-9_.-]+)', deps)


def _normalise(text):
    """The lines as printed: the demo prints whether its gradients are within float32 rounding
    of eager's, not the differences themselves, which vary by machine and backend."""
    return text


def test_demo_output_in_readme_is_what_the_demo_prints(capsys):
    """The demo's default backend is Inductor; the uncompiled one prints the same lines (the plan
    comes from ``remat.explain`` with default options either way; losses agree to the digits
    shown; the gradients are reported as within float32 rounding of eager's, the same text on every
    machine). It runs here uncompiled to keep the suite fast."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import quickstart
    finally:
        sys.path.pop(0)
    quickstart.main(["--backend", "eager"])
    printed = capsys.readouterr().out.rstrip("\n")
    text = README.read_text()
    block = re.search(r"The demo \(`python examples/quickstart.py`.*?\n```\n(.*?)\n```", text, re.S).group(1)
    installed = re.search(r"pip install torch==(\d+\.\d+)\.", text).group(1)
    if torch.__version__.startswith(installed + "."):
        assert _normalise(block) == _normalise(printed)
        return
    # Another torch's Inductor may plan the demo otherwise (its reuse estimate, Note [Reuse
    # estimate]): the README shows the torch its commands install; here the training lines hold.
    steps = [line for line in printed.splitlines() if line.startswith("step ")]
    assert printed.startswith("remat plan: ") and len(steps) == 3, printed
    assert all(re.search(r"gradients equal eager autograd's within 1e-06$", line) for line in steps), steps


def test_signature_line_names_every_option():
    text = README.read_text()
    line = re.search(r"Options of `remat.checkpoint\((.*?)\)`", text, re.S).group(1)
    documented = re.findall(r"(\w+)=", line)
    params = inspect.signature(remat.checkpoint).parameters
    options = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]
    assert documented == options
    for name in options:
        assert re.search(rf"^\| `{name}` \|", text, re.M), f"no row for option {name}"
    explain = inspect.signature(remat.explain).parameters
    assert [n for n, p in explain.items() if p.kind is p.KEYWORD_ONLY] == re.findall(
        r"(\w+)=None", re.search(r"`remat.explain\((.*?)\)`", text, re.S).group(1))


def test_benchmark_tables_are_written_from_their_json():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _prose(text):
    """``text`` without code blocks, inline code, generated tables and HTML comments."""
    text = re.sub(r"<!-- render: [\w-]+ -->.*?<!-- /render -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"`[^`]*`", "", text)


def test_readme_quotes_no_measured_number_outside_generated_tables():
    """One home per number: measurements live in benchmarks/*.json and reach README.md only
    through render.py's tables (the issue found the two READMEs disagreeing on five)."""
    found = re.findall(r"[-+]?\d+(?:\.\d+)?\s?(?:%|ms\b|MiB|GiB|KiB)", _prose(README.read_text()))
    assert found == []


def test_readme_has_limitations_and_budget_advice():
    text = README.read_text()
    assert "## Limitations" in text
    advice = re.search(r"\*\*Choosing a budget\.\*\*(.*?)\n\n", text, re.S).group(1)
    for must in ("whole\ntraining step", "gradients", "remat.explain(model, x, budget=0.5)", "InfeasibleBudgetError",
                 "remat.pareto"):
        assert must.replace("\n", " ") in advice.replace("\n", " "), must


def test_files_named_in_the_readmes_exist():
    for readme in (README, BENCH_README):
        text = re.sub(r"<!--.*?-->", "", readme.read_text(), flags=re.S)
        for name in set(re.findall(r"`((?:benchmarks|examples|remat|tests|zoo|\.ci)/[\w./-]+)", text)):
            path = ROOT / name.split("::")[0].split(":")[0]
            assert path.exists(), f"{readme.name} names {name}, which is not in the repository"
        for name in set(re.findall(r"`([\w-]+\.(?:json|png|py))`", text)):
            candidates = [ROOT / "benchmarks" / name, ROOT / "remat" / name, ROOT / "examples" / name,
                          ROOT / "tests" / name, ROOT / "zoo" / name,
                          *(ROOT / "benchmarks" / "results").glob(f"*/{name}")]
            outputs = ("results.json", "results.png", "frontier.png")  # what a shown command writes
            assert any(p.exists() for p in candidates) or name in outputs, (readme.name, name)


def test_benchmarks_readme_describes_results_not_sessions():
    text = BENCH_README.read_text()
    assert not re.search(r"\b[Ss]ession \d|device time|this session", text)


def test_test_extra_installs_every_package_the_tests_import():
    """README's test command installs ``.[test]``: no test may skip for a Python package that
    extra could install (jsonschema used to be missing, so two schema tests always skipped),
    and the suite runs on two processes (pytest-xdist, ``addopts``)."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r"^test = \[(.*?)\]", pyproject, re.M | re.S).group(1)
    names = {re.split(r"[<>=\[]", n)[0].lower() for n in re.findall(r'"([^"]+)"', extra)}
    assert {"jsonschema", "pytest-xdist", "scipy", "matplotlib", "transformers", "hypothesis"} <= names
    skipped = re.findall(r"importorskip\(\s*[\"']([\w.]+)", "".join(p.read_text() for p in (ROOT / "tests").glob("*.py")
                                                                     if p.name != "test_readme.py"))
    assert skipped == []
    assert re.search(r'^addopts = "-n 2 --dist loadgroup"', pyproject, re.M)
