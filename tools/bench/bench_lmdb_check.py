"""Benchmark the LMDB structure checker against verify() and LMDB's own walk, in the same run.

Run:  python tools/bench/bench_lmdb_check.py [--n 10000000] [--keyed-n 1000000] [--repeat 5]

Indexes, built once per --dir from fixed seeds:

- n fingerprints without keys: one add() (compacting in its transaction),
  ten adds of 10,000 through the log and a compact(); mostly overflow runs
  of blocks, and after the compaction about as many free pages.  Measured
  as built and as a compacting LMDB copy (no free pages: the ~220 MB, ~55k
  page file of a fresh 10M index).
- keyed-n fingerprints each with a document key: the docs and keys trees
  make it tree-heavy (every leaf page is read).

Per file, best of --repeat with the file in the page cache:
``_core.lmdb_check`` (the snapshot LMDB opens), with ``both=True``; the
peers are ``Index.verify()`` (the full check of ndindex's own records that
the checker will run inside) and an LMDB walk (a py-lmdb cursor over every
entry of every database, reading each value: what LMDB does to touch every
page).  Ratios, not absolute times, are the result: the machine is shared.
"""

from __future__ import annotations

import argparse
import datetime
import mmap
import os
import platform
import subprocess
import sys
import tempfile
import time

import lmdb
import numpy as np

import ndindex
from ndindex import _core


def build(path: str, n: int, keyed: bool) -> None:
    rng = np.random.default_rng(7)
    fps = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    with ndindex.Index.create(path, k=3, expected_n=n) as ix:
        if keyed:
            for a in range(0, n, 100_000):
                part = fps[a:a + 100_000]
                ix.add(part, keys=[f"https://example.org/{a + i}" for i in range(len(part))])
        else:
            ix.add(fps)
        for _ in range(10):
            ix.add(rng.integers(0, 2**64, size=10_000, dtype=np.uint64))
        ix.compact()


def compact_copy(src: str, dst: str) -> None:
    env = lmdb.open(src, subdir=False, max_dbs=16, readonly=True, lock=False)
    try:
        env.copy(dst, compact=True)
    finally:
        env.close()


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def lmdb_walk(path: str) -> int:
    """Touch every entry of every database through LMDB; return the bytes read."""
    env = lmdb.open(path, subdir=False, max_dbs=16, readonly=True, lock=False)
    total = 0
    try:
        with env.begin(buffers=True) as txn:
            names = [bytes(k) for k, _ in txn.cursor()]
            for name in names:
                db = env.open_db(name, txn=txn, create=False)
                for k, v in txn.cursor(db=db):
                    total += len(k) + len(v)
    finally:
        env.close()
    return total


def measure(path: str, repeat: int) -> dict:
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        m[:: 4096]  # fault every page in once
        report = _core.lmdb_check(m)
        check = best(lambda: _core.lmdb_check(m), repeat)
        check_both = best(lambda: _core.lmdb_check(m, both=True), repeat)
    tree_pages = sum(t["branch_pages"] + t["leaf_pages"] + t["dup_pages"]
                     for t in report["trees"].values())
    overflow = sum(t["overflow_pages"] for t in report["trees"].values())
    with ndindex.open(path, readonly=True) as ix:
        verify = best(ix.verify, max(1, repeat // 2))
    walk = best(lambda: lmdb_walk(path), max(1, repeat // 2))
    return dict(bytes=os.path.getsize(path), pages=report["file_pages"], tree_pages=tree_pages,
                overflow_pages=overflow, free_pages=report["free_pages"], check=check,
                check_both=check_both, verify=verify, walk=walk)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--keyed-n", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "ndindex-bench-lmdb-check"))
    args = ap.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    files = []
    for n, keyed in ((args.n, False), (args.keyed_n, True)):
        path = os.path.join(args.dir, f"{n}{'-keyed' if keyed else ''}.ndx")
        if not os.path.exists(path):
            build(path, n, keyed)
        files.append((f"{n:,} fps{' + keys' if keyed else ''}", path))
        if not keyed:
            copy = path + ".compact"
            if not os.path.exists(copy):
                compact_copy(path, copy)
            files.append((f"{n:,} fps, compact copy", copy))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"# load before: {os.getloadavg()}")
    print(f"# bench_lmdb_check  {datetime.datetime.now():%Y-%m-%d %H:%M}  commit {commit}  "
          f"{platform.machine()}  {os.cpu_count()} cores  best of {args.repeat}, warm page cache")
    print(f"{'file':<28}{'MB':>8}{'pages':>9}{'tree pg':>9}{'free pg':>9}{'check ms':>10}"
          f"{'both ms':>9}{'verify s':>10}{'walk s':>9}{'check/verify':>14}{'check/walk':>12}")
    for label, path in files:
        r = measure(path, args.repeat)
        print(f"{label:<28}{r['bytes'] / 1e6:>8.0f}{r['pages']:>9,}{r['tree_pages']:>9,}"
              f"{r['free_pages']:>9,}{r['check'] * 1e3:>10.2f}{r['check_both'] * 1e3:>9.2f}"
              f"{r['verify']:>10.2f}{r['walk']:>9.2f}{r['check'] / r['verify']:>14.5f}"
              f"{r['check'] / r['walk']:>12.5f}", flush=True)
    print(f"# load after: {os.getloadavg()}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
