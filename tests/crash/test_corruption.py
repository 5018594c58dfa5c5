"""Damaged, truncated, foreign and newer files give typed errors, never a crash or a wrong answer.

The fixture (tests/crash/damage.py) holds every record and page kind of a
format-2 file.  Each damage class below flips bytes in one of them, the
way a failing disk would; then:

- open(), queries with keys and keys() either answer exactly what the
  model holds or raise CorruptionError (never another exception, never a
  different answer: a fingerprint that was removed never comes back);
- verify() raises CorruptionError naming where the damage is;
- ``ndindex verify`` exits 2 with one line on stderr naming it.

Then files that are not ours (FormatError, left unmodified), files of a
newer format version ([V1]: a newer read version is refused; [V2]: a newer
write version opens read-only), a format-1 file (FormatError naming
``ndindex upgrade``) and files cut short at every kind of boundary.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import struct

import lmdb
import numpy as np
import pytest

from damage import (K, build_fixture, chunk_keys, damage_value, flip, leaf_keys, occurrences,
                    pages_of, records)
from ndindex import CorruptionError, FormatError, ReadOnlyError, _core, chunks as ch, cli
from ndindex import records as rec
from ndindex.index import Index
from tests.oracle import brute_force

DAMAGE = (CorruptionError, FormatError)
META_TXNID_OFFSET = 144


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("corruption") / "pristine.ndx")
    return path, build_fixture(path)


@pytest.fixture
def damaged(built, tmp_path):
    src, info = built
    path = str(tmp_path / "index.ndx")
    shutil.copyfile(src, path)
    return path, info


def sample(info) -> list[int]:
    """Fingerprints from every part of the build, stored and removed."""
    state = info["state"]
    rng = np.random.default_rng(1)
    fps = list(rng.choice(np.array(sorted(state), dtype=np.uint64), 150, replace=False).tolist())
    return fps + info["tombstoned"].tolist()[:20] + info["unremoved"].tolist()


def answers_right_or_corrupt(path, info) -> int:
    """Open, query every sampled fingerprint with keys, and ask its keys; return the errors.

    Each answer must be the model's; anything but CorruptionError fails.
    """
    state = info["state"]
    errors = 0
    try:
        ix = Index.open(path, readonly=True)
    except DAMAGE:
        return 1
    with ix:
        for fp in sample(info):
            want = [(fp, 0, state[fp])] if fp in state else []
            try:
                got = [(m.fingerprint, m.distance, frozenset(m.keys)) for m in ix.query(fp, 0)]
                assert got == want, (hex(fp), got, want)
                assert frozenset(ix.keys(fp)) == state.get(fp, frozenset())
            except CorruptionError:
                errors += 1
    return errors


def verify_error(path) -> Exception:
    """The error verify() (or open()) raises; fails if the file verifies."""
    try:
        with Index.open(path, readonly=True) as ix:
            ix.verify()
    except DAMAGE as exc:
        return exc
    pytest.fail("verify() passed on a damaged file")


def cli_verify_line(path, capsys) -> str:
    capsys.readouterr()
    assert cli.main(["verify", path]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"ndindex: {path}: ")
    return err[0]


def chunk_of_kind(path, space, kind) -> bytes:
    return next(k for k, v in records(path, rec.DB_CHUNKS) if k[0] == space and v[4] == kind)


def meta_txnids(path) -> tuple[int, int]:
    with open(path, "rb") as fh:
        data = fh.read(8192)
    return tuple(struct.unpack_from("<Q", data, s * 4096 + META_TXNID_OFFSET)[0] for s in (0, 1))


# -- the damage classes ---------------------------------------------------------------------


def _meta_page_magic(path, info):
    flip(path, 0 * 4096 + 16)


def _lost_commit(path, info):
    # The older meta page's transaction id raised to one past the newest:
    # LMDB would open the older snapshot, undoing the last commit silently.
    ids = meta_txnids(path)
    older = ids.index(min(ids))
    with open(path, "r+b") as fh:
        fh.seek(older * 4096 + META_TXNID_OFFSET)
        fh.write(struct.pack("<Q", max(ids) + 1))


def _branch_page(path, info):
    (branch,) = pages_of(path, "branch", rec.DB_CHUNKS)
    flip(path, branch * 4096 + 16)


def _chunks_leaf(path, info):
    leaf = next(p for p in pages_of(path, "leaf", rec.DB_CHUNKS)
                if {k[0] for k in leaf_keys(path, p)} == {1})
    flip(path, leaf * 4096 + 14)  # mp_upper


def _overflow_header(path, info):
    first = pages_of(path, "overflow", rec.DB_CHUNKS)[0]
    flip(path, first * 4096 + 12)  # mp_pages


def _free_list(path, info):
    (leaf,) = pages_of(path, "leaf", "(free)")
    data = pathlib.Path(path).read_bytes()
    node = leaf * 4096 + struct.unpack_from("<H", data, leaf * 4096 + 16)[0]
    ksize = struct.unpack_from("<H", data, node + 6)[0]
    flip(path, node + 8 + ksize + 7)  # the top byte of its first record's page count


def _record(db, key, at=3):
    def damage(path, info):
        damage_value(path, db, key, at)
    return damage


def _log_record(path, info):
    damage_value(path, rec.DB_LOG, rec.U64_BE.pack(info["log_first_seq"] + 1), 100)


def _chunk(space, kind, at):
    def damage(path, info):
        damage_value(path, rec.DB_CHUNKS, chunk_of_kind(path, space, kind), at)
    return damage


def _tombstones(path, info):
    (key,) = chunk_keys(path, rec.SPACE_TOMBSTONES)
    damage_value(path, rec.DB_CHUNKS, key, 40)


#: name, damage, words the error (and the verify line) must contain.
CLASSES = [
    ("meta-page", _meta_page_magic, ["meta page 0"]),
    ("lost-commit", _lost_commit, ["state record was written by transaction"]),
    ("branch-page", _branch_page, ["LMDB page", "chunks"]),
    ("leaf-page", _chunks_leaf, ["LMDB page", "chunks"]),
    ("overflow-page", _overflow_header, ["LMDB page", "overflow"]),
    ("free-list", _free_list, ["LMDB page", "free"]),
    ("header", _record(rec.DB_META, rec.KEY_HEADER), ["database=meta", "header"]),
    ("plan", _record(rec.DB_META, rec.KEY_PLAN, 10), ["database=meta", "plan"]),
    ("state", _record(rec.DB_META, rec.KEY_STATE, 20), ["database=meta", "state"]),
    ("manifest", _record(rec.DB_META, rec.KEY_MANIFEST, 30), ["database=meta", "manifest"]),
    ("log-record", _log_record, ["database=log"]),
    ("huffman-block", _chunk(0, rec.KIND_HUFFMAN, 32 + 16 + 1024 + 300), ["database=chunks"]),
    ("raw-chunk-header", _chunk(2, rec.KIND_RAW, 24), ["database=chunks"]),
    ("tombstone-chunk", _tombstones, ["database=chunks"]),
    ("key-chunk", _chunk(rec.SPACE_KEYS_BY_FP, rec.KIND_RECORDS, 40), ["database=chunks"]),
    ("truncated", lambda path, info: os.truncate(path, os.path.getsize(path) - 3 * 4096),
     ["truncated"]),
]


@pytest.mark.parametrize("name, damage, words", CLASSES, ids=[c[0] for c in CLASSES])
def test_damage_is_reported_never_answered_wrongly(damaged, capsys, name, damage, words):
    path, info = damaged
    damage(path, info)
    answers_right_or_corrupt(path, info)
    exc = verify_error(path)
    assert isinstance(exc, CorruptionError), exc
    line = cli_verify_line(path, capsys)
    for word in words:
        assert word in line, (word, line)


def test_pristine_copy_verifies_and_answers(damaged, capsys):
    path, info = damaged
    assert answers_right_or_corrupt(path, info) == 0
    with Index.open(path, readonly=True) as ix:
        ix.verify()
        assert len(ix) == len(info["state"])
    assert cli.main(["verify", path]) == 0


@pytest.mark.parametrize("mask", [1 << b for b in range(8)] + [0xFF])
def test_every_bit_of_a_chunk_header_is_checked(damaged, mask):
    path, info = damaged
    key = chunk_of_kind(path, 3, rec.KIND_HUFFMAN)
    value = dict(records(path, rec.DB_CHUNKS))[key]
    data = pathlib.Path(path).read_bytes()
    at = data.find(value)
    n = struct.unpack_from("<H", value, 6)[0]
    for offset in range(32 + 8 * n):  # the whole header and block-key list
        flip(path, at + offset, mask)
        assert answers_right_or_corrupt(path, info) >= 0
        with pytest.raises(CorruptionError, match="database=chunks"):
            with Index.open(path, readonly=True) as ix:
                ix.verify()
        flip(path, at + offset, mask)


# -- files that are not ours ------------------------------------------------------------------


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
    assert pathlib.Path(path).read_bytes() == data


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
    before = pathlib.Path(path).read_bytes()
    for readonly in (True, False):
        with pytest.raises(FormatError):
            Index.open(path, readonly=readonly)
    assert pathlib.Path(path).read_bytes() == before


def test_format_1_file_is_refused_naming_upgrade(tmp_path):
    v1 = os.path.join(os.path.dirname(__file__), "..", "data", "format-v1.ndx")
    path = str(tmp_path / "old.ndx")
    shutil.copyfile(v1, path)
    before = pathlib.Path(path).read_bytes()
    for readonly in (False, True):
        with pytest.raises(FormatError, match="ndindex upgrade"):
            Index.open(path, readonly=readonly)
    assert pathlib.Path(path).read_bytes() == before


# -- newer format versions -------------------------------------------------------------------


def patch_header(path, **fields) -> None:
    """Rewrite the header record with some fields changed, framed with a good checksum."""
    env = lmdb.open(path, subdir=False, max_dbs=4)
    try:
        meta = env.open_db(rec.DB_META.encode(), create=False)
        with env.begin(write=True, db=meta) as txn:
            payload = rec.unframe(txn.get(rec.KEY_HEADER), rec.DB_META, rec.KEY_HEADER)
            names = ["magic", "read_version", "write_version", "f", "k", "tables", "coding",
                     "expected_n", "file_id"]
            values = dict(zip(names, rec.HEADER.unpack(payload)))
            values.update(fields)
            txn.put(rec.KEY_HEADER, rec.frame(rec.KEY_HEADER,
                                              rec.HEADER.pack(*(values[n] for n in names))))
            # The state record names the transaction that wrote it ([F9]).
            state = rec.State.unpack(rec.unframe(txn.get(rec.KEY_STATE), rec.DB_META,
                                                 rec.KEY_STATE))
            state.txnid = txn.id()
            txn.put(rec.KEY_STATE, rec.frame(rec.KEY_STATE, state.pack()))
    finally:
        env.close()


NEWER = rec.FORMAT_VERSION + 1


def test_newer_read_version_is_refused(damaged):
    path, _ = damaged
    patch_header(path, read_version=NEWER, write_version=NEWER)
    for readonly in (False, True):
        with pytest.raises(FormatError, match=f"read version {NEWER} > supported {NEWER - 1}"):
            Index.open(path, readonly=readonly)


def test_newer_write_version_opens_read_only(damaged):
    path, info = damaged
    patch_header(path, write_version=NEWER)
    with pytest.raises(FormatError, match=f"write version {NEWER} > supported {NEWER - 1}"):
        Index.open(path)
    with Index.open(path, readonly=True) as ix:
        assert ix.readonly
        fp = next(iter(sorted(info["state"])))
        assert [m.fingerprint for m in ix.query(fp, 0)] == [fp]
        ix.verify()
        for call in (lambda: ix.add([1, 2, 3]), lambda: ix.remove([fp]), lambda: ix.compact(),
                     lambda: ix.check_and_add(12345)):
            with pytest.raises(ReadOnlyError):
                call()


@pytest.mark.parametrize("fields", [{"magic": b"ndindeX\0"}, {"f": 32}, {"coding": 5},
                                    {"expected_n": 0}, {"tables": 9},
                                    # [F6]: blocks of coding 2 in a file a reader of
                                    # version 2 would open
                                    {"coding": 2, "read_version": 2, "write_version": 2}],
                         ids=lambda f: ",".join(f))
def test_header_with_impossible_fields_is_refused(damaged, fields):
    path, _ = damaged
    patch_header(path, **fields)
    with pytest.raises(DAMAGE):
        Index.open(path, readonly=True)


# -- truncated files --------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [0, 1, 100, 4096, 8191, 8192, 12288, 0.5, -4096, -1],
                         ids=lambda v: f"keep={v}")
def test_truncated_file_raises_at_open_and_is_left_alone(damaged, keep):
    path, _ = damaged
    size = os.path.getsize(path)
    keep = int(size * keep) if isinstance(keep, float) else (keep if keep >= 0 else size + keep)
    os.truncate(path, keep)
    before = pathlib.Path(path).read_bytes()
    for readonly in (False, True):
        try:
            with Index.open(path, readonly=readonly) as ix:
                ix.verify()
        except DAMAGE:
            continue
        # A cut inside the last page, past what LMDB uses, loses nothing.
        assert keep > size - 4096
    assert pathlib.Path(path).read_bytes() == before


# -- packed raw blocks (FORMAT.md 5.3, [B15]) ---------------------------------------

def _packed_fixture(path) -> np.ndarray:
    """An index whose tables are one raw run of packed blocks (clustered
    fingerprints: spans of about 40 bits), copied compactly; its fingerprints."""
    rng = np.random.default_rng(9)
    fps = np.unique(rng.integers(2**62, 2**62 + 2**45, 4000, dtype=np.uint64))
    tmp = path + ".build"
    with Index.create(tmp, k=K, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        ix.add(fps)
        ix._compactor.flush_log()
        ix.vacuum_into(path)
    for leftover in (tmp, tmp + "-lock"):
        os.unlink(leftover)
    return fps


def _repacked(block: bytes, change) -> bytes:
    """A packed block with some field changed and its checksum made right again."""
    b = bytearray(block)
    change(b)
    b[0:4] = _core.crc32c(bytes(b[4:])).to_bytes(4, "little")
    return bytes(b)


#: name, change to the first packed block of a raw chunk (checksum repaired).
PACKED_DAMAGE = [
    ("width-57", lambda b: b.__setitem__(6, 57)),
    ("width-wider", lambda b: b.__setitem__(6, b[6] + 1)),
    ("width-narrower", lambda b: b.__setitem__(6, b[6] - 1)),
    ("count-1025", lambda b: b.__setitem__(slice(4, 6), (1025).to_bytes(2, "little"))),
    ("count-past-bits", lambda b: b.__setitem__(slice(4, 6), (8008 // b[6] + 2).to_bytes(2, "little"))),
    ("count-1", lambda b: b.__setitem__(slice(4, 6), (1).to_bytes(2, "little"))),
    ("reserved", lambda b: b.__setitem__(7, 1)),
    ("first-raised", lambda b: b.__setitem__(slice(8, 16), (int.from_bytes(b[8:16], "little")
                                                            + 2**50).to_bytes(8, "little"))),
    ("offsets-scrambled", lambda b: b.__setitem__(slice(40, 80), bytes(reversed(b[40:80])))),
    ("padding", lambda b: b.__setitem__(1020, 0x80)),
]


@pytest.mark.parametrize("name, change", PACKED_DAMAGE, ids=[d[0] for d in PACKED_DAMAGE])
def test_a_damaged_packed_block_is_reported_never_answered_wrongly(tmp_path, capsys, name, change):
    # Damage that keeps the block's checksum right reaches the kernel's
    # checks of a packed block (raw_count, raw_block_check, the probe's
    # order check, raw_decode): queries answer exactly or raise
    # CorruptionError, never read outside the block (the chunk sits in
    # LMDB overflow pages), and verify names the chunk.
    path = str(tmp_path / "packed.ndx")
    fps = _packed_fixture(path)
    key, value = next((k, v) for k, v in records(path, rec.DB_CHUNKS) if k[0] == 0 and
                      v[4] == rec.KIND_RAW)
    n_blocks = value[6] | value[7] << 8
    head = ch.FP_CHUNK_HEAD.size + 8 * n_blocks
    block = value[head:head + ch.BLOCK_BYTES]
    assert block[6], "the fixture's raw blocks are packed"
    bad = _repacked(block, change)
    data = pathlib.Path(path).read_bytes()
    hits = occurrences(data, value)
    assert hits
    with open(path, "r+b") as fh:
        for hit in hits:
            fh.seek(hit + head)
            fh.write(bad)
    errors = 0
    with Index.open(path, readonly=True) as ix:
        for q in fps[::7].tolist():
            try:
                got = [(m.fingerprint, m.distance) for m in ix.query(q, K, keys=False)]
            except CorruptionError:
                errors += 1
                continue
            assert got == brute_force(fps, q, K), hex(q)
        with pytest.raises(CorruptionError, match="database=chunks"):
            ix.verify()
    # Nonzero padding changes no value: queries answer right; verify, which
    # decodes every block, reports it.
    assert errors or name == "padding", "no query met the damaged block"
    line = cli_verify_line(path, capsys)
    assert "database=chunks" in line


def test_a_write_on_a_damaged_free_list_raises_and_changes_nothing(damaged):
    """Every write transaction checks the free list whole (LMDB reads its
    records to reuse pages) with PageView.check, which builds no rows."""
    path, info = damaged
    with Index.open(path, background_compaction=False) as ix:
        view = ix._store._view_of(ix._snapshot().txnid)
        assert view.check("free") == len(view.scan("free", check_all=True)) > 0
        assert view.check("main") == len(view.scan("main", check_all=True))
    _free_list(path, info)
    before = pathlib.Path(path).read_bytes()
    with Index.open(path, background_compaction=False) as ix:
        with pytest.raises(CorruptionError, match="free"):
            ix.add([12345])
    assert pathlib.Path(path).read_bytes() == before


def test_a_write_that_finds_no_state_record_raises_corruption_error(tmp_path):
    # Every reading of the state and manifest records goes through
    # records.read_meta.  Four readings on the write path (a compaction
    # step's commit, put_header, dropping a meta record, a commit of an
    # empty record) had no check of their own: a missing state record made
    # them raise TypeError.
    from ndindex.writer import put_header
    path = str(tmp_path / "x.ndx")
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        ix.add(np.arange(1, 100, dtype=np.uint64))
        ix._store.write(lambda wt: wt.delete(rec.DB_META, rec.KEY_STATE))
        with pytest.raises(CorruptionError, match="state record is missing"):
            ix._store.write(lambda wt: put_header(wt, ix._header))


def _metas_of(head: bytes) -> list:
    """What FileMap.metas() makes of a head: each meta page's txnid, or its error."""
    from ndindex import pages
    return [m["txnid"] if isinstance(m, dict) else str(m) for m in pages.metas_of(head)]


