"""Fingerprint files (ndindex.fpfile): round trips, keys, pairs, corruption and truncation."""

import errno
import gc
import os

import numpy as np
import pytest

from ndindex import fpfile
from ndindex.errors import CorruptionError, FormatError


@pytest.fixture
def values():
    return np.random.default_rng(5).integers(0, 2**64, 2500, dtype=np.uint64)


def test_round_trip_sorted_and_unsorted(tmp_path, values):
    for name, fps in [("sorted", np.sort(values)), ("unsorted", values)]:
        path = tmp_path / f"{name}.ndfp"
        assert fpfile.write_fingerprints(path, fps, chunk_size=1000) == len(fps)
        with fpfile.FingerprintReader(path) as r:
            assert (r.n_chunks, r.count) == (3, len(fps))
            assert np.array_equal(r.read_all(), fps)
            assert r.check()["count"] == len(fps)


def test_sorted_chunks_compress_below_eight_bytes(tmp_path):
    fps = np.sort(np.random.default_rng(1).integers(0, 2**64, 100_000, dtype=np.uint64))
    fpfile.write_fingerprints(tmp_path / "s.ndfp", fps)
    assert os.path.getsize(tmp_path / "s.ndfp") < 6.5 * len(fps)


def test_streamed_writes_and_chunk_access(tmp_path, values):
    path = tmp_path / "parts.ndfp"
    fpfile.write_fingerprints(path, (values[a:a + 333] for a in range(0, len(values), 333)),
                              chunk_size=1000)
    with fpfile.FingerprintReader(path) as r:
        assert np.array_equal(r.chunk(1), values[1000:2000])
        with pytest.raises(IndexError):
            r.chunk(3)


def test_keys_round_trip(tmp_path):
    fps = np.array([3, 1, 2], dtype=np.uint64)
    fpfile.write_fingerprints(tmp_path / "k.ndfp", fps, keys=["é", b"\xff", None], chunk_size=2)
    with fpfile.FingerprintReader(tmp_path / "k.ndfp") as r:
        assert r.has_keys
        chunks = list(r)
    assert [c[1] for c in chunks] == [["é".encode(), b"\xff"], [b""]]
    assert np.array_equal(np.concatenate([c[0] for c in chunks]), fps)


def test_pairs_round_trip(tmp_path):
    pairs = np.zeros(5, dtype=fpfile.PAIR_DTYPE)
    pairs["q"] = [1, 1, 2, 9, 2**64 - 1]
    pairs["f"] = [2**64 - 1, 0, 5, 8, 3]
    pairs["distance"] = [63, 1, 2, 1, 62]
    fpfile.write_pairs(tmp_path / "p.ndfp", [pairs[:2], pairs[2:]], chunk_size=3)
    got = np.concatenate(list(fpfile.read_pairs(str(tmp_path / "p.ndfp"))))
    assert np.array_equal(got, pairs)


def test_fingerprints_and_pairs_are_checked_as_index_add_checks_them(tmp_path):
    # A cast wrapped -1 to 2^64 - 1, cut 1.7 to 1, flattened a 2-D array,
    # and filled every field of a pair from a plain array.
    bad = [(np.array([5, -1]), ValueError, "negative"), (np.array([1.7]), TypeError, "float64"),
           (np.zeros((2, 2), np.uint64), ValueError, "1-D"), ([2**64], ValueError, "outside"),
           (["1"], TypeError, "str"), ([1.0], TypeError, "float")]
    for i, (fps, error, match) in enumerate(bad):
        path = tmp_path / f"bad{i}.ndfp"
        with pytest.raises(error, match=match):
            fpfile.write_fingerprints(path, fps)
        assert os.listdir(tmp_path) == []
    with pytest.raises(TypeError, match="structured array with fields q, f, distance"):
        fpfile.write_pairs(tmp_path / "p.ndfp", [np.zeros(3)])
    # A list of ints is one batch, with keys too; parts of a generator are checked.
    fpfile.write_fingerprints(tmp_path / "l.ndfp", [3, 2**64 - 1], keys=["a", "b"])
    with fpfile.FingerprintReader(tmp_path / "l.ndfp") as r:
        (fps, keys), = list(r)
    assert fps.tolist() == [3, 2**64 - 1] and keys == [b"a", b"b"]
    with pytest.raises(ValueError, match="negative"):
        fpfile.write_fingerprints(tmp_path / "g.ndfp", (a for a in [np.arange(3), np.array([-2])]))
    # Pairs with their fields in another order or wider types are taken by name.
    other = np.zeros(2, dtype=[("distance", np.int64), ("f", np.int64), ("q", np.uint64)])
    other["q"], other["f"], other["distance"] = [1, 2], [5, 6], [1, 3]
    fpfile.write_pairs(tmp_path / "o.ndfp", [other])
    got = np.concatenate(list(fpfile.read_pairs(str(tmp_path / "o.ndfp"))))
    assert got.dtype == fpfile.PAIR_DTYPE and got.tolist() == [(1, 5, 1), (2, 6, 3)]


