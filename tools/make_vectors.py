"""Write the codec test vectors in format-spec/vectors/ (FORMAT.md section 10).

Deterministic: running it again must leave the files unchanged, which
tests/conformance checks by re-encoding.  Run: python tools/make_vectors.py
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from ndindex import _core, chunks as ch, codec
from ndindex.codec import CODING_DELTA, CODING_RESTARTS, CODING_XOR, HuffmanCode

OUT = pathlib.Path(__file__).resolve().parent.parent / "format-spec" / "vectors"
EXAMPLE_LENGTHS = [3] * 7 + [8] * 7 + [9] * 50  # FORMAT.md section 8
END_BITS = 13  # FORMAT.md 5.4: each restart record is a 13-bit end, then a w-bit value
#: The codes of the table-*-2000 vectors, as first written (by
#: HuffmanCode.from_values of their day).  Pinned: which code an encoder picks
#: is its own business, not the format's, and the vectors must not move when
#: that heuristic does (tests/conformance/test_format_spec.py regenerates
#: every vector and compares).
TABLE_CODE_LENGTHS = {
    CODING_DELTA: "0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0b0c0c0c"
                  "0a0a0a090908070605050303020203060a0c0c0c0c0c0c0c",
    CODING_XOR: "0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0b"
                "0c0b0b0b0b09090707050403030203030405060708090a0b",
}
TABLE_CODE_LENGTHS[CODING_RESTARTS] = TABLE_CODE_LENGTHS[CODING_DELTA]


def table_code(coding: int) -> HuffmanCode:
    return HuffmanCode.from_lengths(bytes.fromhex(TABLE_CODE_LENGTHS[coding]), coding)


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


def table_bytes(w):
    """T of FORMAT.md 5.4: the restart table's bytes, w included."""
    return 1 + -(-3 * (END_BITS + w) // 8)


def read_restarts(block: bytes):
    """Return (w, [[end, value]] x 3) of a coding-2 block's restart table."""
    w = block[1023]
    size = table_bytes(w)
    bits = int.from_bytes(block[1024 - size:1023], "big")
    recs = []
    for r in range(3):
        rec = bits >> (8 * (size - 1) - (r + 1) * (END_BITS + w)) & ((1 << (END_BITS + w)) - 1)
        recs.append([rec >> w, rec & ((1 << w) - 1)])
    return w, recs


def write_restarts(block: bytearray, w, recs, tail=0):
    """Store a restart table of width w and records recs at the end of block
    (over the last table_bytes(w) bytes); tail fills the bits after the third record."""
    size = table_bytes(w)
    spare = 8 * (size - 1) - 3 * (END_BITS + w)
    bits = 0
    for end, value in recs:
        bits = bits << (END_BITS + w) | end << w | value
    block[1024 - size:1023] = (bits << spare | tail).to_bytes(size - 1, "big")
    block[1023] = w


def overrun_block(block: bytes, values, lengths):
    """Return block (coding 2, the worked example's code) with a count so large
    that its zero padding decodes as h = 0 entries (codeword 000) until one runs
    into the restart table, and with restart records that agree with those
    entries, so that the overrun [B6] is the first damage a decoder meets."""
    ends, used = [0], 0
    for a, b in zip(values, values[1:]):
        h = (b - a).bit_length() - 1
        used += lengths[h] + h
        ends.append(used)
    for w in range(65):
        stream = 8 * (1010 - table_bytes(w))
        zeros = (stream - used) // lengths[0]  # whole h = 0 entries that fit
        count = len(values) + zeros + 1  # and one more, which does not

        def value(i):
            return values[i] if i < len(values) else values[-1] + i - (len(values) - 1)

        def end(i):
            return ends[i] if i < len(values) else used + lengths[0] * (i - (len(values) - 1))

        at = [r * count // 4 for r in (1, 2, 3)]
        if (value(at[2]) - values[0]).bit_length() <= w:
            break
    b = bytearray(block)
    b[1024 - table_bytes(block[1023]):] = bytes(table_bytes(block[1023]))
    b[4:6] = count.to_bytes(2, "little")
    write_restarts(b, w, [[end(e), value(e) - values[0]] for e in at])
    return bytes(b), count, w, end(count - 1), stream


def write(name, obj):
    (OUT / f"{name}.json").write_text(json.dumps(obj, indent=1) + "\n")


def restarts(example_values, table):
    """Coding 2 (FORMAT.md 5.4): valid blocks and tables, then damaged tables."""
    code = HuffmanCode.from_lengths(EXAMPLE_LENGTHS, CODING_RESTARTS)
    enc = valid("block-example-restarts", example_values, code,
                "section 9's values, delta coding with restart tables: count 5, e_r = 1, 2, 3, w = 4")
    short = valid("block-restarts-short", example_values[:3], code,
                  "count 3: e_1 = 0, so record 1 is end 0, value 0; w = 2")
    valid("block-restarts-one", example_values[:1], code,
          "count 1: every e_r = 0, every record zero, w = 0, T = 6")
    valid("block-restarts-extremes", [0, 1, 2**63, 2**64 - 2, 2**64 - 1],
          HuffmanCode.for_density(1000, CODING_RESTARTS), "extreme values, one block: w = 64, T = 30")
    valid("table-restarts-2000", table, table_code(CODING_RESTARTS),
          "2000 random fingerprints, delta coding with restart tables, code from the table")

    block = enc.blocks.tobytes()
    w, recs = read_restarts(block)
    bad = bytearray(block)
    bad[1023] = 65
    invalid("bad-restart-width", bytes(bad), code, "restart", "B11", "w = 65 in byte 1023")
    bad = bytearray(block)
    write_restarts(bad, w, [recs[0], [recs[1][0] + 1, recs[1][1]], recs[2]])
    invalid("bad-restart-end", bytes(bad), code, "restart", "B12",
            f"record 2 says entry 2 ends at bit {recs[1][0] + 1}; it ends at {recs[1][0]}")
    bad = bytearray(block)
    write_restarts(bad, w, [recs[0], recs[1], [recs[2][0], recs[2][1] - 1]])
    invalid("bad-restart-value", bytes(bad), code, "restart", "B12",
            f"record 3 says fingerprint 3 is first + {recs[2][1] - 1}; it is first + {recs[2][1]}")
    bad = bytearray(block)
    write_restarts(bad, w, recs, tail=1)
    invalid("bad-restart-tail", bytes(bad), code, "restart", "B12",
            "the last bit after the third record (the low bit of byte 1022) set")
    sw, srecs = read_restarts(short.blocks.tobytes())
    bad = bytearray(short.blocks.tobytes())
    write_restarts(bad, sw, [[0, 1]] + srecs[1:])
    invalid("bad-restart-first", bytes(bad), code, "restart", "B12",
            "count 3: record 1 (e_1 = 0) must be zero; its value says 1")
    bad = bytearray(block)
    bad[1023 - table_bytes(w)] |= 1
    invalid("bad-restart-padding", bytes(bad), code, "padding", "B8",
            f"the last bit of the bitstream (byte {1023 - table_bytes(w)}, just before the {table_bytes(w)}-byte table) set")
    bad, count, bw, at, stream = overrun_block(block, example_values, EXAMPLE_LENGTHS)
    invalid("bad-restart-overrun", bad, code, "past the end", "B6",
            f"count {count} and records (w = {bw}) that agree with the zero padding read as h = 0 "
            f"entries (codeword 000): entry {count - 1} starts at bit {at - 3} and runs past the "
            f"bitstream's {stream} bits into the table")


def raw_valid(name, values, packed, note):
    """A raw-block vector (5.3): "raw" names the writer ("plain" or "packed", [B16])."""
    values = np.array(values, dtype=np.uint64)
    blocks = ch.encode_raw(values, packed).blocks.tobytes()
    write(name, {"note": note, "raw": "packed" if packed else "plain", "blocks": blocks.hex(),
                 "values": [str(int(v)) for v in values]})
    return blocks


def raw_invalid(name, block: bytes, error, statement, note):
    b = bytearray(block)
    b[0:4] = _core.crc32c(bytes(b[4:])).to_bytes(4, "little")
    write(name, {"note": note, "raw": "damaged", "blocks": bytes(b).hex(), "error": error,
                 "statement": statement})


def packed_block(first: int, offsets, width: int, count: int | None = None) -> bytes:
    """A packed raw block laid out by hand (checksum left to raw_invalid)."""
    b = bytearray(1024)
    b[4:6] = (count or len(offsets) + 1).to_bytes(2, "little")
    b[6] = width
    b[8:16] = first.to_bytes(8, "little")
    stream = sum(o << (i * width) for i, o in enumerate(offsets))
    b[16:] = stream.to_bytes(1008, "little")
    return bytes(b)


def raw_blocks():
    """Raw-block vectors (5.3): both forms, and one damage per statement of [B15]."""
    rng = np.random.default_rng(20261127)
    level2 = np.unique(rng.integers(0, 2**64 // (2**22) * 400, 400, dtype=np.uint64))
    blocks = raw_valid("raw-packed-400", level2, True,
                       "400 fingerprints spread as a run of 4M (2^42 apart): packed blocks")
    raw_valid("raw-plain-400", level2, False, "the same values, plain blocks (versions 2 and 3)")
    raw_valid("raw-packed-consecutive", np.arange(2**64 - 1500, 2**64, dtype=np.uint64), True,
              "1500 consecutive values up to 2^64 - 1: width 10, 801 values in the first block")
    sparse = np.sort(rng.integers(0, 2**64, 130, dtype=np.uint64))
    raw_valid("raw-mixed", np.concatenate([sparse[:127], sparse[-1] + np.arange(1, 201,
                                                                             dtype=np.uint64)]),
              True, "127 random values (a span past 56 bits: plain), then 200 consecutive ones")
    raw_valid("raw-packed-two", [5, 2**56 + 4], True, "two values: width 56, the widest")
    first = blocks[:1024]
    count = int.from_bytes(first[4:6], "little")
    width = first[6]
    values = ch.decode_raw(first)
    offsets = [int(v - values[0]) for v in values[1:]]
    few = offsets[:100]
    raw_invalid("raw-bad-width-wide", packed_block(int(values[0]), few, few[-1].bit_length() + 1),
                "width", "B15", "101 values, offsets written one bit wider than their span needs")
    raw_invalid("raw-bad-width-57", packed_block(0, [2**56 + 1], 57), "width", "B15",
                "two values 2^56 + 1 apart: width 57")
    raw_invalid("raw-bad-order", packed_block(int(values[0]), offsets[:5] + offsets[4:5] +
                                              offsets[6:], width),
                "increase", "B15", "an offset equal to the one before it")
    bad = bytearray(first)
    end = 16 * 8 + (count - 1) * width
    bad[end // 8] |= 1 << (end % 8)
    raw_invalid("raw-bad-padding", bytes(bad), "padding", "B15", "the bit after the last offset set")
    raw_invalid("raw-bad-count", packed_block(7, [], 3, count=1), "count", "B15",
                "a packed block of one value")


def main(out: pathlib.Path = OUT):
    global OUT
    OUT = out
    OUT.mkdir(parents=True, exist_ok=True)
    example = HuffmanCode.from_lengths(EXAMPLE_LENGTHS, CODING_DELTA)
    example_values = [1000, 1001, 1003, 1010, 1040]
    enc = valid("block-example", example_values, example,
                "FORMAT.md section 8, the worked example")
    valid("block-example-xor", [1000, 1001, 1003, 1010, 1040],
          HuffmanCode.from_lengths(EXAMPLE_LENGTHS, CODING_XOR), "the same values, xor coding")
    valid("block-extremes", [0, 1, 2**63, 2**64 - 2, 2**64 - 1], HuffmanCode.for_density(1000),
          "extreme values, one block")
    rng = np.random.default_rng(20261121)
    table = np.unique(rng.integers(0, 2**64, size=2000, dtype=np.uint64))
    for coding in (CODING_DELTA, CODING_XOR):
        name = codec.CODING_NAMES[coding]
        valid(f"table-{name}-2000", table, table_code(coding),
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
    restarts(example_values, table)
    raw_blocks()
    print(f"wrote {len(list(OUT.glob('*.json')))} vectors to {OUT}")


if __name__ == "__main__":
    main()