@pytest.mark.parametrize("damage_page0", [False, True])
def test_an_open_reads_both_meta_pages_in_8_kb_unless_page_0_says_otherwise(tmp_path,
                                                                             damage_page0):
    # A cold open read 2 x 64 KB (the largest page size) for the meta pages
    # four times; it reads 8 KB when page 0 is a meta page of 4 KB pages,
    # and finds in them what it finds in the longer read.
    from ndindex import pages
    path = str(tmp_path / "x.ndx")
    with Index.create(path, k=3, expected_n=1000) as ix:
        ix.add(np.arange(1, 100, dtype=np.uint64))
    if damage_page0:
        flip(path, 16)  # page 0's magic
    head = pages.read_head(path)
    with open(path, "rb") as fh:
        full = fh.read(2 * pages.MAX_PAGE_BYTES)
    assert len(head) == (len(full) if damage_page0 else pages.COMMON_HEAD_BYTES)
    metas = _metas_of(head)
    assert metas == _metas_of(full)
    assert all(isinstance(m, int) for m in metas) != damage_page0
    got = pages.FileMap(path).metas()
    assert [m["txnid"] if isinstance(m, dict) else str(m) for m in got] == metas


# Damages that took LMDB's copy (vacuum, vacuum_into, compact(full=True))
# outside the map before the copy checked the trees: (page kind, tree, which
# of those pages, byte in the page, xor mask) -> SIGBUS, SIGSEGV.
COPY_CRASHES = [("leaf", "(free)", 0, 16, 162), ("leaf", "chunks", 17, 43, 158)]