def test_writer_refuses_existing_file_and_leaves_nothing_on_error(tmp_path, values):
    path = tmp_path / "x.ndfp"
    fpfile.write_fingerprints(path, values)
    with pytest.raises(FileExistsError):
        fpfile.FingerprintWriter(path)
    with pytest.raises(RuntimeError):
        with fpfile.FingerprintWriter(tmp_path / "y.ndfp") as w:
            w.write(values)
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == ["x.ndfp"]


def test_a_writer_that_cannot_finish_or_is_dropped_leaves_no_file(tmp_path, values, monkeypatch):
    # A full disk as the file is synced: the half-written file went nowhere,
    # under its temporary name, and held the space the disk lacked.
    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", no_space)
        with pytest.raises(OSError, match="No space"):
            fpfile.write_fingerprints(tmp_path / "full.ndfp", values)
    assert os.listdir(tmp_path) == []
    # A writer dropped unclosed (its with statement's end cut short, or none).
    w = fpfile.FingerprintWriter(tmp_path / "dropped.ndfp")
    w.write(values)
    assert len(os.listdir(tmp_path)) == 1
    del w
    gc.collect()
    assert os.listdir(tmp_path) == []
    # Two writers of one name: the second to finish does not replace the first.
    a, b = fpfile.FingerprintWriter(tmp_path / "z.ndfp"), fpfile.FingerprintWriter(tmp_path / "z.ndfp")
    a.write(values[:10])
    b.write(values[:20])
    a.close()
    with pytest.raises(FileExistsError):
        b.close()
    assert os.listdir(tmp_path) == ["z.ndfp"]
    assert np.array_equal(fpfile.read_fingerprints(tmp_path / "z.ndfp"), values[:10])


def test_corrupt_chunk_raises_naming_the_chunk(tmp_path, values):
    path = tmp_path / "c.ndfp"
    fpfile.write_fingerprints(path, values, chunk_size=1000)
    with fpfile.FingerprintReader(path) as r:
        second = int(r._bounds[1])
    data = bytearray(path.read_bytes())
    data[second + 40] ^= 0x10
    path.write_bytes(bytes(data))
    with fpfile.FingerprintReader(path) as r:
        assert np.array_equal(r.chunk(0), values[:1000])
        with pytest.raises(CorruptionError, match="chunk 1"):
            r.chunk(1)


@pytest.mark.parametrize("cut", [1, 8, 16, 30, 200])
def test_truncated_file_raises(tmp_path, values, cut):
    path = tmp_path / "t.ndfp"
    fpfile.write_fingerprints(path, values, chunk_size=1000)
    data = path.read_bytes()
    path.write_bytes(data[:-cut])
    with pytest.raises(CorruptionError):
        fpfile.FingerprintReader(path)


def test_not_a_fingerprint_file(tmp_path):
    path = tmp_path / "n.ndfp"
    path.write_bytes(b"hello world, this is not a fingerprint file at all" * 3)
    with pytest.raises(FormatError, match="not a fingerprint file"):
        fpfile.FingerprintReader(path)
    assert not fpfile.is_fpfile(path)
