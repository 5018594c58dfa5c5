"""Flipped bytes, truncated files, foreign files and newer versions give typed errors.

Every damaged record must surface as CorruptionError naming its
sub-database (or FormatError for a header that is not ours) from open(),
query() or verify() -- never a crash, never a wrong answer.

The damage is done to the file's bytes, as a failing disk would do it:
the fixture writes an index and then makes a compacting LMDB copy of it
(``Environment.copy(compact=True)``), which holds each live page once and
no stale copies, so a record's value occurs exactly once in the file and a
byte search finds where it lives.  Header versions are patched through
LMDB instead and re-framed with their checksum (ndindex.store.frame), since
the point there is a well-formed record with a newer version.
"""

from __future__ import annotations

import os
import shutil

import lmdb
import numpy as np
import pytest

from ndindex import CorruptionError, FormatError, ReadOnlyError, store as st
from ndindex.index import Index
from ndindex.tables import SEGMENT_HEADER_BYTES, BLOCK_BYTES

N_TABLE = 3000
N_LOG = 200
N_REMOVED = 3
DAMAGE = (CorruptionError, FormatError)


def fingerprints() -> np.ndarray:
    return np.unique(np.random.default_rng(5).integers(0, 2**64, N_TABLE + N_LOG, dtype=np.uint64))


def doc_key(i: int) -> str:
    return f"doc-{i}"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> str:
    """An index with tables, a log record, tombstones and document keys, copied compactly."""
    d = tmp_path_factory.mktemp("pristine")
    src, dst = str(d / "src.ndx"), str(d / "index.ndx")
    fps = fingerprints()
    with Index.create(src, k=3, expected_n=N_TABLE, log_limit=1 << 20) as ix:
        ix.add(fps[:N_TABLE], keys=[doc_key(i) for i in range(N_TABLE)])
        ix.compact()
        ix.add(fps[N_TABLE:])
        ix.remove(fps[:N_REMOVED])
    env = lmdb.open(src, subdir=False, max_dbs=len(st.ALL_DBS), readonly=True, lock=False)
    try:
        env.copy(dst, compact=True)
    finally:
        env.close()
    return dst


@pytest.fixture
def damaged(pristine, tmp_path) -> str:
    """A fresh copy of the pristine index to damage."""
    path = str(tmp_path / "index.ndx")
    shutil.copyfile(pristine, path)
    return path


def records(path, db: bytes) -> list[tuple[bytes, bytes]]:
    env = lmdb.open(path, subdir=False, max_dbs=len(st.ALL_DBS), readonly=True, lock=False)
    try:
        handle = env.open_db(db, create=False, dupsort=db in st.DUPSORT_DBS)
        with env.begin(db=handle) as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


def file_offset(path, needle: bytes) -> int:
    data = open(path, "rb").read()
    at = data.find(needle)
    assert at >= 0, "record not found in the file"
    assert data.find(needle, at + 1) < 0, "record occurs twice in the file"
    return at


def flip(path, offset: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ mask]))


def flip_value(path, db: bytes, key: bytes, at: int) -> None:
    """Flip byte `at` of the value stored under key in db, in the file itself."""
    value = dict(records(path, db))[key]
    # Short values are not unique on their own; the node holds key then value.
    needle = key + value if len(value) < 32 else value
    flip(path, file_offset(path, needle) + len(needle) - len(value) + at)


def assert_names(exc: pytest.ExceptionInfo, database: str) -> None:
    assert f"database={database}" in str(exc.value), str(exc.value)


def assert_all_answers_right_or_corrupt(ix: Index, expected: np.ndarray) -> int:
    """Query each fingerprint at k=0: itself, or CorruptionError.  Return the error count."""
    errors = 0
    for fp in expected.tolist():
        try:
            got = ix.query(fp, 0, keys=False)
        except CorruptionError:
            errors += 1
            continue
        assert [m.fingerprint for m in got] == [fp]
    return errors


def live_fingerprints() -> np.ndarray:
    return fingerprints()[N_REMOVED:]


