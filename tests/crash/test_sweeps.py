"""The sweep tools: their oracle, their classification, and bounded runs of both.

tools/sweep_corruption.py and tools/sweep_kill.py judge the library, so
their own logic is tested here: the model they compare answers with must
agree with a real index under random operations; a trial's class must
follow from what its child did; and a bounded run of each must finish,
account for every trial, and cover every stratum and operation kind.
The bounded runs hold the library to the promise of issue 10 on every
trial: a damaged file never crashes or hangs the process, never raises an
untyped error, never answers wrongly after verify() passed, never opens an
older commit silently; a kill never loses an acknowledged item and never
leaves a file that does not open.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import sweep_common  # noqa: E402
import sweep_corruption  # noqa: E402
import sweep_kill  # noqa: E402
from ndindex.index import Index  # noqa: E402


def test_model_agrees_with_the_index_under_random_operations(tmp_path):
    rng = np.random.default_rng(4)
    model = sweep_common.IndexModel()
    pool = rng.integers(0, 2**64, 300, dtype=np.uint64)
    with Index.create(tmp_path / "m.ndx", k=3, expected_n=1000) as ix:
        for step in range(60):
            r = rng.random()
            fps = pool[rng.integers(0, len(pool), int(rng.integers(1, 30)))]
            if r < 0.5:
                keys = [f"k{int(rng.integers(40))}" if rng.random() < 0.7 else None for _ in fps]
                ix.add(fps, keys=keys)
                model.add(fps, keys)
            elif r < 0.7:
                ix.remove(fingerprints=fps)
                model.remove(fingerprints=fps)
            elif r < 0.9:
                keys = [f"k{int(rng.integers(40))}" for _ in range(3)]
                ix.remove(keys=keys)
                model.remove(keys=keys)
            else:
                ix.compact()
            assert sweep_common.state_of(ix, pool) == model.state(), step
            assert len(ix.fingerprints()) == len(model.keys)
        for q in pool[:30]:
            q = int(q) ^ (1 << int(rng.integers(64)))
            assert sweep_common.as_answer(ix.query(q, 3, keys=True)) == model.query(q, 3)


def test_option_filtering_keeps_only_accepted_keywords():
    def create(path, *, k=3, durability="full", background_compaction=True):
        pass

    assert sweep_common.api_options(create, {"durability": "none", "unknown": 1}) == \
        {"durability": "none", "background_compaction": False}
    assert sweep_common.parse_options(["a=1", "b='x'", "c=word"]) == {"a": 1, "b": "x", "c": "word"}


def test_child_reports_signal_exception_and_hang():
    died = sweep_common.run_child(lambda send: os.kill(os.getpid(), signal.SIGBUS), 10)
    assert died["signal"] == signal.SIGBUS
    raised = sweep_common.run_child(lambda send: 1 / 0, 10)
    assert "ZeroDivisionError" in raised["escaped"]
    hung = sweep_common.run_child(lambda send: __import__("time").sleep(30), 0.5)
    assert hung["hung"]
    fine = sweep_common.run_child(lambda send: (send("step", "a"), 42)[1], 10)
    assert fine["result"] == 42 and fine["messages"][0] == ("step", "a")


# -- classification of a corruption trial ------------------------------------------------

ORACLE = dict(expect=dict(query=[[(1, 0, ("a",))]], keys=[("a",)]),
              previous=dict(query=[[]], keys=[()]), after=[[(1, 0, ("a",))]])


def outcome(steps=None, sig=None, hung=False, escaped=None):
    return dict(messages=[("step", "verify")], result=steps, escaped=escaped, hung=hung, signal=sig,
                exit_code=0)


def good_steps(**changes):
    steps = dict(open=("ok", None), verify=("ok", None), query=("ok", [[(1, 0, ("a",))]]),
                 keys=("ok", [("a",)]), add=("ok", None), compact=("ok", None),
                 query_after=("ok", [[(1, 0, ("a",))]]))
    steps.update(changes)
    return steps


@pytest.mark.parametrize("trial, cls", [
    (outcome(sig=signal.SIGABRT), "crash"),
    (outcome(hung=True), "hang"),
    (outcome(escaped="Traceback ... MemoryError"), "untyped"),
    (outcome(good_steps(keys=("untyped", "lmdb.CorruptedError: x"))), "untyped"),
    (outcome(good_steps(keys=("ok", [()]))), "wrong"),
    (outcome(good_steps(query=("ok", [[]]), keys=("ok", [()]))), "rollback"),
    (outcome(good_steps(query_after=("ok", [[]]))), "wrong"),
    (outcome(good_steps(verify=("typed", "CorruptionError"), keys=("ok", [()]))), "typed"),
    (outcome(good_steps(add=("typed", "CorruptionError"), query_after=("ok", [[]]))), "typed"),
    (outcome(good_steps()), "harmless"),
])
def test_classify(trial, cls):
    assert sweep_corruption.classify(trial, ORACLE)[0] == cls


# -- bounded runs ---------------------------------------------------------------------------


@pytest.mark.slow
def test_corruption_sweep_bounded(tmp_path):
    run = sweep_corruption.sweep(trials=300, jobs=2, seed=3, timeout=60, options={},
                                 workdir=str(tmp_path))
    s = sweep_corruption.summarize(run)
    assert s["trials"] == 300
    assert sum(s["by_class"].values()) == 300
    assert set(s["by_class"]) <= set(sweep_corruption.CLASSES)
    assert set(s["by_stratum"]) == set(s["strata_pages"])  # every stratum got trials
    assert {"meta", "free", "overflow:chunks", "leaf:chunks", "leaf:log", "leaf:meta"} <= \
        set(s["by_stratum"])
    for cls in ("crash", "hang", "untyped", "wrong", "rollback"):
        assert s["by_class"].get(cls, 0) == 0, (cls, s["by_class"])
    assert s["by_class"].get("typed", 0) > 0 and s["by_class"].get("harmless", 0) > 0


@pytest.mark.slow
def test_kill_sweep_bounded(tmp_path):
    run = sweep_kill.sweep(cycles=120, jobs=2, seed=3, options={}, workdir=str(tmp_path),
                           fresh_every=10, timeout=60)
    s = sweep_kill.summarize(run)
    assert s["cycles"] == 120
    assert {"create", "add", "compact_full"} <= set(s["by_killed_in"])
    assert s["lost_fingerprints"] == 0 and s["lost_keys"] == 0
    for r in run["records"]:
        assert r["outcome"] == "ok", r


@pytest.mark.slow
def test_kill_sweep_bounded_with_background_compaction_and_normal_durability(tmp_path):
    options = dict(background_compaction=True, log_limit=300, durability="normal")
    run = sweep_kill.sweep(cycles=60, jobs=2, seed=5, options=options, workdir=str(tmp_path),
                           fresh_every=10, timeout=60)
    s = sweep_kill.summarize(run)
    assert s["cycles"] == 60
    assert s["during_background_step"] > 0
    assert "background compaction" in s["by_killed_in"]
    assert s["lost_fingerprints"] == 0 and s["lost_keys"] == 0
    for r in run["records"]:
        assert r["outcome"] == "ok", r
