"""Broder's min-wise sketches: MinHash, Jaccard estimates, super-shingles
and LSH banding.

The hash family ([FP40]-[FP42]): p functions
h_i(x) = ((a_i * fold(x) + b_i) mod 2^64) >> 32 with fold(x) = (x xor
(x >> 32)) mod 2^32 applied to the 64-bit feature hash x; a_i (odd) and b_i
come from SplitMix64 seeded with the family's seed.  This is Dietzfelbinger's
multiply-add-shift scheme, strongly universal on 32-bit keys; the sketch is
(min_x h_i(x)) for i < p, stored as uint32.  Two sketches agree in position i
with probability ~ J(A, B), so the agreement rate estimates Jaccard
similarity with standard error sqrt(J(1-J)/p).
"""

from __future__ import annotations

import numpy as np

from ndindex import _core
from ndindex.arrays import sorted_unique
from ndindex.fingerprint.hashing import _check_seed, hash_rows

#: Sketch length by default; the IIR text uses 200.
DEFAULT_NUM_PERM = 128
#: Sketch value of a document with no features.
EMPTY_VALUE = 0xFFFFFFFF

_M = (1 << 64) - 1
#: numpy 2 names it trapezoid (trapz, deprecated there, warned 2,580 times in
#: the tests on numpy 2.2); numpy 1 has only trapz.
_trapezoid = getattr(np, "trapezoid", None) or np.trapz


def splitmix64(seed: int, count: int) -> list[int]:
    """Return the first ``count`` outputs of SplitMix64 from state ``seed``."""
    out, state = [], seed & _M
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & _M
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
        out.append(z ^ (z >> 31))
    return out


class MinHashFamily:
    """p min-wise hash functions (a_i, b_i), i < p, from SplitMix64(seed).

    a_i = s_{2i} | 1 and b_i = s_{2i+1}, where s_0, s_1, ... is the output of
    SplitMix64 with initial state ``seed``.
    """

    def __init__(self, num_perm: int = DEFAULT_NUM_PERM, seed: int = 1):
        if not isinstance(num_perm, int) or isinstance(num_perm, bool):
            raise TypeError(f"num_perm must be int, got {type(num_perm).__name__}")
        if not 1 <= num_perm <= 4096:
            raise ValueError(f"num_perm must be in 1..4096, got {num_perm}")
        self.num_perm = num_perm
        self.seed = _check_seed(seed)
        s = splitmix64(seed, 2 * num_perm)
        self.a = np.array([v | 1 for v in s[0::2]], dtype=np.uint64)
        self.b = np.array(s[1::2], dtype=np.uint64)

    def empty(self) -> np.ndarray:
        """Return the sketch of the empty set (all EMPTY_VALUE)."""
        return np.full(self.num_perm, EMPTY_VALUE, dtype=np.uint32)

    def update(self, sketch: np.ndarray, features) -> None:
        """Lower ``sketch`` in place by more features (uint64 hashes)."""
        f = np.ascontiguousarray(features, dtype=np.uint64)
        if sketch.dtype != np.uint32 or sketch.shape != (self.num_perm,) \
                or not sketch.flags.c_contiguous:
            raise ValueError(f"sketch must be a contiguous uint32 array of shape "
                             f"({self.num_perm},), got {sketch.dtype} {sketch.shape}")
        if len(f):
            _core.minhash_update(f, self.a, self.b, sketch)

    def sketch(self, features) -> np.ndarray:
        """Return the MinHash sketch (uint32, num_perm values) of a feature set.

        Repeated features change nothing.  No features give all EMPTY_VALUE.
        Cost: O(n * num_perm) multiply-adds in C.
        """
        out = self.empty()
        self.update(out, features)
        return out


