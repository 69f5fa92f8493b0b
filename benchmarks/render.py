"""Write the benchmark tables of README.md and benchmarks/README.md from the JSON files under results/.

    python benchmarks/render.py           # rewrite every table between render markers, and the plots
    python benchmarks/render.py --check   # exit 1 if a table or plot differs from what the JSON gives

A table lives between ``<!-- render: NAME -->`` and ``<!-- /render -->`` in a Markdown file;
NAME is one of ``TABLES``. Each number in those tables has one home: the JSON file named in
the table's caption, written by the benchmark that measured it (``bench.py --out``,
``peak_check.py --out``). Edit the JSON's producer, not the table. The real-model section and its
frontier plots come from ``render_real_models.py``, which picks the newest real-models run itself;
the long-context section and its plot from ``render_long_context.py`` (the newest
``long-context-*.json``, or a line saying there is none yet).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from collections.abc import Callable

import render_attention
import render_long_context
import render_real_models
import render_tuning

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
FILES = (ROOT / "README.md", HERE / "README.md")
H200 = "results/h200-torch2.11.0/"  # the folders of the runs, relative to benchmarks/: newest runs only
CPU = "results/cpu-torch2.13.0/"
RESULTS = H200 + "results-h200-run7.json"
PEAK = H200 + "peak-check-h200.json"
PEAK_DEEP = H200 + "peak-check-h200-deep.json"
EAGER_OVERHEAD = CPU + "eager-overhead-cpu.json"
FIRST_STEP = CPU + "first-step-cpu.json"
OLDER = H200 + "results-h200-run5.json"
DDP_SPLIT = (CPU + "distributed-cpu-split-before.json", CPU + "distributed-cpu-split-after.json")
DISTRIBUTED_H200 = (H200 + "distributed-h200-ws1.json", H200 + "distributed-h200-ws1-llama-ddp.json",
                    H200 + "distributed-h200-ws1-llama-fsdp-ckpt.json")  # a later file's rows win
ATTENTION_DROPOUT = H200 + "attention-dropout-h200.json"
BUDGET_RUNS = (H200 + "real-models-h200-vit-budgets.json", H200 + "real-models-h200-s8-lm-budgets.json",
               H200 + "real-models-h200-s8-resnet-budgets.json", H200 + "real-models-h200-s8-gpt2-budgets.json",
               H200 + "real-models-h200-s9-lm-budgets.json", H200 + "real-models-h200-s9-lm-ckpt.json",
               H200 + "budgets-measured-lm.json", H200 + "budgets-measured-ckpt.json",
               H200 + "budgets-measured-vision.json")
BUDGET_DEFAULT = H200 + "real-models-h200-s7.json"  # the default plans' run of the real-model section
H100 = "results/h100-torch2.11.0/"
# a later file's row replaces the same model and budget of an earlier one
SUITE_MATRIX = (H100 + "u-t5-b03.json",) + tuple(H100 + f"suite-h100-{tag}-{model}.json" for tag, models in (
    ("s12", ("gpt2", "llama", "vit", "resnet50", "convnext", "efficientnet", "mobilenetv3", "swin", "mixtral")),
    ("s12b", ("bert", "efficientnet", "gpt2", "llama", "mixtral", "mobilenetv3", "resnet50", "swin", "t5", "vit")),
    ("s12c", ("efficientnet",)),
    ("s12d", ("bert", "convnext", "gpt2", "llama", "mixtral", "resnet50", "vit")),
    ("s13a", ("bert", "convnext", "efficientnet", "mobilenetv3", "swin", "t5")),
    ("s13b", ("efficientnet", "mixtral", "mobilenetv3", "resnet50", "swin", "t5")),
    ("s14a", ("bert", "gpt2", "llama", "swin", "t5", "vit")),
    ("s14b", ("convnext", "mixtral", "resnet50")),
    ("s14c", ("convnext",)),
    ("s15a", ("bert", "convnext", "efficientnet", "mobilenetv3", "swin", "vit")),
    ("s16b", ("convnext", "efficientnet", "mobilenetv3")),
) for model in models)
SUITE_ORDER = ("gpt2", "llama", "vit", "resnet50", "bert", "t5", "mixtral", "swin", "convnext", "efficientnet",
               "mobilenetv3")
MIB = 1 << 20
FAKE_GPU = "results/fake-h100-torch2.14.1/"
GPU_OFFLINE = (FAKE_GPU + "gpu-offline-suite.json", FAKE_GPU + "gpu-offline-gpt2-pad-mm.json")


def _load(name: str) -> dict:
    return json.loads((HERE / name).read_text())


def _file(name: str) -> str:
    """A results file as a table cell names it: its name, the folder being the caption's."""
    return pathlib.PurePath(name).name


