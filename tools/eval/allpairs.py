"""Exact all-pairs set similarity join with prefix filtering (ground truth).

Bayardo, Ma and Srikant's AllPairs (WWW 2007) with the length filter of
PPJoin: tokens are ranked rarest first; a set x of size s keeps its prefix
of s - ceil(t * s) + 1 rarest tokens, and two sets with Jaccard >= t must
share a prefix token (otherwise their overlap is below t * |union|).
Candidates are the pairs sharing a prefix token whose sizes are within the
ratio t; their exact intersections come from sparse row products.  Nothing
is sampled: every pair with Jaccard >= t is found, and each is checked
exactly.  Independent of ndindex's own sketches and kernels.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

#: Candidate pairs whose intersections are computed per sparse product.
CHUNK_PAIRS = 200_000


def _ranges(lengths: np.ndarray) -> np.ndarray:
    total = int(lengths.sum())
    if not total:
        return np.empty(0, np.int64)
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def similar_pairs(sets: list[np.ndarray], threshold: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (left, right, jaccard) of every pair i < j of sets (arrays of
    distinct hashable integers) with exact Jaccard >= threshold, sorted.

    Empty sets are skipped (they have no Jaccard with anything but each
    other).  Cost: O(total size * log) to rank, then the candidates.
    """
    n = len(sets)
    sizes = np.array([len(s) for s in sets], dtype=np.int64)
    if not n or not sizes.sum():
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
    tokens, ids = np.unique(np.concatenate(sets), return_inverse=True)
    df = np.bincount(ids)
    rank_of = np.empty(len(tokens), np.int64)
    rank_of[np.lexsort((np.arange(len(tokens)), df))] = np.arange(len(tokens))
    doc = np.repeat(np.arange(n), sizes)
    ranks = rank_of[ids]
    order = np.lexsort((ranks, doc))            # each set's tokens, rarest first
    doc, ranks = doc[order], ranks[order]
    pos = _ranges(sizes)
    prefix = sizes - np.ceil(threshold * sizes - 1e-9).astype(np.int64) + 1
    keep = pos < np.repeat(prefix, sizes)
    pdoc, prank = doc[keep], ranks[keep]
    order = np.lexsort((pdoc, prank))
    pdoc, prank = pdoc[order], prank[order]
    starts = np.flatnonzero(np.r_[True, prank[1:] != prank[:-1]])
    lengths = np.diff(np.r_[starts, len(prank)])
    member = np.repeat(starts, lengths) + _ranges(lengths)
    later = np.repeat(lengths, lengths) - _ranges(lengths) - 1
    left_pos = np.repeat(member, later)
    right_pos = left_pos + 1 + _ranges(later)
    a, b = pdoc[left_pos], pdoc[right_pos]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    small, big = np.minimum(sizes[lo], sizes[hi]), np.maximum(sizes[lo], sizes[hi])
    ok = (lo != hi) & (small >= threshold * big - 1e-9)
    codes = np.unique(lo[ok] * n + hi[ok])
    lo, hi = codes // n, codes % n
    matrix = sparse.csr_matrix((np.ones(len(ids), np.int32), (np.repeat(np.arange(n), sizes), ids)),
                               shape=(n, len(tokens)))
    inter = np.empty(len(lo), np.int64)
    for start in range(0, len(lo), CHUNK_PAIRS):
        part = slice(start, start + CHUNK_PAIRS)
        inter[part] = np.asarray(matrix[lo[part]].multiply(matrix[hi[part]]).sum(axis=1)).ravel()
    jac = inter / (sizes[lo] + sizes[hi] - inter)
    ok = jac >= threshold
    return lo[ok], hi[ok], jac[ok]


def brute_force_pairs(sets: list[np.ndarray], threshold: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same answer by sparse products over all pairs (a check for small n)."""
    n = len(sets)
    sizes = np.array([len(s) for s in sets], dtype=np.int64)
    tokens, ids = np.unique(np.concatenate(sets), return_inverse=True)
    m = sparse.csr_matrix((np.ones(len(ids), np.int32), (np.repeat(np.arange(n), sizes), ids)),
                          shape=(n, len(tokens)))
    prod = sparse.triu(m @ m.T, k=1).tocoo()
    jac = prod.data / (sizes[prod.row] + sizes[prod.col] - prod.data)
    ok = jac >= threshold
    order = np.lexsort((prod.col[ok], prod.row[ok]))
    return (prod.row[ok][order].astype(np.int64), prod.col[ok][order].astype(np.int64),
            jac[ok][order])
