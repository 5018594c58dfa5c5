"""Operations not yet in the runs: the append log's net effect, and a writer's pending ones.

Both reduce a sequence of add/remove/key operations to its net effect: a
fingerprint's last operation decides whether it is added or removed, a
(fingerprint, key) pair's last operation whether the key is put or
deleted.  ``LogOverlay`` holds the committed log (arrays, rebuilt or extended
as records arrive); ``PendingOps`` holds what one writer has not committed
yet (a transaction, or durability="normal"), changed one operation at a
time, so its additions live in a growable buffer the query kernel scans.
"""

from __future__ import annotations

import numpy as np

from ndindex.arrays import EMPTY_U64, insert_sorted, isin_sorted
from ndindex.records import LogRecord


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Union of two sorted distinct arrays: b's new values inserted into a (O(len a) memmove)."""
    if not len(b):
        return a
    if not len(a):
        return b
    return insert_sorted(a, b[~isin_sorted(b, a)])


def _minus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if not len(a) or not len(b):
        return a
    return a[~isin_sorted(a, b)]


class LogOverlay:
    """The net effect of the log records of a snapshot, in order.

    adds and removes are sorted, distinct and disjoint; keys maps
    (fingerprint, typed key) to True (put) or False (deleted).
    """

    def __init__(self):
        self.adds = EMPTY_U64
        self.removes = EMPTY_U64
        self.keys: dict = {}
        self.records = 0

    def copy(self) -> "LogOverlay":
        out = LogOverlay()
        out.adds, out.removes, out.keys, out.records = self.adds, self.removes, dict(self.keys), \
            self.records
        return out

    def apply(self, record: LogRecord) -> None:
        """Apply one record after everything applied so far."""
        self.adds = _union(_minus(self.adds, record.removes), record.adds)
        self.removes = _union(_minus(self.removes, record.adds), record.removes)
        for pair in record.key_puts:
            self.keys[pair] = True
        for pair in record.key_deletes:
            self.keys[pair] = False
        self.records += 1

    def ops(self) -> int:
        return len(self.adds) + len(self.removes) + len(self.keys)


class PendingOps:
    """One writer's uncommitted operations, in order, reduced to their net effect."""

    def __init__(self):
        self._buf = np.empty(64, dtype=np.uint64)
        self._n = 0
        self._where: dict = {}      # fingerprint -> index in _buf
        self._removes: set = set()
        self._removes_sorted = EMPTY_U64
        self._removes_dirty = False
        self.keys: dict = {}        # (fp, typed key) -> True put / False delete

    def __len__(self) -> int:
        return self._n + len(self._removes) + len(self.keys)

    def add(self, fps) -> None:
        """Add fingerprints (an iterable of ints)."""
        for fp in fps:
            fp = int(fp)
            if fp in self._removes:
                self._removes.discard(fp)
                self._removes_dirty = True
            if fp not in self._where:
                if self._n == len(self._buf):
                    self._buf = np.concatenate([self._buf, np.empty(len(self._buf), np.uint64)])
                self._buf[self._n] = fp
                self._where[fp] = self._n
                self._n += 1

    def add_array(self, fps: np.ndarray) -> None:
        """Add sorted distinct fingerprints in bulk."""
        if not len(fps):
            return
        if self._removes:
            hit = [int(v) for v in fps if int(v) in self._removes]
            if hit:
                self._removes.difference_update(hit)
                self._removes_dirty = True
        fresh = fps if not self._where else np.array(
            [v for v in fps.tolist() if v not in self._where], dtype=np.uint64)
        need = self._n + len(fresh)
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf)), np.uint64)
            grown[:self._n] = self._buf[:self._n]
            self._buf = grown
        self._buf[self._n:need] = fresh
        self._where.update(zip(fresh.tolist(), range(self._n, need)))
        self._n = need

    def remove(self, fps) -> None:
        """Remove fingerprints (an iterable of ints)."""
        for fp in fps:
            fp = int(fp)
            i = self._where.pop(fp, None)
            if i is not None:
                last = self._n - 1
                if i != last:
                    moved = int(self._buf[last])
                    self._buf[i] = moved
                    self._where[moved] = i
                self._n = last
            if fp not in self._removes:
                self._removes.add(fp)
                self._removes_dirty = True

    def put_key(self, fp: int, raw: bytes) -> None:
        self.keys[(fp, raw)] = True

    def delete_key(self, fp: int, raw: bytes) -> None:
        self.keys[(fp, raw)] = False

    def adds(self) -> np.ndarray:
        """The pending additions (unsorted view; valid until the next change)."""
        return self._buf[:self._n]

    def removes(self) -> np.ndarray:
        """The pending removals, sorted."""
        if self._removes_dirty:
            self._removes_sorted = np.array(sorted(self._removes), dtype=np.uint64)
            self._removes_dirty = False
        return self._removes_sorted

    def is_added(self, fp: int) -> bool:
        return fp in self._where

    def is_removed(self, fp: int) -> bool:
        return fp in self._removes

    def to_record(self) -> LogRecord:
        """The net effect as one log record (disjoint sorted arrays and key lists)."""
        puts = sorted(p for p, v in self.keys.items() if v)
        deletes = sorted(p for p, v in self.keys.items() if not v)
        return LogRecord(np.sort(self.adds()), self.removes().copy(), puts, deletes)

    def clear(self) -> None:
        self.__init__()
