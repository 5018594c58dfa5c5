"""ndindex upgrade: format-1 files become format-2 indexes holding exactly the same data.

The fixture tests/data/format-v1.ndx was made from known fingerprints and
keys (tests/data/README.md); every test checks the upgraded index against
those, rebuilt here, never against what the upgrade's own reader says.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys

import lmdb
import numpy as np
import pytest

from ndindex import _core, pages
from ndindex.cli import main
from ndindex.codec import CODING_DELTA, CODING_RESTARTS, CODING_XOR
from ndindex.errors import CorruptionError, FormatError, ReadOnlyError
from ndindex.fingerprint import Fingerprinter
from ndindex.index import Index
from ndindex.upgrade import FormatV1Reader, file_format, upgrade
from tests.oracle import brute_force, near

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "data", "format-v1.ndx")
FPS = np.random.default_rng(0).integers(0, 2**64, 1000, dtype=np.uint64)
#: Removed by fingerprint (0 and 900) and by key (doc5, its only key).
REMOVED = (0, 5, 900)


def expected_keys() -> dict:
    """fingerprint -> set of document keys, as tests/data/README.md says the fixture holds."""
    out = {}
    for i, fp in enumerate(FPS.tolist()):
        if i not in REMOVED:
            out[fp] = {f"doc{i}"} if i < 800 else {f"b{i - 800}".encode()}
    return out


def files(directory) -> list:
    """The names in a directory, but LMDB's lock files (every opener of an index makes one)."""
    return sorted(name for name in os.listdir(directory) if not name.endswith("-lock"))


def sha(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


@pytest.fixture
def v1(tmp_path):
    path = tmp_path / "v1.ndx"
    shutil.copyfile(FIXTURE, path)
    return str(path)


def assert_holds_fixture_data(path) -> None:
    """The index at path holds the fixture's live fingerprints and keys; queries match a scan."""
    want = expected_keys()
    live = np.array(sorted(want), dtype=np.uint64)
    with Index.open(path, readonly=True) as ix:
        assert len(ix) == len(want) == 997
        assert np.array_equal(ix.fingerprints(), live)
        for fp, keys in want.items():
            assert set(ix.keys(fp)) == keys
        for i in REMOVED:
            assert int(FPS[i]) not in ix
        rng = np.random.default_rng(7)
        queries = np.concatenate([near(rng, FPS, 150, 3),
                                  rng.integers(0, 2**64, 50, dtype=np.uint64)])
        for q in queries.tolist():
            for k in range(ix.k + 1):
                got = ix.query(q, k)
                assert [(m.fingerprint, m.distance) for m in got] == brute_force(live, q, k)
                assert all(set(m.keys) == want[m.fingerprint] for m in got)
        ix.verify()


def v1_meta_payload(path, key: bytes) -> bytes:
    """A format-1 meta record's payload, read with py-lmdb (independently of ndindex.upgrade)."""
    env = lmdb.open(path, subdir=False, readonly=True, lock=False, max_dbs=8)
    try:
        with env.begin() as txn:
            value = txn.get(key, db=env.open_db(b"meta", txn=txn, create=False))
    finally:
        env.close()
    return value[:-4]


def put_v1_meta(path, key: bytes, payload: bytes) -> None:
    """Write a framed format-1 meta record (payload, CRC-32C of the payload)."""
    env = lmdb.open(path, subdir=False, max_dbs=8, lock=False)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"meta", txn=txn, create=False)
            txn.put(key, payload + struct.pack("<I", _core.crc32c(payload)), db=db)
    finally:
        env.close()


# -- what the upgrade writes ------------------------------------------------------


