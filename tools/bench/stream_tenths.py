"""Where a stream's time goes, tenth by tenth: the writer's commits and waits, the compactor's work.

Run:  python tools/bench/stream_tenths.py [--n 30000000] [--dir DIR] [--set NAME=VALUE ...]

bench_stream.py says how fast a stream of 10,000-fingerprint add() calls
runs in its first and last tenth; this says why.  It runs the same stream
(the same fingerprints, durability "full", background compaction) with
the index's writes timed, and prints for each tenth of the stream:

- its rate (fingerprints per second) and wall time;
- the compactor: time in its steps, and within them in store writes --
  the puts of a step's records ("body") and LMDB's commit ("commit": its
  page writes and the data fdatasync NOMETASYNC does inside the write
  lock) -- and the bytes it put;
- the writer: time waiting for LMDB's write lock (behind a compaction
  commit), in its puts, its commit and its sync; the rest of the tenth is
  the throttle (the compactor behind) and Python.

At the end, the compactor's bytes put per fingerprint added and per
table, by source: flushes (each rewrites its table's level-1 run), and
merges into each level (tombstone and record runs, small, are left out).

--set NAME=VALUE sets a constant of ndindex.levels or ndindex.compaction
for the run (e.g. MAIN_FRACTION=0.5), to try a policy without editing it.
A diagnostic, not a benchmark: no pass/fail, no peer; run it on an idle
machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))

import bench_stream as bs  # noqa: E402


def instrument(acc: dict, store) -> None:
    """Time store's writes by thread and phase, and Compactor.step, into acc.

    Store.write itself runs unchanged: its write lock is wrapped to time
    the wait for it and to note when it is let go, and the body it is given
    to note when the puts end; the commit lies between the two, the sync
    after."""
    from ndindex import compaction

    def add(key, v):
        acc[key] = acc.get(key, 0) + v

    local = threading.local()  # the outermost acquire of each thread (an RLock)

    class TimedLock:
        def __init__(self, lock):
            self._lock = lock

        def __enter__(self):
            t = time.perf_counter()
            self._lock.acquire()
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            if not depth:
                local.acquired = time.perf_counter()
                local.waited = local.acquired - t

        def __exit__(self, *exc):
            local.depth -= 1
            if not local.depth:
                local.released = time.perf_counter()
            self._lock.release()

    store._write_lock = TimedLock(store._write_lock)
    write = store.write

    def timed_write(body, sync=True):
        who = "w" if threading.current_thread() is threading.main_thread() else "c"
        put = {}

        def timed_body(wt):
            try:
                return body(wt)
            finally:
                put["end"], put["bytes"] = time.perf_counter(), wt.bytes_put

        result = write(timed_body, sync=sync)
        end = time.perf_counter()
        for name, v in (("lockwait", local.waited), ("body", put["end"] - local.acquired),
                        ("commit", local.released - put["end"]), ("sync", end - local.released),
                        ("bytes", put["bytes"])):
            add(f"{who}_{name}", v)
        return result

    store.write = timed_write
    step = compaction.Compactor.step

    def timed_step(self, *a, **kw):
        t = time.perf_counter()
        try:
            return step(self, *a, **kw)
        finally:
            add("c_step", time.perf_counter() - t)

    compaction.Compactor.step = timed_step

    # Bytes put by source: flush commits (log_done given), and merge steps
    # of fingerprint runs by the level they write into.
    from ndindex import levels
    commit, merge_step = compaction.Compactor._commit, compaction.Compactor._fp_merge_step

    def counted_commit(self, snap, puts, *a, log_done=None, **kw):
        if log_done is not None:
            add("by flushes", sum(len(v) for _, v in puts))
        return commit(self, snap, puts, *a, log_done=log_done, **kw)

    def counted_merge_step(self, snap, man, space, output, inputs):
        out = merge_step(self, snap, man, space, output, inputs)
        level = levels.level_of(output)
        name = "the main level" if level == levels.MAIN_LEVEL else f"level {level}"
        add(f"by merges into {name}", sum(len(v) for _, v in out[0]))
        return out

    compaction.Compactor._commit = counted_commit
    compaction.Compactor._fp_merge_step = counted_merge_step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30_000_000)
    ap.add_argument("--dir", default="/work/benchdata", help="where the index goes (deleted)")
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE")
    args = ap.parse_args(argv)
    from ndindex import compaction, levels
    from ndindex.index import Index
    for item in args.set:
        name, value = item.split("=")
        module = levels if hasattr(levels, name) else compaction
        setattr(module, name, type(getattr(module, name))(value))
    acc: dict = {}
    path = os.path.join(args.dir, f"tenths-{args.n}.ndx")
    bs.remove_index(path)
    fps = bs.stream_fingerprints(args.n)
    calls = args.n // bs.BATCH
    tenth = max(1, calls // 10)
    print("\n".join(bs.header("stream_tenths", argv if argv is not None else sys.argv[1:])))
    print(f"{'tenth':>5} {'M fp/s':>6} {'s':>5} | compactor: {'step':>5} {'body':>5} "
          f"{'commit':>6} {'MB put':>6} | writer: {'lock wait':>9} {'body':>5} {'commit':>6} "
          f"{'sync':>5}")
    ix = Index.create(path, k=bs.K, expected_n=args.n)
    instrument(acc, ix._store)
    try:
        last, t_last = {}, time.perf_counter()
        for i in range(calls):
            ix.add(fps[i * bs.BATCH:(i + 1) * bs.BATCH])
            if (i + 1) % tenth == 0:
                now = time.perf_counter()
                d = {k: acc.get(k, 0) - last.get(k, 0) for k in acc}
                print(f"{(i + 1) // tenth:>5} {tenth * bs.BATCH / (now - t_last) / 1e6:>6.2f} "
                      f"{now - t_last:>5.2f} |            {d.get('c_step', 0):>5.2f} "
                      f"{d.get('c_body', 0):>5.2f} {d.get('c_commit', 0):>6.2f} "
                      f"{d.get('c_bytes', 0) / 1e6:>6.0f} |         "
                      f"{d.get('w_lockwait', 0):>9.2f} {d.get('w_body', 0):>5.2f} "
                      f"{d.get('w_commit', 0):>6.2f} {d.get('w_sync', 0):>5.2f}", flush=True)
                last, t_last = dict(acc), now
        tables = len(ix.plan.tables)
        sources = sorted(k for k in acc if k.startswith("by "))
        total = sum(acc[k] for k in sources) or 1
        print("compactor's bytes put per fingerprint added, per table: " + "; ".join(
            f"{k} {acc[k] / args.n / tables:.1f} ({100 * acc[k] / total:.0f}%)" for k in sources))
    finally:
        ix.close()
        bs.remove_index(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
