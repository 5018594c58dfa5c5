"""Index behaviour against a brute-force oracle, in every state the file can be in.

The states: everything in the log; one run per table; several runs (flushes
not yet merged); a merge stopped half way (inputs above the cursor, the
output below it); one Huffman run after a full compaction; reopened.
"""

import errno
import os
import subprocess
import sys
import textwrap
import time
from unittest import mock

import numpy as np
import pytest

from ndindex import chunks as ch, codec, compaction, levels, locks, plan as plans, records as rec, \
    runs as rn
from ndindex.errors import ClosedError, FormatError
from ndindex.index import Index, Match
from tests.conftest import level0_flush_target, wait_for
from tests.killing import killed_at, reader_parked
from tests.oracle import brute_force, check_queries, clustered, near


@pytest.fixture
def path(tmp_path):
    return tmp_path / "test.ndx"


@pytest.fixture
def small_steps(monkeypatch):
    """Small chunks, merged one at a time: small tests see half-done merges."""
    monkeypatch.setattr(compaction, "STEP_CHUNKS", 1)
    monkeypatch.setattr(ch, "CHUNK_MAX_BLOCKS", 1)


def flush(ix):
    """Turn the log into one new run per table, merging nothing."""
    with mock.patch.object(levels, "flush_target", level0_flush_target):
        ix._compactor._flush(ix._snapshot())


def runs_per_table(ix):
    return [len(r) for r in ix._snapshot().table_runs]


def put_in_state(ix, fps, state):
    """Store fps in the index, leaving it in the named state."""
    if state == "log":
        ix.add(fps)
        return
    if state == "one-run":
        ix.add(fps)
        ix.compact()
        assert set(runs_per_table(ix)) == {1}
        return
    if state == "several-runs":
        for part in np.array_split(fps, 4):
            ix.add(part)
            flush(ix)
        assert min(runs_per_table(ix)) == 4
        return
    if state == "mid-merge":
        for part in np.array_split(fps, 3):
            ix.add(part)
            flush(ix)
        for _ in range(3):
            ix._compactor.step()
        snap = ix._snapshot()
        assert any(r.merge_into for r in snap.manifest.runs), "no merge in progress"
        return
    if state == "main":
        ix.add(fps)
        ix.compact(full=True)
        assert all(r[0].kind == rn.KIND_HUFFMAN for r in ix._snapshot().table_runs)
        return
    raise ValueError(state)


STATES = ["log", "one-run", "several-runs", "mid-merge", "main"]


@pytest.fixture(params=["tree", "listed", "memory"])
def listing(request, monkeypatch):
    """How queries find a run's values: through the chunks tree, through run
    directories listed at once, or (raw runs) held in memory, read as soon
    as a snapshot's kernel asks for them (the kernel's three probe paths;
    Huffman runs are listed in the third)."""
    from ndindex import dircache, reader
    monkeypatch.setattr(reader, "DIRECTORY_COLD_CHUNKS", 0 if request.param == "tree" else 1 << 30)
    monkeypatch.setattr(reader, "DIRECTORY_MAX_CHUNKS", 0 if request.param == "tree" else 1 << 30)
    if request.param == "memory":
        monkeypatch.setattr(dircache.DirectoryCache, "warm", True)
        monkeypatch.setattr(dircache.DirectoryCache, "hold_later",
                            lambda cache, snap, run: cache._do(snap, run, "hold"))
    else:
        monkeypatch.setattr(dircache, "MEMORY_RUN_MAX_ENTRIES", 0)
    return request.param


def skewed(rng, n):
    """n fingerprints whose 16-bit blocks take 40 values each, 1,600 apart: in
    every table most of the key space is empty and a few spots are crowded
    (the directories' search guides fall back to their binary search)."""
    blocks = rng.integers(0, 40, size=(n, 4), dtype=np.uint64) * np.uint64(1600)
    blocks[:, 0] += rng.integers(0, 3, size=n, dtype=np.uint64)  # distinct enough
    return (blocks[:, 0] | blocks[:, 1] << np.uint64(16) | blocks[:, 2] << np.uint64(32)
            | blocks[:, 3] << np.uint64(48))


@pytest.mark.parametrize("coding", sorted(codec.CODING_NAMES), ids=codec.CODING_NAMES.get)
@pytest.mark.parametrize("data", ["random", "clustered", "skewed"])
@pytest.mark.parametrize("state", STATES)
def test_queries_match_brute_force(path, data, state, small_steps, listing, coding):
    rng = np.random.default_rng(1)
    if data == "random":
        fps = rng.integers(0, 2**64, size=30000, dtype=np.uint64)
    elif data == "skewed":
        fps = skewed(rng, 30000)
    else:
        fps = clustered(rng, 400, 60, 4)
    with Index.create(path, k=3, expected_n=len(fps), background_compaction=False,
                      coding=coding) as ix:
        put_in_state(ix, fps, state)
        queries = np.concatenate([near(rng, fps, 150, 3), rng.integers(0, 2**64, 50, dtype=np.uint64)])
        check_queries(ix, fps, queries, 3)
        check_queries(ix, fps, queries[:40], 1)
        # Exact lookups probe q alone, not its bucket: stored values and others.
        check_queries(ix, fps, np.concatenate([fps[::499], fps[::997] ^ np.uint64(1),
                                               queries[:40]]), 0)
        assert len(ix) == len(np.unique(fps))
        ix.verify()
    with Index.open(path, background_compaction=False) as ix:
        check_queries(ix, fps, queries[:60], 3)


def test_every_compaction_step_keeps_answers(path, small_steps, monkeypatch, listing):
    # Small flushes and levels: many merges, each stopped after every step.
    # Listed, a merge output's directory is extended step by step (chunks
    # of two blocks: one block would fit inside a leaf page, and a directory
    # of such chunks serves one snapshot only).
    monkeypatch.setattr(levels, "LEVEL_RATIO", 2)
    monkeypatch.setattr(levels, "SMALL_LEVEL_RATIO", 2)
    monkeypatch.setattr(ch, "CHUNK_MAX_BLOCKS", 2)
    from ndindex import _core
    extended = []
    real = _core.run_directory

    def counting(*args):
        extended.append(len(args) > 8 and args[8] is not None)
        return real(*args)

    monkeypatch.setattr(_core, "run_directory", counting)
    rng = np.random.default_rng(2)
    fps = clustered(rng, 300, 40, 4)
    queries = near(rng, fps, 60, 3)
    stored = np.empty(0, np.uint64)
    with Index.create(path, k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1500) as ix:
        for part in np.array_split(fps, 8):
            ix.add(part)
            stored = np.concatenate([stored, part])
            steps = 0
            while ix._compactor.step(force_flush=True):
                steps += 1
                check_queries(ix, stored, queries[:25], 3)
            assert steps >= 1
        assert len(ix) == len(np.unique(fps))
        assert max(r.level for r in ix._snapshot().manifest.runs) >= 2
        ix.verify()
    assert any(extended) == (listing != "tree")


@pytest.mark.parametrize("state", ["one-run", "main"])
def test_more_matches_in_a_block_than_a_probe_lane_holds(path, listing, state):
    # Every value within 3 bits of q in its low 16 bits (697 of them): in a
    # table that keeps those bits low they are one dense block, more matches
    # than the kernel's interleaved probe keeps per lane (256), which hands
    # such a block to the one-lane probe.
    import itertools
    rng = np.random.default_rng(3)
    q = int(rng.integers(0, 2**64, dtype=np.uint64))
    masks = [sum(1 << b for b in bits) for r in range(4) for bits in itertools.combinations(range(16), r)]
    fps = np.concatenate([np.array([q ^ m for m in masks], dtype=np.uint64),
                          rng.integers(0, 2**64, 20000, dtype=np.uint64)])
    with Index.create(path, k=3, expected_n=len(fps), background_compaction=False) as ix:
        put_in_state(ix, fps, state)
        queries = np.array([q, q ^ 1, q ^ (1 << 63)], dtype=np.uint64)
        check_queries(ix, fps, queries, 3)
        assert len(ix.query(q, 3)) >= len(masks)


def test_log_additions_across_commits_fold_and_match_brute_force(path, monkeypatch):
    # Each commit's additions join the snapshot's small recent log, which is
    # folded into the main one now and then: queries between commits see
    # every addition, before and after each fold, and removals rebuild both.
    from ndindex import arrays
    monkeypatch.setattr(arrays, "RECENT_MIN", 40)
    rng = np.random.default_rng(4)
    fps = clustered(rng, 60, 20, 4)
    queries = near(rng, fps, 20, 3)
    with Index.create(path, k=3, expected_n=len(fps), background_compaction=False) as ix:
        folds, shared, before = 0, 0, None
        for i, part in enumerate(np.array_split(fps, 30)):
            ix.add(part)
            check_queries(ix, fps[:sum(len(p) for p in np.array_split(fps, 30)[:i + 1])],
                          queries[:5], 3)
            log, recent, aid = ix._snapshot().log_tables[0]
            folds += len(recent) == 0
            if before is not None and log is before[0]:
                # The commit left log as it was: its kernel search aid is
                # the last snapshot's, not built again over the whole log.
                assert aid is before[1]
                shared += 1
            before = (log, aid)
        assert 0 < folds < 30 and shared > 10
        ix.remove(fingerprints=fps[:100])
        assert len(ix._snapshot().log_tables[0][1]) == 0
        check_queries(ix, fps[100:], queries, 3)


@pytest.mark.parametrize("background", [True, False])
def test_close_flushes_a_long_log_with_background_compaction(path, background, monkeypatch):
    # As SQLite checkpoints its WAL on close: the next open's first query
    # then reads no log.  Opted out of background compaction, close writes
    # nothing but the commits.
    monkeypatch.setattr(compaction, "FLUSH_IDLE_SECONDS", 3600.0)
    monkeypatch.setattr(compaction, "CLOSE_FLUSH_OPS", 1000)
    fps = np.random.default_rng(5).integers(0, 2**64, 3000, dtype=np.uint64)
    Index.create(path, k=3, expected_n=len(fps)).close()
    with Index.open(path, background_compaction=background) as ix:
        ix.add(fps)
    with Index.open(path, readonly=True) as ix:
        assert ix._snapshot().state.log_ops == (0 if background else len(fps))
        check_queries(ix, fps, fps[:20] ^ np.uint64(5), 3)


