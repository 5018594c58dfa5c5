"""Damaged index files for the crash tests: a known index, and ways to damage its bytes.

``build_fixture`` writes, through the public API, an index with every kind
of record a v2 file holds -- Huffman-delta runs (2-block chunks in
overflow pages), raw runs (1-block chunks inline in leaf pages), a
tombstone run, record runs of document keys in both key spaces, log
records (one large enough for overflow pages), and a chunks tree deep
enough for a branch page -- and copies it compactly (``vacuum_into``), so
that each live value occurs once in the file (the copy's two restamping
commits leave stale copies of the meta records in free pages).  It
returns the brute-force model of what the index holds and which
fingerprints and keys each part of the build put where, so a test can say
what must survive a given damage.

Damage is done to the file's bytes, as a failing disk would: a value is
found by its bytes (every copy of it), a page by the LMDB page map of the
undamaged file.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import struct

import lmdb
import numpy as np

from ndindex import _core, chunks as ch, records as rec
from ndindex.index import Index

K = 3


class Model:
    """fingerprint -> set of document keys, changed as the index is."""

    def __init__(self):
        self.keys: dict[int, set] = {}

    def add(self, fps, keys=None) -> None:
        for i, fp in enumerate(np.asarray(fps, dtype=np.uint64).tolist()):
            self.keys.setdefault(fp, set())
            if keys is not None and keys[i] is not None:
                self.keys[fp].add(keys[i])

    def remove(self, fingerprints=None, keys=None) -> None:
        for fp in [] if fingerprints is None else np.asarray(fingerprints).tolist():
            self.keys.pop(int(fp), None)
        doomed = set(keys or ())
        for fp in [f for f, ks in self.keys.items() if ks & doomed]:
            self.keys[fp] -= doomed
            if not self.keys[fp]:
                del self.keys[fp]

    def state(self) -> dict:
        return {fp: frozenset(ks) for fp, ks in self.keys.items()}


def contents(path) -> dict:
    """What an index holds: fingerprint -> frozenset of its document keys."""
    out = {}
    with Index.open(path, readonly=True) as ix:
        for fps, keys in ix.items():
            for fp, ks in zip(fps.tolist(), keys):
                out[fp] = frozenset(ks)
    return out


def build_fixture(path: str) -> dict:
    """Write the fixture index at path; return its model state and the parts of the build.

    Parts: ``A`` (4000 fingerprints, the first 3000 with keys ``doc-i``, in
    the main Huffman runs), ``B`` (1000 with keys ``b-i``, a raw level-1
    run), ``tombstoned`` (100 removed after the runs were written: in the
    tombstone run), ``C`` (500 with keys ``c-i``, log record 1), ``D`` (500
    without keys, log record 2, in overflow pages), ``unremoved`` (10 of
    B removed by log record 3).
    """
    rng = np.random.default_rng(7)
    fps = np.unique(rng.integers(0, 2**64, 7000, dtype=np.uint64))[:6000]
    rng.shuffle(fps)
    model = Model()
    tmp = path + ".build"
    saved = ch.CHUNK_MAX_BLOCKS, ch.RECORD_CHUNK_BLOCKS
    try:
        with Index.create(tmp, k=K, expected_n=6000, background_compaction=False,
                          log_limit=1 << 30) as ix:
            def add(sel, keys=None):
                ix.add(sel, keys=keys)
                model.add(sel, keys)

            def remove(fingerprints=None, keys=None):
                ix.remove(fingerprints=fingerprints, keys=keys)
                model.remove(fingerprints, keys)

            # Small chunks make a chunks tree with a branch page out of a few
            # thousand fingerprints: 2-block chunks (overflow pages) for the
            # main runs, 1-block chunks (inline) for the raw run, one
            # sub-block per record chunk.
            ch.RECORD_CHUNK_BLOCKS, ch.CHUNK_MAX_BLOCKS = 1, 2
            a, b = fps[:4000], fps[4000:5000]
            add(a, [f"doc-{i}" for i in range(3000)] + [None] * 1000)
            add(np.repeat(a[:20], 3), [f"also-{i}-{j}" for i in range(20) for j in range(3)])
            ix.compact(full=True)
            ch.CHUNK_MAX_BLOCKS = 1
            add(b, [f"b-{i}" for i in range(1000)])
            ix.compact()
            remove(fingerprints=a[3000:3050])
            remove(keys=[f"doc-{i}" for i in range(100, 150)])
            ix.compact()
            ch.CHUNK_MAX_BLOCKS, ch.RECORD_CHUNK_BLOCKS = saved
            c, d = fps[5000:5500], fps[5500:6000]
            add(c, [f"c-{i}" for i in range(500)])
            add(d)
            remove(fingerprints=b[:10])
            snap = ix._snapshot()
            assert snap.state.log_next_seq - snap.state.log_first_seq == 3
            tombstoned = snap.tombstones.copy()
            ix.vacuum_into(path)
    finally:
        ch.CHUNK_MAX_BLOCKS, ch.RECORD_CHUNK_BLOCKS = saved
        for leftover in (tmp, tmp + "-lock"):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
    assert set(tombstoned.tolist()) == set(a[3000:3050].tolist()) | set(a[100:150].tolist())
    return dict(state=model.state(), A=a, B=b, C=c, D=d, tombstoned=tombstoned,
                unremoved=b[:10], log_first_seq=int(snap.state.log_first_seq))


# -- finding and damaging bytes ------------------------------------------------------


def records(path, db: str) -> list[tuple[bytes, bytes]]:
    """(key, value) of every record of a named database, read through LMDB (intact files)."""
    env = lmdb.open(path, subdir=False, max_dbs=4, readonly=True, lock=False)
    try:
        handle = env.open_db(db.encode(), create=False)
        with env.begin(db=handle) as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


def occurrences(data: bytes, needle: bytes) -> list[int]:
    out, at = [], data.find(needle)
    while at >= 0:
        out.append(at)
        at = data.find(needle, at + 1)
    return out


def flip(path, offset: int, mask: int = 0xFF) -> None:
    """XOR one byte of the file with mask."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ mask]))


