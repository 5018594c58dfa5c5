"""ndindex recover: from a damaged file, everything whose records still verify, and no more.

Each test damages one kind of page or record of the fixture index
(tests/crash/damage.py), recovers it, and compares the new index with what
the build says must survive that damage: every table holds every
fingerprint, and both key spaces every key, so the loss of one table's
chunk or one key space's chunk loses nothing; a lost log record loses its
operations; lost tombstones bring removed fingerprints back (and the
report says so).  The output must verify, the exit status must say
whether the recovery is provably complete (0) or partial (1), and an
undamaged file must come back exactly.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil

import numpy as np
import pytest

from damage import (build_fixture, chunk_keys, contents, damage_value, flip, leaf_keys,
                    occurrences, page_map, pages_of, records)
from ndindex import CorruptionError, FormatError, cli, records as rec, recover
from ndindex.index import Index
from ndindex.writer import put_header
from tests.conftest import level0_flush_target
from tests.killing import killed_at


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("recover") / "pristine.ndx")
    info = build_fixture(path)
    return path, info


@pytest.fixture
def damaged(built, tmp_path):
    """(path of a fresh copy of the fixture to damage, the build's info)."""
    src, info = built
    path = str(tmp_path / "index.ndx")
    shutil.copyfile(src, path)
    return path, info


def run_recover(path, tmp_path) -> tuple[dict, dict]:
    """Recover path into a new file; return the report and what the new index holds."""
    out = str(tmp_path / "recovered.ndx")
    report = recover.recover(path, out)
    assert report["output"] == out
    with Index.open(out, readonly=True) as ix:
        ix.verify()
    return report, contents(out)


def without(state: dict, fps) -> dict:
    gone = {int(fp) for fp in fps}
    return {fp: ks for fp, ks in state.items() if fp not in gone}


# -- nothing damaged ------------------------------------------------------------------


def test_undamaged_file_round_trips_exactly(damaged, tmp_path):
    path, info = damaged
    report, got = run_recover(path, tmp_path)
    assert got == info["state"] == contents(path)
    assert report["status"] == 0 and report["complete"], report["problems"]
    assert report["fingerprints"] == len(info["state"])
    assert report["keys"] == sum(len(ks) for ks in info["state"].values())
    with Index.open(path, readonly=True) as old, Index.open(tmp_path / "recovered.ndx") as new:
        assert new.k == old.k and new.plan == old.plan and new.coding == old.coding
        assert new.fingerprinter == old.fingerprinter


def test_recover_refuses_an_existing_output_and_leaves_it(damaged, tmp_path):
    path, _ = damaged
    out = tmp_path / "taken.ndx"
    out.write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        recover.recover(path, out)
    assert out.read_bytes() == b"mine"


@pytest.mark.parametrize("when", ["before the link", "after the link"])
def test_a_killed_recover_leaves_nothing_after_the_next_recover_or_open(damaged, tmp_path, when):
    # recover builds the new index under a fixed name it holds, then links
    # it to the output.  Killed before the link, the next recover clears
    # the build (an index-sized file) and succeeds; killed after it, the
    # output is whole and a writer's open of it clears the rest.
    path, info = damaged
    out = tmp_path / "out" / "recovered.ndx"
    out.parent.mkdir()
    # Its link to the output (sys.argv[2]): the build's own create links too.
    killed_at("link", "from ndindex import recover\nrecover.recover(sys.argv[1], sys.argv[2])\n",
              path, out, after=when == "after the link", only_to=2)
    assert set(os.listdir(out.parent)) - {"recovered.ndx", "recovered.ndx-lock"}  # the kill's
    assert out.exists() == (when == "after the link")
    if when == "before the link":
        assert recover.recover(path, out)["status"] == 0
    with Index.open(out) as ix:
        ix.verify()
    assert contents(str(out)) == info["state"]
    assert sorted(os.listdir(out.parent)) == ["recovered.ndx", "recovered.ndx-lock"]


# -- chunks: one table's or one key space's loss loses nothing -------------------------------


def test_damaged_block_of_a_huffman_chunk(damaged, tmp_path):
    path, info = damaged
    key = next(k for k, v in records(path, rec.DB_CHUNKS)
               if k[0] == 0 and v[4] == rec.KIND_HUFFMAN)
    damage_value(path, rec.DB_CHUNKS, key, at=32 + 8 * 2 + 1024 + 200)  # inside block 1
    with pytest.raises(Exception):
        Index.open(path, readonly=True).verify()
    report, got = run_recover(path, tmp_path)
    assert got == info["state"]
    assert report["status"] == 0, report["problems"]


@pytest.mark.parametrize("space, kind", [(1, rec.KIND_RAW), (2, rec.KIND_HUFFMAN),
                                         (rec.SPACE_KEYS_BY_FP, rec.KIND_RECORDS),
                                         (rec.SPACE_FPS_BY_KEY, rec.KIND_RECORDS)],
                         ids=["raw", "huffman", "keys-by-fp", "fps-by-key"])
def test_damaged_chunk_header_of_each_kind(damaged, tmp_path, space, kind):
    path, info = damaged
    key = next(k for k, v in records(path, rec.DB_CHUNKS) if k[0] == space and v[4] == kind)
    damage_value(path, rec.DB_CHUNKS, key, at=5)  # the flags byte, under the header checksum
    report, got = run_recover(path, tmp_path)
    assert got == info["state"]
    assert report["status"] == 0, report["problems"]


def test_chunks_lost_in_every_table_lose_exactly_what_no_record_holds(built, damaged, tmp_path):
    path, info = damaged
    chunks = records(path, rec.DB_CHUNKS)
    main = {t: [k for k, v in chunks if k[0] == t and v[4] == rec.KIND_HUFFMAN] for t in range(4)}
    for t in range(3):  # tables 0-2 lose their main run whole, table 3 its first chunk
        for key in main[t]:
            damage_value(path, rec.DB_CHUNKS, key, at=5)
    damage_value(path, rec.DB_CHUNKS, main[3][0], at=5)
    bound = int.from_bytes(main[3][0][5:], "big")
    with Index.open(built[0], readonly=True) as ix:
        design = ix.plan.tables[3]
    # Lost: fingerprints of the main runs that no log record or document
    # key names and that lay in table 3's first chunk.
    keyless = np.array([fp for fp in info["A"].tolist()
                        if fp in info["state"] and not info["state"][fp]], dtype=np.uint64)
    lost = keyless[design.apply(keyless) <= np.uint64(bound)]
    assert len(lost)
    report, got = run_recover(path, tmp_path)
    assert got == without(info["state"], lost)
    assert report["status"] == 1 and not report["complete"]


def test_damaged_tombstone_chunk_brings_removed_fingerprints_back(damaged, tmp_path):
    path, info = damaged
    (key,) = chunk_keys(path, rec.SPACE_TOMBSTONES)
    damage_value(path, rec.DB_CHUNKS, key, at=40)
    report, got = run_recover(path, tmp_path)
    expected = dict(info["state"])
    expected.update({fp: frozenset() for fp in info["tombstoned"].tolist()})
    assert got == expected
    assert report["status"] == 1
    assert any("tombstone" in p for p in report["problems"])


def test_repeated_tombstone_of_an_older_writer_is_repaired(tmp_path, monkeypatch):
    # Compactions before compaction._newest_tombstones wrote a fingerprint
    # removed twice as two tombstones in a row (checksums intact): readers
    # reject the chunk; recover keeps one and hides the fingerprint still.
    from ndindex import compaction
    path = str(tmp_path / "old.ndx")
    fps = np.arange(1, 200, dtype=np.uint64) * 0x9E3779B97F4A7C15
    monkeypatch.setattr(compaction, "_newest_tombstones",
                        lambda f, s: tuple(a[np.argsort(f, kind="stable")] for a in (f, s)))
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        # A writer of format 4 (one tombstone run, rewritten by each flush).
        ix._header = dataclasses.replace(ix._header, read_version=4, write_version=4)
        ix._store.write(lambda wt: put_header(wt, ix._header), sync=True)
        ix.add(fps)
        ix.compact()
        x = int(fps[5])
        ix.remove(fingerprints=[x])
        ix.compact()
        ix.add([x])
        ix.remove(fingerprints=[x])
        with pytest.raises(CorruptionError):  # the flush commits; the merge after it reads
            ix.compact()
    monkeypatch.undo()
    with Index.open(path, readonly=True) as ix:
        with pytest.raises(CorruptionError, match="tombstone chunk values out of order"):
            ix.verify()
    report, got = run_recover(path, tmp_path)
    assert report["status"] == 0, report["problems"]
    assert set(got) == set(fps.tolist()) - {x}


def written_by_an_older_writer(path, monkeypatch, chunk_blocks: str, parts, gone, check,
                               keys=None) -> None:
    """Write parts (with keys[fp], if given), each flushed, then remove gone
    and compact, merging one chunk (of one block, ch.<chunk_blocks>) a step as
    writers before compaction._last_chunk_marked did: a merge whose final
    step found every value left removed ended with no chunk flagged last.
    check(ix) runs on the index before it closes."""
    from ndindex import chunks as ch, compaction, levels
    monkeypatch.setattr(compaction, "STEP_CHUNKS", 1)
    monkeypatch.setattr(ch, chunk_blocks, 1)
    monkeypatch.setattr(levels, "flush_target", level0_flush_target)  # as they flushed
    monkeypatch.setattr(compaction, "_last_chunk_marked",
                        lambda snap, key: (key, bytes(snap.view.get(rec.DB_CHUNKS, key))))
    with Index.create(path, k=3, background_compaction=False) as ix:
        for part in parts:
            ix.add(part, keys=None if keys is None else [keys[fp] for fp in part.tolist()])
            ix._compactor.flush_log()
        ix.remove(fingerprints=gone)
        ix._compactor.flush_log()
        ix.compact()
        check(ix)
    monkeypatch.undo()


def test_run_without_a_last_chunk_of_an_older_writer_is_recovered(tmp_path, monkeypatch):
    # Every read of such a run fails; recover gives back every fingerprint.
    path = str(tmp_path / "old.ndx")
    fps = np.unique(np.random.default_rng(12).integers(0, 2**64, 4000, dtype=np.uint64))

    def fails(ix):
        with pytest.raises(CorruptionError, match="lacks its last chunk"):
            ix.fingerprints()
    written_by_an_older_writer(path, monkeypatch, "CHUNK_MAX_BLOCKS", (fps, fps[:500]),
                               fps[3000:], fails)
    report, got = run_recover(path, tmp_path)
    assert report["status"] == 0, report["problems"]
    assert sorted(got) == sorted(fps[:3000].tolist())


def test_record_run_without_a_last_chunk_of_an_older_writer_fails_verify_and_is_recovered(
        tmp_path, monkeypatch):
    # The same older merge, of the key runs: readers of records went on
    # without the flag, so only verify() shows the damage.
    path = str(tmp_path / "old.ndx")
    fps = np.unique(np.random.default_rng(13).integers(0, 2**64, 4000, dtype=np.uint64))
    # Keys in fingerprint order, so that both key spaces end with the removed.
    key = {fp: f"doc-{i:05d}" for i, fp in enumerate(fps.tolist())}

    def fails(ix):
        with pytest.raises(CorruptionError, match="run [0-9]+ lacks its last chunk"):
            ix.verify()
    written_by_an_older_writer(path, monkeypatch, "RECORD_CHUNK_BLOCKS", (fps[:2000], fps[2000:]),
                               fps[3000:], fails, keys=key)
    report, got = run_recover(path, tmp_path)
    assert report["status"] == 0, report["problems"]
    assert got == {fp: frozenset({key[fp]}) for fp in fps[:3000].tolist()}


def test_damaged_key_chunks_in_both_spaces_lose_only_their_shared_keys(damaged, tmp_path):
    path, info = damaged
    # The first chunk of each key space: keys-by-fingerprint holds the
    # smallest fingerprints' keys, fingerprints-by-key the smallest keys.
    by_fp = chunk_keys(path, rec.SPACE_KEYS_BY_FP)[0]
    by_key = chunk_keys(path, rec.SPACE_FPS_BY_KEY)[0]
    damage_value(path, rec.DB_CHUNKS, by_fp, at=5)
    damage_value(path, rec.DB_CHUNKS, by_key, at=5)
    logged = set(info["C"].tolist())  # their keys are in a log record, not in the chunks

    def in_both(fp, key):
        raw = rec.encode_doc_key(key)
        return fp not in logged and rec.U64_BE.pack(fp) + raw <= by_fp[5:] and \
            raw + rec.U64_BE.pack(fp) <= by_key[5:]

    expected = {fp: frozenset(k for k in ks if not in_both(fp, k))
                for fp, ks in info["state"].items()}
    assert expected != info["state"]
    report, got = run_recover(path, tmp_path)
    assert got == expected
    assert report["status"] == 1


# -- meta records --------------------------------------------------------------------


@pytest.mark.parametrize("key", [rec.KEY_HEADER, rec.KEY_PLAN, rec.KEY_STATE, rec.KEY_MANIFEST],
                         ids=lambda k: k.decode())
def test_damaged_meta_record_every_copy(built, damaged, tmp_path, key):
    path, info = damaged
    assert damage_value(path, rec.DB_META, key, at=3) >= 1
    report, got = run_recover(path, tmp_path)
    if key == rec.KEY_MANIFEST:
        # The main runs' Huffman codes were kept only in the manifest: their
        # fingerprints survive where a document key names them.
        keyless = [fp for fp in info["A"].tolist() if not info["state"].get(fp, True)]
        assert got == without(info["state"], keyless)
    else:
        assert got == info["state"]
    assert report["status"] == 1 and report["problems"]
    with Index.open(built[0], readonly=True) as old, \
            Index.open(tmp_path / "recovered.ndx", readonly=True) as new:
        assert new.plan == old.plan and new.k == old.k and new.coding == old.coding
    if key == rec.KEY_MANIFEST:
        assert any("may have come back" in p for p in report["problems"])
    if key == rec.KEY_PLAN:
        assert any("planner's plan" in p for p in report["problems"])


def test_damaged_newest_state_falls_back_to_an_older_consistent_one(damaged, tmp_path):
    path, info = damaged
    # Only the current copy: the stale ones in free pages still verify.
    value = dict(records(path, rec.DB_META))[rec.KEY_STATE]
    data = pathlib.Path(path).read_bytes()
    flip(path, data.find(rec.KEY_STATE + value) + len(rec.KEY_STATE) + 20)
    report, got = run_recover(path, tmp_path)
    assert got == info["state"]
    assert report["status"] == 1
    assert report["counts"]["txnid"] < report["counts"]["newest_txnid"]


# -- the log -------------------------------------------------------------------------


@pytest.mark.parametrize("which", [0, 1, 2], ids=["adds-with-keys", "adds-overflow", "removes"])
def test_damaged_log_record_loses_its_operations(damaged, tmp_path, which):
    path, info = damaged
    seq = info["log_first_seq"] + which
    damage_value(path, rec.DB_LOG, rec.U64_BE.pack(seq), at=20)
    report, got = run_recover(path, tmp_path)
    if which == 0:
        expected = without(info["state"], info["C"])
    elif which == 1:
        expected = without(info["state"], info["D"])
    else:  # the removal of ten of B's fingerprints, with their keys, is lost
        expected = dict(info["state"])
        b = info["B"].tolist()
        expected.update({fp: frozenset({f"b-{b.index(fp)}"}) for fp in info["unremoved"].tolist()})
    assert got == expected
    assert report["status"] == 1
    assert any("log records could not be read" in p for p in report["problems"])


# -- LMDB's pages ---------------------------------------------------------------------


def test_damaged_branch_page_of_the_chunks_tree(damaged, tmp_path):
    path, info = damaged
    (branch,) = pages_of(path, "branch", rec.DB_CHUNKS)
    flip(path, branch * 4096 + 16)  # its first node offset
    with pytest.raises(Exception):
        with Index.open(path, readonly=True) as ix:
            ix.verify()
    report, got = run_recover(path, tmp_path)
    assert got == info["state"]
    assert report["status"] == 0, report["problems"]


def test_damaged_leaf_page_of_one_table(damaged, tmp_path):
    path, info = damaged
    leaf = next(p for p in pages_of(path, "leaf", rec.DB_CHUNKS)
                if {k[0] for k in leaf_keys(path, p)} == {1})
    with open(path, "r+b") as fh:  # the whole page lost: its inline chunks with it
        fh.seek(leaf * 4096)
        fh.write(bytes(4096))
    report, got = run_recover(path, tmp_path)
    assert got == info["state"]
    assert report["status"] == 0, report["problems"]


def test_damaged_leaf_page_keeps_the_overflow_chunks_it_pointed_to(damaged, tmp_path):
    path, info = damaged
    # A leaf of table 0 whose chunks live in overflow pages: with the leaf
    # unreadable, the chunks are found from their overflow pages alone.
    pm = page_map(path)
    leaf = next(p for p in pages_of(path, "leaf", rec.DB_CHUNKS)
                if {k[0] for k in leaf_keys(path, p)} == {0})
    keys = leaf_keys(path, leaf)
    with open(path, "r+b") as fh:  # the whole page lost, as a bad sector
        fh.seek(leaf * 4096)
        fh.write(bytes(4096))
    sv = recover.salvage(path)
    assert sv.counts["unclaimed_overflow_runs"] >= 1
    assert sum(1 for p, (k, t) in pm.items() if k == "overflow") >= len(keys) // 2
    assert set(sv.fingerprints.tolist()) == set(info["state"])


def test_damaged_overflow_page_header_is_read_through_its_leaf(damaged, tmp_path):
    path, info = damaged
    first = pages_of(path, "overflow", rec.DB_LOG)[0]
    flip(path, first * 4096)  # mp_pgno: the page no longer names itself
    report, got = run_recover(path, tmp_path)
    assert got == info["state"]
    assert report["status"] == 0, report["problems"]


@pytest.mark.parametrize("which", ["0", "1", "both"])
def test_damaged_meta_pages(damaged, tmp_path, which):
    path, info = damaged
    for page in {"0": [0], "1": [1], "both": [0, 1]}[which]:
        flip(path, page * 4096 + 16)  # mm_magic
    report, got = run_recover(path, tmp_path)
    assert got == info["state"]
    assert report["status"] == 1  # the newest commit cannot be confirmed


@pytest.mark.parametrize("cut_pages", [1, 3])
def test_truncated_file(damaged, tmp_path, cut_pages):
    path, info = damaged
    os.truncate(path, os.path.getsize(path) - cut_pages * 4096)
    report, got = run_recover(path, tmp_path)
    # The last pages hold the newest commit's main, meta and free-list
    # leaves; the meta records' stale copies in free pages stand in.
    assert got == info["state"]
    assert report["status"] in (0, 1)


def test_truncated_to_half_recovers_what_lies_before_the_cut(damaged, tmp_path):
    path, info = damaged
    os.truncate(path, os.path.getsize(path) // 2)
    out = str(tmp_path / "recovered.ndx")
    report = recover.recover(path, out)
    assert report["status"] in (1, 2)
    if report["output"]:
        got = contents(out)
        removed = set(info["tombstoned"].tolist()) | set(info["unremoved"].tolist())
        assert set(got) <= set(info["state"]) | removed


# -- not an index at all --------------------------------------------------------------


@pytest.mark.parametrize("data", [b"", b"x" * 100, bytes(1 << 16),
                                  np.random.default_rng(1).bytes(1 << 16)],
                         ids=["empty", "short", "zeros", "random"])
def test_nothing_recoverable(tmp_path, data):
    path = tmp_path / "junk"
    path.write_bytes(data)
    report = recover.recover(path, tmp_path / "out.ndx")
    assert report["status"] == 2 and report["output"] is None
    assert not (tmp_path / "out.ndx").exists()


# -- the command ----------------------------------------------------------------------


def test_cli_recover_exit_status_and_report(damaged, tmp_path, capsys):
    path, info = damaged
    out = str(tmp_path / "cli.ndx")
    assert cli.main(["recover", path, "-o", out]) == 0
    assert contents(out) == info["state"]
    printed = capsys.readouterr()
    assert f"{len(info['state']):,} fingerprints" in printed.out
    damage_value(path, rec.DB_LOG, rec.U64_BE.pack(info["log_first_seq"]), at=20)
    assert cli.main(["recover", path, "-o", str(tmp_path / "cli2.ndx")]) == 1
    assert "could not be read" in capsys.readouterr().err
    assert cli.main(["recover", path, "-o", out]) == 2  # exists
    junk = tmp_path / "junk"
    junk.write_bytes(b"junk" * 5000)
    assert cli.main(["recover", str(junk), "-o", str(tmp_path / "cli3.ndx")]) == 2
    assert cli.main(["recover", path]) == 2  # -o is required


def test_cli_verify_repair_writes_index_recovered(damaged, tmp_path, capsys):
    path, info = damaged
    assert cli.main(["verify", "--repair", path]) == 0  # undamaged: nothing to repair
    assert not os.path.exists(path + ".recovered")
    capsys.readouterr()
    (branch,) = pages_of(path, "branch", rec.DB_CHUNKS)
    flip(path, branch * 4096 + 16)
    assert cli.main(["verify", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    hint = f"; `ndindex verify --repair {path}` salvages what it can"
    assert len(err) == 1 and err[0].startswith(f"ndindex: {path}: ") and err[0].endswith(hint)
    assert cli.main(["query", path, "0x1234"]) == 2  # any command that meets the damage
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(hint)
    assert cli.main(["verify", "--repair", path]) == 0
    assert contents(path + ".recovered") == info["state"]
    out = str(tmp_path / "chosen.ndx")
    assert cli.main(["verify", "--repair", path, "-o", out]) == 0
    assert contents(out) == info["state"]


def test_format_1_file_is_refused_naming_upgrade(tmp_path):
    v1 = os.path.join(os.path.dirname(__file__), "..", "data", "format-v1.ndx")
    path = tmp_path / "old.ndx"
    shutil.copyfile(v1, path)
    with pytest.raises(FormatError, match="ndindex upgrade"):
        recover.recover(path, tmp_path / "out.ndx")
    assert cli.main(["recover", str(path), "-o", str(tmp_path / "out.ndx")]) == 2
    assert not (tmp_path / "out.ndx").exists()


def test_newer_format_is_refused(damaged, tmp_path):
    path, _ = damaged
    header = dict(records(path, rec.DB_META))[rec.KEY_HEADER]
    version = rec.FORMAT_VERSION + 1
    newer = header[:8] + version.to_bytes(2, "little") + header[10:40]
    with open(path, "r+b") as fh:  # a well-formed header of a newer format, checksum and all
        for at in occurrences(fh.read(), header):
            fh.seek(at)
            fh.write(rec.frame(rec.KEY_HEADER, newer))
    with pytest.raises(FormatError, match=f"read version {version}"):
        recover.recover(path, tmp_path / "out.ndx")
