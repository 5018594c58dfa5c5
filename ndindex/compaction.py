"""Compaction: the log flushed into runs, runs merged level by level, in small steps.

Each table is a log-structured set of sorted runs (FORMAT.md 7.4).  A
*flush* turns the append log into one new run per table (and per record
space), updates the tombstones and deletes the log records.  A *merge*
combines runs into one run of the next level.  Which runs a flush makes
and which merges are due is the run layout's policy, :mod:`ndindex.levels`
(LevelDB-style leveling, RocksDB's dynamic level sizes): work per added
fingerprint grows with log N, not N.  This module does the work, and
holds back writers that outrun it (``Compactor.throttle``).

Why steps: LMDB has one writer at a time, and a file never shrinks, so a
merge that rewrote a large run in one transaction would stall every add()
behind it and leave a file twice the size of its data.  A merge instead
advances a *cursor* through the key space a few megabytes at a time: each
step decodes the next chunks of its inputs from a snapshot (outside any
write transaction), encodes the merged values, then in one short
transaction writes the output chunks, deletes the input chunks it consumed
and moves the cursor.  Readers see the inputs above the cursor and the
output up to it, always the same set.  A crash between steps loses
nothing: the manifest names exactly the chunks that exist.

Steps run in a background thread of the writer (``Index.open(...,
background_compaction=True)``, the default) or on ``Index.compact()``.  One
process compacts at a time (a lock on the index file); a step computed
from a snapshot commits only if the manifest is still the one it read.
"""

from __future__ import annotations

import functools
import dataclasses
import fcntl
import itertools
import logging
import os
import signal
import threading
import time

import numpy as np

from ndindex import _core, chunks as ch, codec, docstore, levels, locks, runs as rn
from ndindex.arrays import EMPTY_U64, isin_sorted, merge_unique
from ndindex.errors import ClosedError, CorruptionError, NdindexError
from ndindex.records import (DB_CHUNKS, DB_LOG, KEY_MANIFEST, KEY_STATE, KIND_HUFFMAN,
                             KIND_RAW,
                             KIND_RECORDS, KIND_TOMBSTONES, RECORD_SPACES, RUN_MERGE_INPUT,
                             RUN_MERGE_OUTPUT, SPACE_DOCS, SPACE_LOOKUP,
                             SPACE_TOMBSTONES, U64_BE, Manifest, Run, State, read_meta)
from ndindex.threadpool import ThreadPool, Wakeup, start_thread

_log = logging.getLogger("ndindex")

#: A smaller log is flushed once no write came for this long.
FLUSH_IDLE_SECONDS = 1.0
#: Input chunks read per input run per merge step (about 2 MB each).
STEP_CHUNKS = 16
#: The background thread waits this long for work before looking again.
IDLE_WAIT_SECONDS = 0.5
#: Backpressure, as RocksDB's write slowdown and stop: a writer whose log
#: holds more than SLOWDOWN_LOGS x log_limit operations sleeps a little
#: after each commit; more than STOP_LOGS x log_limit, it waits for the
#: compactor (at most STOP_WAIT_SECONDS).  Without it a fast writer would
#: outrun compaction and leave queries probing an ever longer log.
SLOWDOWN_LOGS = 2
STOP_LOGS = 6
#: The same for runs not yet merged: runs below the main level in the table
#: that has most (two or three in the steady state).
SLOWDOWN_RUNS = 5
STOP_RUNS = 8
#: With this many level-0 runs waiting, the compactor merges before it flushes.
MERGE_FIRST_RUNS = 2
SLOWDOWN_SECONDS = 0.002
STOP_WAIT_SECONDS = 0.04
#: After a failed step (a full disk, damage it met) the background thread
#: waits IDLE_WAIT_SECONDS, then twice as long after each failure in a row,
#: up to this: a merge that fails writes megabytes first, and each write
#: woke the thread for another try.
RETRY_MAX_SECONDS = 30.0
#: close() flushes a log of at least this many operations (with background
#: compaction on), as SQLite checkpoints its WAL when the last connection
#: closes: otherwise the next open's first query reads the whole log (a
#: 65,000-operation log made it 10 ms with the file cached, 25 ms cold).
CLOSE_FLUSH_OPS = 4096
#: A log of this many records (commits) is flushed too, in the background
#: and by close(), whatever its operations: an open's first query reads
#: each record (about 5 us), and a writer of one item a commit, never idle
#: for FLUSH_IDLE_SECONDS or a process of a few commits each, left up to
#: log_limit of them: 20,000 made a fresh open's first query 0.2 s.
FLUSH_RECORDS = 256
#: And a log of this many bytes (its LMDB pages): a document's operations
#: carry its record (sketch, lookup keys, data: 1-2 KB) where a
#: fingerprint's carry 8 bytes, and every reader holds the log in memory
#: and parses it whole at its first query.  60,000 document operations
#: within log_limit (5 calls of 2,000 documents) made a fresh open's first
#: query 110 ms and its first similar() 234 ms.
FLUSH_LOG_BYTES = 1 << 20


def log_outgrown(snap, ops: int) -> bool:
    """Whether snap's log is due for a flush by its size: ops operations,
    FLUSH_RECORDS records or FLUSH_LOG_BYTES bytes of pages."""
    st = snap.state
    return st.log_first_seq < st.log_next_seq and (
        st.log_ops >= ops or st.log_records >= FLUSH_RECORDS or
        snap.view.trees[DB_LOG].pages * snap.view.psize >= FLUSH_LOG_BYTES)