def _rows(doc: dict, workload: str) -> dict[str, dict]:
    return {r["variant"]: r for r in doc["workloads"][workload]["rows"]}


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if "error" in row:
        return "infeasible" if "InfeasibleBudgetError" in row["error"] else "error"
    return f"{row['ms']:.2f} ms / {row['peak_mib']:.0f} MiB"


def _header(cols: list[str]) -> list[str]:
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def _caption(doc: dict, name: str) -> str:
    return (f"{doc.get('device_name', doc.get('device'))}, torch {doc['torch'].split('+')[0]}, "
            f"{str(doc['dtype']).removeprefix('torch.')}; `benchmarks/{name}`")


def headline() -> str:
    """Step time and peak activation memory against eager, checkpointing and torch.compile."""
    doc = _load(RESULTS)
    variants = [("eager", "eager"), ("eager+ckpt", "eager + checkpoint per block"), ("compile", "torch.compile"),
                ("remat", "remat"), ("remat budget 50%", "remat, budget=0.5")]
    lines = _header(["workload"] + [v[1] for v in variants])
    ratios = []
    for w in doc["workloads"]:
        rows = _rows(doc, w)
        lines.append("| " + " | ".join([w] + [_cell(rows.get(v)) for v, _ in variants]) + " |")
        r, c = rows["remat"], rows["compile"]
        ratios.append(f"{w} {r['ms'] / c['ms']:.2f}x time, {r['peak_mib'] / c['peak_mib']:.2f}x memory")
    lines.append("")
    lines.append(f"Median step time / peak memory of a step ({_caption(doc, RESULTS)}). remat's default plan "
                 f"against torch.compile: {'; '.join(ratios)}.")
    return "\n".join(lines)


def results() -> str:
    """Every variant of the last full run, with compile time, roofline and gradient error."""
    doc = _load(RESULTS)
    cols = ["workload", "variant", "ms", "peak MiB", "x compile time", "x compile mem", "compile s", "x floor",
            "grad rel err", "plan saved MiB", "predicted / measured step peak MiB"]
    lines = _header(cols)
    for w in doc["workloads"]:
        rows = _rows(doc, w)
        base = rows["compile"]
        for v, r in rows.items():
            if "error" in r:
                lines.append(f"| {w} | {v} | {r['error'].split(': remat: ')[-1].split(':')[0]} |" + " |" * 8)
                continue
            pred = (f"{r['predicted_peak_mib']:.0f} / {r['measured_step_peak_mib']:.0f}"
                    if "predicted_peak_mib" in r else "")
            saved = f"{r['plan_saved_mib']:.0f}" if "plan_saved_mib" in r else ""
            lines.append(f"| {w} | {v} | {r['ms']:.2f} | {r['peak_mib']:.0f} | {r['ms'] / base['ms']:.3f} | "
                         f"{r['peak_mib'] / base['peak_mib']:.3f} | {r['compile_s']:.1f} | {r['x_floor']:.2f} | "
                         f"{r['grad_rel_err']:.1e} | {saved} | {pred} |")
    lines += ["", f"({_caption(doc, RESULTS)})"]
    return "\n".join(lines)


def _budget(b: float | None) -> str:
    return "default" if b is None else f"{b:.0%}"


