"""Benchmark table designs at one N: what more tables buy a query, and check_and_add.

Run:  python tools/bench/bench_plans.py [--n 30000000] [--dir DIR] [--out FILE]

At k = 3 the planner (``plan.choose_plan``) gives four tables of 16-bit
prefixes up to billions of fingerprints; the other design of the block
scheme has ten tables of 25-26-bit prefixes (``plan.block_design(3, (5,))``),
2.5 times the space.  For each design the same --n fingerprints (those of
``bench_stream.py``) are built in one call and compacted fully, then, on
the same file, one after the other:

- single queries (2,000 stored fingerprints with 0-3 bits flipped, warmed
  up with 2,000 others twice): p50 and the time per query of the same
  batch through ``query_many``;
- ``check_and_add`` in ``transaction()`` blocks of 1,000 (100,000 new
  random fingerprints, background compaction on, as in bench_stream.py),
  and the time per item beyond the query.

Peers are the designs themselves, measured in the same run; the report
gives ten tables against four as ratios.  Index files are deleted after.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import bench_stream as bs  # noqa: E402  (the stream's fingerprints, queries and helpers)

K = 3


def measure(path: str, fps: np.ndarray, plan, rng) -> dict:
    from ndindex.index import Index
    bs.remove_index(path)
    t = time.perf_counter()
    with Index.create(path, k=K, expected_n=len(fps), plan=plan) as ix:
        ix.add(fps)
        ix.compact(full=True)
    build_s = time.perf_counter() - t
    size = os.path.getsize(path)
    with Index.open(path) as ix:
        bs.warm_up(ix, bs.make_queries(rng, fps, 2000))
        single = bs.make_queries(rng, fps, 2000)
        lat = bs.latencies_us(lambda q: ix.query(int(q), K, keys=False), single)
        t = time.perf_counter()
        ix.query_many(np.asarray(single, dtype=np.uint64), K)
        many_us = (time.perf_counter() - t) / len(single) * 1e6
        items = rng.integers(0, 2**64, 100_000, dtype=np.uint64).tolist()
        cna = bs.txn_items(ix, items)
        tables = len(ix.plan.tables)
        prefixes = sorted({t.prefix_bits for t in ix.plan.tables})
    bs.remove_index(path)
    return dict(tables=tables, prefixes=prefixes, size=size, build_s=build_s,
                p50_us=float(np.median(lat)), many_us=many_us, cna=cna)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30_000_000)
    ap.add_argument("--dir", default="/work/benchdata", help="where index files go (deleted)")
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args(argv)
    from ndindex import plan as plans
    fps = bs.stream_fingerprints(args.n)
    os.makedirs(args.dir, exist_ok=True)
    designs = [("planner", plans.choose_plan(args.n, K)),
               ("ten tables", plans.block_design(K, (5,)))]
    results = []
    for name, plan in designs:
        bs.progress(f"{name}: building {args.n:,}")
        results.append((name, measure(os.path.join(args.dir, f"plans-{args.n}.ndx"), fps, plan,
                                      np.random.default_rng(bs.SEED + 7))))
    out = bs.header("bench_plans", argv if argv is not None else sys.argv[1:])
    out.append(f"N = {args.n:,}, k = {K}; fully compacted one-call builds")
    out.append(f"  {'design':<12} {'t':>3} {'prefix':>7} {'file MB':>8} {'p50 us':>7} "
               f"{'many us/q':>9} {'c&a items/s':>12} {'c&a us - p50':>13}")
    for name, r in results:
        prefix = "-".join(str(p) for p in (r["prefixes"][0], r["prefixes"][-1]))
        out.append(f"  {name:<12} {r['tables']:>3} {prefix:>7} {r['size'] / 1e6:>8,.0f} "
                   f"{r['p50_us']:>7.1f} {r['many_us']:>9.2f} {r['cna']:>12,.0f} "
                   f"{1e6 / r['cna'] - r['p50_us']:>13.1f}")
    (_, a), (_, b) = results
    out.append(f"  ten tables / planner: file {b['size'] / a['size']:.2f}x, query p50 "
               f"{b['p50_us'] / a['p50_us']:.2f}x, query_many {b['many_us'] / a['many_us']:.2f}x, "
               f"check_and_add rate {b['cna'] / a['cna']:.2f}x")
    text = "\n".join(out)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