# -- the pristine file ---------------------------------------------------------


def test_pristine_copy_opens_and_verifies(pristine, tmp_path):
    path = str(tmp_path / "copy.ndx")
    shutil.copyfile(pristine, path)
    with Index.open(path) as ix:
        ix.verify()
        assert assert_all_answers_right_or_corrupt(ix, live_fingerprints()) == 0
        assert ix.query(int(fingerprints()[0]), 0) == []
        assert ix.keys(int(fingerprints()[N_REMOVED])) == (doc_key(N_REMOVED),)


# -- segments ----------------------------------------------------------------


@pytest.mark.parametrize("at", [0, 4, 8, 100, SEGMENT_HEADER_BYTES - 1], ids=lambda a: f"header+{a}")
def test_flipped_segment_header_raises_corruption(damaged, at):
    key = records(damaged, st.DB_SEGMENTS)[0][0]
    flip_value(damaged, st.DB_SEGMENTS, key, at)
    with Index.open(damaged) as ix:
        with pytest.raises(CorruptionError) as exc:
            ix.query(1, 0)
        assert_names(exc, "segments")
        with pytest.raises(CorruptionError) as exc:
            ix.verify()
        assert_names(exc, "segments")


@pytest.mark.parametrize("at", [0, 3, 4, 6, 13, 14, 200, BLOCK_BYTES - 1],
                         ids=lambda a: f"block+{a}")
def test_flipped_block_byte_raises_corruption_never_wrong_answer(damaged, at):
    # Damage block 1 of table 0's first segment: its checksum, count, first
    # value, bitstream or padding.
    key = records(damaged, st.DB_SEGMENTS)[0][0]
    flip_value(damaged, st.DB_SEGMENTS, key, SEGMENT_HEADER_BYTES + BLOCK_BYTES + at)
    with Index.open(damaged) as ix:
        errors = assert_all_answers_right_or_corrupt(ix, live_fingerprints())
        # The fingerprints of that block are in it and nowhere else in table 0.
        assert errors > 0
        assert errors < len(live_fingerprints()) // 4
        with pytest.raises(CorruptionError) as exc:
            ix.verify()
        assert_names(exc, "segments")
        with pytest.raises(CorruptionError):
            ix.query_many(live_fingerprints(), k=3)


def test_flipped_segment_in_every_table_never_gives_wrong_answer(damaged):
    for key, _ in records(damaged, st.DB_SEGMENTS):
        flip_value(damaged, st.DB_SEGMENTS, key, SEGMENT_HEADER_BYTES + 3 * BLOCK_BYTES + 40)
    with Index.open(damaged) as ix:
        assert assert_all_answers_right_or_corrupt(ix, live_fingerprints()) > 0
        with pytest.raises(CorruptionError):
            ix.verify()


# -- log, tombstones, document keys -------------------------------------------


@pytest.mark.parametrize("at", [0, 4, 100, -1], ids=["count", "first", "middle", "crc"])
def test_flipped_log_record_raises_corruption(damaged, at):
    key, value = records(damaged, st.DB_LOG)[0]
    flip_value(damaged, st.DB_LOG, key, at % len(value))
    with Index.open(damaged) as ix:
        with pytest.raises(CorruptionError) as exc:
            ix.query(1, 0)
        assert_names(exc, "log")
        with pytest.raises(CorruptionError) as exc:
            ix.verify()
        assert_names(exc, "log")


@pytest.mark.parametrize("at", [0, 3], ids=["crc-first", "crc-last"])
def test_flipped_tombstone_raises_corruption(damaged, at):
    key, _ = records(damaged, st.DB_REMOVED)[1]
    flip_value(damaged, st.DB_REMOVED, key, at)
    with Index.open(damaged) as ix:
        with pytest.raises(CorruptionError) as exc:
            ix.verify()
        assert_names(exc, "removed")


