"""An index of documents under churn: its file size, and what a fresh reader pays.

Run:  python tools/bench/bench_documents_churn.py [--docs 20000] [--rounds 40] [--replace 0.1]
      [--dir DIR] [--out FILE]

DOCS documents of 80 words (drawn from 5,000, a fixed seed) are added in one
``add_documents`` call and compacted; then each round replaces a REPLACE
fraction of them (new texts under the same keys, one call each: one
commit, one log record), background compaction on.  Every ROUNDS / 4
rounds, after a second's pause for the compactor, it prints the file's
size and its free bytes (``stats()``), and a fresh process opens the index
read-only while the writer holds it and times its first query and its
first ``similar()`` (what the log and the runs cost a new reader).  The
peer: the same content written afresh, ``vacuum_into`` a copy at the end
(its size is what the churned file would be with no free space).  At the
end, which commits grew the file over the rounds: the writer's (each
call's log record) and the compactor's flushes and merges (what they put,
and their largest values: a value takes contiguous overflow pages).

A diagnostic: no pass/fail (the issue's size target is for fingerprint
churn, bench_stream.py's); run it on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

READER = """
import sys, time
from ndindex.index import Index
t0 = time.perf_counter(); ix = Index.open(sys.argv[1], readonly=True)
t1 = time.perf_counter(); ix.query(5); t2 = time.perf_counter()
ix.similar("w1 w2 w3 w4 w5 w6 w7 w8 w9 w10"); t3 = time.perf_counter()
print(f"{(t2 - t1) * 1e3:.1f} {(t3 - t2) * 1e3:.1f}")
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--replace", type=float, default=0.1, help="fraction replaced per round")
    ap.add_argument("--dir", help="where the files go (default: a temporary directory)")
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args(argv)
    from ndindex import compaction
    from ndindex.fingerprint import Fingerprinter
    from ndindex.index import Index
    work = tempfile.mkdtemp(dir=args.dir)
    path, copy = os.path.join(work, "docs.ndx"), os.path.join(work, "copy.ndx")
    rng = random.Random(7)
    words = [f"w{i}" for i in range(5000)]
    lines = [f"# python tools/bench/bench_documents_churn.py --docs {args.docs} "
             f"--rounds {args.rounds} --replace {args.replace}"]

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    def text() -> str:
        return " ".join(rng.choice(words) for _ in range(80))

    def reader() -> str:
        done = subprocess.run([sys.executable, "-c", READER, path], capture_output=True,
                              text=True, check=True)
        first, similar = done.stdout.split()
        return f"a fresh reader's first query {first} ms, first similar() {similar} ms"
    keys = [f"doc{i}" for i in range(args.docs)]
    per_round = max(1, int(args.docs * args.replace))
    # Which commits grow the file: kind -> [commits, bytes grown, bytes put, largest value].
    grew = {kind: [0, 0, 0, 0] for kind in ("add_documents", "flush", "merge")}
    real_commit = compaction.Compactor._commit

    def commit(self, snap, puts, deletes, manifest, log_done=None, *more, **named):
        before = os.path.getsize(path)
        real_commit(self, snap, puts, deletes, manifest, log_done, *more, **named)
        g = grew["flush" if log_done is not None else "merge"]
        g[0] += 1
        g[1] += max(0, os.path.getsize(path) - before)
        g[2] += sum(len(v) for _, v in puts)
        g[3] = max([g[3]] + [len(v) for _, v in puts])
    try:
        with Index.create(path, k=3, fingerprinter=Fingerprinter()) as ix:
            t = time.perf_counter()
            ix.add_documents([text() for _ in keys], keys=keys)
            ix.compact()
            say(f"{args.docs:,} documents added and compacted in {time.perf_counter() - t:.1f} s: "
                f"file {os.path.getsize(path) / 1e6:.1f} MB; {reader()}")
            slowest = 0.0
            compaction.Compactor._commit = commit
            for r in range(1, args.rounds + 1):
                pick = rng.sample(keys, per_round)
                t, before = time.perf_counter(), os.path.getsize(path)
                ix.add_documents([text() for _ in pick], keys=pick)
                slowest = max(slowest, time.perf_counter() - t)
                grew["add_documents"][0] += 1
                grew["add_documents"][1] += max(0, os.path.getsize(path) - before)
                if r % max(1, args.rounds // 4) == 0:
                    time.sleep(1.0)
                    st = ix.stats()
                    say(f"round {r:3d}: file {os.path.getsize(path) / 1e6:.1f} MB, free "
                        f"{st['free_bytes'] / 1e6:.1f} MB, log {st['log_entries']:,} operations "
                        f"in {st['log_records']} records; {reader()}")
            ix.vacuum_into(copy)
            size = os.path.getsize(path)
            compaction.Compactor._commit = real_commit
        say(f"slowest add_documents of {per_round:,}: {slowest * 1e3:.0f} ms")
        say("what grew the file over the rounds:")
        for kind, (n, grown, put, largest) in grew.items():
            say(f"  {kind:<14}{n:5,} commits grew it {grown / 1e6:6.1f} MB" +
                (f", put {put / 1e6:7.1f} MB, largest value {largest / 1e3:,.0f} KB"
                 if kind != "add_documents" else ""))
        say(f"file {size / 1e6:.1f} MB against {os.path.getsize(copy) / 1e6:.1f} MB for the "
            f"same content without free space (vacuum_into): {size / os.path.getsize(copy):.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
