"""check_and_add_many: one call that does what check_and_add on each fingerprint in turn does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ndindex.errors import ReadOnlyError
from ndindex.index import MATCH_DTYPE, Index
from tests.oracle import brute_force, clustered, near
from tests.unit.test_index import put_in_state


def batch_with_partners(rng, stored: np.ndarray, n: int) -> np.ndarray:
    """n fingerprints: fresh ones, near copies of stored ones, near copies and
    exact repeats of earlier ones in the batch, shuffled."""
    fresh = rng.integers(0, 2**64, n // 2, dtype=np.uint64)
    out = np.concatenate([fresh, near(rng, stored, n // 6, 3), near(rng, fresh, n // 6, 3),
                          fresh[:n - n // 2 - 2 * (n // 6)]])
    return out[rng.permutation(len(out))]


def one_at_a_time(ix, fps, keys, k) -> np.ndarray:
    """What check_and_add in a loop returns, as check_and_add_many's array."""
    rows = []
    for i, fp in enumerate(fps.tolist()):
        for m in ix.check_and_add(fp, key=None if keys is None else keys[i], k=k):
            rows.append((i, m.fingerprint, m.distance))
    return np.array(rows, dtype=MATCH_DTYPE)


def twin_indexes(tmp_path, stored, state):
    twins = []
    for name in ("many", "loop"):
        ix = Index.create(str(tmp_path / f"{name}.ndx"), k=3, expected_n=len(stored),
                          background_compaction=False)
        put_in_state(ix, stored, state)
        twins.append(ix)
    return twins


@pytest.mark.parametrize("state", ["log", "several-runs", "main"])
@pytest.mark.parametrize("k", [3, 1])
def test_same_matches_and_additions_as_check_and_add_in_a_loop(tmp_path, state, k):
    rng = np.random.default_rng([31, k])
    stored = np.unique(clustered(rng, 300, 10, 2))
    fps = batch_with_partners(rng, stored, 3000)
    keys = [f"doc{i}" if i % 3 else None for i in range(len(fps))]
    many, loop = twin_indexes(tmp_path, stored, state)
    with many, loop:
        got = many.check_and_add_many(fps, keys=keys, k=k)
        want = one_at_a_time(loop, fps, keys, k)
        assert len(want) and np.array_equal(got, want)
        assert np.array_equal(many.fingerprints(), loop.fingerprints())
        for fp in np.unique(fps).tolist():
            assert many.keys(fp) == loop.keys(fp)


def test_matches_are_the_stored_and_earlier_added_fingerprints_within_k(tmp_path):
    rng = np.random.default_rng(32)
    stored = np.unique(rng.integers(0, 2**64, 2000, dtype=np.uint64))
    fps = batch_with_partners(rng, stored, 1500)
    with Index.create(str(tmp_path / "a.ndx"), k=3, expected_n=4000) as ix:
        ix.add(stored)
        got = ix.check_and_add_many(fps)
        have = set(stored.tolist())
        added = []
        for i, fp in enumerate(fps.tolist()):
            mine = got[got["query"] == i]
            want = brute_force(np.array(sorted(have), dtype=np.uint64), fp, 3)
            assert list(zip(mine["fingerprint"].tolist(), mine["distance"].tolist())) == want
            if not want:
                have.add(fp)
                added.append(fp)
        assert np.array_equal(ix.fingerprints(), np.array(sorted(have), dtype=np.uint64))
        assert len(added) < len(fps)


def test_inside_a_transaction_it_sees_and_joins_the_pending_operations(tmp_path):
    rng = np.random.default_rng(33)
    stored = rng.integers(0, 2**64, 500, dtype=np.uint64)
    many, loop = twin_indexes(tmp_path, stored, "one-run")
    fps = batch_with_partners(rng, stored, 600)
    with many, loop:
        with many.transaction(), loop.transaction():
            results = []
            for ix, call in ((many, lambda ix: ix.check_and_add_many(fps)),
                             (loop, lambda ix: one_at_a_time(ix, fps, None, None))):
                ix.remove(fingerprints=stored[:100])  # pending: the batch must not match them
                ix.add(fps[:5])                        # pending: the batch must match them
                results.append(call(ix))
            assert len(results[0]) and np.array_equal(*results)
        assert np.array_equal(many.fingerprints(), loop.fingerprints())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 60), k=st.integers(0, 3))
def test_small_batches_of_near_fingerprints_match_the_loop(tmp_path_factory, seed, n, k):
    # Few bits in play: partners within the batch, repeats and stored
    # matches are all common.
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 2**64, dtype=np.uint64)
    def some(m):
        return base ^ rng.integers(0, 64, m, dtype=np.uint64) ^ \
            (rng.integers(0, 2, m, dtype=np.uint64) << np.uint64(63))
    stored, fps = some(20), some(n)
    d = tmp_path_factory.mktemp("h")
    many, loop = twin_indexes(d, stored, "log")
    with many, loop:
        assert np.array_equal(many.check_and_add_many(fps, k=k), one_at_a_time(loop, fps, None, k))
        assert np.array_equal(many.fingerprints(), loop.fingerprints())


def test_bad_input_writes_nothing(tmp_path):
    path = str(tmp_path / "a.ndx")
    with Index.create(path, k=3, expected_n=100) as ix:
        with pytest.raises(ValueError, match="keys"):
            ix.check_and_add_many([1, 2, 3], keys=["a", "b"])
        with pytest.raises(ValueError):
            ix.check_and_add_many([1, 2], k=4)
        with pytest.raises(TypeError):
            ix.check_and_add_many(["x"])
        assert len(ix) == 0
        empty = ix.check_and_add_many([])
        assert empty.dtype == MATCH_DTYPE and len(empty) == 0 and len(ix) == 0
    with Index.open(path, readonly=True) as ix, pytest.raises(ReadOnlyError):
        ix.check_and_add_many([1])


def test_an_index_of_a_probabilistic_plan_answers_as_its_check_and_add(tmp_path):
    rng = np.random.default_rng(34)
    stored = np.unique(clustered(rng, 100, 10, 2))
    fps = batch_with_partners(rng, stored, 800)
    twins = []
    for name in ("many", "loop"):
        ix = Index.create(str(tmp_path / f"{name}.ndx"), k=3, expected_n=len(stored),
                          plan="psm", background_compaction=False)
        ix.add(stored)
        twins.append(ix)
    many, loop = twins
    with many, loop:
        assert np.array_equal(many.check_and_add_many(fps), one_at_a_time(loop, fps, None, None))
        assert np.array_equal(many.fingerprints(), loop.fingerprints())
