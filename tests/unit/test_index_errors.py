"""Bad input, misuse and hostile environments give typed errors and lose nothing stored.

Covers the issue's robustness list for Index: wrong argument types and
ranges (TypeError/ValueError, nothing written), use after close
(ClosedError), writes to a read-only index (ReadOnlyError), read-only files
and directories, a map that must grow (in this process and in another
one), and a full disk (CapacityError, earlier data intact).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import lmdb
import numpy as np
import pytest

import ndindex.store as st
from ndindex import CapacityError, ClosedError, NdindexError, ReadOnlyError
from ndindex.index import Index

K = 3


def stored_fingerprints() -> np.ndarray:
    return np.unique(np.random.default_rng(11).integers(0, 2**64, 500, dtype=np.uint64))


@pytest.fixture
def path(tmp_path) -> str:
    """An index holding stored_fingerprints() (half in the tables, half in the log), with keys."""
    p = str(tmp_path / "index.ndx")
    fps = stored_fingerprints()
    with Index.create(p, k=K, expected_n=1000, log_limit=1 << 20) as ix:
        ix.add(fps[:250], keys=[f"t{i}" for i in range(250)])
        ix.compact()
        ix.add(fps[250:], keys=[f"l{i}".encode() for i in range(250, len(fps))])
    return p


@pytest.fixture
def ix(path):
    with Index.open(path) as index:
        yield index


def assert_intact(index: Index) -> None:
    """Every stored fingerprint is there with its key, nothing else, and verify() passes."""
    fps = stored_fingerprints()
    index.verify()
    assert len(index) == len(fps)
    assert np.array_equal(index.fingerprints(), fps)
    assert index.keys(int(fps[0])) == ("t0",)
    assert index.keys(int(fps[-1])) == (f"l{len(fps) - 1}".encode(),)


# -- wrong types and ranges ----------------------------------------------------


BAD_FINGERPRINTS = [
    ("str", "123", TypeError),
    ("bytes", b"\x01" * 8, TypeError),
    ("float", 1.5, TypeError),
    ("float-integral", 2.0, TypeError),
    ("none", None, TypeError),
    ("bool", True, TypeError),
    ("negative", -1, ValueError),
    ("too-large", 1 << 64, ValueError),
    ("huge", 10**30, ValueError),
    ("numpy-float", np.float64(3.0), TypeError),
]


@pytest.mark.parametrize("name,value,error", BAD_FINGERPRINTS, ids=[b[0] for b in BAD_FINGERPRINTS])
def test_bad_fingerprint_raises_for_every_entry_point(ix, name, value, error):
    with pytest.raises(error):
        ix.query(value)
    with pytest.raises(error):
        ix.keys(value)
    with pytest.raises(error):
        ix.check_and_add(value)
    with pytest.raises(error):
        value in ix  # noqa: B015
    with pytest.raises(error):
        ix.add([1, value])
    with pytest.raises(error):
        ix.query_many([1, value])
    with pytest.raises(error):
        ix.remove([1, value])
    assert_intact(ix)


@pytest.mark.parametrize("batch,error", [
    ("a string", TypeError),
    (b"bytes", TypeError),
    (1.5, TypeError),
    (np.array([1.0, 2.0]), TypeError),
    (np.array([1, -2], dtype=np.int64), ValueError),
    (np.array(["1", "2"]), TypeError),
    ([1, "2"], TypeError),
    ([[1, 2]], TypeError),
    (object(), TypeError),
], ids=["str", "bytes", "float", "float-array", "negative-array", "str-array", "mixed-list",
        "nested-list", "object"])
def test_bad_fingerprint_batch_raises_and_writes_nothing(ix, batch, error):
    with pytest.raises(error):
        ix.add(batch)
    with pytest.raises(error):
        ix.query_many(batch)
    assert_intact(ix)


@pytest.mark.parametrize("keys,error", [
    ("one-string", TypeError),
    (b"one-bytes", TypeError),
    ([1, 2], TypeError),
    ([1.0, "x"], TypeError),
    (["only-one"], ValueError),
    (["a", "b", "c"], ValueError),
    (["", "b"], ValueError),
    ([b"", "b"], ValueError),
    (["x" * (st.MAX_DOC_KEY_BYTES + 1), "b"], ValueError),
    ([b"x" * (st.MAX_DOC_KEY_BYTES + 1), "b"], ValueError),
    (["\udcff", "b"], UnicodeEncodeError),
], ids=["str", "bytes", "ints", "float", "too-few", "too-many", "empty-str", "empty-bytes",
        "long-str", "long-bytes", "lone-surrogate"])
def test_bad_keys_raise_and_write_nothing(ix, keys, error):
    new = [12345, 67890]
    with pytest.raises(error):
        ix.add(new, keys=keys)
    assert 12345 not in ix and 67890 not in ix
    assert_intact(ix)


def test_longest_key_is_accepted(ix):
    key = "k" * st.MAX_DOC_KEY_BYTES
    ix.add([42], keys=[key])
    assert ix.keys(42) == (key,)


@pytest.mark.parametrize("k,error", [
    (-1, ValueError), (K + 1, ValueError), (64, ValueError), (True, TypeError),
    (False, TypeError), (1.0, TypeError), ("2", TypeError),
])
def test_k_out_of_range_or_wrong_type_raises(ix, k, error):
    fp = int(stored_fingerprints()[0])
    with pytest.raises(error):
        ix.query(fp, k)
    with pytest.raises(error):
        ix.query_many([fp], k)
    with pytest.raises(error):
        ix.check_and_add(fp, k=k)


@pytest.mark.parametrize("k,error", [(-1, ValueError), (65, ValueError), (True, TypeError),
                                     (2.0, TypeError), (None, TypeError)])
def test_create_with_bad_k_raises_and_leaves_no_file(tmp_path, k, error):
    p = tmp_path / "x.ndx"
    with pytest.raises(error):
        Index.create(p, k=k)
    assert not p.exists()


def test_remove_without_arguments_raises(ix):
    with pytest.raises(TypeError):
        ix.remove()
    with pytest.raises(TypeError):
        ix.remove(keys=[3])


def test_create_over_existing_file_raises_and_keeps_it(path):
    with pytest.raises(FileExistsError):
        Index.create(path)
    with Index.open(path) as index:
        assert_intact(index)


def test_open_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        Index.open(tmp_path / "missing.ndx")
    assert not (tmp_path / "missing.ndx").exists()


# -- closed and read-only indexes ----------------------------------------------


def test_closed_index_raises_closed_error(path):
    index = Index.open(path)
    index.query(1)
    index.close()
    index.close()  # idempotent
    fp = int(stored_fingerprints()[0])
    for call in (lambda: index.query(fp), lambda: index.query_many([fp]), lambda: index.keys(fp),
                 lambda: fp in index, lambda: len(index), lambda: index.add([1]),
                 lambda: index.remove([fp]), lambda: index.compact(), lambda: index.verify(),
                 lambda: index.stats(), lambda: index.fingerprints(),
                 lambda: index.check_and_add(7)):
        with pytest.raises(ClosedError):
            call()
    with Index.open(path) as again:
        assert_intact(again)


def test_read_only_index_refuses_writes(path):
    fp = int(stored_fingerprints()[0])
    with Index.open(path, readonly=True) as index:
        assert index.readonly
        for call in (lambda: index.add([1]), lambda: index.add([1], keys=["k"]),
                     lambda: index.remove([fp]), lambda: index.remove(keys=["t0"]),
                     lambda: index.compact(), lambda: index.compact(full=True),
                     lambda: index.check_and_add(99)):
            with pytest.raises(ReadOnlyError):
                call()
        assert_intact(index)


def _privileged() -> bool:
    """Whether this process ignores file permissions (root, CAP_DAC_OVERRIDE)."""
    return os.geteuid() == 0 if hasattr(os, "geteuid") else False


def test_read_only_file_opens_read_only(path):
    os.chmod(path, 0o444)
    try:
        with Index.open(path, readonly=True) as index:
            assert_intact(index)
        if not _privileged():
            with pytest.raises(NdindexError):
                Index.open(path)
    finally:
        os.chmod(path, 0o644)
    with Index.open(path) as index:
        assert_intact(index)


def test_read_only_directory_opens_read_only(tmp_path, path):
    # A copy in a directory with no lock file, then made read-only: LMDB
    # cannot create its lock file there.
    d = tmp_path / "ro"
    d.mkdir()
    copy = d / "index.ndx"
    copy.write_bytes(open(path, "rb").read())
    os.chmod(copy, 0o444)
    os.chmod(d, 0o555)
    try:
        with Index.open(copy, readonly=True) as index:
            assert_intact(index)
        if not _privileged():
            assert not (d / "index.ndx-lock").exists()
            with pytest.raises(NdindexError):
                Index.open(copy)
    finally:
        os.chmod(d, 0o755)
    assert sorted(os.listdir(d)) in (["index.ndx"], ["index.ndx", "index.ndx-lock"])


def test_read_only_directory_without_lock_file_falls_back_to_no_lock(path, monkeypatch):
    # Root ignores directory permissions, so the refusal LMDB gives an
    # ordinary user in a read-only directory is simulated: opening with a
    # lock file fails with EACCES as it would there.
    real_open = lmdb.open
    calls = []

    def refusing_open(p, **kwargs):
        calls.append(kwargs.get("lock", True))
        if kwargs.get("lock", True):
            raise lmdb.ReadonlyError("mdb_env_open: Permission denied")
        return real_open(p, **kwargs)

    monkeypatch.setattr(st.lmdb, "open", refusing_open)
    with Index.open(path, readonly=True) as index:
        assert_intact(index)
    assert calls == [True, False]
    calls.clear()
    with pytest.raises(ReadOnlyError):
        Index.open(path)
    assert calls == [True]


# -- map growth ----------------------------------------------------------------


def test_map_grows_by_itself(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "INITIAL_MAP_SIZE_BYTES", 256 << 10)
    p = str(tmp_path / "grow.ndx")
    rng = np.random.default_rng(3)
    added = []
    with Index.create(p, k=K, expected_n=100_000, log_limit=20_000) as index:
        first = index._store.env.info()["map_size"]
        for i in range(12):
            batch = rng.integers(0, 2**64, 10_000, dtype=np.uint64)
            index.add(batch, keys=[f"{i}/{j}" for j in range(0, len(batch))])
            added.append(batch)
            if i % 4 == 3:
                index.compact(full=i % 8 == 7)
        grown = index._store.env.info()["map_size"]
        assert grown >= 8 * first, (first, grown)
        index.verify()
    added = np.unique(np.concatenate(added))
    with Index.open(p, readonly=True) as index:
        index.verify()
        assert np.array_equal(index.fingerprints(), added)
        assert index.keys(int(batch[5])) == ("11/5",)


def test_map_grows_during_a_compaction_that_rebuilds_codes(tmp_path, monkeypatch):
    # The map fills up inside compact(full=True): the transaction is
    # aborted and run again on a larger map, and the retry must decode the
    # old blocks with the old codes, not the ones the aborted attempt made.
    monkeypatch.setattr(st, "INITIAL_MAP_SIZE_BYTES", 256 << 10)
    monkeypatch.setattr(st, "PREGROW_MAP", False)
    p = str(tmp_path / "grow.ndx")
    rng = np.random.default_rng(5)
    with Index.create(p, k=K, expected_n=1000, log_limit=1 << 30) as index:
        first = rng.integers(0, 2**64, 20_000, dtype=np.uint64)
        index.add(first)
        index.compact()
        second = rng.integers(0, 2**64, 60_000, dtype=np.uint64)
        index.add(second)
        before = index._store.env.info()["map_size"]
        assert index.compact(full=True)["codes_rebuilt"]
        assert index._store.env.info()["map_size"] > before
        index.verify()
        assert np.array_equal(index.fingerprints(), np.union1d(first, second))


WRITER = textwrap.dedent("""
    import sys, numpy as np, ndindex.store as st
    st.INITIAL_MAP_SIZE_BYTES = 256 << 10
    from ndindex.index import Index
    with Index.open(sys.argv[1], log_limit=1 << 30) as ix:
        rng = np.random.default_rng(4)
        for _ in range(8):
            ix.add(rng.integers(0, 2**64, 40_000, dtype=np.uint64))
        ix.add([777])
        print(ix._store.env.info()["map_size"])
