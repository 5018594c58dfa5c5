"""End-to-end tests of the dedup job on temporary trees with planted duplicates."""

from __future__ import annotations

import importlib
import json
import os
import random

import pytest

import ndindex
from ndindex.cli import main
from ndindex.fingerprint import Fingerprinter
from tests.killing import killed_at

dedup_module = importlib.import_module("ndindex.dedup")
dedup_files = importlib.import_module("ndindex.dedup_files")

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
    real = dedup_files._read_file
    monkeypatch.setattr(dedup_files, "_read_file", lambda p, *a: reads.append(p) or real(p, *a))
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
    keys = file_keys(ix)
    assert str(tree / "b" / "copy.txt") not in keys and str(tree / "d" / "other.txt") in keys
    index_keys_cover_state(ix)


def index_keys_cover_state(ix) -> None:
    """The index holds what the job remembers, consistently (check_index), and
    nothing beside it: no state file."""
    dedup_module.check_index(ix)
    base = os.path.basename(ix)
    beside = sorted(n for n in os.listdir(os.path.dirname(ix)) if n.startswith(base))
    assert beside in ([base], [base, base + "-lock"])       # LMDB's lock file, nothing else


def file_keys(ix) -> set:
    """The paths the index remembers (its file records)."""
    with ndindex.open(ix, readonly=True) as index:
        return {key for key, _, _ in index.documents()
                if not (isinstance(key, bytes) and key[:1] in (b"\x01", b"\x02"))}


