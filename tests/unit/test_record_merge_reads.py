"""Document keys are read right while a merge of their record runs is half done.

A merge input keeps only its records above the merge's cursor (7.5 [M2]);
its chunks below were deleted.  A lookup of a key at or below the cursor
(found in the output) must not take the input's first remaining chunk for
a broken chain -- found by the large index of tools/sweep_corruption.py,
where remove() looked up keys during such a merge.
"""

from __future__ import annotations

import numpy as np

from ndindex import chunks as ch, compaction
from ndindex.index import Index


def test_keys_and_remove_during_a_record_merge(tmp_path, monkeypatch):
    monkeypatch.setattr(ch, "RECORD_CHUNK_BLOCKS", 1)
    monkeypatch.setattr(ch, "RECORD_BLOCK_BYTES", 256)
    rng = np.random.default_rng(2)
    fps = np.unique(rng.integers(0, 2**64, 3000, dtype=np.uint64))[:2000]
    with Index.create(tmp_path / "m.ndx", k=3, expected_n=2000, background_compaction=False,
                      log_limit=1 << 30) as ix:
        ix.add(fps[:1000], keys=[f"a{i}" for i in range(1000)])
        ix.compact()
        ix.add(fps[1000:], keys=[f"b{i}" for i in range(1000)])
        monkeypatch.setattr(compaction, "STEP_CHUNKS", 1)
        ix._compactor.step(force_flush=True)  # the flush: a second record run
        for _ in range(3):                     # a few steps of the merge of the two
            ix._compactor.step()
        runs = ix._snapshot().manifest.runs
        inputs = [r for r in runs if r.space == 0xF1 and r.merge_input]
        assert inputs and all(r.cursor for r in inputs)
        cursor = inputs[0].cursor
        below = [i for i, fp in enumerate(fps.tolist()) if fp.to_bytes(8, "big") < cursor]
        above = [i for i, fp in enumerate(fps.tolist()) if fp.to_bytes(8, "big") > cursor]
        assert below and above
        for i in below[:20] + above[:20]:
            key = f"a{i}" if i < 1000 else f"b{i - 1000}"
            assert ix.keys(int(fps[i])) == (key,)
        gone = [int(fps[i]) for i in below[:5] + above[:5]]
        assert ix.remove(gone) == 10
        assert all(ix.keys(fp) == () and fp not in ix for fp in gone)
        ix.verify()
        ix.compact()
        ix.verify()
        assert len(ix) == 1990
