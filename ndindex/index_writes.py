"""The methods of Index that write: add, check_and_add, remove, transaction, sync.

Each call checks its arguments, then hands a log record (or, inside a
transaction or under durability "normal", the pending set) to
:mod:`ndindex.writer`, which commits it; compaction is never done here.
"""

from __future__ import annotations

import numpy as np

from ndindex import checked_add, docstore, records as rec, removal, validate
from ndindex.arrays import EMPTY_U64, sorted_unique
from ndindex.errors import ReadOnlyError
from ndindex.index_queries import MATCH_DTYPE, Match, _matches
from ndindex.overlay import RecordOps
from ndindex.records import LogRecord


class WriteMethods:
    """add, check_and_add, check_and_add_many, remove, transaction, sync."""

    def _check_writable(self) -> None:
        if self._writer is None:
            raise ReadOnlyError(f"{self.path}: opened read-only")
        if self._store._env is None:  # per call: the attribute (25 ns), not the property (60)
            self._store.env  # raises ClosedError, before any lock (see _disown)

    def add(self, fingerprints, keys=None) -> int:
        """Add fingerprints (with optional document keys).

        Parameters: fingerprints, a 1-D uint64 array or an iterable of ints
        (or one int); keys, None or one str/bytes key per fingerprint (None
        entries allowed; one int takes one key).  Equal fingerprints share one entry and keep all
        their keys; adding a removed fingerprint brings it back.  Returns
        the number of fingerprints given.  Durable when it returns with
        durability="full" outside a transaction; see :meth:`open` and
        :meth:`transaction` otherwise.  Never compacts: the work of merging
        is done in the background or by :meth:`compact`.  Raises
        TypeError/ValueError for bad input (nothing is written),
        CapacityError if the disk is full (nothing is lost).
        """
        self._check_writable()
        fps = validate.fingerprints(fingerprints)
        if isinstance(keys, (str, bytes)) and isinstance(fingerprints, (int, np.integer)):
            keys = [keys]                                   # ix.add(fp, keys="url")
        pairs = validate.doc_pairs(fps, keys)
        if not len(fps):
            return 0
        self._writer.apply(LogRecord(sorted_unique(fps), EMPTY_U64, sorted(set(pairs)), []))
        return len(fps)

    def check_and_add(self, fingerprint: int, key=None, k: int | None = None, *,
                      keys: bool = True) -> list[Match]:
        """Return the near-duplicates of fingerprint; add it only if there are none.

        The crawler's call: one query within k (default: the index's k),
        then, only when it found nothing, an add of fingerprint (with key).
        Returns the matches found (empty means it was added), with their
        document keys unless keys=False (a fingerprint may hold many: a
        match of 200,000 keys took 0.3 s to return).  Atomic among the
        threads of this process; another process may add in between.
        Inside :meth:`transaction`, thousands of these per second commit as one.
        """
        fp = validate.fingerprint(fingerprint)
        k = validate.query_k(k, self._header.k)
        self._check_writable()
        writer = self._writer
        if key is None and writer.in_transaction and not self.plan.probabilistic:
            # The crawler's loop: only the kernel and the pending additions.
            with writer.lock:
                ready = self._warm_kernel()
                if ready is not None:
                    snap, kernel = ready
                    pend = writer.pending
                    found = pend.check_and_add(self.plan, kernel, fp, k)
                    # Keys of what it found: pending operations count only if
                    # there are any (as _view() gives them).
                    return _matches(snap, pend if pend else None, found, keys) if found else []
        pairs = [] if key is None else [(fp, rec.encode_doc_key(key))]
        # query() and add() without their batch-shaped validation: this is
        # the per-item call, 100,000 a second inside a transaction.
        with writer.lock:
            snap, pend = self._view()
            found = self._found(snap, pend, fp, k, self._flip_probabilities(None, None, None, None),
                                None)
            if not found:
                writer.add_one_locked(fp, pairs)
                return []
        return _matches(snap, pend, found, keys)

    def check_and_add_many(self, fingerprints, keys=None, k: int | None = None) -> np.ndarray:
        """check_and_add() of each fingerprint in turn, as one call; return the matches.

        Fingerprint i is added (with keys[i], if keys are given) exactly
        when nothing within k (default: the index's k) is stored and no
        fingerprint this call added before it is within k: what calling
        check_and_add on each in order does, with the queries asked as one
        batch (query_many) instead of one at a time.  Returns the matches as
        :meth:`query_many` does (fields ``query``, ``fingerprint``,
        ``distance``; grouped by query, then by (distance, fingerprint)), a
        match being a stored fingerprint or one this call added before the
        query's; a query with no match was added.  The additions commit as
        one add() (inside :meth:`transaction`, with the block).  Atomic
        among the threads of this process.  On an index of a probabilistic
        plan (PSM) it makes the calls one by one, in one transaction.
        Raises as add() and query_many.
        """
        fps = validate.fingerprints(fingerprints)
        k = validate.query_k(k, self._header.k)
        self._check_writable()
        keys = None if keys is None else list(keys)
        pairs = validate.doc_pairs(fps, keys)
        if self.plan.probabilistic:
            # PSM finds a near fingerprint only at the prefixes it probes, and
            # the batch's own pairs are joined exactly: so call by call.
            with self.transaction():
                rows = [(i, m.fingerprint, m.distance) for i, fp in enumerate(fps.tolist())
                        for m in self.check_and_add(fp, None if keys is None else keys[i], k)]
            return np.array(rows, dtype=MATCH_DTYPE)
        with self._writer.lock:
            snap, pend = self._view()
            stored = self._query_batch(snap, pend, fps, k, None, None)
            hit = np.zeros(len(fps), dtype=bool)
            hit[stored["query"]] = True
            added, within = checked_add.in_order(fps, hit, k, MATCH_DTYPE)
            if added.any():
                keyed = [i for i, key in enumerate(keys) if key is not None] if keys else []
                pairs = [pair for i, pair in zip(keyed, pairs) if added[i]]
                self._writer.apply(LogRecord(sorted_unique(fps[added]), EMPTY_U64,
                                             sorted(set(pairs)), []))
        return checked_add.all_matches(stored, within)

    def remove(self, fingerprints=None, keys=None) -> int:
        """Remove fingerprints, or document keys; removed entries never return in results.

        By fingerprint: the fingerprint and all its keys go.  By key: the key
        goes, and a fingerprint whose last key went is removed too, even if
        it was also added once without a key.  Space is reclaimed as
        compaction merges the runs.  Returns the number of fingerprints that
        were live and are now removed.  Unknown fingerprints or keys are
        ignored.  Atomic among the threads of this process; it removes what
        is live in the newest commit it reads, so a fingerprint that another
        process adds while the call runs may stay (as in check_and_add).
        """
        return self._remove(fingerprints, keys)[0]

    def _remove(self, fingerprints, keys) -> tuple[int, int]:
        """remove(): (fingerprints removed, keys named that were stored), the
        second for `ndindex remove`'s report, from the lookups remove makes."""
        self._check_writable()
        if fingerprints is None and keys is None:
            raise TypeError("remove() needs fingerprints= or keys=")
        fps = validate.fingerprints(fingerprints) if fingerprints is not None else EMPTY_U64
        key_list = [] if keys is None else ([keys] if isinstance(keys, (str, bytes)) else list(keys))
        raw_keys = [rec.encode_doc_key(key) for key in key_list]
        with self._writer.lock:
            snap = self._snapshot()
            pend = self._writer.visible_pending()
            deletes, gone = removal.key_deletions(snap, pend, fps.tolist(), raw_keys)
            live = removal.live(snap, pend, gone)
            ops = RecordOps()
            for space, key, flag, value in docstore.removal_records(snap, pend, deletes):
                ops.set(space, key, flag, value)
            for fp, raws in deletes.items():
                for raw in raws:
                    ops.set_key(fp, raw, False)
            _, key_deletes, records = ops.to_record_parts()
            self._writer.apply(LogRecord(EMPTY_U64, live, [], key_deletes, records))
        going = set().union(*deletes.values()) if raw_keys else set()
        return len(live), sum(1 for raw in raw_keys if raw in going)

    def transaction(self):
        """Group every add/remove/check_and_add inside the block into one commit.

        Queries of this index see the block's operations at once; other
        processes see them when the block ends (with durability="full",
        durably).  An exception in the block discards them all.  Blocks
        nest, and the outermost one commits: an exception in an inner block
        discards that block's operations (a savepoint; entering one copies
        the pending operations), and the enclosing block, if it catches the
        exception, goes on and commits its own.  Writes of other threads of this
        index wait for the block to end.  A block may hold any number of
        operations: past overlay.PENDING_SCAN_MAX additions, queries find
        them through an index per table, not one by one.  They are held in
        memory until the block ends (about 130 bytes an addition with four
        tables).
        """
        self._check_writable()
        return self._writer.transaction(self)

    def sync(self) -> None:
        """Make every acknowledged operation durable (checkpoint the journal, flush)."""
        self._check_writable()
        self._writer.sync()
