"""Brute-force reference answers for k-Hamming queries."""

import numpy as np

M1 = np.uint64(0x5555555555555555)
M2 = np.uint64(0x3333333333333333)
M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
H01 = np.uint64(0x0101010101010101)


def popcount64(a: np.ndarray) -> np.ndarray:
    """Population count of each uint64 (SWAR; works on numpy 1.x too)."""
    a = np.asarray(a, dtype=np.uint64)
    a = a - ((a >> np.uint64(1)) & M1)
    a = (a & M2) + ((a >> np.uint64(2)) & M2)
    a = (a + (a >> np.uint64(4))) & M4
    return ((a * H01) >> np.uint64(56)).astype(np.int64)


def brute_force(stored, q: int, k: int) -> list[tuple[int, int]]:
    """[(fingerprint, distance)] within k of q, ordered by (distance, fingerprint).

    stored must hold distinct values (np.unique them once, not per query).
    """
    stored = np.asarray(stored, dtype=np.uint64)
    d = popcount64(stored ^ np.uint64(q))
    hit = d <= k
    return sorted(zip(stored[hit].tolist(), d[hit].tolist()), key=lambda t: (t[1], t[0]))


def clustered(rng, n_centres: int, per_centre: int, max_flips: int) -> np.ndarray:
    """Fingerprints in tight clusters: each centre plus copies with <= max_flips bits flipped."""
    centres = rng.integers(0, 2**64, size=n_centres, dtype=np.uint64)
    out = np.repeat(centres, per_centre)
    for _ in range(max_flips):
        flip = rng.random(len(out)) < 0.7
        out[flip] ^= np.uint64(1) << rng.integers(0, 64, size=int(flip.sum()), dtype=np.uint64)
    return out


def near(rng, fps: np.ndarray, n: int, max_flips: int) -> np.ndarray:
    """n queries, each a stored fingerprint with up to max_flips random bits flipped."""
    q = fps[rng.integers(0, len(fps), size=n)].copy()
    for _ in range(max_flips):
        flip = rng.random(n) < 0.6
        q[flip] ^= np.uint64(1) << rng.integers(0, 64, size=int(flip.sum()), dtype=np.uint64)
    return q


def check_queries(ix, stored, queries, k):
    """Every query equals brute force, via query() and query_many()."""
    many = ix.query_many(queries, k)
    stored = np.unique(stored)
    for i, q in enumerate(queries.tolist()):
        want = brute_force(stored, q, k)
        got = [(m.fingerprint, m.distance) for m in ix.query(q, k, keys=False)]
        assert got == want, f"query {q:#x}"
        rows = many[many["query"] == i]
        assert list(zip(rows["fingerprint"].tolist(), rows["distance"].tolist())) == want
