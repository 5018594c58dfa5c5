"""MinHash family, estimates, super-shingles, LSH, bottom-k."""

import numpy as np
import pytest

from ndindex.fingerprint import (Fingerprinter, MinHashFamily, bottom_k, bottom_k_jaccard,
                                 bucket_pairs, jaccard_estimate, lsh_candidate_pairs,
                                 optimal_bands, super_shingles)
from ndindex.fingerprint import reference as ref
from ndindex.fingerprint.minhash import splitmix64


def test_family_from_splitmix64():  # [FP41]
    fam = MinHashFamily(4, seed=1)
    s = splitmix64(1, 8)
    assert list(fam.a) == [v | 1 for v in s[0::2]] and list(fam.b) == s[1::2]
    assert splitmix64(0, 1) == [0xE220A8397B1DCDAF]  # SplitMix64's published first output


def test_sketch_matches_reference():  # [FP40]
    fam = MinHashFamily(16, seed=3)
    feats = np.random.default_rng(0).integers(0, 2**64, 50, dtype=np.uint64)
    assert np.array_equal(fam.sketch(feats), ref.minhash(feats, fam.a, fam.b))


def test_empty_sketch_is_all_ones():  # [FP43]
    assert (Fingerprinter().minhash("") == 0xFFFFFFFF).all()


def test_estimate_of_identical_and_disjoint():
    fam = MinHashFamily(128)
    a = np.arange(1000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    b = (np.arange(1000, dtype=np.uint64) + np.uint64(5000)) * np.uint64(0x9E3779B97F4A7C15)
    assert jaccard_estimate(fam.sketch(a), fam.sketch(a)) == 1.0
    assert jaccard_estimate(fam.sketch(a), fam.sketch(b)) < 0.05
    with pytest.raises(ValueError, match="one shape"):
        jaccard_estimate(np.zeros(3), np.zeros(4))


def test_super_shingles_shared_by_near_duplicates():
    fam = MinHashFamily(128)
    base = np.random.default_rng(1).integers(0, 2**64, 500, dtype=np.uint64)
    a, b = fam.sketch(base), fam.sketch(np.r_[base[:495], np.uint64(1)])
    assert len(np.intersect1d(super_shingles(a, 4), super_shingles(b, 4))) > 0


def test_optimal_bands_and_lsh_pairs():
    b, r = optimal_bands(0.8, 128)
    assert b * r <= 128 and r > 1
    fam = MinHashFamily(128)
    rng = np.random.default_rng(2)
    base = rng.integers(0, 2**64, 300, dtype=np.uint64)
    other = rng.integers(0, 2**64, 300, dtype=np.uint64)
    sk = np.stack([fam.sketch(base), fam.sketch(np.r_[base[:297], other[:3]]), fam.sketch(other)])
    left, right = lsh_candidate_pairs(sk, 0.8)
    assert list(zip(left, right)) == [(0, 1)]


def test_bucket_pairs_all_pairs_in_a_bucket():
    keys = np.array([[7], [3], [7], [7], [3]], dtype=np.uint64)
    left, right = bucket_pairs(keys)
    assert sorted(zip(left.tolist(), right.tolist())) == [(0, 2), (0, 3), (1, 4), (2, 3)]


def test_bottom_k_exact_for_small_sets():  # [FP44]
    a = np.arange(1, 101, dtype=np.uint64) << np.uint64(32)
    b = np.arange(21, 121, dtype=np.uint64) << np.uint64(32)
    assert bottom_k_jaccard(bottom_k(a), bottom_k(b)) == pytest.approx(80 / 120)
    assert len(bottom_k(np.arange(10**4, dtype=np.uint64) << np.uint64(32), 256)) == 256