def test_interrupted_run_leaves_consistent_files_and_resumes(tree, tmp_path, monkeypatch):
    ix = tmp_path / "ix.ndx"
    monkeypatch.setattr(dedup_module, "BATCH_FILES", 2)
    calls = []
    real_add = ndindex.Index.add_documents

    def add_then_interrupt(self, *a, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt     # inside a batch's transaction, after an add
        return real_add(self, *a, **kw)

    monkeypatch.setattr(ndindex.Index, "add_documents", add_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        ndindex.dedup([tree], index=ix)
    monkeypatch.setattr(ndindex.Index, "add_documents", real_add)
    index_keys_cover_state(ix)                   # the batch in flight left nothing behind
    resumed = ndindex.dedup([tree], index=ix)
    assert 0 < resumed.files_unchanged < resumed.files_scanned   # the first batch was kept
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
        raise dedup_files._Changed("changed while being read")
    monkeypatch.setattr(dedup_files, "_read_file", always_changing)
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


def test_parallel_workers_are_not_forked_from_the_caller(tree, tmp_path, monkeypatch):
    # Enough files for two workers (64 a worker at least).  The caller may
    # hold threads (an open Index's compaction thread) that a forked worker
    # would inherit mid-step: the workers start from a fork server or spawn.
    for i in range(10, 150):
        write(tree / "many" / f"{i}.txt", text(i))
    one = ndindex.dedup([tree], index=tmp_path / "1.ndx", jobs=1)

    def no_fork():
        raise AssertionError("a dedup worker was forked from the calling process")
    monkeypatch.setattr(os, "fork", no_fork)
    two = ndindex.dedup([tree], index=tmp_path / "2.ndx", jobs=2)
    assert two.files_read == one.files_read > 128
    assert [names(c) for c in one.clusters] == [names(c) for c in two.clusters]


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


def test_cli_dedup_prints_names_with_control_characters_escaped(tmp_path, capsys):
    # A newline in a file's name broke the line it was printed on, and an
    # escape sequence in one reached the terminal: a directory of downloads
    # could rewrite the screen of whoever looked for its duplicates.
    root = tmp_path / "t"
    names = ["plain.txt", "two\nlines.txt", "esc\x1b[2Jclear.txt", "tab\there.txt"]
    for name in names:
        write(root / name, text(30))
    assert main(["dedup", str(root), "--index", str(tmp_path / "ix.ndx"), "-q"]) == 1
    out = capsys.readouterr().out
    assert not any(ch in out for ch in "\x1b\t\r") and "\\x1b[2Jclear.txt" in out
    listed = [line for line in out.splitlines() if " B  " in line]
    assert len(listed) == 4 and any("two\\x0alines.txt" in line for line in listed)
    assert main(["dedup", str(root), "--index", str(tmp_path / "ix.ndx"), "--json"]) == 1
    files = json.loads(capsys.readouterr().out)["clusters"][0]["files"]
    exact = {bytes.fromhex(f["path_bytes_hex"]) for f in files if "path_bytes_hex" in f}
    assert exact == {os.fsencode(str(root / name)) for name in names[1:]}


def test_cli_dedup_no_duplicates_exits_0_and_default_index(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write(tmp_path / "t" / "a.txt", text(10))
    assert main(["dedup", str(tmp_path / "t")]) == 0
    out, err = capsys.readouterr()
    expected = dedup_module.default_index_path([str(tmp_path / "t")])
    assert expected.startswith(str(tmp_path / "cache" / "ndindex" / "dedup-"))
    assert err == f"ndindex: index {expected}\n" and "no duplicates." in out
    assert os.path.exists(expected) and not os.path.exists(expected + ".files")


def test_cli_dedup_errors_are_one_line(tmp_path, capsys):
    assert main(["dedup", str(tmp_path / "missing"), "--index", str(tmp_path / "i.ndx")]) == 2
    err = capsys.readouterr().err
    assert err == f"ndindex: {tmp_path / 'missing'}: No such file or directory\n"
    write(tmp_path / "other.ndx", "not an index")
    write(tmp_path / "t" / "a.txt", text(1))
    assert main(["dedup", str(tmp_path / "t"), "--index", str(tmp_path / "other.ndx"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err == f"ndindex: {tmp_path / 'other.ndx'}: not an ndindex file (12 bytes, no LMDB meta page)\n"
    ndindex.Index.create(tmp_path / "docs.ndx", fingerprinter=Fingerprinter()).close()
    assert main(["dedup", str(tmp_path / "t"), "--index", str(tmp_path / "docs.ndx"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err == (f"ndindex: {tmp_path / 'docs.ndx'}: not a dedup index (an ndindex file that "
                   "`ndindex dedup` did not make); use another --index\n")
    with ndindex.open(tmp_path / "docs.ndx", readonly=True) as index:    # left as it was
        assert len(index) == 0
    for jobs in ("0", "-3"):      # not silently one worker
        assert main(["dedup", str(tmp_path / "t"), "--index", str(tmp_path / "j.ndx"), "-q",
                     "--jobs", jobs]) == 2
        assert capsys.readouterr().err == ("ndindex: error: jobs must be a positive int, or "
                                           f"None for one per CPU, got {jobs}\n")


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
    assert again.notes == [f"{ix}: its lookup keys find near-duplicates at thresholds >= 0.8, "
                           "not 0.7: replaced by a new index; every file is read again"]
    with ndindex.open(ix, readonly=True) as index:
        assert index.fingerprinter == other.to_bytes()
    index_keys_cover_state(ix)


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
    assert file_keys(ix) == {str(a / "1.txt"), str(b / "3.txt"), str(b / "4.txt")}


def test_interrupted_run_keeps_what_it_stored_each_second(tree, tmp_path, monkeypatch):
    ix = tmp_path / "ix.ndx"
    ticks = iter(range(0, 10**6, 2))          # every look at the clock: two seconds later
    monkeypatch.setattr(dedup_module, "_clock", lambda: next(ticks), raising=False)
    examined = []
    real = dedup_files._examine

    def examine_then_interrupt(item, opts):
        if len(examined) == 5:
            raise KeyboardInterrupt
        examined.append(item)
        return real(item, opts)

    monkeypatch.setattr(dedup_files, "_examine", examine_then_interrupt)
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
    real = dedup_files.textfile.decode
    monkeypatch.setattr(dedup_files.textfile, "decode",
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


# -- one file: the index holds everything (issue 13) ---------------------------------


def test_the_index_is_the_only_file_and_identical_copies_share_one_text(tree, tmp_path):
    ix = tmp_path / "ix.ndx"
    ndindex.dedup([tree], index=ix)
    counts = dedup_module.check_index(ix)
    # ten text files, two of them copies of others' bytes: eight distinct texts;
    # the two .dat files were read and found binary: remembered, not compared
    assert counts["files"] == 12 and counts["text_files"] == 10 and counts["texts"] == 8
    assert counts["binary_files"] == 2
    index_keys_cover_state(ix)
    with ndindex.open(ix, readonly=True) as index:
        data = {key: d for key, _, d in index.documents()}
    state = dedup_module._FileState.unpack(str(tree / "a" / "original.txt"),
                                           data[str(tree / "a" / "original.txt")])
    assert (state.size, state.mtime_ns) == (os.stat(tree / "a" / "original.txt").st_size,
                                            os.stat(tree / "a" / "original.txt").st_mtime_ns)
    assert state.content_hash.hex() == __import__("hashlib").blake2b(
        text(1).encode(), digest_size=16).hexdigest() and state.kind == dedup_module.KIND_TEXT


def test_near_duplicates_are_found_whatever_their_simhash_distance(tmp_path):
    """A text and the same text with one word repeated 80 times: Jaccard 0.99,
    but the repeated word outweighs the rest in the simhash (tf weights), so
    the simhashes lie far more than 10 bits apart."""
    root = tmp_path / "t"
    base = text(60)
    write(root / "a.txt", base)
    write(root / "b.txt", base + " zebra" * 80 + "\n")
    result = ndindex.dedup([root], index=tmp_path / "ix.ndx")
    [cluster] = result.clusters
    [pair] = cluster.pairs
    fpr = Fingerprinter()
    assert pair.distance == (fpr.simhash(base) ^ fpr.simhash(base + " zebra" * 80)).bit_count()
    assert pair.distance > 10 and pair.similarity >= 0.98 and not pair.exact


def test_a_pair_linked_through_others_reports_its_own_similarity(tmp_path):
    """A ~ B and B ~ C at >= 0.8, A ~ C below: one cluster, and the pair (A, C)
    carries the Jaccard estimate of its own sketches."""
    root = tmp_path / "t"
    words = text(61, 600).split()
    b = list(words)
    for i in range(0, 600, 40):
        b[i] = "edited"
    c = list(b)
    for i in range(20, 600, 40):
        c[i] = "again"
    for name, w in (("a.txt", words), ("b.txt", b), ("c.txt", c)):
        write(root / name, " ".join(w))
    fpr = Fingerprinter()
    sketches = {n: fpr.sketch(" ".join(w)) for n, w in (("a", words), ("b", b), ("c", c))}
    assert fpr.similarity(sketches["a"], sketches["c"]) < 0.8 <= fpr.similarity(
        sketches["a"], sketches["b"])
    [cluster] = ndindex.dedup([root], index=tmp_path / "ix.ndx").clusters
    got = {tuple(sorted((os.path.basename(cluster.files[p.a].path)[0],
                         os.path.basename(cluster.files[p.b].path)[0]))): p.similarity
           for p in cluster.pairs}
    assert got == {tuple(sorted(pair)): fpr.similarity(sketches[pair[0]], sketches[pair[1]])
                   for pair in (("a", "b"), ("a", "c"), ("b", "c"))}


def test_a_higher_threshold_reuses_the_index_and_a_lower_one_replaces_it(tree, tmp_path):
    ix = tmp_path / "ix.ndx"
    first = ndindex.dedup([tree], index=ix)
    strict = ndindex.dedup([tree], index=ix, threshold=0.99)
    assert strict.files_read == 0 and strict.notes == []
    assert all(p.similarity >= 0.99 or p.exact for c in strict.clusters for p in c.pairs
               if p.a == 0 and len(c.files) == 2)
    assert len(strict.clusters) >= len(first.clusters)          # looser groups split
    loose = ndindex.dedup([tree], index=ix, threshold=0.7)
    assert loose.files_read == first.files_read and "replaced by a new index" in loose.notes[0]
    again = ndindex.dedup([tree], index=ix, threshold=0.8)        # 0.7's keys serve 0.8
    assert again.files_read == 0 and [names(c) for c in again.clusters] == \
        [names(c) for c in first.clusters]


def test_an_index_of_the_two_file_layout_is_replaced_once(tree, tmp_path):
    """What the previous version left: an index (k = 10, simhash -> path keys)
    and its SQLite state file.  The first run replaces both with one file."""
    import sqlite3
    ix = tmp_path / "ix.ndx"
    with ndindex.Index.create(ix, k=10, fingerprinter=Fingerprinter()) as old:
        old.add([Fingerprinter().simhash(text(1))], keys=[str(tree / "a" / "original.txt")])
    db = sqlite3.connect(str(ix) + ".files")
    db.executescript("CREATE TABLE meta(key TEXT PRIMARY KEY, value BLOB);"
                     "INSERT INTO meta VALUES ('schema', 1);")
    db.close()
    result = ndindex.dedup([tree], index=ix)
    assert result.notes == [f"{ix}: an index of an earlier version of the dedup job (with the "
                            f"state file {ix}.files): replaced by a one-file index; every file "
                            "is read again"]
    assert result.files_read == 10 and len(result.clusters) == 2
    index_keys_cover_state(ix)
    again = ndindex.dedup([tree], index=ix)
    assert again.notes == [] and again.files_read == 0


def test_a_state_file_left_alone_by_an_interrupted_replacement_is_deleted(tree, tmp_path,
                                                                          capsys):
    ix = tmp_path / "ix.ndx"
    write(str(ix) + ".files", b"SQLite format 3\x00" + bytes(100))
    assert main(["dedup", str(tree), "--index", str(ix), "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["files_read"] == 10
    assert f"ndindex: {ix}: an index of an earlier version" in captured.err
    index_keys_cover_state(ix)


def test_an_index_of_a_newer_layout_is_refused_and_kept(tree, tmp_path, monkeypatch):
    ix = tmp_path / "ix.ndx"
    monkeypatch.setattr(dedup_module, "LAYOUT_VERSION", 2)
    ndindex.dedup([tree], index=ix)
    monkeypatch.undo()
    size = os.path.getsize(ix)
    with pytest.raises(ndindex.NdindexError, match="dedup index layout 2 > supported 1"):
        ndindex.dedup([tree], index=ix)
    assert os.path.getsize(ix) == size


def test_check_index_names_a_broken_invariant(tree, tmp_path):
    ix = tmp_path / "ix.ndx"
    ndindex.dedup([tree], index=ix)
    with ndindex.open(ix) as index:
        text_key = next(k for k, _, _ in index.documents()
                        if isinstance(k, bytes) and k[:1] == b"\x01")
        index.remove(keys=[text_key])
    with pytest.raises(ndindex.CorruptionError, match="1 text files without their text"):
        dedup_module.check_index(ix)
    with ndindex.open(ix) as index:
        index.add_documents(text(99), b"\x01" + bytes(17))
        index.add_documents(text(1), text_key)
    with pytest.raises(ndindex.CorruptionError, match="1 texts no file uses"):
        dedup_module.check_index(ix)


def test_a_path_too_long_for_a_key_is_remembered(tmp_path):
    root = tmp_path / "t"
    deep = root.joinpath(*[f"{i:02d}" + "d" * 200 for i in range(3)])
    write(deep / "a.txt", text(70))
    write(root / "b.txt", text(70))
    assert len(os.fsencode(str(deep / "a.txt"))) > dedup_module.MAX_PATH_KEY_BYTES
    ix = tmp_path / "ix.ndx"
    first = ndindex.dedup([root], index=ix)
    assert [names(c) for c in first.clusters] == [["a.txt", "b.txt"]]
    assert first.clusters[0].files[0].path == str(deep / "a.txt") or \
        first.clusters[0].files[1].path == str(deep / "a.txt")
    again = ndindex.dedup([tmp_path / "t" / "b.txt"], index=ix)    # the long one not walked
    assert again.files_removed == 0 and again.files_read == 0
    os.unlink(deep / "a.txt")
    gone = ndindex.dedup([tmp_path / "t" / "b.txt"], index=ix)
    assert gone.files_removed == 1
    index_keys_cover_state(ix)


def test_text_without_a_word_is_compared_exactly(tmp_path, monkeypatch):
    """A text whose only word characters the tokenizer does not count (the
    cheap check in _examine passes it) is stored as plain text."""
    root = tmp_path / "t"
    write(root / "a.txt", "---- ==== ----\n")
    write(root / "b.txt", "---- ==== ----\n")
    write(root / "c.txt", text(80))
    monkeypatch.setattr(dedup_files, "_WORD_CHAR", __import__("re").compile(r"."))
    result = ndindex.dedup([root], index=tmp_path / "ix.ndx")
    [cluster] = result.clusters
    assert names(cluster) == ["a.txt", "b.txt"] and cluster.kind == "exact"
    assert cluster.files[0].simhash is None and cluster.pairs[0].distance is None
    counts = dedup_module.check_index(tmp_path / "ix.ndx")
    assert counts["plain_files"] == 2 and counts["texts"] == 1


def test_capped_keeps_each_texts_most_similar_pairs():
    import itertools
    rng = random.Random(5)
    pairs = [(a, b, rng.random()) for a, b in itertools.combinations(range(12), 2)
             if rng.random() < 0.7]
    for limit in (1, 2, 3, 100):
        kept = set(dedup_module._capped(pairs, limit))

        def best(node):
            mine = sorted((p for p in pairs if node in p[:2]), key=lambda p: -p[2])
            return set(mine[:limit])
        assert kept == set().union(*(best(n) for n in range(12)))


def test_progress_reports_each_phase(tree, tmp_path):
    seen = []
    ndindex.dedup([tree], index=tmp_path / "ix.ndx",
                  progress=lambda phase, done, total: seen.append((phase, done, total)))
    assert ("read", 12, 12) in seen        # ten texts and two .dat files (binary inside)
    assert seen[-2:] == [("compare", 0, 1), ("compare", 1, 1)]


KILL_SCRIPT = """
import sys, ndindex, importlib
dedup = importlib.import_module("ndindex.dedup")
dedup.BATCH_FILES = 3
real = dedup._DedupIndex._commit
def commit(self, *a):
    out = real(self, *a)
    print("committed", flush=True)
    return out
dedup._DedupIndex._commit = commit
if __name__ == "__main__":
    ndindex.dedup([sys.argv[1]], index=sys.argv[2])
    print("finished", flush=True)
"""


@pytest.mark.slow
def test_a_killed_run_keeps_every_committed_batch(tmp_path):
    """SIGKILL after a few batches committed: the file verifies, the invariants
    hold, and the next run reads only what was not committed."""
    import signal
    import subprocess
    import sys
    root = tmp_path / "t"
    for i in range(30):
        write(root / f"f{i:02d}.txt", text(100 + i % 10))
    ix = tmp_path / "ix.ndx"
    (tmp_path / "kill.py").write_text(KILL_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "kill.py"), str(root), str(ix)],
                            stdout=subprocess.PIPE, text=True)
    commits = 0
    for line in proc.stdout:
        commits += line.startswith("committed")
        if commits == 3:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    counts = dedup_module.check_index(ix)
    assert counts["files"] >= 9                        # three batches of three files
    resumed = ndindex.dedup([root], index=ix)
    assert resumed.files_unchanged == counts["files"] and \
        resumed.files_read == 30 - counts["files"]
    fresh = ndindex.dedup([root], index=tmp_path / "fresh.ndx")
    assert [names(c) for c in resumed.clusters] == [names(c) for c in fresh.clusters]
    assert len(resumed.clusters) == 10
    index_keys_cover_state(ix)


def _dedup_killed(when: str, files, index) -> None:
    """Run a dedup job in a child that dies at the link of its first build
    into place, or at the first unlink after that link (clearing its
    build's files up)."""
    killed_at("link", "from ndindex import dedup\ndedup([sys.argv[1]], index=sys.argv[2])\n",
              files, index, after=when == "after the link", only_to=2)


@pytest.mark.parametrize("when", ["before the link", "after the link"])
def test_a_killed_first_build_leaves_nothing_after_the_next_run(tmp_path, when):
    # The first run builds its index beside the final name and links it
    # into place.  Killed before the link, the build is left; killed
    # after it, the build's files are.  The next run deletes them
    # either way and finds the duplicates.
    write(tmp_path / "t" / "a.txt", text(1))
    write(tmp_path / "t" / "b.txt", text(1))
    index = tmp_path / "cache" / "files.ndx"
    index.parent.mkdir()
    _dedup_killed(when, tmp_path / "t", index)
    assert set(os.listdir(index.parent)) - {"files.ndx", "files.ndx-lock"}  # the kill's
    assert os.path.exists(index) == (when == "after the link")
    result = ndindex.dedup([tmp_path / "t"], index=index)
    assert [names(c) for c in result.clusters] == [["a.txt", "b.txt"]]
    assert sorted(os.listdir(index.parent)) == ["files.ndx", "files.ndx-lock"]


def test_a_first_build_another_run_holds_is_waited_for_and_left_alone(tmp_path, monkeypatch):
    # A live build's names are not a leftover: the run that finds them held
    # neither deletes them nor builds a second index over the first.
    from ndindex import store
    write(tmp_path / "t" / "a.txt", text(2))
    index = tmp_path / "files.ndx"
    held_name, tmp, _ = store.index_build_files(str(index), "dedup")
    held = store.claim_build(held_name, str(index))
    try:
        with open(tmp, "wb") as fh:  # the other run's index in the making
            fh.write(b"x")
        monkeypatch.setattr(store, "BUILD_WAIT_SECONDS", 0.2)
        with pytest.raises(FileExistsError):
            ndindex.dedup([tmp_path / "t"], index=index)
        assert os.path.exists(tmp) and not os.path.exists(index)
    finally:
        store.release_build(held, held_name)
    os.unlink(tmp)
    assert ndindex.dedup([tmp_path / "t"], index=index).files_read == 1
    assert sorted(os.listdir(tmp_path)) == ["files.ndx", "files.ndx-lock", "t"]
