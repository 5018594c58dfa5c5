"""The document subcommands: create --docs, add --docs/--jsonl, similar, pairs, clusters.

Results are checked against a brute-force oracle: for texts of fewer than
bottom_k shingles the stored sketch is the whole shingle set, so the exact
Jaccard of two sketches, over every pair, is what the index must report.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ndindex
from ndindex.cli import main
from ndindex.cluster import clusters_from_pairs
from ndindex.fingerprint import Fingerprinter

ROOT = Path(__file__).resolve().parents[2]
WORDS = [f"w{i}" for i in range(3000)]


def run(capsys, *argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def corpus(seed: int = 1, n: int = 24) -> dict:
    """Texts of 60-300 words: originals, and edits of them at every distance."""
    rng = random.Random(seed)
    texts = {}
    for i in range(n):
        if i >= 4 and rng.random() < 0.6:
            src = texts[f"doc{rng.randrange(i):02d}"].split()
            for _ in range(rng.choice([1, 2, 4, 8, 20])):
                src[rng.randrange(len(src))] = rng.choice(WORDS)
            texts[f"doc{i:02d}"] = " ".join(src)
        else:
            texts[f"doc{i:02d}"] = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(60, 300)))
    return texts


def jaccard(a: str, b: str) -> float:
    fpr = Fingerprinter()
    x, y = set(fpr.sketch(a).tolist()), set(fpr.sketch(b).tolist())
    return len(x & y) / len(x | y)


def oracle_pairs(texts: dict, threshold: float) -> dict:
    return {(a, b): jaccard(texts[a], texts[b])
            for a, b in itertools.combinations(sorted(texts), 2)
            if jaccard(texts[a], texts[b]) >= threshold}


@pytest.fixture
def docs(tmp_path, capsys, monkeypatch):
    """An index holding corpus() added through --jsonl; returns (path, texts)."""
    path = tmp_path / "docs.ndx"
    assert run(capsys, "create", path, "--docs")[0] == 0
    texts = corpus()
    lines = "".join(json.dumps({"key": k, "text": t}) + "\n" for k, t in texts.items())
    status, out, err = run(capsys, "add", path, "--jsonl", "-", "--json", stdin=lines,
                           monkeypatch=monkeypatch)
    assert status == 0 and err == ""
    assert json.loads(out)["added"] == len(texts)
    return path, texts


# -- create --------------------------------------------------------------------------


def test_create_docs_stores_the_fingerprinter_of_its_options(tmp_path, capsys):
    status, out, err = run(capsys, "create", tmp_path / "a.ndx", "--docs")
    assert status == 0 and err == "" and out.startswith(f"created {tmp_path / 'a.ndx'}: k=3, ")
    assert out.rstrip().endswith("documents: threshold 0.8, bottom-1024 sketches")
    status, out, _ = run(capsys, "create", tmp_path / "b.ndx", "--threshold", "0.9",
                         "--bottom-k", "256", "--json")
    assert status == 0 and json.loads(out)["documents"] == {"threshold": 0.9, "bottom_k": 256}
    with ndindex.open(tmp_path / "b.ndx", readonly=True) as index:
        fpr = Fingerprinter.from_bytes(index.fingerprinter)
    assert (fpr.threshold, fpr.bottom_k) == (0.9, 256)
    assert fpr == Fingerprinter(threshold=0.9, bottom_k=256)


@pytest.mark.parametrize("argv, message", [
    (["--docs", "--no-fingerprinter"], "--docs, --threshold and --bottom-k need the "
                                       "fingerprinter that --no-fingerprinter leaves out"),
    (["--threshold", "0"], "a fingerprinter for documents needs a threshold above 0, got 0.0"),
    (["--bottom-k", "0"], "bottom_k must be an int in 1..65536, got 0"),
])
def test_create_docs_bad_options_are_one_line(tmp_path, capsys, argv, message):
    status, out, err = run(capsys, "create", tmp_path / "x.ndx", *argv)
    assert status == 2 and out == "" and err == f"ndindex: error: {message}\n"
    assert not os.path.exists(tmp_path / "x.ndx")


# -- add ---------------------------------------------------------------------------


def test_add_docs_keys_files_by_path_and_skips_what_is_not_text(tmp_path, capsys):
    root = tmp_path / "notes"
    (root / "sub").mkdir(parents=True)
    texts = corpus(2, 6)
    for key, body in texts.items():
        (root / "sub" / f"{key}.txt").write_text(body)
    (root / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (root / "rule.txt").write_text("---- ==== ----\n")
    (root / "utf16.txt").write_bytes(texts["doc00"].encode("utf-16"))
    ix = tmp_path / "d.ndx"
    run(capsys, "create", ix, "--docs")
    status, out, err = run(capsys, "add", ix, "--docs", f"{root}/./", "--json")
    assert status == 0 and json.loads(out) == {"added": 7, "skipped": 2, "invalid": 0,
                                               "fingerprints": 6}
    assert err.splitlines() == [f"ndindex: {root}/./blob.bin: looks binary, skipped",
                                f"ndindex: {root / 'rule.txt'}: no words to fingerprint, skipped"]
    with ndindex.open(ix, readonly=True) as index:
        keys = sorted(key for key, _, _ in index.documents())
    assert keys == sorted([str(root / "sub" / f"{k}.txt") for k in texts]
                          + [str(root / "utf16.txt")])          # normalised paths
    status, out, _ = run(capsys, "similar", ix, "--key", root / "utf16.txt", "--json")
    assert status == 0 and json.loads(out)["matches"][0] == {
        "key": str(root / "sub" / "doc00.txt"), "similarity": 1.0,
        "fingerprint_hex": json.loads(out)["matches"][0]["fingerprint_hex"]}
    # a file added again under its key replaces its document
    (root / "utf16.txt").write_text(texts["doc01"])
    status, out, _ = run(capsys, "add", ix, "--docs", root / "utf16.txt")
    assert status == 0 and out == "added 1 document (6 distinct fingerprints in the index)\n"
    status, out, _ = run(capsys, "similar", ix, "--key", root / "utf16.txt", "--json")
    assert [m["key"] for m in json.loads(out)["matches"]][:1] == [str(root / "sub" / "doc01.txt")]
    # the text report counts the skipped and agrees in number
    lone = tmp_path / "lone.ndx"
    run(capsys, "create", lone, "--docs")
    status, out, _ = run(capsys, "add", lone, "--docs", root / "utf16.txt", root / "rule.txt")
    assert status == 0 and out == "added 1 document (1 distinct fingerprint in the index); " \
                                  "skipped 1 document\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_add_docs_skips_pipes_found_in_a_directory_and_reads_one_given_itself(tmp_path, capsys):
    root = tmp_path / "notes"
    root.mkdir()
    texts = corpus(3, 2)
    (root / "a.txt").write_text(texts["doc00"])
    os.mkfifo(root / "pipe.txt")                    # no writer: opening it would wait forever
    ix = tmp_path / "d.ndx"
    run(capsys, "create", ix, "--docs")
    # In a child, so that a regression fails the test instead of hanging it.
    done = subprocess.run([sys.executable, "-m", "ndindex", "add", str(ix), "--docs", str(root),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["added"] == 1
    assert done.stderr.splitlines() == [
        f"ndindex: {root / 'pipe.txt'}: not a regular file (a pipe, socket or device), skipped"]
    # A pipe named on the command line is read, as cat reads one.
    r, w = os.pipe()
    os.write(w, texts["doc01"].encode())
    os.close(w)
    try:
        status, out, _ = run(capsys, "add", ix, "--docs", f"/dev/fd/{r}", "--json")
    finally:
        os.close(r)
    assert status == 0 and json.loads(out)["added"] == 1
    with ndindex.open(ix, readonly=True) as index:
        assert sorted(key for key, _, _ in index.documents()) == [f"/dev/fd/{r}",
                                                                    str(root / "a.txt")]


def test_add_jsonl_reports_invalid_lines_and_adds_nothing(tmp_path, capsys, monkeypatch):
    ix = tmp_path / "d.ndx"
    run(capsys, "create", ix, "--docs")
    good = json.dumps({"key": "mail-1", "text": "Dear all, the meeting moves to Tuesday."})
    lines = "\n".join([good, "not json", '["a list"]', '{"key": "", "text": "x"}',
                       '{"key": "k", "txt": "typo"}', json.dumps({"key": "k" * 501, "text": "x"}),
                       '{"key": "k", "text": 3}', ""]) + "\n"
    status, out, err = run(capsys, "add", ix, "--jsonl", "-", stdin=lines, monkeypatch=monkeypatch)
    assert status == 2 and out == ""
    assert err.splitlines() == [
        "ndindex: <stdin>:2: not JSON (Expecting value at column 1)",
        'ndindex: <stdin>:3: not a JSON object: {"key": ..., "text": ...}, got list',
        'ndindex: <stdin>:4: "key" must be a non-empty string',
        "ndindex: <stdin>:5: unknown field 'txt' (fields: key, text)",
        'ndindex: <stdin>:6: "key" is 501 bytes of UTF-8, at most 500',
        'ndindex: <stdin>:7: "text" must be a string',
        "ndindex: <stdin>: 6 invalid lines; nothing added (--skip-invalid adds the valid ones)"]
    with ndindex.open(ix, readonly=True) as index:
        assert list(index.documents()) == []
    (tmp_path / "mail.jsonl").write_text(lines)
    status, out, _ = run(capsys, "add", ix, "--jsonl", tmp_path / "mail.jsonl", "--skip-invalid",
                         "--json")
    assert status == 0 and json.loads(out) == {"added": 1, "skipped": 0, "invalid": 6,
                                               "fingerprints": 1}


def test_add_jsonl_key_given_again_replaces_its_text(tmp_path, capsys, monkeypatch):
    ix = tmp_path / "d.ndx"
    run(capsys, "create", ix, "--docs")
    texts = corpus(3, 3)
    lines = "".join(json.dumps({"key": "k", "text": t}) + "\n" for t in texts.values())
    status, out, _ = run(capsys, "add", ix, "--jsonl", "-", stdin=lines, monkeypatch=monkeypatch)
    assert status == 0 and out.startswith("added 1 document ")
    with ndindex.open(ix, readonly=True) as index:
        assert [k for k, _, _ in index.documents()] == ["k"]
        assert index.similar(texts["doc02"])[0].key == "k"


@pytest.mark.parametrize("argv, message", [
    (["--docs", "a", "--jsonl", "-"], "give --docs or --jsonl, not both"),
    (["fps.txt", "--jsonl", "-"], "fps.txt: a fingerprint list, and --docs or --jsonl: give one"),
])
def test_add_documents_usage_errors(tmp_path, capsys, argv, message):
    ix = tmp_path / "d.ndx"
    run(capsys, "create", ix, "--docs")
    assert run(capsys, "add", ix, *argv) == (2, "", f"ndindex: error: {message}\n")


def test_add_documents_to_an_index_without_fingerprinter(tmp_path, capsys, monkeypatch):
    ix = tmp_path / "f.ndx"
    run(capsys, "create", ix, "--no-fingerprinter")
    status, out, err = run(capsys, "add", ix, "--jsonl", "-", stdin='{"key": "a", "text": "b"}\n',
                           monkeypatch=monkeypatch)
    assert status == 2 and out == ""
    assert err.startswith(f"ndindex: {ix}: this index stores fingerprints only") and \
        err.count("\n") == 1


# -- similar ---------------------------------------------------------------------------


def test_similar_text_key_and_file_agree_with_brute_force(docs, tmp_path, capsys):
    ix, texts = docs
    for threshold in (0.8, 0.9):
        truth = oracle_pairs(texts, threshold)
        for key, body in texts.items():
            want = sorted(((b if a == key else a), s) for (a, b), s in truth.items()
                          if key in (a, b))
            status, out, _ = run(capsys, "similar", ix, "--key", key, "--json",
                                 "--threshold", threshold)
            got = [(m["key"], m["similarity"]) for m in json.loads(out)["matches"]]
            assert sorted(k for k, _ in got) == [k for k, _ in want]
            assert all(abs(s - dict(want)[k]) < 1e-4 for k, s in got)
            assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
            assert status == (0 if want else 1)
    key = "doc05"
    (tmp_path / "q.txt").write_text(texts[key])
    by_file = json.loads(run(capsys, "similar", ix, tmp_path / "q.txt", "--json")[1])
    by_text = json.loads(run(capsys, "similar", ix, "--text", texts[key], "--json")[1])
    assert by_file["matches"] == by_text["matches"] and by_file["matches"][0]["key"] == key
    assert by_file["query"] == {"file": str(tmp_path / "q.txt")} and by_file["note"] is None
    assert by_text["query"] == {"text": texts[key]} and by_text["threshold"] == 0.8
    # --file PATH, as `ndindex query` takes a file, is FILE.
    assert json.loads(run(capsys, "similar", ix, "--file", tmp_path / "q.txt", "--json")[1]) == \
        by_file


def test_similar_checks_each_file_of_several_or_of_a_directory(docs, tmp_path, capsys):
    ix, texts = docs
    incoming = tmp_path / "incoming"
    (incoming / "sub").mkdir(parents=True)
    queries = {incoming / "a.txt": texts["doc03"],
               incoming / "sub" / "b.txt": texts["doc07"],
               incoming / "c.txt": " ".join(WORDS[:200])}          # like nothing stored
    for path, body in queries.items():
        path.write_text(body)
    (incoming / "d.bin").write_bytes(bytes(range(256)) * 4)
    want = {}
    for path, body in sorted(queries.items()):
        near = sorted((k for k, t in texts.items() if jaccard(body, t) >= 0.8),
                      key=lambda k: (-jaccard(body, texts[k]), k))
        if near:
            want[str(path)] = near
    assert 0 < len(want) < len(queries)
    status, out, err = run(capsys, "similar", ix, incoming, "--json")
    got = json.loads(out)
    assert status == 0 and err == f"ndindex: {incoming / 'd.bin'}: looks binary, skipped\n"
    assert (got["threshold"], got["checked"], got["matched"], got["skipped"]) == \
        (0.8, 3, len(want), 1)
    assert {f["file"]: sorted(m["key"] for m in f["matches"]) for f in got["files"]} == \
        {f: sorted(keys) for f, keys in want.items()}
    # The text: each file with a match, in the walk's order, then a count; no match is exit 1.
    status, out, _ = run(capsys, "similar", ix, incoming / "sub" / "b.txt", incoming / "a.txt")
    heads = [line for line in out.splitlines() if line.startswith("similar to ")]
    assert [h.split(" (")[0] for h in heads] == [
        f"similar to {p}" for p in (incoming / "sub" / "b.txt", incoming / "a.txt")
        if str(p) in want]
    assert out.splitlines()[-1] == f"checked 2 files: {len(heads)} with similar documents"
    status, out, _ = run(capsys, "similar", ix, incoming)
    assert out.splitlines()[-1] == \
        f"checked 3 files: {len(want)} with similar documents; skipped 1 file"
    status, out, _ = run(capsys, "similar", ix, incoming / "c.txt", incoming / "c.txt")
    assert status == 1 and out == "checked 2 files: 0 with similar documents\n"


def test_similar_text_output_limit_and_no_match(docs, capsys):
    ix, texts = docs
    status, out, err = run(capsys, "similar", ix, "--text", texts["doc00"], "--limit", "1")
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "similar to the text (threshold 0.8): 1 document"
    assert re.fullmatch(r"  1\.0000  doc00", lines[1]) and len(lines) == 2
    status, out, _ = run(capsys, "similar", ix, "--text", " ".join(WORDS[:200]))
    assert status == 1 and out == "similar to the text (threshold 0.8): 0 documents\n"


def test_similar_short_text_gets_a_note(docs, capsys):
    ix, _ = docs
    status, out, err = run(capsys, "similar", ix, "--text", "w1 w2 w3 w4 w5")
    assert status == 1
    assert err == ("ndindex: note: the text has 3 distinct word 3-shingles, fewer than 4: no "
                   "other text can reach similarity 0.8 with it, so it matches only texts of "
                   "the same words\n")
    status, out, err = run(capsys, "similar", ix, "--text", "!!!", "--json")
    assert json.loads(out)["note"] == "the text has no words to compare: no document can match it"


def test_similar_errors_are_one_line(docs, tmp_path, capsys):
    ix, _ = docs
    (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 4)
    for argv, line in [
            (["--key", "nope"], f"ndindex: {ix}: no document has the key 'nope'"),
            ([tmp_path / "b.bin"], f"ndindex: {tmp_path / 'b.bin'}: looks binary; "
                                   "documents must be text"),
            ([tmp_path / "missing.txt"], f"ndindex: {tmp_path / 'missing.txt'}: No such file or "
                                         "directory"),
            (["--text", "a", "--threshold", "0.5"],
             "ndindex: error: threshold 0.5 is below 0.8, the lowest this index's lookup keys "
             "were designed for; create the index with a fingerprinter of a lower threshold"),
            (["--text", "a", "--limit", "0"], None)]:
        status, out, err = run(capsys, "similar", ix, *argv)
        assert status == 2 and out == "" and err.count("\n") == 1
        assert line is None or err == line + "\n"
    status, out, err = run(capsys, "similar", tmp_path / "none.ndx", "--text", "a")
    assert status == 2 and err == f"ndindex: {tmp_path / 'none.ndx'}: no such index\n"


# -- pairs and clusters ----------------------------------------------------------------


def test_pairs_and_clusters_agree_with_brute_force(docs, capsys):
    ix, texts = docs
    for threshold in ("0.8", "0.9"):
        truth = oracle_pairs(texts, float(threshold))
        status, out, _ = run(capsys, "pairs", ix, "--json", "--threshold", threshold)
        got = {tuple(sorted((p["a"], p["b"]))): p["similarity"] for p in json.loads(out)["pairs"]}
        assert status == 0 and set(got) == set(truth)
        assert all(abs(got[p] - truth[p]) < 1e-4 for p in got)
        names = sorted(texts)
        where = {k: i for i, k in enumerate(names)}
        want = [sorted(names[i] for i in c) for c in clusters_from_pairs(
            len(names), [where[a] for a, _ in truth], [where[b] for _, b in truth])]
        status, out, _ = run(capsys, "clusters", ix, "--json", "--threshold", threshold)
        doc = json.loads(out)
        assert status == 0 and doc["threshold"] == float(threshold)
        assert sorted(sorted(c) for c in doc["clusters"]) == sorted(want)
        assert [len(c) for c in doc["clusters"]] == sorted((len(c) for c in want), reverse=True)
    status, out, _ = run(capsys, "clusters", ix, "--min-size", "1", "--json")
    assert sum(len(c) for c in json.loads(out)["clusters"]) == len(texts)


def test_pairs_and_clusters_text_output(docs, capsys):
    ix, texts = docs
    truth = oracle_pairs(texts, 0.8)
    status, out, _ = run(capsys, "pairs", ix)
    lines = out.splitlines()
    assert status == 0 and lines[-1] == f"{len(truth)} pairs at similarity >= 0.8."
    shown = {(s, frozenset((a, b))) for s, a, b in (line.split("  ") for line in lines[:-1])}
    assert shown == {(f"{s:.4f}", frozenset(pair)) for pair, s in truth.items()}
    status, out, _ = run(capsys, "clusters", ix)
    blocks = out.split("\n\n")
    assert blocks[0].splitlines()[0].startswith("cluster 1: ")
    members = sum(len(b.splitlines()) - 1 for b in blocks[:-1])
    assert blocks[-1] == f"{len(blocks) - 1} clusters of {members} documents at similarity >= 0.8.\n"


def test_every_document_command_has_help_with_examples(capsys):
    for command in ("similar", "pairs", "clusters", "create", "add"):
        status, out, _ = run(capsys, command, "--help")
        assert status == 0 and "examples:\n" in out and "exit status:" in out


# -- the docs page's example -----------------------------------------------------------


def test_documents_page_index_example_runs(tmp_path):
    """docs/documents.md's index section: its python and shell examples run as written."""
    text = (ROOT / "docs" / "documents.md").read_text()
    section = text[text.index("## In an index"):text.index("## Method")]
    python = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    shell = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    assert python and shell
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    (tmp_path / "example.py").write_text("\n".join(python))
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for command in "".join(shell).splitlines():
        if command.strip() and not command.startswith("#"):
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode in (0, 1), f"{command}\n{done.stderr}"
