"""Index: the single-file near-duplicate index (add, query, remove, compact).

An index file (format-spec/FORMAT.md) holds, for each of t permuted tables,
a few sorted runs of 1 KB Huffman-delta blocks; an append log of the
operations since the last flush; tombstones of removed fingerprints; and
the document keys of each fingerprint as sorted record runs.  This class is
the public face: opening, closing and the snapshots its calls read are
here, and its methods in five mixins — :mod:`ndindex.index_queries` (query,
query_many, keys), :mod:`ndindex.index_writes` (add, check_and_add, remove,
transaction), :mod:`ndindex.index_documents` (documents),
:mod:`ndindex.index_contents` (fingerprints, items, iter_chunks) and
:mod:`ndindex.index_maintenance` (compact, vacuum, stats, verify).  The work
is done by:

- :mod:`ndindex.reader` — snapshots and queries (the C kernel probes every
  table's runs in place in the mapped file);
- :mod:`ndindex.writer` — add/remove, transactions, durability, the journal;
- :mod:`ndindex.compaction` — flushes and merges, in a background thread,
  by the run layout of :mod:`ndindex.levels`;
- :mod:`ndindex.checker` — verify();
- :mod:`ndindex.locks` — the compaction lease and the open lock;
- :mod:`ndindex.store` — the LMDB file, read through our own page reader.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import weakref

import numpy as np

from ndindex import _core, codec, compaction, docstore, levels, locks, pages, plan as plans, \
    records as rec, store as st, validate
from ndindex.arrays import EMPTY_U64
from ndindex.codec import CODING_RESTARTS
from ndindex.dircache import DirectoryCache
from ndindex.errors import CorruptionError, FormatError, NdindexError, interrupts_deferred
from ndindex.index_contents import ContentMethods
from ndindex.index_documents import DocumentMethods
from ndindex.index_maintenance import MaintenanceMethods
from ndindex.index_queries import MATCH_DTYPE, Match, QueryMethods
from ndindex.index_writes import WriteMethods
from ndindex.reader import WARM_QUERIES, CountMemo, Snapshot, TombstoneMemo
from ndindex.reaper import REAPER
from ndindex.records import Header, Manifest, State
from ndindex.writer import Writer, replay_journals

#: The public names (Match and MATCH_DTYPE live in index_queries).
__all__ = ["Index", "Match", "MATCH_DTYPE", "open"]


class Index(QueryMethods, WriteMethods, DocumentMethods, ContentMethods, MaintenanceMethods):
    """A near-duplicate index in one file.  Open with :meth:`create` or :meth:`open`.

    Use it as a context manager, or call :meth:`close`.  Any number of
    threads may share one Index; any number of processes may open the same
    file (LMDB opens a file once per process: share the Index object within
    one).
    """

    def __init__(self, store: st.Store, lock_file, header: Header, plan: plans.Plan, *,
                 durability: str, background_compaction: bool, log_limit: int):
        self._store = store
        self._header = header
        self.plan = plan
        self._snap: Snapshot | None = None
        self._lineage = None   # the last snapshot's, once let go of (_let_go_of_snapshot)
        self._snap_lock = threading.Lock()
        self._uses = 0   # snapshot requests, for the idle-snapshot reaper
        self._directories = DirectoryCache()  # run id -> run directory capsule (see dircache)
        self._counts = CountMemo()  # the newest count, for len() to start from
        self._tombstones = TombstoneMemo()  # the tombstone run's arrays, across snapshots
        self._queries = 0  # until reader.WARM_QUERIES, only small runs are listed
        self._pool = None   # query_many's threads, made at its first large batch
        self._pool_lock = threading.Lock()  # close() in another thread: see _batch_pool
        self._psize = store.filemap.psize
        self._meta = pages.meta_words(store.filemap.buffer(2 * self._psize))
        # Where each meta page's txnid lies, as a word of _meta.
        self._txnid_words = (pages.META_TXNID_OFFSET // 8,
                             (self._psize + pages.META_TXNID_OFFSET) // 8)
        self._lock_file = lock_file  # holds the shared open lock (locks.open_locked)
        if not store.readonly:
            # What a killed build (create, vacuum, recover, dedup) left
            # would stay for ever.
            st.clear_build_leftovers(store.path)
        self.log_limit = log_limit
        self._writer = None
        self._compactor = None
        if not store.readonly:
            replay_journals(self)
        # The writer's journal (locked) and threads, made with Ctrl-C held
        # back and taken back if the open fails: an Index that never came to
        # be left them for the life of the process, the journal locked (so
        # never deleted) and the threads working on a closed file.
        try:
            with interrupts_deferred():
                if not store.readonly:
                    self._writer = Writer(self, durability)
                    self._compactor = compaction.Compactor(self, background_compaction)
                self._finalizer = weakref.finalize(self, _close_quietly, self._writer,
                                                   self._compactor)
                if self._writer is not None:
                    _close_at_exit(self)
                REAPER.watch(self)
        except BaseException:
            _OPEN_WRITERS.discard(self)
            _abandon(self._writer, self._compactor)
            raise

    # -- opening and closing ----------------------------------------------

    @classmethod
    def create(cls, path, *, k: int = 3, expected_n: int = 1_000_000,
               plan: plans.Plan | str | None = None,
               coding: int = CODING_RESTARTS, fingerprinter=None,
               exist_ok: bool = False, durability: str = "full",
               background_compaction: bool = True, log_limit: int = levels.FLUSH_OPS) -> "Index":
        """Create a new index file at path and open it for writing.

        Parameters: k, the largest Hamming distance queries may ask for
        (0..12); expected_n, the number of distinct fingerprints you expect
        to store: the planner picks the table design for it (more tables
        and longer prefixes for larger n) and the first Huffman codes assume
        its density, but the index holds any number; plan, a table design
        (else ``plan.choose_plan(expected_n, k)``), or "psm" for one table
        queried by probabilistic simhash matching (``plan.psm_plan``: p =
        ``plan.psm_header_bits(expected_n)`` prefix bits; see :meth:`query`);
        coding, the block coding, a ``codec.CODING_*`` constant or its name
        as stats() gives it (``CODING_RESTARTS``, "delta+restarts", the
        default, makes a format-5 file; ``CODING_DELTA`` or ``CODING_XOR``,
        "delta" or "xor", a format-2 file, which ndindex before restart
        records can open too);
        fingerprinter, a :class:`~ndindex.fingerprint.Fingerprinter` (or its
        ``to_bytes()``): the index then stores documents too
        (:meth:`add_documents`, :meth:`similar`), fingerprinted this way,
        with lookup keys designed for its ``threshold``; exist_ok, open the file instead if it already exists (its own
        k and plan are kept; ValueError if its k is below the one asked
        for, or its fingerprinter is not the one given); durability, background_compaction and
        log_limit as in :meth:`open`.

        The file appears atomically: a crash leaves no file or a whole one.
        Raises FileExistsError (unless exist_ok), FileNotFoundError if its
        directory does not exist, ValueError/TypeError for bad parameters,
        ReadOnlyError if the directory cannot be written, CapacityError if
        the disk is full.
        """
        path = _absolute(path)
        if exist_ok and os.path.exists(path):
            return cls._open_existing(path, k, fingerprinter, durability=durability,
                                      background_compaction=background_compaction,
                                      log_limit=log_limit)
        k = plans.check_k(k)
        expected_n = validate.positive_int(expected_n, "expected_n")
        if expected_n > plans.MAX_EXPECTED_N:      # the header holds it as a u64
            plans.choose_plan(expected_n, k)        # raises, saying why
        _check_durability(durability)
        log_limit = validate.positive_int(log_limit, "log_limit")
        if plan is None:
            plan = plans.choose_plan(expected_n, k)
        elif plan == "psm":
            plan = plans.psm_plan(expected_n, k)
        elif isinstance(plan, str):
            raise ValueError(f'plan must be a Plan, "psm" or None, got {plan!r}')
        elif not isinstance(plan, plans.Plan):
            raise TypeError(f"plan must be an ndindex.plan.Plan, got {type(plan).__name__}")
        if plan.k < k:
            raise ValueError(f"plan covers k={plan.k}, below the index's k={k}")
        coding = _coding(coding)
        version = rec.format_version_of(coding)
        header = Header(k, len(plan.tables), expected_n, os.urandom(16), coding, version, version)
        initial = {rec.KEY_HEADER: header.pack(), rec.KEY_PLAN: plan.to_bytes(),
                   rec.KEY_MANIFEST: Manifest().pack()}
        if fingerprinter is not None:
            fingerprinter = docstore.as_fingerprinter(fingerprinter)
            initial[rec.KEY_FINGERPRINTER] = fingerprinter.to_bytes()
            initial[rec.KEY_KEY_DESIGN] = docstore.key_design_for(fingerprinter).to_bytes()
        try:
            st.Store.create(path, initial)
        except FileExistsError:
            if not exist_ok:
                raise
            return cls._open_existing(path, k, fingerprinter, durability=durability,
                                      background_compaction=background_compaction,
                                      log_limit=log_limit)
        return cls.open(path, durability=durability, background_compaction=background_compaction,
                        log_limit=log_limit)

    @classmethod
    def _open_existing(cls, path, k, fingerprinter, **options) -> "Index":
        """create(exist_ok=True) on a file that exists: open it, unless it
        cannot serve what the call asked for.  Its plan and expected_n are
        hints the stored design replaces; a k above the file's (queries
        would be refused) or another fingerprinter (documents would be
        fingerprinted otherwise than the caller's own) is a ValueError."""
        ix = cls.open(path, **options)
        try:
            if isinstance(k, int) and not isinstance(k, bool) and k > ix.k:
                raise ValueError(f"{path} exists with k={ix.k}, below the k={k} asked for: "
                                 f"it cannot answer queries past k={ix.k}; open it with "
                                 f"Index.open, or create a new index elsewhere")
            if fingerprinter is not None:
                wanted = docstore.as_fingerprinter(fingerprinter).to_bytes()
                if ix.fingerprinter != wanted:
                    held = ("no fingerprinter (it stores fingerprints only)"
                            if ix.fingerprinter is None else "another fingerprinter")
                    raise ValueError(f"{path} exists with {held} than the one asked for: "
                                     f"open it with Index.open, or create a new index "
                                     f"elsewhere")
        except BaseException:
            ix.close()
            raise
        return ix

    @classmethod
    def open(cls, path, *, readonly: bool = False, durability: str = "full",
             background_compaction: bool = True, log_limit: int = levels.FLUSH_OPS,
             timeout: float | None = None) -> "Index":
        """Open an existing index file.

        Parameters:
        - readonly: open for queries only (any number of processes may, beside the
          writers; several processes may also open a file for writing).
        - durability: "full" (default) — every add/remove/transaction is on
          disk when it returns; "normal" — it is in this writer's journal
          (one write(), no fsync) when it returns: a crash of the process
          loses nothing, a crash of the OS or a power cut may lose the last
          ~0.1 s of operations; the file is never corrupted either way;
          other processes see the operations once checkpointed (within ~0.1 s).
        - background_compaction: merge the log into the runs in a thread of
          this process (default); False leaves it to :meth:`compact`.
        - log_limit: log operations that trigger a flush into the runs (a log
          of compaction.FLUSH_RECORDS commits, 256, or FLUSH_LOG_BYTES, 1 MiB,
          is flushed too, however few its operations; so is one idle for a
          second).
        - timeout: while another process vacuums the file or upgrades it in
          place, this waits for it, then opens the new file: for at most
          timeout seconds (None, the default: as long as that takes), then
          raises BusyError.

        Cost: O(1) in the number of fingerprints (nothing is read in
        proportion to N).
        Raises FileNotFoundError, IsADirectoryError, BusyError,
        FormatError (not an index, a newer format, or a format-v1 file:
        upgrade it with ``ndindex upgrade``), CorruptionError (damaged meta
        pages, records, or a commit that a damaged meta page would hide),
        ReadOnlyError, CapacityError.
        """
        _check_durability(durability)
        log_limit = validate.positive_int(log_limit, "log_limit")
        path = _absolute(path)
        lock_file = locks.open_locked(path, readonly, validate.timeout(timeout))
        try:
            store = st.Store.open(path, readonly=readonly, durability=durability)
        except BaseException:
            lock_file.close()
            raise
        return cls._from_store(store, lock_file, durability, background_compaction, log_limit)

    @classmethod
    def _from_store(cls, store, lock_file, durability, background_compaction,
                    log_limit) -> "Index":
        """The Index over an open store; lock_file as locks.open_locked gave it (both
        are closed if this fails)."""
        try:
            st.check_commit_records(store)
            txn, view = store.snapshot()
            try:
                raw = view.get(rec.DB_META, rec.KEY_HEADER)
                if raw is None:
                    raise FormatError(f"{store.path}: not an ndindex file (no header record)")
                header = Header.unpack(rec.unframe(raw, rec.DB_META, rec.KEY_HEADER), store.path)
                if header.write_version > rec.FORMAT_VERSION and not store.readonly:
                    raise FormatError(f"{store.path}: header write version {header.write_version} > "
                                      f"supported {rec.FORMAT_VERSION}; open it with readonly=True")
                raw_plan = view.get(rec.DB_META, rec.KEY_PLAN)
                if raw_plan is None:
                    raise CorruptionError("plan record is missing", database=rec.DB_META,
                                          key=rec.KEY_PLAN)
                plan = plans.Plan.from_bytes(rec.unframe(raw_plan, rec.DB_META, rec.KEY_PLAN))
                if len(plan.tables) != header.tables:
                    raise CorruptionError(f"header names {header.tables} tables, plan has "
                                          f"{len(plan.tables)}", database=rec.DB_META, key=rec.KEY_PLAN)
            finally:
                txn.abort()
            return cls(store, lock_file, header, plan, durability=durability,
                       background_compaction=background_compaction, log_limit=log_limit)
        except BaseException:
            store.close()
            lock_file.close()
            raise

    def close(self) -> None:
        """Close the index: stop compaction, checkpoint the journal.  Idempotent.

        With background compaction on, a log of compaction.CLOSE_FLUSH_OPS
        operations, FLUSH_RECORDS records or FLUSH_LOG_BYTES bytes or more is
        flushed into runs first (about 0.1 s for 65,000 operations), as SQLite checkpoints its WAL when the last connection
        closes, so that the next open's first query does not read it whole.
        Ctrl-C waits for the end of it (a few tenths of a second, or the end
        of a transaction in another thread); a second one does not.  Inside
        a transaction block, it rolls the block back (its end raises
        ClosedError).
        """
        if self._store._env is None and (self._writer is None or self._writer.closed):
            return
        # An interrupt part way closed the file and not always the writer
        # (its normal-durability journal still locked, not checkpointed, its
        # thread running), and a second close() then did nothing, the file
        # being closed (tools/sweep_interrupt_points.py: 305 points of 403).
        # Now the first Ctrl-C waits; after a second, the next close()
        # finishes the writer's part (its journal kept for the next open).
        with interrupts_deferred(second_raises=True):
            self._close()

    def _close(self) -> None:
        try:
            background = self._compactor is not None and self._compactor.background
            if self._compactor is not None:
                self._compactor.close()
            if self._writer is not None:
                self._writer.close()
                if background:
                    # Optional work: a failure (a full disk) leaves the log as it is.
                    with contextlib.suppress(NdindexError):
                        if compaction.log_outgrown(self._snapshot(), compaction.CLOSE_FLUSH_OPS):
                            self._compactor.flush_log()
        finally:
            self._finalizer.detach()
            _OPEN_WRITERS.discard(self)
            self._directories.close()  # its thread reads the file
            with self._snap_lock:
                snap, self._snap, self._lineage = self._snap, None, None
            if snap is not None:
                snap.close()
            with self._pool_lock:
                pool, self._pool = self._pool, False
            if pool:
                pool.shutdown(wait=True)  # batches under way finish on their snapshot
            # The meta pages' view pins the file's mapping: without this a
            # closed index left bound to a name (after a with block) kept
            # the file mapped, and a deleted file's space in use.  Zeros
            # read as txnid 0, so a late _snapshot() gets ClosedError.
            self._meta = pages.meta_words(bytes(2 * self._psize))
            # The open lock goes last: a vacuum in another process, which
            # waits for it, must find this process's LMDB environment closed.
            self._store.close()
            self._lock_file.close()

    def _disown(self) -> None:
        """In a child of fork() (reaper.SnapshotReaper._forked): every later call
        raises ClosedError, and close() does nothing.

        The child has none of the parent's threads, and a lock one of them
        held at the fork stays held for ever: a child that wrote through an
        inherited index hung (1 run in 4 of a scratch test adding from a
        fork Pool beside the parent), and its reads shared the parent's
        LMDB reader slot.  Every call reaches Store.env before any lock.
        """
        self._store.disown(f"this Index was opened before a fork(), by process "
                           f"{os.getppid()}; open the index again in this process")
        self._snap = self._lineage = None  # their read transactions: dropped, never aborted
        self._pool = False
        self._finalizer.detach()
        _OPEN_WRITERS.discard(self)  # the exit's close would wait on locks held at the fork
        if self._writer is not None:
            self._writer.closed = True   # its journal and threads are the parent's

    #: Returns self, in C: a Python __enter__ starts with a point where a
    #: Ctrl-C lands, and the with statement then never closed the index.
    __enter__ = _core.enter_self
    #: close(), in C, and close() again after a KeyboardInterrupt: a Python
    #: __exit__ starts with a point where a Ctrl-C lands before its first
    #: line, and close() with one before it holds Ctrl-C back; the index
    #: stayed open, its threads running, until a garbage collection
    #: (sweep_interrupt_points.py: 1 point in 500 of an upgrade).
    __exit__ = _core.exit_closing

    def __repr__(self) -> str:
        state = "closed" if self._store._env is None else \
            "read-only" if self._store.readonly else "writable"
        return f"<ndindex.Index {self.path!r} k={self._header.k} {state}>"

    def __reduce__(self):
        # Pickling reached LMDB's environment ("cannot pickle 'Environment'
        # object"), and copy.copy made a second Index on the same one.
        raise TypeError("an Index cannot be pickled or copied: open the file again "
                        "(in a worker process, Index.open(path))")

    __copy__ = __reduce__

    def __deepcopy__(self, memo):
        return self.__reduce__()

    # -- properties -----------------------------------------------------------

    @property
    def k(self) -> int:
        """The largest distance this index answers."""
        return self._header.k

    @property
    def path(self) -> str:
        """The index file's absolute path (resolved as it opened)."""
        return self._store.path

    @property
    def expected_n(self) -> int:
        """The expected fingerprint count given at creation (header field)."""
        return self._header.expected_n

    @property
    def file_id(self) -> bytes:
        """The 16 random bytes that name this index file (header field)."""
        return self._header.file_id

    @property
    def coding(self) -> int:
        """The block coding of the tables (codec.CODING_XOR, CODING_DELTA or CODING_RESTARTS)."""
        return self._header.coding

    @property
    def _packs_raw(self) -> bool:
        """Whether compaction writes packed raw blocks (FORMAT.md 5.3): in files
        of read version 4 and above, so that an older file stays readable by
        the versions that wrote it."""
        return self._header.read_version >= rec.PACKED_RAW_VERSION

    @property
    def _levels_tombstones(self) -> bool:
        """Whether flushes write tombstones as runs of their own (format 5,
        FORMAT.md 7.8): an older file keeps one tombstone run, which its
        readers expect, until `ndindex upgrade`."""
        return self._header.read_version >= rec.TOMBSTONE_RUNS_VERSION

    @property
    def _pads_log(self) -> bool:
        """Whether log records are padded (format 5, FORMAT.md [F19]), which
        readers of older versions reject."""
        return self._header.read_version >= rec.PADDED_LOG_VERSION

    @property
    def readonly(self) -> bool:
        return self._store.readonly

    @property
    def fingerprinter(self) -> bytes | None:
        """The serialised fingerprinting configuration stored at creation, if any."""
        raw = self._snapshot().view.get(rec.DB_META, rec.KEY_FINGERPRINTER)
        return None if raw is None else rec.unframe(raw, rec.DB_META, rec.KEY_FINGERPRINTER)

    # -- snapshots ----------------------------------------------------------

    def _latest_txnid(self) -> int:
        # Asked before every query: word reads, a third of struct's cost.
        m = self._meta
        i, j = self._txnid_words
        a, b = m[i], m[j]
        return a if a > b else b

    def _snapshot(self) -> Snapshot:
        """The snapshot of the newest commit (refreshed when the file changed)."""
        self._uses += 1
        cur = self._snap
        if cur is not None and self._latest_txnid() == cur.txnid:
            return cur
        self._store.env  # ClosedError once closed, before the lock (see _disown)
        with self._snap_lock:
            self._store.env  # raises ClosedError after close()
            cur = self._snap
            txn, view = self._store.snapshot()
            if cur is not None and view.txnid == cur.txnid:
                txn.abort()
                return cur
            snap = self._new_snapshot(txn, view, self._last_lineage())
            # The old snapshot's read transaction ends when the last thread
            # using it lets go (Snapshot.__del__), not here: a query may be
            # reading its pages right now.
            self._snap, self._lineage = snap, None
            return snap

    def _new_snapshot(self, txn, view, prev) -> Snapshot:
        try:
            return Snapshot(self._store, self.plan, txn, view, prev=prev,
                            directories=self._directories, counts=self._counts,
                            tombstones=self._tombstones)
        except BaseException:
            txn.abort()
            raise

    def _compaction_snapshot(self) -> Snapshot:
        """A snapshot of the newest commit for one compaction step, with a read
        transaction of its own, which the step ends before it commits
        (Compactor._commit): LMDB reuses no page freed by a commit that a
        reader still sees, and a step's own snapshot, taken right after the
        step before it, kept that step's freed pages (the merged-away chunks)
        from the step's commit.  It extends the index's log, not its
        per-table log, which a step does not use."""
        self._store.env  # raises ClosedError after close()
        txn, view = self._store.snapshot()
        prev = self._last_lineage()
        return self._new_snapshot(txn, view, prev and prev._replace(log_tables=None))

    def _last_lineage(self):
        """What the next snapshot extends: the snapshot's lineage, or the one
        kept when the index let go of it (None before the first)."""
        cur = self._snap
        return cur.lineage() if cur is not None else self._lineage

    def _let_go_of_snapshot(self, if_moved_on: bool = False) -> None:
        """Drop the snapshot (if_moved_on: only if the file has newer commits),
        keeping its lineage for the next one.  Its read transaction ends when
        the last call using it lets go.  SnapshotReaper: an idle index;
        Compactor._commit: before a compaction step's commit."""
        with self._snap_lock:
            snap = self._snap
            if snap is not None and (not if_moved_on or (
                    self._store._env is not None and self._latest_txnid() != snap.txnid)):
                self._snap, self._lineage = None, snap.lineage()

    def _wrote(self, state: State, began: float) -> None:
        """A commit that began at time.monotonic() began is done."""
        if self._compactor is not None:
            self._compactor.notify(state)
            self._compactor.throttle(state, self.log_limit, began)

    def _compacted(self) -> None:
        """A compaction step committed (called in the thread that compacts).

        Once this index is warm (it has answered reader.WARM_QUERIES
        queries), the blocks the step wrote are checked here, beside the
        writer, rather than by the first query to reach each one: on a 10M
        stream that first touch was a third of what a query at a busy moment
        cost beyond a compacted index's.  An index only written to (a bulk
        load) does not pay for it.
        """
        if not self._directories.warm:
            return
        try:
            self._snapshot().verify_listed()
        except NdindexError:
            pass  # damage: the query that reaches it reports it

    # -- queries ------------------------------------------------------------

    def __len__(self) -> int:
        """Number of distinct live fingerprints, as this Index's queries see them.

        Cost: from this Index's last count, O(1) if only compaction came
        since, O(the log records since) while no flush of them came between;
        else O(the log) for a compacted index (table 0 one run, no
        tombstone), O(N) otherwise (a pass over table 0's runs).  Operations
        of an open transaction or not yet checkpointed (durability "normal")
        are counted by k=0 probes.
        """
        snap, new, gone = self._pending_view()
        return snap.count() + len(new) - len(gone)

    def _view(self):
        """The newest snapshot and this writer's pending operations, consistent.

        Pending operations are read first: a checkpoint or a transaction's
        commit puts them into the file and only then replaces the pending
        set, so whatever happens in between, the snapshot taken next holds
        every pending operation the first read missed.  An operation seen in
        both is harmless (adds and removes are idempotent).
        """
        pend = self._writer.visible_pending() if self._writer is not None else None
        ready = self._warm_kernel()
        if ready is not None:
            return ready[0], pend
        snap = self._snapshot()
        if "kernel" in snap.__dict__ and snap.kernel_version != self._directories.version:
            # The background lister finished a large run's directory.
            snap.__dict__.pop("kernel", None)
        if not self._directories.warm:
            self._queries += 1
            if self._queries >= WARM_QUERIES:
                # Queries keep coming: list the larger runs now (the next
                # use of the snapshot's kernel builds it again with them).
                self._directories.warm = True
                snap.__dict__.pop("kernel", None)
        return snap, pend

    def _warm_kernel(self):
        """(snapshot, kernel) when the newest snapshot's kernel is built and
        current and the index warm -- a busy index's steady state, where
        _view() has nothing to do -- else None (then _view() does it)."""
        snap = self._snap
        if snap is None or self._latest_txnid() != snap.txnid:
            return None
        kernel = snap.__dict__.get("kernel")
        dirs = self._directories
        if kernel is None or not dirs.warm or snap.kernel_version != dirs.version:
            return None
        self._uses += 1
        return snap, kernel

    def _pending_view(self):
        """The snapshot, and what this writer's pending operations change in it.

        Returns (snapshot, fingerprints pending adds bring in, stored
        fingerprints pending removes take out); both sorted.  Readers and
        writers without pending operations get empty arrays.
        """
        snap, pend = self._view()
        return (snap, *self._pending_changes(snap, pend))

    def _pending_changes(self, snap, pend) -> tuple:
        """What pending operations pend change in snap: (fingerprints they add,
        stored fingerprints they remove), both sorted (see _pending_view)."""
        if pend is None:
            return EMPTY_U64, EMPTY_U64
        with self._writer.lock:
            adds = np.unique(pend.adds())
            removes = pend.removes().copy()
        probe = np.concatenate([adds, removes])
        found = np.zeros(len(probe), dtype=bool)
        found[np.frombuffer(snap.query_many(probe, 0, None)[0], dtype=np.int64)] = True
        return adds[~found[:len(adds)]], removes[found[len(adds):]]


def _coding(coding) -> int:
    """A block coding: a codec.CODING_* constant, or its name (codec.CODING_NAMES)."""
    by_name = {name: c for c, name in codec.CODING_NAMES.items()}
    if isinstance(coding, str) and coding in by_name:
        return by_name[coding]
    if isinstance(coding, bool) or not isinstance(coding, (int, np.integer)) or \
            coding not in codec.CODING_NAMES:
        raise ValueError(f"coding must be one of {sorted(codec.CODING_NAMES)} or "
                         f"{sorted(by_name)}, got {coding!r}")
    return int(coding)


def _check_durability(durability) -> None:
    if durability not in (st.DURABILITY_FULL, st.DURABILITY_NORMAL):
        raise ValueError(f"durability must be 'full' or 'normal', got {durability!r}")


#: Writers open in this process, weakly held: closed as it exits.
_OPEN_WRITERS: "weakref.WeakSet[Index]" = weakref.WeakSet()
#: How long the exit waits for a daemon thread to let go of a writer.
EXIT_LOCK_SECONDS = 1.0
_exit_hook: list = []


def _close_at_exit(ix: Index) -> None:
    _OPEN_WRITERS.add(ix)
    if not _exit_hook:
        _exit_hook.append(atexit.register(_close_open_writers))


def _close_open_writers() -> None:
    """Close the writers a program left open, as Python flushes the files it
    left open: at exit, once its threads have ended (atexit).  A
    normal-durability journal is checkpointed into the file, where other
    processes read (they read no journal: only a writer's next open replays
    it, so a reader saw none of what the program wrote), and the compaction
    thread stops between steps.  A writer whose lock a daemon thread still
    holds (inside a transaction, say) is left as a killed process leaves it,
    after EXIT_LOCK_SECONDS: waiting for it could hang the exit.  The lock
    is held through close(), so that no such thread enters meanwhile; the
    checkpoint thread, which takes it too and which close() joins, is
    stopped first."""
    for ix in list(_OPEN_WRITERS):
        writer = ix._writer
        if writer is None or not writer.stop_checkpoints(EXIT_LOCK_SECONDS):
            continue
        lock = writer.lock
        if not lock.acquire(timeout=EXIT_LOCK_SECONDS):
            continue
        try:
            ix.close()
        except Exception as exc:  # noqa: BLE001 - at exit, say it and go on with the others
            logging.getLogger("ndindex").warning("%s: closing at exit failed (%s: %s)",
                                                 ix.path, type(exc).__name__, exc)
        finally:
            lock.release()


def _abandon(writer, compactor) -> None:
    """Stop what an open that failed made; its journal holds nothing yet."""
    if compactor is not None:
        compactor.close()
    if writer is not None:
        writer.abandon()


def _close_quietly(writer, compactor) -> None:
    with contextlib.suppress(Exception):
        if compactor is not None:
            compactor.close()


def _absolute(path) -> str:
    """The path an Index names its file by, resolved as it opens (as SQLite
    does): absolute, so that a later os.chdir moves nothing it writes beside
    the file (a vacuum's copy, build names); through symbolic links, so that
    every name of the file shares one LMDB lock file (LMDB names it after
    the path: opened by two names, two processes' commits went unserialised)
    and a vacuum renames its copy over the file, not over the link."""
    return os.path.realpath(os.fsdecode(path))     # a str, as the file system's bytes decode


def open(path, *, readonly: bool = False, **kwargs) -> Index:  # noqa: A001 - mirrors sqlite3/lmdb
    """Open an existing index (ndindex.open), as Index.open."""
    return Index.open(path, readonly=readonly, **kwargs)
