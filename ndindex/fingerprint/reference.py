"""Plain-Python twins of the C feature kernels, written from the spec.

Slow and simple on purpose: the differential tests run these and the kernel
on the same inputs (format-spec/fingerprinter.md).  Not for production use.
"""

from __future__ import annotations

import re

import numpy as np

_M = (1 << 64) - 1
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` with ``seed``, from the published algorithm."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M]
        while i + 32 <= n:
            for k in range(4):
                v[k] = _round(v[k], int.from_bytes(data[i + 8 * k:i + 8 * k + 8], "little"))
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for lane in v:
            h = ((h ^ _round(0, lane)) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h ^= _round(0, int.from_bytes(data[i:i + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i:i + 4], "little") * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    return h ^ (h >> 32)


def rabin(data: bytes, poly: int = 0x9BDC0890B9832B3B) -> int:
    """Remainder of the message polynomial mod x^64 + poly, bit by bit."""
    f = 0
    for byte in data:
        for bit in range(7, -1, -1):
            top = f >> 63
            f = ((f << 1) & _M) | ((byte >> bit) & 1)
            if top:
                f ^= poly
    return f


def tokens(normalized: str, unit: str, stop: frozenset[str] = frozenset()) -> list[str]:
    """The kept tokens of a normalised text under a unit ([FP11]-[FP13])."""
    if unit == "words":
        return [t for t in re.findall(r"\w+", normalized) if t not in stop]
    if unit == "lines":
        lines = (" ".join(line.split()) for line in re.split(r"[\r\n]", normalized))
        return [t for t in lines if t and t not in stop]
    if unit == "chars":
        return list(" ".join(normalized.split()))
    raise ValueError(unit)


def features(normalized: str, unit: str = "words", ngram: int = 1, seed: int = 0,
             stop: frozenset[str] = frozenset(), hash: str = "xxh64") -> list[int]:
    """Feature hashes of a normalised text ([FP11]-[FP16]), one per n-gram."""
    toks = tokens(normalized, unit, stop)
    sep = {"words": " ", "lines": "\n", "chars": ""}[unit]
    grams = [sep.join(toks[i:i + ngram]) for i in range(len(toks) - ngram + 1)]
    if not grams and toks:
        grams = [sep.join(toks)]
    if hash == "rabin":
        return [rabin(g.encode("utf-32-be")) for g in grams]
    return [xxh64(g.encode("utf-8"), seed) for g in grams]


def simhash(feats, weights=None) -> tuple[int, list[float]]:
    """Charikar's simhash with 64 counters; weights default to 1 ([FP30]-[FP32])."""
    v = [0] * 64
    for i, h in enumerate(feats):
        w = 4096 if weights is None else int(weights[i])
        for j in range(64):
            v[j] += w if (int(h) >> j) & 1 else -w
    fp = sum(1 << j for j in range(64) if v[j] > 0)
    return fp, [x / 4096 for x in v]


def minhash(feats, a, b) -> np.ndarray:
    """mins_i = min_x ((a_i * fold(x) + b_i) mod 2^64) >> 32 ([FP40]-[FP41])."""
    out = []
    for ai, bi in zip(a, b):
        best = 0xFFFFFFFF
        for x in feats:
            x = int(x)
            f = (x ^ (x >> 32)) & 0xFFFFFFFF
            best = min(best, ((int(ai) * f + int(bi)) & _M) >> 32)
        out.append(best)
    return np.array(out, dtype=np.uint32)
