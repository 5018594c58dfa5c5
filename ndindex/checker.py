"""verify(): every LMDB page, record, checksum, ordering and run of an index file.

The checks, in order (each raises CorruptionError naming what is wrong):

1. LMDB's structures: both meta pages, every page of every tree reachable
   from the newest one, the free list, no page used twice
   (``_core.lmdb_check`` when the build has it; otherwise a full walk of each
   tree with every page checked).
2. The commit records: both meta pages name transactions that wrote the
   state record ([F9]).
3. The records: header, plan, state, manifest, every log record; every
   meta record has a name the format knows and its frame (which covers
   the name, [F2]) verifies, and the fingerprinter and key design parse.
4. Every chunk belongs to a run the manifest names; every run's chunks
   chain (fences), decode (block checksums), hold the entries and the
   range the manifest says.
5. Every table holds the same fingerprints; the two key spaces mirror
   each other; every document record in the runs parses and its
   (fingerprint, key) pair is in the key spaces.

Cost: a full read of the file; memory bounded by a few chunks a run, not by N.
"""

from __future__ import annotations

import numpy as np

from ndindex import _core, chunks as ch, runs as rn, store as st
from ndindex.errors import CorruptionError
from ndindex.records import (DB_CHUNKS, DB_LOG, DB_META, KEY_FINGERPRINTER, KEY_HEADER,
                             KEY_KEY_DESIGN, KEY_MANIFEST, KEY_PLAN, KEY_STATE, KIND_RAW,
                             KIND_RECORDS, KIND_TOMBSTONES, RECORD_SPACES, SPACE_DOCS,
                             SPACE_FPS_BY_KEY, SPACE_KEYS_BY_FP, SPACE_TOMBSTONES, U64_BE,
                             space_name, unframe)

#: Names of the meta records (FORMAT.md 7.2-7.5); journal positions are
#: JOURNAL_PREFIX and a u64 id (7.3).
META_NAMES = (KEY_HEADER, KEY_PLAN, KEY_STATE, KEY_MANIFEST, KEY_FINGERPRINTER, KEY_KEY_DESIGN)
JOURNAL_PREFIX = b"journal:"


#: How many times check_lmdb looks again when commits came during a look.
LMDB_CHECK_TRIES = 5


