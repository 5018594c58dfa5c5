"""verify()'s table check: every table holds the same fingerprints, read in slices.

The check reads each table's runs side by side a few chunks at a time and
compares the tables by a digest of their sets; these tests run it with
one-block chunks read one at a time, so every index here spans many
slices, in every state the runs can be in.
"""

from __future__ import annotations

import numpy as np
import pytest

from ndindex import _core, checker, chunks as ch, compaction, runs as rn
from ndindex.errors import CorruptionError
from ndindex.index import Index
from ndindex.records import DB_CHUNKS, DB_META, KEY_STATE, State, unframe
from tests.unit.test_index import STATES, flush, put_in_state


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "test.ndx")


@pytest.fixture
def one_block_reads(monkeypatch):
    """One-block chunks, merged and read one at a time; returns the largest read seen."""
    monkeypatch.setattr(compaction, "STEP_CHUNKS", 1)
    monkeypatch.setattr(ch, "CHUNK_MAX_BLOCKS", 1)
    monkeypatch.setattr(checker, "READ_CHUNKS", 1)
    largest = [0]
    read = rn.read_values

    def recording(*args, **kwargs):
        sl = read(*args, **kwargs)
        largest[0] = max(largest[0], len(sl.values))
        return sl
    monkeypatch.setattr(rn, "read_values", recording)
    return largest


@pytest.mark.parametrize("state", STATES)
def test_verify_reads_tables_in_slices_in_every_state(path, state, one_block_reads):
    rng = np.random.default_rng(11)
    fps = np.unique(rng.integers(0, 2**64, 6000, dtype=np.uint64))
    with Index.create(path, k=3, background_compaction=False) as ix:
        put_in_state(ix, fps, state)
        report = ix.verify()
        in_runs = 0 if state == "log" else len(fps)
        assert report["table_entries"] == in_runs
        if in_runs:
            # A block's worth at a time, never a whole table.
            assert 0 < one_block_reads[0] <= ch.BLOCK_BYTES // 8


def test_verify_counts_a_value_in_two_runs_once_and_leaves_tombstones_out(path,
                                                                            one_block_reads):
    rng = np.random.default_rng(12)
    fps = np.unique(rng.integers(0, 2**64, 4000, dtype=np.uint64))
    with Index.create(path, k=3, background_compaction=False) as ix:
        ix.add(fps)
        flush(ix)
        ix.add(fps[:500])            # again: now in two runs of every table
        flush(ix)
        ix.remove(fingerprints=fps[3000:])
        flush(ix)                    # tombstones beside the runs that hold them
        assert ix.verify()["table_entries"] == 3000
        ix.compact()
        assert ix.verify()["table_entries"] == 3000


def _replace_one_value(ix, table: int) -> None:
    """Rewrite table's run with one value changed: every chunk, checksum, count and
    bound stays right, so only the comparison of the tables can tell."""
    snap = ix._snapshot()
    (run,) = snap.table_runs[table]
    values = rn.all_values(snap.view, run).copy()
    gaps = np.nonzero(np.diff(values) > 2)[0]
    i = int(gaps[len(gaps) // 2])
    values[i + 1] = values[i] + np.uint64(1)   # still sorted, distinct, same ends
    old = rn.chunk_keys(snap.view, run)
    pairs = rn.build_fp_chunks(run.space, run.run_id, run.kind, values, rn.run_code(run),
                               None, True)[0]
    assert len(pairs) == run.chunks

    def body(wt):
        for key in old:
            wt.delete(DB_CHUNKS, key)
        for key, value in pairs:
            wt.put(DB_CHUNKS, key, value)
        state = State.unpack(unframe(wt.view.get(DB_META, KEY_STATE), DB_META, KEY_STATE))
        state.txnid = wt.txnid   # the commit record of this commit ([F9])
        wt.put_framed(KEY_STATE, state.pack())
    ix._store.write(body)


@pytest.mark.parametrize("table", [0, 2])
def test_verify_finds_a_table_that_holds_other_fingerprints(path, table, monkeypatch):
    monkeypatch.setattr(checker, "READ_CHUNKS", 1)
    fps = np.unique(np.random.default_rng(13).integers(0, 2**64, 5000, dtype=np.uint64))
    with Index.create(path, k=3, background_compaction=False) as ix:
        ix.add(fps)
        ix.compact(full=True)
        ix.verify()
        _replace_one_value(ix, table)
        other = 1 if table == 0 else table  # the first to differ from table 0
        with pytest.raises(CorruptionError, match=f"table {other} holds different fingerprints"):
            ix.verify()


def test_verify_reports_progress_over_every_table_entry(path, monkeypatch):
    monkeypatch.setattr(checker, "READ_CHUNKS", 1)
    monkeypatch.setattr(ch, "CHUNK_MAX_BLOCKS", 1)
    fps = np.unique(np.random.default_rng(14).integers(0, 2**64, 3000, dtype=np.uint64))
    with Index.create(path, k=3, background_compaction=False) as ix:
        ix.add(fps)
        ix.compact()
        calls = []
        ix.verify(progress=lambda phase, done, total: calls.append((phase, done, total)))
    tables = len(ix.plan.tables)
    assert len(calls) > tables and {c[0] for c in calls} == {"verify"}
    assert [c[1] for c in calls] == sorted(c[1] for c in calls)
    assert calls[-1][1:] == (tables * len(fps), tables * len(fps))


def test_the_lmdb_check_follows_commits_of_another_process(path):
    """The C checker reads the newest meta page, not the snapshot's: after
    another process committed past the snapshot's pages, the snapshot's
    bounds made a healthy file look damaged (verify() beside a writer
    failed now and then, and vacuum_into, which checks before it copies,
    would have).  With the file's map it checks the file as it is."""
    import subprocess
    import sys
    with Index.create(path, k=3, expected_n=10_000) as ix:
        ix.add(np.arange(1, 2001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    with Index.open(path, readonly=True) as reader:
        view = reader._snapshot().view
        subprocess.run([sys.executable, "-c",
                        "import sys, numpy as np, ndindex\n"
                        "with ndindex.open(sys.argv[1]) as ix:\n"
                        "    rng = np.random.default_rng(3)\n"
                        "    for _ in range(20):\n"
                        "        ix.add(rng.integers(0, 2**64, 5000, dtype=np.uint64))\n", path],
                       check=True, timeout=120)
        with pytest.raises(CorruptionError, match="past the end of the file"):
            # The snapshot's bounds, the newest trees: what check_lmdb did.
            _core.lmdb_check(view.buf, view.psize, view.npages)
        assert checker.check_lmdb(view, reader._store.filemap)["txnid"] > view.txnid
        reader.verify()
        reader.vacuum_into(path + ".copy")
    with Index.open(path + ".copy", readonly=True) as copy:
        assert len(copy) > 2000
        copy.verify()
