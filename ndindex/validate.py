"""Argument checks shared by the public API: fingerprints, distances, document keys.

Misuse raises the built-ins (TypeError for a wrong type, ValueError for a
wrong value), with messages that name what was expected and what was found.
"""

from __future__ import annotations

import numpy as np

from ndindex.records import encode_doc_key


def fingerprints(fps) -> np.ndarray:
    """Return fingerprints as a contiguous 1-D uint64 array.

    Accepts one int, a 1-D numpy integer array or an iterable of ints.
    Anything with more than one dimension is a ValueError: a 2-D array is
    more often a mistake (rows of something else) than a batch.
    """
    if isinstance(fps, (int, np.integer)) and not isinstance(fps, bool):
        return np.array([fingerprint(fps)], dtype=np.uint64)
    if isinstance(fps, np.ndarray):
        if fps.ndim != 1:
            raise ValueError(f"fingerprints must be a 1-D array or a single int, got shape "
                             f"{fps.shape}")
        if fps.dtype == np.uint64:
            return np.ascontiguousarray(fps)
        if fps.dtype.kind in "iu":
            if fps.size and fps.dtype.kind == "i" and fps.min() < 0:
                raise ValueError("fingerprints must be in 0..2^64-1, got a negative value")
            return np.ascontiguousarray(fps, dtype=np.uint64)
        raise TypeError(f"fingerprints must be unsigned 64-bit integers, got dtype {fps.dtype}")
    if isinstance(fps, (str, bytes, bytearray, float, bool)) or fps is None:
        raise TypeError(f"fingerprints must be integers, got {type(fps).__name__}")
    out = []
    for v in fps:
        if isinstance(v, (list, tuple, np.ndarray)):
            raise ValueError("fingerprints must be a flat sequence of ints, got a nested one")
        out.append(fingerprint(v))
    return np.array(out, dtype=np.uint64)


def fingerprint(fp) -> int:
    """Return one fingerprint as an int in 0..2^64-1."""
    if type(fp) is int and 0 <= fp < 1 << 64:  # the common case, checked cheaply
        return fp
    if not isinstance(fp, (int, np.integer)) or isinstance(fp, (bool, np.bool_)):
        raise TypeError(f"a fingerprint must be an int, got {type(fp).__name__}")
    fp = int(fp)
    if not 0 <= fp < 1 << 64:
        raise ValueError(f"fingerprint {fp} is outside 0..2^64-1")
    return fp


def query_k(k, largest: int) -> int:
    """A query distance: None means the index's own k; at most that."""
    if k is None:
        return largest
    if type(k) is int and 0 <= k <= largest:  # the common case, checked cheaply
        return k
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 0 <= k <= largest:
        raise ValueError(f"k={k} is outside 0..{largest}, the largest distance this index answers")
    return int(k)


def doc_pairs(fps: np.ndarray, keys) -> list:
    """(fingerprint, typed key) pairs for add(fps, keys=...); no I/O."""
    if keys is None:
        return []
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a sequence with one key per fingerprint, not a single "
                        "str/bytes (one int fingerprint takes one key)")
    try:
        keys = list(keys)
    except TypeError:
        raise TypeError(f"keys must be a sequence with one key (str, bytes or None) per "
                        f"fingerprint, got {type(keys).__name__}") from None
    if len(keys) != len(fps):
        raise ValueError(f"got {len(keys)} keys for {len(fps)} fingerprints")
    return [(int(fp), encode_doc_key(key)) for fp, key in zip(fps.tolist(), keys) if key is not None]


def positive_int(value, name: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def progress(callback):
    """A progress callback, callable(phase, done, total), or None: checked at the
    call, not at its first report, after work was done."""
    if callback is not None and not callable(callback):
        raise TypeError(f"progress must be a callable(phase, done, total) or None, got "
                        f"{type(callback).__name__}")
    return callback


def timeout(value) -> float | None:
    """A wait in seconds: None (no limit) or a real number >= 0."""
    if value is None:
        return None
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
        raise TypeError(f"timeout must be a number of seconds or None, got {type(value).__name__}")
    if not value >= 0:  # also NaN
        raise ValueError(f"timeout must be >= 0 seconds, got {value!r}")
    return float(value)
