"""Batch joins (ndindex.batch): pairs against brute force, self-joins, sources, workers, Dask."""

import numpy as np
import pytest

import ndindex
from ndindex import batch, fpfile, plan as plans
from tests.oracle import clustered, near, popcount64


def brute_pairs(queries, stored, k, self_join=False) -> set:
    """{(q, f, d)} over distinct queries and every stored entry (numpy, |Q| x |F|)."""
    q = np.unique(np.asarray(queries, dtype=np.uint64))
    f = np.asarray(stored, dtype=np.uint64)
    d = popcount64(q[:, None] ^ f[None, :])
    qi, fi = np.nonzero(d <= k)
    out = set(zip(q[qi].tolist(), f[fi].tolist(), d[qi, fi].tolist()))
    return {p for p in out if p[0] < p[1]} if self_join else out


def as_set(batches) -> set:
    if not isinstance(batches, np.ndarray):
        batches = list(batches)
        batches = np.concatenate(batches) if batches else np.empty(0, batch.PAIR_DTYPE)
    pairs = batches
    got = set(zip(pairs["q"].tolist(), pairs["f"].tolist(), pairs["distance"].tolist()))
    assert len(got) == len(pairs), "a pair was emitted twice"
    return got


@pytest.fixture
def data():
    rng = np.random.default_rng(11)
    stored = np.unique(np.concatenate([clustered(rng, 60, 12, 4),
                                       rng.integers(0, 2**64, 300, dtype=np.uint64)]))
    queries = np.concatenate([near(rng, stored, 200, 4), rng.integers(0, 2**64, 50, dtype=np.uint64)])
    return queries, stored


@pytest.mark.parametrize("k", range(8))
def test_join_equals_brute_force(data, k):
    queries, stored = data
    assert as_set(batch.join(queries, stored, k, workers=1, chunk_size=257)) == \
        brute_pairs(queries, stored, k)


@pytest.mark.parametrize("k", [0, 3, 7])
def test_self_join_reports_each_unordered_pair_once(data, k):
    _, stored = data
    got = as_set(batch.self_join(stored, k, workers=1))
    assert got == brute_pairs(stored, stored, k, self_join=True)
    assert all(q < f for q, f, _ in got)


def test_batches_are_sorted_and_typed(data):
    queries, stored = data
    for pairs in batch.join(queries, stored, 3, workers=1, chunk_size=200):
        assert pairs.dtype == batch.PAIR_DTYPE
        order = np.lexsort((pairs["f"], pairs["q"]))
        assert np.array_equal(order, np.arange(len(pairs)))


def test_duplicate_queries_collapse(data):
    queries, stored = data
    doubled = np.concatenate([queries, queries])
    assert as_set(batch.join(doubled, stored, 2, workers=1)) == brute_pairs(queries, stored, 2)


def test_explicit_plan_with_more_tables_gives_the_same_pairs(data):
    queries, stored = data
    got = as_set(batch.join(queries, stored, 3, plan=plans.example_3_1(10), workers=1))
    assert got == brute_pairs(queries, stored, 3)


def test_plan_below_k_raises(data):
    queries, stored = data
    with pytest.raises(ValueError):
        list(batch.join(queries, stored, 3, plan=plans.choose_plan(100, 2)))


def test_k_beyond_planner_raises(data):
    queries, stored = data
    with pytest.raises(ValueError):
        batch.QueryTables(queries, plans.MAX_PLANNER_K + 1)


def test_a_missing_source_is_named(tmp_path, data):
    queries, _ = data
    with pytest.raises(FileNotFoundError, match="no such index or fingerprint file"):
        list(batch.join(queries, str(tmp_path / "gone.ndfp"), 3, workers=1))


def test_empty_inputs():
    got = list(batch.join(np.empty(0, np.uint64), np.arange(10, dtype=np.uint64), 3, workers=1))
    assert sum(len(b) for b in got) == 0
    got = list(batch.join(np.arange(5, dtype=np.uint64), np.empty(0, np.uint64), 3, workers=1))
    assert got == []


