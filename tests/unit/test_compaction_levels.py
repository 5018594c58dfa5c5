"""Merges at different levels of one table run side by side, and answers stay exact.

A merge into the main level takes many steps; flushes that arrive meanwhile
are merged among the small levels beside it (compaction._choose_merges)
instead of piling up as level-0 runs.  Checked against a brute-force oracle
at every step.
"""

from __future__ import annotations

import numpy as np

from ndindex import chunks as ch, compaction
from ndindex.index import Index


def brute(stored: np.ndarray, q: int, k: int) -> set:
    d = np.array([bin(int(x) ^ q).count("1") for x in stored.tolist()])
    return set(stored[d <= k].tolist())


def test_small_merges_run_beside_a_merge_into_the_main_level(tmp_path, monkeypatch):
    monkeypatch.setattr(ch, "CHUNK_MAX_BLOCKS", 1)
    monkeypatch.setattr(compaction, "STEP_CHUNKS", 1)
    rng = np.random.default_rng(4)
    fps = np.unique(rng.integers(0, 2**64, 9000, dtype=np.uint64))[:8000]
    base, later = fps[:6000], fps[6000:]
    with Index.create(tmp_path / "c.ndx", k=3, expected_n=8000, background_compaction=False,
                      log_limit=1 << 30) as ix:
        ix.add(base)
        ix.compact(full=True)
        gone = base[:600]                      # 10% removed: a merge into the main level is due
        ix.remove(gone)
        ix._compactor.step(force_flush=True)   # the flush
        ix._compactor.step()                   # the main merge starts
        live = set(base.tolist()) - set(gone.tolist())
        queries = [int(x) ^ (1 << int(b)) for x, b in zip(fps[::97].tolist(), range(64))]
        both = 0
        for part in np.array_split(later, 8):
            ix.add(part)
            live |= set(part.tolist())
            ix._compactor.step(force_flush=True)   # a level-0 run while the main merge goes on
            for _ in range(3):
                ix._compactor.step()
                man = ix._snapshot().manifest
                outputs = [r for r in man.of(0) if r.merge_output]
                both += len(outputs) == 2
                stored = np.array(sorted(live), dtype=np.uint64)
                for q in queries[:8]:
                    assert {m.fingerprint for m in ix.query(q, 3, keys=False)} == brute(stored, q, 3)
        assert both, "no small merge ran beside the main merge"
        ix.compact()
        ix.verify()
        assert set(ix.fingerprints().tolist()) == live
        ix.compact(full=True)
        ix.verify()
        assert set(ix.fingerprints().tolist()) == live