def test_a_vacuum_of_a_damaged_file_raises_and_never_crashes(built, tmp_path):
    """LMDB's copy trusts every page number it reads; Index._copy_compacted
    checks the trees first, as verify() does.  The two damages that a sweep
    of vacuum_into over this fixture found crashing it, and the first bytes (header, node
    pointers, first nodes) of every branch and leaf page with two masks: each
    vacuum_into and vacuum answers or raises a typed error, in a child
    process so that a crash fails the test instead of ending it."""
    src, _ = built
    damages = [(pages_of(src, kind, tree)[i], at, mask)
               for kind, tree, i, at, mask in COPY_CRASHES]
    rng = np.random.default_rng(5)
    for page in pages_of(src, "branch") + pages_of(src, "leaf"):
        damages += [(page, int(at), int(mask)) for at, mask in
                    zip(rng.integers(0, 64, 2), rng.integers(1, 256, 2))]
    code = (
        "import os, shutil, sys, ndindex\n"
        "sys.path.insert(0, sys.argv[3])\n"
        "from damage import flip\n"
        "src, work = sys.argv[1], sys.argv[2]\n"
        "for i, spec in enumerate(sys.argv[4:]):\n"
        "    page, at, mask = map(int, spec.split(':'))\n"
        "    path, out = os.path.join(work, f'd{i}.ndx'), os.path.join(work, f'o{i}.ndx')\n"
        "    shutil.copyfile(src, path)\n"
        "    flip(path, page * 4096 + at, mask)\n"
        "    for how in ('into', 'in place'):\n"
        "        try:\n"
        "            with ndindex.open(path, background_compaction=False) as ix:\n"
        "                ix.vacuum_into(out) if how == 'into' else ix.vacuum()\n"
        "            print(spec, how, 'ok')\n"
        "        except (ndindex.CorruptionError, ndindex.FormatError) as exc:\n"
        "            print(spec, how, type(exc).__name__)\n"
        "        if os.path.exists(out):\n"
        "            os.unlink(out)\n")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", code, src, str(tmp_path),
                           os.path.dirname(__file__)] + [f"{p}:{a}:{m}" for p, a, m in damages],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert len(lines) == 2 * len(damages)
    for spec in [f"{p}:{a}:{m}" for p, a, m in damages[:len(COPY_CRASHES)]]:
        assert [ln.split()[-1] for ln in lines if ln.startswith(spec + " ")] == \
            ["CorruptionError"] * 2, lines


