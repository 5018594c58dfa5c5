"""Charikar's simhash over weighted 64-bit features.

Each feature adds its weight to V_j when bit j of its hash is 1 and
subtracts it when 0; bit j of the fingerprint is 1 exactly when V_j > 0
([FP30]-[FP32]).  Weights are rounded to fixed point (multiples of
2^-WEIGHT_SHIFT) and summed as integers in the C kernel, so a fingerprint does
not depend on feature order, platform or floating-point mode.  |V_j| is the
margin of bit j: Sood and Loguinov's probabilistic matching treats small
|V_j| as volatile bits.
"""

from __future__ import annotations

import numpy as np

from ndindex import _core

#: Weights are multiples of 2**-WEIGHT_SHIFT (FP_WEIGHT_SHIFT in the kernel).
WEIGHT_SHIFT = 12
_SCALE = float(1 << WEIGHT_SHIFT)
#: Largest weight accepted, so that sums of 2**31 features stay in int64.
MAX_WEIGHT = 2.0 ** 20


def _fixed_weights(weights, n: int) -> np.ndarray | None:
    if weights is None:
        return None
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"weights must have shape ({n},) like features, got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(np.abs(w) > MAX_WEIGHT):
        raise ValueError(f"weights must be finite with |w| <= {MAX_WEIGHT:g}")
    return np.rint(w * _SCALE).astype(np.int64)


def _as_features(features) -> np.ndarray:
    f = np.asarray(features)
    if f.ndim != 1:
        raise ValueError(f"features must be a 1-D array, got {f.ndim}-D")
    if f.dtype != np.uint64:
        if f.size and (f.dtype.kind not in "iu" or (f.dtype.kind == "i" and f.min() < 0)):
            raise TypeError(f"features must be uint64 hashes, got dtype {f.dtype}")
        f = f.astype(np.uint64)
    return np.ascontiguousarray(f)


class SimhashAccumulator:
    """Running simhash state: add feature batches, then read the fingerprint.

    Memory is constant (8 x 256 int64 buckets) whatever the number of
    features, which is how long texts are streamed.
    """

    def __init__(self):
        self._buckets = np.zeros((8, 256), dtype=np.int64)

    def add(self, features, weights=None) -> None:
        """Add features (uint64) with optional float weights (default 1 each).

        Raises:
            TypeError: features are not unsigned integers.
            ValueError: shapes differ, or a weight is not finite or too large.
        """
        f = _as_features(features)
        if len(f) == 0:
            return
        w = _fixed_weights(weights, len(f))
        _core.simhash_accumulate(f, w, self._buckets)

    def result(self) -> tuple[int, np.ndarray]:
        """Return (fingerprint, V) with V as float64 of length 64 (V[j] for bit j)."""
        fp, v = _core.simhash_finish(self._buckets)
        return fp, np.frombuffer(v, dtype=np.int64) / _SCALE


def simhash(features, weights=None) -> int:
    """Return the 64-bit simhash of weighted features.

    Args:
        features: 1-D uint64 feature hashes (repeats count as repeats).
        weights: None (weight 1 each) or float weights, one per feature.

    Returns:
        The fingerprint as a Python int in [0, 2**64).  No features give 0.

    Raises:
        TypeError, ValueError: see :meth:`SimhashAccumulator.add`.

    Cost: O(n) in C, 8 bucket additions per feature.
    """
    return simhash_with_weights(features, weights)[0]


def simhash_with_weights(features, weights=None) -> tuple[int, np.ndarray]:
    """Return (simhash, V): V[j] is the weight sum of bit j (float64, 64 values)."""
    acc = SimhashAccumulator()
    acc.add(features, weights)
    return acc.result()


def hamming(a, b) -> np.ndarray | int:
    """Return the Hamming distance between fingerprints (ints or uint64 arrays)."""
    if isinstance(a, int) and isinstance(b, int):
        return (a ^ b).bit_count()
    x = np.bitwise_xor(np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64))
    return popcount64(x)


def popcount64(x: np.ndarray) -> np.ndarray:
    """Return the number of 1 bits of each uint64 (vectorised SWAR)."""
    x = np.asarray(x, dtype=np.uint64)
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x).astype(np.int64)
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return ((x * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.int64)
