"""The attention table of ``benchmarks/README.md`` (``<!-- render: attention-check -->``): eager
autograd, torch.compile and remat per model, from the newest ``attention-check.json`` under
``results/<gpu>-torch<version>/`` (written by ``attention_check.py``), with the issue's targets."""

from __future__ import annotations

import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"


def section() -> str:
    paths = sorted(RESULTS.glob("*/attention-check.json"))  # one per <gpu>-torch<version> folder
    if not paths:
        return "No attention-check run yet."
    path = paths[-1]
    doc = json.loads(path.read_text())
    lines = ["| model | strategy | step ms | peak MiB | time x eager | memory x eager | time x compile | "
             "attention ops remat runs |", "|" + "---|" * 8]
    for m in doc["models"]:
        rows = m["rows"]
        eager, comp = rows["eager"], rows["compile"]
        for name, r in rows.items():
            ops = ", ".join(f"`{k.removeprefix('aten.').removesuffix('.default')}` x{v}"
                            for k, v in r.get("attention_ops", {}).items()) or "-"
            lines.append(f"| {m['model']} | {name} | {r['step_ms']:.2f} | {r['peak_mib']:,.0f} | "
                         f"{r['step_ms'] / eager['step_ms']:.3f} | {r['peak_mib'] / eager['peak_mib']:.3f} | "
                         f"{r['step_ms'] / comp['step_ms']:.3f} | {ops if name == 'remat' else '-'} |")
    lines += ["", "| model | ratio | measured | target |", "|---|---|---|---|"]
    for m in doc["models"]:
        for k, v in m["ratios"].items():
            target = "-" if v["target"] is None else f"{v['target']:.2f}"
            lines.append(f"| {m['model']} | {k} | {v['value']:.3f} | {target} |")
    notes = [f"- {m['model']}: {n}" for m in doc["models"] for n in m["rows"]["remat"].get("attention_notes", [])]
    built = doc.get("built_masks") or doc.get("dynamo_sees_exporting")
    lines += ["", *notes, "", f"({doc['device']}, torch {doc['torch'].split('+')[0]}, transformers "
              f"{doc['transformers']}; under Dynamo transformers {'builds' if built else 'skips'} its masks in the "
              f"graph; `benchmarks/{path.relative_to(HERE)}`)"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(section())
