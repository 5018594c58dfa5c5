"""The document record: a bottom-k sketch, Rice-coded ([DR01]-[DR14]).

What verification needs per document is its bottom-k sketch: at most
``bottom_k`` distinct uint32 values, sorted.  Sorted values drawn from a
uniform hash are separated by nearly geometric gaps, for which a Rice code
(Golomb with a power-of-two parameter) is within about 0.03 bits of the
entropy; so the record stores the gaps, Rice-coded with the parameter that
makes them shortest.  A short text (values spread over all 32 bits) costs
about 27 bits a value, a long one (the k smallest of many) about
32 - log2(shingles) + 2 bits: 15-40% below the 4 bytes of a raw uint32.

Layout (format-spec/documents.md): u8 version, u8 Rice parameter, LEB128
count, then the bit stream.  Decoding checks every byte: a record that is
not exactly one valid encoding raises CorruptionError.
"""

from __future__ import annotations

import numpy as np

from ndindex import _core
from ndindex.errors import CorruptionError

RECORD_VERSION = 1
#: Largest sketch a record holds (Fingerprinter.bottom_k is at most 65536).
MAX_VALUES = 65536
_DATABASE = "document record"


def encode_record(sketch, rice_parameter: int | None = None) -> bytes:
    """Return the record of a bottom-k sketch (strictly increasing uint32 values).

    rice_parameter: None picks the shortest code ([DR06]); 0..31 forces one
    (any is valid to a reader).

    Raises:
        ValueError: values not strictly increasing, out of uint32 range, or
            more than MAX_VALUES of them.

    Cost: O(n) in C (32 passes to pick the parameter).
    """
    values = np.asarray(sketch)
    if values.ndim != 1:
        raise ValueError(f"sketch must be 1-D, got {values.ndim}-D")
    if values.size and (values.dtype.kind not in "iu" or values.min() < 0
                        or values.max() > 0xFFFFFFFF):
        raise ValueError("sketch values must be integers in [0, 2**32)")
    if len(values) > MAX_VALUES:
        raise ValueError(f"a sketch holds at most {MAX_VALUES} values, got {len(values)}")
    k, stream = _core.rice_encode(np.ascontiguousarray(values, dtype=np.uint32),
                                  -1 if rice_parameter is None else rice_parameter)
    return bytes((RECORD_VERSION, k)) + _leb128(len(values)) + stream


def decode_record(record) -> np.ndarray:
    """Return the sketch (sorted uint32 array) a record holds.

    Raises:
        CorruptionError: unknown version, parameter above 31, a count that is
            too large or not minimally coded, or a bit stream that is not
            exactly the count's values (truncated, overflowing, nonzero
            padding or trailing bytes).
        TypeError: record is not bytes-like.
    """
    data = memoryview(record).cast("B")
    if len(data) < 3:
        raise CorruptionError(f"record of {len(data)} bytes is shorter than 3", database=_DATABASE)
    if data[0] != RECORD_VERSION:
        raise CorruptionError(f"record version {data[0]} is not {RECORD_VERSION}",
                              database=_DATABASE, offset=0)
    k = data[1]
    if k > 31:
        raise CorruptionError(f"Rice parameter {k} > 31", database=_DATABASE, offset=1)
    n, at = _read_leb128(data, 2)
    if n == 0 and k != 0:
        raise CorruptionError(f"an empty record must have parameter 0, got {k}",
                              database=_DATABASE, offset=1)
    return np.frombuffer(_core.rice_decode(data[at:], n, k), dtype=np.uint32)


def record_size(sketch) -> int:
    """Return the bytes :func:`encode_record` writes for a sketch."""
    return len(encode_record(sketch))


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_leb128(data, at: int) -> tuple[int, int]:
    """Read the count ([DR03]): at most 3 bytes, minimal, <= MAX_VALUES."""
    n, shift, start = 0, 0, at
    while True:
        if at >= len(data) or at - start == 3:
            raise CorruptionError("count runs past 3 bytes or the record", database=_DATABASE,
                                  offset=start)
        byte = data[at]
        n |= (byte & 0x7F) << shift
        at += 1
        shift += 7
        if not byte & 0x80:
            break
    if (byte == 0 and at - start > 1) or n > MAX_VALUES:
        raise CorruptionError(f"count {n} is not minimally coded or exceeds {MAX_VALUES}",
                              database=_DATABASE, offset=start)
    return n, at