def test_a_log_of_many_small_commits_is_flushed_however_few_its_operations(path, monkeypatch):
    # A writer of one item a commit, never idle a second, or a process of a
    # commit or two each, left up to log_limit records: a fresh open's first
    # query reads each one (20,000 made it 0.2 s).
    monkeypatch.setattr(compaction, "FLUSH_IDLE_SECONDS", 3600.0)
    monkeypatch.setattr(compaction, "FLUSH_RECORDS", 40)
    fps = np.random.default_rng(7).integers(0, 2**64, 120, dtype=np.uint64)
    Index.create(path, k=3, expected_n=1000).close()
    with Index.open(path, background_compaction=False) as ix:
        for fp in fps[:39].tolist():
            ix.add(fp)
        assert ix._snapshot().state.log_records == 39
        assert ix._compactor.step(force_flush=False) is False      # below: nothing due
        ix.add(int(fps[39]))
        assert ix._compactor.step(force_flush=False) is True       # at it: a flush
        assert ix._snapshot().state.log_records == 0
    # close() flushes such a log (with background compaction on), far below
    # CLOSE_FLUSH_OPS operations; a shorter one stays for the next writer.
    for batch, left in ((fps[40:45], 5), (fps[45:120], 0)):
        with Index.open(path) as ix:
            ix._compactor.close()              # the background thread does nothing here
            for fp in batch.tolist():
                ix.add(fp)
        with Index.open(path, readonly=True) as ix:
            assert ix._snapshot().state.log_records == left
            check_queries(ix, fps[:45 if left else 120], fps[:20] ^ np.uint64(5), 3)


def test_a_log_of_large_operations_is_flushed_by_its_bytes(path, monkeypatch):
    # A document's operations carry its record (1-2 KB), a fingerprint's 8
    # bytes: log_limit operations of documents were tens of MB, which every
    # reader parsed at its first query (110 ms at 60,000 operations).
    monkeypatch.setattr(compaction, "FLUSH_IDLE_SECONDS", 3600.0)
    monkeypatch.setattr(compaction, "FLUSH_LOG_BYTES", 256 * 1024)
    fps = np.random.default_rng(8).integers(0, 2**64, 2000, dtype=np.uint64)
    keys = [f"{i:04d}" + "k" * 300 for i in range(2000)]
    Index.create(path, k=3, expected_n=10_000).close()
    with Index.open(path, background_compaction=False) as ix:
        ix.add(fps[:500], keys=keys[:500])              # about 160 KB of log
        snap = ix._snapshot()
        assert snap.view.trees["log"].pages * snap.view.psize < compaction.FLUSH_LOG_BYTES
        assert ix._compactor.step(force_flush=False) is False
        ix.add(fps[500:1000], keys=keys[500:1000])      # past it, at 1,000 operations
        assert ix._snapshot().state.log_ops == 2000 < ix.log_limit
        assert ix._compactor.step(force_flush=False) is True
        assert ix._snapshot().state.log_records == 0
        assert ix.keys(int(fps[700])) == (keys[700],)
    with Index.open(path) as ix:                          # close() flushes such a log too
        ix._compactor.close()
        ix.add(fps[1000:], keys=keys[1000:])
    with Index.open(path, readonly=True) as ix:
        assert ix._snapshot().state.log_records == 0 and len(ix) == 2000
        assert ix.keys(int(fps[1999])) == (keys[1999],)


def test_a_failed_flush_at_close_loses_nothing(path, monkeypatch):
    from ndindex.errors import CapacityError
    monkeypatch.setattr(compaction, "FLUSH_IDLE_SECONDS", 3600.0)
    monkeypatch.setattr(compaction, "CLOSE_FLUSH_OPS", 1000)

    def full(self):
        raise CapacityError("no space left on device")

    monkeypatch.setattr(compaction.Compactor, "flush_log", full)
    fps = np.random.default_rng(6).integers(0, 2**64, 3000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=len(fps)) as ix:
        ix.add(fps)
    with Index.open(path, readonly=True) as ix:
        assert ix._snapshot().state.log_ops == len(fps)
        assert len(ix) == len(fps)


def test_backpressure_ends_its_wait_a_budget_after_the_commit_began(path, monkeypatch):
    # A writer far behind the compactor waits at the stop line, but never
    # past STOP_WAIT_SECONDS after its commit began: a slow commit leaves
    # less to wait.
    monkeypatch.setattr(compaction, "STOP_WAIT_SECONDS", 1.0)
    with Index.create(path, k=3, expected_n=1000) as ix:
        c = ix._compactor
        c.log_ops = 10**9
        state = ix._snapshot().state
        t = time.monotonic()
        c.throttle(state, ix.log_limit, t - 0.9)
        late = time.monotonic() - t
        t = time.monotonic()
        c.throttle(state, ix.log_limit, t)
        fresh = time.monotonic() - t
        assert late < 0.5 and fresh >= 0.9, (late, fresh)


def _hold_lease(path):
    """Take the compaction lease as another process would: from a descriptor of our own."""
    import fcntl
    fd = os.open(path, os.O_RDWR)
    assert locks.byte_lock(fd, locks.LEASE_BYTE, fcntl.F_WRLCK)
    return fd


def _level0_runs(ix):
    man = ix._snapshot().manifest
    return max(sum(1 for r in man.of(t) if levels.level_of(r) < levels.MAIN_LEVEL)
               for t in range(len(ix.plan.tables)))


ADD_AND_COMPACT = """
import sys
import numpy as np
from ndindex import Index
with Index.open(sys.argv[1], background_compaction=False) as ix:
    ix.add(np.arange(5000, 6000, dtype=np.uint64))
    ix.compact()
"""


def test_backpressure_counts_the_runs_another_process_merged(path, monkeypatch):
    # A writer's backpressure figures came only from its own compaction
    # commits.  After another process (holding the lease) merged the runs,
    # a writer that last counted STOP_RUNS of them waited STOP_WAIT_SECONDS
    # on every add() for as long as it did not get the lease.
    monkeypatch.setattr(compaction, "IDLE_WAIT_SECONDS", 60.0)
    with Index.create(path, k=3, expected_n=10_000, background_compaction=False) as ix:
        ix.add(np.arange(1, 3000, dtype=np.uint64))
    with Index.open(path) as a:
        c = a._compactor
        c.level0_runs = compaction.STOP_RUNS  # as its last own commit counted
        c._runs_generation = a._snapshot().state.manifest_generation
        subprocess.run([sys.executable, "-c", ADD_AND_COMPACT, path], check=True, timeout=120)
        fd = _hold_lease(path)
        try:
            a.add([7777])
            assert c.level0_runs == _level0_runs(a) < compaction.SLOWDOWN_RUNS
            assert c._runs_generation == a._snapshot().state.manifest_generation
            assert c.log_ops == a._snapshot().state.log_ops
        finally:
            os.close(fd)


def test_backpressure_wait_follows_another_processs_compaction(path, monkeypatch):
    # A writer waiting at the stop line while another process holds the
    # lease reads the file's figures as it waits: no event of its own
    # compactor would end the wait once that process caught up.
    monkeypatch.setattr(compaction, "IDLE_WAIT_SECONDS", 60.0)
    monkeypatch.setattr(compaction, "STOP_WAIT_SECONDS", 8.0)
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        ix.add(np.arange(1, 500, dtype=np.uint64))
    with Index.open(path) as a:
        c = a._compactor
        fd = _hold_lease(path)
        try:
            a.add([7777])  # wakes the compactor, which finds the lease taken
            wait_for(lambda: c._lease_elsewhere, seconds=20)
            c.log_ops = 10**9  # as last seen, before the other process flushed
            t = time.monotonic()
            c.throttle(a._snapshot().state, a.log_limit, t)
            assert time.monotonic() - t < 4.0
            assert c.log_ops == a._snapshot().state.log_ops
        finally:
            os.close(fd)


def test_background_compaction_waits_for_a_write_after_open(path, monkeypatch):
    # Owed work (a log to flush) waits for the first write, or the idle
    # wait: an open for a few queries has no merge running beside them.
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        ix.add(np.arange(1, 500, dtype=np.uint64))
    monkeypatch.setattr(compaction, "IDLE_WAIT_SECONDS", 60.0)
    with Index.open(path, log_limit=100) as ix:  # the log is due a flush
        time.sleep(0.3)
        assert ix._compactor.steps == 0 and ix._snapshot().state.log_ops == 499
        ix.add([12345])
        deadline = time.monotonic() + 20
        while ix._compactor.steps == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ix._compactor.steps > 0


def test_results_survive_reopen(path):
    rng = np.random.default_rng(2)
    fps = clustered(rng, 200, 30, 3)
    with Index.create(path, k=3, expected_n=10000, log_limit=2000) as ix:
        ix.add(fps[:3000])
        ix.add(fps[3000:])
    with Index.open(path) as ix:
        check_queries(ix, fps, near(rng, fps, 100, 3), 3)
        assert len(ix) == len(np.unique(fps))


def test_add_never_compacts(path):
    # The log grows past log_limit: without the background thread nothing merges it.
    rng = np.random.default_rng(3)
    with Index.create(path, k=3, expected_n=10000, log_limit=1000,
                      background_compaction=False) as ix:
        for _ in range(5):
            ix.add(rng.integers(0, 2**64, 600, dtype=np.uint64))
        assert ix.stats()["log_entries"] == 3000
        assert runs_per_table(ix) == [0] * len(ix.plan.tables)
        ix.compact()
        s = ix.stats()
        assert s["log_entries"] == 0 and s["fingerprints"] == 3000


def test_background_compaction_flushes_and_merges(path):
    rng = np.random.default_rng(3)
    fps = rng.integers(0, 2**64, 6000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=10000, log_limit=1000) as ix:
        for part in np.array_split(fps, 12):
            ix.add(part)
        deadline = time.monotonic() + 20
        while ix.stats()["log_entries"] >= 1000 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ix.stats()["log_entries"] < 1000, "the background thread flushed nothing"
        assert ix._compactor.steps > 0
        check_queries(ix, fps, near(rng, fps, 50, 3), 3)