def jaccard_estimate(a: np.ndarray, b: np.ndarray) -> float:
    """Return the fraction of positions where two sketches agree.

    Raises:
        ValueError: the sketches differ in length.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"sketches must have one shape, got {a.shape} and {b.shape}")
    return float(np.count_nonzero(a == b)) / a.size if a.size else 1.0


def jaccard_estimates(sketches: np.ndarray, left, right) -> np.ndarray:
    """Return the Jaccard estimates of pairs (left[i], right[i]) of rows."""
    s = np.asarray(sketches)
    left, right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
    out = np.empty(len(left), dtype=np.float64)
    for start in range(0, len(left), 65536):  # bound the temporary
        sl = slice(start, start + 65536)
        out[sl] = (s[left[sl]] == s[right[sl]]).mean(axis=1)
    return out


def super_shingles(sketch: np.ndarray, size: int = 4, seed: int = 0) -> np.ndarray:
    """Return Broder's super-shingles: hashes of windows of the sorted sketch.

    The sketch values are sorted and every window of ``size`` consecutive
    values hashed (XXH64 of their little-endian uint32 bytes).  Documents
    sharing a super-shingle are candidates; a single shared value means
    ``size`` shared sketch values.
    """
    s = np.sort(np.asarray(sketch, dtype=np.uint32))
    if not 1 <= size <= len(s):
        raise ValueError(f"size must be in 1..{len(s)}, got {size}")
    windows = np.lib.stride_tricks.sliding_window_view(s, size)
    return sorted_unique(hash_rows(windows, seed))


def optimal_bands(threshold: float, num_perm: int, fp_weight: float = 0.5,
                  fn_weight: float = 0.5) -> tuple[int, int]:
    """Return (bands, rows) with bands*rows <= num_perm minimising the weighted
    false-positive and false-negative areas of the S-curve 1-(1-s^r)^b around
    ``threshold`` (the rule datasketch's MinHashLSH uses)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    s_lo = np.linspace(0.0, threshold, 201)
    s_hi = np.linspace(threshold, 1.0, 201)
    best, best_cost = (1, num_perm), np.inf
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp = _trapezoid(1 - (1 - s_lo ** r) ** b, s_lo)
            fn = _trapezoid((1 - s_hi ** r) ** b, s_hi)
            cost = fp_weight * fp + fn_weight * fn
            if cost < best_cost:
                best, best_cost = (b, r), cost
    return best


def lsh_band_keys(sketches: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Return an (n, bands) uint64 array: band j's key is XXH64, seeded j, of
    the little-endian bytes of sketch values [j*rows, (j+1)*rows)."""
    s = np.asarray(sketches, dtype=np.uint32)
    if s.ndim != 2 or bands * rows > s.shape[1] or bands < 1 or rows < 1:
        raise ValueError(f"need bands*rows <= sketch length {s.shape[-1]}, got {bands}x{rows}")
    return np.stack([hash_rows(s[:, j * rows:(j + 1) * rows], seed=j) for j in range(bands)],
                    axis=1) if len(s) else np.empty((0, bands), np.uint64)


def bucket_pairs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return all pairs (i < j) of rows sharing a key in any column, deduplicated.

    Cost: O(n log n + pairs); a key shared by m rows yields m(m-1)/2 pairs.
    """
    keys = np.asarray(keys, dtype=np.uint64)
    if keys.ndim == 1:
        keys = keys[:, None]
    n = len(keys)
    found = []
    for col in range(keys.shape[1]):
        order = np.argsort(keys[:, col], kind="stable")
        k = keys[order, col]
        if n < 2:
            continue
        starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        lengths = np.diff(np.r_[starts, n])
        group_len = np.repeat(lengths, lengths)
        offset = np.arange(n) - np.repeat(starts, lengths)
        partners = group_len - 1 - offset  # later members of the same group
        total = int(partners.sum())
        if total == 0:
            continue
        pos = np.arange(n)
        left_pos = np.repeat(pos, partners)
        block_start = np.repeat(np.cumsum(partners) - partners, partners)
        right_pos = left_pos + 1 + (np.arange(total) - block_start)
        a, b = order[left_pos], order[right_pos]
        found.append(np.minimum(a, b).astype(np.uint64) * np.uint64(n)
                     + np.maximum(a, b).astype(np.uint64))
    if not found:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    codes = sorted_unique(np.concatenate(found))
    return (codes // np.uint64(n)).astype(np.int64), (codes % np.uint64(n)).astype(np.int64)


def lsh_candidate_pairs(sketches: np.ndarray, threshold: float = 0.8,
                        bands: int | None = None, rows: int | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Return candidate pairs (left, right), left < right, by LSH banding.

    Bands and rows default to :func:`optimal_bands` for the threshold.
    """
    s = np.asarray(sketches)
    if bands is None or rows is None:
        bands, rows = optimal_bands(threshold, s.shape[1])
    return bucket_pairs(lsh_band_keys(s, bands, rows))


#: Values kept by a bottom-k sketch by default: a text of up to this many
#: distinct shingles (about as many words) is kept whole, so its Jaccard
#: similarity is exact.  256 was enough for paragraphs but left long files at
#: precision 0.91 (docs/fingerprints.md); 1024 costs at most 4 KiB a document.
DEFAULT_BOTTOM_K = 1024


def bottom_k(features, k: int = DEFAULT_BOTTOM_K) -> np.ndarray:
    """Return Broder's bottom-k sketch: the k smallest distinct values of
    ``x >> 32`` over the features x, sorted ascending (uint32) ([FP44]).

    One hash function instead of p: the features are already XXH64 values,
    uniform over 64 bits, so their top 32 bits are a random order.  A set of
    at most k distinct values is kept whole, which makes the Jaccard of two
    short documents exact rather than estimated.
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    top = (np.asarray(features, dtype=np.uint64) >> np.uint64(32)).astype(np.uint32)
    if len(top) > 4 * k:
        top = np.partition(top, 4 * k)[:4 * k] if len(top) > 4 * k else top
        # distinct values among the 4k smallest: enough unless repeats dominate
        u = sorted_unique(top)
        if len(u) >= k:
            return u[:k]
        top = (np.asarray(features, dtype=np.uint64) >> np.uint64(32)).astype(np.uint32)
    return sorted_unique(top)[:k]


def bottom_k_more(sketch: np.ndarray, features, k: int = DEFAULT_BOTTOM_K) -> np.ndarray:
    """Return the bottom-k sketch of a set given in pieces, the pieces so far
    (sketch) and features, one more: the k smallest of the pieces' k
    smallest are the whole set's."""
    more = bottom_k(features, k)
    return sorted_unique(np.concatenate([sketch, more]))[:k] if len(sketch) else more


def bottom_k_jaccard(a: np.ndarray, b: np.ndarray, k: int = DEFAULT_BOTTOM_K) -> float:
    """Return the Jaccard estimate of two bottom-k sketches: among the k
    smallest values of their union, the fraction present in both.  Exact when
    both sketches hold fewer than k values (whole sets)."""
    union = np.union1d(a, b)[:k]
    if len(union) == 0:
        return 1.0
    both = np.isin(union, a, assume_unique=True) & np.isin(union, b, assume_unique=True)
    return float(np.count_nonzero(both)) / len(union)
