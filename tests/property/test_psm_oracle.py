"""Probabilistic matching (ndindex.psm) against brute force: exhaustive probing
finds exactly the stored values within k; a capped query finds exactly those
whose header is among the first max_probes flip sets of the reference VOSH."""

import itertools

import numpy as np
from hypothesis import given, settings, strategies as st

from ndindex import psm, vosh
from tests.oracle import brute_force, clustered, near, popcount64

seeds = st.integers(0, 2**32 - 1)


def data(seed, n, header_bits):
    """Clustered and random fingerprints (so near-duplicates exist), queries
    near them, and flip probabilities."""
    rng = np.random.default_rng(seed)
    stored = np.concatenate([clustered(rng, max(1, n // 8), 6, 4),
                             rng.integers(0, 2**64, n // 4, dtype=np.uint64)])
    queries = near(rng, stored, 12, 4)
    probs = rng.random((len(queries), 64)) ** 3   # a few volatile bits per query
    return stored, queries, probs


def reference_headers(q, probs, p, k, cap=None):
    """q's flipped headers from the Python VOSH over the header bits."""
    positions = list(range(64 - p, 64))
    sets = vosh.flip_sets_upto(probs[positions], min(k, p))
    masks = [sum(1 << positions[b] for b in s) for s in itertools.islice(sets, cap)]
    return [(q ^ m) >> (64 - p) if p else 0 for m in masks]


def within_headers(stored, q, k, p, headers):
    """brute_force restricted to the stored values under the given headers."""
    allowed = set(headers)
    return [(f, d) for f, d in brute_force(stored, q, k)
            if ((f >> (64 - p)) if p else 0) in allowed]


@settings(max_examples=40, deadline=None)
@given(seeds, st.integers(0, 400), st.integers(0, 12), st.integers(0, 6), st.data())
def test_exhaustive_query_is_exact(seed, n, p, k, draw):
    stored, queries, probs = data(seed, n, p)
    b = draw.draw(st.integers(0, p))
    table = psm.PsmTable(stored, p, directory_bits=b)
    values = np.unique(stored)
    for q, pr in zip(queries.tolist(), probs):
        matches, probes = table.query(q, pr, k)
        assert matches == brute_force(values, q, k)
        assert probes == psm.flip_set_count(p, k)


@settings(max_examples=40, deadline=None)
@given(seeds, st.integers(1, 400), st.integers(0, 14), st.integers(0, 5), st.integers(0, 60))
def test_capped_query_finds_exactly_the_probed_headers(seed, n, p, k, cap):
    stored, queries, probs = data(seed, n, p)
    table = psm.PsmTable(stored, p)
    values = np.unique(stored)
    for q, pr in zip(queries.tolist(), probs):
        headers = reference_headers(q, pr, p, k, cap)
        assert table.headers(q, pr, k, cap).tolist() == headers
        matches, probes = table.query(q, pr, k, cap)
        assert probes == len(headers)
        assert matches == within_headers(values, q, k, p, headers)
        assert table.probe(q, np.array(headers, dtype=np.uint64), k) == matches


@settings(max_examples=25, deadline=None)
@given(seeds, st.integers(0, 300), st.integers(1, 12), st.integers(0, 4),
       st.one_of(st.none(), st.integers(0, 30)))
def test_query_many_equals_single_queries(seed, n, p, k, cap):
    stored, queries, probs = data(seed, n, p)
    table = psm.PsmTable(stored, p)
    matches, probes = table.query_many(queries, probs, k, cap)
    for i, (q, pr) in enumerate(zip(queries.tolist(), probs)):
        one, used = table.query(q, pr, k, cap)
        mine = matches[matches["query"] == i]
        assert list(zip(mine["fingerprint"].tolist(), mine["distance"].tolist())) == one
        assert probes[i] == used


def brute_pairs(qs, fs, k):
    qs, fs = np.asarray(qs, dtype=np.uint64), np.asarray(fs, dtype=np.uint64)
    if not len(qs) or not len(fs):
        return set()
    d = popcount64(qs[:, None] ^ fs[None, :])
    i, j = np.nonzero(d <= k)
    return {(int(qs[a]), int(fs[b]), int(d[a, b])) for a, b in zip(i, j)}


@settings(max_examples=30, deadline=None)
@given(seeds, st.integers(0, 300), st.integers(1, 10), st.integers(0, 4),
       st.one_of(st.none(), st.integers(0, 20)), st.integers(1, 200))
def test_batch_join_against_brute_force(seed, n, p, k, cap, chunk):
    stored, queries, probs = data(seed, n, p)
    queries[-1] = queries[0]            # a repeated value, with other probabilities
    stored = np.unique(stored)
    got = [tuple(map(int, r)) for part in psm.join(queries, probs, stored, k, header_bits=p,
                                                   max_probes=cap, chunk_size=chunk)
           for r in part]
    assert len(got) == len(set(got))   # F is a set, and the repeated query's pairs come once
    want = set()
    for q, pr in zip(queries.tolist(), probs):
        want |= {(q, f, d) for f, d in
                 within_headers(stored, q, k, p, reference_headers(q, pr, p, k, cap))}
    assert set(got) == want


def flush_oracle(batch, batch_probs, stored, k, p, cap):
    """The pairs one flush must report, sorted: new against stored, then new
    against new (each unordered pair once)."""
    values = np.array(sorted(stored), dtype=np.uint64)
    distinct = np.unique(np.array(batch, dtype=np.uint64))
    want = set()
    for q, pr in zip(batch, batch_probs):
        heads = reference_headers(q, pr, p, k, cap)
        want |= {(q, f, d) for f, d in within_headers(values, q, k, p, heads)}
        want |= {(min(q, f), max(q, f), d) for f, d in within_headers(distinct, q, k, p, heads)
                 if f != q}
    return sorted(want)


@settings(max_examples=25, deadline=None)
@given(seeds, st.integers(1, 40), st.integers(0, 4), st.one_of(st.none(), st.integers(1, 15)),
       st.lists(st.integers(1, 30), min_size=1, max_size=6))
def test_collection_batches_against_brute_force(seed, m, k, cap, adds):
    rng = np.random.default_rng(seed)
    base = clustered(rng, 10, 4, 3)
    col = psm.PsmCollection(base[:5], k=k, batch_size=m, max_probes=cap, header_bits=6)
    stored = set(np.unique(base[:5]).tolist())
    pending, pending_probs = [], []
    for size in adds:
        fps = np.concatenate([base[rng.integers(5, len(base), size // 2)],
                              rng.integers(0, 2**64, size - size // 2, dtype=np.uint64)])
        probs = rng.random((size, 64)) ** 3
        found = col.add(fps, probs)
        pending += fps.tolist()
        pending_probs += list(probs)
        want = []   # each flush's pairs once; two flushes may report the same pair
        while len(pending) >= m:
            want += flush_oracle(pending[:m], pending_probs[:m], stored, k, 6, cap)
            stored |= set(pending[:m])
            pending, pending_probs = pending[m:], pending_probs[m:]
        assert sorted(tuple(map(int, r)) for r in found) == sorted(want)
    assert col.pending == len(pending) and len(col) == len(stored)
    last = col.flush()
    assert sorted(tuple(map(int, r)) for r in last) == sorted(
        flush_oracle(pending, pending_probs, stored, k, 6, cap))
    assert col.values.tolist() == sorted(stored | set(pending)) and col.pending == 0


@settings(max_examples=30, deadline=None)
@given(seeds, st.integers(1, 120), st.integers(0, 6), st.one_of(st.none(), st.integers(1, 40)))
def test_candidate_pairs_by_document_index(seed, n, k, cap):
    rng = np.random.default_rng(seed)
    fps = clustered(rng, max(1, n // 5), 5, 3)[:n]
    fps[rng.integers(0, len(fps), len(fps) // 4)] = fps[0]       # equal simhashes
    probs = rng.random((len(fps), 64)) ** 3
    p = psm.default_header_bits(len(np.unique(fps)))
    left, right = psm.candidate_pairs(fps, probs, k, cap)
    got = set(zip(left.tolist(), right.tolist()))
    assert len(got) == len(left) and all(a < b for a, b in got)
    want = set()
    for i in range(len(fps)):
        heads = set(reference_headers(int(fps[i]), probs[i], p, k, cap))
        for j in range(len(fps)):
            if i != j and bin(int(fps[i]) ^ int(fps[j])).count("1") <= k \
                    and (int(fps[j]) >> (64 - p)) in heads:
                want.add((min(i, j), max(i, j)))
    assert got == want