def test_equal_fingerprints_share_an_entry_and_keep_all_keys(path):
    with Index.create(path, k=2, expected_n=100) as ix:
        ix.add([7, 7, 9], keys=["a", "b", b"c"])
        ix.add([7], keys=["d"])
        ix.compact()
        assert ix.stats()["fingerprints"] == 2
        assert ix.query(7, 0) == [Match(7, 0, ("a", "b", "d"))]
        assert ix.keys(7) == ("a", "b", "d")
        assert ix.keys(9) == (b"c",)
        assert [m.fingerprint for m in ix.query(7, 2)] == [7]
        assert len(ix) == 2


@pytest.mark.parametrize("state", STATES)
def test_remove_by_fingerprint_and_by_key(path, state, small_steps):
    rng = np.random.default_rng(4)
    fps = np.unique(clustered(rng, 50, 20, 3))
    with Index.create(path, k=3, expected_n=2000, background_compaction=False) as ix:
        put_in_state(ix, fps, state)
        for i in range(0, len(fps), 500):
            part = fps[i:i + 500]
            # Keys on fingerprints already stored: the key records join them.
            ix.add(part, keys=[f"k{j}" for j in range(i, i + len(part))])
        gone = fps[:100]
        assert ix.remove(fingerprints=gone) == 100
        assert ix.remove(keys=["k100", "k101"]) == 2
        live = fps[102:]
        queries = near(rng, fps, 100, 3)
        check_queries(ix, live, queries, 3)
        assert ix.keys(int(fps[0])) == () and ix.keys(int(fps[200])) == ("k200",)
        ix.compact()
        check_queries(ix, live, queries, 3)
        ix.compact(full=True)
        check_queries(ix, live, queries, 3)
        assert ix.stats()["removed_pending"] == 0
        assert len(ix) == len(live)
        assert ix.keys(int(fps[0])) == () and ix.keys(int(fps[200])) == ("k200",)
        ix.verify()


def test_remove_one_of_two_keys_keeps_fingerprint(path):
    with Index.create(path, k=1, expected_n=100) as ix:
        ix.add([5, 5], keys=["x", "y"])
        assert ix.remove(keys="x") == 0
        assert 5 in ix and ix.keys(5) == ("y",)
        assert ix.remove(keys="y") == 1
        assert 5 not in ix


def test_one_fingerprint_takes_one_key_and_many_take_a_sequence(path):
    with Index.create(path, k=1, expected_n=100) as ix:
        assert ix.add(5, keys="https://example.org/") == 1
        assert ix.add(np.uint64(6), keys=b"raw") == 1
        assert ix.keys(5) == ("https://example.org/",) and ix.keys(6) == (b"raw",)
        # A str for many fingerprints would be one key a character: refused.
        with pytest.raises(TypeError, match="one key per fingerprint"):
            ix.add([7, 8], keys="ab")
        with pytest.raises(TypeError, match="one key per fingerprint"):
            ix.add([7], keys="a")
        assert 7 not in ix and len(ix) == 2


def test_remove_unknown_fingerprints_counts_nothing(path):
    with Index.create(path, k=1, expected_n=100, background_compaction=False) as ix:
        ix.add([1, 2])
        ix.compact()
        assert ix.remove(fingerprints=[3, 4, 1]) == 1
        assert ix.stats()["removed_pending"] == 0  # still in the log
        ix.compact()
        assert ix.stats()["removed_pending"] == 1  # a tombstone hides 1 in the older run
        assert 1 not in ix and 2 in ix


def test_a_tombstone_no_run_needs_is_dropped(path):
    with Index.create(path, k=1, expected_n=100, background_compaction=False) as ix:
        ix.add([1, 2])
        ix.remove(fingerprints=[1])  # both in the log: 1 never reaches a run
        ix.compact()
        assert ix.stats()["removed_pending"] == 0 and 1 not in ix and len(ix) == 1