def test_flipped_tombstone_key_never_revives_a_removed_fingerprint(damaged):
    # The tombstone's key *is* the removed fingerprint; a flipped key bit
    # would hide another fingerprint and bring the removed one back unless
    # its checksum is checked before the key is used ([C3]).
    key, value = records(damaged, st.DB_REMOVED)[1]
    flip(damaged, file_offset(damaged, key + value) + 7, 0x01)
    removed = fingerprints()[:N_REMOVED]
    with Index.open(damaged) as ix:
        for fp in removed.tolist():
            try:
                assert ix.query(fp, 0, keys=False) == []
            except CorruptionError as exc:
                assert "database=removed" in str(exc)
        assert_all_answers_right_or_corrupt(ix, live_fingerprints())
        with pytest.raises(CorruptionError) as exc:
            ix.verify()
        assert_names(exc, "removed")


def _single_doc(path) -> tuple[bytes, bytes, int]:
    """A docs record, and the index of its fingerprint in fingerprints()."""
    fps = fingerprints().tolist()
    key, value = records(path, st.DB_DOCS)[10]
    return key, value, fps.index(st.U64_BE.unpack(key)[0])


@pytest.mark.parametrize("at", [0, 4, -1], ids=["crc", "type", "last"])
def test_flipped_docs_record_raises_corruption(damaged, at):
    key, value, i = _single_doc(damaged)
    flip_value(damaged, st.DB_DOCS, key, at % len(value))
    fp = int(fingerprints()[i])
    with Index.open(damaged) as ix:
        assert [m.fingerprint for m in ix.query(fp, 0, keys=False)] == [fp]
        with pytest.raises(CorruptionError) as exc:
            ix.query(fp, 0)
        assert_names(exc, "docs")
        with pytest.raises(CorruptionError) as exc:
            ix.keys(fp)
        assert_names(exc, "docs")
        with pytest.raises(CorruptionError) as exc:
            ix.verify()
        assert_names(exc, "docs")


def test_flipped_keys_record_raises_corruption(damaged):
    key, value = records(damaged, st.DB_KEYS)[10]
    flip_value(damaged, st.DB_KEYS, key, 2)
    with Index.open(damaged) as ix:
        with pytest.raises(CorruptionError) as exc:
            ix.verify()
        assert_names(exc, "keys")
        with pytest.raises(CorruptionError) as exc:
            ix.remove(keys=[st.decode_doc_key(key)])
        assert_names(exc, "keys")


# -- meta records --------------------------------------------------------------


@pytest.mark.parametrize("record,at", [
    (st.META_HEADER, 0), (st.META_HEADER, 8), (st.META_HEADER, 13), (st.META_HEADER, -1),
    (st.META_PLAN, 0), (st.META_PLAN, 50), (st.META_PLAN, -2),
    (st.code_key(0), 0), (st.code_key(0), 20), (st.code_key(3), -1),
    (st.META_STATE, 0), (st.META_STATE, 30),
], ids=lambda v: v.decode(errors="replace") if isinstance(v, bytes) else str(v))
def test_flipped_meta_record_refuses_to_open(damaged, record, at):
    value = dict(records(damaged, st.DB_META))[record]
    flip_value(damaged, st.DB_META, record, at % len(value))
    with pytest.raises(DAMAGE) as exc:
        Index.open(damaged)
    assert_names(exc, "meta")
    with pytest.raises(DAMAGE):
        Index.open(damaged, readonly=True)


# -- truncated files -----------------------------------------------------------


@pytest.mark.parametrize("keep", [0, 1, 100, 4096, 8191, 8192, 12288, 0.5, -4096, -1],
                         ids=lambda v: f"keep={v}")
def test_truncated_file_raises_at_open(damaged, keep):
    size = os.path.getsize(damaged)
    keep = int(size * keep) if isinstance(keep, float) else (keep if keep >= 0 else size + keep)
    os.truncate(damaged, keep)
    with pytest.raises(DAMAGE):
        Index.open(damaged)
    with pytest.raises(DAMAGE):
        Index.open(damaged, readonly=True)