def test_upgrade_to_output_holds_every_fingerprint_key_and_setting(v1, tmp_path):
    before = sha(v1)
    out = str(tmp_path / "v2.ndx")
    report = upgrade(v1, out)
    assert sha(v1) == before                                   # the source is only read
    assert report["upgraded"] and report["output"] == out and report["backup"] is None
    assert (report["fingerprints"], report["keys"], report["tables"]) == (997, 997, 4)
    assert (report["log_fingerprints"], report["tombstones"], report["orphan_keys"]) == (200, 3, 0)
    assert report["seconds"]["total"] > 0
    assert_holds_fixture_data(out)
    with Index.open(out, readonly=True) as ix:
        # The delta coding gains restart tables: the newest format, 3.
        assert (ix.k, ix.expected_n, ix.coding, ix.fingerprinter) == \
            (3, 1000, CODING_RESTARTS, None)
        assert ix.plan.to_bytes() == v1_meta_payload(v1, b"plan")
    assert files(tmp_path) == ["v1.ndx", "v2.ndx"]   # no temporaries left


def test_upgrade_in_place_keeps_the_original_as_backup(v1, tmp_path):
    before = sha(v1)
    report = upgrade(v1)
    assert report["output"] == v1 and report["backup"] == v1 + ".v1"
    assert sha(v1 + ".v1") == before
    assert file_format(v1) == 2 and file_format(v1 + ".v1") == 1
    assert_holds_fixture_data(v1)
    assert files(tmp_path) == ["v1.ndx", "v1.ndx.v1"]


def test_a_file_named_in_another_encoding_than_utf8_upgrades(tmp_path):
    name = str(tmp_path / os.fsdecode(b"caf\xe9.ndx"))      # Latin-1, not UTF-8
    try:
        shutil.copyfile(FIXTURE, name)
    except (OSError, UnicodeError):
        pytest.skip("this file system takes only UTF-8 names")
    report = upgrade(name)
    assert report["output"] == name and file_format(name) == 2
    assert_holds_fixture_data(name)


def test_upgrade_in_place_without_backup_deletes_the_original(v1, tmp_path):
    report = upgrade(v1, backup=False)
    assert report["backup"] is None
    assert_holds_fixture_data(v1)
    assert files(tmp_path) == ["v1.ndx"]


def test_upgrade_without_hard_links_copies_the_backup(v1, tmp_path, monkeypatch):
    link = os.link
    out = str(tmp_path / "out.ndx")

    def no_links(src, dst, **kwargs):
        # Only the upgrade's own links: Index.vacuum_into links too and has no fallback.
        if dst in (v1 + ".v1", out):
            raise PermissionError(1, "Operation not permitted")   # as file systems without them
        return link(src, dst, **kwargs)
    monkeypatch.setattr(os, "link", no_links)
    before = sha(v1)
    upgrade(v1)
    assert sha(v1 + ".v1") == before and not os.path.samefile(v1, v1 + ".v1")
    upgrade(v1 + ".v1", out)
    assert_holds_fixture_data(v1)
    assert_holds_fixture_data(out)
    assert files(tmp_path) == ["out.ndx", "v1.ndx", "v1.ndx.v1"]


def test_upgrade_in_place_keeps_file_permissions(v1, tmp_path):
    os.chmod(v1, 0o640)
    upgrade(v1)
    assert os.stat(v1).st_mode & 0o777 == 0o640


def test_upgrade_through_a_symlink_upgrades_the_file_it_names(v1, tmp_path):
    link = tmp_path / "link.ndx"
    link.symlink_to(v1)
    report = upgrade(str(link))
    assert report["output"] == str(link) and report["backup"] == v1 + ".v1"
    assert link.is_symlink() and file_format(v1) == 2
    assert_holds_fixture_data(str(link))


def test_upgrade_copies_the_fingerprinter_record(v1, tmp_path):
    fpr = Fingerprinter().to_bytes()
    put_v1_meta(v1, b"fingerprinter", fpr)
    upgrade(v1)
    with Index.open(v1, readonly=True) as ix:
        assert ix.fingerprinter == fpr


def test_upgrade_reports_progress_in_order(v1, tmp_path):
    seen = []
    upgrade(v1, str(tmp_path / "v2.ndx"), progress=lambda *a: seen.append(a))
    phases = [p for p, _, _ in seen]
    assert phases[0] == "reading" and ("adding", 997, 997) in seen
    assert phases.index("adding") < phases.index("compacting") < phases.index("checking")
    assert seen[-1] == ("checking", 997, 997)


