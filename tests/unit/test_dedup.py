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
    assert result.skipped == {"binary": 3, "too small": 1}
    assert result.files_scanned == result.files_read == 10   # each file in one category
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
    assert plain.skipped == {"symlink": 3, "special": 1} and plain.links == {}
    assert [names(c) for c in plain.clusters] == [["a.txt", "b.txt"]]
    followed = ndindex.dedup([root], index=tmp_path / "2.ndx", follow_symlinks=True)
    # the loop and link.txt are links to a directory and a file counted
    # under their real names; only the broken one is skipped
    assert followed.links == {"symlink": 2}
    assert followed.skipped == {"broken symlink": 1, "special": 1}
    assert [names(c) for c in followed.clusters] == [["a.txt", "b.txt"]]
    a = next(f for f in followed.clusters[0].files if f.path.endswith("a.txt"))
    assert a.links == ((str(root / "y" / "link.txt"), "symlink"),)


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
    assert doc["files_scanned"] == 10 and doc["files_read"] == 10 and doc["files_unchanged"] == 0
    assert doc["skipped"] == {"binary": 3, "too small": 1} and doc["errors"] == []
    assert doc["duplicate_files"] == 5
    first = doc["clusters"][0]
    assert first["id"] == 1 and first["kind"] == "near" and len(first["files"]) == 5
    f0 = first["files"][0]
    assert set(f0) == {"path", "size", "content_hash", "simhash", "representative", "links"}
    assert f0["representative"] is True and f0["links"] == []
    # the representative is the largest file (reflow.txt doubles every space)
    assert f0["path"] == str(tree / "c" / "reflow.txt")
    assert f0["size"] == max(f["size"] for f in first["files"])
    assert [f["path"] for f in first["files"][1:]] == sorted(f["path"] for f in first["files"][1:])
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
    assert err2 == "" and doc2["files_read"] == 0 and doc2["files_unchanged"] == 10
    assert doc2["skipped"] == doc["skipped"]                 # the same categories again
    assert doc2["clusters"] == doc["clusters"]


def test_cli_dedup_csv_and_text(tree, tmp_path, capsys):
    assert main(["dedup", str(tree), "--index", str(tmp_path / "ix.ndx"), "--csv", "-q"]) == 1
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == ("cluster,kind,path,size,content_hash,simhash,representative,"
                       "distance_to_representative,similarity_to_representative,links")
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


# -- links, reuse of an index, interruption (issue 11) ----------------------------


def licenses_like(root):
    """Two near-duplicates and symlinks that sort before their targets."""
    write(root / "DOC-1.2", text(20))
    words = text(20).split(" ")
    for i in (10, 100, 250):
        words[i] = "revised"
    write(root / "DOC-1.3", " ".join(words) + "\nan added closing line of the newer version\n")
    os.symlink("DOC-1.3", root / "DOC")
    write(root / "OTHER-2", text(21))
    os.symlink("OTHER-2", root / "OTHER")


def test_symlinks_keep_the_real_name_and_runs_with_and_without_follow_agree(tmp_path):
    root = tmp_path / "lic"
    licenses_like(root)
    ix = tmp_path / "ix.ndx"
    runs = [ndindex.dedup([root], index=ix, follow_symlinks=follow)
            for follow in (False, True, False, True)]
    for r in runs:
        assert [[os.path.basename(f.path) for f in c.files] for c in r.clusters] == \
            [["DOC-1.3", "DOC-1.2"]]
        assert r.files_scanned == 3 and r.files_removed == 0
    assert runs[0].files_read == 3 and all(r.files_read == 0 for r in runs[1:])
    assert runs[0].skipped == {"symlink": 2} and runs[0].links == {}
    assert runs[1].skipped == {} and runs[1].links == {"symlink": 2}
    assert runs[1].clusters[0].files[0].links == ((str(root / "DOC"), "symlink"),)
    assert runs[0].clusters[0].files[0].links == ()


def test_hard_links_are_listed_as_links_not_copies(tmp_path, capsys):
    root = tmp_path / "t"
    write(root / "b.txt", text(22))
    write(root / "c.txt", text(22))
    os.link(root / "b.txt", root / "a-hard.txt")      # sorts first: the real name it keeps
    result = ndindex.dedup([root], index=tmp_path / "ix.ndx")
    assert result.links == {"hard link": 1} and result.files_scanned == 2
    [cluster] = result.clusters
    assert [os.path.basename(f.path) for f in cluster.files] == ["a-hard.txt", "c.txt"]
    assert cluster.files[0].links == ((str(root / "b.txt"), "hard link"),)
    assert cluster.reclaimable_bytes == len(text(22))   # c.txt; the hard link frees nothing
    assert main(["dedup", str(root), "--index", str(tmp_path / "ix.ndx"), "-q"]) == 1
    out = capsys.readouterr().out
    assert f"also {root / 'b.txt'} (hard link, not a copy)" in out
    assert "1 hard link to files or directories already counted (links, not copies)" in out


