"""The methods of Index that read its whole contents: fingerprints, items, iter_chunks.

A mixin of :class:`ndindex.index.Index`, kept apart so that each reads in
one sitting.  They read table 0's runs in order, a slice at a time
(Snapshot.table_values), with this writer's pending operations applied, so
that memory stays bounded whatever N when table 0 keeps the fingerprints'
order, as every planned table design does.
"""

from __future__ import annotations

import numpy as np

from ndindex import validate
from ndindex.arrays import EMPTY_U64, isin_sorted
from ndindex.reader import key_order
from ndindex.records import SPACE_KEYS_BY_FP, U64_BE, decode_doc_key

#: items() and fingerprints() read table 0 about this many values a run at a time.
ORDER_SLICE_VALUES = 1 << 20


class _KeysInOrder:
    """The keys of ascending pieces of fingerprints, as Snapshot.keys_of gives
    them, read by one pass over the key records in order (a merge join)
    instead of a lookup a fingerprint: 19 us a key in an export, then."""

    def __init__(self, snap, pend):
        self._records = (snap.space_records(SPACE_KEYS_BY_FP, pend)
                         if snap.may_hold_records(SPACE_KEYS_BY_FP, pend) else None)
        self._ahead = None   # a record read past the last piece

    def __call__(self, part: np.ndarray) -> list[tuple]:
        fps = part.tolist()
        if self._records is None or not fps:
            return [()] * len(fps)
        found, last = {}, fps[-1]
        record = self._ahead or next(self._records, None)
        while record is not None:
            fp = U64_BE.unpack_from(record[0])[0]
            if fp > last:
                break
            found.setdefault(fp, []).append(decode_doc_key(record[0][8:]))
            record = next(self._records, None)
        self._ahead = record
        return [tuple(sorted(found[fp], key=key_order)) if fp in found else () for fp in fps]


class ContentMethods:
    """fingerprints, items, iter_chunks."""

    def fingerprints(self) -> np.ndarray:
        """Return every live fingerprint, sorted.  Cost: O(N log N), O(N) memory."""
        snap, new, gone = self._pending_view()
        return np.concatenate(list(self._in_order(snap, new, gone)) + [EMPTY_U64])

    def items(self, chunk: int = 65536):
        """Yield (fingerprints, keys) chunks of every live fingerprint, in order.

        One snapshot serves the whole iteration.  Memory stays bounded (a few
        MB a run) when the plan's first table keeps the fingerprints' order,
        as every plan the planner makes does; otherwise the fingerprints are
        sorted whole first.  chunk: a positive int (ValueError, at the call).
        """
        return self._items(validate.positive_int(chunk, "chunk"))

    def _items(self, chunk: int, view: tuple | None = None):
        """items(chunk) from view, (snapshot, pending operations), or a new _view()."""
        snap, pend = self._view() if view is None else view
        new, gone = self._pending_changes(snap, pend)
        keys_of = _KeysInOrder(snap, pend)
        held = []   # sorted pieces not yet given out, in order
        count = 0
        for values in self._in_order(snap, new, gone):
            held.append(values)
            count += len(values)
            if count < chunk:
                continue
            run = np.concatenate(held)   # once a piece: the parts below are views
            whole = len(run) - len(run) % chunk
            for start in range(0, whole, chunk):
                part = run[start:start + chunk]
                yield part, keys_of(part)
            held, count = [run[whole:]], len(run) - whole
        if count:
            part = np.concatenate(held)
            yield part, keys_of(part)

    def _in_order(self, snap, new: np.ndarray, gone: np.ndarray):
        """Yield snap's live fingerprints with new added and gone taken out, in ascending
        order, in sorted pieces (all of them at once unless table 0 keeps the order)."""
        design = self.plan.tables[0]
        if not design.keeps_order:
            values = np.sort(np.concatenate([design.invert(v) for v in snap.table_values(0)]
                                            + [new]))
            yield values[~isin_sorted(values, gone)] if len(gone) else values
            return
        taken = 0   # new[:taken] are given out
        for values in snap.table_values(0, ORDER_SLICE_VALUES):
            upto = int(np.searchsorted(new, values[-1], side="right"))
            if upto > taken:
                values = np.sort(np.concatenate([values, new[taken:upto]]))
                taken = upto
            yield values[~isin_sorted(values, gone)] if len(gone) else values
        if taken < len(new):
            yield new[taken:]

    def _size_bound(self) -> int:
        """At least len(self), from the runs' entry counts and the log, O(runs):
        enough to size work split by value ranges (batch's tasks).  len()
        reads table 0 whole on a file of several runs, seconds at 30M."""
        snap, new, _ = self._pending_view()
        return sum(r.entries for r in snap.table_runs[0] if r.chunks) + len(snap.log.adds) + \
            len(new)

    def iter_chunks(self, chunk_size: int = 1 << 20, *, part: int = 0, parts: int = 1):
        """Yield the live fingerprints as sorted uint64 arrays of about chunk_size each.

        Each array is sorted and the arrays together hold every live
        fingerprint exactly once (not ordered among themselves).  One
        snapshot serves the whole iteration.

        part/parts yield only share `part` of `parts`, so that processes can
        split one index: the fingerprints f with part / parts <= f / 2^64 <
        (part + 1) / parts.  The shares are ranges of values, not of the
        file's layout, so shares read in different snapshots (other
        processes, other times) still hold each fingerprint that stayed
        stored throughout exactly once while another process writes and
        compacts; what changed meanwhile may be in or out.  Shares of
        slices of the runs, as they were, duplicated and missed stored
        fingerprints once a compaction came between two of them.
        Bad arguments raise ValueError at the call.
        """
        chunk_size = validate.positive_int(chunk_size, "chunk_size")
        parts = validate.positive_int(parts, "parts")
        if not isinstance(part, (int, np.integer)) or isinstance(part, bool) or \
                not 0 <= part < parts:
            raise ValueError(f"need 0 <= part < parts, got part={part!r}, parts={parts}")
        return self._chunks(chunk_size, *share_bounds(int(part), parts))

    def _chunks(self, chunk_size: int, lo: int, hi: int):
        snap, new, gone = self._pending_view()
        design = self.plan.tables[0]
        if design.keeps_order:
            pieces = snap.table_values(0, chunk_size, lo, hi)
        else:  # no plan the planner makes: the whole table, each piece sorted and cut
            pieces = (v[(v >= lo) & (v <= hi)]
                      for v in (np.sort(design.invert(v)) for v in snap.table_values(0, chunk_size)))
        for values in pieces:
            values = values[~np.isin(values, gone)] if len(gone) else values
            if len(values):
                yield values
        new = new[(new >= lo) & (new <= hi)]
        if len(new):
            yield new


def share_bounds(part: int, parts: int) -> tuple[int, int]:
    """The fingerprints [lo, hi] of share part of parts: equal ranges of the 2^64 values."""
    def start(p):
        return -(-(p << 64) // parts)
    return start(part), start(part + 1) - 1
