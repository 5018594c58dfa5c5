"""Union-find clusters of near-duplicate pairs.

Shared by the fingerprint evaluation, the dedup job and the batch self-join:
pairs (left[i], right[i]) of item indices in [0, n) become connected
components.  :func:`component_labels` does it array-at-a-time (hooking every
root to the smallest root it is paired with, then pointer jumping until each
item points at its root), so millions of pairs cost a few numpy passes, not a
Python loop per pair.  :class:`UnionFind` is the incremental form.
"""

from __future__ import annotations

import numpy as np


def _check_pairs(n: int, left, right) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    left = np.asarray(left, dtype=np.int64).ravel()
    right = np.asarray(right, dtype=np.int64).ravel()
    if left.shape != right.shape:
        raise ValueError(f"left and right must have one length, got {len(left)} and {len(right)}")
    if len(left) and (min(left.min(), right.min()) < 0 or max(left.max(), right.max()) >= n):
        raise ValueError(f"pair indices must be in [0, {n})")
    return left, right


def _link(parent: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Merge the pairs into a parent array whose entries are already roots."""
    while True:
        ru, rv = parent[left], parent[right]
        differ = ru != rv
        if not differ.any():
            return parent
        lo, hi = np.minimum(ru[differ], rv[differ]), np.maximum(ru[differ], rv[differ])
        # roots only ever point at smaller roots, so no cycle can form
        np.minimum.at(parent, hi, lo)
        while True:
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand


def component_labels(n: int, left, right) -> np.ndarray:
    """Return labels (int64, length n): each item's smallest cluster member.

    Raises:
        ValueError: lengths differ or an index is outside [0, n).

    Cost: O((n + pairs) * rounds); rounds grow like log n on real graphs.
    """
    left, right = _check_pairs(n, left, right)
    return _link(np.arange(n, dtype=np.int64), left, right)


def clusters_from_pairs(n: int, left, right, min_size: int = 2) -> list[np.ndarray]:
    """Return the clusters (sorted int64 index arrays) of at least ``min_size``
    items, ordered by their smallest member."""
    labels = component_labels(n, left, right)
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    starts = np.flatnonzero(np.r_[True, sorted_labels[1:] != sorted_labels[:-1]]) if n else []
    bounds = np.r_[starts, n]
    return [order[bounds[i]:bounds[i + 1]] for i in range(len(starts))
            if bounds[i + 1] - bounds[i] >= min_size]


class UnionFind:
    """Incremental union-find over items 0..n-1 (path halving, union by index).

    The root of a set is always its smallest member, so labels agree with
    :func:`component_labels`.
    """

    def __init__(self, n: int = 0):
        self.parent = np.arange(n, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.parent)

    def grow(self, n: int) -> None:
        """Make room for items up to n-1 (new items are singletons)."""
        if n > len(self.parent):
            self.parent = np.concatenate([self.parent, np.arange(len(self.parent), n)])

    def find(self, x: int) -> int:
        """Return the root (smallest member) of x's set."""
        p = self.parent
        while p[x] != x:
            p[x] = p[p[x]]
            x = int(p[x])
        return int(x)

    def union(self, a: int, b: int) -> int:
        """Merge the sets of a and b; return the new root."""
        ra, rb = self.find(a), self.find(b)
        lo, hi = min(ra, rb), max(ra, rb)
        self.parent[hi] = lo
        return lo

    def union_many(self, left, right) -> None:
        """Merge many pairs at once (array form of :meth:`union`)."""
        left, right = _check_pairs(len(self.parent), left, right)
        self.parent = _link(self.labels(), left, right)

    def labels(self) -> np.ndarray:
        """Return every item's root (compresses all paths)."""
        p = self.parent
        while True:
            grand = p[p]
            if np.array_equal(grand, p):
                break
            p = grand
        self.parent = p
        return p.copy()

    def check(self) -> None:
        """Assert the invariants: parents in range and never above their item."""
        p = self.parent
        assert np.all(p >= 0) and np.all(p < max(len(p), 1)), "parent out of range"
        assert np.all(p <= np.arange(len(p))), "a parent is larger than its item"
