"""A compaction step's commit may reuse the pages the step before it freed.

LMDB reuses no page freed by a commit that a reader still sees.  A step
reads from a snapshot of its own and ends it before it commits, and the
index lets go of the snapshot the step before it left, keeping what the next
one extends (reader.Lineage): at a compaction commit no reader of this
process is open.  Answers stay exact through it (brute-force oracle).
"""

from __future__ import annotations

import numpy as np

from tests.oracle import check_queries, near
from ndindex.index import Index


def watch_readers(ix, seen: list) -> None:
    """Wrap the store's write: each commit appends (its txnid, the open readers'
    txnids) to seen."""
    real = ix._store.write

    def write(body, sync=True):
        def watched(wt):
            seen.append((wt.txnid, sorted(t for _, t in ix._store.readers())))
            return body(wt)
        return real(watched, sync=sync)

    ix._store.write = write


def test_no_reader_is_open_at_a_compaction_commit(tmp_path):
    rng = np.random.default_rng(5)
    fps = rng.integers(0, 2**64, size=60_000, dtype=np.uint64)
    with Index.create(tmp_path / "x.ndx", k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=4_000) as ix:
        seen = []
        for i in range(12):
            part = fps[i * 5_000:(i + 1) * 5_000]
            ix.add(part)
            check_queries(ix, fps[:(i + 1) * 5_000], near(rng, part, 20, 3), 3)  # a snapshot
            steps = ix._compactor.steps
            real = ix._store.write
            watch_readers(ix, seen)
            try:
                ix.compact()
            finally:
                ix._store.write = real
            assert ix._compactor.steps > steps
        assert len(seen) >= 15
        assert [readers for _, readers in seen] == [[]] * len(seen)
        check_queries(ix, fps, near(rng, fps, 200, 3), 3)


def test_a_snapshot_let_go_of_hands_its_log_on(tmp_path):
    """The snapshot after one the index let go of extends its log (reads only
    the records since), and answers as a fresh open does."""
    rng = np.random.default_rng(6)
    fps = rng.integers(0, 2**64, size=20_000, dtype=np.uint64)
    path = tmp_path / "x.ndx"
    with Index.create(path, k=3, expected_n=len(fps), background_compaction=False) as ix:
        ix.add(fps[:10_000])
        ix.query(int(fps[0]), 3)
        before = ix._snapshot()
        log = before.log
        ix._let_go_of_snapshot()
        del before
        ix.add(fps[10_000:])
        after = ix._snapshot()
        reads = []
        real = after._read_log
        after._read_log = lambda first, end: reads.append((first, end)) or real(first, end)
        assert after.log.n_adds() == log.n_adds() + 10_000
        assert reads == [(after.state.log_next_seq - 1, after.state.log_next_seq)]
        check_queries(ix, fps, near(rng, fps, 100, 3), 3)
    with Index.open(path) as again:
        check_queries(again, fps, near(rng, fps, 100, 3), 3)
