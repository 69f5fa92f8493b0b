"""``python -m remat explain FILE.py:FACTORY`` in a subprocess, with REMAT_LOG."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = "tests/report_model.py"


def run(*args, **env):
    full = {k: v for k, v in os.environ.items() if k != "REMAT_LOG"}
    full.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "remat", "explain", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=300)


def test_text_report_and_info_log():
    out = run(f"{MODEL}:factory", "--why", "addmm", REMAT_LOG="info")
    assert out.returncode == 0, out.stderr
    golden = (ROOT / "tests" / "golden" / "report_model_plan.txt").read_text()
    assert out.stdout.startswith(golden)
    assert "is saved: rule `matmul`" in out.stdout
    saved_rows = golden.split("\n(+")[0].count("\n") - 2  # table rows: lines after the header and rule
    assert f"[remat INFO] remat plan summary: {saved_rows} saved tensors in 1 graph" in out.stderr


def test_json_html_and_dot_with_kwargs_factory(tmp_path):
    html, dot = tmp_path / "plan.html", tmp_path / "plan.dot"
    out = run(f"{MODEL}:factory_kwargs", "--json", "--html", str(html), "--dot", str(dot))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["version"] == 1 and doc["saved"] and doc["totals"]["saved_bytes"] > 0
    assert "must_save" not in out.stdout  # factory_kwargs has no policy
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert dot.read_text().startswith("digraph remat_plan {")
    assert f"remat: wrote {html}" in out.stderr


def test_errors_exit_2_with_a_remat_message():
    out = run(f"{MODEL}:nope")
    assert out.returncode == 2
    assert out.stderr.startswith("remat: expected a function named 'nope' in tests/report_model.py")
    assert "factory" in out.stderr
    out = run("no_such_file.py:factory")
    assert out.returncode == 2 and out.stderr.startswith("remat: expected an existing Python file")
