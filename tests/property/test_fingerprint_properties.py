"""Hypothesis: kernel vs twin, invariances, estimates, round trips."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ndindex.cluster import component_labels
from ndindex.fingerprint import (FeatureSpec, Fingerprinter, MinHashFamily, extract,
                                 jaccard_estimate, normalize_text, simhash)
from ndindex.fingerprint import reference as ref
from ndindex import _core

u64 = st.integers(0, 2**64 - 1)
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)


@given(st.binary(max_size=100), u64)
def test_xxh64_kernel_equals_twin(data, seed):  # [FP20]
    assert _core.xxh64(data, seed) == ref.xxh64(data, seed)


@given(texts, st.sampled_from(["words", "chars", "lines"]), st.integers(1, 4))
@settings(max_examples=150)
def test_features_kernel_equals_twin(text, unit, ngram):  # [FP11]-[FP16]
    spec = FeatureSpec(unit=unit, ngram=ngram)
    assert list(extract(text, spec)) == ref.features(normalize_text(text), unit, ngram)


@given(st.binary(max_size=200))
def test_features_of_arbitrary_bytes_never_crash(data):  # [FP02]
    feats, _, _ = _core.extract(data, b"", 0, 2, 0, 0, b"", True, False)
    assert len(feats) % 8 == 0


@given(st.lists(u64, max_size=60), st.randoms())
def test_simhash_invariant_under_permutation(feats, rnd):  # [FP30]
    arr = np.array(feats, dtype=np.uint64)
    shuffled = list(feats)
    rnd.shuffle(shuffled)
    assert simhash(arr) == simhash(np.array(shuffled, dtype=np.uint64))
    assert simhash(arr) == ref.simhash(feats)[0]


@given(st.integers(50, 400), st.integers(0, 400), st.integers(0, 2**32))
@settings(max_examples=40, deadline=None)
def test_jaccard_estimate_within_tolerance(n_common, n_extra, seed):
    rng = np.random.default_rng(seed)
    common = rng.integers(0, 2**64, n_common, dtype=np.uint64)
    a = np.r_[common, rng.integers(0, 2**64, n_extra, dtype=np.uint64)]
    b = np.r_[common, rng.integers(0, 2**64, n_extra, dtype=np.uint64)]
    truth = n_common / (n_common + 2 * n_extra)
    fam = MinHashFamily(256, seed=seed)
    est = jaccard_estimate(fam.sketch(a), fam.sketch(b))
    sd = max(np.sqrt(truth * (1 - truth) / 256), 1 / 256)
    assert abs(est - truth) <= 5 * sd + 0.01


@given(st.sampled_from(["words", "chars", "lines"]), st.integers(1, 8),
       st.sampled_from(["tf", "binary", "logtf"]), st.integers(1, 512), u64, st.booleans(),
       st.one_of(st.none(), st.lists(st.text(min_size=1, max_size=8), max_size=5)))
def test_fingerprinter_round_trip(unit, ngram, weighting, num_perm, seed, html, stop):  # [FP50]
    stop = None if unit == "chars" else stop
    fp = Fingerprinter(features=FeatureSpec(unit=unit, ngram=ngram, seed=seed, stop_words=stop),
                       weighting=weighting, num_perm=num_perm, minhash_seed=seed, html=html)
    back = Fingerprinter.from_bytes(fp.to_bytes())
    assert back == fp and back.to_bytes() == fp.to_bytes()


@given(st.integers(1, 60), st.lists(st.tuples(st.integers(0, 59), st.integers(0, 59)), max_size=80))
def test_cluster_labels_match_naive_union_find(n, pairs):
    pairs = [(a % n, b % n) for a, b in pairs]
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x
    for a, b in pairs:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    want = [find(i) for i in range(n)]
    left = [a for a, _ in pairs]
    right = [b for _, b in pairs]
    assert component_labels(n, left, right).tolist() == want


@given(st.text(alphabet=st.sampled_from("aAeE \u0301\u0308\u0327ÅﬁẞΣσςİ\u1e9e\uab70Ꭰ①\u212b\ufb01x\u0345"
                                      "\u0399\u03b9\u1f80\u00b4\u3000\uff21")) | texts)
@settings(max_examples=300)
def test_fast_normalisation_equals_nfkc_casefold(text):  # [FP10]
    from ndindex.fingerprint.normalize import normalize_utf8
    assert normalize_utf8(text) == normalize_text(text).encode("utf-8", "surrogatepass")
