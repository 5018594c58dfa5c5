"""Queries of raw runs (the small compaction levels) against brute force, on
fingerprints far from evenly spread.

The kernel guesses where a probe's range starts inside a raw block from the
block's value range, as if its values were spread evenly, fetches only the
lines around the guess and searches out from it (query.c: raw_guess,
raw_prefetch, raw_probe).  Clustered and consecutive fingerprints put that
guess most of a block away; the answers must not change.  Both ways to a
run's blocks are taken: the chunks tree (runs of several chunks while the
index is cold) and run directories (once it is warm), first visits of a
block (checksum) and later ones.
"""

from __future__ import annotations

import numpy as np

from ndindex import chunks as ch
from ndindex.index import Index
from ndindex.reader import WARM_QUERIES
from ndindex.records import KIND_RAW
from tests.oracle import brute_force, clustered, near


def skewed_fingerprints(rng) -> np.ndarray:
    tight = clustered(rng, 40, 60, 3)
    starts = rng.integers(0, 2**63, 8, dtype=np.uint64)
    consecutive = (starts[:, None] + np.arange(300, dtype=np.uint64)).ravel()
    spread = rng.integers(0, 2**64, 1500, dtype=np.uint64)
    return np.unique(np.concatenate([tight, consecutive, spread]))


def test_raw_runs_answer_exactly_when_fingerprints_cluster(tmp_path, monkeypatch):
    monkeypatch.setattr(ch, "CHUNK_MAX_BLOCKS", 2)  # runs of many chunks: tree path while cold
    rng = np.random.default_rng(21)
    fps = skewed_fingerprints(rng)
    with Index.create(tmp_path / "raw.ndx", k=3, expected_n=len(fps),
                      background_compaction=False, log_limit=1 << 30) as ix:
        for part in np.array_split(rng.permutation(fps), 4):
            ix.add(part)
            ix._compactor.step(force_flush=True)
        assert not ix._snapshot().state.log_ops
        for runs in ix._snapshot().table_runs:
            assert runs and all(r.kind == KIND_RAW for r in runs)
        queries = np.concatenate([near(rng, fps, 2 * WARM_QUERIES, 3), fps[::37],
                                  rng.integers(0, 2**64, 50, dtype=np.uint64)])
        for rounds in range(2):   # cold then warm (listed); first visits then verified
            for q in queries.tolist():
                assert [(m.fingerprint, m.distance) for m in ix.query(q, 3, keys=False)] == \
                    brute_force(fps, q, 3)
            assert ix._directories.warm
            got = ix.query_many(queries, 3)
            want = [(i, f, d) for i, q in enumerate(queries.tolist())
                    for f, d in brute_force(fps, q, 3)]
            assert list(zip(got["query"].tolist(), got["fingerprint"].tolist(),
                            got["distance"].tolist())) == want
