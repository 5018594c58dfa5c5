"""Drive the C codec with corrupt blocks, for valgrind or an ASan build.

Usage (see fuzz/README.md for the ASan variant)::

    PYTHONMALLOC=malloc valgrind --error-exitcode=99 --errors-for-leak-kinds=none \\
        python fuzz/memcheck.py --iterations 3000

Only the C paths run here (decode, probe, block_counts, compile_code,
encode), not the slow plain-Python reference, so a few thousand blocks
finish in minutes under valgrind.  Inputs: the decode_block seed corpus and
regressions, then blocks encoded from random tables and mutated (bit flips,
random bytes, extreme counts and first values, zeroed or random tails),
with the CRC fixed three times in four so the bitstream is reached.  Each
decode is timed; the slowest is reported, as a hang check.

Exits nonzero if anything but CorruptionError is raised (memory errors are
valgrind's or ASan's to report).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import numpy as np

FUZZ_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, FUZZ_DIR)

import harness  # noqa: E402
from ndindex import _core, codec  # noqa: E402
from ndindex.errors import CorruptionError  # noqa: E402

BLOCK = codec.BLOCK_BYTES
MAX_COUNT = 1 + (BLOCK - codec.BLOCK_HEADER_BYTES) * 8


def valid_blocks(rng: random.Random) -> list[bytes]:
    """Return real blocks of assorted tables under the fixed codes."""
    nrng = np.random.default_rng(rng.getrandbits(32))
    tables = [np.unique(nrng.integers(0, 2**64, 400, dtype=np.uint64)),
              np.arange(100, 9000, dtype=np.uint64),
              np.array([(1 << i) - 1 for i in range(65)], dtype=np.uint64)]
    out = []
    for code in harness.FIXED_CODES:
        for t in tables:
            enc = codec.encode(t, code).blocks.tobytes()
            out += [enc[i:i + BLOCK] for i in range(0, len(enc), BLOCK)][:2]
    return out


def mutate(block: bytes, rng: random.Random) -> bytes:
    """Return a damaged copy of block."""
    b = bytearray(block)
    kind = rng.randrange(6)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(4, BLOCK)
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:
        b[4:6] = rng.choice([0, 1, 2, MAX_COUNT, MAX_COUNT + 1, 65535, rng.randrange(65536)]).to_bytes(2, "little")
    elif kind == 2:
        b[6:14] = rng.choice([0, 2**63, 2**64 - 1, 2**64 - 2, rng.getrandbits(64)]).to_bytes(8, "little")
    elif kind == 3:
        cut = rng.randrange(14, BLOCK)
        b[cut:] = bytes(BLOCK - cut) if rng.random() < 0.5 else os.urandom(BLOCK - cut)
    elif kind == 4:
        b = bytearray(os.urandom(BLOCK))
        b[4:6] = rng.randrange(MAX_COUNT + 2).to_bytes(2, "little")
    else:
        b[14:] = bytes([rng.choice([0x00, 0xFF, 0x80, 0x01])]) * (BLOCK - 14)
        b[4:6] = rng.randrange(MAX_COUNT + 2).to_bytes(2, "little")
    if rng.random() < 0.75:
        harness.fix_crc(b)
    return bytes(b)


def exercise(blocks: bytes, code, rng: random.Random, outcomes: dict) -> float:
    """Decode and probe; return the decode time in seconds."""
    start = time.perf_counter()
    for view in (harness.GUARD.at_end(blocks), harness.GUARD.at_start(blocks)):
        try:
            codec.decode(view, code)
            outcome = "ok"
        except CorruptionError as err:
            outcome = str(err).split(": ", 1)[1].split(" (")[0]
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
    took = time.perf_counter() - start
    codec.block_counts(blocks)
    for i in range(0, len(blocks), BLOCK):
        q = int.from_bytes(blocks[i + 6:i + 14], "little") ^ rng.getrandbits(64) >> rng.randrange(65)
        try:
            codec.probe(harness.GUARD.at_end(blocks[i:i + BLOCK]), code, q, rng.randrange(65), rng.randrange(65))
        except CorruptionError:
            pass
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    slowest = 0.0
    n = 0
    outcomes: dict[str, int] = {}
    decode_block = __import__("decode_block")
    for path in harness.corpus_files(FUZZ_DIR, "decode_block"):
        with open(path, "rb") as fh:
            data = fh.read()
        decode_block.check(data)  # the full target, reference included
        n += 1
    seeds = valid_blocks(rng)
    for it in range(args.iterations):
        code = rng.choice(harness.FIXED_CODES) if rng.random() < 0.7 else \
            codec.HuffmanCode.from_lengths(harness.complete_lengths(os.urandom(64)), rng.randrange(2))
        k = rng.choice([1, 1, 1, 2, 3])
        blocks = b"".join(mutate(rng.choice(seeds), rng) for _ in range(k))
        slowest = max(slowest, exercise(blocks, code, rng, outcomes))
        n += 1
        if it % 5 == 0:  # the code loader: random and perturbed records
            rec = bytearray(rng.choice(harness.FIXED_CODES).to_bytes())
            rec[rng.randrange(len(rec))] = rng.randrange(256)
            for data in (bytes(rec), os.urandom(rng.randrange(70))):
                try:
                    _core.compile_code(data[2:66].ljust(64, b"\0"), data[0] if data else 0)
                except ValueError:
                    pass
    print(f"memcheck: {n} inputs clean; slowest decode of up to 3 blocks {slowest * 1e3:.2f} ms")
    print("decode outcomes:", ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
