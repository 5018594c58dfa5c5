"""The in-memory document pipeline against brute force: keys, candidates,
verification, pairs, clusters, short texts, workers."""

import itertools

import numpy as np
import pytest

from ndindex import documents
from ndindex.arrays import sorted_unique
from ndindex.cluster import clusters_from_pairs
from ndindex.documents import (KeyDesign, band_candidates, fingerprint_documents,
                               near_duplicate_clusters, near_duplicate_pairs, verify)
from ndindex.fingerprint import BinaryDataError, Fingerprinter, bottom_k_jaccard, extract
from ndindex.fingerprint.bands import KeyMaker, deletion_keys, exact_key
from ndindex.fingerprint.minhash import splitmix64
from ndindex.fingerprint.reference import xxh64 as ref_xxh64

FP = Fingerprinter()
_M = (1 << 64) - 1


def make_texts(seed: int, n_base: int = 60, copies: int = 3, words: tuple = (8, 120)):
    """Texts from a 3000-word vocabulary, each base followed by edited copies
    (words replaced, inserted or dropped), shuffled."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(3000)]
    texts = []
    for _ in range(n_base):
        base = list(rng.choice(vocab, rng.integers(*words)))
        texts.append(" ".join(base))
        for _ in range(rng.integers(0, copies + 1)):
            doc = list(base)
            for _ in range(rng.integers(0, 4)):
                i = int(rng.integers(0, len(doc)))
                op = rng.integers(0, 3)
                if op == 0:
                    doc[i] = str(rng.choice(vocab))
                elif op == 1:
                    doc.insert(i, str(rng.choice(vocab)))
                elif len(doc) > 3:
                    del doc[i]
            texts.append(" ".join(doc))
    order = rng.permutation(len(texts))
    return [texts[i] for i in order]


def shingle_sets(texts):
    return [sorted_unique(extract(FP.text(t), FP.minhash_features) >> np.uint64(32))
            for t in texts]


def brute_pairs(texts, threshold):
    """{(a, b): Jaccard} over all pairs, exact (sets of 32-bit shingle values)."""
    sets = [set(s.tolist()) for s in shingle_sets(texts)]
    out = {}
    for a, b in itertools.combinations(range(len(texts)), 2):
        union = len(sets[a] | sets[b])
        j = len(sets[a] & sets[b]) / union if union else 1.0
        if j >= threshold:
            out[(a, b)] = j
    return out


def ref_band_keys(features, design, seed=1):
    """Band keys from the spec's words ([DK21]), in plain Python."""
    s = splitmix64(seed, 2 * design.bands)
    keys = []
    for j in range(design.bands):
        a, b = s[2 * j] | 1, s[2 * j + 1]
        values = sorted({((a * ((x ^ (x >> 32)) & 0xFFFFFFFF) + b) & _M) >> 32
                         for x in map(int, features)})[:design.rows]
        keys.append(ref_xxh64(b"".join(v.to_bytes(4, "little") for v in values), j))
    return keys


@pytest.mark.parametrize("threshold", [0.8, 0.9, 0.6])
def test_pairs_match_brute_force(threshold):
    texts = make_texts(1)
    truth = brute_pairs(texts, threshold)
    got = near_duplicate_pairs(texts, threshold, workers=1)
    found = {(int(a), int(b)): j for a, b, j in got.pairs}
    assert len(truth) > 40
    # Short texts: the sketch is the whole set, so every reported pair is
    # true with its exact Jaccard, and recall misses only band collisions.
    assert set(found) <= set(truth)
    assert all(found[p] == pytest.approx(truth[p]) for p in found)
    assert len(found) >= 0.97 * len(truth)
    assert np.all(got.pairs["a"] < got.pairs["b"])
    assert np.all(np.diff(got.pairs["a"] * len(texts) + got.pairs["b"]) > 0)


def test_identical_pair_is_always_found_whatever_its_simhash():
    base = " ".join(f"w{i}" for i in range(200))
    edited = base.replace("w10 ", "x10 ").replace("w150", "y150")
    texts = [base, edited, base]
    got = near_duplicate_pairs(texts, 0.8, workers=1)
    assert [(a, b) for a, b, _ in got.pairs.tolist()] == [(0, 1), (0, 2), (1, 2)]
    assert got.pairs["jaccard"][1] == 1.0


