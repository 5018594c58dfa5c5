"""Fuzz target: arbitrary bytes -> Huffman-code loader gives a code or FormatError.

Contract (``decode_*``): ``ndindex.codec.HuffmanCode.from_bytes`` raises
nothing but ``FormatError``; it accepts exactly the records that the
reference parser (``ndindex.codec_reference.parse_code``) accepts, and the C
compiler (``_core.compile_code``) accepts the same 64 lengths and coding.
A loaded code serialises back to the same bytes and round-trips a table that
uses every symbol h = 0..63 and a random table spanning several blocks,
checked against the reference decoder too.

Input: the code record itself (FORMAT.md "Huffman code record": u8 coding,
u8 max code bits, 64 x u8 code lengths); any other length must be refused.

Run: ``python fuzz/run.py --targets decode_code`` (see fuzz/README.md).
"""

from __future__ import annotations

import numpy as np  # imported before instrumentation: not ours to cover

import instrumented

with instrumented.imports(__name__):  # coverage only when fuzzing
    import harness
    from ndindex import _core, codec, codec_reference
    from ndindex.errors import FormatError

#: 0, 1, 3, 7, ..., 2^64 - 1: each step has delta (and XOR) 2^h for h = 0..63.
EVERY_SYMBOL = np.array([(1 << i) - 1 for i in range(65)], dtype=np.uint64)


def round_trip(code: codec.HuffmanCode, values: np.ndarray) -> None:
    """Encode values with code, decode with C and reference, compare."""
    table = codec.encode(values, code)
    assert np.array_equal(codec.decode(table, code), values), "C round trip differs"
    record = code.to_bytes()
    got = []
    for i in range(table.n_blocks):
        got += codec_reference.decode_block(bytes(table.block(i)), record)
    assert got == [int(v) for v in values], "reference decode of the encoding differs"


def check(data: bytes) -> None:
    """Run one input; raise AssertionError (or crash) on a contract breach."""
    data = bytes(data)
    try:
        code = codec.HuffmanCode.from_bytes(data)
    except FormatError:
        code = None
    try:
        codec_reference.parse_code(data)
        ref_ok = True
    except FormatError:
        ref_ok = False
    assert ref_ok == (code is not None), f"from_bytes {'accepts' if code else 'refuses'}, reference disagrees"
    if len(data) == codec.CODE_RECORD_BYTES:
        try:
            _core.compile_code(data[2:], data[0])
            c_ok = True
        except ValueError:
            c_ok = False
        max_bits_ok = data[1] == codec.CODE_MAX_BITS
        assert (code is not None) == (c_ok and max_bits_ok), "C compile_code disagrees with from_bytes"
    if code is None:
        return
    assert code.to_bytes() == data, "code does not serialise back to its record"
    round_trip(code, EVERY_SYMBOL)
    rng = np.random.default_rng(int.from_bytes(data[2:10], "little"))
    round_trip(code, np.unique(rng.integers(0, 2**64, size=300, dtype=np.uint64)))


if __name__ == "__main__":
    harness.fuzz(check)
