"""``benchmarks/long_context.py``: the search finds exactly the longest multiple of the granularity
that fits (on pure functions, bisecting or guided by a memory line, from any start, going up or
down), stops when the time limit says so, and on the tiny Llama with an emulated cap returns, per
strategy, a length that fitted with the next multiple failing; the README section is written from
a run's JSON and its plot carries the digest ``render.py --check`` compares."""

import json
import math

import pytest

from benchmarks import long_context as lc
from benchmarks import render_long_context as rlc
from benchmarks import render_real_models as rrm

G, TOP = 1024, 131072


def pure(k: int, memory=None):
    """fits(n) = n <= k; ``memory(n)`` is what the cap bounds (None: nothing to guide by)."""
    calls = []

    def probe(n: int) -> lc.Probe:
        calls.append(n)
        return lc.Probe(n, n <= k, capped_bytes=None if memory is None else memory(n))

    return probe, calls


def expected(k: int) -> int:
    return min(max(k, 0) // G * G, TOP)


def check(s: lc.Search, k: int, calls: list[int]) -> None:
    assert s.complete and s.stopped is None
    assert s.lo == expected(k) and s.lo % G == 0
    if s.lo < TOP:  # the next multiple was probed and failed
        assert s.hi == s.lo + G and s.hi in calls
    else:
        assert s.hi is None
    if s.lo:
        assert s.lo in calls
    assert all(n % G == 0 and G <= n <= TOP for n in calls)
    assert len(calls) == len(set(calls)), "no length is probed twice"


KS = [0, 500, G, G + 1, 3 * G - 1, 5 * G, 37 * G + 100, 64 * G, 65 * G, 100 * G + 5, TOP - G, TOP, TOP + 7 * G]


@pytest.mark.parametrize("start", [None, 3 * G, 40 * G, TOP, 2 * TOP])
@pytest.mark.parametrize("mode", ["bisect", "linear", "curved", "flat"])
def test_search_is_exact_on_a_pure_function(mode, start):
    cap = 1e9
    memory = {"bisect": None,
              "linear": lambda n: 2e8 + n * 7e3,  # the guide's line is exact: it reaches the cap at ~114k
              "curved": lambda n: 1e8 + n * 2e3 + n * n * 0.05,  # not a line: the guide misses, bisection closes
              "flat": lambda n: cap * 0.99}[mode]  # no slope (remat @cap's plans fill the budget): bisection
    for k in KS:
        probe, calls = pure(k, memory)
        s = lc.find_longest(probe, granularity=G, max_len=TOP, start=start, cap_bytes=cap, guided=mode != "bisect")
        check(s, k, calls)
        bisect_bound = 2 * math.ceil(math.log2(TOP // G)) + 2
        assert len(calls) <= 2 * bisect_bound, (k, calls)


def test_guided_search_needs_fewer_probes_when_memory_is_a_line():
    cap = 20 * 2**30
    k = int((cap - 2e9) / 2e5) // G * G  # where 2e9 + 2e5 n reaches the cap (about 96k)
    counts = {}
    for guided in (False, True):
        probe, calls = pure(k, lambda n: 2e9 + 2e5 * n)
        s = lc.find_longest(probe, granularity=G, max_len=TOP, cap_bytes=cap, guided=guided)
        check(s, k, calls)
        counts[guided] = len(calls)
    assert counts[True] < counts[False], counts


def test_a_search_the_time_limit_stops_keeps_its_bracket():
    probe, calls = pure(50 * G)
    s = lc.find_longest(probe, granularity=G, max_len=TOP, may_probe=lambda n, s: len(s.probes) < 8)
    assert len(calls) == 8 and not s.complete and s.stopped.startswith("time limit")
    assert s.lo <= 50 * G < s.hi and s.lo % G == 0


def test_out_of_memory_is_recognised_through_wrappers():
    import torch

    inner = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    outer = RuntimeError("backend='inductor' raised")
    outer.__cause__ = inner
    assert lc.is_oom(inner) and lc.is_oom(outer) and lc.is_oom(RuntimeError("CUDA error: out of memory"))
    assert not lc.is_oom(RuntimeError("shape mismatch"))


def test_section_says_there_is_no_run_until_one_is_copied(tmp_path):
    assert "No run is recorded here yet" in rlc.section(tmp_path) and rlc.figures(tmp_path) == []


@pytest.mark.slow
def test_tiny_run_finds_each_strategys_boundary_and_renders(tmp_path):
    """eager and remat (uncompiled backend, sequence dimension dynamic) on the tiny Llama under
    an emulated cap of 3 MiB; every probe's verdict is the measured peak against the cap."""
    out = tmp_path / "out"
    doc = lc.main(["--tiny", "--strategies", "eager", "remat", "--cap-mib", "3", "--max-seq", "1024",
                   "--timing-s", "0.2", "--out", str(out), "--tag", "tiny"])
    g, cap = doc["granularity"], doc["cap_bytes"]
    for name in ("eager", "remat"):
        res = doc["strategies"][name]
        assert res["status"] == "ok" and res["complete"], res
        n = res["longest"]
        assert n > 0 and n % g == 0
        by_seq = {p["seq"]: p for p in res["probes"]}
        assert by_seq[n]["fits"] and by_seq[n]["capped_bytes"] <= cap
        assert not by_seq[n + g]["fits"] and by_seq[n + g]["capped_bytes"] > cap
        assert all(p["fits"] == (p["seq"] <= n) for p in res["probes"])
        assert res["tokens_per_s"] > 0 and res["peak_mib"] * 2**20 <= cap
    assert doc["strategies"]["remat"]["mode"] == "dynamic"
    assert doc["strategies"]["remat"]["probes"][0]["compiled"]
    assert not any(p["compiled"] for p in doc["strategies"]["remat"]["probes"][1:]), "compiled once"
    assert {p.name for p in out.iterdir()} >= {"tiny.json", "tiny.md", "tiny.png"}
    assert "| eager | " in (out / "tiny.md").read_text()

    # the README section from this run, as if it were a GPU run copied into benchmarks/
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "long-context-test.json").write_text(json.dumps(dict(doc, tiny=False)))
    text = rlc.section(folder)
    assert "| strategy | longest seq | tokens/s at it | peak MiB at it | compile s | note |" in text
    assert f"| remat | {doc['strategies']['remat']['longest']} |" in text and "long-context-test.png" in text
    (fig,) = rlc.figures(folder)
    fig.write()
    assert rrm.png_comment(fig.path) == fig.digest


def test_a_compiled_strategy_is_measured_without_asking_remat_for_plans(tmp_path):
    """Only remat's steps wait for its tuning (``real_models.finish_tuning``): asking a
    torch.compile model for remat's plans raises, which once ended compile+ckpt's search."""
    doc = lc.main(["--tiny", "--strategies", "compile", "--cap-mib", "3", "--max-seq", "256",
                   "--timing-s", "0.1", "--out", str(tmp_path), "--tag", "tiny-compile"])
    res = doc["strategies"]["compile"]
    assert res["status"] == "ok" and res["longest"] > 0, res
    assert all("tuning_steps" not in p["extra"] for p in res["probes"])


def test_kernels_records_where_each_fitting_probes_step_goes(tmp_path):
    doc = lc.main(["--tiny", "--strategies", "remat", "--cap-mib", "3", "--max-seq", "128", "--timing-s", "0.1",
                   "--kernels", "3", "--out", str(tmp_path), "--tag", "tiny-kernels"])
    fits = [p for p in doc["strategies"]["remat"]["probes"] if p["fits"]]
    assert fits
    for p in fits:
        k = p["extra"]["kernels"]
        assert k["kind"] == "cpu ops" and len(k["top"]) == 3 and k["total_ms"] > 0
        times = [ms for _, _, ms in k["top"]]
        assert times == sorted(times, reverse=True) and all(calls > 0 for _, calls, _ in k["top"])


def test_table_shows_what_bounds_a_search_that_did_not_finish():
    doc = {"max_seq": TOP, "strategies": {
        "eager": {"status": "ok", "longest": 20 * G, "first_fail": 21 * G, "complete": True, "compile_s": None,
                  "probes": [{"seq": 20 * G, "fits": True, "tokens_per_s": 5000.0, "peak_mib": 19000.0}]},
        "compile+ckpt": {"status": "ok", "longest": 64 * G, "first_fail": 128 * G, "complete": False, "compile_s": 50.0,
                         "mode": "dynamic", "notes": ["search stopped (time limit: not probing 96k)"],
                         "probes": [{"seq": 64 * G, "fits": True, "tokens_per_s": 30000.0, "peak_mib": 15000.0}]},
        "remat @cap": {"status": "skipped", "error": "time limit: a share of 20 s", "probes": []}}}
    rows = {r.split(" | ")[0].lstrip("| "): r for r in rlc.table(doc)[2:]}
    assert f"| {20 * G} | 5000 | 19000 | - |" in rows["eager"]
    assert f">= {64 * G}, < {128 * G} (search not finished)" in rows["compile+ckpt"]
    assert "**skipped**" in rows["remat @cap"] and "time limit" in rows["remat @cap"]
    line = rlc.target_line(doc)
    assert "is not settled: compile+ckpt's search did not finish" in line
    assert "no remat strategy trained at compile+ckpt's longest length, 65536." in line


@pytest.mark.slow
def test_a_run_can_reuse_an_earlier_runs_strategies_and_start_late(tmp_path):
    """``--reuse``: the strategies the second run leaves out come from the first, noted, in the
    table's order; ``--start``: the second run's search begins at that length."""
    out = tmp_path / "out"
    common = ["--tiny", "--cap-mib", "3", "--max-seq", "1024", "--timing-s", "0.2", "--out", str(out)]
    first = lc.main(common + ["--strategies", "remat", "--tag", "first"])
    second = lc.main(common + ["--strategies", "eager", "--start", "512", "--reuse", str(out / "first.json"),
                               "--tag", "second"])
    assert list(second["strategies"]) == ["eager", "remat"], "in the table's order"
    assert second["strategies"]["eager"]["probes"][0]["seq"] == 512
    reused = second["strategies"]["remat"]
    assert reused["longest"] == first["strategies"]["remat"]["longest"] and reused["reused_from"] == "first.json"
    assert reused["notes"][0].startswith("from first.json (")
    assert second["reused"]["strategies"] == ["remat"]
    text = (out / "second.md").read_text()
    assert "| remat | " in text and 'Rows noted "from first.json" (remat) were measured by' in text

    other = json.loads((out / "first.json").read_text())
    other["cap_bytes"] += 1
    (out / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="differs from this one in cap_bytes"):
        lc.main(common + ["--strategies", "eager", "--reuse", str(out / "other.json"), "--tag", "third"])


def test_target_line_compares_the_longest_lengths_as_issue_28_states_it():
    """Length at least 1.5x compile+ckpt's, and tokens/s at remat's longest length against
    compile+ckpt's at its own longest (not at compile+ckpt's length)."""
    base = {"status": "ok", "longest": 58 * G, "complete": True,
            "probes": [{"seq": 58 * G, "fits": True, "tokens_per_s": 18000.0}]}

    def doc(n, tps, also=None):
        probes = [{"seq": n, "fits": True, "tokens_per_s": tps}] + ([also] if also else [])
        return {"max_seq": TOP, "strategies": {"compile+ckpt": base,
                                               "remat @cap": {"status": "ok", "longest": n, "probes": probes}}}

    slow = rlc.target_line(doc(88 * G, 15000.0))
    assert "1.52x" in slow and "15000 tokens/s at 90112 against 18000 at 59392 (0.833x)" in slow
    assert slow.endswith("**not met**.")
    assert rlc.target_line(doc(88 * G, 19000.0)).endswith("**met**.")
    short = rlc.target_line(doc(80 * G, 40000.0, {"seq": 58 * G, "fits": True, "tokens_per_s": 36000.0}))
    assert "at 59392 tokens 36000 against 18000 (2.000x)" in short and short.endswith("**not met**.")


def test_an_out_of_memory_probe_is_noted_with_the_allocator_state():
    # The shortest length that ran out of memory with its allocator state recorded (oom_detail) is
    # named in the strategy's note: what it asked for, allocated, reserved but unallocated.
    error = "OutOfMemoryError: CUDA out of memory. Tried to allocate 5.25 GiB. GPU 0 has ..."
    state = {"allocated_mib": 12784.3, "reserved_mib": 15124.0, "unallocated_mib": 2339.7}
    res = {"probes": [{"seq": 90112, "fits": False, "why": "oom", "error": error, "extra": dict(state)},
                      {"seq": 88064, "fits": False, "why": "oom", "error": error, "extra": dict(state)},
                      {"seq": 44032, "fits": True, "why": "ok", "extra": {}}]}
    assert rlc.oom_note(res) == ("out of memory at 88064 asking for 5.25 GiB with 12784 MiB allocated and 2340 MiB "
                                 "reserved but unallocated (15124 MiB reserved)")
    assert rlc.oom_note({"probes": [{"seq": 88064, "fits": False, "why": "oom", "error": error, "extra": {}}]}) == ""


def test_an_oom_detail_names_the_frames_where_it_struck():
    try:
        raise RuntimeError("CUDA out of memory")
    except RuntimeError as e:
        detail = lc.oom_detail(e, lc.torch.device("cpu"))
    assert detail["frames"][-1].startswith("test_long_context.py:") and "reserved_mib" not in detail
