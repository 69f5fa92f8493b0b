"""The real-model section of benchmarks/README.md: one table, the geomean of remat's default plan
against torch.compile, and one frontier plot per model, from the JSON files of ``real_models.py``.

Which files. The run is the newest (by its ``date`` field, then by name) ``real-models-h200*.json``
in ``RESULTS`` that measured torch.compile and remat's default plan on all of ``MODELS``; a
partial rerun (one model, a few strategies) never replaces it. The anchors are
``anchors-h200-torch<version>.json`` for the run's torch version: strategies the run lacks
(eager + checkpoint, compile with a budget, compile + checkpoint) come from there, marked with
the anchors run's date.

Each "x compile" ratio divides by torch.compile of the same run as the row (the run's own for
its rows, the anchors run's for an anchor row), never across runs. A row is a measurement only
if it finished with every graph planned (``measured``); an error, timeout, skip, infeasible
budget, out-of-memory or a plan that fell back to autograd's saved tensors shows its status and
reason instead, and is left out of the geomean and the plots.

Plots. Each PNG carries, in its ``Comment`` text chunk, a digest of the points it draws and of
the code that chooses and draws them (``digest``): ``render.py --check`` compares that digest,
not the pixels, so a plot is stale exactly when its data or its drawing code changed, whatever
the matplotlib version, and ``render.py`` rewrites only stale plots. Importing this module needs
no matplotlib and no torch; only drawing does.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import pathlib
import shlex
import struct
from collections.abc import Callable
from dataclasses import dataclass

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results" / "h200-torch2.11.0"
"""The runs the GPU sections are written from: ``results/<gpu>-torch<version>/``, newest runs only."""
RUN_GLOB = "real-models-h200*.json"
ANCHORS = "anchors-h200-torch{version}.json"
FIGURE = "real-models-frontier-{model}.png"
MODELS = ("gpt2", "llama", "vit", "resnet50")
STRATEGIES = ("eager", "eager+ckpt", "compile", "compile b0.5", "compile+ckpt", "remat", "remat untuned", "remat b0.75",
              "remat b0.5", "remat b0.3", "remat @ckpt peak", "remat @0.8 ckpt", "remat uncompiled",
              "remat offload auto", "remat offload all")
"""The table's order: ``real_models.STRATEGIES`` (a test keeps the two equal)."""
OWN_RUN = ("remat uncompiled", "remat offload auto", "remat offload all")
"""Strategies measured in a run of their own (offload: ``offload-h200.md``), not listed as missing here."""
OFFLOAD_RUNS: tuple[str, ...] = ()
"""Runs in ``RESULTS`` (file names) whose plans with offload the plots draw as their own line
(``offload_rows``), beside the run the table comes from."""
NAMES = {"gpt2": "HF GPT-2 124M", "llama": "HF Llama (1024 wide, 12 layers)", "vit": "timm ViT-B/16",
         "resnet50": "torchvision ResNet-50"}


@dataclass(frozen=True)
class Entry:
    """One row of the table: a strategy on a model, from the run or from the anchors file."""

    model: str
    row: dict
    compile: dict | None
    """torch.compile of the same run, the denominator of the row's ratios (None: not measured)."""
    date: str
    anchors: bool


def measured(row: dict | None) -> bool:
    """The row is a measurement of its strategy: it finished, with every graph planned."""
    return bool(row) and row.get("status") == "ok" and not row.get("fallback") and row.get("ms") is not None


def status(row: dict) -> str:
    return "fallback" if row.get("status") == "ok" and row.get("fallback") else row.get("status", "?")


def reason(row: dict) -> str:
    """The innermost ``Name: message`` line of the row's error (or fallback), short, table-safe."""
    if status(row) == "fallback":
        text = "fell back to autograd's saved tensors: " + "; ".join(row["fallback"] + row.get("replans", []))
    else:
        lines = [ln for ln in (row.get("error") or "").splitlines() if ln.strip()]
        named = [ln for ln in lines if ln.split(":", 1)[0].isidentifier() and ": " in ln]
        text = (named or lines or [""])[-1]
        text = text.removeprefix("remat: ").split(": the smallest")[0]
    text = text.replace("|", "/")
    return text if len(text) <= 200 else text[:197] + "..."


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def _full(doc: dict) -> bool:
    """Whether ``doc`` measured torch.compile and remat's default plan on every model: the table's
    run (a run of other strategies beside compile, offload's say, never replaces it)."""
    models = doc.get("models", {})
    return all(any(measured(r) for r in models.get(m, {}).get("rows", []) if r["strategy"] == strategy)
               for m in MODELS for strategy in ("compile", "remat"))