def test_one_index_for_other_paths_forgets_only_files_gone_from_disk(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write(a / "1.txt", text(30))
    write(a / "2.txt", text(30))
    write(b / "3.txt", text(31))
    write(b / "4.txt", text(31))
    ix = tmp_path / "ix.ndx"
    first = ndindex.dedup([a], index=ix)
    second = ndindex.dedup([b], index=ix)
    assert second.files_removed == 0 and second.files_read == 2
    assert [names(c) for c in second.clusters] == [["3.txt", "4.txt"]]   # only its paths
    again = ndindex.dedup([a], index=ix)
    assert again.files_read == 0 and again.files_unchanged == 2      # remembered, not re-read
    assert [names(c) for c in again.clusters] == [names(c) for c in first.clusters]
    os.unlink(a / "2.txt")
    third = ndindex.dedup([b], index=ix)                  # a file outside the paths is gone
    assert third.files_removed == 1 and third.files_read == 0
    index_keys_cover_state(ix)
    with ndindex.open(ix, readonly=True) as index:
        keys = {k for fp in index.fingerprints() for k in index.keys(int(fp))}
    assert keys == {str(a / "1.txt"), str(b / "3.txt"), str(b / "4.txt")}


def test_interrupted_run_keeps_what_it_stored_each_second(tree, tmp_path, monkeypatch):
    ix = tmp_path / "ix.ndx"
    ticks = iter(range(0, 10**6, 2))          # every look at the clock: two seconds later
    monkeypatch.setattr(dedup_module, "_clock", lambda: next(ticks), raising=False)
    examined = []
    real = dedup_module._examine

    def examine_then_interrupt(item, opts):
        if len(examined) == 5:
            raise KeyboardInterrupt
        examined.append(item)
        return real(item, opts)

    monkeypatch.setattr(dedup_module, "_examine", examine_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        ndindex.dedup([tree], index=ix)           # BATCH_FILES (2048) is far away
    monkeypatch.undo()
    resumed = ndindex.dedup([tree], index=ix)
    # the five files examined before Ctrl-C were kept: three texts, two binaries
    assert resumed.files_unchanged == 3 and resumed.files_read == resumed.files_scanned - 3
    fresh = ndindex.dedup([tree], index=tmp_path / "fresh.ndx")
    assert [names(c) for c in resumed.clusters] == [names(c) for c in fresh.clusters]
    index_keys_cover_state(ix)


# -- what is text: charsets, compression, binary and undecodable --------------------


LATIN = ("Le cœur déçu mais l'âme plutôt naïve, Louÿs rêva de crapaüter en canoë au delà "
         "des îles, près du mälström où brûlent les novæ. ")


def french(seed: int) -> str:
    rng = random.Random(seed)
    words = LATIN.split()
    return "\n".join(" ".join(rng.choice(words) + str(rng.randrange(300)) for _ in range(12))
                     for _ in range(40)) + "\n"


def test_latin1_utf16_and_utf8_copies_of_one_text_are_near_duplicates(tmp_path):
    root = tmp_path / "t"
    body = french(1).replace("œ", "oe").replace("æ", "ae")   # Latin-1 has no œ or æ
    write(root / "utf8.txt", body.encode("utf-8"))
    write(root / "latin1.txt", body.encode("latin-1"))
    write(root / "utf16.txt", body.encode("utf-16"))
    write(root / "utf16le-no-bom.txt", body.encode("utf-16-le"))
    result = ndindex.dedup([root], index=tmp_path / "ix.ndx")
    assert result.skipped == {} and result.files_scanned == 4
    [cluster] = result.clusters
    assert names(cluster) == ["latin1.txt", "utf16.txt", "utf16le-no-bom.txt", "utf8.txt"]
    assert len({f.simhash for f in cluster.files}) == 1          # one text, four encodings
    assert all(p.similarity == 1.0 and not p.exact for p in cluster.pairs)


def test_compressed_text_is_read_through_its_decompressor(tmp_path, capsys):
    import bz2
    import gzip
    import lzma

    import zstandard
    root = tmp_path / "t"
    body = text(40).encode()
    write(root / "plain.txt", body)
    write(root / "notes.txt.gz", gzip.compress(body))
    write(root / "notes.bz2", bz2.compress(body))
    write(root / "notes.xz", lzma.compress(body))
    write(root / "notes.zst", zstandard.ZstdCompressor().compress(body))
    write(root / "page.html.gz", gzip.compress(b"<html><body><p>" + body + b"</p></body></html>"))
    write(root / "broken.gz", gzip.compress(body)[:-30])
    write(root / "archive.tar.gz", gzip.compress(body))          # a tarball: binary by name
    result = ndindex.dedup([root], index=tmp_path / "ix.ndx")
    assert [names(c) for c in result.clusters] == [
        ["notes.bz2", "notes.txt.gz", "notes.xz", "notes.zst", "page.html.gz", "plain.txt"]]
    assert result.skipped == {"binary": 1}
    assert [(os.path.basename(p), e.startswith("corrupt .gz data")) for p, e in result.errors] \
        == [("broken.gz", True)]
    off = ndindex.dedup([root], index=tmp_path / "off.ndx", decompress=False)
    assert off.skipped == {"binary": 7} and off.clusters == []
    assert main(["dedup", str(root), "--index", str(tmp_path / "cli.ndx"), "-q",
                 "--no-decompress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == {"binary": 7}


def test_decompression_is_bounded_by_max_size(tmp_path, monkeypatch):
    import gzip
    root = tmp_path / "t"
    write(root / "bomb.txt.gz", gzip.compress(b"a " * (8 << 20)))       # 16 MiB of text
    write(root / "small.txt.gz", gzip.compress(text(41).encode()))
    sizes = []
    real = dedup_module.textfile.decode
    monkeypatch.setattr(dedup_module.textfile, "decode",
                        lambda data: sizes.append(len(data)) or real(data))
    result = ndindex.dedup([root], index=tmp_path / "ix.ndx", max_size=1 << 20)
    assert result.skipped == {"too large": 1} and result.files_read == 1
    assert sizes == [len(text(41))]                # the bomb never reached the decoder


def test_undecodable_text_is_counted_apart_from_binary(tmp_path):
    root = tmp_path / "t"
    write(root / "bom-but-latin1.txt", b"\xef\xbb\xbf" + french(2).encode("latin-1", "replace"))
    write(root / "nul.dat", b"\0\1\2\3" * 500)
    write(root / "ok.txt", text(42))
    first = ndindex.dedup([root], index=tmp_path / "ix.ndx")
    assert first.skipped == {"undecodable": 1, "binary": 1} and first.files_scanned == 1
    again = ndindex.dedup([root], index=tmp_path / "ix.ndx")
    assert again.skipped == first.skipped and again.files_read == 0


def test_k_outside_the_planner_range_has_one_message(tmp_path, capsys):
    write(tmp_path / "t" / "a.txt", text(1))
    for k in ("65", "20", "-1"):
        assert main(["dedup", str(tmp_path / "t"), "-k", k, "-q",
                     "--index", str(tmp_path / f"{k}.ndx")]) == 2
        assert capsys.readouterr().err == f"ndindex: error: k must be in 0..12, got {k}\n"


def test_a_cluster_prints_once_with_its_representative(tmp_path, capsys):
    root = tmp_path / "t"
    for i in range(14):
        write(root / f"copy{i:02d}.txt", text(50))
    assert main(["dedup", str(root), "--index", str(tmp_path / "ix.ndx"), "-q"]) == 1
    out = capsys.readouterr().out.splitlines()
    files = [line for line in out if line.endswith("(identical)") or line.startswith("  *")]
    assert out[0] == f"cluster 1: 14 identical files, {14 * len(text(50)) / 1024:.1f} KiB, " \
                     f"{13 * len(text(50)) / 1024:.1f} KiB in exact copies"
    assert len(files) == 14 and out[1].startswith("  *") and out[1].endswith("copy00.txt")
    assert not any("]-[" in line for line in out)          # no pair lines
    assert main(["dedup", str(root), "--index", str(tmp_path / "ix.ndx"), "-q", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["clusters"][0]["pairs"]) == 91           # every pair, for a program


def test_state_on_a_read_only_disk_is_a_read_only_error(tmp_path, monkeypatch, capsys):
    import sqlite3
    write(tmp_path / "t" / "a.txt", text(1))
    ix = tmp_path / "ix.ndx"
    sqlite3.connect(str(ix) + ".files").close()
    real = sqlite3.connect
    # SQLite's own answer on a file it may not write
    monkeypatch.setattr(dedup_module.sqlite3, "connect",
                        lambda path, **kw: real(f"file:{path}?mode=ro", uri=True, **kw))
    with pytest.raises(ndindex.ReadOnlyError, match="cannot write the dedup state file"):
        ndindex.dedup([tmp_path / "t"], index=ix)
    assert main(["dedup", str(tmp_path / "t"), "--index", str(ix), "-q"]) == 2
    err = capsys.readouterr().err
    assert err == (f"ndindex: {ix}.files: cannot write the dedup state file (not writable); "
                   "give an --index on a writable disk\n")


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
