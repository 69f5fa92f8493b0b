"""The long-context section of benchmarks/README.md and the table and plot of one
``long_context.py`` run (the script writes its own ``<tag>.md`` and ``<tag>.png`` with these
functions, so a run's files and the README agree).

Which file. The newest (by its ``date`` field, then by name) ``long-context-*.json`` in
``RESULTS`` (render_real_models) that is not a ``--tiny`` smoke run, then every such run in the
other GPUs' folders beside it (``other_runs``: tables only, no plot); while there is none the
section says so and names the command that makes one. Its plot is ``<the JSON's name>.png``
beside it, drawn from the JSON: like the real-model plots it carries a digest of its data and
drawing code in its ``Comment`` chunk (``render_real_models.png_comment`` reads it), so
``render.py --check`` compares digests, not pixels. Importing this module needs no
torch and no matplotlib; only drawing needs matplotlib.
"""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository: `benchmarks` as a package
from benchmarks.render_real_models import RESULTS, Figure, plot_digest, shown  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
RUN_GLOB = "long-context-*.json"
TARGET = ("compile+ckpt", ("remat", "remat @cap"))
"""Issue 28's target: each remat strategy against compile+ckpt (``target_line``)."""
LENGTH_FACTOR = 1.5
"""Issue 28's target: the longest context at least this times compile+ckpt's."""
COMMAND = "python benchmarks/long_context.py --cap-gib 20 --time-limit 510 --tag long-context-h200 --out out/"


# ---------------------------------------------------------------------------------------------
# Reading a run


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def _runs(folder: pathlib.Path) -> list[tuple[pathlib.Path, dict]]:
    """The non-tiny ``RUN_GLOB`` files of ``folder`` with their JSON, by name."""
    loaded = [(p, _load(p)) for p in sorted(folder.glob(RUN_GLOB))]
    return [(p, doc) for p, doc in loaded if not doc.get("tiny") and "strategies" in doc]


def _when(run: tuple[pathlib.Path, dict]) -> tuple[str, str]:
    return run[1].get("date", ""), run[0].name


def newest_run(folder: pathlib.Path = RESULTS) -> pathlib.Path | None:
    """The newest non-tiny ``RUN_GLOB`` file, or None."""
    runs = _runs(folder)
    return max(runs, key=_when)[0] if runs else None


def _probe_at(res: dict, seq: int | None) -> dict | None:
    """The fitting probe of a strategy at ``seq`` (None: not probed there, or it did not fit)."""
    return next((p for p in res.get("probes", []) if p["seq"] == seq and p["fits"]), None)


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _cell(text: str) -> str:
    text = str(text).replace("|", "/").replace("\n", " ")
    return text if len(text) <= 240 else text[:237] + "..."


def longest_cell(res: dict, max_seq: int) -> str:
    """The longest length that trained, with what bounds it when the search did not close."""
    n = res.get("longest", 0)
    if not res.get("complete", False):
        hi = res.get("first_fail")
        return f">= {n}" + (f", < {hi}" if hi else "") + " (search not finished)"
    if n == 0:
        return "none (the shortest length failed)"
    if res.get("first_fail") is None and n >= max_seq:
        return f"{n} (the search's upper bound)"
    return str(n)


def note(res: dict) -> str:
    parts = [oom_note(res), res.get("mode_note", "")]
    parts += res.get("notes", [])
    return _cell("; ".join(p for p in parts if p))


def oom_note(res: dict) -> str:
    """The shortest length that ran out of memory with the allocator's state recorded
    (``long_context.oom_detail``): what the step asked for against what was allocated and reserved."""
    ooms = sorted((p for p in res.get("probes", []) if p.get("why") == "oom" and "reserved_mib" in p.get("extra", {})),
                  key=lambda p: p["seq"])
    if not ooms:
        return ""
    p, e = ooms[0], ooms[0]["extra"]
    asked = re.search(r"Tried to allocate ([0-9.]+ [KMG]iB)", p.get("error") or "")
    return (f"out of memory at {p['seq']}{' asking for ' + asked.group(1) if asked else ''} with "
            f"{e['allocated_mib']:.0f} MiB allocated and {e['unallocated_mib']:.0f} MiB reserved but unallocated "
            f"({e['reserved_mib']:.0f} MiB reserved)")


