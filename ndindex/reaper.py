"""The idle-snapshot reaper: one thread a process that makes idle indexes let go.

See SnapshotReaper.  Index.__init__ hands each open index to REAPER.
"""

from __future__ import annotations

import _thread
import os
import threading
import time
import weakref

#: An index whose snapshot no call has used for about this long lets it go
#: once the file has moved on (see SnapshotReaper).
IDLE_SNAPSHOT_SECONDS = 2.0


class SnapshotReaper:
    """Makes idle indexes let go of old snapshots, so that they do not pin old pages.

    A snapshot holds an LMDB read transaction, and LMDB reuses no page a
    reader can still reach.  An index opened, asked once and then left
    idle (a viewer, a reader process) kept its snapshot for as long as it
    stayed open: every page a writer freed after it stayed unusable, and
    the writer's file grew with each compaction (7x in 12 churn cycles).
    One daemon thread for the process looks at every open index twice per
    IDLE_SNAPSHOT_SECONDS; one whose use count did not move between two
    looks, and whose file has newer commits, drops its snapshot.  A call
    in flight keeps its own reference, and the next call takes a fresh
    snapshot, as it would anyway.
    """

    def __init__(self):
        self._indexes = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread = None

    def watch(self, index) -> None:
        """Look after index (held weakly) from now on."""
        with self._lock:
            self._indexes.add(index)
            if self._thread is None:
                # A bare thread (daemon-like; held here by its ident):
                # threading.Thread.start() waits for the new thread to run,
                # a fraction of a millisecond in every open, and nothing
                # needs this one before its first look, a second later.
                self._thread = _thread.start_new_thread(self._loop, ())

    def _loop(self) -> None:
        seen = weakref.WeakKeyDictionary()   # index -> its use count at the last look
        while True:
            time.sleep(IDLE_SNAPSHOT_SECONDS / 2)
            self._look(seen)

    def _look(self, seen) -> None:
        with self._lock:
            indexes = list(self._indexes)
        for index in indexes:
            uses = index._uses
            if seen.get(index) == uses:
                try:
                    index._let_go_of_snapshot(if_moved_on=True)
                except Exception:  # noqa: BLE001 - a closing index; never let the thread die
                    pass
            seen[index] = uses

    def _forked(self) -> None:
        # A forked child has none of the parent's threads, and must not use
        # its open indexes: they refuse (Index._disown); start afresh.
        indexes = list(self._indexes)
        self.__init__()
        for index in indexes:
            index._disown()


REAPER = SnapshotReaper()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=REAPER._forked)