def test_an_upgraded_file_is_left_alone(v1, tmp_path):
    assert upgrade(v1, backup=False)["format"] == 5
    before = sha(v1)
    report = upgrade(v1)
    assert report["upgraded"] is False and report["format"] == 5
    assert sha(v1) == before and not os.path.exists(v1 + ".v1")
    assert upgrade(v1, str(tmp_path / "out.ndx"))["upgraded"] is False
    assert not os.path.exists(tmp_path / "out.ndx")


def test_output_that_exists_is_refused(v1, tmp_path):
    out = tmp_path / "v2.ndx"
    out.write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        upgrade(v1, str(out))
    assert out.read_bytes() == b"mine"


def test_a_backup_name_taken_by_another_file_is_refused(v1, tmp_path):
    before = sha(v1)
    with open(v1 + ".v1", "wb") as fh:
        fh.write(b"someone else's")
    with pytest.raises(FileExistsError, match="v1.ndx.v1"):
        upgrade(v1)
    assert sha(v1) == before and pathlib.Path(v1 + ".v1").read_bytes() == b"someone else's"


@contextlib.contextmanager
def held_open(path: str, opener: str):
    """Another process holding path open (opener: Python that opens sys.argv[1])."""
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys; {opener}; print('open', flush=True); "
         "sys.stdin.read()", path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        yield
    finally:
        holder.communicate("", timeout=30)


def test_a_file_open_in_another_process_is_not_upgraded_in_place(v1):
    before = sha(v1)
    with held_open(v1, "import lmdb; e = lmdb.open(sys.argv[1], subdir=False, readonly=True, "
                       "max_dbs=8)"):
        with pytest.raises(ReadOnlyError, match="another process"):
            upgrade(v1)
    assert sha(v1) == before and not os.path.exists(v1 + ".v1")
    upgrade(v1)                                             # once it is closed, it goes
    assert_holds_fixture_data(v1)


def test_leftovers_of_an_interrupted_upgrade_are_cleared_and_nothing_else(v1, tmp_path):
    leftovers = [".v1.ndx.0123456789ab.upgrading", ".v1.ndx.0123456789ab.upgrading-lock",
                 "..v1.ndx.0123456789ab.upgrading.ba9876543210.creating",
                 "..v1.ndx.0123456789ab.upgrading.vacuum", "v1.ndx.v1.0123456789ab.copying"]
    unrelated = [".v1.ndx.upgrading", "v1.ndx.0123456789ab.upgrading", ".v1.ndx.notes",
                 ".other.ndx.0123456789ab.upgrading", "v1.ndx.0123456789ab.copying",
                 "v1.ndx.v1.copying", "other.ndx.v1.0123456789ab.copying"]
    for name in leftovers + unrelated:
        (tmp_path / name).write_bytes(b"x")
    upgrade(v1)
    assert files(tmp_path) == sorted(unrelated + ["v1.ndx", "v1.ndx.v1"])


def test_the_reader_sees_the_fixture_as_written(v1):
    with FormatV1Reader(v1) as reader:
        live = reader.fingerprints()
        assert np.array_equal(live, np.array(sorted(expected_keys()), dtype=np.uint64))
        assert len(reader.log_values()) == 200 and len(reader.tombstones()) == 3
        keys = {fp: set(ks) for fps, kss in reader.items(live, 100)
                for fp, ks in zip(fps.tolist(), kss)}
        assert keys == expected_keys()
        assert reader.check_key_mirror() == 997


def test_an_empty_format_1_index_upgrades_to_an_empty_index(v1, tmp_path):
    env = lmdb.open(v1, subdir=False, max_dbs=8, lock=False)
    with env.begin(write=True) as txn:
        for name in (b"segments", b"log", b"docs", b"keys", b"removed"):
            txn.drop(env.open_db(name, txn=txn, create=False,
                                 dupsort=name in (b"docs", b"keys")), delete=False)
    env.close()
    state = v1_meta_payload(v1, b"state")
    put_v1_meta(v1, b"state", state[:8] + bytes(8) + state[16:24] + bytes(8) + state[32:40]
                + bytes(8))                 # log_next_seq, table_entries, log_entries = 0
    report = upgrade(v1)
    assert (report["fingerprints"], report["keys"]) == (0, 0)
    with Index.open(v1, readonly=True) as ix:
        assert len(ix) == 0 and ix.query(int(FPS[1]), 3) == [] and ix.k == 3