def test_clusters_are_components_of_the_pairs():
    texts = make_texts(2) + ["identical text of eight words or so here"] * 4
    pairs = near_duplicate_pairs(texts, 0.8, workers=1)
    clusters = near_duplicate_clusters(texts, 0.8, workers=1)
    expected = clusters_from_pairs(len(texts), pairs.pairs["a"], pairs.pairs["b"])
    assert [c.tolist() for c in clusters] == [c.tolist() for c in expected]
    assert len(clusters) > 10
    assert [len(c) for c in near_duplicate_clusters(texts, 0.8, min_size=4, workers=1)] \
        == [len(c) for c in expected if len(c) >= 4]


def test_identical_group_expands_to_every_pair():
    texts = ["one two three four five six seven eight"] * 30 + ["something else entirely"]
    got = near_duplicate_pairs(texts, workers=1)
    assert len(got) == 30 * 29 // 2
    assert np.all(got.pairs["jaccard"] == 1.0)
    assert len(near_duplicate_clusters(texts, workers=1).clusters) == 1


def test_short_texts_match_exactly_only_with_a_note():
    texts = ["Hello, world!", "hello world", "hello world again", "a b c d e f",
             "a b c d e f g", "a b c d e f g h i j k", "a b c d e f g h i j k l"]
    got = near_duplicate_pairs(texts, 0.8, workers=1)
    # 4 shingles in 5 (Jaccard 0.8) and 9 in 10 (0.9): deletion keys find both;
    # texts of under 4 shingles can only equal another.
    assert [(int(a), int(b)) for a, b, _ in got.pairs] == [(0, 1), (3, 4), (5, 6)]
    assert got.exact_only.tolist() == [0, 1, 2]
    assert "exact duplicates only" in got.note and "6 words" in got.note
    at_09 = near_duplicate_pairs(texts, 0.9, workers=1)
    assert [(int(a), int(b)) for a, b, _ in at_09.pairs] == [(0, 1), (5, 6)]
    assert at_09.exact_only.tolist() == [0, 1, 2, 3, 4] and "11 words" in at_09.note
    assert near_duplicate_pairs(["a b c d e f g h"] * 2, workers=1).note is None


def test_every_small_pair_at_08_is_found():
    # [DK26]: all sets of at most 9 shingles one value apart, whatever the bands do.
    rng = np.random.default_rng(9)
    texts = []
    for size in range(4, 10):
        for _ in range(20):
            words = [f"v{x}" for x in rng.choice(100_000, size + 2, replace=False)]
            texts += [" ".join(words), " ".join(words + ["extra"])]
    truth = brute_pairs(texts, 0.8)
    got = near_duplicate_pairs(texts, 0.8, workers=1)
    assert {(int(a), int(b)) for a, b, _ in got.pairs} == set(truth)
    assert len(truth) == 120


def test_empty_texts_are_duplicates_of_each_other():
    got = near_duplicate_pairs(["", "  ", "...", "real words here and more of them"], workers=1)
    assert [(int(a), int(b), j) for a, b, j in got.pairs] == [(0, 1, 1.0), (0, 2, 1.0),
                                                              (1, 2, 1.0)]


def test_band_keys_match_the_spec_reference():
    design = KeyDesign(bands=7, rows=3)
    maker = KeyMaker(design, minhash_seed=5)
    for text in ["", "one", "a b c d e", " ".join(f"w{i}" for i in range(300))]:
        feats = extract(text, FP.minhash_features)
        assert maker.band_keys(feats).tolist() == ref_band_keys(feats, design, seed=5)
    feats = np.array([5, 5, 7, 2**64 - 1, 5], dtype=np.uint64)   # repeats count once
    assert maker.band_keys(feats).tolist() == ref_band_keys(feats, design, seed=5)