def test_index_and_fpfile_sources_match_array(tmp_path, data):
    queries, stored = data
    with ndindex.Index.create(tmp_path / "f.ndx", k=3, expected_n=len(stored), log_limit=500) as ix:
        ix.add(stored[:1000])          # compacted into the tables
        ix.add(stored[1000:])          # stays in the log
        ix.remove(stored[5:9])
        live = ix.fingerprints()
        assert as_set(batch.join(queries, ix, 3, workers=1, chunk_size=300)) == \
            brute_pairs(queries, live, 3)
    half = len(stored) // 2
    fpfile.write_fingerprints(tmp_path / "a.ndfp", stored[:half], chunk_size=100)
    fpfile.write_fingerprints(tmp_path / "b.ndfp", stored[half:], chunk_size=100)
    sources = [str(tmp_path / "a.ndfp"), str(tmp_path / "b.ndfp")]
    assert as_set(batch.join(queries, sources, 3, workers=1)) == brute_pairs(queries, stored, 3)
    # By path, after closing: opened and closed inside the call.
    assert as_set(batch.join(str(tmp_path / "a.ndfp"), str(tmp_path / "f.ndx"), 3, workers=1)) == \
        brute_pairs(stored[:half], live, 3)


def test_an_index_of_several_runs_is_split_by_a_bound_read_without_counting(
        tmp_path, data, monkeypatch, level0_flushes):
    """Tasks are sized by Index._size_bound, which reads run headers and the
    log: len() reads table 0 whole on a file of several runs."""
    queries, stored = data
    with ndindex.Index.create(tmp_path / "f.ndx", k=3, expected_n=len(stored),
                              background_compaction=False) as ix:
        for part in np.array_split(stored, 4):     # a run each
            ix.add(part)
            ix._compactor.step(force_flush=True)
        ix.add(stored[:40])                         # again, in the log: counted twice by the bound
        ix.remove(stored[100:110])
        with ix.transaction():
            ix.add(np.array([1, 2, 3], dtype=np.uint64))
            assert ix._size_bound() >= len(ix)
        assert len(ix.stats()["tables"][0]["run_entries"]) > 1
        bound, live = ix._size_bound(), ix.fingerprints()
        assert len(live) <= bound <= len(live) + 60
        monkeypatch.setattr(type(ix), "__len__", lambda self: pytest.fail("len() was asked"))
        assert as_set(batch.join(queries, ix, 3, workers=1, chunk_size=300)) == \
            brute_pairs(queries, live, 3)


def test_self_join_of_an_index(tmp_path, data):
    _, stored = data
    path = tmp_path / "s.ndx"
    with ndindex.Index.create(path, k=3, expected_n=len(stored)) as ix:
        ix.add(stored)
    assert as_set(batch.self_join(str(path), 3, workers=1, chunk_size=400)) == \
        brute_pairs(stored, stored, 3, self_join=True)


def test_worker_processes_match_inline(tmp_path, data):
    queries, stored = data
    with ndindex.Index.create(tmp_path / "w.ndx", k=3, expected_n=len(stored)) as ix:
        ix.add(stored)
    inline = list(batch.join(queries, str(tmp_path / "w.ndx"), 3, workers=1, chunk_size=300))
    pooled = list(batch.join(queries, str(tmp_path / "w.ndx"), 3, workers=2, chunk_size=300))
    assert len(inline) == len(pooled) and all(np.array_equal(a, b) for a, b in zip(inline, pooled))