def test_keys_of_a_fingerprint_that_is_not_live_are_counted_not_copied(v1, tmp_path):
    fp, raw = struct.pack(">Q", int(FPS[0])), b"\x01stale"   # FPS[0] was removed
    env = lmdb.open(v1, subdir=False, max_dbs=8, lock=False)
    with env.begin(write=True) as txn:
        txn.put(fp, struct.pack("<I", _core.crc32c(fp + raw)) + raw,
                db=env.open_db(b"docs", txn=txn, create=False, dupsort=True))
        txn.put(raw, fp + struct.pack("<I", _core.crc32c(raw + fp)),
                db=env.open_db(b"keys", txn=txn, create=False, dupsort=True))
    env.close()
    report = upgrade(v1, str(tmp_path / "v2.ndx"))
    assert (report["orphan_keys"], report["keys"]) == (1, 997)
    assert_holds_fixture_data(str(tmp_path / "v2.ndx"))


# -- what the upgrade refuses ---------------------------------------------------------


def test_a_file_that_is_not_an_index_is_refused(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello\n" * 5000)
    with pytest.raises(FormatError, match="not an ndindex file"):
        upgrade(str(path))
    env = lmdb.open(str(tmp_path / "other.mdb"), subdir=False, max_dbs=2)
    env.open_db(b"stuff")
    env.close()
    with pytest.raises(FormatError, match="not an ndindex file"):
        upgrade(str(tmp_path / "other.mdb"))


def test_a_newer_read_version_is_refused(v1):
    header = bytearray(v1_meta_payload(v1, b"header"))
    header[8:10] = struct.pack("<H", 3)
    put_v1_meta(v1, b"header", bytes(header))
    with pytest.raises(FormatError, match="read version 3 > supported 1"):
        upgrade(v1)


def record_offset(data: bytes, db: bytes, key: bytes, *, with_key: bool = False) -> int:
    """Where a record's value (or key then value) lies in the file's bytes; it must be unique."""
    env = lmdb.open(FIXTURE, subdir=False, readonly=True, lock=False, max_dbs=8)
    try:
        with env.begin() as txn:
            handle = env.open_db(db, txn=txn, create=False, dupsort=db in (b"docs", b"keys"))
            value = txn.get(key, db=handle)
    finally:
        env.close()
    needle = (key + value) if with_key else value
    assert data.count(needle) == 1
    return data.index(needle) + (len(key) if with_key else 0)


def tree_root_page(path, name: str) -> int:
    fm = pages.FileMap(path)
    try:
        meta = max(fm.metas(), key=lambda m: m["txnid"])
        buf = fm.buffer(os.path.getsize(path))
        return pages.named_trees(buf, meta["psize"], meta["last_pg"] + 1,
                                 pages.Tree.from_record(meta["main"]), [name])[name].root
    finally:
        fm.close()


def _segment(data):
    fp = int(np.sort(FPS[:800])[-1])      # table 0 has the identity permutation: its last segment
    return record_offset(data, b"segments", b"\x00" + struct.pack(">Q", fp))


DAMAGE = {
    # name: (offset in the file, the database the error must name)
    "block": (lambda data: _segment(data) + 512 + 300, "segments"),
    "segment header": (lambda data: _segment(data) + 8, "segments"),
    "docs record": (lambda data: record_offset(data, b"docs", struct.pack(">Q", int(FPS[17]))) + 6,
                    "docs"),
    "keys record": (lambda data: record_offset(data, b"keys", b"\x00b17") + 2, "keys"),
    "log record": (lambda data: record_offset(data, b"log", struct.pack(">Q", 1)) + 100, "log"),
    "tombstone": (lambda data: record_offset(data, b"removed", struct.pack(">Q", int(FPS[5])),
                                             with_key=True), "removed"),
    "header": (lambda data: record_offset(data, b"meta", b"header") + 17, "meta"),
    "docs tree page": (lambda data: 4096 * tree_root_page(FIXTURE, "docs") + 3, "lmdb"),
}


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "to-output"])
@pytest.mark.parametrize("what", sorted(DAMAGE))
def test_damage_raises_corruption_and_leaves_no_trace(v1, tmp_path, what, in_place):
    data = bytearray(pathlib.Path(FIXTURE).read_bytes())
    where, database = DAMAGE[what]
    data[where(bytes(data))] ^= 0x10
    with open(v1, "wb") as fh:
        fh.write(data)
    out = None if in_place else str(tmp_path / "v2.ndx")
    with pytest.raises(CorruptionError) as info:
        upgrade(v1, out)
    assert f"database={database}" in str(info.value)
    assert pathlib.Path(v1).read_bytes() == bytes(data)
    assert files(tmp_path) == ["v1.ndx"]


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "to-output"])
def test_a_truncated_file_raises_corruption_and_leaves_no_trace(v1, tmp_path, in_place):
    size = os.path.getsize(v1)
    os.truncate(v1, size - 3 * 4096)
    with pytest.raises(CorruptionError, match="truncated"):
        upgrade(v1, None if in_place else str(tmp_path / "v2.ndx"))
    assert os.path.getsize(v1) == size - 3 * 4096
    assert files(tmp_path) == ["v1.ndx"]