def test_lookup_keys_exact_key_first_then_bands():
    maker = KeyMaker(KeyDesign(), 1)
    feats = extract("one two three four five six seven eight nine", FP.minhash_features)
    sketch = FP.sketch("one two three four five six seven eight nine")
    keys = maker.lookup_keys(feats, sketch)
    assert keys[0] == exact_key(sketch)
    assert keys[1:21].tolist() == maker.band_keys(feats).tolist()
    assert keys[21:].tolist() == deletion_keys(sketch).tolist() and len(keys) == 28
    short = FP.sketch("one two three four five six")
    assert maker.lookup_keys(extract("one two three four five six", FP.minhash_features),
                             short).tolist() == [exact_key(short)]
    long_text = " ".join(f"w{i}" for i in range(20))
    assert len(maker.lookup_keys(extract(long_text, FP.minhash_features),
                                 FP.sketch(long_text))) == 21


def test_band_candidates_are_exactly_the_pairs_sharing_a_key():
    docs = fingerprint_documents(make_texts(3), workers=1)
    left, right = band_candidates(docs)
    keys = [set(docs.lookup_keys(i).tolist()) for i in range(len(docs))]
    expected = {(a, b) for a, b in itertools.combinations(range(len(docs)), 2)
                if keys[a] & keys[b]}
    assert set(zip(left.tolist(), right.tolist())) == expected
    assert len(left) == len(expected)


def test_verify_equals_bottom_k_jaccard_for_short_and_long_sketches():
    rng = np.random.default_rng(4)
    sketches = []
    for size in (0, 1, 5, 300, 1024, 1024, 700):
        base = rng.choice(2**32, 3000, replace=False).astype(np.uint32)
        sketches.append(np.sort(base[:size]))
    sketches.append(np.sort(np.concatenate([sketches[4][:900],
                                            rng.integers(0, 2**32, 124, dtype=np.uint32)])))
    sketches = [sorted_unique(s) for s in sketches]
    docs = documents.DocumentSketches(
        np.concatenate(sketches).astype(np.uint32),
        np.r_[0, np.cumsum([len(s) for s in sketches])].astype(np.int64),
        np.empty(0, np.uint64), np.zeros(len(sketches) + 1, np.int64), 1024, KeyDesign())
    left, right = np.triu_indices(len(sketches))
    got = verify(docs, left, right)
    want = [bottom_k_jaccard(sketches[a], sketches[b], 1024) for a, b in zip(left, right)]
    assert got.tolist() == pytest.approx(want)
    with pytest.raises(ValueError):
        verify(docs, [0], [len(sketches)])


def test_candidate_generator_is_pluggable():
    texts = make_texts(5)

    def all_pairs(docs):
        a, b = np.triu_indices(len(docs), 1)
        return a.astype(np.int64), b.astype(np.int64)

    got = near_duplicate_pairs(texts, 0.8, workers=1, candidates=all_pairs)
    assert {(int(a), int(b)) for a, b, _ in got.pairs} == set(brute_pairs(texts, 0.8))


def test_workers_give_the_same_result(monkeypatch):
    monkeypatch.setattr(documents, "TEXTS_PER_TASK", 50)
    texts = make_texts(6)
    one = fingerprint_documents(texts, workers=1)
    two = fingerprint_documents(texts, workers=2)
    for name in ("values", "offsets", "keys", "key_offsets"):
        assert np.array_equal(getattr(one, name), getattr(two, name))
    a = near_duplicate_pairs(texts, workers=1).pairs
    b = near_duplicate_pairs(texts, workers=2).pairs
    assert np.array_equal(a, b)


def test_take_and_concatenate_keep_documents():
    docs = fingerprint_documents(make_texts(7, n_base=10), workers=1)
    picked = docs.take([3, 0, 5])
    assert [picked.sketch(i).tolist() for i in range(3)] == \
        [docs.sketch(i).tolist() for i in (3, 0, 5)]
    both = documents.DocumentSketches.concatenate([picked, docs], docs.bottom_k, docs.design)
    assert len(both) == 3 + len(docs)
    assert both.lookup_keys(4).tolist() == docs.lookup_keys(1).tolist()


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        near_duplicate_pairs(["a"], threshold=0.0)
    with pytest.raises(ValueError):
        near_duplicate_pairs(["a"], threshold=1.5)
    with pytest.raises(ValueError):
        near_duplicate_pairs(["a"], workers=0)
    with pytest.raises(ValueError):
        near_duplicate_clusters(["a"], min_size=0)
    with pytest.raises(TypeError):
        near_duplicate_pairs(["a", 3])
    with pytest.raises(BinaryDataError):
        near_duplicate_pairs([b"\x00\x01binary"])
    assert len(near_duplicate_pairs([])) == 0


