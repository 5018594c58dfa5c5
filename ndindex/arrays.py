"""Set operations on sorted uint64 arrays, the currency of tables and logs.

numpy's set routines sort (or, since numpy 2.3, hash) their inputs on every
call; these take arrays that are already sorted and distinct and cost
O(n log m) searches plus one O(n) pass.  ``sorted_unique`` exists because
``np.unique`` on uint64 takes a hashing path that is several times slower
than sorting and comparing neighbours.
"""

from __future__ import annotations

import numpy as np

from ndindex import _core

EMPTY_U64 = np.empty(0, dtype=np.uint64)
#: insert_sorted moves base with np.insert when it is this many times longer
#: than the new values, else sorts both with numpy's stable sort (timsort:
#: it finds the two sorted runs and merges them in one pass; np.insert's
#: set-up costs more): a log's 1,000 new values into 4,096 took 23.7 us inserted,
#: 4.9 sorted; into 65,536, 100 and 52; into 2^20, 595 and 732
#: (python -m timeit, numpy 2).
INSERT_RATIO = 256


def copy_holding_gil(a: np.ndarray) -> np.ndarray:
    """A writable copy of a contiguous array, made without letting go of the GIL.

    NumPy lets go of the GIL to copy more than a few hundred values.  A
    thread that lets go of it and takes it back at once, over and over,
    keeps the other threads of the process waiting: they see it change
    hands, so they do not ask for it, and never get it (CPython's convoy
    effect).  A loop of one-item transactions, each copying the pending set
    this way, kept the checkpoint thread from running for 0.7 s at a time,
    and every other thread of the program waited 0.4 s (median) where it
    waits 5 ms.  A bytearray's copy is one memcpy under the GIL.
    """
    return np.frombuffer(bytearray(memoryview(a)), dtype=a.dtype)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """Return the distinct values, sorted, in the input's dtype.  Cost: one sort."""
    s = np.sort(np.asarray(values))
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def isin_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Return a mask of the values present in a sorted array."""
    if not len(sorted_set) or not len(values):
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[pos] == values


def insert_sorted(base: np.ndarray, new_sorted: np.ndarray) -> np.ndarray:
    """Merge sorted new values (absent from base) into a sorted array."""
    if not len(new_sorted):
        return base
    if not len(base):
        return new_sorted
    if len(base) > INSERT_RATIO * len(new_sorted):
        return np.insert(base, np.searchsorted(base, new_sorted), new_sorted)
    out = np.concatenate([base, new_sorted])
    out.sort(kind="stable")
    return out


#: A two-level sorted set (older, recent) keeps its newest values in recent
#: until they outgrow this fraction of older (or RECENT_MIN): an addition
#: then costs O(its values + recent), amortised, not a merge into older.
#: The log's additions are held so (overlay.LogOverlay, and per table in
#: reader.Snapshot.log_tables): a snapshot per commit extends its
#: predecessor's log.
RECENT_FRACTION = 0.125
RECENT_MIN = 4096


def add_recent(older: np.ndarray, recent: np.ndarray, new: np.ndarray) -> tuple:
    """(older, recent) with sorted new values (in neither) added to recent,
    folded into older once it outgrows its share."""
    recent = insert_sorted(recent, new)
    if len(recent) > max(RECENT_MIN, RECENT_FRACTION * len(older)):
        return insert_sorted(older, recent), EMPTY_U64
    return older, recent


def merge_unique(parts: list, hidden: np.ndarray = EMPTY_U64) -> np.ndarray:
    """Sorted distinct union of sorted distinct arrays, minus the sorted array
    hidden: one k-way merge in C (at most 64 parts), O(total), where
    concatenating and sorting costs O(total log total) and a search of
    hidden per value O(total log hidden)."""
    parts = [np.ascontiguousarray(p, dtype=np.uint64) for p in parts if len(p)]
    if not parts:
        return EMPTY_U64
    if len(parts) == 1 and not len(hidden):
        return parts[0]
    out = np.empty(sum(len(p) for p in parts), dtype=np.uint64)
    n = _core.merge_unique(parts, np.ascontiguousarray(hidden, dtype=np.uint64), out)
    return out[:n]
