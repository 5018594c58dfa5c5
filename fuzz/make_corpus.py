"""Write the seed corpus: a few small valid inputs per target.

Usage: ``python fuzz/make_corpus.py`` (rewrites fuzz/corpus/*/seed-*).

Seeds are valid, so the fuzzer starts from inputs that get past the
checksum and decode fully, then mutates them.  They follow each target's
input layout (see the target's docstring) and are deterministic: running
this again writes the same bytes unless the codec or harness changed.
"""

from __future__ import annotations

import os
import sys

import numpy as np

FUZZ_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, FUZZ_DIR)

import harness  # noqa: E402
from ndindex import codec  # noqa: E402


def tables() -> dict[str, np.ndarray]:
    """Return named sorted tables that stress different parts of the code."""
    rng = np.random.default_rng(20240601)
    return {
        "random": np.unique(rng.integers(0, 2**64, size=300, dtype=np.uint64)),
        "dense": np.arange(5000, 5000 + 3000, dtype=np.uint64),  # every h = 0
        "top": np.unique(rng.integers(2**64 - 2**20, 2**64, size=200, dtype=np.uint64)),
        "wide": np.array([0, 2**63 - 1, 2**63, 2**64 - 1], dtype=np.uint64),  # h = 62, 0, 63
        "every_h": np.array([(1 << i) - 1 for i in range(65)], dtype=np.uint64),
        "one": np.array([12345], dtype=np.uint64),
    }


def decode_block_seeds() -> dict[str, bytes]:
    """Return inputs: flags, code choice, probe parameters, then real blocks."""
    seeds = {}
    # delta for_density(2), flat delta, flat xor, and the same two of coding 2
    restarts = [i for i, c in enumerate(harness.FIXED_CODES) if c.coding == codec.CODING_RESTARTS]
    for name, values in tables().items():
        for ci in (0, 4, 5, restarts[0], restarts[4]):
            code = harness.FIXED_CODES[ci]
            for n_blocks in (1, 2):
                blocks = codec.encode(values, code).blocks.tobytes()[:n_blocks * codec.BLOCK_BYTES]
                flags = 1 | (n_blocks - 1) << 1
                probe = (0).to_bytes(8, "little") + bytes([16, 3])
                seeds[f"{name}-code{ci}-{n_blocks}b"] = bytes([flags, ci]) + probe + blocks
        # Seeds with a code from raw lengths, so that path starts covered.
        for coding, suffix in ((codec.CODING_DELTA, ""), (codec.CODING_RESTARTS, "-restarts")):
            code = codec.HuffmanCode.from_values(values, coding)
            blocks = codec.encode(values, code).blocks.tobytes()[:codec.BLOCK_BYTES]
            seeds[f"{name}-rawcode{suffix}"] = (bytes([1, 0x80 | coding])
                                                + bytes(ln - 1 for ln in code.lengths)
                                                + bytes(10) + blocks)
    # The longest decode: 8081 entries of one bit each (h = 0 has a 1-bit code).
    lengths = [7] * codec.CODE_SYMBOLS
    lengths[0], lengths[32] = 1, 6
    block = bytearray(codec.BLOCK_BYTES)
    block[4:6] = (1 + (codec.BLOCK_BYTES - codec.BLOCK_HEADER_BYTES) * 8).to_bytes(2, "little")
    seeds["max-count"] = bytes([1, 0x81]) + bytes(ln - 1 for ln in lengths) + bytes(10) + bytes(block)
    seeds["empty"] = b""
    return seeds


def decode_code_seeds() -> dict[str, bytes]:
    """Return valid code records: the fixed codes and codes fitted to tables."""
    seeds = {f"fixed{i}": code.to_bytes() for i, code in enumerate(harness.FIXED_CODES)}
    for name, values in tables().items():
        for coding in codec.CODING_NAMES:
            seeds[f"{name}-{codec.CODING_NAMES[coding]}"] = \
                codec.HuffmanCode.from_values(values, coding).to_bytes()
    return seeds


def round_trip_blocks_seeds() -> dict[str, bytes]:
    """Return inputs in each value mode, with fitted and fixed codes."""
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=1600, dtype=np.uint8).tobytes()
    seeds = {}
    for mode in range(4):
        for coding in codec.CODING_NAMES:
            flags = (coding & 1 if coding < codec.CODING_RESTARTS else 16) | mode << 1
            seeds[f"mode{mode}-{codec.CODING_NAMES[coding]}"] = \
                bytes([flags]) + (2**64 - 2**40).to_bytes(8, "little") + raw
        seeds[f"mode{mode}-fixed"] = bytes([8 | mode << 1]) + bytes(8) + bytes([5]) + raw[:400]
    seeds["extremes"] = bytes([0]) + bytes(8) + b"".join(
        v.to_bytes(8, "little") for v in (0, 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1))
    seeds["empty"] = b""
    return seeds


def record_chunk_seeds() -> dict[str, bytes]:
    """Return record chunks as the writer makes them: short and long keys,
    compressible and random values, several sub-blocks, first and later chunks."""
    import record_chunk
    from ndindex import chunks
    rng = np.random.default_rng(8)
    seeds = {}
    shapes = {
        "keys": [(b"k%06d" % i, 0, b"") for i in range(300)],
        "docs": [(int(rng.integers(0, 2**63)).to_bytes(8, "big") + b"\x01doc/%d" % i,
                  i % 2, bytes(rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8)))
                 for i in range(120)],
        "text": [(b"url/%05d" % i, 0, b"the same words again " * 8) for i in range(200)],
    }
    for name, records in shapes.items():
        records.sort()
        for first in (True, False):
            fence = None if first else b"\x00"
            pieces = chunks.pack_record_chunks(0xF3, 7, records, fence, is_last=True)
            for j, (key, value) in enumerate(pieces[:2]):
                group = records[len(records) // 2][0][:6]
                seeds[f"{name}-{'first' if first else 'later'}-{j}"] = \
                    record_chunk.make_input(key, value[:record_chunk.MAX_VALUE_BYTES], group)
    return seeds


def decode_raw_block_seeds() -> dict[str, bytes]:
    """Return raw blocks as the writers make them: plain and packed, of each table."""
    from ndindex import chunks
    rng = np.random.default_rng(5)
    named = dict(tables(), level2=np.unique(rng.integers(0, 2**64 // 2**22 * 300, 300,
                                                         dtype=np.uint64)))
    seeds = {}
    for name, values in named.items():
        for packed in (False, True):
            blocks = chunks.encode_raw(values, packed).blocks.tobytes()[:2 * chunks.BLOCK_BYTES]
            n_blocks = len(blocks) // chunks.BLOCK_BYTES
            seeds[f"{name}-{'packed' if packed else 'plain'}-{n_blocks}b"] = \
                bytes([1 | (n_blocks - 1) << 1]) + blocks
    return seeds


def main() -> None:
    for target, make in (("decode_block", decode_block_seeds), ("decode_code", decode_code_seeds),
                         ("round_trip_blocks", round_trip_blocks_seeds),
                         ("record_chunk", record_chunk_seeds),
                         ("decode_raw_block", decode_raw_block_seeds)):
        out = os.path.join(FUZZ_DIR, "corpus", target)
        os.makedirs(out, exist_ok=True)
        for f in os.listdir(out):
            if f.startswith("seed-"):
                os.remove(os.path.join(out, f))
        seeds = make()
        for name, data in seeds.items():
            with open(os.path.join(out, f"seed-{name}"), "wb") as fh:
                fh.write(data)
        print(f"{target}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes")


if __name__ == "__main__":
    main()
