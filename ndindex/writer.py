"""Writing an index: add, remove, transactions, durability and the journal.

Every write reaches the file as one *log record* (FORMAT.md 7.5) appended
in one LMDB transaction, with the state record rewritten beside it; nothing
in a write depends on the size of the index, and compaction never runs
inside one (it runs in the background, :mod:`ndindex.compaction`).

Three ways a write reaches the log:

- durability="full" (the default), no transaction: each call commits its
  own record and returns when it is on disk.
- ``with ix.transaction():`` any number of calls gather into one pending
  record, seen by this index's queries at once and committed (durably, in
  full mode) when the block ends; an exception discards them.
- durability="normal": calls gather into the pending record and are
  appended to this writer's journal (:mod:`ndindex.journal`) with one
  write() each; a checkpoint commits them every ``CHECKPOINT_SECONDS``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time

import numpy as np

from ndindex import _core
from ndindex import journal as jr
from ndindex.arrays import EMPTY_U64, sorted_unique
from ndindex.errors import ClosedError, interrupts_deferred
from ndindex.overlay import PendingOps
from ndindex.records import (DB_LOG, DB_META, KEY_HEADER, KEY_STATE, U64_BE, LogRecord, State,
                             frame, log_padding, read_meta, unframe)
from ndindex.store import translate_error
from ndindex.threadpool import Wakeup, start_thread


def log_ops(record: LogRecord) -> int:
    return record.ops()


def commit_record(wt, record: LogRecord, extra=(), pad: bool = False) -> State:
    """Append record to the log inside write transaction wt; rewrite the state.

    extra: more (key, payload) meta records to write in the same commit;
    pad: pad the record as format 5 writers do (records.log_padding).
    """
    state = read_meta(wt.view, KEY_STATE, State)
    key = U64_BE.pack(state.log_next_seq)
    payload = record.pack()
    if pad:
        payload += bytes(log_padding(len(payload), wt.view.psize))
    wt.put(DB_LOG, key, frame(key, payload))
    state.log_next_seq += 1
    state.log_ops += log_ops(record)
    state.txnid = wt.txnid
    for k, payload in extra:
        wt.put_framed(k, payload)
    wt.put_framed(KEY_STATE, state.pack())
    return state


class _Transaction(_core.Block):
    """A transaction block (Writer.transaction); as a decorator, each call of
    the function runs in one (as a contextlib context manager's did)."""

    def __call__(self, func):
        @functools.wraps(func)
        def in_a_transaction(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return in_a_transaction


class Writer:
    """The write side of one open Index (thread-safe; one writer lock)."""

    def __init__(self, index, durability: str):
        self._ix = index
        self.durability = durability
        self.lock = threading.RLock()
        self.pending: PendingOps | None = PendingOps(self.lock) if durability == "normal" else None
        self._txn_depth = 0
        self._undo = None             # the outermost block's undo (durability normal)
        self._savepoints: list = []   # the pending set as each nested block began
        self.journal = None
        self.closed = False   # close() done
        self._checkpointed = 0  # the journal's offset the last checkpoint covers
        self._checkpoint_wanted = False  # the checkpoint thread found the lock taken
        self._in_place_at = -jr.CHECKPOINT_SECONDS  # when the file last bore its name
        self._stop = Wakeup()  # set in close(): see threadpool
        self._thread = None
        if durability == "normal":
            self.journal = jr.Journal(index.path, index.file_id)
            try:
                start_thread(self._checkpoint_loop, "ndindex-checkpoint",
                             keep=functools.partial(setattr, self, "_thread"))
            except BaseException:
                self.abandon()
                raise

    # -- what readers see --------------------------------------------------------

    def visible_pending(self) -> PendingOps | None:
        p = self.pending
        return p if p else None

    # -- operations ------------------------------------------------------------

    def apply(self, record: LogRecord) -> None:
        """Make record's operations happen: commit now, or pend (transaction / normal)."""
        if not log_ops(record):
            return
        with self.lock:
            if self.pending is None:
                self._commit(record)
                return
            if self.journal is None or self._txn_depth:
                self.pending.apply(record)  # a transaction's: an exception discards them all
                return
            # The journal first: an operation it did not take (a full disk)
            # is not acknowledged, so it must not join the pending
            # operations, which the next checkpoint commits.
            try:
                self._append_journal(record)
                self.pending.apply(record)
            except BaseException:
                # The record whole, if the journal took it; Ctrl-C held back
                # meanwhile: a second one in the rebuild left the half-applied
                # set in place (sweep_interrupt, seed 12 run 73).
                with interrupts_deferred():
                    self._pending_from_journal()
                raise
            self._checkpoint_if_due()

    def _checkpoint_if_due(self) -> None:
        """Checkpoint here, the lock held outside a transaction, when the
        pending set is large or the checkpoint thread found the lock taken
        (see _checkpoint_loop)."""
        if self._checkpoint_wanted or len(self.pending) >= 1 << 16:
            self._checkpoint_wanted = False
            self.checkpoint()

    def add_one_locked(self, fp: int, pairs: list) -> None:
        """apply() of one added fingerprint (with its (fp, key) pairs), the
        lock held: check_and_add's write.  Inside a transaction it only joins
        the pending set, without building a log record: that is most of a
        pended call's cost."""
        if self._txn_depth and not pairs:
            self.pending.add_one(fp)
        else:
            self.apply(LogRecord(np.array([fp], dtype=np.uint64), EMPTY_U64, pairs, []))

    def _append_journal(self, record: LogRecord) -> None:
        # As a commit does (Store.write): a journal beside a deleted or moved
        # file would acknowledge what no later open replays.  Once every
        # CHECKPOINT_SECONDS, the window normal durability has anyway: the
        # stat per call cost 4 us of a check_and_add's 14 (72,000 items/s ->
        # 56,000 in a scratch run).
        now = time.monotonic()
        if now >= self._in_place_at + jr.CHECKPOINT_SECONDS:
            self._ix._store.check_in_place()
            self._in_place_at = now
        try:
            self.journal.append(record.pack())
        except OSError as exc:
            raise translate_error(exc, self.journal.path) from exc

    def _commit(self, record: LogRecord, extra=()) -> None:
        self._ix._wrote(*self._write(record, extra))

    def _write(self, record: LogRecord, extra=()) -> tuple:
        """Commit record; (state, began) for Index._wrote, which may wait
        (backpressure) and so is left to the caller."""
        began = time.monotonic()
        pad = self._ix._pads_log
        return self._ix._store.write(lambda wt: commit_record(wt, record, extra, pad),
                                     sync=True), began

    def transaction(self, binds=None):
        """A with block grouping the calls made inside it into one commit (see
        Index.transaction); the with statement binds `binds`.

        The block's beginning and end are C (_core.Block): the writer's lock
        is taken as it begins and let go as it ends, and both run with
        Ctrl-C held back from their first instruction, so Ctrl-C lands before
        the block, inside it (the end then undoes it) or after it.  As a
        contextlib generator, with the hold begun by a Python call, it could
        land in between: a Ctrl-C as contextlib's __exit__ began left the lock
        held and the block counted until the generator was collected, and
        one as the end of a failed block began left it counted for ever
        (every later call pending, never committed: sweep_interrupt_points,
        a savepoint's block, 1 point in 400).  Before that, with no hold at
        all, a Ctrl-C there left a durability="normal" block's operations
        pending and in no journal (sweep_interrupt seeds 17 and 18).
        """
        return _Transaction(self.lock, functools.partial(self._begin_block, binds),
                            self._end_block)

    def _begin_block(self, binds):
        if self._txn_depth == 0:
            if self.pending is None:
                self.pending = PendingOps(self.lock)
                self._undo = None
            else:
                self._undo = self.pending.copy()
        else:
            # A nested block is a savepoint (SQLite's SAVEPOINT, an LMDB
            # child transaction): an exception in it undoes its own
            # operations, and the enclosing block goes on without them if it
            # catches the exception.
            self._savepoints.append(self.pending.copy())
        self._txn_depth += 1
        return binds

    def _end_block(self, exc_type, exc, tb) -> bool:
        if self._txn_depth == 0:
            # close() inside the block rolled it back (see close()).
            if exc_type is None:
                raise ClosedError(f"{self._ix.path}: index is closed")
            return False
        self._txn_depth -= 1
        if exc_type is None:
            if self._txn_depth:
                self._savepoints.pop()
                return False
            wrote = self._end_transaction()
            if wrote is not None:
                self._ix._wrote(*wrote)
            return False
        if self._txn_depth:
            self.pending = self._savepoints.pop()
        else:
            self._discard()
        return False

    def _discard(self) -> None:
        if self.journal is None:
            self.pending = None
        else:
            self.pending = self._undo
        self._undo = None

    def _end_transaction(self) -> tuple | None:
        """Commit the outermost block (full durability: returns what
        Index._wrote takes) or journal its net effect (normal)."""
        if self.journal is None:
            # Commit before letting go of the pending set: a query in
            # another thread reads the pending set, then the snapshot.
            try:
                return self._write(self.pending.to_record())
            finally:
                self.pending = None
        # Normal durability: the transaction's net effect is one journal record.
        undo, self._undo = self._undo, None
        try:
            delta = _difference(undo, self.pending)
            if log_ops(delta):
                self._append_journal(delta)
        except BaseException:
            self._pending_from_journal(undo)  # discarded, unless the journal took it
            raise
        self._checkpoint_if_due()
        return None

    @property
    def in_transaction(self) -> bool:
        return self._txn_depth > 0

    # -- checkpoints (normal durability) -----------------------------------------

    def checkpoint(self) -> None:
        """Commit the journaled operations into the index file, durably."""
        with self.lock:
            if self.journal is None or self._txn_depth:
                return
            p = self.pending
            if not len(p):
                return
            record = p.to_record()
            # Ctrl-C held back from the commit to the new offsets: cut in
            # between, the pending set, the journal and _checkpointed
            # disagreed, and the rebuild after a later interrupted call read
            # the journal from a stale offset (past a rotation's end: the
            # acknowledged operations since were lost; sweep_interrupt seed 14).
            with interrupts_deferred():
                self._commit(record, extra=[(jr.journal_key(self.journal.journal_id),
                                             self.journal.position())])
                self.pending = PendingOps(self.lock)
                self._checkpointed = self.journal.offset
                self.journal.rotate_if_large()
                self._checkpointed = self.journal.offset  # 0 after a rotation

    def _pending_from_journal(self, fallback: PendingOps | None = None) -> None:
        """The pending operations as the journal holds them: its records past the
        last checkpoint, applied in order.

        Outside a transaction the journal is what normal durability
        promises, and the pending set a copy of it in memory.  An exception
        (KeyboardInterrupt above all: Ctrl-C lands between any two calls)
        can stop an append after its write, or the pending set halfway
        through a record: the set then held part of a record, and the next
        checkpoint committed that part.  Rebuilt so after any exception (a
        full disk's too: the journal then lacks the record), the call is all
        (the journal took it) or nothing.  If the journal cannot be read,
        fallback (if given) stands in.
        """
        try:
            key = jr.journal_key(self.journal.journal_id)
            pending = PendingOps(self.lock)
            for payload in self.journal.records_after(self._checkpointed):
                pending.apply(LogRecord.unpack(payload, key))
        except Exception:  # noqa: BLE001 - the caller's exception is the one to raise
            if fallback is not None:
                self.pending = fallback
            return
        self.pending = pending

    def _checkpoint_loop(self) -> None:
        # With the lock taken, the writer checkpoints as it ends its call
        # (_checkpoint_if_due): this thread does not wait for it.  Waiting,
        # it lost the lock to a writer that takes it again microseconds
        # after letting go (a loop of small transactions: no checkpoint for
        # 0.7 s at a time, the pending set, which each block copies,
        # growing), and every release woke it to compete for the GIL: other
        # threads of the program waited 0.4 s for it (median) where they
        # wait 5 ms.
        while not self._stop.wait(jr.CHECKPOINT_SECONDS):
            if not self.lock.acquire(blocking=False):
                self._checkpoint_wanted = True
                continue
            try:
                self.checkpoint()
            except ClosedError:
                return
            except Exception:  # noqa: BLE001 - the next call reports it; the journal keeps the data
                continue
            finally:
                self.lock.release()

    def sync(self) -> None:
        """Make every acknowledged operation durable (checkpoint, then flush)."""
        self.checkpoint()
        self._ix._store.sync()

    def stop_checkpoints(self, timeout: float | None = None) -> bool:
        """Stop the checkpoint thread; whether it ended within timeout (it
        holds the writer lock during a checkpoint)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def abandon(self) -> None:
        """Stop checkpointing and delete the journal, unread: for an open that
        failed before this writer took any operation."""
        self.stop_checkpoints()
        if self.journal is not None:
            self.journal.close(delete=True)

    def close(self) -> None:
        """Stop checkpointing; commit what the journal holds and delete it
        (with the file closed already, by an interrupted Index.close(), keep
        it for the next writer's open to replay).

        Called inside a transaction block of this thread, it rolls the block
        back first (as SQLite's close does; the block's end then raises
        ClosedError): a checkpoint here committed the half-done block, under
        durability "normal".  (Another thread's close() waits for the
        block's end under durability "normal", and under "full" leaves the
        block to fail as it commits.)"""
        self.stop_checkpoints()
        if self._txn_depth and self.lock._is_owned():
            self._txn_depth = 0
            self._savepoints.clear()
            self._discard()
        if self.journal is not None and self._ix._store._env is None:
            with self.lock:    # not under a transaction's append
                self.journal.close(delete=False)
        elif self.journal is not None:
            try:
                with self.lock:    # another thread's block ends first
                    if not self.pending and not self._ix._store.in_place():
                        # The file was deleted or moved (every write refused
                        # since): nothing to commit, nowhere to commit it.
                        self.journal.close(delete=True)
                        return
                    self.checkpoint()
                    key = jr.journal_key(self.journal.journal_id)
                    self._ix._store.write(lambda wt: _drop_meta(wt, key), sync=True)
                self.journal.close(delete=True)
            except Exception:
                self.journal.close(delete=False)  # replayed by the next writer
                raise
        self.closed = True


def _stamp_state(wt) -> None:
    """Rewrite the state with this transaction's id ([F9]): a commit that
    appends no log record still names itself there."""
    state = read_meta(wt.view, KEY_STATE, State)
    state.txnid = wt.txnid
    wt.put_framed(KEY_STATE, state.pack())


def put_header(wt, header) -> None:
    """Rewrite the header record (``ndindex upgrade``'s change of block coding),
    and the state with this transaction's id."""
    wt.put_framed(KEY_HEADER, header.pack())
    _stamp_state(wt)


def _drop_meta(wt, key: bytes) -> None:
    wt.delete(DB_META, key)
    _stamp_state(wt)


def _difference(before: PendingOps, after: PendingOps) -> LogRecord:
    """The operations that turn `before` into `after` (a transaction's net effect)."""
    adds, removes, changed = after.changes_since(before)
    puts, deletes, records = changed.to_record_parts()
    return LogRecord(adds, removes, puts, deletes, records)


def replay_journals(index) -> int:
    """Commit the journals of dead normal-durability writers; return operations replayed."""
    store = index._store
    total = 0
    for path, journal_id, generation, records in jr.orphans(index.path, index.file_id):
        if journal_id is None:
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        key = jr.journal_key(journal_id)

        def body(wt, key=key, generation=generation, records=records):
            raw = wt.view.get(DB_META, key)
            done_gen, done_off = jr.unpack_position(unframe(raw, DB_META, key)) if raw is not None \
                else (-1, 0)
            acc = PendingOps()
            for end, payload in records:
                if generation == done_gen and end <= done_off:
                    continue
                acc.apply(LogRecord.unpack(payload, key))
            record = acc.to_record()
            n = log_ops(record)
            if n:
                commit_record(wt, record, pad=index._pads_log)
            else:
                _stamp_state(wt)
            if raw is not None:
                wt.delete(DB_META, key)
            return n

        total += store.write(body, sync=True)
        with contextlib.suppress(OSError):
            os.unlink(path)
    return total


def distinct(fps: np.ndarray) -> np.ndarray:
    return sorted_unique(fps) if len(fps) else EMPTY_U64
