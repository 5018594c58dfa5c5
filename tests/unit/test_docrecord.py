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


def _rice_bits(values, k: int) -> int:
    gaps = np.diff(np.asarray(values, np.int64), prepend=-1) - 1
    return int(np.sum(gaps >> k)) + len(values) * (k + 1)


@given(st.one_of(
    st.lists(st.integers(0, 2**32 - 1), max_size=1100, unique=True),
    st.lists(st.integers(0, 2**12), max_size=300, unique=True),       # dense: small k
    st.builds(lambda xs, big: xs + [big], st.lists(st.integers(0, 50), max_size=40, unique=True),
              st.integers(2**31, 2**32 - 1))))                          # one huge gap
def test_the_rice_parameter_is_the_smallest_with_the_fewest_bits(values):
    # rice_encode walks from a guess (bits(k) is convex) instead of trying
    # all 32: the choice must stay what trying all 32 gives.
    from ndindex import _core
    values = sorted(set(values))
    bits = [_rice_bits(values, k) for k in range(32)]
    k, _ = _core.rice_encode(np.array(values, np.uint32).tobytes())
    assert k == bits.index(min(bits))


def _rice_stream(values, k: int) -> bytes:
    """The Rice bit stream as format-spec/documents.md spells it, a bit at a time."""
    out, pos = bytearray((_rice_bits(values, k) + 7) // 8), 0
    for gap in (np.diff(np.asarray(values, np.int64), prepend=-1) - 1).tolist():
        for bit in [1] * (gap >> k) + [0] + [(gap >> j) & 1 for j in range(k)]:
            out[pos >> 3] |= bit << (pos & 7)
            pos += 1
    return bytes(out)


@given(st.lists(st.integers(0, 2**32 - 1), max_size=200, unique=True), st.integers(0, 31))
def test_the_rice_stream_is_the_specified_bits_at_any_parameter(values, k):
    # The encoder writes a word at a time; long unary runs (k = 0, gaps of
    # 2^32) cross several words.
    from ndindex import _core
    values = sorted(values)
    if k < 8 and values and values[-1] >= 2**20:
        values = [v >> 12 for v in values]
        values = sorted(set(values))            # keep the stream small at small k
    raw = np.array(values, np.uint32).tobytes()
    assert _core.rice_encode(raw, k) == (k, _rice_stream(values, k))
    assert _core.rice_decode(_rice_stream(values, k), len(values), k) == raw


def _rice_values_or_error(data: bytes, n: int, k: int):
    """format-spec/documents.md's decoding, a bit at a time: the values, or
    which rule the bytes break first."""
    bits = [(byte >> j) & 1 for byte in data for j in range(8)]
    pos, prev, out = 0, -1, []
    for _ in range(n):
        q = 0
        while True:
            if pos >= len(bits):
                return "truncated"
            bit, pos = bits[pos], pos + 1
            if not bit:
                break
            q += 1
            if q > 0xFFFFFFFF >> k:
                return "overflow"
        if pos + k > len(bits):
            return "truncated"
        low = sum(bits[pos + j] << j for j in range(k))
        pos += k
        prev = prev + 1 + ((q << k) | low)
        if prev > 2**32 - 1:
            return "overflow"
        out.append(prev)
    if (pos + 7) // 8 < len(data):
        return "trailing"
    if any(bits[pos:]):
        return "padding"
    return out


@given(st.binary(max_size=40), st.integers(0, 40), st.integers(0, 31))
def test_rice_decoding_of_any_bytes_is_the_specified_one(data, n, k):
    # The decoder reads 57 bits at a time; on any bytes (damaged ones
    # included) it gives the values or the status reading a bit at a time gives.
    from ndindex import _core
    want = _rice_values_or_error(data, n, k)
    if isinstance(want, list):
        assert np.frombuffer(_core.rice_decode(data, n, k), np.uint32).tolist() == want
    else:
        with pytest.raises(CorruptionError) as caught:
            _core.rice_decode(data, n, k)
        kinds = {"ends before": "truncated",
                 "passes 2^32": "overflow", "padding bits": "padding", "bytes after": "trailing"}
        assert [kind for text, kind in kinds.items() if text in str(caught.value)] == [want]


@given(st.lists(st.integers(0, 2**20), max_size=30, unique=True), st.integers(6, 31),
       st.integers(0, 3), st.integers(0, 2**16), st.integers(-1, 1))
def test_rice_decoding_of_damaged_streams_is_the_specified_one(values, k, how, where, extra):
    # A real stream, then a bit flipped, its tail cut, a byte added, or n off by one.
    from ndindex import _core
    values = sorted(values)
    data = bytearray(_rice_stream(values, k))
    if how == 1 and data:
        data[where % len(data)] ^= 1 << (where % 8)
    elif how == 2:
        del data[where % (len(data) + 1):]
    elif how == 3:
        data.append(where % 256)
    n = max(0, len(values) + extra)
    want = _rice_values_or_error(bytes(data), n, k)
    if isinstance(want, list):
        assert np.frombuffer(_core.rice_decode(bytes(data), n, k), np.uint32).tolist() == want
    else:
        with pytest.raises(CorruptionError):
            _core.rice_decode(bytes(data), n, k)
