"""Benchmark: several writer processes adding to one file, against one writer alone.

Run:  python tools/bench/bench_writers.py [--seconds 30] [--writers 2] [--out FILE]

Each writer process opens the same index (background compaction on, the
default) and adds batches of 10,000 random fingerprints, durably, for
SECONDS.  LMDB serialises their commits and one process at a time holds
the compaction lease; a writer that outruns compaction is held back at
the slowdown and stop lines (compaction.SLOWDOWN_LOGS and beside it),
reading the file's figures when another process compacts.  Prints, for
one writer alone (the peer) and then WRITERS at once: the fingerprints a
second together, each process's call latency (p50, p99, max), the share
of its calls that reached the stop line's wait (35 ms or more), and its
compaction steps; and the rate of the writers together over the one
alone.  The index's len() is checked against what was added.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_stream as bs  # noqa: E402

BATCH = 10_000
#: A call this long waited at the stop line (its wait ends 40 ms after the commit began).
STOPPED_MS = 35.0


def writer(path: str, seed: int, seconds: float, start, out) -> None:
    from ndindex import Index
    rng = np.random.default_rng(seed)
    latencies = []
    with Index.open(path) as ix:
        start.wait()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            batch = rng.integers(0, 2**64, size=BATCH, dtype=np.uint64)
            t = time.perf_counter()
            ix.add(batch)
            latencies.append(time.perf_counter() - t)
        steps = ix._compactor.steps
    out.put((seed, latencies, steps))


def run(path: str, writers: int, seconds: float) -> tuple[float, list, int]:
    """(fingerprints a second together, per-writer lines, fingerprints added)."""
    from ndindex import Index
    if os.path.exists(path):
        os.remove(path)
    Index.create(path, k=3, expected_n=10_000_000).close()
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=writer, args=(path, 1000 + w, seconds, start, out))
             for w in range(writers)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # every process has opened the file
    t0 = time.monotonic()
    start.set()
    results = sorted(out.get() for _ in procs)
    wall = time.monotonic() - t0
    for p in procs:
        p.join()
    lines, added = [], 0
    for seed, lat, steps in results:
        ms = np.array(lat) * 1e3
        added += len(ms) * BATCH
        lines.append(f"    writer {seed - 1000}: {len(ms):,} calls, latency ms p50 "
                     f"{np.percentile(ms, 50):.1f}  p99 {np.percentile(ms, 99):.1f}  max "
                     f"{ms.max():.1f}; at the stop line {np.mean(ms >= STOPPED_MS) * 100:.0f}% "
                     f"of calls; {steps:,} compaction steps")
    with Index.open(path, readonly=True) as ix:
        assert len(ix) == added, (len(ix), added)
    return added / wall, lines, added


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--dir", help="where the index goes (default: a temp dir)")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args(argv)
    lines = bs.header("bench_writers", argv, f"{args.seconds:g} s each")
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = os.path.join(d, "writers.ndx")
        rates = {}
        for n in (1, args.writers):
            rate, per, added = run(path, n, args.seconds)
            rates[n] = rate
            lines.append(f"{n} writer{'s: ' if n > 1 else ': '}{rate:,.0f} fp/s"
                         f"{' together' if n > 1 else ''} ({added:,} added; len() agrees)")
            lines += per
            print("\n".join(lines[-1 - len(per):]), flush=True)
    lines.append(f"{args.writers} writers together / 1 alone: "
                 f"{rates[args.writers] / rates[1]:.2f}x the rate")
    lines.append(f"# load after {bs.load_line()}")
    print(lines[-2])
    bs.write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
