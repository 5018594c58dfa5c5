"""The Volatility Ordered Set Heap (Sood and Loguinov, CIKM 2011, §4).

A query's simhash comes with flip probabilities p_j: the chance that bit j
differs in a near-duplicate.  A flip set S (the bits in which a stored
near-duplicate differs from the query) has probability

    p(u, S) = prod_{i in S} p_i  *  prod_{j not in S} (1 - p_j),

and probabilistic matching probes flip sets in decreasing p(u, S), so that
few probes find most near-duplicates.  VOSH generates the sets of one size h
lazily, without enumerating all C(f, h):

* the bits are sorted by volatility, most volatile first; a set is the
  increasing tuple of its ranks s_1 < ... < s_h in that order;
* the root of size h is (0, 1, ..., h - 1), the most probable set;
* a set's *left child* increments its last element; its *right child*
  increments element j, the one just before the run of consecutive
  elements that ends the set, when the gap from s_j to s_{j+1} is exactly 2
  (their Algorithm 2, ProduceChildren).  Every other set of size h has
  exactly one parent (undo the increment that made it: the first element of
  the final run if that run is longer than one, else the last element), so
  the children relation is a tree over all C(f, h) sets;
* a child replaces one bit by a less volatile one, so it is never more
  probable than its parent (Lemma 1), and a max-heap seeded with the root
  pops every set once, in non-increasing p(u, S).

Seeding one heap with the roots of several sizes merges their orders: a
k-query probes the sets of sizes 0..k in one non-increasing sequence.

Keys.  p(u, S) = prod_j (1 - p_j) * prod_{i in S} odds_i with odds = p / (1 - p);
the first factor is common to all sets, so the heap is keyed on
sum_{i in S} logit(p_i), summed in increasing rank order.  Summing in that
fixed order makes Lemma 1 hold exactly in floating point (a child's sum
differs from its parent's in one smaller term, and rounding is monotone),
and makes the C kernel (``_core.vosh_masks``) produce the very same
sequence as this module, which is its reference and test oracle.  Ties
are broken by the smaller size, then the lexicographically smaller rank
tuple; equal probabilities are sorted by bit position.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Iterator, Sequence

import numpy as np

from ndindex import _core

__all__ = ["P_MIN", "P_MAX", "log_odds", "volatility_order", "produce_children", "flip_sets",
           "flip_sets_upto", "flip_masks", "set_probability"]

#: Probabilities are clamped to [P_MIN, P_MAX] so that every log-odds is
#: finite (a sum of +inf and -inf would be NaN and break the order).
P_MIN = 1e-300
P_MAX = 1.0 - 2.0 ** -53


def log_odds(probabilities) -> np.ndarray:
    """Return log(p / (1 - p)) of each probability, clamped to [P_MIN, P_MAX].

    Computed with the C library's log and log1p (through ``math``), as the
    kernel computes them, so both sort the bits the same way.

    Raises:
        ValueError: not a 1-D array of at most 64 values in [0, 1].
    """
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 1 or len(p) > 64:
        raise ValueError(f"probabilities must be a 1-D array of at most 64 values, got shape "
                         f"{p.shape}")
    if not np.all((p >= 0.0) & (p <= 1.0)):  # also rejects NaN
        raise ValueError("probabilities must lie in [0, 1]")
    out = np.empty(len(p))
    for i, x in enumerate(np.clip(p, P_MIN, P_MAX).tolist()):
        out[i] = math.log(x) - math.log1p(-x)
    return out


def volatility_order(probabilities) -> np.ndarray:
    """Return the bit indices sorted by volatility: largest p first, ties by index."""
    return np.argsort(-log_odds(probabilities), kind="stable")


def produce_children(ranks: tuple[int, ...], n: int) -> list[tuple[int, ...]]:
    """Return the children of a set of ranks among n bits (Algorithm 2).

    ranks: strictly increasing ranks in volatility order, each in 0..n-1.
    Returns the left child (last element + 1), if it stays below n, then
    the right child (the element before the final run of consecutive
    elements + 1, when its gap to the run is 2), if any.
    """
    h = len(ranks)
    children = []
    if h == 0:
        return children
    if ranks[-1] + 1 < n:
        children.append(ranks[:-1] + (ranks[-1] + 1,))
    j = h - 2
    while j >= 0 and ranks[j + 1] - ranks[j] == 1:
        j -= 1
    if j >= 0 and ranks[j + 1] - ranks[j] == 2:
        children.append(ranks[:j] + (ranks[j] + 1,) + ranks[j + 1:])
    return children


def _key(logits: Sequence[float], ranks: tuple[int, ...]) -> float:
    # An explicit loop, not sum(): the order of the additions is part of the
    # contract with the C kernel (and sum() of floats compensates on 3.12+).
    total = 0.0
    for r in ranks:
        total += logits[r]
    return total


def _ordered_ranks(logits: Sequence[float], sizes: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Yield rank tuples of the given sizes in non-increasing key (logits sorted
    in non-increasing order)."""
    n = len(logits)
    heap = [(-_key(logits, root), len(root), root)
            for root in (tuple(range(h)) for h in sorted(set(sizes)) if h <= n)]
    heapq.heapify(heap)
    while heap:
        _, h, ranks = heapq.heappop(heap)
        yield ranks
        for child in produce_children(ranks, n):
            heapq.heappush(heap, (-_key(logits, child), h, child))