def table(doc: dict) -> list[str]:
    """strategy | longest seq | tokens/s at it | peak MiB at it | compile s | note."""
    cols = ["strategy", "longest seq", "tokens/s at it", "peak MiB at it", "compile s", "note"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, res in doc["strategies"].items():
        if res.get("status") in ("skipped", "error") and not res.get("probes"):
            lines.append(f"| {name} | **{res['status']}** | | | | {_cell(res.get('error', ''))} |")
            continue
        at = _probe_at(res, res.get("longest"))
        comp = res.get("compile_s")
        comp_cell = _num(comp, ".1f") + (" at it" if comp is not None and res.get("mode") == "per-probe" else "")
        status = "" if res.get("status") == "ok" else f"**{res.get('status')}**: {res.get('error', '')}"
        lines.append("| " + " | ".join([
            name, longest_cell(res, doc["max_seq"]), _num(at and at.get("tokens_per_s"), ".0f"),
            _num(at and at.get("peak_mib"), ".0f"), comp_cell, _cell("; ".join(x for x in (status, note(res)) if x)),
        ]) + " |")
    return lines


def target_line(doc: dict) -> str:
    """Each remat strategy against compile+ckpt, as issue 28 states the target: the longest length
    at least ``LENGTH_FACTOR`` x compile+ckpt's, at tokens/s (at that longest length) no lower than
    compile+ckpt's at its own longest; and, where both trained at compile+ckpt's length, the two
    speeds there."""
    base_name, names = TARGET
    goal = f"at least {LENGTH_FACTOR}x {base_name}'s length, at no lower tokens/s than {base_name}'s at its own longest"
    base = doc["strategies"].get(base_name)
    if not base or not base.get("longest"):
        return f"The target ({goal}) needs {base_name} measured."
    if not base.get("complete"):
        return (f"The target ({goal}) is not settled: {base_name}'s search did not finish; "
                + _same_length(doc, base_name, base, names))
    n0 = base["longest"]
    b = _probe_at(base, n0)
    out = []
    for name in names:
        res = doc["strategies"].get(name)
        if not res or not res.get("probes"):
            continue
        n = res.get("longest", 0)
        longest = _probe_at(res, n)
        if not (b and b.get("tokens_per_s")) or not (longest and longest.get("tokens_per_s")):
            out.append(f"{name}: {n} against {n0} tokens ({n / n0:.2f}x), tokens/s not measured: **not met**")
            continue
        speed = longest["tokens_per_s"] / b["tokens_per_s"]
        met = n >= LENGTH_FACTOR * n0 and speed >= 1.0
        text = (f"{name}: {n} against {n0} tokens ({n / n0:.2f}x), {longest['tokens_per_s']:.0f} tokens/s at {n} "
                f"against {b['tokens_per_s']:.0f} at {n0} ({speed:.3f}x)")
        same = _probe_at(res, n0) if n != n0 else None
        if same and same.get("tokens_per_s"):
            text += (f"; at {n0} tokens {same['tokens_per_s']:.0f} against {b['tokens_per_s']:.0f} "
                     f"({same['tokens_per_s'] / b['tokens_per_s']:.3f}x)")
        out.append(text + f": **{'met' if met else 'not met'}**")
    if not out:
        return f"No remat strategy was measured beside {base_name}."
    return f"Against {base_name} ({goal}): " + "; ".join(out) + "."


def _same_length(doc: dict, base_name: str, base: dict, names: tuple[str, ...]) -> str:
    """Tokens/s of each remat strategy against ``base`` at ``base``'s longest trained length."""
    n0 = base["longest"]
    b = _probe_at(base, n0)
    out = []
    for name in names:
        mine = _probe_at(doc["strategies"].get(name) or {}, n0)
        if mine and b and b.get("tokens_per_s") and mine.get("tokens_per_s"):
            out.append(f"at {n0} tokens, where both trained, {name} ran {mine['tokens_per_s']:.0f} against "
                       f"{b['tokens_per_s']:.0f} tokens/s ({mine['tokens_per_s'] / b['tokens_per_s']:.3f}x)")
    return ("; ".join(out) + ".") if out else f"no remat strategy trained at {base_name}'s longest length, {n0}."


def caption(doc: dict, name: str) -> str:
    cfg = doc.get("config", {})
    model = (f"HF Llama ({cfg.get('hidden_size')} wide, {cfg.get('num_hidden_layers')} layers, "
             f"vocab {cfg.get('vocab_size')}), batch 1")
    return (f"{doc['device']}, torch {doc['torch']}, {doc.get('transformers', '')}, "
            f"{str(doc['dtype']).removeprefix('torch.')}; {model}; {doc['cap']}; lengths multiples of "
            f"{doc['granularity']} up to {doc['max_seq']}; {doc['date']}; `benchmarks/{name}`")


def markdown(doc: dict, name: str = "") -> str:
    """The run's table, the target line, the command and the run's notes."""
    lines = [caption(doc, name or "(this run)"), ""] + table(doc) + ["", target_line(doc), ""]
    env = f"PYTORCH_CUDA_ALLOC_CONF={shlex.quote(doc['alloc_conf'])} " if doc.get("alloc_conf") else ""
    lines.append(f"Run: `{env}python benchmarks/long_context.py {shlex.join(doc.get('argv') or [])}` (search: "
                 f"{doc['search']}; {doc['warmup']} warm-up step and up to {doc['iters']} timed steps per probe).")
    if doc.get("reused"):
        r = doc["reused"]
        lines.append(f"Rows noted \"from {r['file']}\" ({', '.join(r['strategies'])}) were measured by "
                     f"`python benchmarks/long_context.py {shlex.join(r.get('argv') or [])}` on {r['date']}.")
    lines += [f"\n{n}" for n in doc.get("notes", [])]
    return "\n".join(lines)


def section(folder: pathlib.Path = RESULTS) -> str:
    """The generated Markdown of benchmarks/README.md: the newest run and its plot, or a line
    saying that no run is recorded yet."""
    path = newest_run(folder)
    if path is None:
        return (f"No run is recorded here yet: `{COMMAND}` on a GPU writes it (`out/long-context-h200.json`); "
                "copy that file into `benchmarks/results/<gpu>-torch<version>/` and run `python benchmarks/render.py`.")
    doc = _load(path)
    png = shown(path.with_suffix(".png"))
    text = markdown(doc, shown(path)) + f'\n\n<img src="{png}" width="70%" alt="tokens/s against sequence length">'
    others = other_runs(folder)
    if others:
        text += ("\n\n**Runs on other GPUs** (not comparable with the run above: another card; each run's "
                 "own strategies only, in the order they ran):")
        for run, other in others:
            text += "\n\n" + markdown(other, shown(run))
    return text


def other_runs(folder: pathlib.Path = RESULTS) -> list[tuple[pathlib.Path, dict]]:
    """The non-tiny ``RUN_GLOB`` runs of the other GPU folders beside ``folder``
    (``results/<gpu>-torch<version>/``, CPU folders excluded) with their JSON, oldest first."""
    folders = [f for f in sorted(folder.parent.iterdir())
               if f != folder and f.is_dir() and not f.name.startswith("cpu-")]
    return sorted((run for f in folders for run in _runs(f)), key=_when)


# ---------------------------------------------------------------------------------------------
# Plot


def points(doc: dict) -> dict:
    """Per strategy: its fitting probes as (seq, tokens/s), sorted, and its first failure as
    (seq, tokens/s of the longest fit), the point marked x."""
    lines = {}
    for name, res in doc["strategies"].items():
        fit = sorted((p["seq"], round(p["tokens_per_s"], 1)) for p in res.get("probes", [])
                     if p["fits"] and p.get("tokens_per_s"))
        if not fit:
            continue
        last = dict(fit).get(res.get("longest"), fit[-1][1])
        fail = res.get("first_fail")
        lines[name] = {"fit": fit, "oom": [fail, last] if fail else None}
    return lines


def digest(data: dict) -> str:
    return plot_digest(data, points, draw)


def draw(data: dict, title: str, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, (name, d) in enumerate(data.items()):
        color = f"C{k}"
        ax.plot([p[0] for p in d["fit"]], [p[1] for p in d["fit"]], "-o", color=color, markersize=3, label=name)
        if d["oom"]:
            ax.scatter([d["oom"][0]], [d["oom"][1]], marker="x", s=60, color=color)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(lambda v, _: f"{v / 1024:g}k" if v >= 1024 else f"{v:g}")
    ax.set_xlabel("sequence length (tokens, batch 1); x: the shortest length that failed (out of memory)")
    ax.set_ylabel("tokens/s (median step)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None, "Comment": digest(data)})
    plt.close(fig)


def title(doc: dict) -> str:
    return f"HF Llama, batch 1, under {doc['cap']}\n{doc['device']}, torch {doc['torch']}, {doc['date']}"


def figures(folder: pathlib.Path = RESULTS) -> list[Figure]:
    """The newest run's plot, with the digest its file must carry (none without a run)."""
    path = newest_run(folder)
    if path is None:
        return []
    doc = _load(path)
    data = points(doc)
    png = path.with_suffix(".png")
    return [Figure(png, digest(data), lambda: draw(data, title(doc), png))]
