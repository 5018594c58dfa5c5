"""Kill a writer with SIGKILL mid-add and mid-compaction; every acknowledged add survives.

The writer (crash_writer.py) prints ``ok <batch>`` after each add() returns.
Each round starts it on the file the previous round left, kills it at a
random moment, reopens the file in this process and checks that verify()
passes, every acknowledged batch is present with its keys, the one batch
that may have committed without being acknowledged is all there or all
absent, and no later batch exists.  The next round then writes to the same
file, which shows a killed file stays writable.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from crash_writer import batch
from ndindex.index import Index

WRITER = os.path.join(os.path.dirname(__file__), "crash_writer.py")
#: Fingerprints stored before the compaction rounds: enough that a full
#: compaction takes a good tenth of a second, so a kill can land inside it.
LARGE_TABLE_N = 200_000


class Writer:
    """A crash_writer.py subprocess whose stdout lines are collected by a thread."""

    def __init__(self, path, first: int, log_limit: int = 2000):
        self.proc = subprocess.Popen([sys.executable, WRITER, str(path), str(first), str(log_limit)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.split("\n")[0])
                self._cond.notify_all()
        with self._cond:
            self.lines.append("EOF")
            self._cond.notify_all()

    def wait_for(self, prefix: str, after: int = 0, timeout: float = 30) -> int:
        """Wait for a line starting with prefix at position >= after; return its position."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(after, len(self.lines)):
                    if self.lines[i].startswith(prefix):
                        return i
                if self.lines and self.lines[-1] == "EOF":
                    raise AssertionError(f"writer exited: {self.proc.stderr.read()}")
                left = deadline - time.monotonic()
                assert left > 0, f"no {prefix!r} line within {timeout} s: {self.lines[-5:]}"
                self._cond.wait(left)

    def kill(self) -> list[str]:
        """SIGKILL the writer; return every line it printed."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._thread.join(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()
        assert self.proc.returncode == -signal.SIGKILL
        return [line for line in self.lines if line != "EOF"]


def acknowledged(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("ok ")]


def check_after_crash(path, first: int, acked: list[int]) -> None:
    """Reopen path and check every batch from first on against the acknowledgements."""
    assert acked == list(range(first, first + len(acked)))
    maybe = first + len(acked)  # committed, perhaps, but not acknowledged
    with Index.open(path) as ix:
        ix.verify()
        for b in acked:
            fps, keys = batch(b)
            found = ix.query_many(fps, k=0)
            assert len(found) == len(fps), f"acknowledged batch {b}: {len(found)} of {len(fps)} present"
            if keys is not None:
                # Every key of the batch, checked on a sample to keep the test quick.
                for i in range(0, len(fps), 17):
                    assert keys[i] in ix.keys(int(fps[i])), f"batch {b}: key {keys[i]!r} missing"
        fps, _ = batch(maybe)
        assert len(ix.query_many(fps, k=0)) in (0, len(fps)), f"batch {maybe} is partly present"
        for b in range(maybe + 1, maybe + 4):
            fps, _ = batch(b)
            assert len(ix.query_many(fps, k=0)) <= 1, f"batch {b} was never added but is present"


def kill_round(path, first: int, rng: random.Random, during_compaction: bool) -> tuple[int, str]:
    """One round: start a writer at batch first, kill it, check.

    Returns the next free batch number and the writer's last line.
    """
    writer = Writer(path, first)
    try:
        start = writer.wait_for("ready")
        if during_compaction:
            # Let it add a few batches, then kill it somewhere inside a compaction.
            at = writer.wait_for("compacting", after=start)
            time.sleep(rng.uniform(0.0, 0.08))
        else:
            time.sleep(rng.uniform(0.05, 0.6))
    finally:
        lines = writer.kill()
    acked = acknowledged(lines)
    check_after_crash(path, first, acked)
    if during_compaction:
        assert len(lines) > at
    # Skip the batch that may or may not have committed, so keys are never added twice.
    return first + len(acked) + 1, lines[-1]


def final_write_and_check(path, acked_batches: list[int]) -> None:
    """The file a crash left behind takes new adds and a full compaction."""
    with Index.open(path) as ix:
        fps, keys = batch(10**6)
        ix.add(fps, keys)
        ix.compact(full=True)
        ix.verify()
        assert len(ix.query_many(fps, k=0)) == len(fps)
        for b in acked_batches[::5]:
            got = batch(b)[0]
            assert len(ix.query_many(got, k=0)) == len(got)


def test_sigkill_during_adds_keeps_every_acknowledged_batch(tmp_path):
    rng = random.Random(1)
    path = tmp_path / "crash.ndx"
    first, done = 0, []
    for _ in range(3):
        nxt, _ = kill_round(path, first, rng, during_compaction=False)
        done += list(range(first, nxt - 1))
        first = nxt
    assert done, "the writer never acknowledged a batch"
    final_write_and_check(path, done)


@pytest.mark.slow
def test_sigkill_during_compaction_of_large_table_keeps_every_acknowledged_batch(tmp_path):
    rng = random.Random(3)
    path = tmp_path / "crash.ndx"
    base = np.random.default_rng(99).integers(0, 2**64, LARGE_TABLE_N, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=50_000, log_limit=1 << 30) as ix:
        ix.add(base)
        ix.compact()
    first, done, last_lines = 1, [], []
    for _ in range(3):
        nxt, last = kill_round(path, first, rng, during_compaction=True)
        done += list(range(first, nxt - 1))
        last_lines.append(last)
        first = nxt
    # A compaction of this table takes a tenth of a second or more and the
    # kill comes within 80 ms of its start, so it lands inside one.
    assert any(line.startswith("compacting") for line in last_lines), last_lines
    with Index.open(path, readonly=True) as ix:
        assert len(ix.query_many(base, k=0)) == len(base)
    final_write_and_check(path, done)
