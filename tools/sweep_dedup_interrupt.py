"""Ctrl-C sweep of the dedup command: SIGINT `ndindex dedup --jobs 2` at random moments.

Run:  python tools/sweep_dedup_interrupt.py [--trials 40] [--seed 1] [--workdir DIR] [--expect-clean]

The sweep writes a corpus of 4,000 small text files (many near-duplicates)
under the work directory, then each trial touches some of them (so that a
re-run reads them again), starts ``ndindex dedup --jobs 2 -q --index I``
over the corpus, sends it SIGINT after 0.2-3 s (and, in six trials of ten,
a second one up to 0.3 s later), and waits up to 30 s.  The index is
deleted before seven trials of ten (a first run reads every file).

A trial is bad if the process outlives the 30 s (a py-spy dump of it is
written beside the index when py-spy is installed) or the index it leaves
fails ``ndindex verify``.  Exit status 130 ("interrupted"), or 1 when the
run ended before the signal, are good answers; a second SIGINT may end the
process by the signal (-2) during its clean-up.  --expect-clean exits 1
unless every trial is fine.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DIRS, FILES = 10, 400


def make_corpus(root: str, seed: int) -> None:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    for d in range(DIRS):
        os.makedirs(os.path.join(root, f"d{d}"), exist_ok=True)
        for i in range(FILES):
            source = random.Random(rng.randrange(10**6) % 997)   # 997 texts: many copies
            text = " ".join(source.choice(words) for _ in range(rng.randint(50, 2000)))
            with open(os.path.join(root, f"d{d}", f"f{i}.txt"), "w") as f:
                f.write(text)


def trial(rng: random.Random, corpus: str, index: str, number: int) -> tuple[bool, str]:
    if rng.random() < 0.7 and os.path.exists(index):
        os.remove(index)
    for _ in range(1500):
        os.utime(os.path.join(corpus, f"d{rng.randrange(DIRS)}", f"f{rng.randrange(FILES)}.txt"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ndindex", "dedup", "--jobs", "2", "-q", "--index", index, corpus],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # (a shell's background job starts with SIGINT ignored, and so would this)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(rng.uniform(0.2, 3.0))
    proc.send_signal(signal.SIGINT)
    if rng.random() < 0.6:
        time.sleep(rng.uniform(0.001, 0.3))
        proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        if shutil.which("py-spy"):
            dump = subprocess.run(["py-spy", "dump", "--pid", str(proc.pid)],
                                  capture_output=True, text=True)
            with open(f"{index}.hang-{number}.txt", "w") as f:
                f.write(dump.stdout + dump.stderr)
        proc.kill()
        proc.communicate()
        return False, "hung (killed after 30 s)"
    said = err.strip().splitlines()[-1][:100] if err.strip() else ""
    if os.path.exists(index):
        check = subprocess.run([sys.executable, "-m", "ndindex", "verify", index],
                               capture_output=True, text=True)
        if check.returncode != 0:
            return False, f"exit {proc.returncode}; verify failed: {check.stdout[-300:]}"
    return True, f"exit {proc.returncode} {said!r}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None, help="where the corpus and index go (default: a "
                    "temporary directory, deleted after)")
    ap.add_argument("--expect-clean", action="store_true")
    args = ap.parse_args(argv)
    own = args.workdir is None
    workdir = tempfile.mkdtemp(prefix="ndx-dedup-sweep-") if own else args.workdir
    try:
        corpus, index = os.path.join(workdir, "corpus"), os.path.join(workdir, "dedup.ndx")
        make_corpus(corpus, args.seed)
        rng = random.Random(args.seed)
        bad = 0
        for t in range(args.trials):
            fine, what = trial(rng, corpus, index, t)
            bad += not fine
            print(f"trial {t}: {'ok' if fine else 'BAD'} {what}", flush=True)
        print(f"{args.trials} trials: {args.trials - bad} fine, {bad} bad")
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if args.expect_clean and bad else 0


if __name__ == "__main__":
    sys.exit(main())
