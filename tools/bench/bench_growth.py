"""Benchmark how the cost of adding grows with N: a stream past bench_stream's sizes.

Run:  python tools/bench/bench_growth.py [--n 100000000] [--dir DIR] [--out FILE]

One stream of durable 10,000-fingerprint ``add()`` calls from empty to N
(k = 3, the plan Index.create picks for N: 10 tables at 100M), compaction
in the background as bench_stream.py runs it.  For each fifth of the
stream: its rate, the record bytes put per fingerprint added (the
commits' and compactions' ``Store.bytes_written`` over 8 bytes x tables x
fingerprints added in that fifth: the write amplification of that fifth)
and the levels table 0 holds at its end.  The work per fingerprint should
grow with log N, not N: the last fifth's bytes per fingerprint over the
second fifth's (the first has no main level yet) is printed as the ratio
to watch, in the same run.  Needs about 3 GB of disk and 2 GB of memory
at 100M; about 4 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_stream as bs  # noqa: E402

BATCH = 10_000
PARTS = 5


def run(n: int, workdir: str) -> list[str]:
    from ndindex.index import Index
    path = os.path.join(workdir, f"growth-{n}.ndx")
    bs.remove_index(path)
    rng = np.random.default_rng(bs.SEED + 7)
    ix = Index.create(path, k=bs.K, expected_n=n)
    tables = len(ix.plan.tables)
    calls = n // BATCH
    part = calls // PARTS
    lines = [f"N = {n:,}, t = {tables} tables, {calls:,} add() calls of {BATCH:,}",
             f"{'added':>12} {'fp/s':>11} {'bytes/fp':>9}  levels of table 0 (runs)"]
    per_fp = []
    start = last = time.perf_counter()
    written = last_written = ix._store.bytes_written
    for i in range(calls):
        ix.add(rng.integers(0, 2**64, size=BATCH, dtype=np.uint64))
        if (i + 1) % part == 0:
            now, w = time.perf_counter(), ix._store.bytes_written
            per_fp.append((w - last_written) / (8 * tables * part * BATCH))
            runs = ix._snapshot().manifest.of(0)
            levels = " ".join(f"L{r.level}" for r in runs)
            lines.append(f"{(i + 1) * BATCH:>12,} {part * BATCH / (now - last):>11,.0f} "
                         f"{per_fp[-1]:>9.2f}  {levels}")
            bs.progress(lines[-1])
            last, last_written = now, w
    total = time.perf_counter() - start
    lines.append(f"overall {n / total:,.0f} fp/s; write amplification (record bytes) "
                 f"{(ix._store.bytes_written - written) / (8 * tables * n):.2f}; bytes/fp, last "
                 f"fifth / second fifth: {per_fp[-1] / per_fp[1]:.2f}")
    ix.close()
    bs.remove_index(path)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000_000)
    ap.add_argument("--dir", default="/work/benchdata", help="where the index file goes")
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args(argv)
    if args.n % (BATCH * PARTS) or args.n < 10 * BATCH * PARTS:
        ap.error(f"--n must be a multiple of {BATCH * PARTS:,}, at least {10 * BATCH * PARTS:,}")
    os.makedirs(args.dir, exist_ok=True)
    lines = bs.header("bench_growth", argv)
    lines += run(args.n, args.dir)
    lines.append(f"# load after {bs.load_line()}")
    print("\n".join(lines))
    bs.write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