def _infeasible(message: str) -> str:
    """What an ``InfeasibleBudgetError`` of a row says: the budget in bytes against eager's peak,
    the smallest plan's predicted peak and the floor no plan goes under."""
    def find(pattern: str) -> str:
        m = re.search(pattern, message)
        return m.group(1) if m else "?"
    budget = find(r"fits a peak of ([\d.]+ \w+)")
    eager = find(r"eager autograd's: ([\d.]+ \w+)")
    smallest = find(r"smallest predicted peak for this graph is ([\d.]+ \w+)")
    floor = find(r"(?:goes under|need) ([\d.]+ \w+)")
    return f"budget {budget} of eager's {eager}; smallest predicted: {smallest}; floor: {floor}"


def first_step() -> str:
    """The first training step's wall time (it compiles), remat against torch.compile (``first_step.py``)."""
    doc = _load(FIRST_STEP)
    cells = [f"{r['model']} {r['median_s']['remat']:.0f} s against {r['median_s']['torch.compile']:.0f} s "
             f"({r['ratio']:.2f}x)" for r in doc["rows"]]
    return (f"The first training step compiles, through Inductor's C++ backend on CPU: remat's against "
            f"torch.compile's on the same model, each in a fresh process with an empty Inductor cache, "
            f"median of {len(doc['rows'][0]['samples_s']['remat'])}: {'; '.join(cells)} (`benchmarks/{FIRST_STEP}`, "
            f"torch {doc['torch'].split('+')[0]}, {doc['threads']} threads; `{doc['command']}`).")


def peak_check() -> str:
    """Predicted against measured peak of each plan (``peak_check.py``)."""
    doc = _load(PEAK)
    lines = _header(["workload", "backend", "budget", "predicted MiB", "measured MiB", "error"])
    ok = []
    for r in doc["rows"]:
        head = f"| {r['workload']} | {r['backend']} | {_budget(r['budget'])} |"
        if r["status"] != "ok":
            lines.append(head + f" infeasible ({_infeasible(r.get('message', ''))}) | | |")
            continue
        if r["backend"] == "inductor":
            ok.append(abs(r["error"]))
        lines.append(head + f" {r['predicted_bytes'] / MIB:.1f} | {r['measured_bytes'] / MIB:.1f} | "
                     f"{r['error']:+.1%} |")
    within = sum(e <= 0.05 for e in ok)
    lines += ["", f"({_caption(doc, PEAK)}.) Inductor: {within} of {len(ok)} feasible plans within 5% "
              f"(worst {max(ok):.1%}). \"infeasible\": the budget is below every plan's predicted peak."
              + (f" Note: {doc['note']}." if doc.get("note") else "")]
    return "\n".join(lines)


def peak_check_deep() -> str:
    """The same at the deep sizes, one row per workload."""
    doc = _load(PEAK_DEEP)
    budgets = [None, 0.25, 0.5, 0.75, 1.0]
    lines = _header(["workload"] + [_budget(b) for b in budgets])
    by = {(r["workload"], r["budget"]): r for r in doc["rows"] if r["backend"] == "inductor"}
    for w in dict.fromkeys(r["workload"] for r in doc["rows"]):
        cells = []
        for b in budgets:
            r = by.get((w, b))
            cells.append("-" if r is None else "infeasible" if r["status"] != "ok" else
                         f"{r['predicted_bytes'] / MIB:.2f} / {r['measured_bytes'] / MIB:.2f} ({r['error']:+.1%})")
        lines.append("| " + " | ".join([w] + cells) + " |")
    lines += ["", f"Predicted / measured MiB (error) under Inductor ({_caption(doc, PEAK_DEEP)})."]
    return "\n".join(lines)


