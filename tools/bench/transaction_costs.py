"""What a transaction() block costs around the calls it holds.

Run:  python tools/bench/transaction_costs.py [--dir DIR]

On a small new index (durability "normal", background compaction off),
the cost of an empty block, of a block of one add() with 0, 10,000 and
100,000 operations pending in the journal before it (a block copies the
pending set, and journals its net effect, at its end), and of a nested
block (a savepoint: a copy of the pending set).  Best of five passes.
Then, for two seconds of one-item blocks back to back, how late another
thread of the program wakes from 50 ms waits (CPython hands the GIL over
every 5 ms; a loop that lets go of it and takes it back at once keeps
other threads waiting far longer: see arrays.copy_holding_gil), and the
largest pending set seen (the checkpoints keep it small).
A diagnostic: no pass/fail, no peer; compare two commits by running it
from each, alternating, on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

PASSES = 5


def best_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(PASSES):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


def other_thread_delays(ix, rng) -> tuple:
    """(lateness of another thread's 50 ms waits, blocks run, largest
    pending set) over two seconds of one-item transactions."""
    import queue
    import threading
    late, stop = [], threading.Event()

    def waiter():
        q = queue.SimpleQueue()
        while not stop.is_set():
            t = time.monotonic()
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass
            late.append(time.monotonic() - t - 0.05)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    import numpy as np
    fps = rng.integers(0, 2**64, 1_000_000, dtype=np.uint64).tolist()
    blocks, largest, end = 0, 0, time.monotonic() + 2.0
    while time.monotonic() < end:
        with ix.transaction():
            ix.add(fps[blocks])
        blocks += 1
        if blocks % 100 == 0:
            largest = max(largest, len(ix._writer.pending))
    stop.set()
    thread.join()
    return late, blocks, largest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where the index goes (default: a temp dir)")
    args = ap.parse_args(argv)
    import numpy as np

    from ndindex import journal
    from ndindex.index import Index
    work = tempfile.mkdtemp(dir=args.dir)
    every = journal.CHECKPOINT_SECONDS
    try:
        rng = np.random.default_rng(1)
        # No checkpoint by the thread while the pending sets are measured.
        journal.CHECKPOINT_SECONDS = 3600.0
        with Index.create(os.path.join(work, "t.ndx"), k=3, durability="normal",
                          background_compaction=False) as ix:
            def empty():
                with ix.transaction():
                    pass

            def nested():
                with ix.transaction():
                    with ix.transaction():
                        pass

            print(f"empty block: {best_us(empty, 2000):.1f} us")
            for pending in (0, 10_000, 100_000):
                ix.sync()
                ix.add(rng.integers(0, 2**64, pending, dtype=np.uint64))   # pending, journaled
                fps = iter(rng.integers(0, 2**64, 1000, dtype=np.uint64).tolist())

                def one_add():
                    with ix.transaction():
                        ix.add(next(fps))

                print(f"block of one add(), {pending:,} operations pending before: "
                      f"{best_us(one_add, 100):.1f} us; nested empty blocks: "
                      f"{best_us(nested, 100):.1f} us")
        journal.CHECKPOINT_SECONDS = every
        with Index.create(os.path.join(work, "u.ndx"), k=3, durability="normal",
                          background_compaction=False) as ix:
            late, blocks, largest = other_thread_delays(ix, rng)
            late.sort()
            print(f"{blocks:,} one-item blocks in 2 s; another thread's 50 ms waits ended "
                  f"late by {late[len(late) // 2] * 1e3:.1f} ms (median), "
                  f"{late[-1] * 1e3:.1f} ms (max) over {len(late)} waits; "
                  f"the largest pending set {largest:,}")
    finally:
        journal.CHECKPOINT_SECONDS = every
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
