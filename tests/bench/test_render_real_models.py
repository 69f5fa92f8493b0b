"""benchmarks/README.md's real-model section: written from the newest full run and the anchors of
its torch version, ratios within one run, and a row that did not measure its strategy (error,
timeout, fallback to autograd's saved tensors) never shown, averaged or plotted as a measurement."""

import copy
import json
import pathlib
import re

from benchmarks import real_models
from benchmarks import render_real_models as rrm

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _ok(strategy, ms, peak, **extra):
    return {"strategy": strategy, "status": "ok", "ms": ms, "peak_mib": peak, "compile_s": 1.0, **extra}


def _run(date, rows=None, models=rrm.MODELS, torch="9.9.0+cpu"):
    """A real-models JSON: compile and remat on every model, ``rows`` added to each."""
    base = [_ok("eager", 20.0, 400.0), _ok("compile", 10.0, 300.0, grad_rel_err=1e-3),
            _ok("remat", 11.0, 150.0, grad_rel_err=1e-3, predicted_peak_mib=160.0, predicted_eager_peak_mib=410.0,
                fallback=[])]
    return {"device": "Test GPU", "torch": torch, "dtype": "torch.bfloat16", "date": date, "argv": ["--tag", date],
            "warmup": 1, "iters": 3, "libraries": [],
            "models": {m: {"info": {"batch": [2, 8]}, "rows": copy.deepcopy(base + list(rows or []))} for m in models}}


def _write(folder, name, doc):
    (folder / name).write_text(json.dumps(doc))


FAILED = [
    # a plan that fell back: its step ran, but not remat's plan (numbers no table may show)
    _ok("remat b0.5", 98765.4321, 87654.3210, fallback=["StrategyTimeout: per-strategy time limit reached"],
        replans=["budget re-plan (2 compiles): over the budget"], predicted_peak_mib=0.0),
    {"strategy": "remat b0.75", "status": "error",
     "error": "BackendCompilerFailed: backend='x' raised:\nStrategyTimeout: per-strategy time limit reached\n\n"
              "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace"},
    {"strategy": "remat b0.3", "status": "timeout", "error": "over 45 s", "wall_s": 76543.21},
    {"strategy": "remat @ckpt peak", "status": "infeasible",
     "error": "remat: no plan fits a peak of 2.55 GiB: the smallest predicted peak for this graph is 3.48 GiB"},
]


def test_table_order_is_real_models_strategies():
    assert rrm.STRATEGIES == real_models.STRATEGIES
    assert set(rrm.MODELS) == set(real_models.MODELS)


def test_readme_section_and_plots_are_what_the_json_gives():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    assert text.startswith("# Benchmarks\n\n## Real models")
    block = re.search(r"<!-- render: real-models -->\n(.*?)\n<!-- /render -->", text, re.S).group(1)
    assert block == rrm.section()
    for fig in rrm.figures():
        assert rrm.png_comment(fig.path) == fig.digest, f"{fig.path.name} is stale: run python benchmarks/render.py"
        assert fig.path.name in block


def test_rows_that_did_not_measure_their_strategy_show_their_status(tmp_path):
    _write(tmp_path, "real-models-h200-a.json", _run("2030-01-01 00:00 UTC", FAILED))
    text = rrm.section(tmp_path)
    for number in ("98765", "87654", "76543"):
        assert number not in text
    for strategy, word, why in (("remat b0.5", "fallback", "fell back to autograd's saved tensors: StrategyTimeout"),
                                ("remat b0.75", "error", "StrategyTimeout: per-strategy time limit reached"),
                                ("remat b0.3", "timeout", "over 45 s"),
                                ("remat @ckpt peak", "infeasible", "no plan fits a peak of 2.55 GiB")):
        rows = re.findall(rf"^\| gpt2 \| {re.escape(strategy)} \|(.*)$", text, re.M)
        assert len(rows) == 1
        cells = [c.strip() for c in rows[0].split("|")][:-1]
        assert cells[0] == f"**{word}**" and cells[-1].startswith(why), cells
        assert all(c == "" for c in cells[1:-2])  # no number in any measurement column
    items = rrm.entries(_run("2030-01-01 00:00 UTC", FAILED), None)
    drawn = rrm.points(items, "gpt2")
    assert [p[0] for p in drawn["remat"]] == ["remat"] and [p[0] for p in drawn["other"]] == ["eager", "compile"]


def test_a_fallback_default_plan_leaves_the_geomean(tmp_path):
    doc = _run("2030-01-01 00:00 UTC")
    doc["models"]["vit"]["rows"][2]["fallback"] = ["RuntimeError: boom"]
    items = rrm.entries(doc, None)
    assert set(rrm.ratios(items)) == {"gpt2", "llama", "resnet50"}
    assert "geomean over 3 models: time 1.100x, memory 0.500x" in rrm.geomean_line(items, doc)


