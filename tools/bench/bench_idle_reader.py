"""Benchmark: the writer's file size under churn, beside an idle reader and a killed one.

Run:  python tools/bench/bench_idle_reader.py [--n 300000] [--cycles 12] [--gap 3.0]

An index of N random fingerprints is compacted; then a writer runs cycles
of removing 5% of the fingerprints, adding as many new ones and
compacting, GAP seconds apart.  In the second run a reader process opens
the index read-only, asks one query and waits, idle, for the whole churn
(a viewer beside a crawler); in the third, that reader is killed (SIGKILL)
right after its query, inside its read.  LMDB reuses no page a reader can
still reach, so an index that kept its snapshot while idle, or the slot a
dead reader left in the lock file, would make the writer's file grow with
every cycle; ndindex lets an idle snapshot go after about
reaper.IDLE_SNAPSHOT_SECONDS (--idle sets it in the reader) and the writer
clears dead readers' slots.  Prints the file size after each cycle of the
three runs and the ratios of the final sizes; the run without a reader is
the peer.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

READER = """
import sys
from ndindex import Index, reaper
reaper.IDLE_SNAPSHOT_SECONDS = float(sys.argv[2])
ix = Index.open(sys.argv[1], readonly=True)
ix.query(1)
print("ready", flush=True)
sys.stdin.read()
"""


def churn(path: str, n: int, cycles: int, gap: float, idle: float | None,
          kill: bool = False) -> list[int]:
    """File sizes (bytes) after each cycle; idle: run a reader with this idle time
    (kill: and kill it after its query)."""
    from ndindex import Index
    rng = np.random.default_rng(1)
    live = rng.integers(0, 2**64, n, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=n) as ix:
        ix.add(live)
        ix.compact()
    sizes = []
    step = n // 20
    reader = None
    try:
        with Index.open(path) as ix:
            ix.query(1)    # the writer is open before the reader comes (and dies)
            if idle is not None:
                # The reader imports the same ndindex as this process, wherever run from.
                import ndindex
                env = dict(os.environ,
                           PYTHONPATH=os.path.dirname(os.path.dirname(ndindex.__file__)))
                reader = subprocess.Popen([sys.executable, "-c", READER, path, str(idle)],
                                          env=env, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True)
                assert reader.stdout.readline().strip() == "ready"
                if kill:
                    reader.kill()
                    reader.wait()
                    reader = None
            for _ in range(cycles):
                ix.remove(fingerprints=live[:step])
                live = np.concatenate([live[step:], rng.integers(0, 2**64, step, dtype=np.uint64)])
                ix.add(live[-step:])
                ix.compact()
                sizes.append(os.path.getsize(path))
                time.sleep(gap)
    finally:
        if reader is not None:
            reader.communicate("")
    return sizes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--cycles", type=int, default=12)
    ap.add_argument("--gap", type=float, default=3.0, help="seconds between cycles")
    ap.add_argument("--idle", type=float, default=None,
                    help="the reader's IDLE_SNAPSHOT_SECONDS (default: the library's)")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args(argv)
    from ndindex import reaper
    idle = reaper.IDLE_SNAPSHOT_SECONDS if args.idle is None else args.idle
    with tempfile.TemporaryDirectory() as d:
        alone = churn(os.path.join(d, "alone.ndx"), args.n, args.cycles, args.gap, None)
        beside = churn(os.path.join(d, "beside.ndx"), args.n, args.cycles, args.gap, idle)
        killed = churn(os.path.join(d, "killed.ndx"), args.n, args.cycles, args.gap, 1e9,
                       kill=True)
    lines = [f"# python tools/bench/bench_idle_reader.py{' --out ' + args.out if args.out else ''}",
             f"# bench_idle_reader  {time.strftime('%Y-%m-%d %H:%M')}  n={args.n:,}  "
             f"cycles={args.cycles} of 5%  gap={args.gap} s  reader idle after {idle} s",
             "file MB by cycle, no reader:   " + " ".join(f"{s / 1e6:.1f}" for s in alone),
             "file MB by cycle, idle reader: " + " ".join(f"{s / 1e6:.1f}" for s in beside),
             "file MB by cycle, killed reader: " + " ".join(f"{s / 1e6:.1f}" for s in killed),
             f"final size, idle reader / no reader: {beside[-1] / alone[-1]:.2f}x",
             f"final size, killed reader / no reader: {killed[-1] / alone[-1]:.2f}x"]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
