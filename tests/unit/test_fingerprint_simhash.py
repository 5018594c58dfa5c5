"""simhash, weights and the Fingerprinter contract."""

import numpy as np
import pytest

from ndindex.errors import FormatError
from ndindex.fingerprint import (FORMAT_VERSION, BinaryDataError, FeatureSpec, Fingerprinter,
                                 IdfTable, hamming, simhash, simhash_with_weights, weigh)
from ndindex.fingerprint import reference as ref

#: [FP60] the default Fingerprinter's simhash of this text (see the spec).
VECTOR_TEXT = "The quick brown fox jumps over the lazy dog."


def test_simhash_of_one_feature_is_the_feature():  # [FP31]
    assert simhash(np.array([0xDEADBEEF12345678], dtype=np.uint64)) == 0xDEADBEEF12345678


def test_simhash_of_no_features_is_zero():  # [FP33]
    fp, v = simhash_with_weights(np.empty(0, np.uint64))
    assert fp == 0 and not v.any() and v.shape == (64,)


def test_simhash_matches_reference_with_weights():  # [FP30], [FP32]
    rng = np.random.default_rng(1)
    feats = rng.integers(0, 2**64, 300, dtype=np.uint64)
    weights = rng.random(300) * 3
    fp, v = simhash_with_weights(feats, weights)
    want_fp, want_v = ref.simhash(feats, np.rint(weights * 4096))
    assert fp == want_fp and np.allclose(v, want_v)


def test_simhash_ties_give_zero_bits():  # [FP32]
    feats = np.array([0, 2**64 - 1], dtype=np.uint64)
    assert simhash(feats) == 0


def test_weights_checked():
    with pytest.raises(ValueError, match="weights must have shape"):
        simhash(np.zeros(3, np.uint64), [1.0])
    with pytest.raises(ValueError, match="finite"):
        simhash(np.zeros(1, np.uint64), [np.nan])
    with pytest.raises(TypeError, match="uint64"):
        simhash(np.array([-1]))


def test_weighting_schemes():
    feats = np.array([5, 5, 7], dtype=np.uint64)
    assert weigh(feats, "tf")[1] is None
    uniq, w = weigh(feats, "logtf")
    assert list(uniq) == [5, 7] and np.allclose(w, [1 + np.log(2), 1])
    with pytest.raises(ValueError, match="needs an IdfTable"):
        weigh(feats, "tfidf")


def test_idf_table_learn_and_round_trip():
    table = IdfTable.learn([np.array([1, 2], np.uint64), np.array([2, 3, 3], np.uint64)])
    assert table.n_docs == 2 and list(table.hashes) == [1, 2, 3] and list(table.df) == [1, 2, 1]
    assert IdfTable.from_bytes(table.to_bytes()) == table
    idf = table.idf(np.array([2, 99], np.uint64))
    assert idf[0] == pytest.approx(np.log(3 / 3) + 1) and idf[1] == pytest.approx(np.log(3) + 1)
    with pytest.raises(FormatError):
        IdfTable.from_bytes(b"garbage")


def test_default_fingerprinter_test_vector():  # [FP60]
    fp = Fingerprinter()
    feats = ref.features("the quick brown fox jumps over the lazy dog", "words", 1)
    assert fp.simhash(VECTOR_TEXT) == ref.simhash(feats)[0]
    assert fp.simhash(VECTOR_TEXT) == 0x593B03225397E4AE
    assert list(fp.simhash_with_weights(VECTOR_TEXT)[1][:4]) == [-5.0, 3.0, 1.0, 1.0]
    assert hex(int(fp.feature_hashes(VECTOR_TEXT)[0])) == "0x4b1b03a21f8b5f26"  # XXH64(b"the")


def test_pipeline_fingerprint_and_verification():  # [FP70]
    fp = Fingerprinter()
    a = " ".join(f"w{i} x{i % 7}" for i in range(120))
    b = a.replace("w60 ", "changed ")
    c = " ".join(f"v{i}" for i in range(200))
    fa, fb, fc = fp.fingerprint(a), fp.fingerprint(b), fp.fingerprint(c)
    assert fa[0] == fp.simhash(a) and fa[1].dtype == np.uint32 and len(fa[1]) <= fp.bottom_k
    assert np.all(np.diff(fa[1].astype(np.int64)) > 0)
    assert fp.similarity(fa[1], fb[1]) == pytest.approx(len(np.intersect1d(fa[1], fb[1]))
                                                        / len(np.union1d(fa[1], fb[1])))
    assert fp.is_near_duplicate(fa, fb) and not fp.is_near_duplicate(fa, fc)


