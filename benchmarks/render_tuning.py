"""The measured-plans table of ``benchmarks/README.md`` (``<!-- render: measured-plans -->``):
remat with ``tune`` (its graphs' candidates measured on the first training steps, the winner kept)
against torch.compile in the same process, from ``real_models.py`` runs whose remat rows carry
``measured``: every ``tune-*.json`` under ``results/<gpu>-torch<version>/``. A run whose name
ends in ``-cached`` is the same script run again, its decisions cached (Inductor's caches warm
for torch.compile too): its first-step times fill the last column.
"""

from __future__ import annotations

import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"


def _runs() -> tuple[list[tuple[pathlib.Path, dict]], dict[str, dict]]:
    cold, cached = [], {}
    for path in sorted(RESULTS.glob("*/tune-*.json")):
        doc = json.loads(path.read_text())
        if path.stem.endswith("-cached"):
            cached[path.stem.removesuffix("-cached")] = doc
        else:
            cold.append((path, doc))
    return cold, cached


def _rows(doc: dict, model: str) -> dict[str, dict]:
    return {r["strategy"]: r for r in doc["models"].get(model, {}).get("rows", [])}


def _first(rows: dict[str, dict]) -> str:
    c, r = rows.get("compile", {}), rows.get("remat", {})
    if not c.get("compile_s") or not r.get("compile_s"):
        return "-"
    total = r["compile_s"] + r.get("tuning_s", 0.0)
    return f"{total:.0f} / {c['compile_s']:.0f} s ({total / c['compile_s']:.2f}x)"


def section() -> str:
    cold, cached = _runs()
    if not cold:
        return "No measured-plans run yet."
    lines = ["| model | torch.compile | remat, measured plans | time x compile | memory x compile | chosen | "
             "candidates (median ms / peak MiB of the graph) | first step: remat / compile, cold | "
             "same, decision cached |", "|" + "---|" * 9]
    for path, doc in cold:
        later = cached.get(path.stem)
        for model in doc["models"]:
            rows = _rows(doc, model)
            c, r = rows.get("compile", {}), rows.get("remat", {})
            if r.get("status") != "ok" or c.get("status") != "ok":
                why = r.get("status", "not run")
                lines.append(f"| {model} | {c.get('ms', 0):.2f} ms / {c.get('peak_mib', 0):.0f} MiB | {why} | - | - "
                             "| - | - | - | - |")
                continue
            cands = "; ".join(f"{n}: {s * 1e3:.2f} / {b / 2**20:.0f}" for graph in r.get("measured", [])
                              for n, s, b in graph)
            chosen = ", ".join(o or "default" for o in r.get("origin", [])) or "-"
            lines.append(
                f"| {model} | {c['ms']:.2f} ms / {c['peak_mib']:.0f} MiB | {r['ms']:.2f} ms / {r['peak_mib']:.0f} MiB "
                f"| {r['ms'] / c['ms']:.3f} | {r['peak_mib'] / c['peak_mib']:.3f} | {chosen} | {cands or '-'} | "
                f"{_first(rows)} | {_first(_rows(later, model)) if later else '-'} |")
        lines.append(f"\n({doc['device']}, torch {doc['torch'].split('+')[0]}, {doc['dtype'].removeprefix('torch.')}, "
                     f"{doc.get('date', '')}; `benchmarks/{path.relative_to(HERE)}`)\n")
    return "\n".join(lines).rstrip()


if __name__ == "__main__":
    print(section())
