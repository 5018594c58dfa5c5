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
import sweep_dedup_interrupt  # noqa: E402
import sweep_interrupt  # noqa: E402
import sweep_interrupt_points  # noqa: E402
import sweep_kill  # noqa: E402
import sweep_lock_file  # noqa: E402
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


def test_document_model_agrees_with_a_document_index(tmp_path):
    from ndindex.fingerprint import Fingerprinter

    rng = np.random.default_rng(6)
    model = sweep_corruption.DocumentModel(Fingerprinter())
    texts = sweep_corruption._doc_texts(rng, 120, [])
    keys = [f"k{i}" for i in range(len(texts))]
    with Index.create(tmp_path / "d.ndx", k=3, fingerprinter=model.fingerprinter,
                      background_compaction=False) as ix:
        for a in range(0, 120, 40):
            data = [bytes([i % 256]) for i in range(a, a + 40)]
            ix.add_documents(texts[a:a + 40], keys[a:a + 40], data=data, workers=1)
            model.add(texts[a:a + 40], keys[a:a + 40], data)
        ix.compact()
        replaced = sweep_corruption._doc_texts(rng, 10, texts)
        ix.add_documents(replaced, keys[:10], data=[b"r"] * 10, workers=1)
        model.add(replaced, keys[:10], [b"r"] * 10)
        ix.remove(keys=keys[50:60])
        model.remove(keys[50:60])
        assert sorted(ix.documents()) == model.documents()
        assert sweep_common.state_of(ix, model.index.fingerprints()) == model.index.state()
        queries = texts[10:40:3] + sweep_corruption._doc_texts(rng, 3, texts)
        want = model.similar(queries)
        assert all(w for w in want[:10]) and sum(map(len, want[:10])) > 10  # near-duplicates too
        got = [sweep_corruption._similar_answer((m.key, m.similarity) for m in ix.similar(t))
               for t in queries]
        assert got == want


def test_kill_sweep_lane_model_agrees_with_a_document_index(tmp_path, monkeypatch):
    # The kill sweep's operations with documents, applied without kills: its
    # model must hold what the index holds, documents() included, and
    # check_and_add must have turned some near-duplicates away.
    from ndindex.fingerprint import Fingerprinter

    monkeypatch.setattr(sweep_kill, "DOCUMENTS", True)
    model = sweep_kill.LaneModel()
    universe, kinds = set(), set()
    with Index.create(tmp_path / "k.ndx", k=3, expected_n=1000, fingerprinter=Fingerprinter(),
                      background_compaction=False) as ix:
        turned_away = 0
        for j in range(80):
            kind, args = sweep_kill.operation(9, 0, j)
            kinds.add(kind)
            before = len(model.keys)
            sweep_kill.run_operation(ix, kind, args)
            sweep_kill.apply_model(model, kind, args)
            if kind == "check_and_add":
                turned_away += len(args["fps"]) - (len(model.keys) - before)
            universe.update(sweep_kill._added(9, 0, j))
            assert sweep_common.state_of(ix, universe) == model.state(), (j, kind)
            assert sorted(ix.documents()) == model.documents(), (j, kind)
    assert {"add_documents", "remove_key", "add", "check_and_add"} <= kinds
    assert len(model.docs) > 20
    assert turned_away > 0


