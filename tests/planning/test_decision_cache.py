"""The decision cache (``remat.planning.decision_cache``): keys, hits, misses, bad files."""

import json

from remat.planning.decision_cache import Decision, DecisionCache, decision_key, default_cache_dir

D = Decision(chosen=(("mm", "relu"), ("tanh",)), name="default", reason="fastest", table=(("default", 0.01, 100),
                                                                              ("compile", 0.011, 200)))


def test_store_then_load(tmp_path):
    cache = DecisionCache(tmp_path)
    key = decision_key("graph", "cuda:NVIDIA H200", "2.11.0", "opts")
    assert cache.load(key) is None  # miss
    path = cache.store(key, D)
    assert path is not None and path.parent == tmp_path / "decisions"
    assert cache.load(key) == D  # hit
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_every_part_of_the_key_counts():
    base = decision_key("g", "d", "t", "o")
    assert len({base, decision_key("g2", "d", "t", "o"), decision_key("g", "d2", "t", "o"),
                decision_key("g", "d", "t2", "o"), decision_key("g", "d", "t", "o2")}) == 5
    assert decision_key("g", "d", "t", "o") == base
    assert decision_key("ab", "c", "t", "o") != decision_key("a", "bc", "t", "o")  # parts are separated


def test_unreadable_or_old_entries_are_misses(tmp_path):
    cache = DecisionCache(tmp_path)
    key = decision_key("g", "d", "t", "o")
    cache.store(key, D)
    path = tmp_path / "decisions" / f"{key}.json"
    path.write_text("{not json")
    assert cache.load(key) is None
    path.write_text(json.dumps({"schema": 0, "chosen": [], "name": "x", "reason": "", "table": []}))
    assert cache.load(key) is None


def test_unwritable_directory_is_not_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert DecisionCache(blocker).store("k", D) is None  # its decisions/ cannot be made under a file


def test_default_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("REMAT_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("REMAT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x" / "remat"