def test_keys_that_do_not_mirror_docs_are_corruption(v1, tmp_path):
    env = lmdb.open(v1, subdir=False, max_dbs=8, lock=False)
    with env.begin(write=True) as txn:
        db = env.open_db(b"keys", txn=txn, create=False, dupsort=True)
        raw, fp = b"\x01doc17", struct.pack(">Q", int(FPS[17]))
        assert txn.delete(raw, fp + struct.pack("<I", _core.crc32c(raw + fp)), db=db)
    env.close()
    with pytest.raises(CorruptionError, match="does not mirror"):
        upgrade(v1, str(tmp_path / "v2.ndx"))
    assert files(tmp_path) == ["v1.ndx"]


# -- the command ------------------------------------------------------------------------


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_upgrades_in_place(v1, capsys):
    status, out, err = run(capsys, "upgrade", v1)
    assert status == 0 and err == ""
    assert out == (f"upgraded {v1} to format 5: 997 fingerprints, 997 document keys, 4 tables; "
                   f"original kept as {v1}.v1 ({os.path.getsize(v1 + '.v1'):,} -> "
                   f"{os.path.getsize(v1):,} bytes, {out.rsplit(', ', 1)[1]}")
    assert_holds_fixture_data(v1)
    status, out, err = run(capsys, "upgrade", v1)
    assert (status, out, err) == (0, f"{v1}: already format 5, nothing to do\n", "")


def test_cli_json_and_output(v1, tmp_path, capsys):
    out_path = str(tmp_path / "v2.ndx")
    status, out, err = run(capsys, "upgrade", v1, "-o", out_path, "--json")
    doc = json.loads(out)
    assert status == 0 and err == ""
    assert doc["upgraded"] and doc["output"] == out_path and doc["fingerprints"] == 997
    assert file_format(v1) == 1
    assert_holds_fixture_data(out_path)
    status, out, err = run(capsys, "upgrade", out_path, "--json")
    assert status == 0 and json.loads(out)["upgraded"] is False


def test_cli_no_backup(v1, tmp_path, capsys):
    status, out, _ = run(capsys, "upgrade", v1, "--no-backup")
    assert status == 0 and "original deleted" in out and not os.path.exists(v1 + ".v1")


