"""Lock-file sweep: damage LMDB's lock file while a process has the index open.

Run:  python tools/sweep_lock_file.py [--trials 100] [--seed 1] [--workdir DIR] [--expect-clean]

LMDB trusts ``INDEX-lock`` while any process has the index open (the first
opener writes it afresh).  Each trial builds a small index, starts a
holder process that opens it for writing and adds one fingerprint, and
changes one byte of the lock file (a flipped bit or a random byte) among
those LMDB reads that are not mutexes: the header's magic and format, the
newest transaction id and the count of reader slots
(``_core.lmdb_lock_layout()``), and the first eight reader slots (format-spec/lmdb.md
section 11).  Then:

- a new process opens the index read-only and queries, another opens it
  for writing and adds;
- the holder adds, queries and compacts, then closes;
- once no process has it open, the index opens, verifies and holds the
  holder's first addition.

A trial is bad if a process crashes or hangs, or the last step fails;
typed errors (CorruptionError or FormatError naming the lock file) are
good answers.  The mutexes are left out: damaged, the C library stops
the process or waits forever, which ndindex does not check (lmdb.md
section 11).  --expect-clean exits 1 unless every trial is fine.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import subprocess
import sys
import tempfile

HOLDER = """
import sys, ndindex
ix = ndindex.open(sys.argv[1])
ix.add([1 << 50]); ix.query(1)
print("holding", flush=True)
sys.stdin.readline()
out = []
for name, call in [("add", lambda: ix.add([3 << 50])), ("query", lambda: ix.query(1 << 50, k=0)),
                   ("compact", lambda: ix.compact())]:
    try:
        call(); out.append(name + ":ok")
    except Exception as exc:
        out.append(name + ":" + type(exc).__name__)
ix.close()
print(" ".join(out), flush=True)
"""

OPENER = """
import sys, ndindex
try:
    with ndindex.open(sys.argv[1], readonly=sys.argv[2] == "ro") as ix:
        if sys.argv[2] == "rw":
            ix.add([2 << 50])
        print("ok")
except Exception as exc:
    print(type(exc).__name__ + (":lock" if "-lock" in str(exc) else ":index"))
"""

TIMEOUT = 60


def regions():
    """(start, end) byte ranges of the lock file a trial may damage."""
    from ndindex import _core
    txnid_at, count_at, _ = _core.lmdb_lock_layout()
    return [(0, 8), (txnid_at, count_at + 4)] + [(128 + 64 * i, 128 + 64 * i + 24)
                                                 for i in range(8)]


def run_child(args, stdin=None):
    try:
        done = subprocess.run([sys.executable, "-c", *args], input=stdin, capture_output=True,
                              text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return "HANG"
    return f"CRASH({done.returncode})" if done.returncode else done.stdout.strip()


def trial(path: str, rng: random.Random) -> tuple[int, str, bool]:
    import numpy as np
    from ndindex.index import Index
    for name in (path, path + "-lock"):
        if os.path.exists(name):
            os.remove(name)
    with Index.create(path, k=3, expected_n=1000) as ix:
        ix.add(np.arange(1, 500, dtype=np.uint64))
        ix.compact()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert holder.stdout.readline().strip() == "holding"
    lo, hi = rng.choice(regions())
    at = rng.randrange(lo, hi)
    with open(path + "-lock", "r+b") as f:
        f.seek(at)
        old = f.read(1)[0]
        f.seek(at)
        f.write(bytes([old ^ (1 << rng.randrange(8)) if rng.random() < 0.5
                       else rng.randrange(256)]))
    parts = [f"ro:{run_child([OPENER, path, 'ro'])}", f"rw:{run_child([OPENER, path, 'rw'])}"]
    try:
        out, _ = holder.communicate("go\n", timeout=TIMEOUT)
        parts.append("holder:" + (f"CRASH({holder.returncode})" if holder.returncode
                                  else out.strip().replace(" ", ",")))
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
        parts.append("holder:HANG")
    try:
        with Index.open(path) as ix:
            ix.verify()
            parts.append("after:" + ("ok" if ix.query(1 << 50, k=0) else "LOST"))
    except Exception as exc:  # noqa: BLE001 - reported as the trial's outcome
        parts.append(f"after:{type(exc).__name__}")
    line = " ".join(parts)
    bad = "CRASH" in line or "HANG" in line or not line.endswith("after:ok")
    return at, line, bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", help="where the index goes (default: a temp dir)")
    ap.add_argument("--expect-clean", action="store_true", help="exit 1 unless every trial is fine")
    args = ap.parse_args(argv)
    from ndindex import _core
    if _core.lmdb_lock_layout() is None:
        print("the lock file's layout is not known on this platform")
        return 0
    workdir = args.workdir or tempfile.mkdtemp(prefix="ndx-lock-sweep-")
    path = os.path.join(workdir, f"lock{args.seed}.ndx")
    rng = random.Random(args.seed)
    outcomes, bad = collections.Counter(), 0
    for t in range(args.trials):
        at, line, is_bad = trial(path, rng)
        bad += is_bad
        outcomes[line.split(" holder:")[0]] += 1
        print(f"trial {t} byte {at}: {line}{'  <-- BAD' if is_bad else ''}", flush=True)
    print(f"{args.trials} trials, seed {args.seed}: {args.trials - bad} fine, {bad} bad")
    for what, n in outcomes.most_common():
        print(f"  {n:5d}  {what}")
    return 1 if bad and args.expect_clean else 0


if __name__ == "__main__":
    sys.exit(main())