def shown(path: pathlib.Path) -> str:
    """``path`` as benchmarks/README.md names it: relative to ``benchmarks/`` (its name alone outside it)."""
    try:
        return path.resolve().relative_to(HERE).as_posix()
    except ValueError:
        return path.name


def newest_run(folder: pathlib.Path = RESULTS) -> pathlib.Path:
    """The newest ``RUN_GLOB`` file that measured torch.compile and remat on every model."""
    runs = [p for p in sorted(folder.glob(RUN_GLOB)) if _full(_load(p))]
    if not runs:
        raise SystemExit(f"render: no {RUN_GLOB} in {folder} measured torch.compile and remat on all of "
                         f"{', '.join(MODELS)}")
    return max(runs, key=lambda p: (_load(p)["date"], p.name))


def anchors_path(run: dict, folder: pathlib.Path = RESULTS) -> pathlib.Path:
    return folder / ANCHORS.format(version=run["torch"].split("+")[0])


def _pick(rows: list[dict], strategy: str) -> dict | None:
    """The strategy's row: its last measurement, else its last row (a merged file may hold several)."""
    mine = [r for r in rows if r["strategy"] == strategy]
    return next((r for r in reversed(mine) if measured(r)), mine[-1] if mine else None)


def _entry(model: str, doc: dict, row: dict, anchors: bool) -> Entry:
    run = row.get("run", 0)
    rows = doc["models"][model]["rows"]
    comp = next((r for r in rows if r["strategy"] == "compile" and r.get("run", 0) == run and measured(r)), None)
    runs = doc.get("runs") or [doc]
    return Entry(model, row, comp, runs[run]["date"] if run < len(runs) else doc["date"], anchors)


def entries(run: dict, anchors: dict | None) -> list[Entry]:
    """The table's rows in ``MODELS`` x ``STRATEGIES`` order: the run's row, else the anchors'."""
    out = []
    for model in MODELS:
        for strategy in STRATEGIES:
            row = _pick(run["models"].get(model, {}).get("rows", []), strategy)
            if row is not None:
                out.append(_entry(model, run, row, anchors=False))
                continue
            row = _pick(anchors["models"].get(model, {}).get("rows", []), strategy) if anchors else None
            if row is not None:
                out.append(_entry(model, anchors, row, anchors=True))
    return out


def _num(x: float | None, spec: str) -> str:
    return "-" if not x else format(x, spec)


def _ratio(e: Entry, key: str) -> str:
    if not (measured(e.compile) and e.row.get(key) and e.compile.get(key)):
        return "-"
    return f"{e.row[key] / e.compile[key]:.3f}"


def _grad(row: dict) -> str:
    """Relative L2 error of the gradients against eager's; eager is the reference."""
    if row["strategy"] == "eager":
        floor = row.get("grad_noise_floor")
        return "reference" if floor is None else f"reference (dropout noise floor {floor:.1e})"
    return "-" if row.get("grad_rel_err") is None else f"{row['grad_rel_err']:.1e}"


