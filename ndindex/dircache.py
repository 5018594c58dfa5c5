"""What an open index keeps of its runs across snapshots: directories and held runs.

A run's *directory* lists its chunks' blocks (Snapshot._directory), so a
query probes a listed run without searching the chunks tree; a small raw
run is *held*: its values in memory, probed as the log is.  Both outlive
the snapshot that made them, for as long as the run lasts, in one
``DirectoryCache`` an Index owns; a background thread lists the large
runs and reads the small ones once the index is warm (reader.WARM_QUERIES).
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ndindex import _core, runs as rn
from ndindex.threadpool import start_thread

if TYPE_CHECKING:
    from ndindex.reader import Snapshot

#: Raw runs of at most this many entries (a table's level-0 and level-1
#: runs, merge inputs and outputs among them) are held in memory once the
#: index is warm: the values a flush or a merge step wrote, kept by the
#: compactor (Compactor._hold; a merge output as it grows), or read once,
#: checked, by the background lister (DirectoryCache.hold_later); and
#: probed as the log is -- the search aid and one or two lines of values --
#: where a listed run's probe reads a dozen lines (directory, the block's
#: header and its lines around the range).  At most 4 MB a run; a table
#: holds two to four such runs at a busy moment.
MEMORY_RUN_MAX_ENTRIES = 1 << 19
#: The background lister's thread ends after this long without work.
LISTER_IDLE_SECONDS = 1.0


class HeldRun(NamedTuple):
    """A run's values held in memory (DirectoryCache.held)."""
    start: int               # the first value they may hold (a merge input's live start)
    aid: object              # _core.log_aid capsule over the values: what the kernel takes
    nbytes: int
    upto: bytes | None       # a merge output's cursor they reach; None: the whole run


class DirectoryCache(dict):
    """Run directories by run id, kept across snapshots; warm once the index
    has answered WARM_QUERIES queries (then larger runs are listed too, and
    small ones held in memory).  outputs: merge outputs' directories by run
    id, with the cursor each was listed at (see Snapshot._output_directory).
    held: runs held in memory by run id (HeldRun).

    Large runs are listed, small ones read into memory, by a background
    thread (list_later, hold_later); version counts what it added, so that
    the index can rebuild a kernel built without them.  close() stops the
    thread: before the file it reads is closed."""

    warm = False

    def __init__(self):
        super().__init__()
        self.outputs = {}
        self.held = {}
        self.lock = threading.Lock()
        self.version = 0
        self._asked: set = set()   # (run id, job) queued, being done, or failed
        self._jobs: list = []
        self._busy = False  # a job taken off _jobs and not yet done
        self._wake = threading.Condition(self.lock)
        self._thread = None
        self._closed = False

    def drop_stale(self, live: set) -> None:
        """Forget the directories of runs not in live."""
        with self.lock:
            for stale in [rid for rid in self if rid not in live]:
                del self[stale]
            for stale in [rid for rid in self.held if rid not in live]:
                del self.held[stale]
            # And that they were asked for: an index open for months sees
            # run ids come and go without end.
            keep = live | {run.run_id for _, run, _ in self._jobs}
            self._asked = {a for a in self._asked if a[0] in keep}

    def list_later(self, snap: "Snapshot", run) -> None:
        """List run in the background (once; it holds snap's pages meanwhile)."""
        self._later(snap, run, "list")

    def hold_later(self, snap: "Snapshot", run) -> None:
        """Read run's live values into memory in the background (once)."""
        self._later(snap, run, "hold")

    def idle(self) -> bool:
        """Whether the background lister has nothing queued or under way."""
        with self.lock:
            return not self._jobs and not self._busy

    def held_sizes(self) -> list:
        """(run id, bytes) of the runs held in memory."""
        with self.lock:
            return [(rid, h.nbytes) for rid, h in self.held.items()]

    def hold_values(self, run_id: int, values: np.ndarray, upto: bytes | None = None) -> bool:
        """Hold a run just written, from its values (sorted, as written), if
        the index is warm and the run small; upto: for a merge output, the
        cursor up to which values holds it (None: the whole run).  Returns
        whether it is held; a run past the limit loses what was held of it
        (a merge output that grew past it)."""
        if not self.warm:
            return False
        aid = _core.log_aid(values) if 0 < len(values) <= MEMORY_RUN_MAX_ENTRIES else None
        with self.lock:
            if aid is None or self._closed:
                self.held.pop(run_id, None)
                return False
            self._asked.add((run_id, "hold"))
            self.held[run_id] = HeldRun(0, aid, values.nbytes, upto)
            self.version += 1
            return True

    def let_go(self, run_id: int) -> None:
        """Hold the run's values no more (they may be asked for again)."""
        with self.lock:
            self.held.pop(run_id, None)
            self._asked.discard((run_id, "hold"))

    def _later(self, snap: "Snapshot", run, job: str) -> None:
        with self.lock:
            if self._closed or (run.run_id, job) in self._asked:
                return
            self._asked.add((run.run_id, job))
            self._jobs.append((snap, run, job))
            if self._thread is None:
                start_thread(self._list_loop, "ndindex-lister",
                             keep=functools.partial(setattr, self, "_thread"))
            self._wake.notify()

    def _list_loop(self) -> None:
        while True:
            with self.lock:
                if not self._jobs and not self._closed:
                    self._wake.wait(LISTER_IDLE_SECONDS)
                if self._closed or not self._jobs:
                    # Idle: the thread ends (list_later starts another), so
                    # an index dropped without close() leaves none behind.
                    self._jobs.clear()
                    if self._thread is threading.current_thread():
                        self._thread = None
                    return
                snap, run, job = self._jobs.pop(0)
                self._busy = True
            try:
                self._do(snap, run, job)
            finally:
                with self.lock:
                    self._busy = False
            del snap

    def _do(self, snap: "Snapshot", run, job: str) -> None:
        """List run (job "list") or read its values into memory ("hold")."""
        start = rn.live_start(run) or 0
        try:
            # The kernel releases the GIL while it reads the chunks.
            if job == "list":
                cap, _, inline, _ = snap._list_chunks(run, start)
                done = None if inline else cap
            else:
                values = rn.read_values(snap.view, run).values
                done = HeldRun(start, _core.log_aid(values), values.nbytes, None) \
                    if len(values) else None
        except Exception:  # noqa: BLE001 - damage: the tree path reports it to the query
            done = None
        with self.lock:
            if done is not None and not self._closed:
                (self if job == "list" else self.held)[run.run_id] = done
                self.version += 1

    def close(self) -> None:
        """Stop the background lister and wait for it; it may start again after reopen()."""
        with self.lock:
            self._closed = True
            thread, self._thread = self._thread, None
            self._wake.notify()
        if thread is not None:
            thread.join()
        with self.lock:
            # The directories point into the file's mapping and keep it.
            self.clear()
            self.outputs.clear()
            self.held.clear()

    def reopen(self) -> None:
        """Forget everything (the file was replaced) and accept work again."""
        self.close()
        with self.lock:
            self._asked.clear()
            self._closed = False