def eager_overhead() -> str:
    """Step time of the uncompiled backend against plain eager (``eager_overhead.py``)."""
    doc = _load(EAGER_OVERHEAD)
    lines = _header(["model", "plain eager", "remat, backend=\"eager\"", "ratio"])
    for r in doc["rows"]:
        lines.append(f"| {r['model']} | {r['eager_ms']:.2f} ms | {r['remat_eager_ms']:.2f} ms | "
                     f"{r['remat_eager_ms'] / r['eager_ms']:.2f}x |")
    load = ", ".join(f"{v:.1f}" for v in doc["load_average"])
    lines += ["", f"(CPU, torch {doc['torch'].split('+')[0]}, {doc['threads']} thread(s), fastest of {doc['steps']} "
              f"steps, load average {load} on a shared 2-core machine; `benchmarks/{EAGER_OVERHEAD}`)"]
    return "\n".join(lines)


def compile_variants() -> str:
    """torch.compile with a budget and with checkpointing, from the last run that had them."""
    doc = _load(OLDER)
    variants = [("compile", "torch.compile"), ("compile budget 0.5", "compile, activation_memory_budget=0.5"),
                ("compile+ckpt", "compile + checkpoint per block"), ("eager+ckpt", "eager + checkpoint per block")]
    lines = _header(["workload"] + [v[1] for v in variants])
    for w in doc["workloads"]:
        rows = _rows(doc, w)
        lines.append("| " + " | ".join([w] + [_cell(rows.get(v)) for v, _ in variants]) + " |")
    lines += ["", f"({_caption(doc, OLDER)})"]
    return "\n".join(lines)


def ddp_split() -> str:
    """Saved bytes lost to DDP's bucket splits, before and after remat split them itself
    (``distributed.py --wrappers ddp --strategies remat`` on CPU)."""
    before, after = (_load(name) for name in DDP_SPLIT)
    lines = _header(["model", "bucket graphs", "unsplit plan saves", "remat's saving", "split cost before",
                     "before, plans' sum", "split cost after", "after, plans' sum"])

    def cost(r: dict, key: str) -> str:
        saving = r["unsplit_eager_saved_bytes"] - r["unsplit_saved_bytes"]
        return f"{r[key] / MIB:.2f} MiB ({r[key] / saving:.1%})"

    for b, a in zip(before["rows"], after["rows"]):
        saving = a["unsplit_eager_saved_bytes"] - a["unsplit_saved_bytes"]
        lines.append(f"| {a['model']} | {b['graphs']} / {a['graphs']} | {a['unsplit_saved_bytes'] / MIB:.1f} MiB | "
                     f"{saving / MIB:.1f} MiB | {cost(b, 'split_cost_bytes')} | {cost(b, 'split_cost_plans_bytes')} | "
                     f"{cost(a, 'split_cost_bytes')} | {cost(a, 'split_cost_plans_bytes')} |")
    m = after["meta"]
    batch = "x".join(map(str, after["rows"][0]["batch_per_rank"]))
    lines += ["", f"(CPU, torch {m['torch'].split('+')[0]}, {str(m['dtype']).removeprefix('torch.')}, world size "
              f"{m['world_size']}, batch {batch} per rank, DDP's default buckets, remat's uncompiled backend; "
              f"`benchmarks/{DDP_SPLIT[0]}`, `benchmarks/{DDP_SPLIT[1]}`)"]
    return "\n".join(lines)


