"""Index behaviour against a brute-force oracle (random and clustered data)."""

import numpy as np
import pytest

from ndindex import plan as plans
from ndindex.index import Index, Match
from tests.oracle import brute_force, clustered, near


@pytest.fixture
def path(tmp_path):
    return tmp_path / "test.ndx"


def check_queries(ix, stored, queries, k):
    """Every query equals brute force, via query() and query_many()."""
    many = ix.query_many(queries, k)
    stored = np.unique(stored)
    for i, q in enumerate(queries.tolist()):
        want = brute_force(stored, q, k)
        got = [(m.fingerprint, m.distance) for m in ix.query(q, k, keys=False)]
        assert got == want, f"query {q:#x}"
        rows = many[many["query"] == i]
        assert list(zip(rows["fingerprint"].tolist(), rows["distance"].tolist())) == want


@pytest.mark.parametrize("preload", [False, True], ids=["mapped", "preloaded"])
@pytest.mark.parametrize("data", ["random", "clustered"])
@pytest.mark.parametrize("where", ["log", "tables", "both"])
def test_queries_match_brute_force(path, data, where, preload):
    rng = np.random.default_rng(1)
    if data == "random":
        fps = rng.integers(0, 2**64, size=30000, dtype=np.uint64)
    else:
        fps = clustered(rng, 400, 60, 4)
    ix = Index.create(path, k=3, expected_n=len(fps), log_limit=10**9)
    if where == "log":
        ix.add(fps)
    elif where == "tables":
        ix.add(fps)
        ix.compact()
    else:
        ix.add(fps[:20000])
        ix.compact()
        ix.add(fps[20000:])
    ix.preload(preload)
    queries = np.concatenate([near(rng, fps, 150, 3), rng.integers(0, 2**64, 50, dtype=np.uint64)])
    for k in (0, 1, 3):
        check_queries(ix, fps, queries, k)
    assert ix.verify()["table_entries"] == (0 if where == "log" else len(np.unique(fps[:20000] if where == "both" else fps)))
    ix.close()


def test_results_survive_reopen(path):
    rng = np.random.default_rng(2)
    fps = clustered(rng, 200, 30, 3)
    with Index.create(path, k=3, expected_n=10000, log_limit=2000) as ix:
        ix.add(fps[:3000])
        ix.add(fps[3000:])
    with Index.open(path) as ix:
        check_queries(ix, fps, near(rng, fps, 100, 3), 3)
        assert len(ix) == len(np.unique(fps))


def test_auto_compaction_at_log_limit(path):
    rng = np.random.default_rng(3)
    with Index.create(path, k=3, expected_n=10000, log_limit=1000) as ix:
        ix.add(rng.integers(0, 2**64, 600, dtype=np.uint64))
        assert ix.stats()["log_entries"] == 600
        ix.add(rng.integers(0, 2**64, 600, dtype=np.uint64))
        s = ix.stats()
        assert s["log_entries"] == 0 and s["table_entries"] == 1200


def test_equal_fingerprints_share_an_entry_and_keep_all_keys(path):
    with Index.create(path, k=2, expected_n=100) as ix:
        ix.add([7, 7, 9], keys=["a", "b", b"c"])
        ix.add([7], keys=["d"])
        ix.compact()
        assert ix.stats()["table_entries"] == 2
        assert ix.query(7, 0) == [Match(7, 0, ("a", "b", "d"))]
        assert ix.keys(7) == ("a", "b", "d")
        assert ix.keys(9) == (b"c",)
        assert [m.fingerprint for m in ix.query(7, 2)] == [7]
        assert len(ix) == 2


def test_remove_by_fingerprint_and_by_key(path):
    rng = np.random.default_rng(4)
    fps = np.unique(clustered(rng, 50, 20, 3))
    with Index.create(path, k=3, expected_n=2000, log_limit=10**9) as ix:
        ix.add(fps, keys=[f"k{i}" for i in range(len(fps))])
        ix.compact()
        gone = fps[:100]
        assert ix.remove(fingerprints=gone) == 100
        assert ix.remove(keys=["k100", "k101"]) == 2
        live = fps[102:]
        queries = near(rng, fps, 100, 3)
        check_queries(ix, live, queries, 3)
        ix.compact()
        check_queries(ix, live, queries, 3)
        assert ix.stats()["table_entries"] == len(live)
        assert ix.keys(int(fps[0])) == ()
        ix.verify()


