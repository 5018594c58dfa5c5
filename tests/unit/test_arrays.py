"""Set operations on sorted uint64 arrays (ndindex.arrays) against numpy's own."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ndindex import arrays

u64 = st.integers(0, 2**64 - 1)


def as_sorted(values) -> np.ndarray:
    return np.unique(np.array(values, dtype=np.uint64))


@settings(max_examples=200, deadline=None)
@given(st.lists(u64, max_size=300), st.lists(u64, max_size=300))
def test_insert_sorted_is_the_union_of_disjoint_sorted_arrays(base, new):
    base = as_sorted(base)
    new = as_sorted(new)
    new = new[~np.isin(new, base)]
    got = arrays.insert_sorted(base, new)
    assert got.dtype == np.uint64
    assert np.array_equal(got, np.union1d(base, new))


@pytest.mark.parametrize("n_base, n_new", [(10_000, 3), (3, 10_000), (5_000, 5_000), (0, 7), (7, 0)])
def test_insert_sorted_both_ways(n_base, n_new):
    # Far longer base: np.insert; otherwise the merge by stable sort.
    rng = np.random.default_rng(n_base + n_new)
    both = as_sorted(rng.integers(0, 2**64, n_base + n_new, dtype=np.uint64))
    pick = np.zeros(len(both), bool)
    pick[rng.choice(len(both), min(n_new, len(both)), replace=False)] = True
    assert np.array_equal(arrays.insert_sorted(both[~pick], both[pick]), both)


@settings(max_examples=200, deadline=None)
@given(st.lists(u64, max_size=200), st.lists(u64, max_size=200), st.lists(u64, max_size=50))
def test_merge_unique_and_isin_sorted(existing, new, gone):
    existing, new, gone = as_sorted(existing), as_sorted(new), as_sorted(gone)
    want = np.setdiff1d(np.union1d(existing, new), gone)
    assert np.array_equal(arrays.merge_unique([existing, new], gone), want)
    assert np.array_equal(arrays.merge_unique([new, existing, new[::2]]), np.union1d(existing, new))
    values = np.concatenate([new, existing[:5]])
    assert np.array_equal(arrays.isin_sorted(values, existing), np.isin(values, existing))
    assert np.array_equal(arrays.sorted_unique(np.concatenate([new, new[::-1]])), new)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 2**64 - 1)), min_size=1, max_size=6),
       st.integers(0, 2**32))
def test_merge_unique_of_long_overlapping_runs(shapes, seed):
    # Runs past merge2's two-chain threshold (64 values), drawn from ranges
    # of every width: from a few hundred values (most of them in several
    # runs, equal pairs on both sides of the split) to the whole 64 bits.
    rng = np.random.default_rng(seed)
    parts = [as_sorted(rng.integers(0, width, n, dtype=np.uint64, endpoint=True))
             for n, width in shapes]
    hidden = as_sorted(np.concatenate(parts)[::7]) if seed % 2 else arrays.EMPTY_U64
    want = np.setdiff1d(np.unique(np.concatenate(parts)), hidden)
    assert np.array_equal(arrays.merge_unique(parts, hidden), want)
    assert np.array_equal(arrays.merge_unique(parts[::-1], hidden), want)


def test_copy_holding_gil_is_a_writable_copy_of_its_own():
    from ndindex.arrays import copy_holding_gil
    a = np.arange(5000, dtype=np.uint64) * np.uint64(3)
    b = copy_holding_gil(a[:4000])
    assert b.dtype == np.uint64 and b.flags.writeable and np.array_equal(b, a[:4000])
    b[0] = 7
    assert a[0] == 0 and len(copy_holding_gil(a[:0])) == 0
