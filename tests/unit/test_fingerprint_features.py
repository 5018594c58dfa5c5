"""Normalisation, tokenising, stop words, shingles: kernel against the spec's twin."""

import numpy as np
import pytest

from ndindex.fingerprint import (ENGLISH_STOP_WORDS, BinaryDataError, FeatureSpec, decode_text,
                                 extract, extract_stream, html_to_text, looks_binary,
                                 normalize_text, tokens)
from ndindex.fingerprint import features as features_mod
from ndindex.fingerprint import reference as ref

TEXT = ("The Quick  brown fox — jumps over the lazy dog.\nStraße ﬁne ＡＢＣ café\r\n"
        "\n  second\tline, with_underscores and 42 numbers  ")


def _ref(text, spec):
    return ref.features(normalize_text(text), spec.unit, spec.ngram, spec.seed,
                        frozenset(spec.stop_list()), spec.hash)


def test_normalize_is_nfkc_then_casefold():  # [FP10]
    assert normalize_text("Straße ﬁne ＡＢＣ") == "strasse fine abc"


@pytest.mark.parametrize("spec", [
    FeatureSpec(), FeatureSpec(ngram=3), FeatureSpec(ngram=2, stop_words="english"),
    FeatureSpec(unit="chars", ngram=5), FeatureSpec(unit="chars", ngram=4, hash="rabin"),
    FeatureSpec(unit="lines"), FeatureSpec(unit="lines", ngram=2, stop_words=("second line, with_underscores and 42 numbers",)),
    FeatureSpec(seed=12345, ngram=2),
])
def test_kernel_features_equal_reference(spec):  # [FP11]-[FP16]
    assert list(extract(TEXT, spec)) == _ref(TEXT, spec)


def test_words_are_unicode_word_runs():  # [FP11]
    assert tokens("don't stop-me now_x 3.5 naïve") == ["don", "t", "stop", "me", "now_x", "3",
                                                          "5", "naïve"]


def test_stop_words_removed_before_shingling():  # [FP14]
    spec = FeatureSpec(ngram=2, stop_words="english")
    assert tokens("the cat and the hat", spec) == ["cat", "hat"]
    assert len(extract("the cat and the hat", spec)) == 1


def test_user_stop_list_is_normalised():
    spec = FeatureSpec(stop_words=["CAT"])
    assert tokens("Cat hat", spec) == ["hat"]


def test_short_text_gives_one_feature_of_all_tokens():  # [FP15]
    spec = FeatureSpec(ngram=5)
    assert list(extract("only two", spec)) == [ref.xxh64(b"only two")]


def test_empty_text_gives_no_features():  # [FP15]
    assert len(extract("", FeatureSpec())) == 0
    assert len(extract(" ... !!! ", FeatureSpec())) == 0


def test_invalid_utf8_bytes_split_words():  # [FP02]
    assert decode_text(b"abc\xffdef") == "abc\ufffddef"
    assert tokens(decode_text(b"abc\xffdef")) == ["abc", "def"]


def test_binary_data_raises_value_error_subclass():  # [FP03]
    with pytest.raises(BinaryDataError, match="looks binary"):
        decode_text(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    assert issubclass(BinaryDataError, ValueError)
    assert decode_text(b"\x00\x01", binary="text") == "\x00\x01"
    assert not looks_binary(b"plain text\n")
    assert looks_binary(bytes(range(1, 32)) * 10)
    assert not looks_binary(b"abc\xffdef")


def test_streamed_pieces_equal_whole_text(monkeypatch):  # [FP17]
    monkeypatch.setattr(features_mod, "PIECE_CHARS", 50)
    text = (TEXT + " ") * 20
    for spec in (FeatureSpec(ngram=3), FeatureSpec(unit="chars", ngram=6),
                 FeatureSpec(unit="lines", ngram=2), FeatureSpec(unit="chars", ngram=3, hash="rabin")):
        whole = _ref(text, spec)
        assert list(extract(text, spec)) == whole
        pieces = [text[i:i + 37] for i in range(0, len(text), 37)]
        assert list(np.concatenate(list(extract_stream(pieces, spec)))) == whole
    # A run without a boundary longer than MAX_PIECE_CHARS is cut inside it:
    # the pieces' features are the same whether the text comes whole or not.
    monkeypatch.setattr(features_mod, "MAX_PIECE_CHARS", 120)
    text = TEXT + " " + "x" * 400 + " " + TEXT + "\n" + "y" * 300 + TEXT
    for spec in (FeatureSpec(ngram=3), FeatureSpec(unit="lines", ngram=2)):
        whole = extract(text, spec)
        pieces = [text[i:i + 37] for i in range(0, len(text), 37)]
        assert np.concatenate(list(extract_stream(pieces, spec))).tolist() == whole.tolist()
        assert len(whole) > 0


def test_feature_spec_rejects_bad_values():
    with pytest.raises(ValueError, match="unit must be one of"):
        FeatureSpec(unit="sentences")
    with pytest.raises(ValueError, match="ngram must be in 1..64, got 0"):
        FeatureSpec(ngram=0)
    with pytest.raises(ValueError, match="hash='rabin' needs unit='chars'"):
        FeatureSpec(hash="rabin")
    with pytest.raises(TypeError, match="ngram must be int"):
        FeatureSpec(ngram=1.5)
    with pytest.raises(TypeError, match="text must be str"):
        extract(b"bytes", FeatureSpec())


def test_stop_list_is_small_and_lowercase():
    assert 100 <= len(ENGLISH_STOP_WORDS) <= 200
    assert all(w == w.lower() for w in ENGLISH_STOP_WORDS)


def test_stemming_needs_pystemmer_or_names_extra():
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"ndindex\[stem\]"):
            FeatureSpec(stem="english")
        return
    spec = FeatureSpec(stem="english", stop_words="english")
    assert tokens("The runners were running", spec) == ["runner", "run"]
    assert len(extract("The runners were running", spec)) == 2


@pytest.mark.parametrize("parser", ["stdlib", "auto"])
def test_html_to_text_keeps_visible_text(parser):
    html = ("<html><head><title>T</title><style>p{x:1}</style></head><body>"
            "<p>Hello <b>world</b>&amp; friends</p><script>var x=1;</script>"
            "<!-- hidden --><div>Bye</div></body></html>")
    words = tokens(html_to_text(html, parser=parser))
    assert words == ["hello", "world", "friends", "bye"]


def test_html_parser_name_checked():
    with pytest.raises(ValueError, match="parser must be"):
        html_to_text("<p>x</p>", parser="lxml")
