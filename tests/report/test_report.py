"""Reports of a plan: the golden table and summary, totals, JSON schema, DOT, HTML."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import zlib

import pytest
import torch

import remat
from remat import report
from remat.plan import Plan, PlanNode, SavedTensor
from zoo import workloads
from zoo.report_model import factory

GOLDEN = pathlib.Path(__file__).parents[1] / "golden" / "report_model_plan.txt"


def golden_text(plan):
    return f"{plan}\n\n{plan.summary()}\n"


def test_golden_table_and_summary(report_plan):
    """Exact rows for a fixed model. Regenerate with REMAT_UPDATE_GOLDEN=1 after an intended change."""
    text = golden_text(report_plan)
    if os.environ.get("REMAT_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_table_is_stable_across_runs(report_plan):
    torch._dynamo.reset()
    model, args = factory()
    assert golden_text(remat.explain(model, *args)) == golden_text(report_plan)


def test_table_rows_carry_module_reason_and_source(report_plan):
    lines = str(report_plan).splitlines()
    assert lines[1].split() == ["name", "module", "op", "shape", "dtype", "bytes", "reason", "source"]
    rows = {line.split()[0]: line for line in lines[3:] if line.split() and line.split()[0] in
            {s.name for s in report_plan.saved}}
    assert "layers.0.fc1" in rows["addmm"] and "matmul" in rows["addmm"]
    assert "random op" in rows["rand_1"] and "report_model.py:26" in rows["rand_1"]
    assert "user rule `must_save(layers.*.act)`" in rows["tanh"]
    assert "min-cut boundary" in rows["mul"]


def test_totals(report_plan):
    t = report_plan.totals()
    assert t.saved_bytes == report_plan.saved_bytes
    assert t.eager_saved_bytes == report_plan.eager_saved_bytes
    assert t.recomputed_ops == len(report_plan.recomputed)
    assert t.saved_bytes <= t.activation_bytes
    assert t.eager_saved_bytes <= t.activation_bytes
    expected = sum(n.nbytes for n in report_plan.nodes if n.status == "saved"
                   or (n.status in ("recomputed", "forward") and n.reason != "view"))
    assert t.activation_bytes == expected
    assert t.line() in str(report_plan) and t.line() in report_plan.summary()


def _node(name, module, status="saved", nbytes=64, reason=""):
    return PlanNode(name, "aten.mul.Tensor", (4, 4), "float32", nbytes, module, status=status, reason=reason)


def test_summary_collapses_identical_blocks():
    nodes, saved, rec = [], [], []
    for k in range(12):
        for sub, nbytes in (("attn", 64), ("mlp.fc1", 128)):
            nodes.append(_node(f"s{k}_{sub}", f"layers.{k}.{sub}", nbytes=nbytes))
            saved.append(SavedTensor(f"s{k}_{sub}", "aten.mul.Tensor", (4, 4), "float32", nbytes,
                                     f"layers.{k}.{sub}", reason="min-cut boundary"))
        nodes.append(_node(f"r{k}", f"layers.{k}", status="recomputed"))
        rec.append(f"r{k}")
    nodes.append(_node("out", "head", nbytes=8))
    saved.append(SavedTensor("out", "aten.mul.Tensor", (2,), "float32", 8, "head", reason="matmul"))
    plan = Plan(tuple(saved), tuple(rec), ("aten.mul.Tensor",) * 12, nodes=tuple(nodes))
    rows = report.module_rows(plan)
    assert [(r.module, r.blocks, r.saved, r.saved_bytes, r.recomputed) for r in rows] == [
        ("layers.0..11 (x12)", 12, 24, 12 * 192, 12),
        ("  .attn", 12, 12, 12 * 64, 0),
        ("  .mlp.fc1", 12, 12, 12 * 128, 0),
        ("  (block itself)", 12, 0, 0, 12),
        ("head", 1, 1, 8, 0),
    ]
    text = plan.summary()
    assert "layers.0..11 (x12)" in text
    assert text.splitlines()[-2].split()[:4] == ["total", "25", "2.26", "KiB"]


def test_summary_splits_runs_at_a_different_block(report_plan):
    modules = [r.module for r in report.module_rows(report_plan) if not r.depth]
    assert modules == ["layers.0..1 (x2)", "layers.2", "head"]  # block 2 also saves its output


# --- JSON ---------------------------------------------------------------------------------------

def test_json_schema(report_plan):
    doc = json.loads(report_plan.to_json())
    assert doc["version"] == report.VERSION == 1
    assert {"version", "saved", "recomputed", "totals"} <= set(doc)
    for item in doc["saved"]:
        assert set(item) == {"name", "op", "module", "shape", "dtype", "bytes", "reason", "source"}
    assert [s["name"] for s in doc["saved"]] == [s.name for s in report_plan.saved]
    assert [r["name"] for r in doc["recomputed"]] == list(report_plan.recomputed)
    assert doc["totals"]["saved_bytes"] == report_plan.saved_bytes
    assert len(doc["nodes"]) == len(report_plan.nodes)
    assert "nodes" not in json.loads(report_plan.to_json(nodes=False))
    import jsonschema
    jsonschema.validate(doc, report.SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**doc, "version": 2}, report.SCHEMA)


def test_json_written_to_path(report_plan, tmp_path):
    text = report_plan.to_json(str(tmp_path / "plan.json"))
    assert json.loads((tmp_path / "plan.json").read_text()) == json.loads(text)


# --- DOT ----------------------------------------------------------------------------------------

def test_dot_structure(report_plan):
    dot = report_plan.to_dot()
    assert dot.startswith("digraph remat_plan {") and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    assert "subgraph cluster_forward" in dot and "subgraph cluster_backward" in dot
    declared = {line.split(" [", 1)[0].strip().strip('"') for line in dot.splitlines() if " [label=" in line}
    for line in dot.splitlines():
        if " -> " in line:
            a, b = line.strip().rstrip(";").split(" [")[0].split(" -> ")
            assert a.strip('"') in declared and b.strip('"') in declared
    assert 'penwidth=2]' in dot  # the cut's edges
    assert "SAVED: matmul" in dot and "RECOMPUTED" in dot


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_dot_parses_with_graphviz(report_plan, tmp_path):
    run = subprocess.run(["dot", "-Tsvg"], input=report_plan.to_dot(), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "<svg" in run.stdout
    report_plan.to_dot(str(tmp_path / "plan.svg"))
    assert "<svg" in (tmp_path / "plan.svg").read_text()


# --- HTML ---------------------------------------------------------------------------------------

def tiny_png() -> bytes:
    def chunk(kind, data):
        return (len(data).to_bytes(4, "big") + kind + data
                + zlib.crc32(kind + data).to_bytes(4, "big"))
    header = (1).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
            + chunk(b"IEND", b""))


class FakeFrontier:
    def plot(self, path):
        pathlib.Path(path).write_bytes(tiny_png())


def test_html_is_self_contained(report_plan, tmp_path):
    path = report_plan.to_html(str(tmp_path / "plan.html"), frontier=FakeFrontier())
    html = pathlib.Path(path).read_text()
    assert html.startswith("<!DOCTYPE html>")
    for s in report_plan.saved:
        if s.op != "parameter":
            assert f"<td>{s.name}</td>" in html
    assert 'class="remat-graph"' in html and "<title>addmm | aten.addmm.default" in html
    assert "data:image/png;base64," in html
    without_ns = html.replace("http://www.w3.org/2000/svg", "").replace("http://www.w3.org/1999/xlink", "")
    assert "http://" not in without_ns and "https://" not in without_ns
    assert "<script" not in html and "<link" not in html


def test_svg_layout_puts_backward_below_forward(report_plan):
    pos = report.svg.layout(report_plan)
    status = {n.name: n.status for n in report_plan.nodes}
    fwd = [y for n, (_, y) in pos.items() if status[n] in ("saved", "recomputed", "forward", "input")]
    bwd = [y for n, (_, y) in pos.items() if status[n] in ("backward", "backward-only", "tangent")]
    assert max(fwd) < min(bwd)
    assert pos["addmm"][0] < pos["addmm_2"][0] < pos["addmm_4"][0]  # forward runs left to right
    assert report.svg.layout(report_plan) == pos


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.chromium
@pytest.mark.skipif(chromium() is None, reason="Debian's chromium is not installed")
def test_html_report_renders_in_headless_chromium(report_plan, tmp_path):
    html = tmp_path / "plan.html"
    report_plan.to_html(str(html))
    shot = tmp_path / "plan.png"
    common = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--window-size=1400,2400"]
    run = subprocess.run(common + [f"--screenshot={shot}", html.as_uri()], capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000
    dom = subprocess.run(common + ["--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=180)
    assert "<table" in dom.stdout and 'class="remat-graph"' in dom.stdout
    keep = os.environ.get("REMAT_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_combined_plan_keeps_nodes_for_reports(report_plan):
    both = Plan.combine([report_plan, report_plan])
    assert len(both.nodes) == 2 * len(report_plan.nodes)
    assert "is saved: rule `matmul`" in both.explain("g1.addmm")
    assert "recomputed in the backward from `g0.addmm`" in both.explain("g0.gelu")
    assert both.totals().activation_bytes == 2 * report_plan.totals().activation_bytes
    assert "layers.0..1 (x2)" in both.summary()
    import jsonschema
    jsonschema.validate(json.loads(both.to_json()), report.SCHEMA)


def test_table_header_and_summary_count_the_same_saved_tensors(report_plan):
    """Both count saved activations; parameters and buffers (saved at no cost) are listed apart."""
    import re

    table_count = int(re.match(r"remat plan: (\d+) saved tensors", str(report_plan)).group(1))
    summary_count = int(re.match(r"remat plan summary: (\d+) saved tensors", report_plan.summary()).group(1))
    activations = sum(s.op != "parameter" for s in report_plan.saved)
    assert table_count == summary_count == activations


def test_saved_labels_never_overlap():
    # issue 29 item 11: labels of saved values in neighbouring columns printed over each other.
    # A label crossing one drawn is left out (the tooltip keeps the name); apart, both are drawn.
    space = report.svg.LabelSpace()
    assert space.take(100, 100, "addmm_12")
    assert not space.take(100 + report.svg.DX, 100 - report.svg.DY, "addmm_13")  # the next column, a row up
    assert space.take(100 + 3 * report.svg.DX, 100 + 3 * report.svg.DY, "mul_7")
    assert space.take(100 - 4 * report.svg.DX, 100, "addmm_3")  # one column holds no more than its own
    # On a real plan's drawing every pair of drawn labels is apart, and each saved value is drawn
    # with a label or a tooltip.
    torch._dynamo.reset()
    model, x = workloads.build("gpt", "small")
    plan = remat.explain(model, x)
    svg = report.svg.draw_svg(plan)
    drawn = [(float(a), float(b), name) for a, b, name in
             re.findall(r'<text x="([\d.-]+)" y="([\d.-]+)" font-size="9"[^>]*>([^<]+)</text>', svg)]
    check = report.svg.LabelSpace()
    assert drawn and all(check.take(x_, y_, name) for x_, y_, name in drawn)
    saved = [s.name for s in plan.saved if s.op not in ("input", "parameter")]
    assert all(f"<title>{name} |" in svg for name in saved)
