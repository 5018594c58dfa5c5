"""XXH64 and Rabin: kernel against published vectors and the Python twin."""

import pytest

from ndindex import _core
from ndindex.fingerprint import RABIN_POLY, feature_hash, hash_rows, rabin_fingerprint
from ndindex.fingerprint import reference as ref

# [FP20] XXH64 test vectors (seed 0 and seed 1), as published with xxHash.
XXH64_VECTORS = [
    (b"", 0, 0xEF46DB3751D8E999),
    (b"a", 0, 0xD24EC4F1A98C6E5B),
    (b"abc", 0, 0x44BC2CF5AD770999),
    (b"hello world", 0, 0x45AB6734B21E6968),
    (b"the quick brown fox", 0, None),
    (bytes(range(100)), 0, None),
]


@pytest.mark.parametrize("data,seed,expected", XXH64_VECTORS)
def test_xxh64_matches_vector_and_reference(data, seed, expected):
    got = _core.xxh64(data, seed)
    assert got == ref.xxh64(data, seed)
    if expected is not None:
        assert got == expected


def test_xxh64_seed_changes_hash():
    assert feature_hash("hello", 0) != feature_hash("hello", 1)


def test_feature_hash_str_is_utf8():
    assert feature_hash("héllo") == _core.xxh64("héllo".encode("utf-8"), 0)


def test_feature_hash_rejects_bad_types():
    with pytest.raises(TypeError, match="feature must be str or bytes, got int"):
        feature_hash(3)
    with pytest.raises(ValueError, match="seed must be in"):
        feature_hash("x", -1)


def test_rabin_matches_bitwise_reference():
    for data in (b"", b"\x01", b"abcdefgh", bytes(range(256)), "shingle".encode("utf-32-be")):
        assert _core.rabin(data) == ref.rabin(data)


def test_rabin_of_str_is_utf32be():
    assert rabin_fingerprint("ab") == ref.rabin("ab".encode("utf-32-be"))


def test_rabin_poly_constant():
    assert RABIN_POLY == 0x9BDC0890B9832B3B


def test_hash_rows_hashes_little_endian_rows():
    import numpy as np
    rows = np.array([[1, 2], [3, 4]], dtype=np.uint32)
    got = hash_rows(rows, seed=5)
    assert got[0] == ref.xxh64((1).to_bytes(4, "little") + (2).to_bytes(4, "little"), 5)
    with pytest.raises(ValueError, match="2-D"):
        hash_rows(np.zeros(3))