def test_newest_full_run_is_chosen_and_anchor_rows_use_their_own_compile(tmp_path):
    _write(tmp_path, "real-models-h200-old.json", _run("2030-01-01 00:00 UTC"))
    _write(tmp_path, "real-models-h200-new.json", _run("2030-02-01 00:00 UTC"))
    # newer, but one model only: a rerun, not the table's run
    _write(tmp_path, "real-models-h200-partial.json", _run("2030-03-01 00:00 UTC", models=("llama",)))
    _write(tmp_path, "real-models-h200-profile.json", {"gpt2": {}})
    assert rrm.newest_run(tmp_path).name == "real-models-h200-new.json"
    anchors = _run("2029-12-01 00:00 UTC")
    for m in rrm.MODELS:  # the anchors run's compile is twice as slow as the run's
        anchors["models"][m]["rows"] = [_ok("compile", 20.0, 300.0), _ok("compile+ckpt", 30.0, 100.0)]
    _write(tmp_path, "anchors-h200-torch9.9.0.json", anchors)
    text = rrm.section(tmp_path)
    assert "`benchmarks/real-models-h200-new.json`" in text and "`benchmarks/anchors-h200-torch9.9.0.json`" in text
    row = re.search(r"^\| llama \| compile\+ckpt \| 30.00 \| 100 \| - \| - \| 1.500 \| 0.333 \|.*"
                    r"\| anchors \(2029-12-01 00:00 UTC\) \|", text, re.M)
    assert row, text
    assert re.search(r"^\| llama \| compile \| 10.00 \| 300 \| .*\| run \|", text, re.M)  # the run's own compile
    assert "Anchors run of 2029-12-01 00:00 UTC: `python benchmarks/real_models.py --tag '2029-12-01 00:00 UTC'`." \
        in text


def test_a_plot_is_stale_when_its_data_changes(tmp_path):
    _write(tmp_path, "real-models-h200-a.json", _run("2030-01-01 00:00 UTC"))
    fig = rrm.figures(tmp_path)[0]
    assert rrm.png_comment(fig.path) is None
    fig.write()
    assert rrm.png_comment(fig.path) == fig.digest
    _write(tmp_path, "real-models-h200-a.json", _run("2030-01-01 00:00 UTC", [_ok("remat b0.5", 12.0, 120.0)]))
    assert rrm.figures(tmp_path)[0].digest != fig.digest


def test_plans_with_offload_are_their_own_line_newest_of_each_strategy(tmp_path, monkeypatch):
    # issue 28: each model's plot shows its offload plans as their own line, from the listed runs
    # (OFFLOAD_RUNS), the newest measurement of each strategy; a failed row is not drawn.
    _write(tmp_path, "real-models-h200-a.json", _run("2030-01-01 00:00 UTC", [_ok("remat b0.5", 12.0, 120.0)]))
    off1 = _run("2030-02-01 00:00 UTC", [
        _ok("remat @0.8 ckpt +offload", 15.0, 90.0), _ok("remat offload all", 30.0, 70.0),
        {"strategy": "remat @0.8 ckpt +offload all", "status": "oom", "error": "CUDA out of memory"}])
    for m in rrm.MODELS:  # compile and the offload strategies only, on every model: not the table's run
        off1["models"][m]["rows"] = [r for r in off1["models"][m]["rows"] if r["strategy"] != "remat"]
    _write(tmp_path, "real-models-h200-off1.json", off1)
    _write(tmp_path, "real-models-h200-off2.json", _run("2030-03-01 00:00 UTC", [
        _ok("remat @0.8 ckpt +offload", 14.0, 88.0)], models=("gpt2",)))
    monkeypatch.setattr(rrm, "OFFLOAD_RUNS", ("real-models-h200-off2.json", "real-models-h200-off1.json"))
    assert rrm.newest_run(tmp_path).name == "real-models-h200-a.json"
    gpt2, vit = rrm.figures(tmp_path)[0], rrm.figures(tmp_path)[2]
    items = rrm.entries(rrm._load(tmp_path / "real-models-h200-a.json"), None)
    drawn = rrm.points(items, "gpt2", rrm.offload_rows("gpt2", rrm.offload_runs(tmp_path)))
    assert [p[0] for p in drawn["remat"]] == ["remat b0.5", "remat"]  # by peak; no offload plan on this line
    assert drawn["offload"] == [["remat offload all", 70.0, 30.0, "2030-02-01 00:00 UTC"],
                                ["remat @0.8 ckpt +offload", 88.0, 14.0, "2030-03-01 00:00 UTC"]]
    vit_rows = rrm.offload_rows("vit", rrm.offload_runs(tmp_path))
    assert [p[0] for p in rrm.points(items, "vit", vit_rows)["offload"]] == ["remat offload all",
                                                                           "remat @0.8 ckpt +offload"]
    gpt2.write()
    assert rrm.png_comment(gpt2.path) == gpt2.digest
    monkeypatch.setattr(rrm, "OFFLOAD_RUNS", ("real-models-h200-off1.json",))
    assert rrm.figures(tmp_path)[0].digest != gpt2.digest and rrm.figures(tmp_path)[2].digest == vit.digest
