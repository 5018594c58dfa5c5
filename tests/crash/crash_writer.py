"""A writer process for the crash tests: add batches and compact until killed.

Usage: python crash_writer.py PATH FIRST_BATCH [LOG_LIMIT]

Opens (or creates) the index at PATH and adds batch FIRST_BATCH, then the
next, forever.  After each add() returns it prints ``ok <batch>`` and
flushes, so every line the parent reads names a batch that add() reported
durable.  Every seventh batch it prints ``compacting <batch>`` and runs
compact() (full on every fourteenth); the small log limit makes add() run
the incremental compaction inside its own transaction as well.

The batches are a pure function of their number (:func:`batch`), so the
test recomputes them instead of reading them back from this process.
"""

from __future__ import annotations

import os
import sys

import numpy as np

#: Batches at most this large; sizes vary so compactions land at varied points.
MAX_BATCH = 400


def batch(b: int) -> tuple[np.ndarray, list | None]:
    """Return batch b: distinct fingerprints, and a key per fingerprint for even b."""
    rng = np.random.default_rng([7, b])
    fps = np.unique(rng.integers(0, 2**64, int(rng.integers(1, MAX_BATCH)), dtype=np.uint64))
    keys = [f"b{b}/{i}" if i % 3 else f"b{b}/{i}".encode() for i in range(len(fps))] \
        if b % 2 == 0 else None
    return fps, keys


def main(argv: list[str]) -> None:
    from ndindex.index import Index

    path, first = argv[0], int(argv[1])
    log_limit = int(argv[2]) if len(argv) > 2 else 2000
    if os.path.exists(path):
        ix = Index.open(path, log_limit=log_limit)
    else:
        ix = Index.create(path, k=3, expected_n=50_000, log_limit=log_limit)
    print("ready", flush=True)
    for b in range(first, first + 1_000_000):
        fps, keys = batch(b)
        ix.add(fps, keys)
        print(f"ok {b}", flush=True)
        if b % 7 == 0:
            print(f"compacting {b}", flush=True)
            ix.compact(full=b % 14 == 0)
            print(f"compacted {b}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
