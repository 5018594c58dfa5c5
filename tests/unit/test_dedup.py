"""End-to-end tests of the dedup job on temporary trees with planted duplicates."""

from __future__ import annotations

import importlib
import json
import os
import random

import numpy as np
import pytest

import ndindex
from ndindex.cli import main
from ndindex.fingerprint import Fingerprinter

dedup_module = importlib.import_module("ndindex.dedup")

WORDS = ("river stone market paper garden window silver engine letter season harbor "
         "village signal lantern pocket thunder violet meadow copper ribbon castle "
         "mirror feather orchard candle basket compass anchor tunnel ladder blanket").split()


def text(seed: int, words: int = 400) -> str:
    rng = random.Random(seed)
    out = [f"{rng.choice(WORDS)}{rng.randrange(500)}" for _ in range(words)]
    return "\n".join(" ".join(out[i:i + 12]) for i in range(0, len(out), 12)) + "\n"


def write(path, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w") as fh:
        fh.write(data)


@pytest.fixture
def tree(tmp_path):
    """A tree with exact, near and boilerplate-sharing files, a binary and a non-UTF-8 name."""
    root = tmp_path / "tree"
    base = text(1)
    write(root / "a" / "original.txt", base)
    write(root / "b" / "copy.txt", base)                                   # exact
    words = base.split(" ")
    for i in (20, 90, 200):
        words[i] = "changed"
    write(root / "b" / "edited.md", " ".join(words))                        # a few words
    write(root / "c" / "header.txt", "Copyright 2024 Example Ltd.\n\n" + base + "\n-- end --\n")
    write(root / "c" / "reflow.txt", "  ".join(base.split()) + "\n")        # white space
    boiler = "This file is part of the project and is licensed under the terms of the MIT license. " * 3
    write(root / "d" / "one.py", boiler + text(2))                          # share boilerplate only
    write(root / "d" / "two.py", boiler + text(3))
    write(root / "d" / "other.txt", text(4))
    write(root / "bin" / "blob.dat", bytes(range(256)) * 8)
    write(root / "bin" / "blob-copy.dat", bytes(range(256)) * 8)
    write(root / "bin" / "image.png", b"\x89PNG" + bytes(500))
    write(root / "empty.txt", "")
    name = os.path.join(os.fsencode(str(root / "d")), b"caf\xe9-notes.txt")
    with open(name, "wb") as fh:
        fh.write(text(5).encode())
    with open(os.path.join(os.fsencode(str(root / "d")), b"caf\xe9-copy.txt"), "wb") as fh:
        fh.write(text(5).encode())
    return root


def names(cluster) -> list:
    return sorted(os.path.basename(os.fsencode(f.path)).decode("utf-8", "backslashreplace")
                  for f in cluster.files)


def test_dedup_finds_planted_exact_and_near_duplicates(tree, tmp_path):
    result = ndindex.dedup([tree], index=tmp_path / "ix.ndx")
    groups = [names(c) for c in result.clusters]
    assert ["copy.txt", "edited.md", "header.txt", "original.txt", "reflow.txt"] in groups
    assert ["caf\\xe9-copy.txt", "caf\\xe9-notes.txt"] in groups
    assert len(groups) == 2                          # boilerplate sharers stay apart
    big = result.clusters[0]
    assert big.kind == "near" and len(big.pairs) == 10
    exact = [p for p in big.pairs if p.exact]
    assert len(exact) == 1 and exact[0].distance == 0 and exact[0].similarity == 1.0
    assert all(p.similarity >= 0.8 and p.distance <= 10 for p in big.pairs)
    assert result.skipped["binary"] == 3 and result.skipped["too small"] == 1
    assert result.errors == []


def test_include_binary_reports_identical_binaries(tree, tmp_path):
    result = ndindex.dedup([tree], index=tmp_path / "ix.ndx", include_binary=True)
    groups = [names(c) for c in result.clusters]
    assert ["blob-copy.dat", "blob.dat"] in groups
    blob = next(c for c in result.clusters if names(c) == ["blob-copy.dat", "blob.dat"])
    assert blob.kind == "exact" and blob.pairs[0].distance is None
    assert blob.reclaimable_bytes == 2048


def test_second_run_reads_nothing_and_sees_changes(tree, tmp_path, monkeypatch):
    ix = tmp_path / "ix.ndx"
    first = ndindex.dedup([tree], index=ix)
    reads = []
    real = dedup_module._read_file
    monkeypatch.setattr(dedup_module, "_read_file", lambda p, *a: reads.append(p) or real(p, *a))
    second = ndindex.dedup([tree], index=ix)
    assert reads == [] and second.files_read == 0
    assert second.files_unchanged == first.files_scanned
    assert [names(c) for c in second.clusters] == [names(c) for c in first.clusters]
    # a changed file is read again; a deleted one leaves index and clusters
    os.unlink(tree / "b" / "copy.txt")
    write(tree / "d" / "other.txt", text(1))        # now an exact copy of original.txt
    third = ndindex.dedup([tree], index=ix)
    assert [os.path.basename(p) for p in reads] == [b"other.txt"]
    assert third.files_removed == 1 and third.files_read == 1
    assert "other.txt" in names(third.clusters[0]) and "copy.txt" not in names(third.clusters[0])
    with ndindex.open(ix, readonly=True) as index:
        keys = {k for fp in index.fingerprints() for k in index.keys(int(fp))}
    assert str(tree / "b" / "copy.txt") not in keys and str(tree / "d" / "other.txt") in keys
    index_keys_cover_state(ix)


def index_keys_cover_state(ix) -> None:
    """Every text row of the state is keyed in the index, and nothing else is."""
    import sqlite3
    db = sqlite3.connect(str(ix) + ".files")
    rows = {dedup_module.index_key(bytes(p)) for (p,) in
            db.execute("SELECT path FROM files WHERE kind = 0")}
    db.close()
    with ndindex.open(ix, readonly=True) as index:
        keys = {k for fp in index.fingerprints() for k in index.keys(int(fp))}
        index.verify()
    assert rows == keys


def test_interrupted_run_leaves_consistent_files_and_resumes(tree, tmp_path, monkeypatch):
    ix = tmp_path / "ix.ndx"
    monkeypatch.setattr(dedup_module, "BATCH_FILES", 2)
    calls = []
    real_add = ndindex.Index.add

    def add_then_interrupt(self, *a, **kw):
        out = real_add(self, *a, **kw)
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt     # after the index commit, before the state commit
        return out

    monkeypatch.setattr(ndindex.Index, "add", add_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        ndindex.dedup([tree], index=ix)
    monkeypatch.setattr(ndindex.Index, "add", real_add)
    resumed = ndindex.dedup([tree], index=ix)
    assert 0 < resumed.files_read < resumed.files_scanned     # the first batch was kept
    fresh = ndindex.dedup([tree], index=tmp_path / "fresh.ndx")
    assert [names(c) for c in resumed.clusters] == [names(c) for c in fresh.clusters]
    index_keys_cover_state(ix)


def test_symlink_loops_and_special_files(tmp_path):
    root = tmp_path / "t"
    write(root / "x" / "a.txt", text(7))
    write(root / "y" / "b.txt", text(7))
    os.symlink(root, root / "x" / "loop")
    os.symlink(root / "x" / "a.txt", root / "y" / "link.txt")
    os.symlink(root / "missing", root / "y" / "broken")
    os.mkfifo(root / "y" / "fifo")
    plain = ndindex.dedup([root], index=tmp_path / "1.ndx")
    assert plain.skipped["symlink"] == 3 and plain.skipped["special"] == 1
    assert [names(c) for c in plain.clusters] == [["a.txt", "b.txt"]]
    followed = ndindex.dedup([root], index=tmp_path / "2.ndx", follow_symlinks=True)
    assert followed.skipped["symlink loop"] == 1 and followed.skipped["hard link"] == 1
    assert followed.skipped["broken symlink"] == 1
    assert [names(c) for c in followed.clusters] == [["a.txt", "b.txt"]]


def test_unreadable_files_are_reported_and_skipped(tmp_path):
    root = tmp_path / "t"
    write(root / "a.txt", text(8))
    write(root / "b.txt", text(8))
    write(root / "locked" / "c.txt", text(8))
    os.chmod(root / "a.txt", 0)
    os.chmod(root / "locked", 0)
    try:
        if os.access(root / "a.txt", os.R_OK):
            pytest.skip("running as root: chmod 000 does not block reads")
        result = ndindex.dedup([root], index=tmp_path / "ix.ndx")
    finally:
        os.chmod(root / "a.txt", 0o644)
        os.chmod(root / "locked", 0o755)
    problems = dict(result.errors)
    assert "Permission denied" in problems[str(root / "a.txt")]
    assert "Permission denied" in problems[str(root / "locked")]
    assert result.clusters == []


def test_file_changing_while_read_is_skipped(tree, tmp_path, monkeypatch):
    def always_changing(path, *a):
        raise dedup_module._Changed("changed while being read")
    monkeypatch.setattr(dedup_module, "_read_file", always_changing)
    result = ndindex.dedup([tree], index=tmp_path / "ix.ndx")
    assert result.clusters == [] and result.files_read == 0
    assert all(e == "changed while being read" for _, e in result.errors)
    monkeypatch.undo()
    again = ndindex.dedup([tree], index=tmp_path / "ix.ndx")   # read on the next run
    assert again.files_read > 0 and len(again.clusters) == 2


def test_parallel_jobs_give_the_same_clusters(tree, tmp_path, monkeypatch):
    monkeypatch.setattr(dedup_module, "BATCH_FILES", 4)
    one = ndindex.dedup([tree], index=tmp_path / "1.ndx", jobs=1)
    two = ndindex.dedup([tree], index=tmp_path / "2.ndx", jobs=2)
    assert [names(c) for c in one.clusters] == [names(c) for c in two.clusters]


def test_jaccard_many_equals_similarity():
    fp = Fingerprinter()
    rng = np.random.default_rng(3)
    sketches = []
    for i in range(200):
        pool = rng.choice(1 << 20, 400, replace=False).astype(np.uint32)
        keep = pool[rng.random(400) < rng.uniform(0.5, 1.0)]
        sketches.append(np.unique(keep)[:rng.integers(0, 257)])
    left = rng.integers(0, 200, 2000)
    right = np.where(rng.random(2000) < 0.3, (left + 1) % 200, rng.integers(0, 200, 2000))
    got = dedup_module.jaccard_many(dedup_module.sketch_matrix(sketches), left, right, fp.bottom_k)
    want = [fp.similarity(sketches[a], sketches[b]) for a, b in zip(left, right)]
    assert np.array_equal(got, want)


def test_cli_dedup_json_field_by_field(tree, tmp_path, capsys):
    status = main(["dedup", str(tree), "--index", str(tmp_path / "ix.ndx"), "--json"])
    out, err = capsys.readouterr()
    assert status == 1 and err.startswith("ndindex: index ")
    doc = json.loads(out)
    assert doc["index"] == str(tmp_path / "ix.ndx")
    assert doc["files_scanned"] == 12 and doc["files_read"] == 12 and doc["files_unchanged"] == 0
    assert doc["skipped"] == {"binary": 3, "too small": 1} and doc["errors"] == []
    assert doc["duplicate_files"] == 5
    first = doc["clusters"][0]
    assert first["id"] == 1 and first["kind"] == "near" and len(first["files"]) == 5
    f0 = first["files"][0]
    assert set(f0) == {"path", "size", "content_hash", "simhash"}
    assert f0["path"] == str(tree / "a" / "original.txt") and f0["size"] == len(text(1))
    assert len(f0["content_hash"]) == 32 and f0["simhash"].startswith("0x")
    assert first["reclaimable_bytes"] == len(text(1))
    assert {tuple(sorted(p)) for p in first["pairs"]} == {("a", "b", "distance", "exact",
                                                            "similarity")}
    bad = doc["clusters"][1]["files"]
    assert bad[0]["path"].endswith("caf\\xe9-copy.txt")
    assert bytes.fromhex(bad[0]["path_bytes_hex"]).endswith(b"caf\xe9-copy.txt")
    # a second run: nothing read, same clusters
    main(["dedup", str(tree), "--index", str(tmp_path / "ix.ndx"), "--json", "-q"])
    out2, err2 = capsys.readouterr()
    doc2 = json.loads(out2)
    assert err2 == "" and doc2["files_read"] == 0 and doc2["files_unchanged"] == 12
    assert doc2["clusters"] == doc["clusters"]


def test_cli_dedup_csv_and_text(tree, tmp_path, capsys):
    assert main(["dedup", str(tree), "--index", str(tmp_path / "ix.ndx"), "--csv", "-q"]) == 1
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == ("cluster,kind,path,size,content_hash,simhash,distance_to_first,"
                       "similarity_to_first")
    assert len(rows) == 1 + 5 + 2 and rows[1].startswith("1,near,")
    assert main(["dedup", str(tree), "--index", str(tmp_path / "ix.ndx"), "-q"]) == 1
    out = capsys.readouterr().out
    assert "cluster 1: 5 near-duplicates" in out and "identical" in out
    assert "2 clusters, 6 duplicate files" not in out and "2 clusters, 5 duplicate files" in out


def test_cli_dedup_no_duplicates_exits_0_and_default_index(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write(tmp_path / "t" / "a.txt", text(10))
    assert main(["dedup", str(tmp_path / "t")]) == 0
    out, err = capsys.readouterr()
    expected = dedup_module.default_index_path([str(tmp_path / "t")])
    assert expected.startswith(str(tmp_path / "cache" / "ndindex" / "dedup-"))
    assert err == f"ndindex: index {expected}\n" and "no duplicates." in out
    assert os.path.exists(expected) and os.path.exists(expected + ".files")


def test_cli_dedup_errors_are_one_line(tmp_path, capsys):
    assert main(["dedup", str(tmp_path / "missing"), "--index", str(tmp_path / "i.ndx")]) == 2
    err = capsys.readouterr().err
    assert err == f"ndindex: {tmp_path / 'missing'}: No such file or directory\n"
    write(tmp_path / "other.ndx", "not an index")
    write(tmp_path / "t" / "a.txt", text(1))
    assert main(["dedup", str(tmp_path / "t"), "--index", str(tmp_path / "other.ndx"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "other.ndx" in err and "state file" in err


def test_index_of_another_fingerprinter_is_rebuilt(tree, tmp_path, monkeypatch):
    ix = tmp_path / "ix.ndx"
    first = ndindex.dedup([tree], index=ix)
    import dataclasses

    @dataclasses.dataclass(frozen=True, eq=False)
    class Other(Fingerprinter):
        threshold: float = 0.7

    other = Other()
    monkeypatch.setattr(dedup_module, "Fingerprinter", Other)
    again = ndindex.dedup([tree], index=ix)
    assert again.files_read == first.files_read          # everything read again
    with ndindex.open(ix, readonly=True) as index:
        assert index.fingerprinter == other.to_bytes()


def test_index_of_the_same_pipeline_without_flip_model_is_kept(tree, tmp_path, monkeypatch):
    """An index written before the flip model existed (a version-1 record) is
    the same pipeline: the flip model only orders probes, so nothing is re-read."""
    import dataclasses

    @dataclasses.dataclass(frozen=True, eq=False)
    class Before(Fingerprinter):
        flip_model: object = None

    ix = tmp_path / "ix.ndx"
    monkeypatch.setattr(dedup_module, "Fingerprinter", Before)
    first = ndindex.dedup([tree], index=ix)
    with ndindex.open(ix, readonly=True) as index:
        assert index.fingerprinter[4:6] == b"\x01\x00"    # a version-1 record
    monkeypatch.undo()
    again = ndindex.dedup([tree], index=ix)
    assert first.files_read > 0 and again.files_read == 0