def test_kill_sweep_read_back_names_what_a_killed_build_left(tmp_path):
    # The check opens the index as a writer, which clears a killed build's
    # leftover; one it cannot clear (held, or of another kind) is reported.
    import fcntl
    path = str(tmp_path / "lane.ndx")
    Index.create(path, k=3).close()
    for name in (".lane.ndx.vacuum", ".lane.ndx.creating", ".lane.ndx.1234.copying"):
        open(tmp_path / name, "wb").close()
    held = os.open(tmp_path / ".lane.ndx.vacuum", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        res = sweep_kill.read_back(path, {}, set(), lambda *a: None)
    finally:
        os.close(held)
    assert res["leftovers"] == [".lane.ndx.1234.copying", ".lane.ndx.vacuum"]
    res = sweep_kill.read_back(path, {}, set(), lambda *a: None)
    assert res["leftovers"] == [".lane.ndx.1234.copying"]


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
DOC_ORACLE = dict(expect=dict(ORACLE["expect"], similar=[[("a", 1.0)]], documents=[("a", 1, b"")]),
                  previous=dict(ORACLE["previous"], similar=[[]], documents=[]),
                  after=ORACLE["after"])


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


def doc_steps(**changes):
    return good_steps(**dict(dict(similar=("ok", [[("a", 1.0)]]),
                                  documents=("ok", [("a", 1, b"")])), **changes))


@pytest.mark.parametrize("trial, cls", [
    (outcome(doc_steps()), "harmless"),
    (outcome(doc_steps(similar=("ok", [[]]))), "wrong"),
    (outcome(doc_steps(documents=("ok", [("a", 1, b"x")]))), "wrong"),
    (outcome(doc_steps(query=("ok", [[]]), keys=("ok", [()]), similar=("ok", [[]]),
                       documents=("ok", []))), "rollback"),
    (outcome(doc_steps(similar=("untyped", "KeyError: 'x'"))), "untyped"),
    (outcome(doc_steps(similar=("typed", "CorruptionError"))), "typed"),
])
def test_classify_document_answers(trial, cls):
    assert sweep_corruption.classify(trial, DOC_ORACLE)[0] == cls


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
def test_corruption_sweep_bounded_on_a_document_index(tmp_path):
    run = sweep_corruption.sweep(trials=120, jobs=2, seed=4, timeout=60, options={},
                                 workdir=str(tmp_path), index="documents")
    s = sweep_corruption.summarize(run)
    assert s["trials"] == 120 and s["documents"] > 2000
    assert set(s["by_stratum"]) == set(s["strata_pages"])
    for cls in ("crash", "hang", "untyped", "wrong", "rollback"):
        assert s["by_class"].get(cls, 0) == 0, (cls, s["by_class"], s["examples"])
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
def test_kill_sweep_bounded_with_documents(tmp_path):
    run = sweep_kill.sweep(cycles=80, jobs=2, seed=21, options=dict(documents=True),
                           workdir=str(tmp_path), fresh_every=10, timeout=60)
    s = sweep_kill.summarize(run)
    assert s["cycles"] == 80
    assert "add_documents" in s["by_killed_in"]
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


@pytest.mark.slow
@pytest.mark.parametrize("documents", [False, True])
def test_interrupt_sweep_bounded(tmp_path, documents):
    # Ctrl-C at random moments of writes: every call all or nothing, the
    # Index going on, the file reopening as the child last saw it.
    results = sweep_interrupt.sweep(runs=2, ops=80, seed=11, documents=documents,
                                    workdir=str(tmp_path), timeout=120)
    assert len(results) == 2
    for run_seed, outcome, detail in results:
        assert outcome == "ok", (run_seed, detail)
    assert sum(int(detail.split()[1]) for _, _, detail in results) > 0  # some landed in calls


@pytest.mark.slow
def test_lock_file_sweep_bounded(tmp_path):
    # A damaged lock file beside a live holder: no crash, hang or loss.
    import random
    rng = random.Random(3)
    for _ in range(4):
        at, line, bad = sweep_lock_file.trial(str(tmp_path / "lock.ndx"), rng)
        assert not bad, (at, line)
        assert line.endswith("after:ok") and line.count(":") >= 5


def test_dedup_interrupt_sweep_bounded(tmp_path, monkeypatch):
    # `ndindex dedup --jobs 2` interrupted: it exits, and its index verifies.
    import random
    monkeypatch.setattr(sweep_dedup_interrupt, "DIRS", 2)
    monkeypatch.setattr(sweep_dedup_interrupt, "FILES", 200)
    corpus = str(tmp_path / "corpus")
    sweep_dedup_interrupt.make_corpus(corpus, 5)
    rng = random.Random(5)
    for t in range(3):
        fine, what = sweep_dedup_interrupt.trial(rng, corpus, str(tmp_path / "d.ndx"), t)
        assert fine, what


def test_aimed_trials_are_the_unaimed_sweep_s_trials_of_those_strata():
    names = ["branch:(free)", "leaf:(free)", "leaf:chunks", "meta", "overflow:chunks"]
    aimed = sweep_corruption.aimed_trials(names, 7, ["meta", "leaf:(free)"])
    assert aimed == [1, 3, 6, 8, 11, 13, 16]
    assert all(names[t % len(names)] in ("meta", "leaf:(free)") for t in aimed)
    assert sweep_corruption.aimed_trials(names, 4, None) == [0, 1, 2, 3]
    with pytest.raises(SystemExit, match="no stratum leaf:nowhere"):
        sweep_corruption.aimed_trials(names, 4, ["leaf:nowhere"])


@pytest.mark.parametrize("n_strata", [4, 5])
def test_each_stratum_gets_both_kinds_of_damage(n_strata):
    # With an even number of strata, trial % 2 gave each stratum one mode.
    strata = {f"s{i}": [i + 2] for i in range(n_strata)}
    data = bytes(4096 * (n_strata + 2))
    modes = {}
    for trial in range(8 * n_strata):
        stratum, _, _, mask = sweep_corruption.trial_damage(data, strata, 4096, 1, trial)
        modes.setdefault(stratum, set()).add("xor" if mask == 0xFF else "bit")
    assert modes == {name: {"xor", "bit"} for name in strata}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["open-normal", "transaction-normal", "savepoint-normal",
                                      "compact-full", "vacuum", "close", "close-flush",
                                      "add_documents"])