def test_truncated_file_is_left_alone(damaged):
    os.truncate(damaged, os.path.getsize(damaged) // 2)
    before = open(damaged, "rb").read()
    with pytest.raises(DAMAGE):
        Index.open(damaged)
    assert open(damaged, "rb").read() == before


# -- files that are not ours ---------------------------------------------------


def _write(path, data: bytes) -> str:
    with open(path, "wb") as fh:
        fh.write(data)
    return str(path)


@pytest.mark.parametrize("kind", ["empty", "text", "random-small", "random-large", "zeros"])
def test_non_index_file_raises_format_error(tmp_path, kind):
    data = {
        "empty": b"",
        "text": b"hello, this is not an index\n" * 1000,
        "random-small": np.random.default_rng(1).bytes(1000),
        "random-large": np.random.default_rng(2).bytes(1 << 16),
        "zeros": bytes(1 << 16),
    }[kind]
    path = _write(tmp_path / "foreign", data)
    for readonly in (False, True):
        with pytest.raises(FormatError):
            Index.open(path, readonly=readonly)
    assert open(path, "rb").read() == data


@pytest.mark.parametrize("content", ["empty", "plain-keys", "named-dbs", "meta-as-plain-key"])
def test_plain_lmdb_file_raises_format_error_and_is_not_modified(tmp_path, content):
    path = str(tmp_path / "plain.mdb")
    env = lmdb.open(path, subdir=False, max_dbs=4)
    with env.begin(write=True) as txn:
        if content == "plain-keys":
            txn.put(b"hello", b"world")
        elif content == "named-dbs":
            txn.put(b"header", b"x", db=env.open_db(b"meta", txn=txn))
        elif content == "meta-as-plain-key":
            txn.put(b"meta", b"not a sub-database")
    env.close()
    before = open(path, "rb").read()
    for readonly in (True, False):
        with pytest.raises(FormatError):
            Index.open(path, readonly=readonly)
    assert open(path, "rb").read() == before


# -- newer format versions -----------------------------------------------------


def patch_header(path, **fields) -> None:
    """Rewrite the header record with some fields changed, framed with a good checksum."""
    env = lmdb.open(path, subdir=False, max_dbs=len(st.ALL_DBS))
    try:
        meta = env.open_db(st.DB_META, create=False)
        with env.begin(write=True, db=meta) as txn:
            payload = st.unframe(txn.get(st.META_HEADER), st.DB_META, st.META_HEADER)
            names = ["magic", "read_version", "write_version", "f", "k", "tables", "reserved",
                     "expected_n"]
            values = dict(zip(names, st.HEADER.unpack(payload)))
            values.update(fields)
            txn.put(st.META_HEADER, st.frame(st.HEADER.pack(*(values[n] for n in names))))
    finally:
        env.close()


def test_newer_read_version_is_refused(damaged):
    patch_header(damaged, read_version=2, write_version=2)
    for readonly in (False, True):
        with pytest.raises(FormatError, match="read version 2 > supported 1"):
            Index.open(damaged, readonly=readonly)


def test_newer_write_version_opens_read_only(damaged):
    patch_header(damaged, write_version=2)
    with pytest.raises(FormatError, match="write version 2 > supported 1"):
        Index.open(damaged)
    with Index.open(damaged, readonly=True) as ix:
        assert ix.readonly
        fp = int(live_fingerprints()[7])
        assert [m.fingerprint for m in ix.query(fp, 0)] == [fp]
        ix.verify()
        with pytest.raises(ReadOnlyError):
            ix.add([1, 2, 3])
        with pytest.raises(ReadOnlyError):
            ix.remove([fp])
        with pytest.raises(ReadOnlyError):
            ix.compact()
        with pytest.raises(ReadOnlyError):
            ix.check_and_add(12345)


@pytest.mark.parametrize("field,value", [("magic", b"ndindeX\0"), ("f", 32), ("reserved", 1)])
def test_header_with_foreign_fields_is_refused(damaged, field, value):
    patch_header(damaged, **{field: value})
    with pytest.raises(FormatError):
        Index.open(damaged, readonly=True)
