"""Two checkouts of ndindex side by side: stream rate and query times, alternating.

Run:  python tools/bench/ab_versions.py OLD NEW [--n 10000000] [--rounds 2]
                                        [--index FILE [--items 100000]] [--no-stream]
                                        [--dir DIR]

OLD and NEW are source trees with a built extension, for example

    git worktree add /tmp/old 8bbf8c7
    cp ndindex/_core*.so /tmp/old/ndindex/   # if ndindex/_core did not change

Each round runs OLD, then NEW, each in a fresh process that imports that
tree: a stream of N random fingerprints in durable 10,000-fingerprint
add() calls, background compaction on (fingerprints per second); and with
--index, 20,000 random queries on that file after 3,000 to warm it (p50 of
query(), and query_many's rate over the same queries); and with --items,
check_and_add of that many new random fingerprints in transactions of
1,000 on a copy of that file, right after opening it with background
compaction on, as bench_stream.py asks them (items per second).
Alternating in the
same minutes is what makes the two comparable on a shared machine, where
a run's speed moves by a third from one hour to the next.  A diagnostic:
no pass/fail.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

QUERIES = 20_000
WARM_QUERIES = 3_000


def child(tree: str, what: str, n: int, path: str, src: str | None = None) -> None:
    """In a fresh process: import ndindex from tree and measure one thing."""
    sys.path.insert(0, tree)
    import numpy as np

    import ndindex
    from ndindex.index import Index
    if not os.path.abspath(ndindex.__file__).startswith(os.path.abspath(tree)):
        raise SystemExit(f"ndindex came from {ndindex.__file__}, not {tree}")
    if what == "stream":
        for p in (path, path + "-lock"):
            if os.path.exists(p):
                os.unlink(p)
        fps = np.random.default_rng(9).integers(0, 2**64, size=n, dtype=np.uint64)
        with Index.create(path, k=3, expected_n=n) as ix:
            t = time.perf_counter()
            for a in range(0, n, 10_000):
                ix.add(fps[a:a + 10_000])
            seconds = time.perf_counter() - t
        for p in (path, path + "-lock"):
            os.unlink(p)
        print(f"stream {n / seconds / 1e6:.2f}M fp/s ({seconds:.1f} s)")
        return
    if what == "items":
        # bench_stream's check_and_add figure: right after open, background
        # compaction on, new items (not bench_stream's own, which its
        # items phase left stored in stream-N.ndx).
        shutil.copyfile(src, path)
        items = np.random.default_rng(78).integers(0, 2**64, size=n, dtype=np.uint64).tolist()
        try:
            with Index.open(path) as ix:
                t = time.perf_counter()
                for a in range(0, n, 1000):
                    with ix.transaction():
                        for fp in items[a:a + 1000]:
                            ix.check_and_add(fp)
                seconds = time.perf_counter() - t
        finally:
            for p in (path, path + "-lock"):
                if os.path.exists(p):
                    os.unlink(p)
        print(f"check_and_add in transactions of 1,000: {n / seconds:,.0f} items/s")
        return
    rng = np.random.default_rng(77)
    with Index.open(path, readonly=True) as ix:
        for q in rng.integers(0, 2**64, WARM_QUERIES, dtype=np.uint64).tolist():
            ix.query(q)
        qs = rng.integers(0, 2**64, QUERIES, dtype=np.uint64)
        lat = []
        for q in qs.tolist():
            t = time.perf_counter_ns()
            ix.query(q)
            lat.append(time.perf_counter_ns() - t)
        t = time.perf_counter()
        ix.query_many(qs)
        rate = QUERIES / (time.perf_counter() - t)
    print(f"query p50 {np.median(lat) / 1000:.2f} us, query_many {rate:,.0f} q/s")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:   # one measurement, in the process main() starts
        tree, what, n, path, *src = argv[1:]
        child(tree, what, int(n), path, *src)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--n", type=int, default=10_000_000, help="fingerprints streamed")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--index", help="also time queries on this index file")
    ap.add_argument("--items", type=int, default=0,
                    help="with --index: also this many check_and_add calls in transactions "
                         "of 1,000, on a copy of it (100000 in bench_stream)")
    ap.add_argument("--no-stream", action="store_true", help="leave the stream out")
    ap.add_argument("--dir", default="/work/benchdata",
                    help="where the stream's index and the copy for --items go")
    args = ap.parse_args(argv)
    if args.items and not args.index:
        ap.error("--items needs --index")
    stream_path = os.path.join(args.dir, "ab_versions.ndx")
    jobs = [] if args.no_stream else [("stream", args.n, stream_path)]
    if args.index:
        jobs.append(("query", args.n, args.index))
    if args.items:
        jobs.append(("items", args.items, os.path.join(args.dir, "ab_versions_items.ndx"),
                     args.index))
    for r in range(1, args.rounds + 1):
        for label, tree in (("old", args.old), ("new", args.new)):
            for what, n, path, *src in jobs:
                out = subprocess.run([sys.executable, __file__, "--child", tree, what,
                                      str(n), path, *src], capture_output=True, text=True)
                if out.returncode:
                    sys.stderr.write(out.stderr)
                    return out.returncode
                print(f"round {r} {label:3s} {tree}: {out.stdout.strip()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
