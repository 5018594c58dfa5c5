"""The feature hash: XXH64 with a 64-bit seed, and Rabin fingerprints.

XXH64 (Collet) is the one feature hash: a documented algorithm with public
test vectors, the same value on every platform and Python version (the
kernel reads input bytes little-endian whatever the host's order), and fast
on the short strings that features are.  Python's ``hash()`` is salted per
process and ``hashlib`` digests are 5-20x slower on short inputs, so neither
serves.  Rabin fingerprints (Broder's choice for shingles) are offered for
character windows; see format-spec/fingerprinter.md [FP20]-[FP23].
"""

from __future__ import annotations

import numpy as np

from ndindex import _core

#: Default XXH64 seed of the feature hash.  Zero, so that any XXH64
#: implementation reproduces the test vectors without configuration.
DEFAULT_SEED = 0

#: The Rabin modulus is x^64 + RABIN_POLY over GF(2) (irreducible).
RABIN_POLY = 0x9BDC0890B9832B3B

_U64_MAX = (1 << 64) - 1


def _check_seed(seed: int) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be int, got {type(seed).__name__}")
    if not 0 <= seed <= _U64_MAX:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return seed


def feature_hash(feature: str | bytes, seed: int = DEFAULT_SEED) -> int:
    """Return XXH64 of a feature (str features hash their UTF-8 bytes).

    Raises:
        TypeError: ``feature`` is neither str nor bytes-like, or seed not int.
        ValueError: ``seed`` outside [0, 2**64).
    """
    if isinstance(feature, str):
        feature = feature.encode("utf-8")
    elif not isinstance(feature, (bytes, bytearray, memoryview)):
        raise TypeError(f"feature must be str or bytes, got {type(feature).__name__}")
    return _core.xxh64(feature, _check_seed(seed))


def hash_rows(rows: np.ndarray, seed: int = DEFAULT_SEED) -> np.ndarray:
    """Return XXH64 of each row of a 2-D array's little-endian bytes.

    Used for LSH band keys and super-shingles: a row of sketch values
    becomes one 64-bit key.

    Raises:
        ValueError: ``rows`` is not 2-D or has no columns.
    """
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[1] == 0:
        raise ValueError(f"rows must be a 2-D array with >= 1 column, got shape {rows.shape}")
    data = np.ascontiguousarray(rows, dtype=rows.dtype.newbyteorder("<"))
    row_bytes = data.shape[1] * data.dtype.itemsize
    if data.shape[0] == 0:
        return np.empty(0, dtype=np.uint64)
    return np.frombuffer(_core.xxh64_rows(data.tobytes(), row_bytes, _check_seed(seed)),
                         dtype=np.uint64)


def rabin_fingerprint(data: bytes | str) -> int:
    """Return the Rabin fingerprint of bytes (str: its UTF-32BE code points).

    The fingerprint is the remainder of the message polynomial, first byte
    highest, modulo x^64 + RABIN_POLY over GF(2).  A str is encoded as
    UTF-32BE, which is how character windows are fingerprinted.
    """
    if isinstance(data, str):
        data = data.encode("utf-32-be")
    elif not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be str or bytes, got {type(data).__name__}")
    return _core.rabin(data)