def damage_value(path, db: str, key: bytes, at: int = 0) -> int:
    """Flip byte `at` of every copy of the value stored under key; return how many copies.

    Short values are found with their key in front (a leaf node holds the
    key, then the value); long ones by their bytes alone (overflow pages).
    """
    value = dict(records(path, db))[key]
    data = pathlib.Path(path).read_bytes()
    needle = value if len(value) >= 48 else key + value
    hits = occurrences(data, needle)
    assert hits, f"{db}/{key!r} not found in the file"
    for hit in hits:
        flip(path, hit + len(needle) - len(value) + at % len(value))
    return len(hits)


def page_map(path) -> dict:
    """kind and owning tree of every page of an intact file: {page: (kind, tree)}."""
    pm = _core.lmdb_page_map(pathlib.Path(path).read_bytes())
    return {p: (pm["kind_names"][k], pm["trees"][o] if o < len(pm["trees"]) else None)
            for p, (k, o) in enumerate(zip(pm["kinds"], pm["owners"]))}


def pages_of(path, kind: str, tree: str | None = None) -> list[int]:
    return [p for p, (k, t) in page_map(path).items() if k == kind and (tree is None or t == tree)]


def leaf_keys(path, page: int, psize: int = 4096) -> list[bytes]:
    """The keys of a leaf page of an intact file."""
    data = pathlib.Path(path).read_bytes()
    base = page * psize
    lower = struct.unpack_from("<H", data, base + 12)[0]
    keys = []
    for i in range((lower - 16) // 2):
        off = struct.unpack_from("<H", data, base + 16 + 2 * i)[0]
        ksize = struct.unpack_from("<H", data, base + off + 6)[0]
        keys.append(data[base + off + 8:base + off + 8 + ksize])
    return keys


def chunk_keys(path, space: int) -> list[bytes]:
    return [k for k, _ in records(path, rec.DB_CHUNKS) if k[0] == space]