def test_join_to_files_round_trips(tmp_path, data):
    queries, stored = data
    paths = batch.join_to_files(queries, stored, 3, tmp_path / "out", workers=1, chunk_size=500)
    assert len(paths) == -(-len(stored) // 500)
    assert as_set(np.concatenate(list(fpfile.read_pairs(paths)))) == brute_pairs(queries, stored, 3)


def test_unknown_option_raises(data):
    _, stored = data
    with pytest.raises(TypeError):
        batch.self_join(stored, 3, wokers=2)


def test_query_tables_pickle_rebuilds(data):
    import pickle
    queries, stored = data
    tables = batch.QueryTables(queries, 4)
    clone = pickle.loads(pickle.dumps(tables))
    assert np.array_equal(tables.probe(stored), clone.probe(stored))


def test_dask_matches_local_pair_for_pair(tmp_path, data):
    distributed = pytest.importorskip("distributed", reason="dask extra not installed")
    queries, stored = data
    path = tmp_path / "d.ndx"
    with ndindex.Index.create(path, k=3, expected_n=len(stored)) as ix:
        ix.add(stored)
    local = list(batch.join(queries, str(path), 3, workers=1, chunk_size=300))
    local_self = list(batch.self_join(str(path), 3, workers=1, chunk_size=300))
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        remote = list(batch.join(queries, str(path), 3, client=client, chunk_size=300))
        remote_self = list(batch.self_join(str(path), 3, client=client, chunk_size=300))
        files = batch.join_to_files(queries, str(path), 3, tmp_path / "dask-out", client=client,
                                    chunk_size=300)
        for k in range(8):   # every k the planner supports, against brute force too
            on_dask = list(batch.join(queries, stored, k, client=client, chunk_size=400))
            assert as_set(on_dask) == brute_pairs(queries, stored, k)
            here = list(batch.join(queries, stored, k, workers=1, chunk_size=400))
            assert all(np.array_equal(x, y) for x, y in zip(here, on_dask))
    for a, b in [(local, remote), (local_self, remote_self)]:
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert np.array_equal(np.concatenate(local), np.concatenate(list(fpfile.read_pairs(files))))


@pytest.mark.parametrize("k", range(8, plans.MAX_PLANNER_K + 1))
def test_join_and_self_join_beyond_7_equal_brute_force(k):
    # Clusters of up to 14 flipped bits, so that pairs lie at every distance
    # around k; the planner's designs for k = 8..12 have 9-13+ tables.
    rng = np.random.default_rng(k)
    stored = np.unique(clustered(rng, 30, 12, 14))
    queries = near(rng, stored, 150, 12)
    pairs = brute_pairs(queries, stored, k)
    assert len(pairs) > 50
    assert as_set(batch.join(queries, stored, k, workers=1, chunk_size=97)) == pairs
    assert as_set(batch.self_join(stored, k, workers=1)) == \
        brute_pairs(stored, stored, k, self_join=True)
    assert sum(len(b) for b in batch.self_join(stored, k, workers=1)) == \
        len(brute_pairs(stored, stored, k, self_join=True))


@pytest.mark.parametrize("call", [
    "batch.join(np.arange(10, dtype=np.uint64), [path, path], 3, workers=2)",
    "near_duplicate_pairs(['a b c d e'] * 400, workers=2)"])
def test_a_script_without_the_main_guard_is_told_why_its_workers_died(tmp_path, call):
    # Each worker imports the main module: a script that starts its work at
    # its top level starts it again there, and multiprocessing ends the
    # worker.  BrokenProcessPool's "terminated abruptly" named no cause.
    import subprocess
    import sys
    path = tmp_path / "f.ndfp"
    fpfile.write_fingerprints(path, np.arange(100, dtype=np.uint64))
    script = tmp_path / "script.py"
    script.write_text("import numpy as np\nfrom ndindex import batch\n"
                      "from ndindex.documents import near_duplicate_pairs\n"
                      f"path = {str(path)!r}\nfor _ in {call}: pass\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 1
    said = [line for line in done.stderr.splitlines()
            if line.startswith("ndindex.procs.WorkersDied: ndindex's worker processes died")]
    assert said and 'if __name__ == "__main__":' in said[0], done.stderr[-2000:]
