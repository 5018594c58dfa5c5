"""Why a file grows under churn: the compaction commits that grew it, one by one.

Run:  python tools/bench/bench_churn_commits.py [--n 10000000] [--cycles 10] [--dir DIR] [--out FILE]

The churn of bench_stream.py without its queries and copies: N random
fingerprints streamed in by 10,000-fingerprint ``add()`` calls (background
compaction on), ``compact()``, 1,000 queries (so the index is warm, as
bench_stream's is), then CYCLES cycles of removing 5% of the fingerprints
and adding as many new ones, in calls of 10,000.  Before every compaction
commit of the churn it reads, inside the commit's write transaction,
the free list of the newest commit and the open readers, and after the
commit prints those that grew the file: what the commit put (values
large enough for overflow pages, the pages they take; tombstone chunks
apart from the tables'), the free pages LMDB could reuse (records of
commits before both the newest and the oldest open reader: LMDB keeps
the newest commit's frees for the meta page before it, and a reader's
for the reader), how many 16-page slots (a 64 KB chunk's overflow pages,
contiguous) those hold, the free pages the readers pinned, and the
readers.  The file
size after each cycle is held against the file right after the stream's
compaction (the peer: the same content before any churn).  Per cycle it
also sums the pages every compaction commit put, flushes (their tombstone
chunks apart) and merges, the fewest 16-page slots any commit found, and
the tombstones left at the cycle's end.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_stream as bs  # noqa: E402

from ndindex import compaction as cm  # noqa: E402
from ndindex.index import Index  # noqa: E402
from ndindex.records import CHUNK_PAGES, SPACE_TOMBSTONES  # noqa: E402
from ndindex.store import _core_idl as free_list_pages  # noqa: E402

OVERFLOW_MIN = 2048  # an LMDB value larger than this goes to overflow pages (4 KB pages)


def overflow_pages(value) -> int:
    """The pages an LMDB value larger than OVERFLOW_MIN takes (16-byte page header)."""
    return (len(value) + 16 + 4095) // 4096


def free_slots(ix) -> dict:
    """The free list of the newest commit as the next commit's allocations see
    it: free (reusable pages: records of commits before the newest and before
    the oldest open reader), slots (16-page runs among them), pinned (free
    pages a reader kept from it), readers (their txnids), newest.  Reads the
    map directly: it opens no reader of its own."""
    newest = ix._latest_txnid()
    readers = sorted(t for _, t in ix._store.readers())
    oldest = min(readers + [newest])
    view = ix._store._view_of(newest)
    pages, pinned = [], 0
    for key, val in view.scan("free", check_all=True):
        txnid = struct.unpack("<Q", bytes(key))[0]
        if txnid < oldest:
            pages.extend(free_list_pages(val))
        elif txnid < newest:
            pinned += len(free_list_pages(val))
    out = dict(free=len(pages), slots=0, pinned=pinned, readers=readers, newest=newest)
    if pages:
        pg = np.sort(np.array(pages, dtype=np.int64))
        breaks = np.flatnonzero(np.diff(pg) != 1)
        starts = np.concatenate([[0], breaks + 1])
        ends = np.concatenate([breaks + 1, [len(pg)]])
        out["slots"] = int(((ends - starts) // CHUNK_PAGES).sum())
    return out


def watch_commits(events: list, cycles: list, on: dict) -> None:
    """Wrap Compactor._commit: while on['churn'], add each commit to the last of
    cycles and record those that grow the file in events."""
    real = cm.Compactor._commit

    def commit(self, snap, puts, deletes, manifest, **kw):
        if not on["churn"]:
            return real(self, snap, puts, deletes, manifest, **kw)
        ix = self._ix
        big = [(k, v) for k, v in puts if len(v) > OVERFLOW_MIN]
        tomb = sum(1 for k, _ in big if k[0] == SPACE_TOMBSTONES)
        pages = sum(overflow_pages(v) for _, v in big)
        size = os.path.getsize(ix._store.path)
        # Seen from inside the commit's write, after the step let go of its
        # snapshot (Compactor._commit); only this thread's write is watched.
        seen, me, write = {}, threading.get_ident(), ix._store.write

        def watched(body, sync=True):
            def first_look(wt):
                if threading.get_ident() == me and not seen:
                    seen.update(free_slots(ix))
                return body(wt)
            return write(first_look, sync=sync)

        ix._store.write = watched
        try:
            out = real(self, snap, puts, deletes, manifest, **kw)
        finally:
            del ix._store.write  # the class's method again
        grew = os.path.getsize(ix._store.path) - size
        free, slots = seen["free"], seen["slots"]
        flush = kw.get("log_done") is not None
        cycle = cycles[-1]
        tomb_pages = sum(overflow_pages(v) for k, v in big if k[0] == SPACE_TOMBSTONES)
        cycle["flush" if flush else "merge"] += pages - tomb_pages
        cycle["tomb"] += tomb_pages
        cycle["slots"] = slots if cycle["slots"] is None else min(cycle["slots"], slots)
        if grew > 0:
            events.append(dict(grew=grew, chunks=len(big), tomb=tomb, pages=pages, free=free,
                               slots=slots, pinned=seen["pinned"], readers=seen["readers"],
                               newest=seen["newest"], flush=flush))
        return out

    cm.Compactor._commit = commit


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--dir", default="/work/benchdata")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"churn-commits-{args.n}.ndx")
    bs.remove_index(path)
    events, cycles, on = [], [], {"churn": False}
    watch_commits(events, cycles, on)
    lines = bs.header("bench_churn_commits", argv) + [""]

    fps = bs.stream_fingerprints(args.n)
    rng = np.random.default_rng(bs.SEED + 5)
    ix = Index.create(path, k=bs.K, expected_n=args.n)
    for i in range(0, args.n, bs.BATCH):
        ix.add(fps[i:i + bs.BATCH])
    ix.compact()
    for q in rng.integers(0, 2**64, size=1000, dtype=np.uint64).tolist():
        ix.query(q, keys=False)
    base = os.path.getsize(path)
    live = np.unique(fps)
    del fps
    lines.append(f"N = {args.n:,}: file after the stream and compact(): {base / 1e6:.0f} MB")
    sizes = []
    for c in range(args.cycles):
        cycles.append(dict(flush=0, tomb=0, merge=0, slots=None))
        on["churn"] = True  # (after the append: the compaction thread adds to cycles[-1])
        live = bs.churn_cycle(ix, live, rng, 0.05)[0]
        sizes.append(os.path.getsize(path))
        cycles[-1]["tombstones"] = sum(r.entries for r in ix._snapshot().tombstone_runs)
        bs.progress(f"cycle {c + 1}: file {sizes[-1] / 1e6:.0f} MB")
    ix.close()
    lines.append("file MB after each churn cycle: " + " ".join(f"{s / 1e6:.0f}" for s in sizes)
                 + f"  (x {sizes[-1] / base:.2f} of the file before churn)")
    lines.append("by cycle: MB file, pages put by flushes (their tombstone chunks apart) and by "
                 "merges, fewest 16-page slots a commit found, tombstones at the end")
    for c, (size, cy) in enumerate(zip(sizes, cycles), 1):
        lines.append(f"    {c:2}  {size / 1e6:5.0f}  flushes {cy['flush']:7,} (+{cy['tomb']:7,} "
                     f"tombstone)  merges {cy['merge']:7,}  slots "
                     f"{'-' if cy['slots'] is None else format(cy['slots'], ','):>5}  "
                     f"tombstones {cy['tombstones']:9,}")
    lines.append(f"compaction commits that grew the file: {len(events)}, "
                 f"{sum(e['grew'] for e in events) / 1e6:.1f} MB in all")
    lines.append("    grew MB  kind   chunks put (tombstone)  pages  reusable free pages  "
                 "16-page slots  pinned  readers (newest commit)")
    for e in events:
        lines.append(f"    {e['grew'] / 1e6:7.1f}  {'flush' if e['flush'] else 'merge':5}  "
                     f"{e['chunks']:10,} ({e['tomb']:5,})  {e['pages']:6,}  {e['free']:19,}  "
                     f"{e['slots']:13,}  {e['pinned']:6,}  {e['readers']} ({e['newest']})")
    lines.append(f"# load after {bs.load_line()}")
    print("\n".join(lines))
    bs.write_report(lines, args.out)
    bs.remove_index(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
