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

Cost: a full read of the file, O(N log N) for the table comparison.
"""

from __future__ import annotations

import numpy as np

from ndindex import _core, chunks as ch, runs as rn
from ndindex.arrays import isin_sorted, sorted_unique
from ndindex.errors import CorruptionError
from ndindex.records import (DB_CHUNKS, DB_LOG, DB_META, KEY_FINGERPRINTER, KEY_HEADER,
                             KEY_KEY_DESIGN, KEY_MANIFEST, KEY_PLAN, KEY_STATE, KIND_RECORDS,
                             KIND_TOMBSTONES, RECORD_SPACES, SPACE_DOCS, SPACE_FPS_BY_KEY,
                             SPACE_KEYS_BY_FP, SPACE_TOMBSTONES, U64_BE, space_name, unframe)

#: Names of the meta records (FORMAT.md 7.2-7.5); journal positions are
#: JOURNAL_PREFIX and a u64 id (7.3).
META_NAMES = (KEY_HEADER, KEY_PLAN, KEY_STATE, KEY_MANIFEST, KEY_FINGERPRINTER, KEY_KEY_DESIGN)
JOURNAL_PREFIX = b"journal:"


def check_lmdb(view) -> dict:
    """Check LMDB's own structures of a snapshot; return page statistics."""
    if hasattr(_core, "lmdb_check"):
        return _core.lmdb_check(view.buf, view.psize, view.npages)
    pages = 0
    for tree in ("main", "free", DB_META, DB_LOG, DB_CHUNKS):
        rows = view.scan(tree, check_all=True)
        pages += len(rows)
    return {"entries": pages}


def verify(ix) -> dict:
    """Check the whole file behind an open Index; return a summary."""
    from ndindex.index import check_commit_records
    store = ix._store
    store.env  # noqa: B018 - raises ClosedError after close()
    check_commit_records(store)
    snap = ix._snapshot()
    view = snap.view
    lmdb_stats = check_lmdb(view)
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
    for t, design in enumerate(ix.plan.tables):
        parts = []
        for run in snap.table_runs[t]:
            values = _check_fp_run(view, run)
            parts.append(values)
            runs_checked += 1
        values = sorted_unique(np.concatenate(parts)) if parts else np.empty(0, np.uint64)
        original = np.sort(design.invert(values))
        # Merges drop tombstoned values as they pass, table by table: compare
        # what the tables hold apart from the tombstones.
        if len(snap.tombstones):
            original = original[~isin_sorted(original, snap.tombstones)]
        if reference is None:
            reference = original
        elif not np.array_equal(reference, original):
            raise CorruptionError(f"table {t} holds different fingerprints from table 0",
                                  database=DB_CHUNKS)
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
                table_entries=len(reference) if reference is not None else 0,
                log_records=snap.state.log_next_seq - snap.state.log_first_seq,
                log_entries=snap.state.log_ops, removed_pending=len(snap.tombstones),
                keys=len(by_fp), lmdb=lmdb_stats)


def _check_fp_run(view, run) -> np.ndarray:
    """Decode a table run whole, checking it against its manifest entry."""
    cs = rn.fp_chunks(view, run, None if not run.merge_input else
                      (int.from_bytes(run.cursor, "big") + 1 if run.cursor else None))
    if run.merge_input and run.cursor:
        pass  # an input keeps only its chunks above the cursor
    elif len(cs) != run.chunks:
        raise CorruptionError(f"{space_name(run.space)} run {run.run_id} has {len(cs)} chunks, "
                              f"the manifest says {run.chunks}", database=DB_CHUNKS)
    if cs and not cs[-1].flags & ch.FLAG_LAST and not run.merge_output:
        raise CorruptionError(f"{space_name(run.space)} run {run.run_id} lacks its last chunk",
                              database=DB_CHUNKS, key=cs[-1].key)
    values = rn.read_values(view, run).values
    if not run.merge_into:
        if len(values) != run.entries:
            raise CorruptionError(f"{space_name(run.space)} run {run.run_id} holds {len(values)} "
                                  f"values, the manifest says {run.entries}", database=DB_CHUNKS)
        if len(values) and (int(values[0]) != run.first or int(values[-1]) != run.last):
            raise CorruptionError(f"{space_name(run.space)} run {run.run_id} spans other values "
                                  "than the manifest says", database=DB_CHUNKS)
    return values


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
        recs, _, _ = rn.all_records(view, run)
        if not run.merge_into and len(recs) != run.entries:
            raise CorruptionError(f"record run {run.run_id} holds {len(recs)} records, the "
                                  f"manifest says {run.entries}", database=DB_CHUNKS)
        for key, flag, value in recs:
            decided.setdefault(key, (flag, value))
    return {k: value for k, (flag, value) in decided.items() if flag == ch.RECORD_PUT}


__all__ = ["verify", "check_lmdb", "KIND_TOMBSTONES"]
