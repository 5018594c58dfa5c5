"""Interrupt sweep: Ctrl-C (SIGINT) at random moments of writes; each call is all or nothing.

Run:  python tools/sweep_interrupt.py [--runs 20] [--ops 150] [--seed 1] [--documents]
                                      [--workdir DIR] [--timeout 600] [--expect-clean]

Each run starts a child process that creates an index (durability "full"
or "normal", background compaction on or off, by the run's seed) and makes
--ops calls: add, check_and_add_many, remove, a transaction of
check_and_add calls, a transaction of removes and adds, compact (a fifth
of them full, which vacuums), and with --documents add_documents.  The
parent sends SIGINT at random intervals (5-80 ms).  The child lets the
KeyboardInterrupt land only inside the call under test (its handler
ignores the signal elsewhere), and after every call checks the content:

- a call that returned: the content is the one before with the call applied;
- an interrupted call: the content before, or that with the whole call
  applied (never a part of it), and the same Index object goes on;
- compact: the content unchanged;
- at the end, a reopen holds what the child last saw, and verify() passes.

A run is bad if the child exits other than cleanly: a failed check, an
exception other than the interrupt, a closed index, or a hang (a child
alive after --timeout seconds is killed; with py-spy on the PATH, the
report shows a dump of its threads).  A failed check
of an interrupted call says which earlier calls the missing fingerprints
came from.  Found: pending operations half applied under durability
"normal", an Index left closed by an interrupted vacuum (d4c1bae,
d4c5fcf, 379ca08), close() waiting for a lock a Ctrl-C left held, a
rotated journal's records unreadable, a transaction's operations left in
no journal (dropped by the next rebuild).
"""

from __future__ import annotations

import argparse
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()