def table(items: list[Entry]) -> list[str]:
    cols = ["model", "strategy", "step ms", "measured peak MiB", "predicted peak MiB", "predicted eager peak MiB",
            "time x compile", "memory x compile", "compile s", "grad rel err", "from", "note"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for e in items:
        r = e.row
        src = f"anchors ({e.date})" if e.anchors else "run"
        if not measured(r):
            lines.append(f"| {e.model} | {r['strategy']} | **{status(r)}** |" + " |" * 7 + f" {src} | {reason(r)} |")
            continue
        cells = [e.model, r["strategy"], f"{r['ms']:.2f}", _num(r.get("peak_mib"), ".0f"),
                 _num(r.get("predicted_peak_mib"), ".0f"), _num(r.get("predicted_eager_peak_mib"), ".0f"),
                 _ratio(e, "ms"), _ratio(e, "peak_mib"), f"{r['compile_s']:.1f}", _grad(r), src,
                 "; ".join(x for x in (f"{r['graphs']} graphs (Dynamo graph break)" if r.get("graphs", 1) > 1
                                       else "", r.get("timing", "")) if x)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def ratios(items: list[Entry]) -> dict[str, tuple[float, float]]:
    """remat's default plan over torch.compile of its run, (time, memory) per model."""
    out = {}
    for e in items:
        r, c = e.row, e.compile
        if r["strategy"] == "remat" and not e.anchors and measured(r) and measured(c) and r.get("peak_mib"):
            out[e.model] = (r["ms"] / c["ms"], r["peak_mib"] / c["peak_mib"])
    return out


def geomean_line(items: list[Entry], run: dict) -> str:
    per = ratios(items)
    if not per:
        return "remat's default plan was measured beside torch.compile on no model of this run."
    t, m = geomean([v[0] for v in per.values()]), geomean([v[1] for v in per.values()])
    each = "; ".join(f"{k} {v[0]:.3f}x / {v[1]:.3f}x" for k, v in per.items())
    return (f"**remat default against torch.compile, geomean over {len(per)} models: time {t:.3f}x, memory "
            f"{m:.3f}x** ({each}; {run['device']}, torch {run['torch']}, {run['date']}).")


def _command(argv: list[str]) -> str:
    return "python benchmarks/real_models.py " + shlex.join(argv)


def _missing(items: list[Entry]) -> str:
    have = {(e.model, e.row["strategy"]) for e in items}
    parts = []
    for s in STRATEGIES:
        absent = [m for m in MODELS if (m, s) not in have and s not in OWN_RUN]
        if absent:
            parts.append(f"{s} ({'all models' if len(absent) == len(MODELS) else ', '.join(absent)})")
    return f"Not measured in either file: {'; '.join(parts)}." if parts else ""


def headline(folder: pathlib.Path = RESULTS) -> str:
    """The top-level README's quote of the newest run: its geomean line and its file; the commands,
    notes and rows are in benchmarks/README.md's section only (one home for each)."""
    path = newest_run(folder)
    run = _load(path)
    apath = anchors_path(run, folder)
    items = entries(run, _load(apath) if apath.exists() else None)
    return (geomean_line(items, run) + f" From `benchmarks/{shown(path)}`; its commands, notes and every row: "
            "the first section of `benchmarks/README.md`.")


def section(folder: pathlib.Path = RESULTS) -> str:
    """The generated Markdown: caption, table, geomean, commands, plots."""
    path = newest_run(folder)
    run = _load(path)
    apath = anchors_path(run, folder)
    anchors = _load(apath) if apath.exists() else None
    items = entries(run, anchors)
    dtype = str(run["dtype"]).removeprefix("torch.")
    about = [run["device"], f"torch {run['torch']}", dtype, *run.get("libraries", [])]
    lines = [f"{', '.join(about)}; "
             f"run of {run['date']}: `benchmarks/{shown(path)}`, "
             + (f"anchors: `benchmarks/{shown(apath)}`." if anchors else f"no anchors file ({apath.name})."), ""]
    lines += table(items) + ["", geomean_line(items, run), ""]
    for r in run.get("runs") or [run]:  # a merged file (``real_models.py --report``) lists its runs
        lines.append(f"Run of {r['date']}: `{_command(r['argv'])}` ({run['warmup']} warm-up, {run['iters']} "
                     "timed steps).")
    for note in run.get("notes") or []:
        lines += ["", note]
    for k, a in enumerate((anchors.get("runs") or [anchors]) if anchors else []):
        if any(e.anchors and e.row.get("run", 0) == k for e in items):
            lines.append(f"Anchors run of {a['date']}: `{_command(a['argv'])}`.")
    missing = _missing(items)
    lines += [missing] if missing else []
    lines += ["", " ".join(f'<img src="{shown(folder / FIGURE.format(model=m))}" width="49%" alt="{m} frontier">'
                           for m in MODELS)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Frontier plots


def offloads(strategy: str) -> bool:
    """Whether a strategy's plans may offload (``real_models``: "remat offload auto", a "+offload" suffix)."""
    return strategy.startswith("remat") and "offload" in strategy


def offload_runs(folder: pathlib.Path = RESULTS) -> list[tuple[str, dict]]:
    """The runs of ``OFFLOAD_RUNS`` in ``folder``, each (file name, its JSON), read once for every plot."""
    return [(name, _load(folder / name)) for name in OFFLOAD_RUNS]


def offload_rows(model: str, runs: list[tuple[str, dict]]) -> list[list]:
    """``model``'s measured offload strategies in ``runs`` (``offload_runs``), the newest of each
    strategy (by its run's date, then the file's name): [strategy, peak MiB, step ms, date]."""
    newest: dict[str, tuple[tuple[str, str], list]] = {}
    for name, doc in runs:
        for r in doc.get("models", {}).get(model, {}).get("rows", []):
            if offloads(r["strategy"]) and measured(r) and r.get("peak_mib"):
                key = (doc["date"], name)
                if r["strategy"] not in newest or key > newest[r["strategy"]][0]:
                    newest[r["strategy"]] = (key, [r["strategy"], round(r["peak_mib"], 1), round(r["ms"], 3),
                                                   doc["date"]])
    return [pt for _, pt in newest.values()]


def points(items: list[Entry], model: str, offloaded: list[list] = ()) -> dict:
    """What the model's plot draws: remat's measured points by peak (plans with offload apart,
    with ``offloaded``, from other runs: ``offload_rows``), and the other strategies'."""
    mine = [e for e in items if e.model == model and measured(e.row) and e.row.get("peak_mib")]
    pt = lambda e: [e.row["strategy"], round(e.row["peak_mib"], 1), round(e.row["ms"], 3), e.anchors]
    by_peak = lambda p: (p[1], p[2])
    remat = sorted((pt(e) for e in mine if e.row["strategy"].startswith("remat") and not offloads(e.row["strategy"])),
                   key=by_peak)
    here = [[*pt(e)[:3], e.date] for e in mine if offloads(e.row["strategy"])]
    off = sorted(here + [p for p in offloaded if p[0] not in {q[0] for q in here}], key=by_peak)
    return {"model": model, "remat": remat, "offload": off,
            "other": [pt(e) for e in mine if not e.row["strategy"].startswith("remat")]}


def plot_digest(data: dict, *code: Callable) -> str:
    """What a plot is drawn from: the code that chooses and draws its points, and the points."""
    h = hashlib.sha256("".join(inspect.getsource(f) for f in code).encode())
    h.update(json.dumps(data, sort_keys=True).encode())
    return "remat-render " + h.hexdigest()[:32]


def digest(data: dict) -> str:
    return plot_digest(data, points, offload_rows, draw)


def draw(data: dict, title: str, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    if data["remat"]:
        xs, ys = [p[1] for p in data["remat"]], [p[2] for p in data["remat"]]
        ax.plot(xs, ys, "-o", color="C3", label="remat (default and budgets, measured)")
        for name, x, y, _ in data["remat"]:
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(-5, 5), ha="right", fontsize=8, color="C3")
    if data.get("offload"):
        xs, ys = [p[1] for p in data["offload"]], [p[2] for p in data["offload"]]
        dates = sorted({p[3] for p in data["offload"]})
        ax.plot(xs, ys, "--s", color="C2", label=f"remat with offload (measured {', '.join(dates)})")
        for name, x, y, _ in data["offload"]:
            ax.annotate(name.removeprefix("remat "), (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8,
                        color="C2")
    for flag, style, label in ((False, {"color": "C0"}, "other strategies, same run"),
                               (True, {"facecolors": "none", "edgecolors": "C0"}, "anchors run")):
        pts = [p for p in data["other"] if p[3] == flag]
        if pts:
            ax.scatter([p[1] for p in pts], [p[2] for p in pts], label=label, **style)
        for name, x, y, _ in pts:
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set_xlabel("measured peak of a step (MiB)")
    ax.set_ylabel("median step time (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    ax.margins(x=0.15, y=0.1)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None, "Comment": digest(data)})
    plt.close(fig)


def png_comment(path: pathlib.Path) -> str | None:
    """The ``Comment`` text chunk of a PNG file (None if the file or the chunk is missing)."""
    if not path.exists():
        return None
    data, pos = path.read_bytes(), 8
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        if kind == b"tEXt" and body.startswith(b"Comment\0"):
            return body.split(b"\0", 1)[1].decode("latin-1")
        pos += 12 + size
    return None


@dataclass(frozen=True)
class Figure:
    path: pathlib.Path
    digest: str
    write: Callable[[], None]


def figures(folder: pathlib.Path = RESULTS) -> list[Figure]:
    """One frontier plot per model, with the digest its file must carry."""
    run = _load(newest_run(folder))
    apath = anchors_path(run, folder)
    items = entries(run, _load(apath) if apath.exists() else None)
    out, offloaded = [], offload_runs(folder)
    for model in MODELS:
        data = points(items, model, offload_rows(model, offloaded))
        batch = "x".join(map(str, run["models"][model].get("info", {}).get("batch", [])))
        title = f"{NAMES[model]}, batch {batch}\n{run['device']}, torch {run['torch']}, {run['date']}"
        path = folder / FIGURE.format(model=model)
        out.append(Figure(path, digest(data), lambda d=data, t=title, p=path: draw(d, t, p)))
    return out