def distributed_h200() -> str:
    """DDP and FSDP2 at world size 1 on the H200: the rows of ``DISTRIBUTED_H200``, a row of a
    later file replacing the same model, wrapper and strategy of an earlier one."""
    rows: dict[tuple, tuple[dict, str]] = {}
    for name in DISTRIBUTED_H200:
        d = _load(name)
        for r in d["rows"]:
            rows[(r["model"], r["wrapper"], r["strategy"])] = (r, name)

    def mib(r: dict, key: str) -> str:
        return "-" if r.get(key) is None else f"{r[key] / MIB:.0f}"

    lines = ["| model | wrapper | strategy | step ms | peak MiB | graphs | kept MiB | unsplit saved MiB "
             "| split cost MiB (of saving) | file |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (model, wrapper, strategy), (r, name) in rows.items():
        head = f"| {model} | {wrapper} | {strategy} |"
        if r.get("error"):
            kind, _, message = r["error"].partition(": ")
            lines.append(f"{head} **{kind}** | {message.split(' (')[0]} | | | | | `{_file(name)}` |")
            continue
        cost = "-" if r.get("split_cost_bytes") is None else (
            f"{r['split_cost_bytes'] / MIB:.0f} ({r['split_cost_of_saving']:.1%})")
        unsplit = "unsplit_saved_bytes" if wrapper == "ddp" else "unsplit_block_saved_bytes"
        kept = "kept_bytes" if wrapper == "ddp" else "saved_bytes"
        lines.append(f"{head} {r['step_ms']:.2f} | {mib(r, 'peak_bytes')} | {r.get('graphs') or '-'} | "
                     f"{mib(r, kept) if r.get('graphs') else '-'} | {mib(r, unsplit) if r.get('graphs') else '-'} | "
                     f"{cost} | `{_file(name)}` |")
    metas = [_load(n)["meta"] for n in DISTRIBUTED_H200]
    lines += ["", "(" + "; ".join(f"`{_file(n)}`: {m['device']}, torch {m['torch']}, "
                                  f"transformers {m.get('transformers')}, "
                                  f"{m['date'][:16].replace('T', ' ')} UTC" for n, m in zip(DISTRIBUTED_H200, metas))
              + "; world size 1, bf16, batch 8 x 1024 (GPT-2) and 8 x 2048 (Llama) per rank)"]
    return "\n".join(lines)


def attention_dropout() -> str:
    """``attention_dropout.py`` on the H200: eager, torch.compile and remat, with ratios to eager."""
    d = _load(ATTENTION_DROPOUT)
    eager = d["rows"]["eager"]
    lines = ["| strategy | step ms | peak MiB | time x eager | memory x eager | attention ops remat runs |",
             "|---|---|---|---|---|---|"]
    for name, r in d["rows"].items():
        ops = ", ".join(f"`{o.removeprefix('aten.')}`" for o in r.get("attention_ops", [])) or "-"
        lines.append(f"| {name} | {r['step_ms']:.2f} | {r['peak_mib']} | {r['step_ms'] / eager['step_ms']:.3f} | "
                     f"{r['peak_mib'] / eager['peak_mib']:.3f} | {ops} |")
    lines += ["", f"({d['gpu']}, torch {d['torch']}; `benchmarks/{ATTENTION_DROPOUT}`)"]
    return "\n".join(lines)


def _mib(value: float | None) -> str:
    return f"{value:.0f}" if value else "-"


def _ratio(peak_mib: float, default: dict | None) -> str:
    return f"{peak_mib / default['peak_mib']:.3f}" if default else "-"


def real_model_budgets() -> str:
    """remat's budgets on the four real models (``BUDGET_RUNS``; a later file's row replaces the
    same model and strategy of an earlier one): measured against predicted peak, against the
    budget and against the default plan's measured peak (``BUDGET_DEFAULT``), and time against
    torch.compile in the row's own run."""
    rows: dict[tuple[str, str], tuple[dict, dict, str]] = {}
    dates = []
    for name in BUDGET_RUNS:
        d = _load(name)
        dates.append(f"`{_file(name)}` {d['date']}")
        for model, md in d["models"].items():
            comp = next((r for r in md["rows"] if r["strategy"] == "compile" and r.get("ms")), None)
            for r in md["rows"]:
                if r["strategy"].startswith("remat ") and r.get("status") != "skipped":
                    rows[(model, r["strategy"])] = (r, comp or {}, name)
    defaults = {m: next(r for r in md["rows"] if r["strategy"] == "remat")
                for m, md in _load(BUDGET_DEFAULT)["models"].items()}
    order = {m: i for i, m in enumerate(defaults)}
    lines = _header(["model", "budget", "budget MiB (per graph)", "step ms", "time x compile", "measured MiB",
                     "simulated MiB", "read MiB", "simulated / read", "read / measured", "measured / (first) budget",
                     "measured / default's", "compiles", "file"])
    for (model, strategy), (r, comp, name) in sorted(rows.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1])):
        head = f"| {model} | {strategy.removeprefix('remat ')} |"
        if r.get("status") != "ok":
            why = (r.get("error") or "").split(". Raise")[0].replace("|", "/")
            lines.append(f"{head} **{r.get('status')}** | {why} | | | | | | | | | | `{_file(name)}` |")
            continue
        budgets = [b for b in r.get("budget_mib") or [] if b]
        sim, read = r.get("simulated_peak_mib"), r.get("read_peak_mib")
        replans = "".join(r["replans"]) if isinstance(r.get("replans"), (list, str)) else ""
        compiles = re.findall(r"\((\d+) compiles\)", replans)
        over = f"{r['peak_mib'] / budgets[0]:.3f}" if budgets else "-"
        measured = r["peak_mib"]
        sim_read = f"{sim / read:.3f}" if sim and read else "-"
        read_meas = f"{read / measured:.3f}" if read else "-"
        lines.append(f"{head} {' / '.join(f'{b:.0f}' for b in budgets)} | {r['ms']:.2f} | "
                     f"{r['ms'] / comp['ms']:.3f} | {measured:.0f} | {_mib(sim)} | {_mib(read)} | {sim_read} | "
                     f"{read_meas} | {over} | {_ratio(measured, defaults.get(model))} | "
                     f"{max(compiles, key=int, default='1')} | `{_file(name)}` |")
    lines += ["", f"(NVIDIA H200, torch 2.11, bfloat16; {'; '.join(dates)}; the default plans' measured peaks from "
                  f"`{_file(BUDGET_DEFAULT)}`. Predicted as in the section above; GPT-2 runs as two graphs (a graph "
                  "break before the loss; T5 as four): runs before 2026-12-03 bounded each graph by the budget, "
                  "later ones the step (Note [Step budget]).)"]
    return "\n".join(lines)


