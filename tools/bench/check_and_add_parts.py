"""Where a check_and_add item's time goes, on a copy of an index file.

Run:  python tools/bench/check_and_add_parts.py INDEX [--transactions 60] [--dir DIR]

On a copy of INDEX (background compaction off), each transaction of
check_and_add_parts asks three kinds of call on new random fingerprints,
300 each, in turns whose order alternates between transactions:

- the kernel call alone: ``_core.query`` with the transaction's pending
  view, taken once at its start;
- a minimal Python path: the writer's lock, the current snapshot, the
  pending view as the kernel takes it, and ``PendingOps.add_one``;
- ``Index.check_and_add``.

Then, per commit of 1,000 check_and_add calls: the commit itself, and the
first query after it, which extends the snapshot's log, log tables and
kernel for the new record (the next check_and_add pays the same).  The minimal path uses the writer's internals: it is
what check_and_add would cost with nothing left to cut around the kernel.
A diagnostic: no pass/fail, no peer; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

CALLS = 300
COMMITS = 40


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("index", help="an index file (it is copied; the copy is deleted)")
    ap.add_argument("--transactions", type=int, default=60)
    ap.add_argument("--dir", default="/work/benchdata", help="where the copy goes")
    args = ap.parse_args(argv)
    import numpy as np

    from ndindex import _core
    from ndindex.index import Index
    copy = os.path.join(args.dir, "check_and_add_parts.ndx")
    shutil.copy(args.index, copy)
    try:
        with Index.open(copy, background_compaction=False) as ix:
            rng = np.random.default_rng(12345)
            for q in rng.integers(0, 2**64, 3000, dtype=np.uint64).tolist():
                ix.query(q)   # warm: runs listed, small ones held
            k, writer = ix.k, ix._writer

            def minimal(fp: int):
                with writer.lock:
                    snap, pend = ix._snapshot(), writer.pending
                    m, capsule, _ = pend._index
                    found = _core.query(snap.kernel, fp, k, pend._buf[m:pend._n],
                                        pend._removes_sorted, capsule)
                    if not found:
                        pend.add_one(fp)

            spent = dict(kernel=0.0, minimal=0.0, check_and_add=0.0)
            for r in range(args.transactions):
                fps = rng.integers(0, 2**64, 1 + 3 * CALLS, dtype=np.uint64).tolist()
                with ix.transaction():
                    ix.check_and_add(fps[0])   # the transaction's pending set exists
                    snap, pend = ix._view()
                    view = pend.query_view(ix.plan)
                    calls = dict(kernel=lambda fp: _core.query(snap.kernel, fp, k, *view),
                                 minimal=minimal, check_and_add=ix.check_and_add)
                    names = list(calls) if r % 2 else list(reversed(calls))
                    for i, name in enumerate(names):
                        f, part = calls[name], fps[1 + i * CALLS:1 + (i + 1) * CALLS]
                        t = time.perf_counter()
                        for fp in part:
                            f(fp)
                        spent[name] += time.perf_counter() - t
            n = args.transactions * CALLS
            print("per item, in transactions: " + ", ".join(
                f"{name} {s / n * 1e6:.2f} us" for name, s in spent.items()))
            commit = first = 0.0
            for _ in range(COMMITS):
                fps = rng.integers(0, 2**64, 1001, dtype=np.uint64).tolist()
                cm = ix.transaction()
                cm.__enter__()
                for fp in fps[:1000]:
                    ix.check_and_add(fp)
                t = time.perf_counter()
                cm.__exit__(None, None, None)
                t1 = time.perf_counter()
                ix.query(fps[1000])   # extends the snapshot's log for the commit
                commit += t1 - t
                first += time.perf_counter() - t1
            print(f"per commit of 1,000: the commit {commit / COMMITS * 1e3:.2f} ms, "
                  f"the first query after it {first / COMMITS * 1e3:.2f} ms")
    finally:
        for p in (copy, copy + "-lock"):
            if os.path.exists(p):
                os.unlink(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