def child(path: str, seed: int, ops: int, documents: bool) -> None:
    import numpy as np

    from ndindex.index import Index
    rng = np.random.default_rng(seed)
    r = random.Random(seed)
    armed = [False]

    def handler(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    fingerprinter = None
    if documents:
        from ndindex.fingerprint import Fingerprinter
        fingerprinter = Fingerprinter()
    ix = Index.create(path, k=3, expected_n=200_000, log_limit=5000, fingerprinter=fingerprinter,
                      background_compaction=seed % 2 == 1,
                      durability=r.choice(["full", "normal"]))
    print("ready", flush=True)  # the parent's interrupts start now
    known: set = set()
    history: list = []  # (call, the fingerprints it added) of each call
    interrupts = docs = 0
    kinds = ["add", "add", "remove", "transaction", "transaction_remove", "compact",
             "check_and_add_many"] + (["documents", "documents"] if documents else [])
    for _ in range(ops):
        op = r.choice(kinds)
        batch = rng.integers(0, 2**64, r.choice([10, 1000, 5000]), dtype=np.uint64)
        if op.startswith(("remove", "transaction_remove")) and known:
            batch = np.array(r.sample(sorted(known), min(len(known), len(batch))), dtype=np.uint64)
        half = batch[:len(batch) // 2]
        extra = rng.integers(0, 2**64, 100, dtype=np.uint64)
        texts = [" ".join(r.choice(WORDS) for _ in range(30)) + f" {docs + i}" for i in range(50)]
        keys = [f"d{docs + i}" for i in range(50)]
        if op == "documents":
            docs += 50  # before the call: an interrupted call's keys are not used again
        done = False
        try:
            armed[0] = True
            if op == "add":
                ix.add(batch)
            elif op == "check_and_add_many":
                ix.check_and_add_many(batch)
            elif op == "remove":
                ix.remove(fingerprints=batch)
            elif op == "transaction":
                with ix.transaction():
                    for fp in batch.tolist():
                        ix.check_and_add(fp)
            elif op == "transaction_remove":
                with ix.transaction():
                    ix.remove(fingerprints=half)
                    ix.add(extra)
            elif op == "compact":
                ix.compact(full=r.random() < 0.2)
            else:
                ix.add_documents(texts, keys)
            armed[0] = False
            done = True
        except KeyboardInterrupt:
            armed[0] = False
            interrupts += 1
        got = set(ix.fingerprints().tolist())
        # Random fingerprints: check_and_add finds nothing within k, and adds them all.
        added = known | set(batch.tolist())
        whole = {"add": added, "check_and_add_many": added, "transaction": added,
                 "remove": known - set(batch.tolist()),
                 "transaction_remove": (known - set(half.tolist())) | set(extra.tolist()),
                 "compact": known}.get(op)
        if op == "documents":
            assert known <= got, (op, "removed stored fingerprints", len(known - got))
        elif done or op == "compact":
            assert got == whole, (op, "done, but the content differs", len(got), len(whole))
        elif got not in (known, whole):
            missing = known - got
            origin = {f"{len(history) - j} calls back ({name})": len(missing & values)
                      for j, (name, values) in enumerate(history) if missing & values}
            raise AssertionError((op, "applied in part", len(got), len(known), len(whole),
                                  f"{len(missing)} stored before are missing, from {origin}; "
                                  f"{len(got - whole)} present that the call did not add"))
        for fp in list(got)[:5]:
            assert any(m.fingerprint == fp for m in ix.query(fp, 0)), (op, "a query missed")
        history.append((op, set(extra.tolist()) if op == "transaction_remove" else
                        set(batch.tolist()) if whole is added else set()))
        known = got
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ix.close()
    with Index.open(path, readonly=True) as again:
        assert set(again.fingerprints().tolist()) == known, "the reopened file differs"
        again.verify()
    print(f"ok interrupts {interrupts} fingerprints {len(known)}", flush=True)


def sweep(runs: int, ops: int, seed: int, documents: bool, workdir: str,
          timeout: float = 600, on_result=None) -> list:
    """Run the sweep; return one (seed, outcome, detail) a run: "ok" with "interrupts N
    fingerprints M", or "bad" with the child's exit and the end of its stderr;
    on_result(seed, outcome, detail) is called as each run ends."""
    results = []
    for i in range(runs):
        run_seed = seed * 1000 + i
        path = os.path.join(workdir, f"run{i}.ndx")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", path, str(run_seed),
               str(ops)] + (["--documents"] if documents else [])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pace = random.Random(run_seed)
        ready, _, _ = select.select([proc.stdout], [], [], timeout)  # imports and create
        if ready:
            proc.stdout.readline()
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(pace.uniform(0.005, 0.08))
            try:
                proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                break
        dump = ""
        if proc.poll() is None:
            if shutil.which("py-spy"):      # where it hangs, before it goes
                dump = subprocess.run(["py-spy", "dump", "--pid", str(proc.pid)],
                                      capture_output=True, text=True).stdout
            proc.kill()
        out, err = proc.communicate()
        ok = proc.returncode == 0 and out.startswith("ok")
        results.append((run_seed, "ok" if ok else "bad",
                        out.strip().removeprefix("ok ") if ok
                        else f"exit {proc.returncode}: {err[-3000:]}"
                        + (f"\nhung after {timeout:.0f} s:\n{dump}" if dump else "")))
        if on_result is not None:
            on_result(*results[-1])
        for name in os.listdir(workdir):
            if name.startswith(f"run{i}.ndx"):
                os.unlink(os.path.join(workdir, name))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--ops", type=int, default=150, help="calls a run makes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--documents", action="store_true", help="an index with a fingerprinter")
    ap.add_argument("--workdir", help="where the runs' files go (default: a temp dir)")
    ap.add_argument("--expect-clean", action="store_true", help="exit 1 if any run is bad")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds a run may take before it counts as a hang")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        path, seed, ops = args.child
        child(path, int(seed), int(ops), args.documents)
        return 0
    workdir = args.workdir or tempfile.mkdtemp(prefix="sweep_interrupt-")
    os.makedirs(workdir, exist_ok=True)
    t0 = time.monotonic()
    results = sweep(args.runs, args.ops, args.seed, args.documents, workdir, args.timeout,
                    on_result=lambda run_seed, outcome, detail:
                    print(f"run {run_seed}: {outcome} {detail}", flush=True))
    bad = sum(outcome != "ok" for _, outcome, _ in results)
    print(f"{len(results)} runs of {args.ops} calls in {time.monotonic() - t0:.0f} s: "
          f"{len(results) - bad} ok, {bad} bad")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if bad and args.expect_clean else 0


if __name__ == "__main__":
    sys.exit(main())
