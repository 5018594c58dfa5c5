"""The ``ndindex`` command on a probabilistic (psm) index: query --text uses the
text's own flip probabilities; stats says the plan is probabilistic."""

from __future__ import annotations

import json

import numpy as np

import ndindex
from ndindex.cli import main
from ndindex.fingerprint import Fingerprinter

TEXTS = [f"Section {i}: the {w} fox jumps over the lazy dog while the farmer sleeps in the "
         f"afternoon sun and the cows graze quietly in the {w} meadow by the river {i}."
         for i, w in enumerate(["green", "wide", "old", "quiet", "long", "cold"])]


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def make_index(path, plan):
    fpr = Fingerprinter()
    with ndindex.Index.create(path, k=10, expected_n=10_000, plan=plan,
                              fingerprinter=fpr.to_bytes()) as ix:
        rng = np.random.default_rng(0)
        ix.add(rng.integers(0, 2**64, 5000, dtype=np.uint64))
        ix.add(fpr.simhash_many(TEXTS), keys=[f"doc{i}" for i in range(len(TEXTS))])
    return fpr


def test_query_text_on_a_psm_index_probes_with_the_texts_margins(tmp_path, capsys):
    path = str(tmp_path / "psm.ndx")
    fpr = make_index(path, "psm")
    text = TEXTS[2] + " And one more line."
    q, v = fpr.simhash_with_weights(text)
    for extra in ([], ["--max-probes", "3"]):
        status, out, err = run(capsys, "query", path, "--text", text, "--json", *extra)
        doc = json.loads(out)
        assert err == "" and doc["query"] == q
        max_probes = int(extra[1]) if extra else None
        with ndindex.open(path, readonly=True) as ix:
            want = ix.query(q, probabilities=fpr.flip_probabilities(v), max_probes=max_probes)
            assert want == ix.query_text(text, max_probes=max_probes)
        assert [(m["fingerprint"], m["distance"]) for m in doc["matches"]] == \
            [(m.fingerprint, m.distance) for m in want]
        assert status == (0 if want else 1)
    assert any(m["keys"] == ["doc2"] for m in doc["matches"])


def test_query_text_on_permuted_tables_stays_exact_unless_max_probes(tmp_path, capsys):
    path = str(tmp_path / "t.ndx")
    fpr = make_index(path, None)
    text = TEXTS[1]
    q, v = fpr.simhash_with_weights(text)
    with ndindex.open(path, readonly=True) as ix:
        exact = ix.query(q)
        capped = ix.query(q, probabilities=fpr.flip_probabilities(v), max_probes=1)
    doc = json.loads(run(capsys, "query", path, "--text", text, "--json")[1])
    assert [(m["fingerprint"], m["distance"]) for m in doc["matches"]] == \
        [(m.fingerprint, m.distance) for m in exact]
    doc = json.loads(run(capsys, "query", path, "--text", text, "--json", "--max-probes", "1")[1])
    assert [(m["fingerprint"], m["distance"]) for m in doc["matches"]] == \
        [(m.fingerprint, m.distance) for m in capped]
    status, out, err = run(capsys, "query", path, hex(q), "--max-probes", "4")
    assert status == 2 and "needs probabilities or margins" in err


def test_stats_names_a_probabilistic_plan(tmp_path, capsys):
    path = str(tmp_path / "psm.ndx")
    make_index(path, "psm")
    status, out, _ = run(capsys, "stats", path)
    assert status == 0 and "probabilistic plan" in out and "256 at k=10" in out
    doc = json.loads(run(capsys, "stats", path, "--json")[1])
    assert doc["probabilistic"] is True and "probabilistic" in doc["plan"]
    path = str(tmp_path / "t.ndx")
    make_index(path, None)
    assert "probabilistic" not in run(capsys, "stats", path)[1]


def test_create_psm_makes_the_plan_that_index_create_does(tmp_path, capsys):
    path = str(tmp_path / "wide.ndx")
    status, out, _ = run(capsys, "create", path, "-k", "10", "-n", "10000", "--psm")
    assert status == 0 and "1 table (prefix of" in out and "probabilistic" in out
    with ndindex.Index.create(str(tmp_path / "api.ndx"), k=10, expected_n=10_000,
                              plan="psm") as ix:
        want = ix.plan
    with ndindex.open(path) as ix:
        assert ix.plan == want and ix.plan.probabilistic
        ix.add(Fingerprinter().simhash_many(TEXTS), keys=[f"doc{i}" for i in range(len(TEXTS))])
    status, out, _ = run(capsys, "query", path, "--text", TEXTS[2], "--json")
    assert status == 0 and "doc2" in [k for m in json.loads(out)["matches"] for k in m["keys"]]
