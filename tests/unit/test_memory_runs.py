"""Small raw runs held in memory (dircache.MEMORY_RUN_MAX_ENTRIES): exact
answers, only from values read for the snapshot asking, never hiding damage.

Once an index is warm, the kernel asks the background lister to read a
small raw run's live values (checked as a merge reads them) and then probes
them as it probes the log.  The oracle tests of test_index.py take this
path in every file state (their `listing` fixture, "memory"); these tests
take the real background thread and the edges of its cache.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ndindex import _core, chunks as ch, compaction, dircache, reader
from ndindex.errors import CorruptionError
from ndindex.index import Index
from ndindex.records import KIND_RAW
from tests.conftest import wait_for
from tests.oracle import brute_force, check_queries, near


def small_raw_runs(snap) -> set:
    return {r.run_id for runs in snap.table_runs for r in runs
            if r.kind == KIND_RAW and not r.merge_output and r.chunks
            and r.entries <= dircache.MEMORY_RUN_MAX_ENTRIES}


@pytest.fixture
def many_chunks(monkeypatch, level0_flushes):
    """Runs of several chunks and merges of several steps on a few thousand values."""
    monkeypatch.setattr(ch, "CHUNK_MAX_BLOCKS", 2)
    monkeypatch.setattr(compaction, "STEP_CHUNKS", 1)


def test_small_runs_are_held_in_the_background_and_answers_stay_exact(tmp_path, many_chunks):
    rng = np.random.default_rng(41)
    fps = np.unique(rng.integers(0, 2**64, 24000, dtype=np.uint64))
    gone = fps[:1500]
    with Index.create(tmp_path / "m.ndx", k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        ix.add(fps[:12000])
        ix.compact(full=True)                       # a Huffman main run: never held
        for part in np.array_split(fps[12000:22000], 3):
            ix.add(part)
            ix._compactor.step(force_flush=True)    # level-0 raw runs
        ix.remove(gone)                             # tombstones hide values held
        ix._compactor.step(force_flush=True)
        for _ in range(2):
            ix._compactor.step()                    # a merge part way: inputs with a cursor
        ix.add(fps[22000:])                         # and a log
        live = np.setdiff1d(fps, gone)
        snap = ix._snapshot()
        small = small_raw_runs(snap)
        assert len(small) >= 3 and any(r.cursor for runs in snap.table_runs for r in runs
                                       if r.run_id in small)
        queries = np.concatenate([near(rng, live, 80, 3), near(rng, gone, 20, 3)])
        for i in range(reader.WARM_QUERIES):
            ix.query(int(queries[i % len(queries)]), 3)   # warm: the lister is asked
        assert ix._directories.warm
        ix.query(1, 3)
        wait_for(lambda: small <= set(ix._directories.held))
        check_queries(ix, live, queries, 3)
        assert ix._snapshot().kernel_version == ix._directories.version
        while ix._compactor.step():                 # cursors move past what was read
            check_queries(ix, live, queries[:20], 3)
        assert not ix._directories.held.keys() - {r.run_id for r in
                                                   ix._snapshot().manifest.runs}
        ix.verify()


def test_values_read_further_into_a_merge_input_do_not_serve_an_earlier_snapshot(
        tmp_path, many_chunks):
    rng = np.random.default_rng(42)
    fps = np.unique(rng.integers(0, 2**64, 12000, dtype=np.uint64))
    with Index.create(tmp_path / "e.ndx", k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        for part in np.array_split(fps, 3):
            ix.add(part)
            ix._compactor.step(force_flush=True)
        ix._directories.warm = True
        ix._compactor.step()
        earlier = ix._snapshot()
        ix._compactor.step()
        later = ix._snapshot()
        moved = [(a, b) for a, b in zip(earlier.table_runs[0], later.table_runs[0])
                 if a.run_id == b.run_id and a.merge_input and a.cursor != b.cursor]
        assert moved, "no merge input moved on"
        run_early, run_late = moved[0]
        ix._directories._do(later, run_late, "hold")
        assert later._held(run_late) is not None
        assert earlier._held(run_early) is None     # it would lack values the earlier one has
        for q in near(rng, fps, 60, 3).tolist():
            assert _core.query(earlier.kernel, q, 3) == brute_force(fps, q, 3)


def test_a_damaged_small_run_is_not_held_and_queries_report_it(tmp_path, monkeypatch):
    path = tmp_path / "d.ndx"
    rng = np.random.default_rng(43)
    fps = rng.integers(0, 2**64, 4000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        ix.add(fps)
        ix._compactor.step(force_flush=True)        # one raw run a table
        ix._directories.warm = True
        snap = ix._snapshot()
        run = snap.table_runs[0][0]
        assert run.kind == KIND_RAW
        blocks = _core.run_directory_blocks(snap._directory(run))
        last, offset = blocks[len(blocks) // 2]
        victim = int(ix.plan.tables[0].invert(last))
    with open(path, "r+b") as fh:
        fh.seek(offset + 600)
        byte = fh.read(1)
        fh.seek(offset + 600)
        fh.write(bytes([byte[0] ^ 0x10]))
    monkeypatch.setattr(dircache.DirectoryCache, "hold_later",
                        lambda cache, snap, run: cache._do(snap, run, "hold"))
    with Index.open(path, readonly=True) as ix:
        ix._directories.warm = True
        for _ in range(2):
            with pytest.raises(CorruptionError, match="table 0"):
                ix.query(victim, 3)
        assert run.run_id not in ix._directories.held


def test_runs_past_the_limit_stay_on_disk(tmp_path, monkeypatch, level0_flushes):
    monkeypatch.setattr(dircache.DirectoryCache, "hold_later",
                        lambda cache, snap, run: cache._do(snap, run, "hold"))
    rng = np.random.default_rng(44)
    fps = np.unique(rng.integers(0, 2**64, 6000, dtype=np.uint64))
    with Index.create(tmp_path / "l.ndx", k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        for part in np.split(rng.permutation(fps), [500, 4000]):
            ix.add(part)
            ix._compactor._flush(ix._snapshot())    # runs of 500, 3500 and 2000, unmerged
        monkeypatch.setattr(dircache, "MEMORY_RUN_MAX_ENTRIES", 2000)
        ix._directories.warm = True
        stored = np.unique(ix.fingerprints())
        check_queries(ix, stored, near(rng, stored, 30, 3), 3)
        runs = ix._snapshot().table_runs[0]
        held = {r.run_id for r in runs if r.entries <= 2000}
        assert len(runs) == 3 and len(held) == 2 and held <= set(ix._directories.held)
        assert not {r.run_id for r in runs if r.entries > 2000} & set(ix._directories.held)



def test_a_warm_index_holds_the_runs_its_flushes_write_without_reading_them(tmp_path,
                                                                          monkeypatch):
    asked = []
    monkeypatch.setattr(dircache.DirectoryCache, "hold_later",
                        lambda cache, snap, run: asked.append(run.run_id))
    rng = np.random.default_rng(45)
    fps = np.unique(rng.integers(0, 2**64, 12000, dtype=np.uint64))
    with Index.create(tmp_path / "w.ndx", k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        ix.add(fps[:6000])
        ix._compactor.step(force_flush=True)
        assert not ix._directories.held                 # cold: nothing held
        ix._directories.warm = True
        for part in np.array_split(fps[6000:], 3):
            ix.add(part)
            ix._compactor.step(force_flush=True)
            runs = [r for runs in ix._snapshot().table_runs for r in runs]
            new = {r.run_id for r in runs}
            assert new <= set(ix._directories.held) and not new & set(asked)
            info = ix.stats()
            assert info["held_runs"] == len(runs)
            assert info["held_bytes"] == 8 * sum(r.entries for r in runs)
        check_queries(ix, fps, near(rng, fps, 60, 3), 3)


def test_an_index_only_written_to_lets_go_of_the_runs_it_merged_away(tmp_path):
    # No query builds a kernel (which drops stale values too): each
    # compaction step drops the values of the runs it merged away.
    rng = np.random.default_rng(46)
    with Index.create(tmp_path / "g.ndx", k=3, expected_n=40000, background_compaction=False,
                      log_limit=1 << 30) as ix:
        ix._directories.warm = True
        for _ in range(12):
            ix.add(rng.integers(0, 2**64, 3000, dtype=np.uint64))
            while ix._compactor.step(force_flush=True):
                live = {r.run_id for r in ix._snapshot().manifest.runs}
                assert set(ix._directories.held) <= live
        assert ix._directories.held


def test_a_raw_merge_output_is_held_as_it_grows_and_answers_stay_exact(tmp_path, many_chunks):
    # Level-0 runs merge into a raw level-1 output step by step: a warm
    # index holds what each step wrote, and a snapshot uses it only as far
    # as its own cursor; one begun while the index was cold is never held.
    rng = np.random.default_rng(47)
    fps = np.unique(rng.integers(0, 2**64, 16000, dtype=np.uint64))
    with Index.create(tmp_path / "o.ndx", k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        stored = fps[:0]
        for begun_cold in (True, False):
            ix._directories.warm = not begun_cold
            for part in np.array_split(fps[:8000] if begun_cold else fps[8000:], 3):
                ix.add(part)
                ix._compactor._flush(ix._snapshot())       # level-0 runs, unmerged
                stored = np.concatenate([stored, part])
            assert ix._compactor.step()                    # the merge's first step
            ix._directories.warm = True
            steps = 0
            while True:
                snap = ix._snapshot()
                outputs = [r for runs in snap.table_runs for r in runs if r.merge_output]
                if not outputs:
                    break
                steps += 1
                for run in outputs:
                    assert (snap._held(run) is None) == begun_cold
                check_queries(ix, stored, near(rng, stored, 15, 3), 3)
                assert ix._compactor.step()
            assert steps >= 2
        held = ix._directories.held
        finished = [r for runs in ix._snapshot().table_runs for r in runs]
        assert all(held[r.run_id].upto is None for r in finished if r.run_id in held)
        check_queries(ix, stored, near(rng, stored, 60, 3), 3)
        ix.verify()


STEP_IN_ANOTHER_PROCESS = """
import sys
from ndindex import Index, chunks, compaction
chunks.CHUNK_MAX_BLOCKS = 2
compaction.STEP_CHUNKS = 1
with Index.open(sys.argv[1], background_compaction=False) as ix:
    assert ix._compactor.step()
