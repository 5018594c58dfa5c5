"""The LMDB structure checker: real files pass, each damaged structure gives its exact error.

Files are made by LMDB itself (py-lmdb): named databases, small and
overflow values, a three-level tree, sorted duplicates in sub-pages and in
a sub-database, an integer-keyed database, and free pages left by deletes
in later transactions; and a format-v1 index made through the public API.
The damage is done to a copy of the file's bytes, field by field, at
offsets read from the file with the layouts of format-spec/lmdb.md (this
module reads them with its own few lines of struct, not with the
checker), and each test cites the statement it exercises.  The last tests
flip random bytes and bits and require a result or a CorruptionError,
nothing else: the checker runs in this process, so a crash would fail the
whole run.
"""

from __future__ import annotations

import random
import struct

import lmdb
import pathlib

import numpy as np
import pytest

from ndindex import CorruptionError, _core
from ndindex.index import Index

PSIZE = 4096
META_FREE_DB, META_MAIN_DB, META_LAST_PG, META_TXNID = 40, 88, 136, 144
P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
MDB_REVERSEKEY = 0x02


def u16(b, off):
    return struct.unpack_from("<H", b, off)[0]


def u64(b, off):
    return struct.unpack_from("<Q", b, off)[0]


def put16(b, off, v):
    struct.pack_into("<H", b, off, v)


def put64(b, off, v):
    struct.pack_into("<Q", b, off, v)


def build_lmdb(path) -> None:
    """An LMDB file with every structure the checker walks, the same bytes on every run."""
    rnd = random.Random(5)
    env = lmdb.open(str(path), subdir=False, max_dbs=8, map_size=1 << 30)
    try:
        plain = env.open_db(b"plain")
        deep = env.open_db(b"deep")
        dups = env.open_db(b"dups", dupsort=True)
        ints = env.open_db(b"ints", integerkey=True)
        with env.begin(write=True) as txn:
            for i in range(200):
                txn.put(b"p%04d" % i, rnd.randbytes(rnd.choice([10, 100, 5000, 12000])), db=plain)
            for i in range(6000):  # 100-byte keys: three levels
                txn.put(b"%0100d" % i, b"v", db=deep)
            for i in range(60):  # three values each: sub-pages
                for j in range(3):
                    txn.put(b"k%03d" % i, b"value-%d" % j, db=dups)
            for j in range(300):  # too many for a sub-page: a sub-database
                txn.put(b"many", b"%040d" % j, db=dups)
            for i in range(500):
                txn.put(struct.pack("<Q", i * 7919), b"i", db=ints)
        with env.begin(write=True) as txn:  # frees pages: a free-list record
            for i in range(0, 200, 3):
                txn.delete(b"p%04d" % i, db=plain)
            for i in range(0, 6000, 2):
                txn.delete(b"%0100d" % i, db=deep)
        with env.begin(write=True) as txn:  # and another one
            for i in range(0, 200, 5):
                txn.put(b"p%04d" % i, rnd.randbytes(300), db=plain)
    finally:
        env.close()


