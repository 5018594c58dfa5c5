"""Which fingerprints of a batch a run of check_and_add calls would add, in order.

``Index.check_and_add_many`` asks the batch's queries of the index at once
(``query_many``), which says which fingerprints have a stored match.  What
is left is the batch itself: a fingerprint is added only when no
fingerprint added before it in the batch is within k either, so the
outcome of one depends on those before it.  :func:`in_order` settles it
with one self-join of the batch (:class:`ndindex.batch.QueryTables`) and a
pass in batch order over the few fingerprints that have a partner in the
batch (a near one, or an equal one); every other fingerprint is added
exactly when it has no stored match.
"""

from __future__ import annotations

import numpy as np

from ndindex.arrays import isin_sorted


def in_order(fps: np.ndarray, hit: np.ndarray, k: int, match_dtype) -> tuple:
    """(added, within): what check_and_add(fps[0]), check_and_add(fps[1]), ... would do.

    fps: the batch, a uint64 array in call order; hit: a bool array, True
    where the fingerprint has a stored match within k.  Returns added, a
    bool array (True: the call adds it), and within, a match_dtype array
    of the matches among the batch: (query i, a fingerprint added before
    i, their distance) for every i that one is within k of, whether or not
    i also has stored matches (a call sees what the calls before it added).
    """
    from ndindex.batch import QueryTables  # here: most indexes never batch their adds
    added = ~hit
    values, counts = np.unique(fps, return_counts=True)
    neighbours: dict = {}
    if k > 0 and len(values) > 1:
        pairs = QueryTables(values, k).probe(values, self_join=True)
        for q, f, d in zip(pairs["q"].tolist(), pairs["f"].tolist(), pairs["distance"].tolist()):
            neighbours.setdefault(q, []).append((f, d))
            neighbours.setdefault(f, []).append((q, d))
    partnered = np.union1d(values[counts > 1], np.fromiter(neighbours, np.uint64, len(neighbours)))
    at = np.flatnonzero(isin_sorted(fps, partnered))
    taken: set = set()  # values with a partner that a call has added so far
    rows = []
    for i, v in zip(at.tolist(), fps[at].tolist()):
        near = [(v, 0)] if v in taken else []
        near += [(u, d) for u, d in neighbours.get(v, ()) if u in taken]
        if near:
            added[i] = False
            rows += [(i, u, d) for u, d in near]
        elif added[i]:
            taken.add(v)
    return added, np.array(rows, dtype=match_dtype)


def all_matches(stored: np.ndarray, within: np.ndarray) -> np.ndarray:
    """Both kinds of matches as query_many gives them: grouped by query, then
    by (distance, fingerprint)."""
    out = np.concatenate([stored, within])
    return out[np.lexsort((out["fingerprint"], out["distance"], out["query"]))]