def _check_size(h, n: int, name: str) -> int:
    h = operator.index(h)
    if not 0 <= h <= n:
        raise ValueError(f"{name} must be in 0..{n}, got {h}")
    return h


def flip_sets(probabilities, h: int) -> Iterator[tuple[int, ...]]:
    """Yield every set of h bit indices, most probable first (the reference VOSH).

    Parameters:
        probabilities: p_j for each bit (1-D, at most 64 values in [0, 1]).
        h: the set size, 0..len(probabilities).

    Yields:
        Tuples of bit indices, sorted by volatility (most volatile first),
        in non-increasing p(u, S); each of the C(n, h) sets exactly once.

    Raises:
        ValueError: bad probabilities or h.

    Cost: O(log m) per set for the m-th set; memory O(m * h).  Pure Python,
    about a microsecond per heap operation: use :func:`flip_masks` (C) on
    hot paths.
    """
    logits = log_odds(probabilities)
    h = _check_size(h, len(logits), "h")
    order = volatility_order(probabilities)
    sorted_logits = logits[order].tolist()
    for ranks in _ordered_ranks(sorted_logits, (h,)):
        yield tuple(int(order[r]) for r in ranks)


def flip_sets_upto(probabilities, k: int) -> Iterator[tuple[int, ...]]:
    """Yield every set of at most k bit indices, most probable first.

    The heap is seeded with the roots of sizes 0..k, so sizes interleave in
    one non-increasing sequence (the empty set first only when every p_j is
    below 1/2).  Parameters and cost as :func:`flip_sets`.
    """
    logits = log_odds(probabilities)
    k = _check_size(k, len(logits), "k")
    order = volatility_order(probabilities)
    sorted_logits = logits[order].tolist()
    for ranks in _ordered_ranks(sorted_logits, range(k + 1)):
        yield tuple(int(order[r]) for r in ranks)


def set_probability(probabilities, bits) -> float:
    """Return p(u, S) = prod_{i in S} p_i * prod_{j not in S} (1 - p_j) (unclamped)."""
    p = np.asarray(probabilities, dtype=np.float64)
    inside = np.zeros(len(p), dtype=bool)
    inside[list(bits)] = True
    return float(np.prod(np.where(inside, p, 1.0 - p)))


def flip_masks(probabilities, k: int, *, positions=None, max_probes: int | None = None,
               exact: bool = False) -> np.ndarray:
    """Return the flip sets of at most k bits as uint64 masks, most probable first (C).

    Parameters:
        probabilities: 64 values, p_j for bit j (bit 0 least significant).
        k: the largest set size (0..64, at most the number of positions).
        positions: the bits that may flip (default all 64), e.g. the header
            bits of a table; the others never appear in a mask.
        max_probes: return at most this many masks (default all of them:
            sum of C(len(positions), h) over h <= k, which must stay below
            2**31).
        exact: only sets of exactly k bits (the paper's Figure 5 setting).

    Returns:
        uint64 array; mask i has bit b set when bit b is in the i-th set.
        The same sets in the same order as :func:`flip_sets_upto` (or
        :func:`flip_sets` when exact) over the chosen positions.

    Raises:
        ValueError: bad probabilities, positions, k or max_probes.

    Cost: O(m log m) for m masks, about 50 ns each; memory 24 bytes per
    set kept in the heap (at most m + k + 1).
    """
    p = np.asarray(probabilities, dtype=np.float64)
    if p.shape != (64,):
        raise ValueError(f"probabilities must have 64 values, got shape {p.shape}")
    pos = np.arange(64) if positions is None else np.asarray(positions)
    if pos.size == 0:
        pos = pos.astype(np.int64)  # np.asarray([]) is float64
    if pos.ndim != 1 or pos.dtype.kind not in "iu" or len(np.unique(pos)) != len(pos) \
            or (len(pos) and (pos.min() < 0 or pos.max() > 63)):
        raise ValueError("positions must be distinct bit positions in 0..63")
    pos = pos.astype(np.int64)
    log_odds(p[pos])  # validates
    k = _check_size(k, len(pos), "k")
    total = math.comb(len(pos), k) if exact else sum(math.comb(len(pos), h) for h in range(k + 1))
    if max_probes is None:
        if total >= 2 ** 31:
            raise ValueError(f"{total} flip sets of at most {k} of {len(pos)} bits: give "
                             "max_probes")
        max_probes = total
    max_probes = operator.index(max_probes)
    if max_probes < 0:
        raise ValueError(f"max_probes must be >= 0, got {max_probes}")
    out = np.empty(min(max_probes, total), dtype=np.uint64)
    n = _core.vosh_masks(np.ascontiguousarray(p[pos]), pos.astype(np.uint8), k, exact, out)
    return out[:n]