@pytest.fixture(scope="module")
def lmdb_file(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("lmdb") / "f.mdb"
    build_lmdb(path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def v1_index() -> bytes:
    """A format-v1 index (tests/data/README.md): tables, a log, tombstones, document keys."""
    return (pathlib.Path(__file__).parents[1] / "data" / "format-v1.ndx").read_bytes()


@pytest.fixture(scope="module")
def v2_index(tmp_path_factory) -> bytes:
    """A format-v2 index: runs of chunks, a log, tombstones, key records."""
    path = tmp_path_factory.mktemp("v2") / "index.ndx"
    fps = np.unique(np.random.default_rng(3).integers(0, 2**64, 3000, dtype=np.uint64))
    with Index.create(path, k=3, expected_n=3000, background_compaction=False) as ix:
        ix.add(fps[:2500], keys=[f"doc-{i}" for i in range(2500)])
        ix.add([fps[0]] * 200, keys=[f"copy-{i}" for i in range(200)])
        ix.compact()
        ix.add(fps[2500:], keys=[f"late-{i}" for i in range(2500, len(fps))])
        ix.remove(fps[10:40])
        ix.remove(keys=["doc-50", "doc-51"])
    return path.read_bytes()


# -- reading the file as format-spec/lmdb.md lays it out ------------------------


def newer_slot(b) -> int:
    return int(u64(b, PSIZE + META_TXNID) > u64(b, META_TXNID))


def nodes(b, pgno) -> list[int]:
    """Absolute offsets of the nodes of a branch or leaf page, in key order."""
    base = pgno * PSIZE
    n = (u16(b, base + 12) - 16) // 2
    return [base + u16(b, base + 16 + 2 * i) for i in range(n)]


def node_key(b, nd) -> bytes:
    return bytes(b[nd + 8:nd + 8 + u16(b, nd + 6)])


def node_data(b, nd) -> int:
    """Absolute offset of a leaf node's data."""
    return nd + 8 + u16(b, nd + 6)


def node_child(b, nd) -> int:
    return u16(b, nd) | u16(b, nd + 2) << 16 | u16(b, nd + 4) << 32


def page_map(b):
    m = _core.lmdb_page_map(bytes(b))
    return m, [m["kind_names"][k] for k in m["kinds"]], [
        m["trees"][o] if o != 255 else None for o in m["owners"]]


def pages_of(b, tree, kind) -> list[int]:
    _, kinds, owners = page_map(b)
    return [p for p, (k, o) in enumerate(zip(kinds, owners)) if k == kind and o == tree]


def named_record(b, name: bytes) -> int:
    """Absolute offset of a named database's 48-byte record in the main database."""
    root = u64(b, newer_slot(b) * PSIZE + META_MAIN_DB + 40)
    for nd in nodes(b, root):
        if node_key(b, nd) == name:
            return node_data(b, nd)
    raise KeyError(name)


def free_records(b) -> list[int]:
    """Absolute offsets of the newer snapshot's free-list ID lists."""
    root = u64(b, newer_slot(b) * PSIZE + META_FREE_DB + 40)
    out = []
    for nd in nodes(b, root):
        data = node_data(b, nd)
        out.append(u64(b, data) * PSIZE + 16 if u16(b, nd + 4) & F_BIGDATA else data)
    return out


def ids(b, rec) -> list[int]:
    return [u64(b, rec + 8 * (j + 1)) for j in range(u64(b, rec))]


def expect(b, problem: str, pgno: int | None = None, tree=..., **kw) -> CorruptionError:
    with pytest.raises(CorruptionError) as info:
        _core.lmdb_check(bytes(b), **kw)
    err = info.value
    assert err.problem == problem, str(err)
    if pgno is not None:
        assert err.pgno == pgno, str(err)
    if tree is not ...:
        assert err.tree == tree, str(err)
    assert err.database == "lmdb"
    assert f"LMDB {'meta ' if err.tree is None and err.pgno < 2 else ''}page {err.pgno}" in str(err)
    return err


# -- intact files pass ------------------------------------------------------------


def test_lmdb_file_passes_with_lmdb_s_own_counts(lmdb_file, tmp_path):
    report = _core.lmdb_check(lmdb_file, both=True)
    assert report["psize"] == PSIZE and report["slot"] == newer_slot(lmdb_file)
    assert report["file_pages"] == len(lmdb_file) // PSIZE
    assert report["free_records"] == 2 and report["free_pages"] > 0
    path = tmp_path / "f.mdb"
    path.write_bytes(lmdb_file)
    env = lmdb.open(str(path), subdir=False, max_dbs=8, readonly=True, lock=False)
    try:
        for name, dupsort in ((b"plain", False), (b"deep", False), (b"dups", True), (b"ints", False)):
            db = env.open_db(name, create=False, dupsort=dupsort, integerkey=name == b"ints")
            with env.begin() as txn:
                stat = txn.stat(db)
            tree = report["trees"][name.decode()]
            assert tree["entries"] == stat["entries"] and tree["depth"] == stat["depth"]
            if not dupsort:  # [L14]: a DUPSORT tree's page counts are not exact in LMDB
                assert (tree["branch_pages"], tree["leaf_pages"], tree["overflow_pages"]) == \
                    (stat["branch_pages"], stat["leaf_pages"], stat["overflow_pages"])
    finally:
        env.close()
    assert report["trees"]["deep"]["depth"] == 3
    assert report["trees"]["plain"]["overflow_pages"] > 0
    assert report["trees"]["dups"]["dup_pages"] > 0  # the sub-database of b"many"
    assert report["other"]["txnid"] == report["txnid"] - 1  # [L12]
    assert "error" not in report["other"]


@pytest.mark.parametrize("seed", range(6))
def test_every_file_lmdb_writes_passes(tmp_path, seed):
    """No false alarms: random puts and deletes (big values, sorted duplicates growing into
    sub-databases and shrinking, integer keys) over many transactions; both snapshots pass
    after every commit, and so does a compacting copy."""
    rnd = random.Random(seed)
    path = str(tmp_path / "r.mdb")
    env = lmdb.open(path, subdir=False, max_dbs=4, map_size=1 << 30)
    dbs = [env.open_db(b"plain"), env.open_db(b"dups", dupsort=True),
           env.open_db(b"ints", integerkey=True)]
    sub_databases = 0
    try:
        for _ in range(12):
            with env.begin(write=True) as txn:
                for _ in range(rnd.randint(1, 600)):
                    which = rnd.randrange(3)
                    db = dbs[which]
                    key = (struct.pack("<Q", rnd.randrange(3000)) if which == 2
                           else b"k%d" % rnd.randrange(12 if which == 1 else 1500))
                    r = rnd.random()
                    if r < (0.85 if which == 1 else 0.6):
                        size = rnd.randint(1, 200) if which == 1 else rnd.choice([1, 50, 900, 5000, 20000])
                        txn.put(key, rnd.randbytes(size), db=db)
                    elif which == 1 and r < 0.95:
                        cur = txn.cursor(db=db)
                        if cur.set_key(key):
                            for _ in range(rnd.randint(1, 60)):
                                if not cur.delete() or cur.key() != key:
                                    break
                    else:
                        txn.delete(key, db=db)
            with open(path, "rb") as fh:
                report = _core.lmdb_check(fh.read(), both=True)
            assert "error" not in report["other"], report["other"]
            sub_databases += report["trees"]["dups"]["dup_pages"] > 0
        assert sub_databases  # duplicates did outgrow their sub-pages
        copy = str(tmp_path / "copy.mdb")
        env.copy(copy, compact=True)
        with open(copy, "rb") as fh:
            assert _core.lmdb_check(fh.read(), both=True)["free_pages"] == 0
    finally:
        env.close()


def test_page_map_accounts_for_every_page(lmdb_file):
    """[L25] [L33]-[L37]: each page is exactly one thing, every page of an overflow run too."""
    m, kinds, owners = page_map(lmdb_file)
    assert len(kinds) == len(lmdb_file) // PSIZE
    assert kinds[:2] == ["meta", "meta"]
    assert "unseen" not in kinds
    assert m["trees"] == ("(free)", "(main)", "deep", "dups", "ints", "plain")  # [L27]
    for kind in ("branch", "leaf", "overflow", "overflow-more", "free"):
        assert kind in kinds
    report = _core.lmdb_check(lmdb_file)
    assert kinds.count("free") == report["free_pages"]
    for name, tree in report["trees"].items():
        used = sum(1 for o in owners if o == name)
        assert used * PSIZE == tree["bytes"], name


def test_v1_index_passes(v1_index):
    report = _core.lmdb_check(v1_index, both=True)
    assert set(report["trees"]) == {"(free)", "(main)", "meta", "segments", "log", "docs",
                                    "keys", "removed"}
    assert report["trees"]["docs"]["entries"] > 0
    assert "error" not in report["other"]
    m, kinds, _ = page_map(v1_index)
    assert {"branch", "leaf", "overflow", "overflow-more"} <= set(kinds)


def test_v2_index_passes(v2_index):
    report = _core.lmdb_check(v2_index, both=True)
    assert set(report["trees"]) == {"(free)", "(main)", "meta", "log", "chunks"}
    assert "error" not in report["other"]
    m, kinds, _ = page_map(v2_index)
    assert {"leaf", "overflow", "overflow-more", "free"} <= set(kinds)


def test_tail_pages_after_the_last_page_are_not_read(lmdb_file):
    """[L37]: pages a transaction wrote and never committed."""
    report = _core.lmdb_check(lmdb_file + b"\xa5" * (3 * PSIZE))
    assert report["tail_pages"] == 3


def test_npages_limits_what_is_read(lmdb_file):
    report = _core.lmdb_check(lmdb_file + b"\0" * PSIZE, PSIZE, len(lmdb_file) // PSIZE)
    assert report["tail_pages"] == 0


# -- meta pages ------------------------------------------------------------------


@pytest.mark.parametrize("slot", [0, 1])
def test_meta_magic(lmdb_file, slot):
    """[L5]"""
    b = bytearray(lmdb_file)
    b[slot * PSIZE + 16] ^= 0xFF
    expect(b, "meta page magic is not LMDB's", slot, None)


def test_meta_version(lmdb_file):
    """[L5]"""
    b = bytearray(lmdb_file)
    b[PSIZE + 20] = 2
    expect(b, "LMDB data version is not 1", 1, None)


def test_meta_names_itself(lmdb_file):
    """[L4]"""
    b = bytearray(lmdb_file)
    b[0] = 1
    expect(b, "meta page does not name itself", 0, None)


def test_meta_page_size(lmdb_file):
    """[L6]"""
    b = bytearray(lmdb_file)
    b[PSIZE + META_FREE_DB + 1] ^= 0x20  # psize 4096 -> 12288
    expect(b, "meta pages disagree on the page size", 1, None)
    b = bytearray(lmdb_file)
    b[META_FREE_DB + 1] ^= 0x20
    expect(b, "meta page size is not a power of two in 512..65536", 0, None)


def test_free_database_integer_key_flag(lmdb_file):
    """[L7]"""
    b = bytearray(lmdb_file)
    b[newer_slot(b) * PSIZE + META_FREE_DB + 4] &= ~0x08
    expect(b, "free database lacks its integer-key flag", newer_slot(b), None)


@pytest.mark.parametrize("flag", [0x02, 0x04, 0x10, 0x20, 0x40])
def test_free_database_other_tree_flags(lmdb_file, flag):
    """[L7]: with MDB_DUPSORT (0x04) LMDB's cursor on the free database
    asserted (abort) for want of a duplicates cursor; the checker passed
    the file (tools/sweep_corruption.py --index large --seed 290, trial 281)."""
    b = bytearray(lmdb_file)
    b[newer_slot(b) * PSIZE + META_FREE_DB + 4] ^= flag
    expect(b, "free database has tree flags besides its integer key", newer_slot(b), None)


@pytest.mark.parametrize("flag", [0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x100, 0x8000])
def test_main_database_tree_flags(lmdb_file, flag):
    """[L8]"""
    b = bytearray(lmdb_file)
    put16(b, newer_slot(b) * PSIZE + META_MAIN_DB + 4, flag)
    expect(b, "main database has tree flags", newer_slot(b), None)


@pytest.mark.parametrize("bit, problem", [
    (0, "meta page holds a transaction id of the other page's parity"),  # [L9]
    (4, "meta pages' transaction ids are not consecutive"),  # [L10]
    (40, "meta pages' transaction ids are not consecutive"),
    # 7 -> 5 makes the older page (6) look newer; it has fewer pages: [L11]
    (1, "newer meta page has fewer pages than the older one"),
])
def test_meta_txnid_flips_are_caught(lmdb_file, bit, problem):
    """[L9]-[L11]: a damaged id in the newer meta page would make LMDB open the older one."""
    b = bytearray(lmdb_file)
    slot = newer_slot(b)
    assert u64(b, slot * PSIZE + META_TXNID) == 7
    put64(b, slot * PSIZE + META_TXNID, u64(b, slot * PSIZE + META_TXNID) ^ (1 << bit))
    err = expect(b, problem, tree=None)
    assert "meta 0: txnid" in str(err)


def test_older_meta_txnid_raised_past_the_newer_is_not_caught(tmp_path):
    """Section 3: the flip the meta pages cannot settle, left to ndindex's own commit record.

    Small writes reuse free pages, so both meta pages hold the same last
    page; the older id 6 raised to 8 beside 7 satisfies [L9]-[L11], and
    LMDB would open the older snapshot.
    """
    path = tmp_path / "small.mdb"
    env = lmdb.open(str(path), subdir=False, max_dbs=2, map_size=1 << 26)
    db = env.open_db(b"d")
    for i in range(6):
        with env.begin(write=True) as txn:
            txn.put(b"k%d" % i, b"x" * 100, db=db)
    env.close()
    b = bytearray(path.read_bytes())
    assert [u64(b, s * PSIZE + META_TXNID) for s in (0, 1)] == [6, 7]
    assert u64(b, META_LAST_PG) == u64(b, PSIZE + META_LAST_PG)
    put64(b, META_TXNID, 8)
    assert _core.lmdb_check(bytes(b))["slot"] == 0


def test_meta_last_page(lmdb_file):
    """[L8] [L11]"""
    b = bytearray(lmdb_file)
    put64(b, PSIZE + META_LAST_PG, 0)
    expect(b, "meta page's last page out of range", 1, None)
    b = bytearray(lmdb_file)
    slot = newer_slot(b)
    put64(b, slot * PSIZE + META_LAST_PG, u64(b, slot * PSIZE + META_FREE_DB + 40) - 1)
    expect(b, "tree root page out of range", slot, None)  # [L11]: see the txnid tests


def test_meta_tree_record(lmdb_file):
    """[L8] [L13]"""
    b = bytearray(lmdb_file)
    slot = newer_slot(b)
    put16(b, slot * PSIZE + META_MAIN_DB + 6, 0)  # depth 0 with a root
    expect(b, "tree depth out of range", slot, None)


def test_file_too_short(lmdb_file):
    """[L3]"""
    expect(lmdb_file[:100], "file too short for a meta page", tree=None)
    expect(lmdb_file[:PSIZE + 200], "file too short for a meta page", 1, None)  # whole pages only


# -- branch and leaf pages -------------------------------------------------------


def test_page_names_itself(lmdb_file):
    """[L1]"""
    b = bytearray(lmdb_file)
    leaf = pages_of(b, "deep", "leaf")[5]
    b[leaf * PSIZE] ^= 0x01
    expect(b, "page does not name itself", leaf, "deep")


def test_page_kind_follows_the_level(lmdb_file):
    """[L2]: a leaf flagged as a branch."""
    b = bytearray(lmdb_file)
    leaf = pages_of(b, "deep", "leaf")[5]
    put16(b, leaf * PSIZE + 10, P_BRANCH)
    expect(b, "expected a leaf page", leaf, "deep")


def test_page_header_bounds(lmdb_file):
    """[L18]"""
    b = bytearray(lmdb_file)
    leaf = pages_of(b, "deep", "leaf")[5]
    put16(b, leaf * PSIZE + 12, u16(b, leaf * PSIZE + 12) + 1)  # odd lower
    expect(b, "page free-space bounds impossible", leaf, "deep")
    b = bytearray(lmdb_file)
    put16(b, leaf * PSIZE + 14, PSIZE + 2)
    expect(b, "page free-space bounds impossible", leaf, "deep")


def test_node_offset(lmdb_file):
    """[L19]"""
    b = bytearray(lmdb_file)
    leaf = pages_of(b, "plain", "leaf")[0]
    put16(b, leaf * PSIZE + 16, 20)  # node 0 inside the header
    expect(b, "node offset outside the page's node area", leaf, "plain")


def test_node_key_size(lmdb_file):
    """[L19]"""
    b = bytearray(lmdb_file)
    leaf = pages_of(b, "plain", "leaf")[0]
    put16(b, nodes(b, leaf)[-1] + 6, 600)
    expect(b, "node key runs past the page", leaf, "plain")


def test_leaf_data_size(lmdb_file):
    """[L19]"""
    b = bytearray(lmdb_file)
    leaf = pages_of(b, "deep", "leaf")[0]
    put16(b, nodes(b, leaf)[0] + 2, 1)  # data size + 65536
    expect(b, "leaf node data runs past the page", leaf, "deep")


def test_leaf_flags(lmdb_file):
    """[L19]"""
    b = bytearray(lmdb_file)
    leaf = pages_of(b, "deep", "leaf")[0]
    put16(b, nodes(b, leaf)[0] + 4, 0x10)
    expect(b, "leaf node has unknown flags", leaf, "deep")


def test_key_order_within_a_page(lmdb_file):
    """[L20]: two node offsets swapped."""
    b = bytearray(lmdb_file)
    leaf = pages_of(b, "deep", "leaf")[3]
    a, c = leaf * PSIZE + 16, leaf * PSIZE + 18
    b[a:a + 2], b[c:c + 2] = b[c:c + 2], b[a:a + 2]
    expect(b, "keys on the page do not increase", leaf, "deep")


def test_key_order_across_pages(lmdb_file):
    """[L20] [L21]: a branch key raised above its child's keys."""
    b = bytearray(lmdb_file)
    branch = pages_of(b, "ints", "branch")[0]
    last = nodes(b, branch)[-1]
    b[last + 8 + 7] = 0x7F  # the key's most significant byte (integer keys)
    expect(b, "key outside the range its parent gives the page", node_child(b, last), "ints")


def test_integer_keys_sort_as_integers(lmdb_file):
    """[L20] [L22]: little-endian keys that bytewise order would call unsorted pass."""
    leaf = pages_of(lmdb_file, "ints", "leaf")[0]
    keys = [node_key(lmdb_file, nd) for nd in nodes(lmdb_file, leaf)]
    assert keys != sorted(keys)
    assert [struct.unpack("<Q", k)[0] for k in keys] == sorted(struct.unpack("<Q", k)[0] for k in keys)


def test_integer_key_size(lmdb_file):
    """[L22]"""
    b = bytearray(lmdb_file)
    first_leaf = min(pages_of(b, "ints", "leaf"),
                     key=lambda p: struct.unpack("<Q", node_key(b, nodes(b, p)[0]))[0])
    put16(b, nodes(b, first_leaf)[0] + 6, 7)  # the smallest key, so the order still holds
    expect(b, "integer key is not 4 or 8 bytes", first_leaf, "ints")


@pytest.mark.parametrize("tree, delta", [("ints", 2), ("ints", -1), ("(free)", 8)])
def test_node_sizes_tile_the_node_area(lmdb_file, tree, delta):
    """[L38]: the lowest node of a leaf claims more bytes (a free-list value stays whole
    words), or fewer (the 1-byte value of "ints" none: a gap); every bounds check still holds.
    The free-list case is the sweep's damaged size byte that LMDB's next delete on the page
    turned into "Located page was wrong type"."""
    b = bytearray(lmdb_file)
    if tree == "(free)":
        root = u64(b, newer_slot(b) * PSIZE + META_FREE_DB + 40)
        leaf = next(p for p in [root] if any(not u16(b, nd + 4) & F_BIGDATA for nd in nodes(b, p)))
    else:
        leaf = pages_of(b, tree, "leaf")[0]
    inline = [nd for nd in nodes(b, leaf) if not u16(b, nd + 4) & F_BIGDATA]
    lowest = min(inline)
    assert lowest == leaf * PSIZE + u16(b, leaf * PSIZE + 14)  # the node at mp_upper
    size = u16(b, lowest) | u16(b, lowest + 2) << 16
    put16(b, lowest, size + delta)
    expect(b, "page's nodes do not fill its node area exactly", leaf, tree)


@pytest.mark.parametrize("child, problem", [
    (0, "page number names a meta page"),
    ("last+1", "page number past the meta page's last page"),
])
def test_child_page_number_out_of_range(lmdb_file, child, problem):
    """[L17]"""
    b = bytearray(lmdb_file)
    branch = pages_of(b, "deep", "branch")[0]
    nd = nodes(b, branch)[1]
    value = u64(b, newer_slot(b) * PSIZE + META_LAST_PG) + 1 if child == "last+1" else child
    put16(b, nd, value & 0xFFFF)
    put16(b, nd + 2, value >> 16 & 0xFFFF)
    put16(b, nd + 4, value >> 32)
    expect(b, problem, branch, "deep")


def test_child_page_referenced_twice(lmdb_file):
    """[L33]: node 1 of a branch points at node 0's child."""
    b = bytearray(lmdb_file)
    branch = pages_of(b, "deep", "branch")[1]
    n0, n1 = nodes(b, branch)[:2]
    b[n1:n1 + 6] = b[n0:n0 + 6]
    err = expect(b, "page reachable twice", node_child(b, n0), "deep")
    assert "already a" in str(err)


def test_child_page_of_the_wrong_kind(lmdb_file):
    """[L2]: a branch above leaves points at another branch page of the same tree."""
    b = bytearray(lmdb_file)
    root = named_record(b, b"deep")
    branch = node_child(b, nodes(b, u64(b, root + 40))[0])  # level 1: its children are leaves
    other = node_child(b, nodes(b, u64(b, root + 40))[1])
    nd = nodes(b, branch)[1]
    put16(b, nd, other & 0xFFFF)
    put16(b, nd + 2, other >> 16)
    expect(b, "expected a leaf page", other, "deep")


def _problem(b) -> str:
    try:
        _core.lmdb_check(bytes(b))
    except CorruptionError as err:
        return err.problem
    return "no error"


def test_truncated_file(lmdb_file):
    """[L17] [L36]: the file cut before pages the snapshot uses."""
    cut = lmdb_file[:-3 * PSIZE]
    expect(cut, "page number past the end of the file")


# -- tree records ----------------------------------------------------------------


@pytest.mark.parametrize("offset, problem", [
    (32, "tree record's entry count disagrees with its entries"),
    (16, "tree record's leaf page count disagrees with its pages"),
    (8, "tree record's branch page count disagrees with its pages"),
    (24, "tree record's overflow page count disagrees with its pages"),
])
def test_tree_record_counts(lmdb_file, offset, problem):
    """[L14] [L25]: overflow pages count mp_pages per run."""
    b = bytearray(lmdb_file)
    rec = named_record(b, b"plain")
    put64(b, rec + offset, u64(b, rec + offset) + 1)
    root = u64(b, rec + 40)
    expect(b, problem, root, "plain")


def test_tree_record_flags(lmdb_file):
    """[L15]"""
    b = bytearray(lmdb_file)
    rec = named_record(b, b"deep")
    put16(b, rec + 4, MDB_REVERSEKEY)
    expect(b, "tree record has flags the checker does not support", tree="(main)")


def test_tree_record_pad(lmdb_file):
    """[L16]"""
    b = bytearray(lmdb_file)
    rec = named_record(b, b"deep")
    b[rec] = 1
    expect(b, "tree record's pad field is not zero", tree="(main)")


def test_tree_record_root(lmdb_file):
    """[L13]"""
    b = bytearray(lmdb_file)
    rec = named_record(b, b"deep")
    put64(b, rec + 40, len(b) // PSIZE + 10)
    expect(b, "tree root page out of range", tree="(main)")


def test_named_record_outside_main(lmdb_file):
    """[L26]"""
    b = bytearray(lmdb_file)
    leaf = pages_of(b, "deep", "leaf")[0]
    put16(b, nodes(b, leaf)[0] + 4, F_SUBDATA)
    expect(b, "named-database record outside the main database", leaf, "deep")


def test_dupdata_outside_a_dupsort_tree(lmdb_file):
    """[L28]"""
    b = bytearray(lmdb_file)
    leaf = pages_of(b, "deep", "leaf")[0]
    put16(b, nodes(b, leaf)[0] + 4, F_DUPDATA)
    expect(b, "duplicates in a tree without sorted duplicates", leaf, "deep")


# -- overflow runs ----------------------------------------------------------------


def overflow_runs(b, tree):
    """(leaf, node, first page, pages) of every overflow value of a tree."""
    out = []
    for leaf in pages_of(b, tree, "leaf"):
        for nd in nodes(b, leaf):
            if u16(b, nd + 4) & F_BIGDATA:
                first = u64(b, node_data(b, nd))
                out.append((leaf, nd, first, struct.unpack_from("<I", b, first * PSIZE + 12)[0]))
    return out


def test_overflow_count_too_small(lmdb_file):
    """[L24]"""
    b = bytearray(lmdb_file)
    leaf, nd, first, pages = next(r for r in overflow_runs(b, "plain") if r[3] > 1)
    struct.pack_into("<I", b, first * PSIZE + 12, pages - 1)
    expect(b, "overflow run too short for its value", first, "plain")


def test_overflow_count_too_large(lmdb_file):
    """[L24] [L33]: a longer run takes in a page that something else holds."""
    b = bytearray(lmdb_file)
    leaf, nd, first, pages = overflow_runs(b, "plain")[0]
    struct.pack_into("<I", b, first * PSIZE + 12, pages + 1)
    assert _problem(b) in ("page reachable twice", "page listed free is in use")
    struct.pack_into("<I", b, first * PSIZE + 12, 1 << 30)
    expect(b, "overflow run past the meta page's last page", first, "plain")


def test_overflow_zero_pages(lmdb_file):
    """[L24]"""
    b = bytearray(lmdb_file)
    leaf, nd, first, pages = overflow_runs(b, "plain")[0]
    struct.pack_into("<I", b, first * PSIZE + 12, 0)
    expect(b, "overflow run of zero pages", first, "plain")


def test_overflow_page_header(lmdb_file):
    """[L1] [L2] [L23]"""
    b = bytearray(lmdb_file)
    leaf, nd, first, pages = overflow_runs(b, "plain")[0]
    put16(b, first * PSIZE + 10, P_LEAF)
    expect(b, "expected an overflow page", first, "plain")
    b = bytearray(lmdb_file)
    b[first * PSIZE + 1] ^= 0x80
    expect(b, "overflow page does not name itself", first, "plain")
    b = bytearray(lmdb_file)
    put16(b, nd + 4, F_BIGDATA | F_SUBDATA)
    expect(b, "overflow value node has other flags", leaf, "plain")


# -- sorted duplicates ------------------------------------------------------------


def subpages(b):
    """(leaf, node) of every duplicate sub-page of the dups database."""
    return [(leaf, nd) for leaf in pages_of(b, "dups", "leaf") for nd in nodes(b, leaf)
            if u16(b, nd + 4) == F_DUPDATA]


def test_subpage_flags(lmdb_file):
    """[L29]"""
    b = bytearray(lmdb_file)
    leaf, nd = subpages(b)[0]
    put16(b, node_data(b, nd) + 10, P_LEAF)
    expect(b, "duplicate sub-page flags are not P_LEAF|P_SUBP", leaf, "dups")


def test_subpage_value_order(lmdb_file):
    """[L29]"""
    b = bytearray(lmdb_file)
    leaf, nd = subpages(b)[0]
    sp = node_data(b, nd)
    b[sp + 16:sp + 18], b[sp + 18:sp + 20] = b[sp + 18:sp + 20], b[sp + 16:sp + 18]
    expect(b, "duplicate values on the sub-page do not increase", leaf, "dups")


def test_subpage_bounds(lmdb_file):
    """[L29]"""
    b = bytearray(lmdb_file)
    leaf, nd = subpages(b)[0]
    sp = node_data(b, nd)
    put16(b, sp + 14, 2000)  # upper beyond the sub-page
    expect(b, "duplicate sub-page free-space bounds impossible", leaf, "dups")
    b = bytearray(lmdb_file)
    put16(b, sp + 16, 2)
    expect(b, "duplicate sub-page node offset outside its node area", leaf, "dups")


def test_subpage_value_carries_data(lmdb_file):
    """[L29]"""
    b = bytearray(lmdb_file)
    leaf, nd = subpages(b)[0]
    sp = node_data(b, nd)
    put16(b, sp + u16(b, sp + 16), 1)
    expect(b, "duplicate value node carries data or flags", leaf, "dups")


def test_sub_database_entries(lmdb_file):
    """[L30]: the sub-database of b"many" counts one value more than it holds."""
    b = bytearray(lmdb_file)
    for leaf in pages_of(b, "dups", "leaf"):
        for nd in nodes(b, leaf):
            if node_key(b, nd) == b"many":
                rec = node_data(b, nd)
    put64(b, rec + 32, u64(b, rec + 32) + 1)
    expect(b, "tree record's entry count disagrees with its entries", u64(b, rec + 40), "dups")


def test_dupsort_page_counts_are_not_checked(lmdb_file):
    """[L14]: LMDB leaves a DUPSORT tree's page counts inexact, so they may be anything."""
    b = bytearray(lmdb_file)
    rec = named_record(b, b"dups")
    put64(b, rec + 16, u64(b, rec + 16) + 5)
    _core.lmdb_check(bytes(b))


# -- the free list ----------------------------------------------------------------


def test_free_page_also_in_use(lmdb_file):
    """[L34]: a free-list entry replaced by a page of a tree, the list kept decreasing."""
    b = bytearray(lmdb_file)
    _, kinds, owners = page_map(b)
    for rec in free_records(b):
        listed = ids(b, rec)
        for j in range(1, len(listed) - 1):
            inside = [p for p in range(listed[j + 1] + 1, listed[j - 1]) if kinds[p] == "leaf"]
            if inside:
                put64(b, rec + 8 * (j + 1), inside[0])
                expect(b, "page listed free is in use", inside[0], owners[inside[0]])
                return
    pytest.fail("no leaf page between two free ones")


def test_free_list_order(lmdb_file):
    """[L32]"""
    b = bytearray(lmdb_file)
    rec = free_records(b)[0]
    first, second = u64(b, rec + 8), u64(b, rec + 16)
    put64(b, rec + 8, second)
    put64(b, rec + 16, first)
    expect(b, "free-list page numbers do not decrease", tree="(free)")


def free_tree_check(b):
    """What a write transaction checks of the free list (pages.PageView.check("free")):
    the tree, and each record as an ID list of the newer snapshot's pages."""
    slot = newer_slot(b) * PSIZE
    tree = (u64(b, slot + META_FREE_DB + 40), u16(b, slot + META_FREE_DB + 6), 0x08)
    return _core.lmdb_check_tree(bytes(b), PSIZE, len(b) // PSIZE, tree, 0x06,
                                 u64(b, slot + META_LAST_PG))


@pytest.mark.parametrize("damage, problem", [
    ("order", "free-list page numbers do not decrease"),
    ("range", "free-list page number outside the snapshot's pages"),
    ("low", "free-list page number outside the snapshot's pages"),
    ("count", "free-list count exceeds its value"),
])
def test_a_write_checks_the_free_lists_it_will_reuse(lmdb_file, damage, problem):
    """[L32] in the write path: LMDB trusts the lists, and one out of order
    aborted a later commit (mdb_freelist_save: "pglast <= env->me_pglast";
    tools/sweep_corruption.py --index large --seed 291, trial 159)."""
    b = bytearray(lmdb_file)
    assert free_tree_check(b) == 2
    rec = free_records(b)[0]
    first, second = u64(b, rec + 8), u64(b, rec + 16)
    if damage == "order":
        put64(b, rec + 8, second)
        put64(b, rec + 16, first)
    elif damage == "range":
        put64(b, rec + 8, u64(b, newer_slot(b) * PSIZE + META_LAST_PG) + 1)
    elif damage == "low":
        put64(b, rec + 8 * u64(b, rec), 1)
    else:
        put64(b, rec, 1 << 40)
    with pytest.raises(CorruptionError) as info:
        free_tree_check(b)
    assert problem in str(info.value) and info.value.database == "lmdb"


def test_free_list_count(lmdb_file):
    """[L32] [L35]: one entry fewer leaves its page neither used nor free; too many overrun."""
    b = bytearray(lmdb_file)
    rec = free_records(b)[0]
    dropped = ids(b, rec)[-1]
    put64(b, rec, u64(b, rec) - 1)
    expect(b, "page neither in a tree nor free", dropped, None)
    put64(b, rec, 1 << 40)
    expect(b, "free-list count exceeds its value", tree="(free)")


def test_free_list_entry_out_of_range(lmdb_file):
    """[L32]"""
    b = bytearray(lmdb_file)
    rec = free_records(b)[0]
    put64(b, rec + 8, 1 << 45)
    expect(b, "free-list page number outside the snapshot's pages", tree="(free)")


def test_free_page_listed_twice(lmdb_file):
    """[L34]: an entry of the second record copied into the first."""
    b = bytearray(lmdb_file)
    r0, r1 = free_records(b)[:2]
    a, c = ids(b, r0), ids(b, r1)
    for j in range(1, len(a) - 1):
        inside = [p for p in c if a[j + 1] < p < a[j - 1]]
        if inside:
            put64(b, r0 + 8 * (j + 1), inside[0])
            break
    else:
        pytest.fail("no entry of one record between two of the other")
    expect(b, "page listed free twice", inside[0], "(free)")


def test_free_list_key(lmdb_file):
    """[L31]: a record from a transaction after the snapshot's."""
    b = bytearray(lmdb_file)
    slot = newer_slot(b)
    root = u64(b, slot * PSIZE + META_FREE_DB + 40)
    last = nodes(b, root)[-1]
    put64(b, last + 8, u64(b, slot * PSIZE + META_TXNID) + 1)
    expect(b, "free-list key is not a transaction id up to the snapshot's", root, "(free)")
    b = bytearray(lmdb_file)
    put16(b, nodes(b, root)[0] + 6, 4)  # the first key, so the order still holds
    expect(b, "free-list key is not an 8-byte transaction id", root, "(free)")


def test_free_list_value_size(lmdb_file):
    """[L32]"""
    b = bytearray(lmdb_file)
    slot = newer_slot(b)
    root = u64(b, slot * PSIZE + META_FREE_DB + 40)
    nd = next(nd for nd in nodes(b, root) if not u16(b, nd + 4) & F_BIGDATA)
    put16(b, nd, u16(b, nd) - 4)
    expect(b, "free-list value is not a whole number of 8-byte words", root, "(free)")


def test_pages_past_the_end_must_be_free(lmdb_file):
    """[L36]: a meta page claiming more pages than the file holds and the free list names."""
    b = bytearray(lmdb_file)
    slot = newer_slot(b)
    end = len(b) // PSIZE
    put64(b, slot * PSIZE + META_LAST_PG, end + 5)
    expect(b, "page past the end of the file is not free", end, "(free)")


# -- the other snapshot -----------------------------------------------------------


def test_both_reports_the_older_snapshot_separately(lmdb_file):
    """[L12]: damage to a page only the older snapshot uses leaves the newer one intact."""
    b = bytearray(lmdb_file)
    older = _core.lmdb_page_map(bytes(b), slot=1 - newer_slot(b))
    newer_kinds = [page_map(b)[1][p] for p in range(len(b) // PSIZE)]
    only_older = next(p for p, k in enumerate(older["kinds"])
                      if older["kind_names"][k] == "leaf" and newer_kinds[p] == "free")
    b[only_older * PSIZE + 1] ^= 0x55
    report = _core.lmdb_check(bytes(b), both=True)
    assert report["other"]["error"] and report["other"]["pgno"] == only_older
    assert report["other"]["slot"] == 1 - report["slot"]
    with pytest.raises(CorruptionError):
        _core.lmdb_page_map(bytes(b), slot=1 - newer_slot(b))


# -- random damage never crashes ------------------------------------------------------


def damage_offsets(b, rng, n):
    """n offsets, each in a page chosen evenly among the page kinds (meta pages: their fields)."""
    _, kinds, _ = page_map(b)
    by_kind = {}
    for p, k in enumerate(kinds):
        by_kind.setdefault(k, []).append(p)
    names = sorted(by_kind)
    for _ in range(n):
        kind = names[rng.integers(len(names))]
        page = by_kind[kind][rng.integers(len(by_kind[kind]))]
        span = 152 if kind == "meta" else PSIZE
        yield page * PSIZE + int(rng.integers(span))


@pytest.mark.parametrize("which", ["lmdb_file", "v1_index", "v2_index"])
def test_random_flips_give_a_result_or_corruption_error(which, request):
    """Any damage: a report or CorruptionError, in this process, never a crash."""
    data = bytearray(request.getfixturevalue(which))
    rng = np.random.default_rng(11)
    outcomes = {"ok": 0, "error": 0}
    for i, off in enumerate(damage_offsets(data, rng, 3000)):
        mask = 0xFF if i % 2 else 1 << int(rng.integers(8))
        data[off] ^= mask
        try:
            _core.lmdb_check(data, both=bool(i % 3 == 0))
            outcomes["ok"] += 1
        except CorruptionError as err:
            assert isinstance(err.pgno, int) and err.problem
            outcomes["error"] += 1
        data[off] ^= mask
    assert outcomes["error"] > 300 and outcomes["ok"] > 300, outcomes


def test_random_truncations_and_multi_byte_damage(v1_index):
    rng = np.random.default_rng(12)
    for _ in range(300):
        data = bytearray(v1_index[:int(rng.integers(len(v1_index)))] if rng.random() < 0.3 else v1_index)
        for off in rng.integers(0, max(len(data), 1), int(rng.integers(1, 64))):
            if off < len(data):
                data[off] = int(rng.integers(256))
        try:
            _core.lmdb_check(data, both=True)
        except CorruptionError:
            pass
