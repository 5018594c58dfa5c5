"""The Python face of the LMDB checker: arguments, geometry, results (format-spec/lmdb.md section 13)."""

from __future__ import annotations

import mmap

import lmdb
import pytest

from ndindex import CorruptionError, _core

PSIZE = 4096


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("small") / "s.mdb"
    env = lmdb.open(str(path), subdir=False, max_dbs=2, map_size=1 << 24)
    db = env.open_db(b"d")
    with env.begin(write=True) as txn:
        for i in range(100):
            txn.put(b"k%03d" % i, b"v" * i, db=db)
    env.close()
    return path


def test_check_reads_an_mmap(small_file):
    with open(small_file, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        report = _core.lmdb_check(m)
    assert report["trees"]["d"]["entries"] == 100
    assert report["trees"]["(main)"]["entries"] == 1
    assert report["psize"] == PSIZE and report["tail_pages"] == 0


def test_page_size_from_meta_or_given(small_file):
    data = small_file.read_bytes()
    assert _core.lmdb_check(data) == _core.lmdb_check(data, PSIZE)
    assert _core.lmdb_check(data, npages=len(data) // PSIZE) == _core.lmdb_check(data)


def test_bad_geometry_is_value_error(small_file):
    data = small_file.read_bytes()
    with pytest.raises(ValueError, match="psize"):
        _core.lmdb_check(data, 1000)
    with pytest.raises(ValueError, match="npages"):
        _core.lmdb_check(data, PSIZE, len(data) // PSIZE + 1)
    with pytest.raises(ValueError, match="slot"):
        _core.lmdb_page_map(data, slot=2)


def test_given_page_size_must_match_the_file(small_file):
    """[L6]"""
    with pytest.raises(CorruptionError, match="disagree on the page size"):
        _core.lmdb_check(small_file.read_bytes(), 8192)


def test_not_a_buffer_is_type_error():
    with pytest.raises(TypeError):
        _core.lmdb_check("not bytes")


def test_zeros_are_not_lmdb():
    """[L6]: a file of zeros has page size 0."""
    with pytest.raises(CorruptionError) as info:
        _core.lmdb_check(bytes(2 * PSIZE))
    assert info.value.pgno == 0 and info.value.tree is None
    assert info.value.problem == "meta page size is not a power of two in 512..65536"


def test_empty_tree_root_is_none(tmp_path):
    path = tmp_path / "e.mdb"
    env = lmdb.open(str(path), subdir=False, max_dbs=2, map_size=1 << 24)
    env.open_db(b"empty")
    env.close()
    report = _core.lmdb_check(path.read_bytes(), both=True)
    assert report["trees"]["empty"]["root"] is None
    assert report["trees"]["empty"]["entries"] == 0


def test_page_map_shape(small_file):
    data = small_file.read_bytes()
    m = _core.lmdb_page_map(data)
    assert len(m["kinds"]) == len(m["owners"]) == len(data) // PSIZE
    assert m["kind_names"][m["kinds"][0]] == "meta"
    assert m["trees"] == ("(free)", "(main)", "d")
    assert set(m["owners"][2:]) <= {0, 1, 2, 255}
