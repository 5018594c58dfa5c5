"""Merges at different levels of one table run side by side, and answers stay exact.

A merge into the main level takes many steps; flushes that arrive meanwhile
are merged among the small levels beside it (levels.choose_merges)
instead of piling up as level-0 runs.  Checked against a brute-force oracle
at every step.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ndindex import chunks as ch, compaction, levels, records as rec
from ndindex.index import Index


def brute(stored: np.ndarray, q: int, k: int) -> set:
    d = np.array([bin(int(x) ^ q).count("1") for x in stored.tolist()])
    return set(stored[d <= k].tolist())


def assert_answers(ix, live: set, queries) -> None:
    """Each query within 3 finds what brute force finds among live."""
    stored = np.array(sorted(live), dtype=np.uint64)
    for q in queries:
        assert {m.fingerprint for m in ix.query(q, 3, keys=False)} == brute(stored, q, 3)


def assert_settles(ix, live: set) -> None:
    """compact() leaves a file that verifies and holds exactly live."""
    ix.compact()
    ix.verify()
    assert set(ix.fingerprints().tolist()) == live


def grown(ix, fps, parts: int, steps: int, every: int, flip: int, stride: int):
    """Add fps in `parts` calls with `steps` compaction steps after each, and
    yield (table, its runs) for every table after every call; after every
    `every` calls, queries near what was added (every stride-th stored
    fingerprint XOR flip << b) find what brute force finds."""
    live = set()
    for i, part in enumerate(np.array_split(fps, parts)):
        ix.add(part)
        live |= set(part.tolist())
        for _ in range(steps):
            ix._compactor.step()
        for t in range(len(ix.plan.tables)):
            yield t, ix._snapshot().manifest.of(t)
        if i % every == every - 1:
            stored = sorted(live)
            assert_answers(ix, live, [x ^ (flip << b) for x, b in
                                      zip(stored[::stride], range(64 - flip.bit_length()))])


@contextlib.contextmanager
def main_merge_started(path, monkeypatch, seed: int, n: int, log_limit: int):
    """An index of merges in many small steps, with three quarters of n
    fingerprints compacted into the main level, a tenth of those removed and
    a merge into the main level begun: yields (ix, live fingerprints, the
    quarter not added yet, queries near stored fingerprints)."""
    monkeypatch.setattr(ch, "CHUNK_MAX_BLOCKS", 1)
    monkeypatch.setattr(compaction, "STEP_CHUNKS", 1)
    rng = np.random.default_rng(seed)
    fps = np.unique(rng.integers(0, 2**64, n + n // 8, dtype=np.uint64))[:n]
    base, later = fps[:n * 3 // 4], fps[n * 3 // 4:]
    with Index.create(path, k=3, expected_n=n, background_compaction=False,
                      log_limit=log_limit) as ix:
        ix.add(base)
        ix.compact(full=True)
        gone = base[:len(base) // 10]          # 10%: a merge into the main level is due
        ix.remove(gone)
        ix._compactor.step(force_flush=True)   # the flush
        ix._compactor.step()                   # the main merge starts
        queries = [int(x) ^ (1 << int(b)) for x, b in zip(fps[::97].tolist(), range(64))]
        yield ix, set(base[len(gone):].tolist()), later, queries


def test_small_merges_run_beside_a_merge_into_the_main_level(tmp_path, monkeypatch,
                                                              level0_flushes):
    with main_merge_started(tmp_path / "c.ndx", monkeypatch, 4, 8000, 1 << 30) as started:
        ix, live, later, queries = started
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
                assert_answers(ix, live, queries[:8])
        assert both, "no small merge ran beside the main merge"
        assert_settles(ix, live)
        ix.compact(full=True)
        ix.verify()
        assert set(ix.fingerprints().tolist()) == live


def test_a_flush_merges_into_the_level_1_run_in_its_own_commit(tmp_path, monkeypatch):
    # Adds, removes (of values in the main run and in level 1) and re-adds:
    # after each flush a table holds its level-1 run and its main run, no
    # merge is left to do, and answers equal brute force.  Level 1 holds
    # eight flushes, as it does past a main level of 16.8M entries.
    monkeypatch.setattr(levels, "SMALL_LEVEL_RATIO", levels.LEVEL_RATIO)
    rng = np.random.default_rng(8)
    fps = np.unique(rng.integers(0, 2**64, 13000, dtype=np.uint64))[:12000]
    with Index.create(tmp_path / "f.ndx", k=3, expected_n=12000, background_compaction=False,
                      log_limit=1000) as ix:               # level 1 holds 8,000 entries
        ix.add(fps[:6000])
        ix.compact(full=True)
        live = set(fps[:6000].tolist())
        removed = []
        for i, part in enumerate(np.array_split(fps[6000:], 6)):
            ix.add(part)
            live |= set(part.tolist())
            gone = rng.choice(np.array(sorted(live), dtype=np.uint64), 50, replace=False)
            ix.remove(gone)
            live -= set(gone.tolist())
            removed += gone.tolist()
            if i == 3:
                back = removed[:20]
                ix.add(np.array(back, dtype=np.uint64))
                live |= set(back)
            ix._compactor.step(force_flush=True)
            man = ix._snapshot().manifest
            for t in range(len(ix.plan.tables)):
                assert [r.level for r in man.of(t)] == [1, levels.MAIN_LEVEL]
                assert not any(r.merge_into for r in man.of(t))
            fp_runs = [r for r in man.runs if r.space < rec.SPACE_TOMBSTONES]
            while ix._compactor.step():   # tombstone runs may merge (format 5), nothing else
                pass
            assert [r for r in ix._snapshot().manifest.runs if r.space < rec.SPACE_TOMBSTONES] \
                == fp_runs
            assert set(ix.fingerprints().tolist()) == live
            near = [int(x) ^ (1 << int(b)) for x, b in zip(fps[i::301].tolist(), range(64))]
            assert_answers(ix, live, near)
        ix.verify()
        # A flush merges into a level-1 run within its share, even past it;
        # a run past its share goes up before the next flush, which is then a
        # level-1 run of its own.
        more = np.unique(rng.integers(0, 2**64, 3100, dtype=np.uint64))
        ix.add(more[:3000])
        ix._compactor.step(force_flush=True)
        runs = ix._snapshot().manifest.of(0)
        assert [r.level for r in runs] == [1, levels.MAIN_LEVEL] and runs[0].entries > 8000
        ix.add(more[3000:])
        while ix._snapshot().manifest.of(0)[0].level == 1:
            assert ix._compactor.step(force_flush=True)
            assert ix._snapshot().state.log_ops == 100       # merging first
        ix._compactor.step(force_flush=True)
        assert [r.level for r in ix._snapshot().manifest.of(0)] == [1, 2, levels.MAIN_LEVEL]
        live |= set(more.tolist())
        assert_settles(ix, live)


def test_a_flush_into_level_1_drops_what_the_log_removed_from_it(tmp_path):
    # With no older run left, the flush's tombstones go at once: the values
    # they remove must leave the level-1 run in the same commit.
    rng = np.random.default_rng(9)
    fps = np.unique(rng.integers(0, 2**64, 5000, dtype=np.uint64))[:4000]
    with Index.create(tmp_path / "g.ndx", k=3, expected_n=4000, background_compaction=False,
                      log_limit=1000) as ix:
        ix.add(fps[:3000])
        ix._compactor.step(force_flush=True)
        assert {r.level for r in ix._snapshot().manifest.runs if r.space == 0} == {1}
        ix.add(fps[3000:])
        ix.remove(fps[:300])
        ix._compactor.step(force_flush=True)
        snap = ix._snapshot()
        assert [r.level for r in snap.manifest.of(0)] == [1] and not len(snap.tombstones)
        assert set(ix.fingerprints().tolist()) == set(fps[300:].tolist())
        assert all(not ix.query(int(x), 0, keys=False) for x in fps[:300:7].tolist())
        ix.verify()


def test_flushes_beside_a_busy_merge_go_to_one_free_level_1_run(tmp_path, monkeypatch):
    with main_merge_started(tmp_path / "b.ndx", monkeypatch, 10, 8000, 1 << 30) as started:
        ix, live, later, queries = started
        for part in np.array_split(later, 8):
            ix.add(part)
            live |= set(part.tolist())
            ix._compactor.step(force_flush=True)
            man = ix._snapshot().manifest
            assert any(r.merge_output for r in man.of(0)), "the main merge goes on"
            small = [r for r in man.of(0) if r.level <= 1]
            assert [(r.level, r.merge_into) for r in small] == [(1, 0)]
            ix._compactor.step()
            assert_answers(ix, live, queries[:8])
        assert_settles(ix, live)


def test_full_level_1_runs_merge_into_level_2_beside_a_main_merge(tmp_path, monkeypatch):
    # log_limit=50: level 1 holds 400 entries.
    with main_merge_started(tmp_path / "s.ndx", monkeypatch, 11, 11000, 50) as started:
        ix, live, later, queries = started
        side = 0
        for part in np.array_split(later, 10):
            ix.add(part)
            live |= set(part.tolist())
            ix._compactor.step(force_flush=True)
            for _ in range(2):
                ix._compactor.step()
                outputs = [r for r in ix._snapshot().manifest.of(0) if r.merge_output]
                side += any(r.level == 2 for r in outputs) and \
                    any(r.level == levels.MAIN_LEVEL for r in outputs)
                assert_answers(ix, live, queries[:6])
        assert side, "no merge into level 2 ran beside the main merge"
        assert_settles(ix, live)


def test_a_growing_table_keeps_one_main_run(tmp_path):
    # log_limit=50: level 1 holds 400 entries, level 2 3,200 or a quarter of
    # the main level.  Every merge into the main level takes the main run
    # with it: a merge of the small levels that outgrew level 2 once became
    # a main run of its own, and a stream left one more for every few
    # hundred thousand fingerprints (five a table at 30M), each one more
    # probe for every query.
    rng = np.random.default_rng(12)
    fps = np.unique(rng.integers(0, 2**64, 31000, dtype=np.uint64))[:30000]
    rng.shuffle(fps)
    with Index.create(tmp_path / "m.ndx", k=3, expected_n=30000, background_compaction=False,
                      log_limit=50) as ix:
        main_ids = set()
        for t, runs in grown(ix, fps, parts=300, steps=2, every=60, flip=3, stride=997):
            main = [r for r in runs if r.level >= levels.MAIN_LEVEL]
            assert len([r for r in main if not r.merge_into]) <= 1, runs
            assert len(main) <= 2, runs   # a merge's output and its main input
            main_ids |= {r.run_id for r in main} if t == 0 else set()
        assert len(main_ids) > 5, "the stream merged into the main level too seldom"
        assert_settles(ix, set(fps.tolist()))


def test_snapshots_share_the_tombstones_until_the_run_changes(tmp_path):
    # The open index keeps the tombstone run's arrays (and each table's
    # permuted copy, which merges use) for all its snapshots, and takes the
    # new run's as soon as a flush writes one.
    rng = np.random.default_rng(13)
    fps = np.unique(rng.integers(0, 2**64, 9000, dtype=np.uint64))[:8000]
    with Index.create(tmp_path / "t.ndx", k=3, expected_n=8000, background_compaction=False,
                      log_limit=1 << 20) as ix:
        ix.add(fps)
        ix.compact(full=True)
        live = set(fps.tolist())
        for part in (fps[:300], fps[300:700]):
            ix.remove(part)
            live -= set(part.tolist())
            ix._compactor.step(force_flush=True)
            first = ix._snapshot()
            gone = set(fps.tolist()) - live
            assert set(first.tombstones.tolist()) == gone
            extra = int(rng.integers(0, 2**64, dtype=np.uint64))
            ix.add(np.array([extra], dtype=np.uint64))  # a commit, a new snapshot
            live.add(extra)
            second = ix._snapshot()
            assert second is not first and second.tombstones is first.tombstones
        while ix._compactor.step():
            pass
        assert set(ix.fingerprints().tolist()) == live
        assert_answers(ix, live, [int(x) ^ 5 for x in fps[::211].tolist()])


def test_a_read_stops_at_the_first_chunk_past_stop(tmp_path, monkeypatch):
    # read_values(stop=...) reads no chunk whose values all lie past stop
    # (a merge step reads its sparser inputs only as far as its largest one
    # reaches), always at least one, and what it reads is the run's values.
    from ndindex import runs as rn
    monkeypatch.setattr(ch, "CHUNK_MAX_BLOCKS", 1)
    rng = np.random.default_rng(14)
    fps = np.unique(rng.integers(0, 2**64, 5000, dtype=np.uint64))
    with Index.create(tmp_path / "r.ndx", k=3, expected_n=5000, background_compaction=False) as ix:
        ix.add(fps)
        ix.compact(full=True)
        snap = ix._snapshot()
        run = snap.table_runs[0][0]
        whole = rn.read_values(snap.view, run)
        assert len(whole.chunk_keys) > 10 and whole.exhausted
        values = whole.values
        for stop in (0, int(values[0]), int(values[len(values) // 3]), int(values[-1]), 2**64 - 1):
            sl = rn.read_values(snap.view, run, None, 1 << 30, stop)
            assert sl.values.tolist() == values[:len(sl.values)].tolist()
            ends = [int.from_bytes(k[5:], "big") for k in sl.chunk_keys]   # each chunk's last
            assert ends and all(e < stop for e in ends[:-1])
            assert sl.exhausted or ends[-1] >= stop
            assert sl.exhausted == (ends[-1] == int(values[-1]))
        above = int(values[100])
        sl = rn.read_values(snap.view, run, above, 1 << 30, int(values[200]))
        assert sl.values.tolist() == values[101:101 + len(sl.values)].tolist()
        assert sl.end >= int(values[200]) and len(sl.values) < len(values) - 101


def test_levels_grow_geometrically_and_are_added_as_the_main_level_grows():
    f = levels.FLUSH_OPS
    for main in (0, 10**7, 3 * 10**7, 10**8, 10**9, 10**10):
        top = levels.top_raw_level(main)
        caps = [levels.level_capacity(level, main) for level in range(top + 1)]
        # Level 1: four flushes while two raw levels do with that (a main
        # level of up to 16.8M entries), then eight.
        assert caps[0] == f and caps[1] == f * (4 if main <= 16 * 4 * f * 4 else 8)
        assert caps[top] == max(f * 4 * levels.LEVEL_RATIO, main // 4)
        ratios = [b / a for a, b in zip(caps[1:], caps[2:])]
        assert all(1 < r <= levels.MAX_LEVEL_RATIO for r in ratios), (main, caps)
        assert levels.level_capacity(top + 1, main) == 0  # above the top: due
    assert [levels.top_raw_level(m) for m in (10**7, 3 * 10**7, 10**8, 10**9, 10**10)] == \
        [2, 2, 3, 4, 5]


def test_a_huffman_run_is_main_whatever_level_it_carries():
    # Files before 2026-11-27 numbered the main level 3: such a run stays
    # the main level (a raw run at level 3 is a raw level now).
    from ndindex.records import KIND_HUFFMAN, KIND_RAW, Manifest, Run
    old_main = Run(0, KIND_HUFFMAN, 3, 1, 10**8, 100)
    level2 = Run(0, KIND_RAW, 2, 2, 4 * 10**6, 10)
    assert levels.level_of(old_main) == levels.MAIN_LEVEL
    assert levels.level_of(Run(0, KIND_RAW, 3, 3, 10, 1)) == 3
    # Level 2 past its share of a 100M main level (3.6M) goes to raw level 3, not main.
    output, inputs, level = levels.choose_merge(Manifest(1, 4, [level2, old_main]), 0, False)
    assert (output, inputs, level) == (None, [level2], 3)
    # Once level 3 outgrows a quarter of the main level, it merges with the main run.
    level3 = Run(0, KIND_RAW, 3, 3, 26 * 10**6, 10)
    output, inputs, level = levels.choose_merge(Manifest(1, 4, [level3, old_main]), 0, False)
    assert level == levels.MAIN_LEVEL and inputs == [level3, old_main]


def test_a_table_that_outgrows_two_raw_levels_gets_a_third(tmp_path):
    # log_limit=20: level 1 holds 80 entries, 160 once the main level passes
    # 5,120; a third raw level comes once a quarter of the main level is
    # more than 16 x 160 (main > 10,240).
    rng = np.random.default_rng(21)
    fps = np.unique(rng.integers(0, 2**64, 41000, dtype=np.uint64))[:40000]
    rng.shuffle(fps)
    levels_seen = set()
    with Index.create(tmp_path / "d.ndx", k=3, expected_n=40000, background_compaction=False,
                      log_limit=20) as ix:
        for _, runs in grown(ix, fps, parts=400, steps=3, every=100, flip=5, stride=1999):
            main = [r for r in runs if levels.level_of(r) == levels.MAIN_LEVEL]
            assert len([r for r in main if not r.merge_into]) <= 1, runs
            levels_seen |= {r.level for r in runs if r not in main}
        assert 3 in levels_seen, levels_seen
        assert_settles(ix, set(fps.tolist()))


def test_record_spaces_keep_two_raw_levels():
    # A record space's runs at level 3 are its main level (level_of): a third
    # raw level there would be taken for main runs.
    big = 10**9
    assert levels.level_capacity(3, big, records=True) == 0
    assert levels.level_capacity(2, big, records=True) == big // 4
    assert levels.level_for(big // 8, 1, big, records=True) == 2
    assert levels.level_for(big // 8, 1, big) == 4  # tables: 4.1M, 32M, 250M above level 1
