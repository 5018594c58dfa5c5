"""Benchmark the block codec: size against the entropy bound, encode and decode speed.

Run:  python tools/bench/bench_codec.py [--sizes 1000000 10000000] [--repeat 3]

For each N and coding: bits per fingerprint of the whole table (block
headers, restart tables and unused tail bits included) and its ratio to
64 - log2 N + log2 e; encode and decode rates on one core (best of
--repeat); decode time as a ratio to numpy copying the same uncompressed
array, measured in the same run (the peer that keeps the ratio meaningful
on a shared, noisy machine); and the probes a query makes of the block
where its 16-bit prefix begins (k = 3, the blocks side by side as queries
decode them), per second, and as a ratio to the delta coding's in the same
run: the part of a block before the prefix is what restart tables skip.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from ndindex import codec
from ndindex.codec import CODING_DELTA, CODING_RESTARTS, CODING_XOR, HuffmanCode

PROBES = 20_000


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def datasets(n, seed=1):
    rng = np.random.default_rng(seed)
    yield "random", np.unique(rng.integers(0, 2**64, size=n, dtype=np.uint64))
    # Clustered: n/16 centres, each with 16 neighbours within 3 bits.
    centres = rng.integers(0, 2**64, size=max(n // 16, 1), dtype=np.uint64)
    flips = np.zeros(n, dtype=np.uint64)
    for _ in range(3):
        flips ^= np.uint64(1) << rng.integers(0, 64, size=n, dtype=np.uint64)
    yield "clustered", np.unique(np.repeat(centres, 16)[:n] ^ flips)


def first_block_probes(x, enc, code, repeat, seed=2):
    """Probes per second of the block holding the start of a random 16-bit prefix."""
    qs = np.random.default_rng(seed).integers(0, 2**64, size=PROBES, dtype=np.uint64)
    lo = qs & np.uint64(0xFFFF << 48)
    at = np.minimum(np.searchsorted(enc.keys, lo), enc.n_blocks - 1)
    blocks = enc.blocks.reshape(-1, codec.BLOCK_BYTES)[at].tobytes()
    codes, ps, ks = [code] * PROBES, [16] * PROBES, [3] * PROBES
    return PROBES / best(lambda: codec.probe_blocks(blocks, codes, qs, ps, ks, verified=True),
                         repeat)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"# bench_codec  {time.strftime('%Y-%m-%d')}  {platform.machine()}  "
          f"python {platform.python_version()}  numpy {np.__version__}")
    hdr = (f"{'data':<10}{'N':>11} {'coding':<15}{'bits/fp':>8}{'bound':>7}{'ratio':>7}"
           f"{'enc M/s':>9}{'dec M/s':>9}{'dec/copy':>9}{'probe M/s':>10}{'x delta':>8}")
    print(hdr)
    for n in args.sizes:
        for name, x in datasets(n):
            copy_t = best(lambda: x.copy(), args.repeat)
            delta_rate = None
            for coding in (CODING_DELTA, CODING_RESTARTS, CODING_XOR):
                code = HuffmanCode.from_values(x, coding)
                enc = codec.encode(x, code)
                enc_t = best(lambda: codec.encode(x, code), args.repeat)
                dec_t = best(lambda: codec.decode(enc, code), args.repeat)
                assert np.array_equal(codec.decode(enc, code), x)
                rate = first_block_probes(x, enc, code, args.repeat)
                delta_rate = delta_rate or rate
                bits = enc.blocks.size * 8 / len(x)
                bound = codec.entropy_bound_bits(len(x))
                print(f"{name:<10}{len(x):>11} {codec.CODING_NAMES[coding]:<15}{bits:>8.3f}"
                      f"{bound:>7.2f}{bits / bound:>7.4f}{len(x) / enc_t / 1e6:>9.1f}"
                      f"{len(x) / dec_t / 1e6:>9.1f}{dec_t / copy_t:>9.1f}"
                      f"{rate / 1e6:>10.2f}{rate / delta_rate:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