"""


def test_a_merge_output_another_process_went_on_with_is_not_held_from_this_ones_steps(
        tmp_path, many_chunks):
    # Writer processes share the compaction lease: the merge this index
    # held as it grew went on a step in another process, then here.  The
    # buffer it held lacked that step's values, so queries here missed
    # them (a k=0 one too, so a remove() of them was lost).
    rng = np.random.default_rng(53)
    fps = np.unique(rng.integers(0, 2**64, 12000, dtype=np.uint64))
    path = str(tmp_path / "p.ndx")
    with Index.create(path, k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        ix._directories.warm = True
        for part in np.array_split(fps, 3):
            ix.add(part)
            ix._compactor._flush(ix._snapshot())           # level-0 runs, unmerged
        assert ix._compactor.step()                        # the merge's first step, here
        subprocess.run([sys.executable, "-c", STEP_IN_ANOTHER_PROCESS, path], check=True,
                       timeout=120)
        assert ix._compactor.step()                        # and one more here
        snap = ix._snapshot()
        outputs = [r for runs in snap.table_runs for r in runs if r.merge_output]
        assert outputs and all(snap._held(r) is None for r in outputs)
        found = ix.query_many(fps, 0)
        assert len(np.unique(found["query"])) == len(fps)
        check_queries(ix, fps, near(rng, fps, 40, 3), 3)
        while ix._compactor.step():
            pass
        check_queries(ix, fps, near(rng, fps, 40, 3), 3)
