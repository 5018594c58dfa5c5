"""Write the codec test vectors in format-spec/vectors/ (FORMAT.md section 9).

Deterministic: running it again must leave the files unchanged, which
tests/conformance checks by re-encoding.  Run: python tools/make_vectors.py
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from ndindex import _core, codec
from ndindex.codec import CODING_DELTA, CODING_XOR, HuffmanCode

OUT = pathlib.Path(__file__).resolve().parent.parent / "format-spec" / "vectors"
EXAMPLE_LENGTHS = [3] * 7 + [8] * 7 + [9] * 50  # FORMAT.md section 8


def valid(name, values, code, note):
    values = np.array(values, dtype=np.uint64)
    enc = codec.encode(values, code)
    write(name, {"note": note, "code": code.to_bytes().hex(), "blocks": enc.blocks.tobytes().hex(),
                 "values": [str(int(v)) for v in values]})
    return enc


def invalid(name, block: bytes, code, error, statement, note, fix_crc=True):
    b = bytearray(block)
    if fix_crc:
        b[0:4] = _core.crc32c(bytes(b[4:])).to_bytes(4, "little")
    write(name, {"note": note, "code": code.to_bytes().hex(), "blocks": bytes(b).hex(),
                 "error": error, "statement": statement})


def write(name, obj):
    (OUT / f"{name}.json").write_text(json.dumps(obj, indent=1) + "\n")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    example = HuffmanCode.from_lengths(EXAMPLE_LENGTHS, CODING_DELTA)
    enc = valid("block-example", [1000, 1001, 1003, 1010, 1040], example,
                "FORMAT.md section 8, the worked example")
    valid("block-example-xor", [1000, 1001, 1003, 1010, 1040],
          HuffmanCode.from_lengths(EXAMPLE_LENGTHS, CODING_XOR), "the same values, xor coding")
    valid("block-extremes", [0, 1, 2**63, 2**64 - 2, 2**64 - 1], HuffmanCode.for_density(1000),
          "extreme values, one block")
    rng = np.random.default_rng(20261121)
    table = np.unique(rng.integers(0, 2**64, size=2000, dtype=np.uint64))
    for coding in (CODING_DELTA, CODING_XOR):
        name = codec.CODING_NAMES[coding]
        valid(f"table-{name}-2000", table, HuffmanCode.from_values(table, coding),
              f"2000 random fingerprints, {name} coding, code from the table")
    block = enc.blocks.tobytes()
    bad = bytearray(block)
    bad[100] ^= 0x10
    invalid("bad-checksum", bytes(bad), example, "checksum", "B2", "one bit flipped, checksum kept",
            fix_crc=False)
    bad = bytearray(block)
    bad[4:6] = b"\0\0"
    invalid("bad-count-zero", bytes(bad), example, "count", "B3", "count 0")
    bad = bytearray(block)
    bad[4:6] = (4000).to_bytes(2, "little")
    invalid("bad-overrun", bytes(bad), example, "past the end", "B6",
            "count 4000: the zero padding decodes as 3-bit h=0 entries until the bitstream ends")
    bad = bytearray(block)
    bad[1023] = 1
    invalid("bad-padding", bytes(bad), example, "padding", "B8", "last bit of the block set")
    bad = bytearray(block)
    bad[6:14] = (2**64 - 5).to_bytes(8, "little")
    invalid("bad-order", bytes(bad), example, "increase", "B7",
            "first = 2^64-5: the first delta wraps past 2^64")
    print(f"wrote {len(list(OUT.glob('*.json')))} vectors to {OUT}")


if __name__ == "__main__":
    main()
