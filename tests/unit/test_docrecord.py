"""The document record: round trips, sizes and every kind of bad byte."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ndindex.docrecord import MAX_VALUES, decode_record, encode_record, record_size
from ndindex.errors import CorruptionError


@given(st.sets(st.integers(0, 2**32 - 1), max_size=300))
def test_round_trip(values):
    sketch = np.array(sorted(values), dtype=np.uint32)
    assert decode_record(encode_record(sketch)).tolist() == sketch.tolist()


@pytest.mark.parametrize("n_set, k", [(60, 60), (100_000, 1024)])
def test_size_below_raw_uint32(n_set, k):
    rng = np.random.default_rng(0)
    values = np.sort(rng.choice(2**32, n_set, replace=False))[:k].astype(np.uint32)
    size = record_size(values)
    bits = 32 - np.log2(n_set / k * len(values)) if n_set > k else 32 - np.log2(len(values))
    assert size < 4 * len(values)
    assert size * 8 / len(values) < bits + 2.5     # Rice: within ~1.6 bits of log2(gap)
    assert decode_record(encode_record(values)).tolist() == values.tolist()


def test_extremes():
    for values in ([], [0], [2**32 - 1], [0, 2**32 - 1], list(range(1000))):
        record = encode_record(np.array(values, dtype=np.uint32))
        assert decode_record(record).tolist() == values
    assert encode_record(np.array([], np.uint32)) == b"\x01\x00\x00"


def test_encode_rejects_bad_sketches():
    for bad in ([3, 2], [1, 1], [-1], [2**32]):
        with pytest.raises(ValueError):
            encode_record(np.array(bad, dtype=np.int64))
    with pytest.raises(ValueError):
        encode_record(np.arange(MAX_VALUES + 1))


def corrupt_records():
    good = encode_record(np.array([5, 900, 70000, 2**31], dtype=np.uint32))
    yield "empty", b""
    yield "short", good[:2]
    yield "version", b"\x02" + good[1:]
    yield "parameter", good[:1] + b"\x20" + good[2:]
    yield "truncated", good[:-1]
    yield "trailing", good + b"\x00"
    yield "count too big", good[:2] + b"\x05" + good[3:]
    yield "count not minimal", good[:2] + b"\x84\x00" + good[3:]
    yield "count over max", good[:2] + b"\x81\x80\x05" + good[3:]
    yield "empty with parameter", b"\x01\x03\x00"
    assert good[-1] < 0x80    # the stream's last bit is not bit 7, so that bit is padding
    yield "padding", good[:-1] + bytes([good[-1] | 0x80])
    yield "overflow", b"\x01\x1f\x02" + b"\xff" * 12


@pytest.mark.parametrize("name, record", list(corrupt_records()))
def test_corrupt_record_raises(name, record):
    with pytest.raises(CorruptionError):
        decode_record(record)


@given(st.binary(max_size=40))
def test_any_bytes_decode_or_raise_corruption(data):
    try:
        values = decode_record(data)
    except CorruptionError:
        return
    # What decodes is exactly one valid encoding: re-encoding gives the bytes back.
    assert np.all(np.diff(values.astype(np.int64)) > 0)
    assert encode_record(values, rice_parameter=data[1]) == data
