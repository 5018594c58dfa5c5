"""Benchmark the batch join (ndindex.batch) against FAISS IndexBinaryMultiHash, in one run.

Run:  python tools/bench/bench_batch.py                 # the issue's 1M x 100M, k = 3
      python tools/bench/bench_batch.py --small         # 100k x 5M, a minute
Needs the bench extra (faiss-cpu):  pip install -e '.[bench]'

Data (seeded, generated chunk by chunk so memory stays bounded): F, --stored
random 64-bit fingerprints written to a fingerprint file (ndindex.fpfile) in
sorted chunks of 1M; Q, --queries fingerprints, half of them an F entry with
1-3 bits flipped, half random.  What is measured:

- ndindex: ``batch.join(Q, <fpfile>, k, workers=W)`` over all of F, read
  back from disk (the page cache may hold it: the file is written just
  before).  The time covers building the Q tables in every worker, reading
  and decompressing F, probing, and gathering the pairs.
- FAISS, one thread: ``IndexBinaryMultiHash(64, 4, 16)`` built over Q (4 maps of 16-bit
  substrings: exact for k = 3 by pigeonhole), ``range_search`` with radius
  k + 1 (FAISS keeps distances below the radius) for the first --faiss-stored
  fingerprints of F.  FAISS is measured on a subset because it is over an
  order of magnitude slower; ndindex (QueryTables.probe, one core, in this
  process) scans the same subset, and the two pair sets are compared.

Rates are fingerprints of F per second per core (wall time x workers).
Report ratios, not absolute rates: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from ndindex import batch, fpfile  # noqa: E402

GEN_CHUNK = 1 << 20


def stored_chunk(seed: int, i: int, n: int) -> np.ndarray:
    """Chunk i of F: n random fingerprints from its own seeded stream, sorted."""
    return np.sort(np.random.default_rng([seed, i]).integers(0, 2**64, n, dtype=np.uint64))


def make_stored(path: str, n: int, seed: int) -> float:
    t = time.perf_counter()
    with fpfile.FingerprintWriter(path, chunk_size=GEN_CHUNK) as w:
        for i, a in enumerate(range(0, n, GEN_CHUNK)):
            w.write(stored_chunk(seed, i, min(GEN_CHUNK, n - a)))
    return time.perf_counter() - t


def make_queries(n: int, n_stored: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 1 << 30])
    first = stored_chunk(seed, 0, min(GEN_CHUNK, n_stored))
    near = first[rng.integers(0, len(first), n // 2)]
    for flip in range(3):
        hit = rng.random(len(near)) < (1.0 if flip == 0 else 0.5)
        near[hit] ^= np.uint64(1) << rng.integers(0, 64, int(hit.sum()), dtype=np.uint64)
    return np.concatenate([near, rng.integers(0, 2**64, n - len(near), dtype=np.uint64)])


def as_codes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.astype("<u8")).view(np.uint8).reshape(-1, 8)


def run_ndindex(queries, source, k, workers):
    t = time.perf_counter()
    pairs = [p for p in batch.join(queries, source, k, workers=workers)]
    seconds = time.perf_counter() - t
    pairs = np.concatenate(pairs) if pairs else np.empty(0, batch.PAIR_DTYPE)
    return seconds, pairs


def run_faiss(queries, stored, k, workers):
    import faiss
    faiss.omp_set_num_threads(workers)
    t = time.perf_counter()
    index = faiss.IndexBinaryMultiHash(64, 4, 16)
    index.add(as_codes(queries))
    build = time.perf_counter() - t
    qs, fs, ds = [], [], []
    t = time.perf_counter()
    for a in range(0, len(stored), 100_000):
        part = stored[a:a + 100_000]
        lims, dist, ids = index.range_search(as_codes(part), k + 1)
        fs.append(np.repeat(part, np.diff(lims).astype(np.int64)))
        qs.append(queries[ids])
        ds.append(dist)
    seconds = time.perf_counter() - t
    return build, seconds, np.concatenate(qs), np.concatenate(fs), np.concatenate(ds)


def pair_set(q, f, d) -> set:
    return set(zip(np.asarray(q).tolist(), np.asarray(f).tolist(), np.asarray(d).astype(int).tolist()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=1_000_000)
    ap.add_argument("--stored", type=int, default=100_000_000)
    ap.add_argument("--faiss-stored", type=int, default=2_000_000)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=2007)
    ap.add_argument("--small", action="store_true", help="100k queries x 5M stored, FAISS on 500k")
    ap.add_argument("--dir", default=None, help="where to write the fingerprint file (default: a temp dir)")
    ap.add_argument("--out", default=None, help="append the report to this file")
    args = ap.parse_args()
    if args.small:
        args.queries, args.stored, args.faiss_stored = 100_000, 5_000_000, 500_000
    args.faiss_stored = min(args.faiss_stored, args.stored)
    workdir = args.dir or tempfile.mkdtemp(prefix="bench-batch-")
    path = os.path.join(workdir, f"stored-{args.stored}-{args.seed}.ndfp")
    lines = []

    def say(line=""):
        print(line, flush=True)
        lines.append(line)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(__file__)).stdout.strip()
    say(f"bench_batch  {datetime.date.today()}  commit {commit}  {platform.machine()} "
        f"{os.cpu_count()} cores  python {platform.python_version()}")
    say(f"command: python tools/bench/bench_batch.py {' '.join(sys.argv[1:])}")
    say(f"|Q| = {args.queries:,}  |F| = {args.stored:,}  k = {args.k}  workers = {args.workers}")
    if not os.path.exists(path):
        gen = make_stored(path, args.stored, args.seed)
        say(f"F written to a fingerprint file in {gen:.1f} s: {os.path.getsize(path) / args.stored:.2f} "
            "bytes per fingerprint")
    queries = make_queries(args.queries, args.stored, args.seed)
    plan = batch.plans.choose_plan(len(np.unique(queries)), args.k)
    say(f"Q tables: {len(plan.tables)} tables, p = {min(t.prefix_bits for t in plan.tables)}.."
        f"{max(t.prefix_bits for t in plan.tables)} ({plan.scheme})")

    # The subset both engines scan, each on one core in this process, so the
    # per-core rates compare kernels, and their pair sets can be compared.
    subset = np.concatenate([stored_chunk(args.seed, i, min(GEN_CHUNK, args.faiss_stored - a))
                             for i, a in enumerate(range(0, args.faiss_stored, GEN_CHUNK))])
    t = time.perf_counter()
    tables = batch.QueryTables(queries, args.k)
    nd_build = time.perf_counter() - t
    t = time.perf_counter()
    nd_sub = np.concatenate([tables.probe(subset[a:a + GEN_CHUNK])
                             for a in range(0, len(subset), GEN_CHUNK)])
    nd_sub_s = time.perf_counter() - t
    build, fa_s, fq, ff, fd = run_faiss(queries, subset, args.k, 1)
    agree = pair_set(nd_sub["q"], nd_sub["f"], nd_sub["distance"]) == pair_set(fq, ff, fd)
    nd_sub_rate = len(subset) / nd_sub_s
    fa_rate = len(subset) / fa_s
    say(f"one core, subset of {len(subset):,} in memory: ndindex {nd_sub_rate / 1e6:.2f} M/s "
        f"({nd_sub_s:.2f} s + tables {nd_build:.2f} s, {len(nd_sub):,} pairs); "
        f"FAISS MultiHash {fa_rate / 1e6:.3f} M/s ({fa_s:.2f} s + build {build:.2f} s, "
        f"{len(fq):,} rows); ratio {nd_sub_rate / fa_rate:.1f}x")
    say(f"pair sets agree: {agree} (FAISS rows repeat a pair once per duplicate query; "
        f"ndindex treats Q as a set)")
    del tables

    full_s, full = run_ndindex(queries, path, args.k, args.workers)
    rate = args.stored / full_s / args.workers
    say(f"full scan of F from the fingerprint file: {full_s:.1f} s, {len(full):,} pairs, "
        f"{args.stored / full_s / 1e6:.2f} M/s total, {rate / 1e6:.2f} M/s per core")
    say(f"ratio full-scan rate per core / FAISS one-core rate: {rate / fa_rate:.1f}x "
        f"(paper's mappers: about 0.4M/s each)")
    say(f"scaling: 1M queries x 8B stored at this rate: {8e9 / rate / 3600:.1f} core-hours")
    say()
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")
    if not args.dir:
        os.unlink(path)
        os.rmdir(workdir)


if __name__ == "__main__":
    main()
