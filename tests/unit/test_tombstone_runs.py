"""Tombstones in runs of their own (format 5, FORMAT.md [M3], 7.8, [Q4]).

A flush writes its removals as a new tombstone run instead of rewriting
every tombstone; a run holding a fingerprint the log adds back is
rewritten without it; the smallest runs merge when more than
TOMBSTONE_RUNS are left; outdated ones go.  Queries and len() equal brute
force throughout, and a file of format 4 keeps one run until upgraded.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from ndindex import Index, compaction, levels, records as rec
from ndindex.errors import CorruptionError
from ndindex.upgrade import upgrade
from ndindex.writer import put_header
from tests.oracle import check_queries, near

K = 3


def tomb_runs(ix) -> list:
    return list(ix._snapshot().tombstone_runs)


def flush_now(ix) -> None:
    ix._compactor._flush(ix._snapshot())


def remove_in_flushes(ix, gone: np.ndarray, flushes: int) -> None:
    """Remove gone in that many parts, each flushed: a tombstone run each (format 5)."""
    for part in np.array_split(gone, flushes):
        ix.remove(fingerprints=np.sort(part))
        flush_now(ix)


def assert_exact(ix, stored: np.ndarray, rng) -> None:
    stored = np.unique(stored)
    assert len(ix) == len(stored)
    queries = np.concatenate([near(rng, stored, 40, K), rng.integers(0, 2**64, 10, np.uint64)])
    check_queries(ix, stored, queries, K)


def random_fps(seed: int, n: int) -> np.ndarray:
    return np.unique(np.random.default_rng(seed).integers(0, 2**64, n, dtype=np.uint64))


@pytest.fixture
def built(tmp_path):
    """An index of 20,000 fingerprints, fully compacted: removals then need tombstones."""
    path = str(tmp_path / "t.ndx")
    fps = random_fps(1, 20_000)
    ix = Index.create(path, k=K, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30)
    ix.add(fps)
    ix.compact(full=True)
    yield ix, fps
    ix.close()


def test_each_flush_writes_its_removals_as_a_run_of_their_own(built):
    ix, fps = built
    rng = np.random.default_rng(2)
    assert ix._levels_tombstones and ix._header.read_version == rec.FORMAT_VERSION == 5
    stored = fps
    for part in np.array_split(rng.permutation(fps)[:2_000], 3):
        before = {r.run_id: r for r in tomb_runs(ix)}
        ix.remove(fingerprints=np.sort(part))
        flush_now(ix)
        runs = tomb_runs(ix)
        # The older runs are untouched (same ids); the new one holds exactly the removals.
        assert {r.run_id for r in runs[1:]} == set(before)
        new_fps, _ = ix._snapshot().tombstone_run_arrays(runs[0])
        assert np.array_equal(new_fps, np.sort(part))
        stored = np.setdiff1d(stored, part)
        assert_exact(ix, stored, rng)
    assert len(tomb_runs(ix)) == 3
    ix.verify()


def test_adding_back_rewrites_only_the_runs_that_hold_it(built):
    ix, fps = built
    rng = np.random.default_rng(3)
    first, second = fps[:500], fps[500:1000]
    ix.remove(fingerprints=first)
    flush_now(ix)
    ix.remove(fingerprints=second)
    flush_now(ix)
    newer, older = tomb_runs(ix)
    back = first[::7]
    ix.add(back)
    flush_now(ix)
    runs = tomb_runs(ix)
    ids = {r.run_id for r in runs}
    assert newer.run_id in ids and older.run_id not in ids and len(runs) == 2
    held = np.concatenate([ix._snapshot().tombstone_run_arrays(r)[0] for r in runs])
    assert not np.isin(back, held).any() and np.isin(np.setdiff1d(first, back), held).all()
    stored = np.concatenate([fps[1000:], back])
    assert_exact(ix, stored, rng)
    # Removed again: a tombstone once more, in the flush's new run.
    ix.remove(fingerprints=back[:10])
    flush_now(ix)
    assert_exact(ix, np.setdiff1d(stored, back[:10]), rng)
    ix.verify()


def test_the_smallest_runs_merge_and_outdated_ones_go(built):
    ix, fps = built
    rng = np.random.default_rng(4)
    gone = rng.permutation(fps)[:3_000]
    remove_in_flushes(ix, gone, 7)
    assert len(tomb_runs(ix)) == 7
    stored = np.setdiff1d(fps, gone)
    # The next compaction step merges the smallest runs (all fit the cap) into
    # one; what the index computed from them stands for the new run.
    union = ix._snapshot().tombstones
    assert ix._compactor.step()
    runs = tomb_runs(ix)
    assert len(runs) == 1 and runs[0].entries == len(gone)
    snap = ix._snapshot()
    memo, seq = snap._tombstone_memo, snap.state.log_first_seq
    assert memo.peek(snap.tombstone_runs, "arrays", seq)[0] is union
    assert np.array_equal(snap.tombstone_run_arrays(runs[0])[0], np.sort(gone))
    assert_exact(ix, stored, rng)
    # With 15% of the main runs removed, the tables are rewritten without
    # them; then no tombstone is needed any more, and the run goes.
    while ix._compactor.step():
        pass
    assert tomb_runs(ix) == []
    assert min(r.run_id for r in ix._snapshot().manifest.runs) > runs[0].run_id
    assert_exact(ix, stored, rng)
    ix.verify()


def test_tombstone_inputs():
    def run(entries):
        return rec.Run(rec.SPACE_TOMBSTONES, rec.KIND_TOMBSTONES, 0, 1, entries, 1)
    alive = lambda n: np.full(n, 100, np.uint32)  # noqa: E731
    # Few runs, none outdated: nothing to do.
    runs = [run(10), run(20), run(30), run(40)]
    assert levels.tombstone_inputs(runs, [alive(r.entries) for r in runs], 50, 1000) == []
    # Half or more outdated: rewritten, whatever the count.
    stamps = [alive(10), np.array([1] * 10 + [100] * 10, np.uint32), alive(30), alive(40)]
    assert levels.tombstone_inputs(runs, stamps, 50, 1000) == [1]
    # More than TOMBSTONE_RUNS: the smallest that fit the cap.
    runs = [run(n) for n in (5, 600, 10, 500, 20, 700)]
    stamps = [alive(r.entries) for r in runs]
    assert levels.tombstone_inputs(runs, stamps, 50, 1000) == [0, 2, 3, 4]
    # Not even the two smallest fit: left as they are ...
    runs = [run(n) for n in (900, 800, 950, 990, 999)]
    assert levels.tombstone_inputs(runs, [alive(r.entries) for r in runs], 50, 1000) == []
    # ... unless they are too many.
    runs = [run(900 + n) for n in range(4 * levels.TOMBSTONE_RUNS)]
    assert levels.tombstone_inputs(runs, [alive(r.entries) for r in runs], 50, 1000) == []
    runs = [run(900 + n) for n in range(4 * levels.TOMBSTONE_RUNS + 1)]
    chosen = levels.tombstone_inputs(runs, [alive(r.entries) for r in runs], 50, 1000)
    assert chosen == [0, 1]


def test_a_format_4_file_keeps_one_tombstone_run_until_upgraded(tmp_path):
    path = str(tmp_path / "v4.ndx")
    fps = random_fps(5, 20_000)
    rng = np.random.default_rng(5)
    with Index.create(path, k=K, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        header = dataclasses.replace(ix._header, read_version=4, write_version=4)
        ix._store.write(lambda wt: put_header(wt, header), sync=True)
    with Index.open(path, background_compaction=False, log_limit=1 << 30) as ix:
        assert not ix._levels_tombstones
        ix.add(fps)
        ix.compact(full=True)
        for part in np.array_split(fps[:1_500], 3):
            ix.remove(fingerprints=part)
            flush_now(ix)
            assert len(tomb_runs(ix)) == 1
        assert tomb_runs(ix)[0].entries == 1_500
        stored = fps[1_500:]
        assert_exact(ix, stored, rng)
        ix.verify()
    report = upgrade(path)
    assert report["upgraded"] and report["format"] == 5
    with Index.open(path, background_compaction=False, log_limit=1 << 30) as ix:
        assert ix._levels_tombstones
        remove_in_flushes(ix, stored[:1_000], 2)
        assert len(tomb_runs(ix)) == 2
        assert_exact(ix, stored[1_000:], rng)
        ix.verify()


def test_verify_rejects_several_tombstone_runs_in_a_format_4_file(built, tmp_path):
    ix, fps = built
    for part in (fps[:100], fps[100:200]):
        ix.remove(fingerprints=part)
        flush_now(ix)
    assert len(tomb_runs(ix)) == 2
    header = dataclasses.replace(ix._header, read_version=4, write_version=4)
    ix._store.write(lambda wt: put_header(wt, header), sync=True)
    path = ix.path
    ix.close()
    with Index.open(path, readonly=True) as ro:
        with pytest.raises(CorruptionError, match="2 tombstone runs in a file of format 4"):
            ro.verify()


def test_a_manifest_of_too_many_tombstone_runs_is_damage(built):
    ix, fps = built
    ix.remove(fingerprints=fps[:10])
    flush_now(ix)
    snap = ix._snapshot()
    (run,) = snap.tombstone_runs
    man = snap.manifest
    man.runs += [dataclasses.replace(run) for _ in range(rec.MAX_TOMBSTONE_RUNS)]
    from ndindex import reader
    with pytest.raises(CorruptionError, match="65 tombstone runs"):
        reader.Snapshot(ix._store, ix.plan, *ix._store.snapshot(),
                        prev=reader.Lineage(snap.state, man, None, None))


def test_queries_agree_whether_tombstones_are_held_or_looked_up(built):
    # A writer whose compaction has read the tombstones searches them in
    # memory (one search a candidate); a reader looks each run up in the file.
    from ndindex.reader import TombstoneMemo
    ix, fps = built
    rng = np.random.default_rng(6)
    gone = rng.permutation(fps)[:1_200]
    remove_in_flushes(ix, gone, 4)
    stored = np.setdiff1d(fps, gone)
    ix._tombstones = TombstoneMemo()
    ix._let_go_of_snapshot()
    snap = ix._snapshot()
    memo, seq = snap._tombstone_memo, snap.state.log_first_seq
    assert memo.peek(snap.tombstone_runs, "arrays", seq) is None
    assert_exact(ix, stored, rng)
    assert np.array_equal(ix._snapshot().tombstones, np.sort(gone))
    ix._let_go_of_snapshot()
    snap = ix._snapshot()
    held = snap._tombstone_memo.peek(snap.tombstone_runs, "arrays", snap.state.log_first_seq)
    assert held is not None and np.array_equal(held[0], np.sort(gone))
    assert_exact(ix, stored, rng)
    # Removed fingerprints stay hidden on both paths, exactly.
    for x in gone[:50].tolist():
        assert x not in ix and not ix.query(x, 0, keys=False)


def assert_held_union_exact(ix) -> None:
    """The writer's union of the tombstone runs and each table's sorted
    tombstones, extended flush by flush, equal what the runs hold now."""
    from ndindex import runs as rn
    snap = ix._snapshot()
    arrays = [rn.load_tombstones(snap.view, r) for r in snap.tombstone_runs]
    fps, stamps = rn.union_tombstones(arrays)
    assert np.array_equal(snap.tombstones, fps) and np.array_equal(snap.tombstone_stamps, stamps)
    for t, table in enumerate(ix.plan.tables):
        parts = snap.tombstone_table_parts(t)
        assert [len(p) for p in parts] == [len(a[0]) for a in arrays]
        for part, (run_fps, _) in zip(parts, arrays):
            assert np.array_equal(part, np.sort(table.apply(run_fps)))


def test_the_tombstones_held_follow_every_flush_and_merge(built):
    # The union is extended by each flush's new run, not made again; after a
    # merge of tombstone runs it may stand for the merged run, but a flush
    # then makes it anew, so that a tombstone the merge dropped hides
    # nothing added back.
    ix, fps = built
    rng = np.random.default_rng(8)
    gone = rng.permutation(fps)[:3_600]
    stored = np.setdiff1d(fps, gone)
    for part in np.array_split(gone[:3_000], 6):
        ix.remove(fingerprints=np.sort(part))
        flush_now(ix)
        assert_held_union_exact(ix)
    while ix._compactor.step():  # tombstone merges, then the tables rewritten without them
        pass
    back = gone[:1_500]
    ix.add(back)
    ix.remove(fingerprints=np.sort(gone[3_000:]))
    flush_now(ix)
    assert_held_union_exact(ix)
    stored = np.concatenate([stored, back])
    assert_exact(ix, stored, rng)
    for x in back[:50].tolist():
        assert x in ix


@pytest.mark.parametrize("seed", range(5))
def test_add_tombstones_is_the_union(seed):
    from ndindex import runs as rn
    rng = np.random.default_rng(seed)

    def run(n):
        fps = np.unique(rng.integers(0, 400, n).astype(np.uint64))
        return fps, rng.integers(1, 50, len(fps)).astype(np.uint32)

    union, more = run(int(rng.integers(0, 300))), run(int(rng.integers(0, 100)))
    kept = union[0].copy(), union[1].copy()
    got = rn.add_tombstones(union, more)
    want = rn.union_tombstones([union, more])
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert got[1].dtype == np.uint32
    # The union a snapshot holds is shared: it is never changed in place.
    assert np.array_equal(union[0], kept[0]) and np.array_equal(union[1], kept[1])


def carry_outdated_tombstones(ix, fps, monkeypatch, rng) -> tuple:
    """Bring ix to where its tombstone union stands for runs that no longer
    hold part of it (TombstoneMemo.carry); (the fingerprints of that part,
    every fingerprint removed)."""
    monkeypatch.setattr(compaction, "STEP_CHUNKS", 1)  # merges take several steps
    a, b = np.split(rng.permutation(fps)[:1_400], [1_200])
    remove_in_flushes(ix, a, 3)  # past TOMBSTONE_FRACTION: the tables merge
    assert ix._compactor.step()  # that merge's first step: its output is newer than a's
    assert any(r.merge_output for r in ix._snapshot().manifest.runs)
    remove_in_flushes(ix, b, 2)  # newer than the merge's output
    while ix._compactor.step():  # the five tombstone runs merge into one; the tables'
        pass                     # merge ends, a's tombstones are outdated and dropped
    runs = tomb_runs(ix)
    assert runs and ix._tombstones._carried
    left = np.concatenate([ix._snapshot().tombstone_run_arrays(r)[0] for r in runs])
    assert not np.isin(a, left).any() and np.isin(a, ix._snapshot().tombstones).all()
    return a, np.concatenate([a, b])


def test_a_flush_that_only_adds_back_does_not_leave_them_hidden(built, monkeypatch):
    # A merge of tombstone runs that drops outdated tombstones lets the
    # union it had stand for the runs it leaves (TombstoneMemo.carry): a
    # superset, which hides only what no run holds.  A later flush that
    # adds some of them back, and removes nothing, rewrites no tombstone
    # run, so the runs stay as they were; the superset then hid the added
    # fingerprints in their new run (and a remove() of one, which removes
    # only what it finds, was lost: tools/soak_oracle.py).
    ix, fps = built
    rng = np.random.default_rng(9)
    a, removed = carry_outdated_tombstones(ix, fps, monkeypatch, rng)
    back = a[:100]
    ix.add(back)
    flush_now(ix)
    for x in back.tolist():
        assert x in ix
    ix.remove(fingerprints=back[:10])
    stored = np.concatenate([np.setdiff1d(fps, removed), back[10:]])
    assert_exact(ix, stored, rng)


ADD_BACK_AND_FLUSH = """
import sys
import numpy as np
from ndindex import Index
with Index.open(sys.argv[1], background_compaction=False) as ix:
    ix.add(np.load(sys.argv[2]))
    ix.compact()
"""


def test_another_process_flushing_fingerprints_back_does_not_leave_them_hidden(
        built, monkeypatch, tmp_path):
    # The same, with the flush made by another process's compactor (the
    # compaction lease passes between writer processes): that process has
    # no carried union to drop.  tools/soak_oracle.py --writers 2 ended with
    # removed fingerprints stored: hidden here when their remove() came.
    ix, fps = built
    rng = np.random.default_rng(9)
    a, removed = carry_outdated_tombstones(ix, fps, monkeypatch, rng)
    back = a[:100]
    np.save(tmp_path / "back.npy", back)
    tombstones_before = [r.run_id for r in tomb_runs(ix)]
    subprocess.run([sys.executable, "-c", ADD_BACK_AND_FLUSH, ix.path,
                    str(tmp_path / "back.npy")], check=True, timeout=120)
    snap = ix._snapshot()
    assert snap.state.log_ops == 0 and [r.run_id for r in snap.tombstone_runs] == tombstones_before
    for x in back.tolist():
        assert x in ix
    assert ix.remove(fingerprints=back[:10]) == 10
    stored = np.concatenate([np.setdiff1d(fps, removed), back[10:]])
    assert_exact(ix, stored, rng)
