"""Soak: one index open through many churn cycles; print what the process holds as it goes.

Run:  python tools/soak.py [--cycles 300] [--n 200000] [--dir DIR]

A writer keeps one index open (with a fingerprinter, log_limit 5,000, so
background compaction flushes and merges all along) while a second thread
asks single and batch queries without pause.  Each cycle removes 1% of the
fingerprints and adds as many new ones, adds three documents under keys
that come back every 50 cycles (so documents are replaced), and commits
twenty check_and_add calls in one transaction.  Every 50 cycles it prints
the process's anonymous memory, open descriptors, threads, memory
mappings, the file's size and the background lister's remembered run ids:
on an index that lives for months none of them may grow with the cycles.
At the end: the file beside a compacted copy of the same content.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading

import numpy as np


def held(path: str, ix) -> str:
    anon = next(line.split()[1] for line in open("/proc/self/status")
                if line.startswith("RssAnon"))
    with open("/proc/self/maps") as fh:
        maps = sum(1 for _ in fh)
    return (f"anon {int(anon) // 1024} MB, fds {len(os.listdir('/proc/self/fd'))}, "
            f"threads {threading.active_count()}, mappings {maps}, "
            f"file {os.path.getsize(path) / 1e6:.1f} MB, "
            f"lister remembers {len(ix._directories._asked)} runs")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dir", help="where the index goes (default: a temp dir)")
    args = ap.parse_args(argv)
    from ndindex import Index
    from ndindex.fingerprint import Fingerprinter
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = os.path.join(d, "soak.ndx")
        rng = np.random.default_rng(1)
        live = rng.integers(0, 2**64, args.n, dtype=np.uint64)
        step = max(1, args.n // 100)
        with Index.create(path, k=3, expected_n=args.n, fingerprinter=Fingerprinter(),
                          log_limit=5000) as ix:
            ix.add(live)
            stop = threading.Event()

            def ask():
                r = np.random.default_rng(2)
                while not stop.is_set():
                    ix.query_many(r.integers(0, 2**64, 100, dtype=np.uint64))
                    ix.query(int(r.integers(0, 2**63)))
            asker = threading.Thread(target=ask, name="soak-queries")
            asker.start()
            try:
                for cycle in range(args.cycles + 1):
                    ix.remove(fingerprints=live[:step])
                    live = np.concatenate([live[step:],
                                           rng.integers(0, 2**64, step, dtype=np.uint64)])
                    ix.add(live[-step:])
                    ix.add_documents([f"document {cycle} {j} with a few words" for j in range(3)],
                                     [f"d{cycle % 50}-{j}" for j in range(3)])
                    with ix.transaction():
                        for fp in rng.integers(0, 2**64, 20, dtype=np.uint64).tolist():
                            ix.check_and_add(fp)
                    if cycle % 50 == 0:
                        print(f"cycle {cycle:4d}: {held(path, ix)}", flush=True)
            finally:
                stop.set()
                asker.join()
            ix.verify()
            copy = os.path.join(d, "copy.ndx")
            print(f"file {os.path.getsize(path) / 1e6:.1f} MB; a compacted copy of the same "
                  f"content (vacuum_into): {ix.vacuum_into(copy) / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
