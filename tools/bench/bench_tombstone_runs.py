"""Benchmark what several tombstone runs cost a query (format 5, FORMAT.md 7.8).

Run:  python tools/bench/bench_tombstone_runs.py [--n 10000000] [--runs 6] [--dir DIR] [--out FILE]

A copy of ``fresh-N.ndx`` (``bench_stream.py``'s one-call build; built here
when missing) has 3% of its fingerprints removed in --runs flushes, each a
tombstone run of its own, as a churning writer leaves them; then single
queries (a stored fingerprint with two bits flipped: each finds one
fingerprint, which must be looked up among the tombstones) are timed, in
the writer (which holds the tombstones in memory once compaction has read
them) and in a read-only reader (which looks each candidate up in every
run in the file).  The same runs are then merged into one
(``Compactor._tombstone_round``) and the same queries timed again: the
same content.  Reports the p50 of each and their ratios (three passes over
20,000 queries each, after a warm-up pass).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_stream as bs  # noqa: E402


def p50_us(ix, queries: list) -> float:
    for q in queries[:5000]:
        ix.query(q, keys=False)
    lat = []
    for _ in range(3):
        for q in queries:
            t = time.perf_counter_ns()
            ix.query(q, keys=False)
            lat.append(time.perf_counter_ns() - t)
    return float(np.percentile(lat, 50)) / 1000


def main(argv=None) -> int:
    from ndindex import Index, levels
    from ndindex.reader import TombstoneMemo
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--dir", default="/work/benchdata")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    fresh = os.path.join(args.dir, f"fresh-{args.n}.ndx")
    if not os.path.exists(fresh):
        bs.build_fresh(np.unique(bs.stream_fingerprints(args.n)), fresh)
    path = os.path.join(args.dir, "tombstone-runs.ndx")
    bs.remove_index(path)
    shutil.copyfile(fresh, path)
    rng = np.random.default_rng(3)
    lines = bs.header("bench_tombstone_runs", argv)
    try:
        with Index.open(path, background_compaction=False, log_limit=1 << 30) as ix:
            stored = ix.fingerprints()
            gone = rng.choice(stored, int(0.03 * len(stored)), replace=False)
            for part in np.array_split(gone, args.runs):
                ix.remove(fingerprints=np.sort(part))
                ix._compactor._flush(ix._snapshot())
            kept = np.setdiff1d(stored, gone)
            queries = (kept[rng.integers(0, len(kept), 20_000)] ^ np.uint64(0x81)).tolist()
            runs = len(ix._snapshot().tombstone_runs)
            figures = {}

            def measure(label):
                # A reader process looks each candidate up in the runs in the
                # file; the writer holds the tombstones in memory once its
                # compaction has read them (each step does).
                ix._tombstones = TombstoneMemo()
                ix._let_go_of_snapshot()
                figures[label, "reader"] = p50_us(ix, queries)
                ix._snapshot().tombstones
                ix._let_go_of_snapshot()
                figures[label, "writer"] = p50_us(ix, queries)
            measure(runs)
            before, levels.TOMBSTONE_RUNS = levels.TOMBSTONE_RUNS, 0
            try:
                while len(ix._snapshot().tombstone_runs) > 1:
                    ix._compactor._tombstone_round(ix._snapshot())
            finally:
                levels.TOMBSTONE_RUNS = before
            measure(1)
    finally:
        bs.remove_index(path)
    lines.append(f"N = {args.n:,}, {len(gone):,} removed; query p50, us "
                 f"(a stored fingerprint, two bits flipped):")
    for who, how in (("reader", "looked up in the file"), ("writer", "held in memory")):
        several, one = figures[runs, who], figures[1, who]
        lines.append(f"  {who} (tombstones {how}): {runs} tombstone runs {several:.2f}, "
                     f"one {one:.2f}: {several / one:.2f}x")
    lines.append(f"  writer, {runs} runs held / reader, one run looked up: "
                 f"{figures[runs, 'writer'] / figures[1, 'reader']:.2f}x")
    print("\n".join(lines))
    bs.write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