def suite_matrix() -> str:
    """Issue 27's matrix on the broad suite (``SUITE_MATRIX``): each budget's simulated peak (the
    prediction before compiling), the peak read from Inductor's memory plan and the measured one;
    peaks only (the runs shared one GPU, so no time stands)."""
    rows: dict[tuple[str, str], tuple[dict, str]] = {}
    for name in SUITE_MATRIX:
        for model, md in _load(name)["models"].items():
            for r in md["rows"]:
                if r["strategy"].startswith("remat") and r.get("status") in ("ok", "infeasible"):
                    rows[(model, r["strategy"])] = (r, name)
    budgets = {"remat": "default", "remat b0.75": "0.75", "remat b0.5": "0.5", "remat b0.3": "0.3",
               "remat @ckpt peak": "compile+ckpt's peak"}
    lines = _header(["model", "budget", "budget MiB", "plan", "simulated MiB", "read MiB", "measured MiB",
                     "simulated vs measured", "read vs measured", "measured / budget", "file"])
    order = {m: i for i, m in enumerate(SUITE_ORDER)}
    for (model, strategy), (r, name) in sorted(rows.items(), key=lambda kv: (order.get(kv[0][0], 99),
                                                                             list(budgets).index(kv[0][1]))):
        head = f"| {model} | {budgets[strategy]} |"
        if r["status"] != "ok":
            why = (r.get("error") or "").split(". Raise")[0].replace("|", "/").removeprefix("remat: ")
            lines.append(f"{head} | refused: {why} | | | | | | | `{_file(name)}` |")
            continue
        cap = [b for b in r.get("budget_mib") or [] if b]
        sim, read, measured = r.get("simulated_peak_mib"), r.get("read_peak_mib"), r["peak_mib"]
        plan = " + ".join(o or "no choice" for o in r.get("origin") or []) or "-"
        lines.append(f"{head} {' / '.join(f'{b:.0f}' for b in cap) or '-'} | {plan} | {_mib(sim)} | {_mib(read)} | "
                     f"{measured:.0f} | {f'{100 * (sim / measured - 1):+.1f}%' if sim else '-'} | "
                     f"{f'{100 * (read / measured - 1):+.1f}%' if read else '-'} | "
                     f"{f'{measured / cap[0]:.3f}' if cap else '-'} | `{_file(name)}` |")
    dates = sorted({_load(n)["date"][:10] for n in SUITE_MATRIX})
    lines += ["", f"(NVIDIA H100 80GB HBM3, torch 2.11, bfloat16, {' to '.join((dates[0], dates[-1]))}; "
                  f"`benchmarks/{H100}`; a budget's MiB are per graph (T5 and GPT-2 run as several graphs, the first "
                  "graph's share shown first); a refused budget names the smallest plan.)"]
    return "\n".join(lines)