def test_tree_flags_in_the_newer_meta_page_are_damage_not_an_abort(built, tmp_path):
    # A bit set in the free database's flags (MDB_DUPSORT) made LMDB's
    # cursor on it assert and abort the process at open
    # (tools/sweep_corruption.py --index large --seed 290, trial 281).
    # In a child, so that an abort fails the test rather than the run.
    src, _ = built
    with open(src, "rb") as fh:
        head = fh.read(2 * 4096)
    slot = int(struct.unpack_from("<Q", head, 4096 + 144)[0] >
               struct.unpack_from("<Q", head, 144)[0])
    cases = [(slot * 4096 + 16 + 24 + 4, flag) for flag in (0x02, 0x04, 0x10, 0x20, 0x40)] + \
            [(slot * 4096 + 16 + 72 + 4, flag) for flag in (0x02, 0x04, 0x08, 0x40)]
    code = (
        "import shutil, sys, ndindex\n"
        "sys.path.insert(0, sys.argv[3])\n"
        "from damage import flip\n"
        "src, work = sys.argv[1], sys.argv[2]\n"
        "for i, spec in enumerate(sys.argv[4:]):\n"
        "    at, mask = map(int, spec.split(':'))\n"
        "    path = f'{work}/f{i}.ndx'\n"
        "    shutil.copyfile(src, path)\n"
        "    flip(path, at, mask)\n"
        "    for readonly in (False, True):\n"
        "        try:\n"
        "            with ndindex.open(path, readonly=readonly) as ix:\n"
        "                ix.query(1)\n"
        "            print(spec, 'opened')\n"
        "        except ndindex.CorruptionError as exc:\n"
        "            print(spec, 'CorruptionError', 'meta page' in str(exc))\n")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", code, src, str(tmp_path),
                           os.path.dirname(__file__)] + [f"{a}:{m}" for a, m in cases],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.splitlines() == [f"{a}:{m} CorruptionError True"
                                        for a, m in cases for _ in range(2)]


