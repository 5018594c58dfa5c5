"""Runs: reading and writing the sorted runs of each space through a snapshot.

A run's chunks are found in the chunks tree under the run's prefix (space,
run id).  Readers here check what the C query kernel checks: each chunk's
header against its key, and that chunks chain (each one's low fence is the
previous one's last entry), so a missing or misrouted chunk is an error,
never a silently shorter run.  Decoding is in :mod:`ndindex.chunks` and
:mod:`ndindex.codec`; this module knows where runs live.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ndindex import _core, chunks as ch, codec
from ndindex.arrays import EMPTY_U64, merge_unique
from ndindex.errors import CorruptionError
from ndindex.pages import PageView
from ndindex.records import (DB_CHUNKS, KIND_HUFFMAN, KIND_RAW, KIND_RECORDS,
                             KIND_TOMBSTONES, Run, space_name)


@functools.lru_cache(maxsize=1024)
def code_of(raw: bytes) -> codec.HuffmanCode:
    """The compiled Huffman code of a run (cached: runs share few distinct codes)."""
    return codec.HuffmanCode.from_bytes(raw)


def run_code(run: Run) -> codec.HuffmanCode | None:
    return code_of(run.code) if run.kind == KIND_HUFFMAN else None


def live_start(run: Run) -> int | None:
    """The first value a reader may take from a merge input (above its cursor);
    None for other runs.  A merge input's chunks below it go as its merge
    advances, and no query probes them any more."""
    if run.merge_input and run.cursor:
        return int.from_bytes(run.cursor, "big") + 1
    return None


def fp_chunks(view: PageView, run: Run, start: int | None = None, limit: int = -1) -> list:
    """The run's chunks (checked FpChunk) from the one holding `start` on, at most limit.

    Raises CorruptionError for a damaged chunk or a broken chain.
    """
    prefix = ch.run_prefix(run.space, run.run_id)
    seek = prefix + (0 if start is None else start).to_bytes(8, "big")
    rows = view.scan(DB_CHUNKS, seek, prefix=prefix, limit=limit)
    out, prev = [], None
    for key, value in rows:
        c = ch.unpack_fp_chunk(key, value)
        if c.kind != run.kind:
            raise CorruptionError(f"chunk kind {c.kind} in a run of kind {run.kind}",
                                  database=DB_CHUNKS, key=key)
        if prev is None:
            if start is None and not c.flags & ch.FLAG_FIRST and not run.merge_input:
                raise CorruptionError("run's first chunk is missing", database=DB_CHUNKS, key=key)
            if start is not None and not c.flags & ch.FLAG_FIRST and c.low_fence >= start:
                raise CorruptionError("chunk fences do not match its neighbours",
                                      database=DB_CHUNKS, key=key)
        elif c.low_fence != prev.last or c.flags & ch.FLAG_FIRST:
            raise CorruptionError("chunk fences do not match its neighbours",
                                  database=DB_CHUNKS, key=key)
        out.append(c)
        prev = c
    return out


class Slice(NamedTuple):
    """Values read from a run: sorted, complete up to `end`; the chunks they came from."""

    values: np.ndarray
    end: int | None       # the last value of the last chunk read (None: nothing read)
    exhausted: bool       # no live chunk of the run lies beyond
    chunk_keys: list      # LMDB keys of the chunks read


def read_values(view: PageView, run: Run, above: int | None = None,
                limit_chunks: int = -1, stop: int | None = None) -> Slice:
    """Decode the run's live values above `above` (exclusive), up to limit_chunks chunks,
    and after the first no chunk whose values all lie past `stop`.

    One C call (``_core.run_read``): chunk headers, fences and every block
    are checked.  Merge inputs start above their cursor; merge outputs stop
    at theirs.  Raises CorruptionError.
    """
    start = live_start(run)
    if above is not None:
        if above + 1 >= 1 << 64:
            return Slice(EMPTY_U64, (1 << 64) - 1, True, [])
        start = max(start or 0, above + 1)
    code = run_code(run).compiled if run.kind == KIND_HUFFMAN else None
    raw, keys, end, exhausted, last_seen = _core.run_read(
        view.buf, view.psize, view.npages, tuple(view.trees[DB_CHUNKS]), run.space, run.run_id,
        run.kind, code, start or 0, limit_chunks if limit_chunks > 0 else 1 << 62,
        (1 << 64) - 1 if stop is None else stop)
    values = np.frombuffer(raw, dtype=np.uint64)
    if run.merge_output and run.cursor:
        cursor = int.from_bytes(run.cursor, "big")
        values = values[:np.searchsorted(values, np.uint64(cursor), side="right")]
        exhausted = exhausted or (bool(keys) and end >= cursor)
    elif exhausted and not last_seen and run.chunks and not run.merge_output and \
            (start is None or start <= run.last):
        # A complete run's chunks end with one flagged as its last (a read
        # that starts past the run's last value meets none of them).
        raise CorruptionError(f"{space_name(run.space)} run {run.run_id} lacks its last chunk",
                              database=DB_CHUNKS)
    if not keys and run.chunks and not run.merge_output and (start is None or start <= run.last):
        raise CorruptionError(f"{space_name(run.space)} run {run.run_id} has no chunk at or "
                              "after its start", database=DB_CHUNKS)
    return Slice(values, end if keys else None, bool(exhausted), keys)


class RunReader:
    """A run read read_chunks chunks at a time (read_values), counting what it read."""

    def __init__(self, view: PageView, run: Run, read_chunks: int, above: int | None = None):
        self.view, self.run, self.read_chunks = view, run, read_chunks
        self.buf = EMPTY_U64
        self.above = above          # the last value read (exclusive start of the next read)
        self.end = 0
        self.exhausted = False      # nothing of the run is left to read
        self.chunks = self.entries = 0
        self.first = self.last = None

    @property
    def done(self) -> bool:
        return self.exhausted and not len(self.buf)

    def fill(self) -> None:
        """Read the next chunks if everything read so far was taken."""
        if self.exhausted or len(self.buf):
            return
        # The run's chunk flagged last ends it (read_values reports a missing one).
        sl = read_values(self.view, self.run, self.above, self.read_chunks)
        self.chunks += len(sl.chunk_keys)
        self.entries += len(sl.values)
        if len(sl.values):
            if self.first is None:
                self.first = int(sl.values[0])
            self.last = int(sl.values[-1])
        self.buf = sl.values
        if sl.end is not None:
            self.above = self.end = sl.end
        self.exhausted = sl.exhausted or sl.end is None

    def take(self, upto: int | None) -> np.ndarray:
        """The values read and not yet taken up to upto (all of them for None)."""
        if upto is None:
            out, self.buf = self.buf, EMPTY_U64
            return out
        cut = int(np.searchsorted(self.buf, np.uint64(upto), side="right"))
        out, self.buf = self.buf[:cut], self.buf[cut:]
        return out


def union_slices(readers: list, hidden: np.ndarray = EMPTY_U64):
    """Yield (values, upto): the distinct live values of the readers' runs together,
    less the sorted values hidden, sorted, in slices; a slice holds every
    value up to `upto` (None: the last slice, the rest) not in an earlier one.

    A k-way merge by value that reads each run a few chunks at a time, so
    memory is bounded by the readers' read_chunks, not by the runs.  Runs
    overlap (a fingerprint added twice lives in two runs until they merge):
    a value is yielded once.  Each slice is one merge in C (arrays.merge_unique)
    with the slice of hidden it can meet: a 30M table with 660,000
    tombstones (bench_stream's streamed and churned file, warm) took 0.79 s
    to count, sorting slices and searching the tombstones per value; 0.35 s so.
    """
    readers = list(readers)
    low = 0  # hidden[:low] lie below every value still to come
    while readers:
        for r in readers:
            r.fill()
        # Every run has been read past `upto` or is done: values up to it are final.
        upto = min((r.end for r in readers if not r.exhausted), default=None)
        high = len(hidden) if upto is None else \
            int(np.searchsorted(hidden, np.uint64(upto), side="right"))
        yield merge_unique([r.take(upto) for r in readers], hidden[low:high]), upto
        low = high
        readers = [r for r in readers if not r.done]


def all_values(view: PageView, run: Run) -> np.ndarray:
    """Every live value of a run, sorted (permuted space)."""
    return read_values(view, run).values


def build_fp_chunks(space: int, run_id: int, kind: int, values: np.ndarray,
                    code: codec.HuffmanCode | None, low_fence: int | None,
                    is_last: bool, whole_chunks_only: bool = False, packed: bool = False):
    """Encode sorted distinct values into chunk (key, value) pairs.

    packed: raw blocks may be packed (FORMAT.md 5.3; files of format 4).
    whole_chunks_only keeps only full chunks (a merge step that is not the
    last): returns (pairs, entries written, last value written or None).
    """
    if not len(values):
        return [], 0, None
    enc = ch.encode_values(values, kind, code, packed)
    counts = ch.block_entry_counts(enc, kind)
    nb = enc.n_blocks
    if whole_chunks_only:
        nb = nb // ch.CHUNK_MAX_BLOCKS * ch.CHUNK_MAX_BLOCKS
        if nb == 0:
            return [], 0, None
        enc = codec.EncodedTable(enc.blocks[:nb * ch.BLOCK_BYTES], enc.keys[:nb])
        counts = counts[:nb]
    pairs = ch.pack_fp_chunks(space, run_id, kind, enc, counts, low_fence, is_last)
    return pairs, int(counts.sum()), int(enc.keys[-1])


def chunk_keys(view: PageView, run: Run) -> list:
    """The LMDB keys of every chunk of a run (no value is decoded)."""
    prefix = ch.run_prefix(run.space, run.run_id)
    return [key for key, _ in view.scan(DB_CHUNKS, prefix, prefix=prefix)]


# -- tombstones ----------------------------------------------------------------


def load_tombstones(view: PageView, run: Run | None):
    """(fps, stamps) of the tombstone run, sorted by fingerprint; empty if none."""
    if run is None:
        return EMPTY_U64, np.empty(0, np.uint32)
    prefix = ch.run_prefix(run.space, run.run_id)
    fps, stamps, low, done = [], [], None, False
    for key, value in view.scan(DB_CHUNKS, prefix, prefix=prefix):
        if done:
            raise CorruptionError("tombstone chunk after the run's last", database=DB_CHUNKS, key=key)
        f, s, done = ch.unpack_tombstone_chunk(key, value, low)
        fps.append(f)
        stamps.append(s)
        low = int(f[-1])
    if not done or sum(len(f) for f in fps) != run.entries:
        raise CorruptionError(f"tombstone run {run.run_id} is incomplete", database=DB_CHUNKS)
    return np.concatenate(fps), np.concatenate(stamps)


def union_tombstones(arrays: list) -> tuple:
    """(fps, stamps) of several tombstone runs' (fps, stamps) together: sorted
    by fingerprint, each fingerprint once with its newest (largest) stamp,
    which hides every run any of its stamps does (FORMAT.md [F15])."""
    if not arrays:
        return EMPTY_U64, np.empty(0, np.uint32)
    if len(arrays) == 1:
        return arrays[0]
    return newest_tombstones(np.concatenate([a[0] for a in arrays]),
                             np.concatenate([a[1] for a in arrays]))


def add_tombstones(union: tuple, more: tuple) -> tuple:
    """union_tombstones([union, more]) in O(len(union)) rather than a sort of
    both: more's fingerprints inserted where they are new, and where union
    has one already, the newer stamp kept."""
    fps, stamps = union
    new_fps, new_stamps = more
    if not len(new_fps):
        return union
    at = np.searchsorted(fps, new_fps)
    there = at < len(fps)
    there[there] = fps[at[there]] == new_fps[there]
    if there.any():
        stamps = stamps.copy()
        stamps[at[there]] = np.maximum(stamps[at[there]], new_stamps[there])
        at, new_fps, new_stamps = at[~there], new_fps[~there], new_stamps[~there]
    return np.insert(fps, at, new_fps), np.insert(stamps, at, new_stamps)


def newest_tombstones(fps: np.ndarray, stamps: np.ndarray) -> tuple:
    """Tombstones (parts each sorted, concatenated) sorted by fingerprint, one
    a fingerprint: the newest (largest) stamp, which hides every run an
    older one did.  (Flushes before compaction used this wrote a fingerprint
    removed again within one log twice: a tombstone chunk with a repeated
    value, which readers reject as damage and `ndindex recover` repairs.)"""
    order = np.argsort(fps, kind="stable")  # a merge of sorted parts (timsort)
    fps, stamps = fps[order], stamps[order]
    first = np.ones(len(fps), bool)
    first[1:] = fps[1:] != fps[:-1]
    if first.all():
        return fps, stamps
    return fps[first], np.maximum.reduceat(stamps, np.flatnonzero(first))


# -- record runs -----------------------------------------------------------------


def _record_live(run: Run, key: bytes) -> bool:
    if run.merge_input and run.cursor:
        return key > run.cursor
    if run.merge_output:
        return bool(run.cursor) and key <= run.cursor
    return True


def record_chunks(view: PageView, run: Run, start: bytes = b"", limit: int = -1,
                  exclusive: bool = False) -> list:
    """Checked RecordChunks of a run from the one that would hold `start`.

    A chunk holds the keys in (its low fence, its separator]: the first one
    found must have a fence below start (at most start when exclusive, that
    is when the keys wanted are those above start).
    """
    prefix = ch.run_prefix(run.space, run.run_id)
    rows = view.scan(DB_CHUNKS, prefix + start, prefix=prefix, limit=limit)
    out, prev = [], None
    for key, value in rows:
        c = ch.unpack_record_chunk(key, value)
        if prev is None:
            _check_first_fence(run, key, c.low_fence, start, exclusive)
        elif c.low_fence != prev.separator:
            raise CorruptionError("record chunk fences do not match its neighbours",
                                  database=DB_CHUNKS, key=key)
        out.append(c)
        prev = c
    return out


def _check_first_fence(run: Run, key: bytes, fence: bytes | None, start: bytes,
                       exclusive: bool) -> None:
    """The first chunk found for start must be the one that holds it ([F16]).

    A chunk holds the keys in (its low fence, its separator]: the one before
    it (if any) ends below start (at start when exclusive), unless a merge
    consumed and deleted chunks up to its cursor.  A run's first chunk
    must be present unless a merge consumed it.
    """
    if fence is None:
        return
    if not start:
        if not run.merge_input:
            raise CorruptionError("record run's first chunk is missing", database=DB_CHUNKS,
                                  key=key)
        return
    if (fence > start if exclusive else fence >= start) and \
            not (run.merge_input and run.cursor and fence <= run.cursor):
        raise CorruptionError("record chunk fences do not match its neighbours",
                              database=DB_CHUNKS, key=key)


def record_lookup(view: PageView, run: Run, group: bytes) -> list:
    """Live records of a run whose key begins with group: [(key, flag, value)].

    One seek in the chunks tree; the chunk's filter rules most absent
    groups out without reading a sub-block (FORMAT.md 7.9).  A group's keys
    continue into the next chunk only while the chunk's separator begins
    with the group.
    """
    if run.chunks == 0:
        return []
    out = []
    prefix = ch.run_prefix(run.space, run.run_id)
    rows = view.scan(DB_CHUNKS, prefix + group, prefix=prefix, limit=1)
    first = True
    while rows:
        key, value = rows[0]
        flags, _, fence, blocks, _ = _core.record_chunk(key, value, group)
        if first:
            _check_first_fence(run, key, fence, group, exclusive=False)
            first = False
        for entry in blocks:
            out += [r for r in ch.find_records(key, value, entry, group) if _record_live(run, r[0])]
        sep = key[5:]
        if flags & ch.FLAG_LAST or not sep.startswith(group):
            break
        rows = view.scan(DB_CHUNKS, key + b"\0", prefix=prefix, limit=1)
        if rows:
            nxt = _core.record_chunk(rows[0][0], rows[0][1])[2]
            if nxt != sep:
                raise CorruptionError("record chunk fences do not match its neighbours",
                                      database=DB_CHUNKS, key=rows[0][0])
    return out


def record_lookup_many(view: PageView, run: Run, groups: list) -> dict:
    """Live records of each group in one run: {group index: [(key, flag, value)]}.

    The seeks, chunk checks and filters run in one C call; only the chunks
    that may hold a group are read further (see record_lookup).
    """
    if run.chunks == 0 or not groups:
        return {}
    prefix = ch.run_prefix(run.space, run.run_id)
    cursor = run.cursor if run.merge_input and run.cursor else None
    hits = _core.record_probe(view.buf, view.psize, view.npages, view.trees[DB_CHUNKS],
                              prefix, groups, cursor)
    out = {}
    mv = memoryview(view.buf)
    last = [None, None]
    for i, key, off, length in sorted(hits, key=lambda hit: (hit[1], groups[hit[0]])):
        group = groups[i]
        value = mv[off:off + length]
        _, _, _, blocks, _ = _core.record_chunk(key, value, group)
        found = []
        for entry in blocks:
            found += [r for r in ch.find_records(key, value, entry, group, last)
                      if _record_live(run, r[0])]
        if key[5:].startswith(group):  # the group goes on past this chunk
            found = record_lookup(view, run, group)
        if found:
            out[i] = found
    return out


def all_records(view: PageView, run: Run, above: bytes | None = None, limit_chunks: int = -1):
    """Live records of a run in order (above `above`, exclusive): (records, end, exhausted)."""
    start = above if above is not None else (run.cursor if run.merge_input else b"")
    # A chunk whose separator is `start` holds nothing above it: begin after.
    cs = record_chunks(view, run, start + b"\0" if start else b"", limit_chunks, exclusive=True)
    recs = []
    for c in cs:
        recs.extend(r for r in c.all_records() if _record_live(run, r[0])
                    and (above is None or r[0] > above))
    exhausted = not cs or bool(cs[-1].flags & ch.FLAG_LAST)
    return recs, (cs[-1].separator if cs else None), exhausted


__all__ = ["KIND_HUFFMAN", "KIND_RAW", "KIND_RECORDS", "KIND_TOMBSTONES"]
