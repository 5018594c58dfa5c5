"""format-spec/fingerprinter.md: test vectors and the statements not covered elsewhere."""

import json
import pathlib
import random

import numpy as np

from ndindex import _core
from ndindex.fingerprint import (FeatureSpec, Fingerprinter, MinHashFamily, extract,
                                 lsh_band_keys, super_shingles, tokens)
from ndindex.fingerprint.hashing import RABIN_POLY

VECTORS = json.loads((pathlib.Path(__file__).parents[1] / "data" / "fingerprint"
                      / "vectors.json").read_text())


def test_vectors_file():  # [FP60]
    for text, seed, want in VECTORS["xxh64"]:
        assert _core.xxh64(text.encode(), seed) == int(want, 16)
    for text, want in VECTORS["rabin_utf32be"]:
        assert _core.rabin(text.encode("utf-32-be")) == int(want, 16)
    fam = MinHashFamily(2, seed=1)
    assert [hex(int(x))[2:] for x in fam.a] == VECTORS["minhash_seed1"]["a"]
    assert [hex(int(x))[2:] for x in fam.b] == VECTORS["minhash_seed1"]["b"]
    for text, want in VECTORS["default_simhash"]:
        assert Fingerprinter().simhash(text) == int(want, 16)


def _polymulmod(a, b, poly):
    r = 0
    while b:
        if b & 1:
            r ^= a
        b >>= 1
        a <<= 1
        if a >> 64:
            a ^= poly
    return r


def test_rabin_polynomial_is_irreducible():  # [FP22]
    poly = (1 << 64) | RABIN_POLY
    x = 2
    for _ in range(32):
        x = _polymulmod(x, x, poly)
    x32 = x
    for _ in range(32):
        x = _polymulmod(x, x, poly)
    assert x == 2  # x^(2^64) = x
    a, b = x32 ^ 2, poly  # gcd(x^(2^32) - x, P) = 1
    while b:
        while a and a.bit_length() >= b.bit_length():
            a ^= b << (a.bit_length() - b.bit_length())
        a, b = b, a
    assert a == 1


def test_rabin_is_linear():  # [FP21], [FP23]
    rng = random.Random(5)
    a, b = rng.randbytes(40), rng.randbytes(40)
    xor = bytes(x ^ y for x, y in zip(a, b))
    assert _core.rabin(xor) == _core.rabin(a) ^ _core.rabin(b)
    assert _core.rabin(b"") == 0


def test_lines_and_chars_units():  # [FP12], [FP13]
    assert tokens("  a  b \n\n\t c\r\nd ", FeatureSpec(unit="lines")) == ["a b", "c", "d"]
    assert tokens("  a  b \n", FeatureSpec(unit="chars")) == ["a", " ", "b"]
    assert list(extract("ab", FeatureSpec(unit="chars", ngram=2))) == [_core.xxh64(b"ab")]


def test_html_option_uses_visible_text():  # [FP04]
    fp = Fingerprinter(html=True)
    assert fp.simhash("<p>hello <script>x()</script>world</p>") == Fingerprinter().simhash(
        "hello world")


def test_band_keys_and_super_shingles():  # [FP42]
    sk = np.arange(8, dtype=np.uint32)
    keys = lsh_band_keys(sk[None, :], bands=2, rows=4)
    assert keys[0, 1] == _core.xxh64(sk[4:8].astype("<u4").tobytes(), 1)
    assert _core.xxh64(np.arange(4, dtype="<u4").tobytes(), 0) in super_shingles(sk, 4)