def test_a_free_list_out_of_order_is_damage_at_the_next_write_not_an_abort(tmp_path):
    # LMDB reuses the pages its free list names without checking the lists:
    # one out of order aborted a later commit (mdb_freelist_save:
    # "pglast <= env->me_pglast"; tools/sweep_corruption.py --index large
    # --seed 291, trial 159).  A write now checks them first.
    from ndindex import pages
    path = str(tmp_path / "f.ndx")
    rng = np.random.default_rng(12)
    with Index.create(path, k=3, expected_n=50_000, background_compaction=False) as ix:
        for _ in range(3):
            ix.add(rng.integers(0, 2**64, 20_000, dtype=np.uint64))
            ix.compact()
        fm = pages.FileMap(path)
        meta = max(pages.metas_of(pages.read_head(path)), key=lambda m: m["txnid"])
        buf = fm.buffer(os.path.getsize(path))
        free = pages.Tree.from_record(meta["free"])._replace(flags=0x08)
        npages = os.path.getsize(path) // meta["psize"]
        view = pages.PageView(buf, meta["psize"], npages, meta["txnid"], {"free": free},
                              meta["last_pg"])
        lists = [(key, value) for key, value in view.scan("free")
                 if struct.unpack_from("<Q", value)[0] >= 2]
        assert lists, "no free list of two pages to damage"
        key, _ = lists[0]
        off, _, _ = _core.lmdb_get(buf, meta["psize"], npages, tuple(free), key)
        del view, buf
        fm.close()
    with open(path, "r+b") as fh:
        fh.seek(off + 8)
        first, second = struct.unpack("<QQ", fh.read(16))
        fh.seek(off + 8)
        fh.write(struct.pack("<QQ", second, first))
    code = (
        "import sys, numpy as np, ndindex\n"
        "with ndindex.open(sys.argv[1], background_compaction=False) as ix:\n"
        "    stored = int(ix.fingerprints()[7])\n"
        "    try:\n"
        "        ix.add(np.arange(1, 5000, dtype=np.uint64))\n"
        "        print('wrote')\n"
        "    except ndindex.CorruptionError as exc:\n"
        "        print('CorruptionError', 'free-list page numbers do not decrease' in str(exc))\n"
        "    print(stored in ix, 1 in ix)\n")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.splitlines() == ["CorruptionError True", "True False"]  # reads go on