def test_cli_errors_are_one_line_with_status_2(v1, tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_bytes(b"hello\n" * 5000)
    status, out, err = run(capsys, "upgrade", str(text))
    assert (status, out) == (2, "")
    assert err.startswith(f"ndindex: {text}: not an ndindex file") and err.count("\n") == 1
    status, _, err = run(capsys, "upgrade", str(tmp_path / "missing.ndx"))
    assert status == 2 and err == f"ndindex: {tmp_path / 'missing.ndx'}: no such index\n"
    status, _, err = run(capsys, "upgrade", v1, "-o", str(text))
    assert status == 2 and err == f"ndindex: {text}: already exists\n"
    status, _, err = run(capsys, "upgrade", v1, "-o", str(tmp_path / "x.ndx"), "--no-backup")
    assert status == 2 and err.startswith("ndindex: error: --no-backup is for in-place")
    data = bytearray(pathlib.Path(v1).read_bytes())
    data[record_offset(bytes(data), b"docs", struct.pack(">Q", int(FPS[17]))) + 6] ^= 1
    pathlib.Path(v1).write_bytes(data)
    status, _, err = run(capsys, "upgrade", v1)
    assert status == 2 and err.startswith(f"ndindex: {v1}: document key record checksum mismatch")
    assert err.count("\n") == 1 and not os.path.exists(v1 + ".v1")


def test_cli_help_has_examples_and_exit_status(capsys):
    status, out, _ = run(capsys, "upgrade", "--help")
    assert status == 0
    assert "ndindex upgrade pages.ndx -o pages-v2.ndx" in out and "exit status:" in out
    assert "already in the newest format" in out and "INDEX.v1" in out


# -- format 2 (the delta coding) to format 5 (restart tables) ---------------------------


def format_2(path, coding=CODING_DELTA, compacted=False):
    """A format-2 index with keys: a main Huffman run, raw runs flushed
    after it, tombstones and a log; return its fingerprints -> keys."""
    rng = np.random.default_rng(21)
    fps = np.unique(rng.integers(0, 2**64, 6000, dtype=np.uint64))
    held = {}
    with Index.create(path, k=3, expected_n=len(fps), coding=coding,
                      background_compaction=False) as ix:
        for i, part in enumerate(np.array_split(fps, 3)):
            keys = [f"doc-{i}-{j}" for j in range(len(part))]
            ix.add(part, keys=keys)
            held.update(zip(part.tolist(), ({k} for k in keys)))
            if i == 0:
                ix.compact(full=True)
            else:
                ix._compactor.flush_log()
        gone = fps[::7]
        ix.remove(fingerprints=gone)
        for fp in gone.tolist():
            del held[fp]
        ix.add(fps[:5] ^ np.uint64(1 << 63))  # stays in the log
        held.update((fp, set()) for fp in (fps[:5] ^ np.uint64(1 << 63)).tolist())
        if compacted:  # each table one Huffman run, the log empty
            ix.compact(full=True)
    return held


def contents(path):
    with Index.open(path, readonly=True) as ix:
        out = {}
        for fps, keys in ix.items():
            out.update((fp, set(ks)) for fp, ks in zip(fps.tolist(), keys))
        return out


def codings(path):
    """The file's coding and versions, and the codings of its Huffman runs."""
    from ndindex import runs as rn
    with Index.open(path, readonly=True) as ix:
        h = ix._header
        return (h.coding, h.read_version, h.write_version), \
            {rn.run_code(r).coding for r in ix._snapshot().manifest.runs
             if r.kind == rn.KIND_HUFFMAN}


@pytest.mark.parametrize("compacted", [False, True], ids=["living", "compacted"])
def test_a_delta_file_gains_restart_tables_in_place(tmp_path, compacted):
    path = str(tmp_path / "d.ndx")
    held = format_2(path, compacted=compacted)
    assert codings(path) == ((CODING_DELTA, 2, 2), {CODING_DELTA})
    report = upgrade(path)
    assert report["upgraded"] and not report["rebuilt"] and report["format"] == 5
    assert report["output"] == path and report["fingerprints"] == len(held)
    # Even a table already in one run is rewritten (FORMAT.md 7.2).
    assert codings(path) == ((CODING_RESTARTS, 5, 5), {CODING_RESTARTS})
    assert contents(path) == held
    with Index.open(path) as ix:
        ix.verify()
        stored = np.array(sorted(held), dtype=np.uint64)
        for q in stored[::400].tolist():
            assert [m.fingerprint for m in ix.query(q ^ 5, 3)] == \
                [int(v) for v in stored if bin(int(v) ^ q ^ 5).count("1") <= 3]
    assert upgrade(path)["upgraded"] is False
    assert sorted(os.listdir(tmp_path)) == ["d.ndx", "d.ndx-lock"]


def test_a_delta_file_upgraded_to_output_is_left_as_it_is(tmp_path):
    path, out = str(tmp_path / "d.ndx"), str(tmp_path / "out.ndx")
    held = format_2(path)
    before = sha(path)
    report = upgrade(path, out)
    assert report["upgraded"] and report["output"] == out and report["format"] == 5
    assert sha(path) == before
    assert codings(path) == ((CODING_DELTA, 2, 2), {CODING_DELTA})
    assert codings(out) == ((CODING_RESTARTS, 5, 5), {CODING_RESTARTS})
    assert contents(out) == held
    with pytest.raises(FileExistsError):
        upgrade(path, out)


def test_an_interrupted_upgrade_leaves_a_whole_index_that_the_next_finishes(tmp_path):
    # The header names coding 2 before the full compaction rewrites the
    # tables: a file of both codings reads, writes and verifies.
    import dataclasses
    from ndindex.writer import put_header
    path = str(tmp_path / "d.ndx")
    held = format_2(path)
    with Index.open(path, background_compaction=False) as ix:
        header = dataclasses.replace(ix._header, coding=CODING_RESTARTS, read_version=3,
                                     write_version=3)
        ix._store.write(lambda wt: put_header(wt, header), sync=True)
    with Index.open(path, background_compaction=False) as ix:
        extra = np.arange(1, 2000, dtype=np.uint64) * np.uint64(2**50)
        ix.add(extra)
        ix._compactor.flush_log()
        ix.verify()
        held.update((fp, set()) for fp in extra.tolist())
    assert codings(path) == ((CODING_RESTARTS, 3, 3), {CODING_DELTA})
    assert contents(path) == held
    report = upgrade(path)
    assert report["upgraded"] and codings(path)[1] == {CODING_RESTARTS}
    assert contents(path) == held


def test_an_xor_file_keeps_its_coding(tmp_path):
    path = str(tmp_path / "x.ndx")
    format_2(path, coding=CODING_XOR)
    before = sha(path)
    report = upgrade(path)
    assert report["upgraded"] is False and report["format"] == 2 and sha(path) == before


def test_a_delta_file_open_in_another_process_is_not_upgraded_in_place(tmp_path):
    path = str(tmp_path / "d.ndx")
    format_2(path)
    with held_open(path, "from ndindex import Index; ix = Index.open(sys.argv[1], readonly=True)"):
        with pytest.raises(ReadOnlyError, match="another process"):
            upgrade(path)
    assert codings(path)[0] == (CODING_DELTA, 2, 2)
    assert upgrade(path)["upgraded"]


def test_a_process_opening_a_delta_file_after_the_check_stops_the_header_commit(tmp_path,
                                                                             monkeypatch):
    # The upgrade checks LMDB's lock file, lets go, then opens the file: a
    # process that opens it in between must still stop the header's commit
    # (it holds the open lock), not read on in the old format.
    import ndindex.upgrade as up
    path = str(tmp_path / "d.ndx")
    format_2(path)
    checked = up._exclusive

    holders = contextlib.ExitStack()

    @contextlib.contextmanager
    def check_then_open(p):
        with checked(p):
            yield
        holders.enter_context(held_open(path, "from ndindex import Index; "
                                              "ix = Index.open(sys.argv[1], readonly=True)"))
    monkeypatch.setattr(up, "_exclusive", check_then_open)
    with holders, pytest.raises(ReadOnlyError, match="another process"):
        upgrade(path)
    assert codings(path)[0] == (CODING_DELTA, 2, 2)
    monkeypatch.undo()
    assert upgrade(path)["upgraded"] and codings(path)[0][0] == CODING_RESTARTS