def test_remove_one_of_two_keys_keeps_fingerprint(path):
    with Index.create(path, k=1, expected_n=100) as ix:
        ix.add([5, 5], keys=["x", "y"])
        assert ix.remove(keys="x") == 0
        assert 5 in ix and ix.keys(5) == ("y",)
        assert ix.remove(keys="y") == 1
        assert 5 not in ix


def test_readd_after_remove_revives(path):
    with Index.create(path, k=1, expected_n=100) as ix:
        ix.add([11, 12])
        ix.compact()
        ix.remove(fingerprints=[11])
        assert 11 not in ix
        ix.add([11])
        assert 11 in ix
        ix.compact()
        assert 11 in ix and len(ix) == 2


def test_check_and_add(path):
    with Index.create(path, k=3, expected_n=100) as ix:
        assert ix.check_and_add(0b1111, key="first") == []
        found = ix.check_and_add(0b0111, key="second")
        assert [(m.fingerprint, m.distance, m.keys) for m in found] == [(0b1111, 1, ("first",))]
        assert 0b0111 not in ix


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


def test_incremental_compaction_rewrites_only_touched_blocks(path):
    rng = np.random.default_rng(5)
    fps = rng.integers(0, 2**64, 50000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=50000, log_limit=10**9) as ix:
        ix.add(fps)
        ix.compact()
        blocks = ix.stats()["tables"][0]["blocks"]
        ix.add(rng.integers(0, 2**64, 10, dtype=np.uint64))
        report = ix.compact()
        assert report["tables_rebuilt"] == 0
        assert report["blocks_rewritten"] <= 10 * len(ix.plan.tables)
        assert blocks > 200
        ix.verify()


def test_full_rebuild_recomputes_codes(path):
    rng = np.random.default_rng(6)
    with Index.create(path, k=3, expected_n=100, log_limit=10**9) as ix:
        ix.add(rng.integers(0, 2**64, 20000, dtype=np.uint64))
        report = ix.compact()
        assert report["codes_rebuilt"]
        bits = ix.stats()["tables"][0]["bits_per_fingerprint"]
        assert bits < 1.05 * ix.stats()["entropy_bound_bits"]


def test_stats_fields(path):
    with Index.create(path, k=3, expected_n=1000) as ix:
        ix.add(np.arange(1, 500, dtype=np.uint64) << np.uint64(40))
        ix.compact()
        s = ix.stats()
        assert s["fingerprints"] == 499 and s["log_entries"] == 0
        assert len(s["tables"]) == len(ix.plan.tables)
        assert s["file_bytes"] > 0 and "table 0" in s["plan"]


def test_vacuum_into_drops_free_pages(path, tmp_path):
    rng = np.random.default_rng(7)
    fps = rng.integers(0, 2**64, 40000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=40000, log_limit=10**9) as ix:
        ix.add(fps)
        ix.compact()
        ix.add(rng.integers(0, 2**64, 2000, dtype=np.uint64))
        ix.compact()  # rewrites most blocks: the old ones become free pages
        dest = tmp_path / "copy.ndx"
        size = ix.vacuum_into(dest)
        assert size < ix.stats()["file_bytes"]
        with pytest.raises(FileExistsError):
            ix.vacuum_into(dest)
    with Index.open(dest) as copy:
        copy.verify()
        assert len(copy) == len(np.unique(fps)) + 2000


def test_value_in_tables_and_log_is_reported_once(path):
    with Index.create(path, k=3, expected_n=1000, log_limit=10**9) as ix:
        ix.add([0xABCDEF, 0xABCDEE])
        ix.compact()
        ix.add([0xABCDEF])  # again: now in every table's blocks and in the log
        assert [(m.fingerprint, m.distance) for m in ix.query(0xABCDEF, 1)] == \
            [(0xABCDEF, 0), (0xABCDEE, 1)]
        many = ix.query_many([0xABCDEF], 1)
        assert many["fingerprint"].tolist() == [0xABCDEF, 0xABCDEE]


@pytest.mark.parametrize("preload", [False, True], ids=["mapped", "preloaded"])
def test_many_table_plan_at_k10_matches_brute_force(path, preload):
    # 66 tables: a near match is found by dozens of them and must come out once.
    rng = np.random.default_rng(9)
    fps = clustered(rng, 60, 40, 6)
    with Index.create(path, k=10, expected_n=1_000_000, log_limit=10**9) as ix:
        assert len(ix.plan.tables) > 20
        ix.add(fps[:1500])
        ix.compact()
        ix.add(fps[1500:])
        ix.preload(preload)
        check_queries(ix, fps, near(rng, fps, 60, 8), 10)
