"""Union-find clusters."""

import numpy as np
import pytest

from ndindex.cluster import UnionFind, clusters_from_pairs, component_labels


def test_clusters_from_pairs():
    clusters = clusters_from_pairs(7, [0, 1, 4, 6], [1, 2, 5, 6])
    assert [c.tolist() for c in clusters] == [[0, 1, 2], [4, 5]]


def test_labels_are_smallest_member():
    assert component_labels(5, [4, 3], [3, 1]).tolist() == [0, 1, 2, 1, 1]


def test_long_chain_merges():
    n = 10000
    labels = component_labels(n, np.arange(n - 1)[::-1], np.arange(1, n)[::-1])
    assert (labels == 0).all()


def test_union_find_incremental_matches_batch():
    rng = np.random.default_rng(0)
    left, right = rng.integers(0, 300, 200), rng.integers(0, 300, 200)
    uf = UnionFind(300)
    for a, b in zip(left[:100], right[:100]):
        uf.union(int(a), int(b))
    uf.union_many(left[100:], right[100:])
    uf.check()
    assert np.array_equal(uf.labels(), component_labels(300, left, right))
    uf.grow(310)
    assert uf.find(305) == 305 and len(uf) == 310


def test_bad_pairs_rejected():
    with pytest.raises(ValueError, match=r"in \[0, 3\)"):
        component_labels(3, [0], [3])
    with pytest.raises(ValueError, match="one length"):
        component_labels(3, [0, 1], [1])
