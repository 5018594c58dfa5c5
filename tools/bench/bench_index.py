"""Benchmark the index against FAISS binary indexes, measured in the same run.

Run:  python tools/bench/bench_index.py [--sizes 1000000 10000000] [--queries 10000]
Needs the bench extra (faiss-cpu, psutil):  pip install -e '.[bench]'

Data: N random 64-bit fingerprints (seeded); Q queries, half of them a
stored fingerprint with 1..3 bits flipped, half random; k = 3.  Engines:

- ndindex: one add() of all N (into the append log) and compact(full=True),
  which writes each table as one run: the ingest time counts both; then 1%
  more in batches of 10,000 through the log and one compact(), and those
  removed again; single queries through Index.query(keys=False); batches
  through Index.query_many (threads = cores).  Queries read the blocks in
  place from the mapped file (the page cache warm, as after the build);
  FAISS holds its data in memory, uncompressed.  A stream of small adds
  from empty, the open path and the CLI are bench_stream.py's and
  bench_open.py's.
- faiss MultiHash: IndexBinaryMultiHash(64, 4, 16), range_search with
  radius k+1 (FAISS reports distances strictly below the radius).
- faiss Flat: IndexBinaryFlat(64), a brute-force scan; measured on a
  subset of queries because each one reads the whole array.

Each engine runs in its own subprocess, so "peak MB" is that process's
maximum resident set (data generation included, the same for all).
Results are checked for agreement with FAISS Flat on the subset.  Report
ratios, not absolute times: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

K = 3


def make_data(n, n_queries, seed=7):
    rng = np.random.default_rng(seed)
    fps = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    near = fps[rng.integers(0, n, size=n_queries // 2)].copy()
    for i in range(3):
        flip = rng.random(len(near)) < (1.0 if i == 0 else 0.6)
        near[flip] ^= np.uint64(1) << rng.integers(0, 64, size=int(flip.sum()), dtype=np.uint64)
    far = rng.integers(0, 2**64, size=n_queries - len(near), dtype=np.uint64)
    queries = np.concatenate([near, far])
    rng.shuffle(queries)
    return fps, queries


def latencies(fn, queries):
    out = np.empty(len(queries))
    for i, q in enumerate(queries):
        t = time.perf_counter_ns()
        fn(q)
        out[i] = (time.perf_counter_ns() - t) / 1000
    return out


def as_bytes(a):
    """uint64 fingerprints as FAISS binary codes (8 bytes, little-endian)."""
    return np.ascontiguousarray(a.astype("<u8")).view(np.uint8).reshape(-1, 8)


def run_ndindex(n, n_queries, subset, workdir):
    from ndindex.index import Index
    fps, queries = make_data(n, n_queries)
    path = os.path.join(workdir, f"bench-{n}.ndx")
    t0 = time.perf_counter()
    ix = Index.create(path, k=K, expected_n=n)
    ix.add(fps)
    ix.compact(full=True)
    t_ingest = time.perf_counter() - t0
    bulk = ix.stats()
    # Then the crawler's pattern: small batches through the log, one compaction.
    extra = np.random.default_rng(11).integers(0, 2**64, size=n // 100, dtype=np.uint64)
    t = time.perf_counter()
    for a in range(0, len(extra), 10_000):
        ix.add(extra[a:a + 10_000])
    t_log = time.perf_counter() - t
    report = ix.compact()
    ix.remove(fingerprints=extra)  # back to the benchmark's data set for queries
    ix.compact()
    # compact(full=True) wrote the file with LMDB's copy (O_DIRECT): read it
    # through once, so that queries measure the index, not the disk.
    with open(path, "rb", buffering=0) as fh:
        while fh.read(1 << 20):
            pass
    ix.query(int(queries[0]), K, keys=False)  # build the snapshot
    lat = latencies(lambda q: ix.query(int(q), K, keys=False), queries)
    t = time.perf_counter()
    res = ix.query_many(queries, K)
    t_many = time.perf_counter() - t
    sub = res[res["query"] < subset]
    pairs = sorted(zip(sub["query"].tolist(), sub["fingerprint"].tolist()))
    stats = ix.stats()
    ix.close()
    return dict(engine="ndindex", n=n, p50_us=float(np.percentile(lat, 50)),
                p99_us=float(np.percentile(lat, 99)), many_qps=len(queries) / t_many,
                ingest_fps=n / t_ingest, ingest_s=t_ingest,
                log_add_fps=len(extra) / t_log, compact_s=report["seconds"],
                file_bytes_per_fp=bulk["file_bytes"] / n,
                file_bits_per_fp_per_table=bulk["file_bits_per_fingerprint_per_table"],
                table_bits_per_fp=bulk["tables"][0]["bits_per_fingerprint"],
                file_after_churn_bits=stats["file_bits_per_fingerprint_per_table"],
                bound_bits=bulk["entropy_bound_bits"], tables=len(bulk["tables"]),
                matches=len(res), pairs=pairs)


def faiss_range(index, xq, radius):
    lims, _d, ids = index.range_search(xq, radius)
    return lims, ids


def run_faiss(kind, n, n_queries, subset, workdir):
    import faiss
    fps, queries = make_data(n, n_queries)
    xb, xq = as_bytes(fps), as_bytes(queries)
    t0 = time.perf_counter()
    index = faiss.IndexBinaryMultiHash(64, 4, 16) if kind == "multihash" else faiss.IndexBinaryFlat(64)
    index.add(xb)
    t_ingest = time.perf_counter() - t0
    qs = xq if kind == "multihash" else xq[:subset]
    faiss.omp_set_num_threads(1)
    lat = latencies(lambda i: faiss_range(index, qs[i:i + 1], K + 1), range(len(qs)))
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    t = time.perf_counter()
    lims, ids = faiss_range(index, qs, K + 1)
    t_many = time.perf_counter() - t
    pairs = sorted((q, int(fps[ids[j]])) for q in range(min(subset, len(qs)))
                   for j in range(lims[q], lims[q + 1]))
    pairs = sorted(set(pairs))
    return dict(engine=f"faiss {kind}", n=n, p50_us=float(np.percentile(lat, 50)),
                p99_us=float(np.percentile(lat, 99)), many_qps=len(qs) / t_many,
                ingest_fps=n / t_ingest, matches=int(lims[-1]), pairs=pairs)


def child(conn, name, args):
    fn = {"ndindex": run_ndindex, "multihash": lambda *a: run_faiss("multihash", *a),
          "flat": lambda *a: run_faiss("flat", *a)}[name]
    out = fn(*args)
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    conn.send(out)
    conn.close()


def run(name, args):
    ctx = mp.get_context("spawn")
    parent, kid = ctx.Pipe(duplex=False)
    p = ctx.Process(target=child, args=(kid, name, args))
    p.start()
    out = parent.recv()
    p.join()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--flat-queries", type=int, default=200,
                    help="queries for the brute-force peer and the agreement check")
    ap.add_argument("--workdir", default=None, help="where index files go (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="ndindex-bench-")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"# bench_index  {time.strftime('%Y-%m-%d %H:%M')}  commit {commit}  {platform.machine()}"
          f"  {os.cpu_count()} cores  k={K}  queries={args.queries} (half within 3 bits)")
    rows = []
    try:
        for n in args.sizes:
            common = (n, args.queries, args.flat_queries, workdir)
            res = {name: run(name, common) for name in ("ndindex", "multihash", "flat")}
            agree = res["ndindex"]["pairs"] == res["flat"]["pairs"] == res["multihash"]["pairs"]
            mh, nd = res["multihash"], res["ndindex"]
            print(f"\nN = {n:,}: results agree with FAISS Flat on {args.flat_queries} queries: {agree}")
            print(f"{'engine':<17}{'p50 us':>9}{'p99 us':>9}{'batch q/s':>12}{'ingest fp/s':>13}"
                  f"{'peak MB':>9}")
            for r in res.values():
                print(f"{r['engine']:<17}{r['p50_us']:>9.1f}{r['p99_us']:>9.1f}{r['many_qps']:>12,.0f}"
                      f"{r['ingest_fps']:>13,.0f}{r['peak_mb']:>9.0f}")
            print(f"ndindex vs MultiHash: p50 {mh['p50_us'] / nd['p50_us']:.1f}x faster, "
                  f"batch {nd['many_qps'] / mh['many_qps']:.1f}x, "
                  f"p99 {mh['p99_us'] / nd['p99_us']:.1f}x")
            print(f"ndindex file: {nd['file_bytes_per_fp']:.2f} bytes/fp in {nd['tables']} tables = "
                  f"{nd['file_bits_per_fp_per_table']:.2f} bits/fp/table; bound "
                  f"{nd['bound_bits']:.2f} -> {nd['file_bits_per_fp_per_table'] / nd['bound_bits']:.3f}x "
                  f"(table values alone {nd['table_bits_per_fp'] / nd['bound_bits']:.3f}x)")
            print(f"ndindex ingest: one add() of {n:,} and compact(full=True) {nd['ingest_s']:.2f}s; "
                  f"then {n // 100:,} more in batches of 10,000 through the log at "
                  f"{nd['log_add_fps']:,.0f} fp/s and compact() {nd['compact_s']:.2f}s; file after "
                  f"removing them {nd['file_after_churn_bits'] / nd['bound_bits']:.3f}x the bound "
                  f"(LMDB keeps freed pages for reuse)")
            for r in res.values():
                r.pop("pairs")
            rows.append(res)
        if args.json:
            print(json.dumps(rows, indent=1))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
