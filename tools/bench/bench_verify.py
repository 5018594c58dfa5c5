"""Benchmark verify() and open() of format 2 against format 1 (issue 10: the checker's cost).

Run:  python tools/bench/bench_verify.py [--sizes 1000000 10000000]
                                         [--v1-python /tmp/exp/venv-v1/bin/python] [--repeat 3]

The largest N: an index of N random fingerprints (seed 1, k = 3, no keys,
compacted into one run per table) is built by this library (format 2)
and, with --v1-python, by the format-1 library that interpreter imports
(ndindex at 9521845) from the same fingerprints.  Each file is read once
to warm the page cache; then verify() of each is timed in a fresh process,
alternating between the two, --repeat times.  The result is the median of
each and the ratio format 2 / format 1 (issue 10 asks for at most 2).

Every N of --sizes: Index.open(path, readonly=True) then close(), timed
100 times in one process after a warm-up (median), and open plus a first
query (which reads the state, manifest and log: the snapshot); the ratio
of the largest N to the smallest shows whether open() is O(1).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

K = 3
SEED = 1
BATCH = 1_000_000

#: Run by either interpreter: build an index, or time verify() / open().
CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from ndindex.index import Index
    mode, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "build":
        fps = np.random.default_rng(%(seed)d).integers(0, 2**64, n, dtype=np.uint64)
        with Index.create(path, k=%(k)d, expected_n=n, log_limit=1 << 40) as ix:
            for a in range(0, n, %(batch)d):
                ix.add(fps[a:a + %(batch)d])
            ix.compact(full=True)
    elif mode == "lib":
        import ndindex
        print(ndindex.__file__)
    elif mode == "warm":
        with open(path, "rb") as fh:
            while fh.read(1 << 24):
                pass
    elif mode == "verify":
        with Index.open(path, readonly=True) as ix:
            t0 = time.perf_counter()
            report = ix.verify()
            print(time.perf_counter() - t0)
    elif mode == "open":
        times, first = [], []
        Index.open(path, readonly=True).close()
        for _ in range(100):
            t0 = time.perf_counter()
            Index.open(path, readonly=True).close()
            times.append(time.perf_counter() - t0)
        for q in range(10):
            t0 = time.perf_counter()
            with Index.open(path, readonly=True) as ix:
                ix.query(q)
            first.append(time.perf_counter() - t0)
        times.sort()
        first.sort()
        print(times[len(times) // 2], first[len(first) // 2])
""" % dict(seed=SEED, k=K, batch=BATCH))


def run(python: str, *args) -> str:
    # `python -c` puts the working directory first on sys.path: run where the
    # index file is, so that a checkout's ndindex/ never shadows the library
    # the interpreter has installed (the format-1 peer would import format 2).
    out = subprocess.run([python, "-c", CHILD, *map(str, args)], capture_output=True, text=True,
                         timeout=24 * 3600, cwd=os.path.dirname(os.path.abspath(args[1])))
    if out.returncode != 0:
        raise SystemExit(f"bench_verify: {python} {args[0]} failed:\n{out.stderr[-2000:]}")
    return out.stdout


def build(python: str, path: str, n: int) -> float:
    t0 = time.perf_counter()
    run(python, "build", path, n)
    return time.perf_counter() - t0


def header(argv) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"# python tools/bench/bench_verify.py {' '.join(argv)}\n"
            f"# bench_verify  {time.strftime('%Y-%m-%d')}  {platform.machine()}  python "
            f"{platform.python_version()}  commit {commit}  {os.cpu_count()} cores  load {load}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--v1-python", help="an interpreter whose ndindex is the format-1 library")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", help="where the index files go (default: the temp dir)")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    work = tempfile.mkdtemp(prefix="bench-verify-", dir=args.dir)
    try:
        sizes = sorted(args.sizes)
        v2 = {n: os.path.join(work, f"v2-{n}.ndx") for n in sizes}
        lines = [header(argv)]
        lines.append(f"# format 2 library: {run(sys.executable, 'lib', v2[sizes[0]], 0).strip()}")
        for n in sizes:
            seconds = build(sys.executable, v2[n], n)
            lines.append(f"# built format 2, N = {n:,}: {seconds:.1f} s, "
                         f"{os.path.getsize(v2[n]) / 1e6:.1f} MB")
        big = sizes[-1]
        v1 = None
        if args.v1_python:
            v1 = os.path.join(work, f"v1-{big}.ndx")
            lines.append(f"# format 1 library: {run(args.v1_python, 'lib', v1, 0).strip()}")
            seconds = build(args.v1_python, v1, big)
            lines.append(f"# built format 1, N = {big:,}: {seconds:.1f} s, "
                         f"{os.path.getsize(v1) / 1e6:.1f} MB")
        times = {"format 2": []}
        peers = [("format 2", sys.executable, v2[big])]
        if v1:
            times["format 1"] = []
            peers.append(("format 1", args.v1_python, v1))
        for _, python, path in peers:
            run(python, "warm", path, big)
        for _ in range(args.repeat):
            for name, python, path in peers:
                times[name].append(float(run(python, "verify", path, big)))
        lines.append(f"\nverify() at N = {big:,} (median of {args.repeat}, each in a fresh "
                     "process, file pages cached)")
        lines.append(f"{'format':>10} {'median s':>10} {'min s':>8} {'max s':>8}")
        for name, ts in times.items():
            lines.append(f"{name:>10} {statistics.median(ts):>10.3f} {min(ts):>8.3f} "
                         f"{max(ts):>8.3f}")
        if v1:
            ratio = statistics.median(times["format 2"]) / statistics.median(times["format 1"])
            lines.append(f"ratio format 2 / format 1: {ratio:.2f} (issue 10 asks for <= 2)")
        lines.append("\nIndex.open(readonly=True) + close(), median of 100; with a first query, "
                     "median of 10")
        lines.append(f"{'N':>12} {'open ms':>9} {'open+query ms':>14} {'vs smallest':>12}")
        base = None
        for n in sizes:
            run(sys.executable, "warm", v2[n], n)
            open_s, first_s = map(float, run(sys.executable, "open", v2[n], n).split())
            base = base or open_s
            lines.append(f"{n:>12,} {open_s * 1e3:>9.3f} {first_s * 1e3:>14.3f} "
                         f"{open_s / base:>12.2f}")
        print("\n".join(lines))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
