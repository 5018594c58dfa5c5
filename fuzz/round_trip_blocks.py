"""Fuzz target: encode then decode a sorted uint64 array gives it back.

Contract (``round_trip_*``): for any strictly increasing uint64 array and
any valid code of any coding, ``decode(encode(values))`` is the array;
each block's key is its last value and header counts add up; the
plain-Python reference decodes every block to the same slice; a probe for
a stored value with p = 64, k = 0 finds exactly that value.

Input layout (``harness.ByteReader``; missing bytes read as zero):

    u8      flags: bit 0 coding for from_values (0 xor, 1 delta), unless
            bit 4 (coding 2, delta with restart tables); bits 1-2 how
            the rest becomes values (below); bit 3 take the code from the
            input (``harness.code_from``) instead of
            ``HuffmanCode.from_values``
    u64     base
    u8 ...  the code, when bit 3 is set
    rest    values, np.unique'd:  0 raw little-endian u64;  1 base + running
            sum of u8 gaps + 1 (dense tables, h near 0);  2 base + running
            sum of u16 gaps;  3 base XOR (raw u64 >> (base % 64)) (one
            shared prefix, as in a probed range).  Sums wrap modulo 2^64.

Run: ``python fuzz/run.py --targets round_trip_blocks`` (see fuzz/README.md).
"""

from __future__ import annotations

import numpy as np  # imported before instrumentation: not ours to cover

import instrumented

with instrumented.imports(__name__):  # coverage only when fuzzing
    import harness
    from ndindex import codec, codec_reference

#: Most values one input makes; enough for tens of blocks, fast to check.
MAX_VALUES = 4096


def values_from(mode: int, base: int, raw: bytes) -> np.ndarray:
    """Return the sorted distinct uint64 array that raw bytes describe."""
    base_u = np.uint64(base)
    with np.errstate(over="ignore"):
        if mode == 0:
            v = np.frombuffer(raw[:len(raw) // 8 * 8], dtype="<u8")
        elif mode == 1:
            v = base_u + np.cumsum(np.frombuffer(raw, dtype=np.uint8).astype(np.uint64) + np.uint64(1))
        elif mode == 2:
            v = base_u + np.cumsum(np.frombuffer(raw[:len(raw) // 2 * 2], dtype="<u2").astype(np.uint64))
        else:
            v = base_u ^ (np.frombuffer(raw[:len(raw) // 8 * 8], dtype="<u8") >> np.uint64(base % 64))
    return np.unique(v.astype(np.uint64))[:MAX_VALUES]


def check(data: bytes) -> None:
    """Run one input; raise AssertionError (or crash) on a contract breach."""
    reader = harness.ByteReader(data)
    flags, base = reader.u8(), reader.u64()
    code = harness.code_from(reader) if flags & 8 else None
    values = values_from((flags >> 1) & 3, base, reader.rest())
    if code is None:
        code = codec.HuffmanCode.from_values(values, codec.CODING_RESTARTS if flags & 16 else flags & 1)

    table = codec.encode(values, code)
    assert np.array_equal(codec.decode(table, code), values), "C round trip differs"
    counts = codec.block_counts(table.blocks).astype(np.int64)
    assert counts.sum() == len(values) and (counts >= 1).all(), "header counts do not add up"
    if len(values):
        assert np.array_equal(table.keys, values[np.cumsum(counts) - 1]), "keys are not last values"
    record = code.to_bytes()
    start = 0
    for i, n in enumerate(counts):
        got = codec_reference.decode_block(bytes(table.block(i)), record)
        assert got == [int(v) for v in values[start:start + n]], f"reference decodes block {i} differently"
        start += n
    if len(values):
        j = base % len(values)
        i = int(np.searchsorted(np.cumsum(counts), j, side="right"))
        x = int(values[j])
        assert codec.probe(table.block(i), code, x, 64, 0) == [x], f"probe misses {x:#x} in block {i}"


if __name__ == "__main__":
    harness.fuzz(check)