def gpu_offline() -> str:
    """remat's simulated peak against the peak read from Inductor's CUDA memory plan, generated on
    a CPU (``gpu_offline.py``)."""
    lines = _header(["model", "matmuls padded", "graph", "budget", "simulated MiB", "read MiB", "error"])
    meta = {}
    for name in GPU_OFFLINE:
        doc = _load(name)
        meta = doc["meta"]
        for r in doc["rows"]:
            pad = "all misaligned" if r.get("pad_mm") else "none"
            if "failed" in r:
                lines.append(f"| {r['model']} | {pad} | {r['graph']} | {_budget(r['budget'])} | "
                             f"{_infeasible(r['failed'])} | | |")
                continue
            lines.append(f"| {r['model']} | {pad} | {r['graph']} | {_budget(r['budget'])} | "
                         f"{r['simulated'] / MIB:.1f} | {r['read'] / MIB:.1f} | {100 * r['error']:+.1f}% |")
    files = ", ".join(f"`{_file(n)}`" for n in GPU_OFFLINE)
    torch_version = meta.get("torch", "?").split("+")[0]
    return "\n".join(lines + ["", f"(Generated on this CPU for a {meta.get('device', '?')}, torch {torch_version}, "
                                   "bfloat16, no dropout; each graph planned alone, its budget a fraction of its "
                                   f"own eager peak; `benchmarks/{FAKE_GPU}`: {files}.)"])


TABLES: dict[str, Callable[[], str]] = {
    "headline": headline, "results": results, "peak-check": peak_check, "first-step": first_step,
    "peak-check-deep": peak_check_deep,
    "eager-overhead": eager_overhead, "compile-variants": compile_variants, "ddp-split": ddp_split,
    "distributed-h200": distributed_h200, "attention-dropout": attention_dropout,
    "real-models": render_real_models.section, "real-models-headline": render_real_models.headline,
    "long-context": render_long_context.section, "real-model-budgets": real_model_budgets,
    "attention-check": render_attention.section, "measured-plans": render_tuning.section,
    "gpu-offline": gpu_offline, "suite-matrix": suite_matrix,
}
_BLOCK = re.compile(r"(<!-- render: ([\w-]+) -->\n)(.*?)(<!-- /render -->)", re.S)


def render(text: str) -> str:
    """``text`` with every render block replaced by its table."""
    def fill(m: re.Match) -> str:
        if m.group(2) not in TABLES:
            raise SystemExit(f"render.py: unknown table {m.group(2)!r}; known: {', '.join(TABLES)}")
        return m.group(1) + TABLES[m.group(2)]() + "\n" + m.group(4)

    return _BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table or plot is stale; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path in FILES:
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new)
    for fig in [*render_real_models.figures(), *render_long_context.figures()]:  # rewritten only when stale
        if render_real_models.png_comment(fig.path) != fig.digest:
            stale.append(fig.path)
            if not args.check:
                fig.write()
    if args.check and stale:
        print("stale tables or plots in " + ", ".join(str(p.relative_to(ROOT)) for p in stale)
              + ": run python benchmarks/render.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