@pytest.mark.parametrize("call", [
    lambda t: near_duplicate_pairs(t), lambda t: near_duplicate_clusters(t),
    lambda t: fingerprint_documents(t), lambda t: Fingerprinter().simhash_many(t),
    lambda t: Fingerprinter().minhash_many(t), lambda t: Fingerprinter().learn_idf(t)])
@pytest.mark.parametrize("one", ["a text of a few words here", b"a text of a few words here"])
def test_one_text_where_many_are_asked_is_a_type_error_not_a_text_per_character(call, one):
    # Iterated, a str is a document per character: pairs of every letter.
    with pytest.raises(TypeError, match=r"got one (str|bytes): give \[text\]"):
        call(one)


def test_key_design_for_threshold_and_bytes():
    assert KeyDesign.for_threshold(0.8) == KeyDesign()
    assert KeyDesign.for_threshold(0.9) == KeyDesign()
    low = KeyDesign.for_threshold(0.6)
    assert low.bands > 20 and low.candidate_probability(60, 100) >= 0.999
    assert KeyDesign.from_bytes(low.to_bytes()) == low
    assert KeyDesign().candidate_probability(8, 10) == pytest.approx(0.993, abs=1e-3)
    with pytest.raises(ValueError):
        KeyDesign(bands=0)
    with pytest.raises(ValueError):
        KeyDesign.for_threshold(0.05)


def test_verify_with_threshold_is_exact_above_it_and_below_it_otherwise():
    rng = np.random.default_rng(11)
    pool = rng.choice(2**32, 50_000, replace=False).astype(np.uint32)
    sketches = []
    for _ in range(40):     # overlaps from none to nearly all, sizes 1..3000
        size = int(rng.integers(1, 3000))
        start = int(rng.integers(0, 2000))
        sketches.append(np.sort(pool[start:start + size])[:1024])
    docs = documents.DocumentSketches(
        np.concatenate(sketches), np.r_[0, np.cumsum([len(s) for s in sketches])].astype(np.int64),
        np.empty(0, np.uint64), np.zeros(len(sketches) + 1, np.int64), 1024, KeyDesign())
    left, right = np.triu_indices(len(sketches), 1)
    exact = verify(docs, left, right)
    for t in (0.3, 0.8, 0.95):
        fast = verify(docs, left, right, t)
        above = exact >= t
        assert np.array_equal(fast[above], exact[above])
        assert np.all(fast[~above] < t) and np.all(fast[~above] >= exact[~above])
        assert 0 < above.sum() < len(exact)


def test_a_long_text_sketched_in_pieces_gets_what_it_gets_whole(monkeypatch):
    # Past PIECE_CHARS a text's sketch and band keys are built a piece at a
    # time (the bottom-k of the pieces' bottom-k, band minima carried in a
    # state), so that its features are never held at once; the result is
    # the whole text's.
    from ndindex.fingerprint import features as features_mod
    rng = np.random.default_rng(5)
    vocab = [f"w{i}" for i in range(5000)]
    texts = [" ".join(rng.choice(vocab, n)) for n in (3, 40, 900, 4000)]
    whole = fingerprint_documents(texts, FP, workers=1, simhash=True)
    monkeypatch.setattr(features_mod, "PIECE_CHARS", 300)
    pieces = fingerprint_documents(texts, FP, workers=1, simhash=True)
    for field in ("values", "offsets", "keys", "key_offsets", "simhashes"):
        assert np.array_equal(getattr(pieces, field), getattr(whole, field)), field
    assert len(whole.sketch(3)) == FP.bottom_k                 # the long ones fill their sketch
    # The band state: any split of the features gives the keys of all of them.
    maker = KeyMaker(KeyDesign(), FP.minhash_seed)
    feats = extract(texts[3], FP.minhash_features)
    state = maker.band_state()
    for part in np.array_split(feats[::-1], 7):
        keys = maker.band_keys(part, state)
    assert np.array_equal(keys, maker.band_keys(feats))
    with pytest.raises(ValueError, match="band state must be"):
        maker.band_keys(feats, bytearray(8))