def test_str_and_bytes_give_the_same_simhash():  # [FP01]
    fp = Fingerprinter()
    assert fp.simhash(VECTOR_TEXT) == fp.simhash(VECTOR_TEXT.encode())


def test_binary_bytes_raise_unless_asked():  # [FP03]
    fp = Fingerprinter()
    with pytest.raises(BinaryDataError):
        fp.simhash(b"\x00\x01\x02binary")
    assert isinstance(Fingerprinter(binary="text").simhash(b"\x00abc def ghi"), int)


def test_near_duplicates_are_close():
    fp = Fingerprinter()
    a = " ".join(f"word{i % 97} term{i % 13}" for i in range(400))
    b = a.replace("word5 ", "other ", 1)
    assert hamming(fp.simhash(a), fp.simhash(b)) <= 3


def test_simhash_many_and_with_weights_agree():
    fp = Fingerprinter(features=FeatureSpec(stop_words="english"), weighting="logtf")
    docs = ["alpha beta gamma", "alpha beta delta", ""]
    many = fp.simhash_many(docs)
    assert many.dtype == np.uint64
    assert [int(x) for x in many] == [fp.simhash(d) for d in docs]
    h, v = fp.simhash_with_weights(docs[0])
    assert h == fp.simhash(docs[0]) and v.dtype == np.float64 and v.shape == (64,)


def test_long_text_streams_with_bounded_pieces(monkeypatch):  # [FP17]
    from ndindex.fingerprint import features as features_mod
    fp = Fingerprinter()
    text = " ".join(f"w{i % 1000}" for i in range(20000))
    whole = fp.simhash(text)
    monkeypatch.setattr(features_mod, "PIECE_CHARS", 1000)
    assert fp.simhash(text) == whole
    chunks = [text[i:i + 777].encode() for i in range(0, len(text), 777)]
    assert fp.simhash_stream(chunks)[0] == whole
    assert np.array_equal(fp.minhash_stream(chunks), fp.minhash(text))
    # A character cut short at the end of the bytes (U+FFFD) tips the last
    # piece over the size: the words it completes still count.
    data = " ".join(f"w{i}" for i in range(400))[:1000].encode() + b"\xe2\x82"
    assert len(data.decode("utf-8", "replace")) == 1001
    assert fp.simhash_stream([data[:400], data[400:]])[0] == \
        fp.simhash(data.decode("utf-8", "replace"))


def test_to_bytes_round_trip_and_small():  # [FP50], [FP51]
    fp = Fingerprinter(features=FeatureSpec(unit="chars", ngram=4, hash="rabin"),
                       weighting="logtf", num_perm=64, html=True)
    data = fp.to_bytes()
    assert data[:4] == b"NDFP" and int.from_bytes(data[4:6], "little") == FORMAT_VERSION
    assert len(data) < 4096
    assert Fingerprinter.from_bytes(data) == fp


def test_to_bytes_keeps_idf_table():
    fp = Fingerprinter().learn_idf(["a b c d", "b c d e"])
    back = Fingerprinter.from_bytes(fp.to_bytes())
    assert back.idf == fp.idf and back.simhash("a b c d e") == fp.simhash("a b c d e")


def test_newer_version_rejected():  # [FP52]
    data = bytearray(Fingerprinter().to_bytes())
    data[4:6] = (FORMAT_VERSION + 1).to_bytes(2, "little")
    with pytest.raises(FormatError, match=f"version {FORMAT_VERSION + 1} > supported"):
        Fingerprinter.from_bytes(bytes(data))


@pytest.mark.parametrize("mutate", [
    lambda d: b"XXXX" + d[4:],
    lambda d: d[:-1],
    lambda d: d[:10] + b"[" + d[11:],
    lambda d: d.replace(b'"num_perm"', b'"num_purr"'),
])
def test_corrupt_records_rejected(mutate):  # [FP53]
    with pytest.raises(FormatError):
        Fingerprinter.from_bytes(mutate(Fingerprinter().to_bytes()))


def test_misuse_raises_builtin_errors():
    with pytest.raises(ValueError, match="weighting must be one of"):
        Fingerprinter(weighting="bm25")
    with pytest.raises(TypeError, match="text must be str or bytes-like, got int"):
        Fingerprinter().simhash(5)
    with pytest.raises(TypeError, match="features must be a FeatureSpec"):
        Fingerprinter(features="words")