def test_interrupt_points_sweep_bounded(tmp_path, scenario):
    # Ctrl-C at 40 points of one call each: the call whole or not at all,
    # the Index going on, nothing left open after close().
    res = sweep_interrupt_points.run_scenario(scenario, str(tmp_path), 40, seed=7, timeout=120,
                                              report=lambda line: None)
    assert res["bad"] == [], res["bad"][:3]
    assert res["points"] == min(40, res["events"]) and res["events"] > 100
    assert res["interrupted"] >= res["points"] - 2   # the points lie inside the call


@pytest.mark.usefixtures("sigint_raises")
def test_interrupt_points_trial_finds_what_a_call_leaves_behind(tmp_path, monkeypatch):
    # The sweep's checks fail a call that leaves a descriptor open or a
    # thread running, interrupted or not.
    import threading
    leaked = []

    def leaks_a_descriptor(ix, path):
        leaked.append(os.open(path, os.O_RDONLY))
        ix.add([1 << 40])

    def leaves_a_thread(ix, path):
        stop = threading.Event()
        leaked.append(stop)
        threading.Thread(target=stop.wait, name="ndindex-left", daemon=True).start()
        ix.add([1 << 40])

    base, path = str(tmp_path / "base.ndx"), str(tmp_path / "t.ndx")
    sweep_interrupt_points.make_base(base, "full", False)
    for name, call, outcome in [("leaky-fd", leaks_a_descriptor, "fd"),
                                ("leaky-thread", leaves_a_thread, "thread")]:
        monkeypatch.setitem(sweep_interrupt_points.SCENARIOS, name,
                            sweep_interrupt_points.Scenario(call))
        reference = sweep_interrupt_points.trial(name, base, path, 0, None)
        for n in (reference["events"], reference["events"] + 1):   # at its last point; never
            assert sweep_interrupt_points.trial(name, base, path, n, reference)["outcome"] == outcome
    for item in leaked:
        if isinstance(item, int):
            os.close(item)
        else:
            item.set()