def test_queries_look_tombstones_up_without_reading_them_whole(path, monkeypatch, listing):
    # The tombstone run spans many chunks; queries find what it hides by
    # looking each candidate up (first, last and middle values of chunks,
    # near values of removed ones), never by reading the run whole.
    monkeypatch.setattr(ch, "TOMBSTONES_PER_CHUNK", 7)
    rng = np.random.default_rng(12)
    fps = np.unique(clustered(rng, 600, 5, 3))
    gone = fps[::5]
    with Index.create(path, k=3, expected_n=3000, background_compaction=False) as ix:
        ix.add(fps)
        ix.compact(full=True)
        ix.remove(fingerprints=gone)
        flush(ix)
        assert ix._snapshot().tombstone_runs[0].chunks == -(-len(gone) // 7)

    def refuse(*a, **k):
        raise AssertionError("the tombstone run was read whole")
    load_tombstones = rn.load_tombstones
    monkeypatch.setattr(rn, "load_tombstones", refuse)
    live = np.setdiff1d(fps, gone)
    queries = np.concatenate([gone[:20], gone[6::7][:20], gone[-1:], near(rng, gone, 60, 2),
                              near(rng, live, 40, 3)])
    with Index.open(path, background_compaction=False) as ix:
        check_queries(ix, live, queries, 3)
        with ix.transaction():
            assert ix.check_and_add(int(gone[7]), k=0) == [] and int(gone[7]) in ix
        monkeypatch.setattr(rn, "load_tombstones", load_tombstones)  # counting reads them
        assert ix.stats()["removed_pending"] == len(gone) and len(ix) == len(live) + 1


@pytest.mark.parametrize("compact_between", [False, True])
def test_readd_after_remove_revives(path, compact_between):
    with Index.create(path, k=1, expected_n=100, background_compaction=False) as ix:
        ix.add([11, 12])
        ix.compact()
        ix.remove(fingerprints=[11])
        if compact_between:
            ix.compact()
        assert 11 not in ix
        ix.add([11])
        assert 11 in ix
        ix.compact()
        assert 11 in ix and len(ix) == 2
        ix.compact(full=True)
        assert 11 in ix and len(ix) == 2 and ix.stats()["removed_pending"] == 0


@pytest.mark.parametrize("compact_between", [False, True])
def test_remove_readd_remove_keeps_one_tombstone(path, compact_between):
    # The second removal meets the first one's tombstone at the flush: one
    # entry with the newer stamp (two made the tombstone chunk unreadable).
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        ix.add(np.arange(1, 300, dtype=np.uint64) * 0x9E3779B97F4A7C15)
        ix.compact()
        x = int(ix.fingerprints()[7])
        ix.remove(fingerprints=[x])
        if compact_between:
            ix.compact()
        ix.add([x])
        ix.remove(fingerprints=[x])
        ix.compact()
        ix.verify()
        assert x not in ix and ix.query(x, 3) == [] and len(ix) == 298
        ix.add([x])
        ix.compact()
        assert x in ix and len(ix) == 299
        ix.verify()


def test_check_and_add(path):
    with Index.create(path, k=3, expected_n=100) as ix:
        assert ix.check_and_add(0b1111, key="first") == []
        found = ix.check_and_add(0b0111, key="second")
        assert [(m.fingerprint, m.distance, m.keys) for m in found] == [(0b1111, 1, ("first",))]
        assert 0b0111 not in ix
        # keys=False leaves the keys out, in and out of a transaction, as query does.
        assert ix.check_and_add(0b0011, keys=False) == [Match(0b1111, 2, ())]
        with ix.transaction():
            assert ix.check_and_add(0b0011, keys=False) == [Match(0b1111, 2, ())]
            assert ix.check_and_add(0b0011) == [Match(0b1111, 2, ("first",))]


def test_k_above_index_maximum_is_an_error(path):
    with Index.create(path, k=2, expected_n=100) as ix:
        with pytest.raises(ValueError, match="k=3 is outside 0..2"):
            ix.query(1, 3)
        with pytest.raises(ValueError):
            ix.query_many([1, 2], 5)


def test_explicit_plan_is_stored(path):
    plan = plans.example_3_1(10)
    with Index.create(path, k=3, expected_n=1000, plan=plan) as ix:
        ix.add(np.arange(1000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    with Index.open(path) as ix:
        assert ix.plan == plan
        assert len(ix.stats()["tables"]) == 10


def test_full_compaction_makes_one_huffman_run_near_the_bound(path):
    rng = np.random.default_rng(6)
    with Index.create(path, k=3, expected_n=100, background_compaction=False) as ix:
        for _ in range(4):
            ix.add(rng.integers(0, 2**64, 5000, dtype=np.uint64))
            flush(ix)
        ix.compact(full=True)
        snap = ix._snapshot()
        assert all(len(r) == 1 and r[0].kind == rn.KIND_HUFFMAN for r in snap.table_runs)
        bits = ix.stats()["tables"][0]["bits_per_fingerprint"]
        assert bits < 1.06 * ix.stats()["entropy_bound_bits"]


def test_stats_fields(path):
    with Index.create(path, k=3, expected_n=1000) as ix:
        ix.add(np.arange(1, 500, dtype=np.uint64) << np.uint64(40))
        ix.compact()
        s = ix.stats()
        assert s["fingerprints"] == 499 and s["log_entries"] == 0
        assert len(s["tables"]) == len(ix.plan.tables)
        assert s["file_bytes"] > 0 and "table 0" in s["plan"]
        assert s["tables"][0]["runs"] == 1 and s["tables"][0]["bytes"] > 0


def test_stats_names_an_open_read_and_how_far_behind_it_is(path):
    # LMDB reuses no page freed after the oldest open read began.
    import gc
    fps = np.random.default_rng(3).integers(0, 2**64, 200, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        ix.add(fps[:100])
        held = ix._snapshot()                 # a read open on this commit
        for part in np.array_split(fps[100:], 3):
            ix.add(part)
        s = ix.stats()
        assert {"pid": os.getpid(), "txnid": held.txnid} in s["readers"]
        assert s["oldest_reader_lag"] == ix._latest_txnid() - held.txnid >= 3
        del held
        gc.collect()
        s = ix.stats()
        assert s["oldest_reader_lag"] == 0 and s["readers"] == [
            {"pid": os.getpid(), "txnid": ix._latest_txnid()}]


def test_stats_frees_the_slot_of_a_reader_killed_inside_its_read(path):
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        ix.add(np.arange(1, 100, dtype=np.uint64) << np.uint64(40))
        with reader_parked(path) as holder:
            ix.add(np.arange(100, 110, dtype=np.uint64) << np.uint64(40))
            assert holder.pid in {r["pid"] for r in ix.stats()["readers"]}
            holder.kill()                  # dies inside its read: its slot stays
            holder.wait(timeout=30)
            s = ix.stats()
            assert holder.pid not in {r["pid"] for r in s["readers"]}
            assert s["oldest_reader_lag"] == 0


def test_vacuum_into_drops_free_pages(path, tmp_path):
    rng = np.random.default_rng(7)
    fps = rng.integers(0, 2**64, 40000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=40000, background_compaction=False) as ix:
        ix.add(fps)
        ix.compact()
        ix.add(rng.integers(0, 2**64, 2000, dtype=np.uint64))
        ix.compact(full=True)  # the old runs become free pages
        dest = tmp_path / "copy.ndx"
        size = ix.vacuum_into(dest)
        assert size <= ix.stats()["file_bytes"]
        with pytest.raises(FileExistsError):
            ix.vacuum_into(dest)
    with Index.open(dest) as copy:
        copy.verify()
        assert len(copy) == len(np.unique(fps)) + 2000


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_a_program_that_exits_without_closing_its_writer_leaves_what_it_wrote_readable(
        tmp_path, durability):
    """Closed at exit, as Python flushes the files a program left open: a
    normal-durability journal not yet checkpointed was read by no other
    process (readers read no journal) until a writer opened the file again."""
    path = tmp_path / "left.ndx"
    code = textwrap.dedent(f"""
        import numpy as np, ndindex
        ix = ndindex.Index.create({str(path)!r}, durability={durability!r}, log_limit=500)
        rng = np.random.default_rng(3)
        for _ in range(20):
            ix.add(rng.integers(0, 2**64, 1000, dtype=np.uint64))
        print("exiting", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "exiting\n"
    assert done.stderr == ""        # no compaction step failing as the merge pool shut down
    assert sorted(os.listdir(tmp_path)) == ["left.ndx", "left.ndx-lock"]    # no journal left
    with Index.open(path, readonly=True) as ix:
        assert len(ix) == 20000


def test_the_exits_close_does_not_deadlock_with_the_checkpoint_thread(tmp_path):
    """The exit's close holds the writer lock; the checkpoint thread takes it
    every CHECKPOINT_SECONDS and close() joins it: a compactor slow to stop
    let the thread block on the lock, and the join then waited for ever."""
    path = tmp_path / "slow.ndx"
    code = textwrap.dedent(f"""
        import time, ndindex
        from ndindex import compaction
        real = compaction.Compactor.close
        def slow_close(self):
            time.sleep(0.5)       # several checkpoint ticks
            real(self)
        compaction.Compactor.close = slow_close
        ix = ndindex.Index.create({str(path)!r}, durability="normal")
        ix.add([1, 2, 3])
        print("exiting", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "exiting\n" and done.stderr == ""
    with Index.open(path, readonly=True) as ix:
        assert sorted(ix.fingerprints().tolist()) == [1, 2, 3]


def test_an_exit_with_a_daemon_thread_inside_a_transaction_neither_hangs_nor_loses(tmp_path):
    """The exit's close waits for no daemon thread that holds the writer:
    the index is left as a killed process leaves it (its journal replayed
    by the next writer), and the transaction never committed is not there."""
    path = tmp_path / "held.ndx"
    code = textwrap.dedent(f"""
        import threading, ndindex
        ix = ndindex.Index.create({str(path)!r}, durability="normal")
        ix.add([1, 2, 3])
        inside = threading.Event()
        def stuck():
            with ix.transaction():
                ix.add([4])
                inside.set()
                threading.Event().wait()        # for ever
        threading.Thread(target=stuck, daemon=True).start()
        inside.wait()
        print("exiting", flush=True)
    """)
    t = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "exiting\n" and done.stderr == ""
    assert time.monotonic() - t < 30
    with Index.open(path) as ix:                # replays the journal
        assert sorted(ix.fingerprints().tolist()) == [1, 2, 3]


def test_compaction_builds_on_its_own_thread_once_the_merge_pool_refuses_work(path):
    """At interpreter exit concurrent.futures shuts the merge pool down before
    the program's threads end; their writes go on, and so must compaction."""
    fps = np.random.default_rng(9).integers(0, 2**64, 6000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=6000, background_compaction=False) as ix:
        ix.add(fps[:3000])
        ix.compact()
        if ix._compactor._pool is None:
            pytest.skip("one core: compaction has no merge pool")
        ix._compactor._pool.shutdown(wait=True)
        ix.add(fps[3000:])
        ix.compact()
        assert ix.stats()["compaction_error"] is None
        assert len(ix) == 6000 and ix.verify()["table_entries"] == 6000
        check_queries(ix, fps, fps[::500] ^ np.uint64(5), 3)


def test_an_index_named_in_another_encoding_than_utf8_works_end_to_end(tmp_path):
    """A Latin-1 name (an old archive's, a USB disk's) is bytes that are not
    UTF-8; Python names it with surrogates, which py-lmdb's strict UTF-8
    encoding of a str path refused (UnicodeEncodeError at create)."""
    name = os.fsdecode(b"caf\xe9")
    try:
        (tmp_path / name).write_bytes(b"")
    except (OSError, UnicodeError):
        pytest.skip("this file system takes only UTF-8 names")
    path = tmp_path / f"{name}.ndx"
    fps = np.random.default_rng(5).integers(0, 2**64, 3000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=3000) as ix:
        ix.add(fps[:2000], keys=[f"k{i}" for i in range(2000)])
        ix.compact()
        ix.add(fps[2000:])
        ix.compact(full=True)
        ix.vacuum_into(tmp_path / f"{name}-copy.ndx")
    for p in (path, tmp_path / f"{name}-copy.ndx"):
        with Index.open(p, readonly=True) as ix:
            assert len(ix) == 3000 and ix.verify()["table_entries"] == 3000
            assert [m.fingerprint for m in ix.query(int(fps[7]), k=0)] == [int(fps[7])]
    dump = tmp_path / f"{name}.dump"
    cli = [sys.executable, "-m", "ndindex"]
    for argv in (["export", path, "-o", dump], ["import", dump, tmp_path / f"{name}-2.ndx"],
                 ["recover", path, "-o", tmp_path / f"{name}-3.ndx"],
                 ["verify", tmp_path / f"{name}-3.ndx"]):
        done = subprocess.run(cli + [os.fsencode(a) for a in argv], capture_output=True)
        assert done.returncode == 0, done.stderr
    with Index.open(tmp_path / f"{name}-2.ndx", readonly=True) as ix:
        assert len(ix) == 3000
    # The name as bytes, as os.listdir(bytes) gives it, opens the same file.
    with Index.open(os.fsencode(path), readonly=True) as ix:
        assert len(ix) == 3000 and ix.path == str(path)


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_an_index_opened_by_a_relative_path_survives_a_change_of_directory(
        tmp_path, monkeypatch, durability):
    # The file is named by its absolute path once opened, as SQLite does.
    # Before, after os.chdir a full compaction (its vacuum) and vacuum_into
    # raised FileNotFoundError (an error of no ndindex type).  With
    # durability "normal", the copy holds the journaled add too, as export's
    # dump does (vacuum_into copied the file as last checkpointed).
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(home)
    ix = Index.create("rel.ndx", k=3, expected_n=10_000, durability=durability)
    ix.add(np.arange(1, 5001, dtype=np.uint64))
    assert ix.path == os.path.realpath(home / "rel.ndx")
    monkeypatch.chdir(elsewhere)
    ix.compact(full=True)
    ix.add([10**12])
    assert ix.vacuum_into("copy.ndx") > 0  # a destination given now: the current directory
    with ix.transaction():
        ix.add([10**13])
    assert ix.stats()["file_bytes"] > 0
    ix.sync()
    assert os.listdir(elsewhere) == ["copy.ndx"]
    ix.close()
    with Index.open(home / "rel.ndx") as again:
        again.verify()
        assert len(again) == 5002
    with Index.open(elsewhere / "copy.ndx") as copy:
        assert len(copy) == 5001


def test_an_index_opened_through_a_symbolic_link_is_the_file_it_names(tmp_path):
    # Opened by a link's name, the index used LMDB's lock file of that name
    # (a process opening the file by its own name used another one, so
    # their commits were not serialised), and a vacuum renamed its copy
    # over the link: the link became a file of its own, the file it named
    # kept the old content.
    (tmp_path / "data").mkdir()
    real = tmp_path / "data" / "real.ndx"
    with Index.create(real, k=3, expected_n=20_000) as ix:
        ix.add(np.arange(1, 20_001, dtype=np.uint64))
        ix.compact()
        ix.remove(np.arange(1, 15_001, dtype=np.uint64))
    link = tmp_path / "link.ndx"
    link.symlink_to(real)
    with Index.open(link) as ix:
        assert ix.path == os.path.realpath(real)
        assert ix.compact(full=True)["vacuumed"]
        ix.add([10**12])
    assert link.is_symlink() and sorted(os.listdir(tmp_path)) == ["data", "link.ndx"]
    with Index.open(real, readonly=True) as ix:
        assert len(ix) == 5_001 and ix.fingerprints()[-1] == 10**12


_WRITES_BY_NAME = """
import sys, numpy as np
from ndindex import Index
ix = Index.open(sys.argv[1], background_compaction=False)
print("open", flush=True)
sys.stdin.readline()
rng = np.random.default_rng(int(sys.argv[2]))
for _ in range(200):
    ix.add(rng.integers(0, 2**64, 50, dtype=np.uint64))
ix.close()
"""


def test_two_processes_writing_by_two_names_of_one_file_lose_nothing(tmp_path):
    # Each name had its own LMDB lock file: in a scratch run one process
    # met "no meta page names the last commit" and the file held half the
    # additions.  Resolved to the file's own name, they share one.
    real = tmp_path / "real.ndx"
    Index.create(real, k=3, expected_n=20_000).close()
    (tmp_path / "link.ndx").symlink_to(real)
    children = [subprocess.Popen([sys.executable, "-c", _WRITES_BY_NAME, str(name), str(seed)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for seed, name in enumerate((real, tmp_path / "link.ndx"))]
    for child in children:
        assert child.stdout.readline() == "open\n"
    for child in children:  # both open first: then they write side by side
        child.stdin.write("go\n")
        child.stdin.flush()
    assert [child.wait(timeout=120) for child in children] == [0, 0]
    for child in children:
        child.stdin.close()
        child.stdout.close()
    with Index.open(real) as ix:
        ix.verify()
        assert len(ix) == 2 * 200 * 50
    assert not (tmp_path / "link.ndx-lock").exists()  # one lock file: the file's


def test_create_and_vacuum_work_where_hard_links_are_refused(path, tmp_path, monkeypatch):
    def no_links(src, dst, **kwargs):
        raise PermissionError(errno.EPERM, "hard links not supported", dst)
    monkeypatch.setattr(os, "link", no_links)
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        ix.add([5, 6, 7])
        ix.compact(full=True)
        assert ix.vacuum_into(tmp_path / "copy.ndx") > 0
        with pytest.raises(FileExistsError):
            ix.vacuum_into(tmp_path / "copy.ndx")
    with pytest.raises(FileExistsError):
        Index.create(path, k=3)
    with Index.open(tmp_path / "copy.ndx") as copy:
        assert sorted(copy.fingerprints().tolist()) == [5, 6, 7]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith("-lock")) == \
        ["copy.ndx", "test.ndx"]


def test_builds_of_whole_indexes_work_where_hard_links_are_refused(path, tmp_path, monkeypatch):
    # recover, import and the dedup job's first index build aside, then
    # give the build its name: by a link, or where the file system has
    # none (FAT, exFAT: an archive's USB disk) a rename.  recover linked
    # unconditionally and failed there.
    import io

    from ndindex import dedup, dump, recover
    with Index.create(path, k=3, expected_n=1000) as ix:
        ix.add([5, 6, 7], keys=["five", "six", "seven"])
        dumped = io.BytesIO()
        dump.export_index(ix, dumped)

    def no_links(src, dst, **kwargs):
        raise PermissionError(errno.EPERM, "hard links not supported", dst)
    monkeypatch.setattr(os, "link", no_links)
    assert recover.recover(path, tmp_path / "recovered.ndx")["status"] == 0
    dumped.seek(0)
    dump.import_index(dumped, tmp_path / "imported.ndx")
    for name in ("recovered.ndx", "imported.ndx"):
        with Index.open(tmp_path / name) as copy:
            assert copy.fingerprints().tolist() == [5, 6, 7] and copy.keys(6) == ("six",)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("alpha beta gamma delta " * 50)
    (tmp_path / "docs" / "b.txt").write_text("alpha beta gamma delta " * 50)
    result = dedup([tmp_path / "docs"], index=tmp_path / "files.ndx")
    assert len(result.clusters) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith("-lock")) == \
        ["docs", "files.ndx", "imported.ndx", "recovered.ndx", "test.ndx"]


def test_vacuum_gives_space_back_and_keeps_the_index_usable(path):
    rng = np.random.default_rng(8)
    with Index.create(path, k=3, expected_n=40000, background_compaction=False) as ix:
        ix.add(rng.integers(0, 2**64, 40000, dtype=np.uint64), keys=[f"k{i}" for i in range(40000)])
        ix.compact()
        ix.remove(keys=[f"k{i}" for i in range(30000)])
        ix.compact()
        before = os.path.getsize(path)
        ix.vacuum()
        assert os.path.getsize(path) < before
        assert len(ix) == 10000 and ix.keys(int(ix.fingerprints()[0])) != ()
        ix.add([1, 2, 3])
        assert 2 in ix
        ix.verify()


def test_value_in_runs_and_log_is_reported_once(path):
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        ix.add([0xABCDEF, 0xABCDEE])
        ix.compact()
        ix.add([0xABCDEF])  # again: now in every table's runs and in the log
        flush(ix)
        ix.add([0xABCDEF])
        assert [(m.fingerprint, m.distance) for m in ix.query(0xABCDEF, 1)] == \
            [(0xABCDEF, 0), (0xABCDEE, 1)]
        many = ix.query_many([0xABCDEF], 1)
        assert many["fingerprint"].tolist() == [0xABCDEF, 0xABCDEE]
        assert len(ix) == 2


@pytest.mark.parametrize("state", ["several-runs", "main"])
def test_many_table_plan_at_k10_matches_brute_force(path, state, small_steps):
    # 66 tables: a near match is found by dozens of them and must come out once.
    rng = np.random.default_rng(9)
    fps = clustered(rng, 60, 40, 6)
    with Index.create(path, k=10, expected_n=1_000_000, background_compaction=False) as ix:
        assert len(ix.plan.tables) > 20
        put_in_state(ix, fps[:1500], state)
        ix.add(fps[1500:])
        check_queries(ix, fps, near(rng, fps, 60, 8), 10)


def test_iteration_yields_every_live_fingerprint_once(path, small_steps):
    rng = np.random.default_rng(10)
    fps = np.unique(rng.integers(0, 2**64, 20000, dtype=np.uint64))
    with Index.create(path, k=3, expected_n=20000, background_compaction=False) as ix:
        put_in_state(ix, fps[:15000], "mid-merge")
        ix.add(fps[15000:])
        ix.add(fps[:10])  # twice: in a run and in the log
        ix.remove(fingerprints=fps[100:110])
        live = np.setdiff1d(fps, fps[100:110])
        assert np.array_equal(ix.fingerprints(), live)
        chunks = list(ix.iter_chunks(3000))
        assert all(np.all(c[1:] > c[:-1]) for c in chunks)
        assert np.array_equal(np.sort(np.concatenate(chunks)), live)
        parts = [np.concatenate(list(ix.iter_chunks(2000, part=p, parts=3)) or [np.empty(0, np.uint64)])
                 for p in range(3)]
        assert np.array_equal(np.sort(np.concatenate(parts)), live)
        items = list(ix.items(5000))
        assert np.array_equal(np.concatenate([f for f, _ in items]), live)


def test_bad_chunk_sizes_and_shares_raise_at_the_call(path):
    # items(0) divided by zero, items(-1) yielded nothing at all, and
    # iter_chunks(0) one chunk of everything.
    with Index.create(path, k=3, expected_n=1000) as ix:
        ix.add([1, 2, 3])
        for call in (lambda: ix.items(0), lambda: ix.items(-1), lambda: ix.items(2.5),
                     lambda: ix.iter_chunks(0), lambda: ix.iter_chunks(-5),
                     lambda: ix.iter_chunks(10, parts=0), lambda: ix.iter_chunks(10, part=3, parts=3),
                     lambda: ix.iter_chunks(10, part=0.5, parts=2)):
            with pytest.raises(ValueError):
                call()
        assert [f.tolist() for f, _ in ix.items(2)] == [[1, 2], [3]]



@pytest.mark.parametrize("state", STATES)
def test_the_keys_items_reads_in_order_equal_those_looked_up(path, state, small_steps):
    # items() reads the key records in one ordered pass beside the
    # fingerprints (a merge join); keys_many looks each one up.
    rng = np.random.default_rng(41)
    fps = np.unique(rng.integers(0, 2**64, 4000, dtype=np.uint64))
    with Index.create(path, k=3, background_compaction=False) as ix:
        put_in_state(ix, fps, state)
        some = fps[::3].tolist()
        ix.add(some, keys=[f"a{i}" for i in range(len(some))])
        ix.add(some[::2], keys=[b"\xff%d" % i for i in range(len(some[::2]))])  # a second, bytes
        ix.remove(keys=[f"a{i}" for i in range(0, len(some), 5)])
        with ix.transaction():
            ix.add(fps[1:50:2], keys=[f"p{i}" for i in range(25)])
            parts = list(ix.items(101))
            listed = np.concatenate([p for p, _ in parts])
            keys = [k for _, ks in parts for k in ks]
            assert keys == ix.keys_many(listed)
            assert sum(1 for k in keys if len(k) == 2) > 300 and sum(map(bool, keys)) > 1000


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("first_table", ["in order", "permuted"])
def test_shares_of_iter_chunks_are_ranges_of_values(path, state, first_table, small_steps):
    # Share p of P holds the fingerprints in [p, p + 1) x 2^64 / P, in every
    # state the layout can be in, with a transaction's operations pending.
    from ndindex.index_contents import share_bounds
    rng = np.random.default_rng(17)
    fps = np.unique(rng.integers(0, 2**64, 3000, dtype=np.uint64))
    plan = plans.choose_plan(3000, 3)
    if first_table == "permuted":
        plan = plans.Plan(k=3, tables=tuple(reversed(plan.tables)))
    with Index.create(path, k=3, plan=plan, background_compaction=False) as ix:
        put_in_state(ix, fps, state)
        with ix.transaction():
            extra = np.unique(rng.integers(0, 2**64, 300, dtype=np.uint64))
            ix.add(extra)
            ix.remove(fingerprints=fps[100:400])
            want = np.setdiff1d(np.union1d(fps, extra), fps[100:400])
            for parts in (1, 2, 7):
                got = []
                for part in range(parts):
                    lo, hi = share_bounds(part, parts)
                    chunks = list(ix.iter_chunks(250, part=part, parts=parts))
                    assert all(len(c) and np.all(c[1:] > c[:-1]) for c in chunks)
                    share = np.concatenate(chunks or [np.empty(0, np.uint64)])
                    assert np.array_equal(np.sort(share), want[(want >= lo) & (want <= hi)])
                    got.append(share)
                assert np.array_equal(np.sort(np.concatenate(got)), want)


def test_shares_read_on_either_side_of_a_compaction_hold_each_fingerprint_once(path,
                                                                             small_steps):
    # batch.join reads an index's shares in other processes, at other
    # times: a compaction may come between two of them.  Shares cut from
    # the runs' slices as they were missed and repeated fingerprints then.
    rng = np.random.default_rng(18)
    fps = np.unique(rng.integers(0, 2**64, 6000, dtype=np.uint64))
    with Index.create(path, k=3, expected_n=6000, background_compaction=False) as ix:
        put_in_state(ix, fps, "several-runs")
        before = list(ix.iter_chunks(500, part=0, parts=3))
        ix.compact(full=True)
        after = [c for part in (1, 2) for c in ix.iter_chunks(500, part=part, parts=3)]
        assert np.array_equal(np.sort(np.concatenate(before + after)), fps)

def test_create_exist_ok_opens_the_existing_index(path):
    with Index.create(path, k=2, expected_n=100) as ix:
        ix.add([42])
    with Index.create(path, k=1, expected_n=10**6, exist_ok=True) as ix:
        assert ix.k == 2 and 42 in ix  # the stored index, its own k
    with pytest.raises(FileExistsError):
        Index.create(path, k=2, expected_n=100)


def test_create_exist_ok_refuses_a_file_that_cannot_serve_the_call(path):
    from ndindex.fingerprint import Fingerprinter
    with Index.create(path, k=2, expected_n=100) as ix:
        ix.add([42])
    with pytest.raises(ValueError, match="k=2, below the k=5"):
        Index.create(path, k=5, exist_ok=True)
    with pytest.raises(ValueError, match="no fingerprinter"):
        Index.create(path, k=2, exist_ok=True, fingerprinter=Fingerprinter())
    docs = str(path) + ".docs"
    with Index.create(docs, k=3, fingerprinter=Fingerprinter(num_perm=64)) as ix:
        pass
    with pytest.raises(ValueError, match="another fingerprinter"):
        Index.create(docs, k=3, exist_ok=True, fingerprinter=Fingerprinter(num_perm=32))
    with Index.create(docs, k=3, exist_ok=True, fingerprinter=Fingerprinter(num_perm=64)) as ix:
        assert ix.fingerprinter == Fingerprinter(num_perm=64).to_bytes()
    with Index.open(path) as ix:        # refusals left both files as they were, unlocked
        assert ix.fingerprints().tolist() == [42] and ix.k == 2


def test_two_dimensional_input_is_refused(path):
    with Index.create(path, k=2, expected_n=100) as ix:
        grid = np.arange(4, dtype=np.uint64).reshape(2, 2)
        with pytest.raises(ValueError, match="1-D"):
            ix.add(grid)
        with pytest.raises(ValueError, match="1-D"):
            ix.query_many(grid)
        with pytest.raises(ValueError, match="flat"):
            ix.add([[1, 2], [3, 4]])
        assert len(ix) == 0


def test_a_directory_is_not_an_index(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        Index.open(tmp_path)


def test_open_and_first_query_read_no_run_whole(path, monkeypatch):
    # Nothing on the open or first-query path may read in proportion to N:
    # runs are probed in place, never decoded whole.
    rng = np.random.default_rng(11)
    with Index.create(path, k=3, expected_n=100000, background_compaction=False) as ix:
        ix.add(rng.integers(0, 2**64, 100000, dtype=np.uint64))
        ix.compact(full=True)
    def refuse(*a, **k):
        raise AssertionError("a run was read whole")
    monkeypatch.setattr(rn, "read_values", refuse)
    monkeypatch.setattr(rn, "fp_chunks", refuse)
    with Index.open(path) as ix:
        ix.query(12345, 3)


def test_a_format_v1_file_names_the_upgrade_command(tmp_path):
    v1 = os.path.join(os.path.dirname(__file__), "..", "data", "format-v1.ndx")
    with pytest.raises(FormatError, match="ndindex upgrade"):
        Index.open(v1, readonly=True)


@pytest.fixture
def background_listing(monkeypatch):
    """Runs of more than 2 chunks are listed only by the background lister,
    once the index has answered 20 queries.  Chunks of two blocks: small,
    and still too large to live inside a leaf page (where a directory would
    serve one snapshot only, and the lister keeps none)."""
    from ndindex import index as index_module, reader
    monkeypatch.setattr(reader, "DIRECTORY_MAX_CHUNKS", 2)
    monkeypatch.setattr(reader, "DIRECTORY_MAX_CHUNKS_BACKGROUND", 1 << 30)
    monkeypatch.setattr(index_module, "WARM_QUERIES", 20)
    monkeypatch.setattr(ch, "CHUNK_MAX_BLOCKS", 2)


def compacted(path, rng, n: int) -> np.ndarray:
    """A fully compacted index of n random fingerprints at path; returns them."""
    fps = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=n, background_compaction=False) as ix:
        ix.add(fps)
        ix.compact(full=True)
    return fps


def test_large_runs_are_listed_in_the_background_and_answers_stay_exact(path, background_listing):
    rng = np.random.default_rng(21)
    fps = compacted(path, rng, 20000)
    queries = np.concatenate([near(rng, fps, 60, 3), rng.integers(0, 2**64, 20, dtype=np.uint64)])
    with Index.open(path, background_compaction=False) as ix:
        main = [runs[0].run_id for runs in ix._snapshot().table_runs]
        assert min(r.chunks for runs in ix._snapshot().table_runs for r in runs) > 2
        check_queries(ix, fps, queries[:30], 3)          # warm now: the lister starts
        wait_for(lambda: all(rid in ix._directories for rid in main))
        version = ix._directories.version
        assert version == len(main)
        check_queries(ix, fps, queries, 3)               # the kernel is rebuilt with them
        assert ix._snapshot().kernel_version == version


def test_close_waits_for_the_background_lister(path, background_listing):
    rng = np.random.default_rng(22)
    compacted(path, rng, 40000)
    for _ in range(3):
        ix = Index.open(path, readonly=True)
        for q in rng.integers(0, 2**64, size=21, dtype=np.uint64).tolist():
            ix.query(q, 3)
        thread = ix._directories._thread
        assert thread is not None and thread.name == "ndindex-lister"
        ix.close()                                       # while it lists, most likely
        assert not thread.is_alive()


def test_vacuum_restarts_the_background_lister(path, background_listing):
    rng = np.random.default_rng(23)
    fps = compacted(path, rng, 20000)
    with Index.open(path, background_compaction=False) as ix:
        for q in rng.integers(0, 2**64, size=21, dtype=np.uint64).tolist():
            ix.query(q, 3)
        ix.vacuum()
        main = [runs[0].run_id for runs in ix._snapshot().table_runs]
        check_queries(ix, fps, near(rng, fps, 30, 3), 3)
        wait_for(lambda: all(rid in ix._directories for rid in main))
        check_queries(ix, fps, near(rng, fps, 30, 3), 3)


def test_a_merge_input_is_listed_in_the_background_from_its_cursor(path, background_listing):
    rng = np.random.default_rng(24)
    fps = rng.integers(0, 2**64, size=24000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        ix.add(fps[:20000])
        ix.compact(full=True)
        ix.remove(fps[:2000])             # 10% removed: a merge into the main level is due
        ix._compactor.step(force_flush=True)
        for _ in range(3):
            ix._compactor.step()          # the merge, part way
        inputs = [r for runs in ix._snapshot().table_runs for r in runs
                  if r.merge_input and r.chunks > 2 and r.cursor]
        assert inputs, "no merge input with a cursor"
        ix.add(fps[20000:])
        live = fps[2000:]
        queries = np.concatenate([near(rng, live, 60, 3), near(rng, fps[:2000], 10, 3)])
        check_queries(ix, live, queries[:25], 3)   # warm: the lister takes the inputs
        wait_for(lambda: all(r.run_id in ix._directories for r in inputs))
        check_queries(ix, live, queries, 3)
        for _ in range(3):
            ix._compactor.step()          # the cursor moves on past the listed start
        check_queries(ix, live, queries, 3)
        ix.verify()


def _maps_of(path) -> list:
    """Lines of this process's memory map and open descriptors that name path."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as fh:
        lines = [line for line in fh if line.rstrip().endswith(real)]
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == real:
                lines.append(f"fd {fd}")
        except OSError:
            pass  # the listing's own descriptor, gone by now
    return lines


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
@pytest.mark.parametrize("readonly", [False, True])
def test_close_unmaps_the_file_while_the_index_object_lives(path, readonly):
    # A closed index still bound to a name (as after a with block) must not
    # hold the file: its space would stay in use after the file is deleted.
    from ndindex.fingerprint import Fingerprinter
    fps = np.random.default_rng(8).integers(0, 2**64, 5000, dtype=np.uint64)
    texts = [f"document {i} about item {i % 7} and its many words" for i in range(50)]
    with Index.create(path, k=3, fingerprinter=Fingerprinter()) as ix:
        ix.add(fps)
        ix.add_documents(texts, [f"d{i}" for i in range(50)])
        ix.compact()
    ix = Index.open(path, readonly=readonly)
    assert ix.query(int(fps[0]))
    assert len(ix.query_many(fps[:100])) == 100
    assert ix.similar(texts[3])
    assert _maps_of(path)
    ix.close()
    assert _maps_of(path) == []
    with pytest.raises(ClosedError):
        ix.query(int(fps[0]))


def test_a_killed_vacuum_leaves_nothing_behind_after_the_next_open(path):
    # A vacuum killed after its copy is written and before the rename: the
    # index is whole, and the next writer's open deletes the copy, which
    # would otherwise take the index's size on disk for ever.
    from ndindex.store import build_path
    fps = np.random.default_rng(9).integers(0, 2**64, 20000, dtype=np.uint64)
    with Index.create(path, k=3, background_compaction=False) as ix:
        ix.add(fps)
        ix.compact()
        ix.remove(fingerprints=fps[:10000])
        ix.compact()
    killed_at("replace", "from ndindex import Index\nIndex.open(sys.argv[1]).vacuum()", path)
    copy = build_path(path, "vacuum")
    assert os.path.getsize(copy) > 0
    with Index.open(path, readonly=True) as ro:  # a reader deletes nothing
        assert len(ro) == 10000
    assert os.path.exists(copy)
    with Index.open(path) as ix:
        assert not os.path.exists(copy)
        assert sorted(ix.fingerprints().tolist()) == sorted(set(fps[10000:].tolist()))
        ix.verify()
        ix.vacuum()
        assert len(ix) == 10000
    assert sorted(os.listdir(os.path.dirname(path))) == ["test.ndx", "test.ndx-lock"]


@pytest.mark.parametrize("call", ["link", "fsync"])
def test_a_killed_create_leaves_nothing_behind(path, call):
    # Killed before its file is linked into place (fsync: while building)
    # the next create reuses the name; killed after (link: the name is then
    # a second link to the index) the next writer's open deletes it.
    from ndindex.store import build_path
    build = build_path(path, "creating")
    if call == "link":  # die right after the link
        killed_at("unlink", "from ndindex import Index\nIndex.create(sys.argv[1], k=3)", path)
        assert os.path.exists(path) and os.path.samefile(path, build)
        with Index.open(path) as ix:
            ix.add([1, 2, 3])
    else:
        killed_at("fsync", "from ndindex import Index\nIndex.create(sys.argv[1], k=3)", path)
        assert not os.path.exists(path) and os.path.exists(build)
        with Index.create(path, k=3) as ix:
            ix.add([1, 2, 3])
    assert not os.path.exists(build)
    with Index.open(path) as ix:
        assert sorted(ix.fingerprints().tolist()) == [1, 2, 3]


def test_a_build_name_held_by_a_live_process_stays(path, monkeypatch):
    # Another process builds under the name (a create or vacuum at work):
    # an open leaves it, and a create of the same index waits, then says so.
    import subprocess
    import sys
    from ndindex import store
    Index.create(path, k=3).close()
    hold = ("import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n")
    names = [store.build_path(path, "vacuum"), store.build_path(path, "creating")]
    procs = [subprocess.Popen([sys.executable, "-c", hold, name], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for name in names]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["held", "held"]
        with Index.open(path):
            assert all(os.path.exists(name) for name in names)
        monkeypatch.setattr(store, "BUILD_WAIT_SECONDS", 0.2)
        os.unlink(path)
        with pytest.raises(FileExistsError, match="another process is creating it"):
            Index.create(path, k=3)
    finally:
        for p in procs:
            p.communicate("", timeout=60)
    with Index.create(path, k=3) as ix:  # the holders are gone
        assert len(ix) == 0
    assert not any(os.path.exists(name) for name in names)


def test_a_merge_whose_last_values_were_all_removed_still_ends_its_run(path, small_steps):
    # The merge's final step had nothing left to write (every value above
    # the cursor tombstoned), so no chunk was flagged the run's last: then
    # len(), fingerprints(), verify() and every later merge of the run
    # failed with "lacks its last chunk".
    fps = np.unique(np.random.default_rng(12).integers(0, 2**64, 4000, dtype=np.uint64))
    with Index.create(path, k=3, background_compaction=False) as ix:
        ix.add(fps)
        flush(ix)
        ix.add(fps[:500])
        flush(ix)
        ix.remove(fingerprints=fps[3000:])   # the largest: the end of table 0's order
        flush(ix)
        ix.compact()
        for runs in ix._snapshot().table_runs:
            last = rn.fp_chunks(ix._snapshot().view, runs[-1])[-1]
            assert last.flags & ch.FLAG_LAST
        assert len(ix) == 3000
        ix.verify()
        ix.add(fps[3000:3100])
        ix.compact(full=True)
        assert sorted(ix.fingerprints().tolist()) == sorted(fps[:3100].tolist())
        ix.verify()


def test_a_record_merge_whose_last_records_were_all_deleted_still_ends_its_run(path,
                                                                             monkeypatch):
    # The same for the key spaces: the keys of the largest fingerprints go.
    monkeypatch.setattr(ch, "RECORD_CHUNK_BLOCKS", 1)
    monkeypatch.setattr(ch, "RECORD_BLOCK_BYTES", 256)
    monkeypatch.setattr(compaction, "STEP_CHUNKS", 1)
    fps = np.unique(np.random.default_rng(13).integers(0, 2**64, 3000, dtype=np.uint64))[:2000]
    with Index.create(path, k=3, background_compaction=False, log_limit=1 << 30) as ix:
        ix.add(fps, keys=[f"k{i:04d}" for i in range(2000)])
        ix.compact()
        ix.remove(keys=[f"k{i:04d}" for i in range(1500, 2000)])
        ix.compact()
        snap = ix._snapshot()
        record_runs = [r for r in snap.manifest.runs if r.kind == rn.KIND_RECORDS and r.chunks]
        assert record_runs
        for run in record_runs:  # (readers of record runs went on without the flag)
            assert rn.record_chunks(snap.view, run, b"", -1)[-1].flags & ch.FLAG_LAST
        ix.compact(full=True)
        ix.verify()
        assert len(ix) == 1500
        assert ix.keys(int(fps[10])) == ("k0010",) and ix.keys(int(fps[1600])) == ()


def test_compact_reports_progress_up_to_the_end(path, small_steps):
    fps = np.random.default_rng(15).integers(0, 2**64, 20000, dtype=np.uint64)
    with Index.create(path, k=3, background_compaction=False) as ix:
        for part in np.array_split(fps, 4):
            ix.add(part)
            flush(ix)
        calls = []
        report = ix.compact(full=True, progress=lambda *a: calls.append(a))
        assert len(calls) == report["steps"] + 1 > 10
        assert {c[0] for c in calls} == {"compact"}
        done = [c[1] for c in calls]
        assert done == sorted(done) and done[-1] == calls[-1][2] and done[-2] < done[-1]
        assert done[len(done) // 2] > 0


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("first_table", ["in order", "permuted"])
def test_items_and_fingerprints_stream_in_order_with_pending_operations(path, state, first_table,
                                                                        small_steps,
                                                                        monkeypatch):
    # Read in one-chunk slices (table 0 keeps the fingerprints' order in
    # every planned index), with a transaction's adds and removes pending;
    # a plan whose first table is permuted sorts the values whole instead.
    from ndindex import index_contents
    monkeypatch.setattr(index_contents, "ORDER_SLICE_VALUES", 1)
    rng = np.random.default_rng(16)
    fps = np.unique(rng.integers(0, 2**64, 3000, dtype=np.uint64))
    plan = plans.choose_plan(3000, 3)
    if first_table == "permuted":
        plan = plans.Plan(k=3, tables=tuple(reversed(plan.tables)))
    assert plan.tables[0].keeps_order == (first_table == "in order")
    with Index.create(path, k=3, plan=plan, background_compaction=False) as ix:
        put_in_state(ix, fps, state)
        ix.add(fps[:40], keys=[f"k{i}" for i in range(40)])
        with ix.transaction():
            extra = np.unique(rng.integers(0, 2**64, 300, dtype=np.uint64))
            ix.add(extra)
            ix.remove(fingerprints=fps[100:400])
            want = np.setdiff1d(np.union1d(fps, extra), fps[100:400])
            assert np.array_equal(ix.fingerprints(), want)
            parts = list(ix.items(97))
        assert [len(p) for p, _ in parts[:-1]] == [97] * (len(parts) - 1)
        assert np.array_equal(np.concatenate([p for p, _ in parts]), want)
        keys = dict(zip(np.concatenate([p for p, _ in parts]).tolist(),
                        [k for _, ks in parts for k in ks]))
        assert keys[int(fps[7])] == ("k7",) and keys[int(extra[0])] == ()


def test_keys_are_found_wherever_they_are_when_most_fingerprints_have_none(path):
    # An index without keys skips key lookups; one key anywhere (pending,
    # log, runs) turns them back on.
    from ndindex.records import SPACE_KEYS_BY_FP
    fps = np.random.default_rng(17).integers(1, 2**64, 2000, dtype=np.uint64)
    with Index.create(path, k=3, background_compaction=False) as ix:
        ix.add(fps)
        ix.compact()
        snap = ix._snapshot()
        assert not snap.may_hold_records(SPACE_KEYS_BY_FP)
        assert ix.keys(int(fps[0])) == ()
        with ix.transaction():
            ix.add([int(fps[1])], keys=["one"])
            assert ix.keys(int(fps[1])) == ("one",)                 # pending
            assert [k for _, per_fp in ix.items() for ks in per_fp for k in ks] == ["one"]
        assert ix.keys(int(fps[1])) == ("one",)                     # in the log
        ix.compact()
        assert ix.keys(int(fps[1])) == ("one",)                     # in the runs
        # keys_many answers as keys() each, in the order asked, absent ones too
        ix.add([int(fps[2]), int(fps[2])], keys=["b", "a"])
        asked = [int(fps[2]), 5, int(fps[1]), int(fps[0]), int(fps[2])]
        assert ix.keys_many(asked) == [ix.keys(fp) for fp in asked] == [
            ("a", "b"), (), ("one",), (), ("a", "b")]
        assert ix.keys_many(np.array([], np.uint64)) == []
        # fingerprints_of: keys() the other way, one key or a list
        assert ix.fingerprints_of("a") == [int(fps[2])]
        assert ix.fingerprints_of(["one", "nope", "b"]) == [[int(fps[1])], [], [int(fps[2])]]
        ix.add([7, 3], keys=["a", "a"])
        assert ix.fingerprints_of(b"\x01a") == [] and ix.fingerprints_of("a") == sorted(
            [3, 7, int(fps[2])])
        with pytest.raises(ValueError):
            ix.keys_many([-1])
        # Its last key gone, the fingerprint goes too (remove's rule).
        assert ix.remove(keys=["one"]) == 1 and int(fps[1]) not in ix


def test_removing_many_keys_in_one_call_matches_a_model(path):
    # The lookups of a removal are batched (key records in key order, a
    # sub-block read once for all its keys): over several runs and many
    # record chunks, what goes and what stays is what a model says.
    rng = np.random.default_rng(31)
    fps = rng.integers(0, 2**64, 12000, dtype=np.uint64).tolist()
    model = {}
    with Index.create(path, k=3, background_compaction=False) as ix:
        for part in range(3):                       # three runs of key records
            chunk = fps[part * 4000:(part + 1) * 4000]
            keys = [f"k{part}-{i}" for i in range(len(chunk))]
            shared = [f"shared-{i % 700}" for i in range(len(chunk))]
            ix.add(chunk + chunk, keys=keys + shared)
            for fp, a, b in zip(chunk, keys, shared):
                model.setdefault(fp, set()).update((a, b))
            ix.compact()
        going = set(rng.choice(sorted({k for ks in model.values() for k in ks}), 5000,
                               replace=False).tolist())
        removed = ix.remove(keys=sorted(going))
        left = {fp: ks - going for fp, ks in model.items() if ks - going}
        assert removed == len(model) - len(left)
        assert ix.keys_many(fps) == [tuple(sorted(left.get(fp, ()))) for fp in fps]
        assert sorted(ix.fingerprints().tolist()) == sorted(left)


def test_the_lister_forgets_runs_merged_away(path, background_listing, monkeypatch):
    # An index open for months lists run after run: what it remembers of
    # runs merged away must go with them.  (No vacuum, which starts the
    # lister afresh.)
    monkeypatch.setattr(Index, "_vacuum_if_alone", lambda self: False)
    rng = np.random.default_rng(25)
    compacted(path, rng, 20000)
    with Index.open(path, background_compaction=False) as ix:
        asked = set()
        for _ in range(3):
            for q in rng.integers(0, 2**64, size=21, dtype=np.uint64).tolist():
                ix.query(q, 3)
            main = {runs[0].run_id for runs in ix._snapshot().table_runs}
            assert {(rid, "list") for rid in main} <= ix._directories._asked
            asked |= main
            wait_for(ix._directories.idle)
            ix.add(rng.integers(0, 2**64, size=3000, dtype=np.uint64))
            ix.compact(full=True)                        # new main runs
            ix.query(1, 3)
            live = {r.run_id for r in ix._snapshot().manifest.runs}
            assert not asked & live
            assert {rid for rid, _ in ix._directories._asked} <= live
            assert set(ix._directories) <= live and set(ix._directories.held) <= live


def test_len_counts_on_from_its_last_count(path, monkeypatch):
    # Compaction changes no content, and between two flushes only the
    # values the log records since the last count touch can change state:
    # len() reads no table after merges, vacuum, adds and removes (of new
    # values, of stored ones, of tombstoned ones brought back), nor after a
    # flush, which counts first; it counts table 0 afresh only when more
    # operations than a flush counts for were flushed since the last count.
    from ndindex import reader
    rng = np.random.default_rng(41)
    fps = rng.integers(0, 2**64, size=6000, dtype=np.uint64)
    fps[:50] = fps[50:100]  # repeats
    live = set(fps.tolist())
    with Index.create(path, k=3, expected_n=20_000, background_compaction=False) as ix:
        put_in_state(ix, fps, "several-runs")
        assert len(ix) == len(live)
        reads = []
        real = reader.Snapshot.table_values
        monkeypatch.setattr(reader.Snapshot, "table_values",
                            lambda self, *a, **kw: reads.append(1) or real(self, *a, **kw))

        def check(read):
            assert len(ix) == len(live) and bool(reads) == read
            reads.clear()

        ix._compactor.step()  # a merge
        check(False)
        ix.compact(full=True)  # merges, vacuum
        check(False)
        gone = fps[:200].tolist()
        ix.remove(fps[:200])
        ix.add(np.array([1, 2, 3], dtype=np.uint64))
        live.difference_update(gone)
        live.update([1, 2, 3])
        check(False)
        flush(ix)  # tombstones for the removed; content unchanged
        check(False)
        back = fps[100:130].tolist()  # tombstoned, then added again
        ix.add(fps[100:130])
        ix.remove(np.array([1, int(fps[500]), 12345], dtype=np.uint64))  # 12345 was never stored
        ix.add(np.array([int(fps[500])], dtype=np.uint64))  # removed and added in the log
        live.update(back)
        live.discard(1)
        check(False)
        ix.remove(fps[600:601])  # removed in the log when last counted, then added back
        live.discard(int(fps[600]))
        check(False)
        ix.add(fps[600:601])
        live.add(int(fps[600]))
        check(False)
        ix.add(np.array([7, 8], dtype=np.uint64))
        flush(ix)  # counts first, from the last count
        live.update([7, 8])
        check(False)
        monkeypatch.setattr(reader, "COUNT_BEFORE_FLUSH_OPS", 2)
        ix.add(np.array([9, 10, 11], dtype=np.uint64))
        flush(ix)  # more operations since the last count than a flush counts: afresh
        live.update([9, 10, 11])
        check(True)
        ix.add(np.array([12, 13], dtype=np.uint64))
        flush(ix)  # within the bound: counted first
        live.update([12, 13])
        check(False)
        ix.compact(full=True)
        check(False)




def test_len_of_a_compacted_index_reads_no_table(path, monkeypatch):
    # One run per table and no tombstone: the run's entry count, corrected
    # by the log's adds and removes, with nothing to start from (a new open).
    from ndindex import reader
    fps = np.unique(np.random.default_rng(43).integers(0, 2**64, size=5000, dtype=np.uint64))
    with Index.create(path, k=3, background_compaction=False) as ix:
        ix.add(fps)
        ix.compact(full=True)
    reads = []
    real = reader.Snapshot.table_values
    monkeypatch.setattr(reader.Snapshot, "table_values",
                        lambda self, *a, **kw: reads.append(1) or real(self, *a, **kw))
    with Index.open(path, readonly=True) as ro:
        assert len(ro) == len(fps) and reads == []
    with Index.open(path, background_compaction=False) as ix:
        ix.add(np.array([1, 2], dtype=np.uint64))
        ix.add(fps[20:25])  # stored already
        ix.remove(fps[:10])
        ix.remove(np.array([3], dtype=np.uint64))  # never stored
    live = len(fps) + 2 - 10
    with Index.open(path, background_compaction=False) as ix:
        assert len(ix) == live and reads == []
        ix.compact(full=True)
        ix.remove(fps[100:120])
        flush(ix)  # tombstones, no new run: the run no longer counts for itself
        assert len(ix._snapshot().table_runs[0]) == 1
    with Index.open(path, background_compaction=False) as ix:
        assert len(ix) == live - 20 and reads


@pytest.mark.parametrize("coding", sorted(codec.CODING_NAMES), ids=codec.CODING_NAMES.get)
def test_a_file_says_the_format_version_its_coding_needs(path, coding):
    # FORMAT.md section 2, [F6]: coding 2 (restart tables) makes a version-4
    # file; codings 0 and 1 a version-2 file, which readers of version 2 open.
    fps = np.random.default_rng(4).integers(0, 2**64, 5000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=5000, coding=coding) as ix:
        ix.add(fps)
        ix.compact(full=True)
    with Index.open(path) as ix:
        header = ix._header
        assert (header.coding, header.read_version, header.write_version) == \
            (coding, *(2 * [rec.FORMAT_VERSION if coding == codec.CODING_RESTARTS else 2]))
        codes = {rn.run_code(r).coding for runs in ix._snapshot().table_runs for r in runs}
        assert codes == {coding}
        ix.add(fps[:10] ^ np.uint64(1))  # a later writer keeps the file's coding
        ix.compact(full=True)
        assert {rn.run_code(r).coding for runs in ix._snapshot().table_runs for r in runs} == {coding}
        assert rec.format_version_of(ix.coding) == header.read_version
        check_queries(ix, np.concatenate([fps, fps[:10] ^ np.uint64(1)]), fps[:20], 3)


@pytest.mark.parametrize("durability", ["full", "normal"])
@pytest.mark.parametrize("warm", [False, True])
def test_a_long_transaction_indexes_its_pending_additions_and_stays_exact(path, durability,
                                                                         warm):
    # Past overlay.PENDING_SCAN_MAX pending additions, queries find them
    # through a per-table index, not a scan of all (a transaction of n
    # check_and_add calls was O(n^2)).  Every answer still equals brute
    # force over what is stored plus what the transaction did so far,
    # removals of its own additions and additions again included.  A warm
    # index answers most calls by check_and_add's short path
    # (Index._warm_kernel, PendingOps.check_and_add).
    from ndindex import overlay, reader
    rng = np.random.default_rng(31)
    stored = np.unique(clustered(rng, 300, 4, 2))
    items = clustered(rng, 600, 6, 3)
    with Index.create(path, k=3, expected_n=5000, durability=durability,
                      background_compaction=False) as ix:
        ix.add(stored)
        ix.compact()
        if warm:
            for q in rng.integers(0, 2**64, reader.WARM_QUERIES, dtype=np.uint64).tolist():
                ix.query(q)
            wait_for(ix._directories.idle)
        live = set(stored.tolist())
        folds = short = 0
        with ix.transaction():
            for i, fp in enumerate(items.tolist()):
                want = brute_force(np.array(sorted(live), dtype=np.uint64), fp, 3)
                short += ix._warm_kernel() is not None
                got = ix.check_and_add(fp)
                assert [(m.fingerprint, m.distance) for m in got] == want
                if not want:
                    live.add(fp)
                if i % 97 == 0 and len(live) > len(stored):
                    # A removal of one of the transaction's own additions
                    # moves the index's bound back; the value added again later.
                    gone = max(live - set(stored.tolist()))
                    ix.remove(fingerprints=[gone])
                    live.discard(gone)
                    assert gone not in ix
                    if i % 2:
                        ix.add([gone])
                        live.add(gone)
                folds += ix._writer.pending._index[0] > 0
            assert len(live) - len(stored) > 2 * overlay.PENDING_SCAN_MAX
            assert folds > 0  # the index served
            # Cold, the first WARM_QUERIES calls take the long way.
            assert (short > 0.9 * len(items)) if warm else short < len(items), short
            qs = rng.integers(0, 2**64, 50, dtype=np.uint64).tolist() + items[:50].tolist()
            res = ix.query_many(qs, 3)
            everything = np.array(sorted(live), dtype=np.uint64)
            for j, q in enumerate(qs):
                rows = res[res["query"] == j]
                assert list(zip(rows["fingerprint"].tolist(), rows["distance"].tolist())) == \
                    brute_force(everything, q, 3)
        assert len(ix) == len(live)
        assert np.array_equal(ix.fingerprints(), np.array(sorted(live), dtype=np.uint64))


def test_the_kernel_checks_a_pending_index(path):
    from ndindex import _core
    with Index.create(path, k=3, background_compaction=False) as ix:
        ix.add([5, 6])
        kernel = ix._snapshot().kernel
        empty = np.empty(0, np.uint64)
        one_table = _core.pending_index([(empty, np.array([7], np.uint64))])
        with pytest.raises(ValueError, match="number of tables"):
            _core.query(kernel, 7, 3, empty, empty, one_table)
        with pytest.raises(TypeError, match="pending_index"):
            _core.query(kernel, 7, 3, empty, empty, object())
        with pytest.raises(TypeError):
            _core.pending_index([(empty,)])
        tables = [(empty, np.sort(d.apply(np.array([7, 9], np.uint64)))) for d in ix.plan.tables]
        index = _core.pending_index(tables)
        # 7 and 9 pending (indexed), 9 removed since: only 7 and the stored 5, 6.
        got = _core.query(kernel, 7, 3, empty, np.array([9], np.uint64), index)
        assert sorted(got) == [(5, 1), (6, 1), (7, 0)]  # 9, at distance 3, is hidden