""")


def test_reader_adopts_a_map_grown_by_another_process(path, monkeypatch):
    # The reader's map is smaller than what the writer will grow the file
    # to; its next query must remap, and must not reuse block addresses of
    # the old map (the tables did not change, only the log did).
    monkeypatch.setattr(st, "INITIAL_MAP_SIZE_BYTES", 256 << 10)
    fps = stored_fingerprints()
    with Index.open(path, readonly=True) as reader:
        before = reader._store.env.info()["map_size"]
        assert [m.fingerprint for m in reader.query(int(fps[0]), 0)] == [int(fps[0])]
        out = subprocess.run([sys.executable, "-c", WRITER, path], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout) > before and os.path.getsize(path) > before
        assert [m.fingerprint for m in reader.query(int(fps[0]), 0)] == [int(fps[0])]
        assert 777 in reader
        assert len(reader.query_many(fps, k=0)) == len(fps)
        reader.verify()


# -- full disk -----------------------------------------------------------------


@pytest.mark.parametrize("error", [lmdb.DiskError("mdb_txn_commit: No space left on device"),
                                   lmdb.Error("mdb_txn_commit: File too large")],
                         ids=["ENOSPC", "EFBIG"])
def test_full_disk_raises_capacity_error_and_loses_nothing(path, monkeypatch, error):
    index = Index.open(path, log_limit=100)
    real_put = st.Store.put_framed

    def full(self, txn, db, key, payload):
        if db == st.DB_META and key == st.META_STATE:
            raise error
        return real_put(self, txn, db, key, payload)

    monkeypatch.setattr(st.Store, "put_framed", full)
    for call in (lambda: index.add([1, 2, 3], keys=["a", "b", "c"]),  # compacts: log_limit=100
                 lambda: index.add([4]), lambda: index.compact(full=True),
                 lambda: index.remove(stored_fingerprints()[:5])):
        with pytest.raises(CapacityError, match="disk full"):
            call()
        assert_intact(index)
    monkeypatch.undo()
    index.add([1, 2, 3], keys=["a", "b", "c"])
    assert index.keys(2) == ("b",)
    index.close()


FILE_SIZE_LIMITED_WRITER = textwrap.dedent("""
    import os, resource, signal, sys
    import numpy as np
    from ndindex import CapacityError
    from ndindex.index import Index
    path = sys.argv[1]
    # With SIGXFSZ ignored, a write past RLIMIT_FSIZE fails (EFBIG or a short
    # write) instead of killing the process: a full disk in miniature.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = os.path.getsize(path) + (512 << 10)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    ix = Index.open(path, log_limit=30_000)
    rng = np.random.default_rng(8)
    for b in range(1000):
        try:
            ix.add(rng.integers(0, 2**64, 4000, dtype=np.uint64) | np.uint64(1))
        except CapacityError as exc:
            print("full", b, exc, flush=True)
            break
        print("ok", b, flush=True)
    try:
        ix.compact(full=True)
        print("compacted", flush=True)
    except CapacityError:
        print("compact full", flush=True)
    ix.close()
""")


def test_file_size_limit_raises_capacity_error_and_keeps_committed_adds(path):
    out = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMITED_WRITER, path],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("full") for line in lines), lines[-3:]
    acked = [int(line.split()[1]) for line in lines if line.startswith("ok ")]
    assert acked, lines
    rng = np.random.default_rng(8)
    batches = [rng.integers(0, 2**64, 4000, dtype=np.uint64) | np.uint64(1) for _ in acked]
    with Index.open(path) as index:
        index.verify()
        for batch in batches:
            assert len(index.query_many(batch, k=0)) == len(np.unique(batch))
        fps = stored_fingerprints()
        assert len(index.query_many(fps, k=0)) == len(fps)
        assert index.keys(int(fps[0])) == ("t0",)
        # Without the limit the same file takes writes again.
        index.add([5, 6])
        index.compact()
        assert 5 in index
        index.verify()