#: Test-only (tests/crash/test_kill_compaction.py): with
#: NDINDEX_KILL_AT_COMPACTION="before:N" or "after:N" in the environment,
#: the process kills itself (SIGKILL) just before or after its N-th
#: compaction commit, counted from 0 over the whole process.
_KILL_AT = os.environ.get("NDINDEX_KILL_AT_COMPACTION", "")
_COMMITS = itertools.count()


def _kill_if(moment: str) -> None:
    if _KILL_AT == moment:
        os.kill(os.getpid(), signal.SIGKILL)


class _Conflict(Exception):
    """The manifest changed since the step's snapshot; the step is dropped."""


class Compactor:
    """Flushes and merges for one open Index; optionally in a background thread."""

    def __init__(self, index, background: bool):
        self._ix = index
        self.background = background
        self._lock = threading.Lock()  # one step at a time in this process
        self._wake = Wakeup()
        self._progress = Wakeup()
        self._stop = Wakeup()
        self._last_write = time.monotonic()
        self._next_space = 0
        #: The background thread's last failed step, None once a step (its
        #: own or compact()'s) succeeds; failures: how many in a row.
        self.error: BaseException | None = None
        self.failures = 0
        self.steps = 0
        #: Input chunks merged away so far (the progress of Index.compact).
        self.chunks_merged = 0
        #: Most runs below the main level any table holds, and the log's
        #: operations, as of the last commit this process made or saw (for
        #: throttle); the manifest generation the runs were counted in.
        self.level0_runs = 0
        self.log_ops = 0
        self._runs_generation = None
        #: Whether the last step found the lease taken by another process.
        self._lease_elsewhere = False
        #: Raw merge outputs held in memory as they grow: run id -> (buffer,
        #: values in it, the cursor they reach) (see _hold).
        self._growing: dict = {}
        self._thread = None
        workers = min(os.cpu_count() or 1, 4)
        self._pool = ThreadPool(workers, "ndindex-merge") if workers > 1 else None
        if background:
            try:
                start_thread(self._loop, "ndindex-compaction",
                             keep=functools.partial(setattr, self, "_thread"))
            except BaseException:
                self.close()
                raise

    # -- scheduling -----------------------------------------------------------

    def notify(self, state=None) -> None:
        """A commit happened: there may be work."""
        self._last_write = time.monotonic()
        if state is not None:
            self.log_ops = state.log_ops
            if self._thread is not None and (self._runs_generation is None or
                                             state.manifest_generation > self._runs_generation):
                # Another process's compaction step came between: its runs
                # are not the ones this process last counted.  (One of this
                # process's steps may commit after the writer's commit and
                # before this line: its count is newer than the state's.)
                self._read_figures()
        self._wake.set()

    def _count_runs(self, manifest: Manifest) -> None:
        tables = range(len(self._ix.plan.tables))
        self.level0_runs = max((sum(1 for r in manifest.of(t)
                                    if levels.level_of(r) < levels.MAIN_LEVEL)
                                for t in tables), default=0)
        self._runs_generation = manifest.generation

    def _read_figures(self) -> None:
        """Take throttle's figures from the newest commit, in a read of the
        state and manifest alone (no snapshot of the whole index).  The
        writer's commit is done by now: a file closed or damaged meanwhile
        leaves the figures as they were, for the next call or query to
        report, rather than fail an add() that committed."""
        try:
            txn, view = self._ix._store.snapshot()
            try:  # the records lie in pages the snapshot pins: read them before it ends
                state = read_meta(view, KEY_STATE, State)
                manifest = read_meta(view, KEY_MANIFEST, Manifest)
            finally:
                txn.abort()
        except NdindexError:
            return
        self.log_ops = state.log_ops
        if self._runs_generation is None or manifest.generation >= self._runs_generation:
            self._count_runs(manifest)  # else a step of this process committed meanwhile

    def throttle(self, state, log_limit: int, began: float) -> None:
        """Slow a writer down while the background compactor is behind (see SLOWDOWN_LOGS).

        began: time.monotonic() when the writer's commit began.  The wait
        ends STOP_WAIT_SECONDS after it, commit included, so that no single
        add() stalls for long however slow its commit was (a commit waits
        for LMDB's write lock behind a compaction commit's fsync).
        """
        if self._thread is None or state is None or self.error is not None:
            return  # a compactor failing its steps makes no progress to wait for
        deadline = began + STOP_WAIT_SECONDS
        while (self.log_ops / max(log_limit, 1) >= STOP_LOGS or
               self.level0_runs >= STOP_RUNS) \
                and time.monotonic() < deadline and not self._stop.is_set():
            self._progress.clear()
            if not self._lease_elsewhere:
                self._progress.wait(max(0.0, deadline - time.monotonic()))
                continue
            # Another process compacts: its progress sets no event here, so
            # look at the file's figures every slice of the wait.
            self._progress.wait(max(0.0, min(STOP_WAIT_SECONDS / 8,
                                             deadline - time.monotonic())))
            self._read_figures()
        if state.log_ops / max(log_limit, 1) >= SLOWDOWN_LOGS or self.level0_runs >= SLOWDOWN_RUNS:
            time.sleep(min(SLOWDOWN_SECONDS, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        # A step of compact() in another thread ends first, and the steps
        # after it raise ClosedError: under way, its merges met a pool shut
        # down ("cannot schedule new futures after shutdown").
        with self._lock:
            pool, self._pool = self._pool, None  # close()'s last flush builds its runs here
        if pool is not None:
            pool.shutdown(wait=True)

    def _map(self, fn, jobs: list) -> list:
        """[fn(job) for job in jobs], on the merge threads when there are
        several jobs and a pool; on this thread once the pool refuses work
        (close() in another thread shut it down)."""
        pool, futures = self._pool, []
        if pool is not None and len(jobs) > 1:
            try:
                for job in jobs:
                    futures.append(pool.submit(fn, job))
            except RuntimeError:        # "cannot schedule new futures after shutdown"
                pass
        done = [f.result() for f in futures]
        return done + [fn(job) for job in jobs[len(futures):]]

    def _loop(self) -> None:
        # Owed work waits for the first write or IDLE_WAIT_SECONDS: an index
        # opened for a few queries answers them without a merge beside them
        # (a merge reads the tombstones whole: 0.1 s cold at 30M).
        self._wake.wait(IDLE_WAIT_SECONDS)
        self._wake.clear()
        while not self._stop.is_set():
            try:
                did = self.step()
            except ClosedError:
                return
            except Exception as exc:  # noqa: BLE001 - never let the thread die silently
                self._failed(exc)
                # Not woken by writes: each would be another failing try.
                self._stop.wait(min(IDLE_WAIT_SECONDS * 2 ** (self.failures - 1),
                                    RETRY_MAX_SECONDS))
                continue
            if not did:
                self._wake.wait(IDLE_WAIT_SECONDS)
                self._wake.clear()

    def _failed(self, exc: BaseException) -> None:
        """A background step failed: keep it for stats(), say so once a streak."""
        if self.error is None:
            # The traceback too, for an error of no ndindex type: a bug to report.
            _log.warning("%s: background compaction failed (%s: %s); it retries, "
                         "and writes go on meanwhile without waiting for it",
                         self._ix.path, type(exc).__name__, exc,
                         exc_info=None if isinstance(exc, NdindexError) else exc)
        self.error = exc
        self.failures += 1

    def _succeeded(self) -> None:
        if self.error is not None:
            _log.warning("%s: background compaction works again (%d %s in a row failed)",
                         self._ix.path, self.failures, "step" if self.failures == 1 else "steps")
            self.error, self.failures = None, 0

    def run(self, force_flush: bool = True, full: bool = False, wait: bool = True,
            on_step=None) -> int:
        """Do every step there is to do now; return how many.  Used by Index.compact();
        on_step(), if given, is called after each step."""
        n = 0
        while self.step(force_flush=force_flush, full=full, wait=wait):
            n += 1
            if on_step is not None:
                on_step()
        return n

    # -- one step -------------------------------------------------------------

    def _leased(self, wait: bool = False):
        """A with block holding the file's compaction lease, this process's
        step lock held (by the caller, in a with statement of its own: see
        below); binds False, holding nothing, when another process has the
        lease.  (wait: wait for it, as long as another process's step.)

        Its beginning and end are C (_core.Block), Ctrl-C held back from
        their first instruction: as a contextlib generator, a Ctrl-C as
        contextlib's __exit__ began left the lease held while the
        interrupt's traceback kept the generator alive, and no other
        process compacted.  The step lock was taken in here too, and
        close() then waited for it for ever (sweep_interrupt_points:
        `ndindex compact --full`, 1 point in 1,500): a lock's own with
        statement is C as well."""
        return _core.Block(None, functools.partial(self._take_lease, wait), self._let_go_lease)

    def _take_lease(self, wait: bool) -> bool:
        fd = self._ix._lock_file.fd
        if fd < 0:      # Index.close() in another thread let the file go
            raise ClosedError(f"{self._ix.path}: index is closed")
        return locks.byte_lock(fd, locks.LEASE_BYTE, fcntl.F_WRLCK, wait=wait)

    def _let_go_lease(self, *exc) -> bool:
        # Letting go of a byte this description does not hold changes nothing.
        fd = self._ix._lock_file.fd
        if fd >= 0:
            locks.byte_lock(fd, locks.LEASE_BYTE, fcntl.F_UNLCK)
        return False

    def step(self, force_flush: bool = False, full: bool = False, wait: bool = False) -> bool:
        """Do one unit of work if there is any; return whether something was done."""
        if self._ix.readonly:
            return False
        with self._lock, self._leased(wait) as held:
            self._lease_elsewhere = not held
            if not held:
                return False  # another process is compacting
            if self._stop.is_set():
                raise ClosedError(f"{self._ix.path}: index is closed")  # close() has begun
            snap = self._ix._compaction_snapshot()
            try:
                did = self._step(snap, force_flush, full)
            except _Conflict:
                did = True  # something else changed the manifest: look again
            finally:
                snap.close()
            self._succeeded()
            return did

    def flush_log(self) -> bool:
        """Flush the log into runs now, if this process can take the compaction lease."""
        with self._lock, self._leased() as held:
            if not held:
                return False
            snap = self._ix._compaction_snapshot()
            try:
                if snap.state.log_first_seq == snap.state.log_next_seq:
                    return False
                self._flush(snap)
                return True
            except _Conflict:
                return False
            finally:
                snap.close()

    def _step(self, snap, force_flush: bool, full: bool) -> bool:
        st = snap.state
        idle = time.monotonic() - self._last_write >= FLUSH_IDLE_SECONDS
        log_due = log_outgrown(snap, self._ix.log_limit) or \
            (st.log_records > 0 and (force_flush or idle))
        # Flushing first would starve the merges of a busy writer: level-0
        # runs would pile up.  Merge first once they do, unless the log
        # itself has grown long.
        tables = range(len(self._ix.plan.tables))
        level0 = max((sum(1 for r in snap.manifest.of(t) if levels.level_of(r) == 0)
                      for t in tables), default=0)
        # A level-1 run past its share, with nothing else merging in its
        # table, starts its merge up first: the flush would otherwise be a
        # second level-1 run beside it (levels.flush_target) and one more input
        # of that merge.
        level1_over = any(levels.level1_full(snap.manifest, t, self._ix.log_limit)
                          for t in tables)
        if log_due and ((level0 < MERGE_FIRST_RUNS and not level1_over) or
                        st.log_ops >= STOP_LOGS * self._ix.log_limit):
            self._flush(snap)
            return True
        # A few tombstone runs at most: a query looks a candidate up in each.
        if len(snap.tombstone_runs) > levels.TOMBSTONE_RUNS and self._ix._levels_tombstones and \
                self._tombstone_round(snap):
            return True
        if self._merge_round(snap, full):
            return True
        if log_due:
            self._flush(snap)
            return True
        # Tombstones no run can hold any more go as soon as the merges that
        # outdated them are done (not only at the next flush): every merge
        # reads the tombstones whole, and they take space.
        if self._ix._levels_tombstones:
            return self._tombstone_round(snap)
        if len(snap.tombstones) and self._tombstones_droppable(snap.manifest,
                                                               snap.tombstone_stamps):
            self._rewrite_tombstones(snap)
            return True
        return False

    def _merge_round(self, snap, full: bool) -> bool:
        """One step of every merge that is due, computed in parallel, committed together.

        Each space's step touches only its own runs, so the steps of a round
        are independent: their heavy parts (reading, merging, encoding) run
        in C with the GIL released, on as many threads as there are cores.
        """
        man = _copy_manifest(snap.manifest)
        jobs = []
        stamps = snap.tombstone_derived("sorted stamps", lambda: np.sort(snap.tombstone_stamps)) \
            if snap.tombstone_runs else None
        spaces = list(range(len(self._ix.plan.tables))) + list(RECORD_SPACES)
        merges = [(space, m) for space in spaces
                  for m in levels.choose_merges(snap.manifest, space, full, self._ix.log_limit,
                                                stamps, self._ix.coding)]
        for space, (output, inputs, level) in merges:
            inputs = [_find(man, r.run_id) for r in inputs]
            if output is None:
                rid = man.new_run_id()
                kind = KIND_RECORDS if space in RECORD_SPACES else levels.kind_of(level)
                output = Run(space, kind, level, rid, 0, 0, flags=RUN_MERGE_OUTPUT, merge_into=rid)
                man.runs.insert(min(man.runs.index(r) for r in inputs), output)
                for r in inputs:
                    r.flags, r.merge_into, r.cursor = RUN_MERGE_INPUT, rid, b""
            else:
                output = _find(man, output.run_id)
            step = self._record_merge_step if space in RECORD_SPACES else self._fp_merge_step
            jobs.append((step, space, output, inputs))
        if not jobs:
            return False
        results = self._map(lambda j: j[0](snap, man, *j[1:]), jobs)
        puts, deletes, held = [], [], []
        for (p, d, gone, *wrote) in results:
            puts += p
            deletes += d
            held += wrote
            for run in gone:
                man.runs.remove(run)
        self._commit(snap, puts, deletes, man, held=held)
        self.chunks_merged += len(deletes)
        return True

    # -- committing ---------------------------------------------------------------

    def _commit(self, snap, puts, deletes, manifest: Manifest, log_done: int | None = None,
                log_ops_done: int = 0, held=()) -> None:
        """Write a compaction step.  held: what it wrote of raw runs, for a warm
        index to hold in memory at once instead of reading them back (see
        _hold)."""
        def body(wt):
            state = read_meta(wt.view, KEY_STATE, State)
            if state.manifest_generation != snap.state.manifest_generation or \
                    state.log_first_seq != snap.state.log_first_seq:
                raise _Conflict()
            for key, value in puts:
                wt.put(DB_CHUNKS, key, value)
            for key in deletes:
                wt.delete(DB_CHUNKS, key)
            if log_done is not None:
                for seq in range(state.log_first_seq, log_done):
                    wt.delete(DB_LOG, U64_BE.pack(seq))
                state.log_first_seq = log_done
                state.log_ops -= log_ops_done
            state.manifest_generation += 1
            manifest.generation = state.manifest_generation
            state.txnid = wt.txnid
            wt.put_framed(KEY_MANIFEST, manifest.pack())
            wt.put_framed(KEY_STATE, state.pack())
            self._count_runs(manifest)
            self.log_ops = state.log_ops

        # The step reads no more.  No reader may see the commit before this
        # one when this one allocates, or LMDB reuses none of the pages that
        # commit freed (the step before's merged-away chunks): not the step's
        # own snapshot, nor the index's, which the last step left there
        # (Index._compacted).  Without this, 10M churn's file grew by a
        # flush's 15 MB while 24 MB freed one step before lay pinned.
        snap.close()
        self._ix._let_go_of_snapshot()
        # Compaction commits need not reach the disk before returning: a
        # lost step is redone (LMDB's NOMETASYNC keeps the file whole).
        n = next(_COMMITS) if _KILL_AT else 0
        _kill_if(f"before:{n}")
        self._ix._store.write(body, sync=False)
        _kill_if(f"after:{n}")
        self.steps += 1
        cache = self._ix._directories
        if cache.held:
            # Values held for runs this step merged away go now: an index
            # only written to builds no kernel (which drops them too).
            cache.drop_stale({r.run_id for r in manifest.runs})
        self._hold(held)
        self._progress.set()
        self._ix._compacted()

    def _hold(self, held) -> None:
        """Hold in memory the raw runs a committed step wrote, if the index is
        warm and they are small (DirectoryCache.hold_values).  held: (run
        id, the values the step wrote, whether they begin the run, the
        run's cursor before the step and after it: None once complete).  A
        merge output grows step by step: its values gather in a buffer grown
        by doubling (self._growing), and each step holds the part written so
        far (the kernel clips it to a snapshot's cursor); one begun before
        the index was warm, or grown past the limit, is not held.  Nor is
        one another process's compactor went on with (the lease passes
        between writer processes): the buffer lacks what its steps wrote,
        and queries through it missed those values, so that a remove() of
        them, which removes what it finds, was lost (tools/soak_oracle.py
        --writers 2)."""
        cache = self._ix._directories
        for rid, values, begins, began_at, cursor in held:
            if begins and cursor is None:
                cache.hold_values(rid, values)  # a whole run at once (a flush's)
                continue
            grow = self._growing.pop(rid, None)
            if grow is not None and grow[2] != began_at:
                cache.let_go(rid)  # other steps came between
                grow = None
            if begins and cache.warm:
                grow = (np.empty(max(len(values), 1 << 16), np.uint64), 0, b"")
            if grow is None:
                continue
            buf, n, _ = grow
            if n + len(values) > len(buf):
                buf = np.concatenate([buf[:n], np.empty(max(len(buf), len(values)), np.uint64)])
            buf[n:n + len(values)] = values
            n += len(values)
            # Past the limit the output is held no more, and grows no more here.
            if (not n or cache.hold_values(rid, buf[:n], cursor)) and cursor is not None:
                self._growing[rid] = (buf, n, cursor)

    # -- flush ------------------------------------------------------------------

    def _flush(self, snap) -> None:
        snap.count_before_flush()  # len() after the flush then starts from it
        ix = self._ix
        log = snap.log
        man = _copy_manifest(snap.manifest)
        puts, deletes = [], []
        adds = log.adds
        first_new = man.next_run_id
        main = levels.largest_main_level(man, len(ix.plan.tables))
        # Tombstones: the log's removals join them, its additions leave them
        # (searched among the additions, fewer than the tombstones).
        t_fps, t_stamps = snap.tombstones, snap.tombstone_stamps
        back = adds[isin_sorted(adds, t_fps)]
        fps, stamps = t_fps, t_stamps
        if not ix._levels_tombstones and (len(back) or len(log.removes)):
            # A file before format 5 rewrites its one tombstone run with them.
            keep = ~isin_sorted(t_fps, back)
            fps = np.concatenate([t_fps[keep], log.removes])
            stamps = np.concatenate([t_stamps[keep],
                                     np.full(len(log.removes), first_new, np.uint32)])
            fps, stamps = _newest_tombstones(fps, stamps)

        def hiding(run_id: int) -> np.ndarray:
            """The tombstones after the flush that hide values of run run_id:
            those stamped after it, the log's removals among them."""
            if not ix._levels_tombstones:
                return fps[stamps > run_id]
            newer = t_fps[t_stamps > run_id]
            if len(back):
                newer = newer[~isin_sorted(newer, back)]
            return merge_unique([newer, log.removes])
        # A flush goes to level 1 or level 0 (levels.flush_target), unless it is
        # larger than any raw level may hold: then it is a main run of its own.
        level = 0 if len(adds) <= levels.top_share(main, ix.log_limit) else levels.MAIN_LEVEL
        kind = levels.kind_of(level)

        def table_run(job):
            """A table's new run: (chunk pairs, entries, first value, last value, code).
            Its heavy parts (permute, sort, decode, merge, encode) release the GIL."""
            t, design, _, into, rid = job
            values = np.sort(design.apply(adds))
            if into is not None:
                # A tombstone stamped s hides runs older than s: of the
                # level-1 run's values, only those stamped after it can.
                newer = hiding(into.run_id)
                hidden = np.sort(design.apply(newer)) if len(newer) else EMPTY_U64
                values = merge_unique([values, rn.read_values(snap.view, into).values], hidden)
            code = codec.HuffmanCode.from_values(values, ix.coding) if kind == KIND_HUFFMAN \
                else None
            pairs, n, last = rn.build_fp_chunks(t, rid, kind, values, code, None, True,
                                                packed=ix._packs_raw)
            return pairs, n, int(values[0]), last, code, values

        # The tables' runs are built side by side on the merge threads (550
        # of the compaction thread's 3,432 samples in a 30M stream went to
        # building them one after another), then put into the manifest in
        # table order.
        jobs = [(t, design, *levels.flush_target(man, t, level, ix.log_limit), man.new_run_id())
                for t, design in enumerate(ix.plan.tables)] if len(adds) else []
        built = self._map(table_run, jobs)
        held = [(rid, values, True, b"", None)
                for (_, _, _, _, rid), (*_, values) in zip(jobs, built) if kind == KIND_RAW]
        for (t, _, run_level, into, rid), (pairs, n, first, last, code, _) in zip(jobs, built):
            at = 0
            if into is not None:
                deletes += rn.chunk_keys(snap.view, into)
                at = man.runs.index(into)
                man.runs.remove(into)
            puts += pairs
            man.runs.insert(at, Run(t, kind, run_level, rid, n, len(pairs),
                                    sum(len(v) for _, v in pairs), first, last,
                                    code=code.to_bytes() if code else b""))
        for space, (raw, count) in _space_records(log.ops.streams()).items():
            rid = man.new_run_id()
            pairs = ch.pack_record_stream(space, rid, raw, None, True)
            puts += pairs
            man.runs.insert(0, Run(space, KIND_RECORDS, 0, rid, count, len(pairs),
                                   sum(len(v) for _, v in pairs)))
        if ix._levels_tombstones:
            puts_t, deletes_t = self._flush_tombstones(snap, man, back, log.removes, first_new)
        else:
            # A tombstone no run can hold any more goes (see _droppable).
            alive = stamps > _min_fp_run_id(man)
            if not alive.all():
                fps, stamps = fps[alive], stamps[alive]
            puts_t, deletes_t = self._tombstone_chunks(snap, man, fps, stamps) \
                if fps is not t_fps and not np.array_equal(fps, t_fps) else ([], [])
        puts += puts_t
        deletes += deletes_t
        self._commit(snap, puts, deletes, man, log_done=snap.state.log_next_seq,
                     log_ops_done=snap.state.log_ops, held=held)

    def _tombstone_chunks(self, snap, man: Manifest, fps, stamps):
        """(puts, deletes) replacing every tombstone run with one of fps (a file
        before format 5, [M3]), or with none if fps is empty."""
        deletes = [k for r in man.of(SPACE_TOMBSTONES) for k in rn.chunk_keys(snap.view, r)]
        run, puts = self._tombstone_run(man, fps, stamps) if len(fps) else (None, [])
        man.replace(SPACE_TOMBSTONES, [run] if run is not None else [])
        return puts, deletes

    def _tombstones_droppable(self, man: Manifest, stamps) -> bool:
        return bool(len(stamps)) and bool(np.any(stamps <= _min_fp_run_id(man)))

    def _rewrite_tombstones(self, snap) -> None:
        man = _copy_manifest(snap.manifest)
        alive = snap.tombstone_stamps > _min_fp_run_id(man)
        puts, deletes = self._tombstone_chunks(snap, man, snap.tombstones[alive],
                                               snap.tombstone_stamps[alive])
        self._commit(snap, puts, deletes, man)

    # -- tombstone runs (format 5) ----------------------------------------------------

    def _flush_tombstones(self, snap, man: Manifest, back, removes, stamp: int):
        """(puts, deletes) of a flush's tombstones in a file of several
        tombstone runs: the log's removals become a new run of their own,
        stamped `stamp`; a run holding a fingerprint the log adds back is
        rewritten without it (a tombstone hides a fingerprint in every run,
        [Q1]); a run no table can hold anything of any more goes.  A flush
        so writes a run the size of its removals, not every tombstone again
        (which, 1-2M of them in a churned 10M file, made each flush's
        commit three times its size: bench_churn_commits.py)."""
        floor = _min_fp_run_id(man)
        runs, puts, deletes = [], [], []
        if len(removes) and stamp > floor:  # else no run is left that could hold them
            run, pairs = self._tombstone_run(man, removes, np.full(len(removes), stamp, np.uint32))
            puts += pairs
            runs.append(run)
        for run in man.of(SPACE_TOMBSTONES):
            fps, stamps = snap.tombstone_run_arrays(run)
            hit = isin_sorted(fps, back) if len(back) else None
            if int(stamps.max()) <= floor:
                deletes += rn.chunk_keys(snap.view, run)  # every tombstone outdated
            elif hit is not None and hit.any():
                deletes += rn.chunk_keys(snap.view, run)
                keep = ~hit & (stamps > floor)
                if keep.any():
                    rewritten, pairs = self._tombstone_run(man, fps[keep], stamps[keep])
                    puts += pairs
                    runs.append(rewritten)
            else:
                runs.append(run)
        man.replace(SPACE_TOMBSTONES, runs)
        return puts, deletes

    def _tombstone_round(self, snap) -> bool:
        """Merge, rewrite or drop tombstone runs when levels.tombstone_inputs says so,
        in one commit; whether it did."""
        runs = list(snap.tombstone_runs)
        arrays = [snap.tombstone_run_arrays(r) for r in runs]
        man = _copy_manifest(snap.manifest)
        floor = _min_fp_run_id(man)
        main = levels.largest_main_level(man, len(self._ix.plan.tables))
        chosen = levels.tombstone_inputs(runs, [a[1] for a in arrays], floor,
                                         levels.tombstone_cap(main, self._ix.log_limit))
        if not chosen:
            return False
        fps, stamps = rn.union_tombstones([arrays[i] for i in chosen])
        alive = stamps > floor
        deletes = [k for i in chosen for k in rn.chunk_keys(snap.view, runs[i])]
        kept = [r for i, r in enumerate(runs) if i not in chosen]
        puts, new = [], []
        if alive.any():
            run, puts = self._tombstone_run(man, fps[alive], stamps[alive])
            kept.insert(min(chosen), run)
            new.append((run, (fps[alive], stamps[alive])))
        man.replace(SPACE_TOMBSTONES, kept)
        self._commit(snap, puts, deletes, man)
        self._ix._tombstones.carry(tuple(runs), tuple(kept), new, snap.state.log_first_seq)
        return True

    @staticmethod
    def _tombstone_run(man: Manifest, fps, stamps) -> tuple:
        """(Run, chunk pairs) of a new tombstone run of sorted fps and their stamps."""
        rid = man.new_run_id()
        puts = ch.pack_tombstone_chunks(SPACE_TOMBSTONES, rid, fps, stamps)
        return Run(SPACE_TOMBSTONES, KIND_TOMBSTONES, 0, rid, len(fps), len(puts),
                   sum(len(v) for _, v in puts), int(fps[0]), int(fps[-1])), puts

    # -- fingerprint merges ---------------------------------------------------------

    def _fp_merge_step(self, snap, man: Manifest, space: int, output: Run, inputs: list):
        """Advance a merge of a table's runs by one step; return (puts, deletes, runs gone).

        Changes only the Run objects of this merge (safe beside other spaces'
        steps on other threads).
        """
        began_at = output.cursor
        cursor = int.from_bytes(output.cursor, "big") if output.cursor else None
        begins = not output.chunks
        # The largest input first: its STEP_CHUNKS chunks span the narrowest
        # range of keys, and the others are read only as far (a step keeps
        # what every input covers; a third of what steps decoded went back).
        slices, stop = [None] * len(inputs), None
        for i in sorted(range(len(inputs)), key=lambda i: -inputs[i].entries):
            slices[i] = rn.read_values(snap.view, inputs[i], cursor, STEP_CHUNKS, stop)
            if stop is None and not slices[i].exhausted:
                stop = slices[i].end
        parts = [sl.values for sl in slices]
        ends = [None if sl.exhausted else sl.end for sl in slices]
        read_chunks = [sl.chunk_keys for sl in slices]
        bounds = [e for e in ends if e is not None]
        final = not bounds
        bound = min(bounds) if bounds else None
        if bound is not None:
            parts = [p[:np.searchsorted(p, np.uint64(bound), side="right")] for p in parts]
        # Tombstones are dropped as they pass; the log's removals need not be.
        # Only those in the step's range (cursor, bound] can match: taken
        # from each run's sorted tombstones, which are made once a run (a
        # flush's new run costs its own size, not every tombstone's again).
        hidden = []
        for run_hidden in snap.tombstone_table_parts(space):
            hidden.append(run_hidden[
                np.searchsorted(run_hidden, np.uint64(cursor), side="right")
                if cursor is not None else 0:
                np.searchsorted(run_hidden, np.uint64(bound), side="right")
                if bound is not None else len(run_hidden)])
        merged = merge_unique(parts, merge_unique(hidden))
        if output.kind == KIND_HUFFMAN and not output.code:
            # The code is chosen once, from the first values the merge writes:
            # every part of the key space has the same gap distribution.
            total = sum(r.entries for r in inputs)
            output.code = codec.HuffmanCode.from_values(merged, self._ix.coding,
                                                        expected_n=max(total, 2)).to_bytes()
        code = rn.run_code(output)
        # The next chunk's fence is the last value written, which the
        # cursor (what the inputs gave up) may lie beyond.
        low = output.last if output.chunks else None
        pairs, written, last = rn.build_fp_chunks(space, output.run_id, output.kind, merged,
                                                  code, low, final, whole_chunks_only=not final,
                                                  packed=self._ix._packs_raw)
        if not final and not written and len(merged):
            # Less than a chunk's worth up to the bound: write it as a short
            # chunk rather than make no progress.
            pairs, written, last = rn.build_fp_chunks(space, output.run_id, output.kind, merged,
                                                      code, low, False, packed=self._ix._packs_raw)
        if final:
            done = (1 << 64) - 1
        else:
            # Input values up to `done` are consumed: up to the last value
            # written, or up to the bound when the step kept nothing.
            done = last if written else bound
            if cursor is not None and done <= cursor:
                raise RuntimeError(f"merge into run {output.run_id} made no progress")
        deletes = []
        for run, keys in zip(inputs, read_chunks):
            gone = [k for k in keys if int.from_bytes(k[5:], "big") <= done]
            deletes += gone
            run.chunks -= len(gone)
        if written:
            if not output.chunks:
                output.first = int(merged[0])
            output.entries += written
            output.chunks += len(pairs)
            output.value_bytes += sum(len(v) for _, v in pairs)
            output.last = last
        removed = []
        if final:
            if not written and output.chunks:
                pairs = [_last_chunk_marked(snap, ch.fp_chunk_key(space, output.run_id,
                                                                  output.last))]
            seen = set(deletes)
            for r in inputs:
                deletes += [k for k in rn.chunk_keys(snap.view, r) if k not in seen]
                removed.append(r)
            output.flags, output.merge_into, output.cursor = 0, 0, b""
            if not output.chunks:
                removed.append(output)
        else:
            output.cursor = done.to_bytes(8, "big")
            for r in inputs:
                r.cursor = output.cursor
        if output.kind != KIND_RAW:
            return pairs, deletes, removed
        # What the step wrote of a raw output, for Compactor._hold.
        wrote = merged[:written] if written else EMPTY_U64
        return pairs, deletes, removed, (output.run_id, wrote, begins, began_at,
                                         None if final else output.cursor)

    # -- record merges ---------------------------------------------------------

    def _record_merge_step(self, snap, man: Manifest, space: int, output: Run, inputs: list):
        """Advance a merge of a record space's runs by one step (see _fp_merge_step).

        The inputs' sub-blocks are read raw and merged in C (newest run
        first wins a key); the output is cut into new chunks.
        """
        cursor = output.cursor if output.cursor else None
        start = cursor + b"\0" if cursor else b""
        raws, ends, read = [], [], []
        for run in inputs:
            cs = rn.record_chunks(snap.view, run, start, STEP_CHUNKS, exclusive=True)
            raws.append(b"".join(bytes(c.raw_block(i)) for c in cs for i in range(len(c.blocks))))
            ends.append(None if not cs or cs[-1].flags & ch.FLAG_LAST else cs[-1].separator)
            read.append(cs)
        bounds = [e for e in ends if e is not None]
        final = not bounds
        bound = min(bounds) if bounds else None
        # Deletions matter only while an older run might hold the key.
        bottom = all(r.run_id in {i.run_id for i in inputs} or r.run_id == output.run_id
                     for r in snap.manifest.of(space))
        merged, count = _core.records_merge(raws, cursor, bound, bottom)
        low = output.fence if output.chunks else None
        pairs = ch.pack_record_stream(space, output.run_id, merged, low, final) if count else []
        deletes = []
        for run, cs in zip(inputs, read):
            gone = [c for c in cs if final or c.separator <= bound]
            deletes += [c.key for c in gone]
            run.chunks -= len(gone)
        output.entries += count
        output.chunks += len(pairs)
        output.value_bytes += sum(len(v) for _, v in pairs)
        if pairs:
            output.fence = pairs[-1][0][5:]
        removed = []
        if final:
            if not pairs and output.chunks:
                pairs = [_last_chunk_marked(snap, ch.run_prefix(space, output.run_id)
                                            + output.fence)]
            seen = set(deletes)
            for r in inputs:
                deletes += [k for k in rn.chunk_keys(snap.view, r) if k not in seen]
                removed.append(r)
            output.flags, output.merge_into, output.cursor, output.fence = 0, 0, b"", b""
            if not output.chunks:
                removed.append(output)
        else:
            # Everything up to the bound is consumed; the output's last
            # separator lies at or below it.
            output.cursor = bound
            for r in inputs:
                r.cursor = output.cursor
        return pairs, deletes, removed


def _last_chunk_marked(snap, key: bytes) -> tuple:
    """(key, value) of a merge output's last written chunk, marked the run's last.

    A merge's final step writes the chunk that ends the run; when every value
    left for it was removed (tombstones, deleted records) it has nothing to
    write, and the chunk an earlier step wrote must end the run instead.
    (Before this, the run had no last chunk: every later read of it failed.)
    """
    value = snap.view.get(DB_CHUNKS, key)
    if value is None:
        raise CorruptionError("a merge output's last chunk is missing", database=DB_CHUNKS,
                              key=key)
    return key, ch.marked_last(key, value)


#: A flush's tombstones, one a fingerprint (a name of its own: a test
#: stands in a writer from before it for this).
_newest_tombstones = rn.newest_tombstones


def _min_fp_run_id(man: Manifest) -> int:
    """The smallest run id among fingerprint runs (tables); tombstones stamped at or
    below it are held by no run any more."""
    ids = [r.run_id for r in man.runs if r.space < SPACE_TOMBSTONES]
    return min(ids) if ids else man.next_run_id


def _copy_manifest(man: Manifest) -> Manifest:
    """A copy a step may change (runs are flat dataclasses of immutable fields)."""
    return Manifest(man.generation, man.next_run_id, [dataclasses.replace(r) for r in man.runs])


def _find(man: Manifest, run_id: int) -> Run:
    for r in man.runs:
        if r.run_id == run_id:
            return r
    raise KeyError(run_id)


def _space_records(streams: dict) -> dict:
    """The log's record operations as new runs' records: {space: (raw stream, count)}.

    streams: the log's net operations per space (sorted raw record
    streams).  Lookup-key records are derived from the document records
    ([D2]).
    """
    runs = {space: (raw, len(_core.records_offsets(raw)) // 8)
            for space, raw in streams.items() if space != SPACE_LOOKUP}
    docs = streams.get(SPACE_DOCS, b"")
    lookups = streams.get(SPACE_LOOKUP, b"")
    if docs or lookups:
        raw = docstore.lookup_records(_core.records_unpack(docs), _core.records_unpack(lookups))
        runs[SPACE_LOOKUP] = (raw, len(raw) // (ch.RECORD_HEAD.size + 16))
    return dict(sorted(runs.items()))