def check_lmdb(view, filemap) -> dict:
    """Check LMDB's own structures; return page statistics.

    The C checker reads the newest meta page, not the snapshot's: a commit
    of another process since the snapshot may have trees past the
    snapshot's pages ("page number past the end of the file", 12 times in
    108,000 checks beside a writer, when it was given the snapshot's).  So
    it checks the file as it is now (filemap, the file's map), and again
    while commits keep landing during a check (the meta pages or the size
    changed): no page it walks is reused meanwhile, as the caller holds a
    snapshot."""
    if hasattr(_core, "lmdb_check"):
        for attempt in range(LMDB_CHECK_TRIES):
            size = filemap.file_bytes()
            buf = filemap.buffer(size)
            head = bytes(memoryview(buf)[:2 * view.psize])
            try:
                return _core.lmdb_check(buf, view.psize, size // view.psize)
            except CorruptionError:
                changed = filemap.file_bytes() != size or \
                    bytes(memoryview(buf)[:2 * view.psize]) != head
                if not changed or attempt == LMDB_CHECK_TRIES - 1:
                    raise
    pages = 0
    for tree in ("main", "free", DB_META, DB_LOG, DB_CHUNKS):
        rows = view.scan(tree, check_all=True)
        pages += len(rows)
    return {"entries": pages}


def verify(ix, progress=None) -> dict:
    """Check the whole file behind an open Index; return a summary.

    progress(phase, done, total), if given, is called as the tables are read
    (done and total count table entries).
    """
    store = ix._store
    store.env  # noqa: B018 - raises ClosedError after close()
    st.check_commit_records(store)
    snap = ix._snapshot()
    view = snap.view
    lmdb_stats = check_lmdb(view, store.filemap)
    snap.log  # noqa: B018 - parses every log record
    documents_configured = _check_meta_records(view)
    man = snap.manifest
    # Every chunk must belong to a run of the manifest.
    known = {ch.run_prefix(r.space, r.run_id) for r in man.runs}
    chunk_count = 0
    for key, _ in view.scan(DB_CHUNKS):
        chunk_count += 1
        if key[:5] not in known:
            raise CorruptionError(f"chunk of {space_name(key[0])} run "
                                  f"{int.from_bytes(key[1:5], 'big')} that the manifest does "
                                  "not name", database=DB_CHUNKS, key=key)
    runs_checked = 0
    reference = None
    read = _Read(progress, sum(r.entries for runs in snap.table_runs for r in runs))
    for t, design in enumerate(ix.plan.tables):
        digest = _table_digest(view, design, snap.table_runs[t], snap.tombstones, read)
        runs_checked += len(snap.table_runs[t])
        if reference is None:
            reference = digest
        elif digest != reference:
            raise CorruptionError(f"table {t} holds different fingerprints from table 0 "
                                  f"({digest[0]:,} against {reference[0]:,})",
                                  database=DB_CHUNKS)
    if not ix._packs_raw:
        _check_plain_raw(view, man, ix._header.read_version)
    if len(man.of(SPACE_TOMBSTONES)) > 1 and not ix._levels_tombstones:
        raise CorruptionError(f"{len(man.of(SPACE_TOMBSTONES))} tombstone runs in a file of "
                              f"format {ix._header.read_version} (one before format 5, [M3])",
                              database=DB_META, key=KEY_MANIFEST)
    for run in man.of(SPACE_TOMBSTONES):
        rn.load_tombstones(view, run)
        runs_checked += 1
    live_keys = {}
    for space in RECORD_SPACES:
        live_keys[space] = _check_record_space(view, man.of(space))
        runs_checked += len(man.of(space))
    by_fp = {(U64_BE.unpack(k[:8])[0], k[8:]) for k in live_keys[SPACE_KEYS_BY_FP]}
    by_key = {(U64_BE.unpack(k[-8:])[0], k[:-8]) for k in live_keys[SPACE_FPS_BY_KEY]}
    if by_fp != by_key:
        raise CorruptionError(f"the key spaces disagree on {len(by_fp ^ by_key)} (fingerprint, "
                              "key) pairs", database=DB_CHUNKS)
    _check_documents(live_keys[SPACE_DOCS], by_fp, documents_configured)
    return dict(tables=len(ix.plan.tables), runs=runs_checked, chunks=chunk_count,
                table_entries=reference[0] if reference is not None else 0,
                log_records=snap.state.log_records,
                log_entries=snap.state.log_ops, removed_pending=len(snap.tombstones),
                keys=len(by_fp), lmdb=lmdb_stats)


def _check_plain_raw(view, man, version: int) -> None:
    """[B15]: a file of format 3 or older holds plain raw blocks only (its
    readers know no other form)."""
    for run in man.runs:
        if run.kind != KIND_RAW:
            continue
        for c in rn.fp_chunks(view, run):
            widths = np.frombuffer(c.blocks, np.uint8)[6::ch.BLOCK_BYTES]
            if widths.any():
                raise CorruptionError(f"a packed raw block in a file of format {version} "
                                      "(packed blocks need format 4)", database=DB_CHUNKS,
                                      key=c.key)


#: Chunks read from each run at a time by the table check (about 1.5 MB of
#: values each): memory stays bounded however large the index.
READ_CHUNKS = 64


class _Read:
    """Table entries read so far, reported to a progress callback."""

    def __init__(self, progress, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def add(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress("verify", min(self.done, self.total), self.total)


def _table_digest(view, design, runs, tombstones: np.ndarray, read: _Read) -> tuple:
    """(count, digest) of the distinct fingerprints a table holds apart from the tombstones,
    checking each run against its manifest entry.

    The runs are read side by side in slices (runs.union_slices), so memory
    is bounded by READ_CHUNKS chunks a run, not by N: the table comparison
    used to sort every table whole (2 GB at 30M, so 60 GB at 1B).  Tables
    are compared by an order-free digest of their sets (two sums of 64-bit
    mixes of each fingerprint), as they are kept in different orders: two
    different sets agree by chance with probability about 2^-128.  Merges
    drop tombstoned values table by table, so those are left out.
    """
    hidden = np.sort(design.apply(tombstones)) if len(tombstones) else tombstones
    readers = [rn.RunReader(view, run, READ_CHUNKS) for run in runs]
    count, digest = 0, (0, 0)
    for values, _ in rn.union_slices(readers, hidden):
        read.add(len(values))
        count += len(values)
        digest = _add_digest(digest, design.invert(values))
    for r in readers:
        _check_run_read(r)
    return count, digest


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 that scatters every bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _add_digest(digest: tuple, fps: np.ndarray) -> tuple:
    if not len(fps):
        return digest
    a = int(np.sum(_mix(fps), dtype=np.uint64))
    b = int(np.sum(_mix(fps ^ np.uint64(0x9E3779B97F4A7C15)), dtype=np.uint64))
    return ((digest[0] + a) & (2**64 - 1), (digest[1] + b) & (2**64 - 1))


def _check_run_read(r) -> None:
    """A run read whole (a RunReader) holds what its manifest entry says."""
    run = r.run
    name = f"{space_name(run.space)} run {run.run_id}"
    if not (run.merge_input and run.cursor) and r.chunks != run.chunks:
        raise CorruptionError(f"{name} has {r.chunks} chunks, the manifest says {run.chunks}",
                              database=DB_CHUNKS)
    if run.merge_into:
        return
    if r.entries != run.entries:
        raise CorruptionError(f"{name} holds {r.entries} values, the manifest says "
                              f"{run.entries}", database=DB_CHUNKS)
    if r.entries and (r.first != run.first or r.last != run.last):
        raise CorruptionError(f"{name} spans other values than the manifest says",
                              database=DB_CHUNKS)


def _check_meta_records(view) -> bool:
    """Check every meta record's name and frame, and parse the document configuration.

    A damaged name is found here: the frame's checksum covers it.  Returns
    whether the index stores documents (has a fingerprinter record).
    Raises CorruptionError, or FormatError for a configuration this
    version cannot read.
    """
    for key, value in view.scan(DB_META):
        known = key in META_NAMES or (key.startswith(JOURNAL_PREFIX) and
                                      len(key) == len(JOURNAL_PREFIX) + 8)
        if not known:
            raise CorruptionError(f"meta record of unknown name {key[:40]!r}", database=DB_META,
                                  key=key)
        unframe(value, DB_META, key)
    fingerprinter = view.get(DB_META, KEY_FINGERPRINTER)
    design = view.get(DB_META, KEY_KEY_DESIGN)
    if fingerprinter is None:
        if design is not None:
            raise CorruptionError("a key design record without a fingerprinter record",
                                  database=DB_META, key=KEY_KEY_DESIGN)
        return False
    from ndindex.docstore import DocConfig
    DocConfig.from_records(unframe(fingerprinter, DB_META, KEY_FINGERPRINTER),
                           None if design is None else unframe(design, DB_META, KEY_KEY_DESIGN))
    return True


def _check_documents(documents: dict, pairs: set, configured: bool) -> None:
    """Check that every document record in the runs parses and its key pair is stored."""
    if documents and not configured:
        raise CorruptionError(f"{len(documents)} document records in an index without a "
                              "fingerprinter record", database=DB_CHUNKS)
    from ndindex.docstore import unpack_document
    for key, value in documents.items():
        unpack_document(value, key)
        if (U64_BE.unpack(key[:8])[0], key[8:]) not in pairs:
            raise CorruptionError("a document whose (fingerprint, key) pair is not in the key "
                                  "spaces", database=DB_CHUNKS, key=key)


def _check_record_space(view, runs) -> dict:
    """Read every record run of a space (newest first); return the live records' values by key."""
    decided = {}
    for run in runs:
        if run.kind != KIND_RECORDS:
            raise CorruptionError(f"run {run.run_id} of a key space is not a record run",
                                  database=DB_CHUNKS)
        recs, _, whole = rn.all_records(view, run)
        if run.chunks and not run.merge_output and not whole:
            # As for fingerprint runs: a complete run's chunks end with one
            # flagged as its last (readers of records go on without it).
            raise CorruptionError(f"{space_name(run.space)} run {run.run_id} lacks its last "
                                  "chunk", database=DB_CHUNKS)
        if not run.merge_into and len(recs) != run.entries:
            raise CorruptionError(f"record run {run.run_id} holds {len(recs)} records, the "
                                  f"manifest says {run.entries}", database=DB_CHUNKS)
        for key, flag, value in recs:
            decided.setdefault(key, (flag, value))
    return {k: value for k, (flag, value) in decided.items() if flag == ch.RECORD_PUT}


__all__ = ["verify", "check_lmdb", "KIND_TOMBSTONES"]
