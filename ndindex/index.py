"""Index: the single-file near-duplicate index (add, query, remove, compact).

An index file holds t permuted, sorted, compressed tables of distinct 64-bit
fingerprints (ndindex.tables), an append log of fingerprints added since the
last compaction, tombstones of removed fingerprints, and the document keys
of each fingerprint (ndindex.store).  A query probes every table's blocks in
place in the memory map and every table's sorted copy of the log, in one C
call (ndindex._core.query), so its cost does not involve Python per table
or per block.

Concurrency follows LMDB: any number of reader threads and processes, one
writer at a time.  Each call works on a *snapshot*: a read transaction plus
the directory arrays built from it.  A snapshot is refreshed when the file
has changed (a new LMDB transaction id), reusing the parts whose generation
counters did not move, so a reader pays about a microsecond per call to
notice that nothing changed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import struct
import threading
import time
from typing import NamedTuple

import numpy as np

from ndindex import _core, codec, plan as plans, store as st, tables
from ndindex.arrays import EMPTY_U64, insert_sorted, isin_sorted, merge_sorted, sorted_unique
from ndindex.codec import CODING_DELTA, HuffmanCode
from ndindex.errors import CorruptionError, FormatError, ReadOnlyError

#: Default size of the append log, in fingerprints, before add() compacts.
DEFAULT_LOG_LIMIT = 1 << 18
#: A compaction that would touch more than this fraction of blocks rebuilds
#: the whole table instead (and recomputes its code).  Measured at 10M
#: fingerprints: a rebuild costs ~10 us per block, an incremental pass ~0.5 s
#: plus ~67 us per touched block (decode, merge and encode run per block
#: from Python), so they break even near 11% of the blocks.
FULL_REBUILD_FRACTION = 0.1
#: A table's code is rebuilt once its size drifts this far from the size the
#: code was made for: each doubling shifts the gap distribution by one bit.
CODE_DRIFT_FACTOR = 2.0
#: query_many splits batches of at least this many queries across threads.
PARALLEL_QUERY_MIN = 4096
LOG_HEAD = struct.Struct("<I")


class Match(NamedTuple):
    """One query result: a stored fingerprint, its distance, its document keys."""

    fingerprint: int
    distance: int
    keys: tuple


MATCH_DTYPE = np.dtype([("query", np.int64), ("fingerprint", np.uint64), ("distance", np.uint8)])


@dataclasses.dataclass
class State:
    """The counters in meta/state (FORMAT.md 7.3)."""

    tables_generation: int = 0
    log_next_seq: int = 0
    removed_generation: int = 0
    table_entries: int = 0
    code_n: int = 0
    log_entries: int = 0

    def pack(self) -> bytes:
        return st.STATE.pack(self.tables_generation, self.log_next_seq, self.removed_generation,
                             self.table_entries, self.code_n, self.log_entries)

    @classmethod
    def unpack(cls, payload: bytes) -> "State":
        if len(payload) != st.STATE.size:
            raise CorruptionError(f"state record is {len(payload)} bytes", database="meta", key=st.META_STATE)
        return cls(*st.STATE.unpack(payload))


@dataclasses.dataclass
class Snapshot:
    """What queries read: a read transaction and the arrays derived from it."""

    txn: object
    txn_id: int
    state: State
    views: list           # tables.TableView per table
    log_values: np.ndarray  # distinct unpermuted log fingerprints, sorted
    log_tables: list      # per table: sorted permuted log
    removed: np.ndarray   # sorted unpermuted tombstones
    kernel: object        # _core snapshot capsule
    codes: list           # the Huffman code of each table, as of this snapshot
    #: Serialises cursors on ``txn``: threads share a snapshot, and an LMDB
    #: transaction is used by one thread at a time (py-lmdb sets MDB_NOTLS).
    txn_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def _as_fingerprints(fps) -> np.ndarray:
    """Return fingerprints as a contiguous uint64 array; TypeError/ValueError otherwise."""
    if isinstance(fps, (int, np.integer)):
        fps = [fps]
    if isinstance(fps, np.ndarray):
        if fps.dtype == np.uint64:
            return np.ascontiguousarray(fps).reshape(-1)
        if fps.dtype.kind in "iu":
            if fps.size and fps.dtype.kind == "i" and fps.min() < 0:
                raise ValueError("fingerprints must be in 0..2^64-1, got a negative value")
            return np.ascontiguousarray(fps, dtype=np.uint64).reshape(-1)
        raise TypeError(f"fingerprints must be unsigned 64-bit integers, got dtype {fps.dtype}")
    if isinstance(fps, (str, bytes, float)):
        raise TypeError(f"fingerprints must be integers, got {type(fps).__name__}")
    out = []
    for v in fps:
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"fingerprints must be integers, got {type(v).__name__}")
        if not 0 <= int(v) < 1 << 64:
            raise ValueError(f"fingerprint {v} is outside 0..2^64-1")
        out.append(int(v))
    return np.array(out, dtype=np.uint64)


def _check_fingerprint(fp) -> int:
    if type(fp) is int and 0 <= fp < 1 << 64:  # the common case, checked cheaply
        return fp
    if not isinstance(fp, (int, np.integer)) or isinstance(fp, bool):
        raise TypeError(f"a fingerprint must be an int, got {type(fp).__name__}")
    fp = int(fp)
    if not 0 <= fp < 1 << 64:
        raise ValueError(f"fingerprint {fp} is outside 0..2^64-1")
    return fp


class Index:
    """A near-duplicate index in one file.  Open with :meth:`create` or :meth:`open`.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, store: st.Store, header: dict, plan: plans.Plan, codes: list,
                 log_limit: int, preload: bool = False):
        self._store = store
        self._header = header
        self.plan = plan
        self._codes = codes
        self.log_limit = log_limit
        self._preload = bool(preload)
        self._snap: Snapshot | None = None
        self._snap_lock = threading.Lock()
        self._check_lock = threading.Lock()
        self._pool = None
        self._runs = [(t.runs(), _inverse_runs(t)) for t in plan.tables]
        store.before_remap = self._drop_snapshot

    # -- opening and closing ----------------------------------------------

    @classmethod
    def create(cls, path, *, k: int = 3, expected_n: int = 1_000_000, plan: plans.Plan | None = None,
               coding: int = CODING_DELTA, log_limit: int = DEFAULT_LOG_LIMIT,
               fingerprinter: bytes | None = None) -> "Index":
        """Create a new index file at path.

        Parameters: k, the largest Hamming distance queries may ask for;
        expected_n, the expected number of distinct fingerprints (the planner
        and the initial Huffman codes use it); plan, a table design (else
        ``plan.choose_plan(expected_n, k)``); coding, the block coding;
        log_limit, the append-log size that triggers compaction;
        fingerprinter, serialised fingerprinting configuration kept in the
        header.  Raises FileExistsError if path exists, ValueError for bad
        parameters.
        """
        path = os.fspath(path)
        if os.path.exists(path):
            raise FileExistsError(f"{path}: already exists")
        k = _check_k_value(k)
        if not isinstance(expected_n, (int, np.integer)) or expected_n < 1:
            raise ValueError(f"expected_n must be a positive int, got {expected_n!r}")
        if plan is None:
            plan = plans.choose_plan(int(expected_n), k)
        elif not isinstance(plan, plans.Plan):
            raise TypeError(f"plan must be an ndindex.plan.Plan, got {type(plan).__name__}")
        if plan.k < k:
            raise ValueError(f"plan covers k={plan.k}, below the index's k={k}")
        if coding not in codec.CODING_NAMES:
            raise ValueError(f"coding must be one of {sorted(codec.CODING_NAMES)}, got {coding}")
        _check_log_limit(log_limit)
        codes = [HuffmanCode.for_density(int(expected_n), coding) for _ in plan.tables]
        store = st.Store.open(path, create=True)
        try:
            def init(txn):
                store.put_framed(txn, st.DB_META, st.META_HEADER,
                                 st.pack_header(k, len(plan.tables), int(expected_n)))
                store.put_framed(txn, st.DB_META, st.META_PLAN, plan.to_bytes())
                for i, code in enumerate(codes):
                    store.put_framed(txn, st.DB_META, st.code_key(i), code.to_bytes())
                store.put_framed(txn, st.DB_META, st.META_STATE, State(code_n=int(expected_n)).pack())
                if fingerprinter is not None:
                    store.put_framed(txn, st.DB_META, st.META_FINGERPRINTER, bytes(fingerprinter))
            store.write(init)
        except BaseException:
            store.close()
            raise
        header = st.unpack_header(st.pack_header(k, len(plan.tables), int(expected_n)), path)
        return cls(store, header, plan, codes, log_limit)

    @classmethod
    def open(cls, path, *, readonly: bool = False, log_limit: int = DEFAULT_LOG_LIMIT,
             preload: bool = False) -> "Index":
        """Open an existing index file with its stored plan and codes.

        preload=True decodes the tables into memory (8 bytes per fingerprint
        per table) when a snapshot is first built after each compaction;
        queries then search plain arrays instead of decoding blocks, several
        times faster for large batches.  The file stays the only storage.

        Raises FileNotFoundError, FormatError (not an index, or a newer
        format), CorruptionError (damaged records or a truncated file).  A
        file whose write version is newer than this library opens only with
        readonly=True.
        """
        _check_log_limit(log_limit)
        store = st.Store.open(path, readonly=readonly)
        try:
            txn = store.begin_read()
            try:
                raw = store.get_framed(txn, st.DB_META, st.META_HEADER)
                if raw is None:
                    raise FormatError(f"{path}: not an ndindex file (no header record)")
                header = st.unpack_header(raw, store.path)
                if header["write_version"] > st.FORMAT_VERSION and not readonly:
                    raise FormatError(f"{path}: header write version {header['write_version']} > "
                                      f"supported {st.FORMAT_VERSION}; open it with readonly=True")
                plan = plans.Plan.from_bytes(_required(store, txn, st.META_PLAN))
                if len(plan.tables) != header["tables"]:
                    raise CorruptionError(f"header names {header['tables']} tables, plan has "
                                          f"{len(plan.tables)}", database="meta", key=st.META_PLAN)
                codes = [HuffmanCode.from_bytes(_required(store, txn, st.code_key(i)))
                         for i in range(len(plan.tables))]
                State.unpack(_required(store, txn, st.META_STATE))
            finally:
                txn.abort()
        except BaseException:
            store.close()
            raise
        return cls(store, header, plan, codes, log_limit, preload)

    def preload(self, enable: bool = True) -> None:
        """Keep decoded copies of the tables in memory (see :meth:`open`), or stop."""
        with self._snap_lock:
            self._preload = bool(enable)
            self._snap = None

    def close(self) -> None:
        """Close the index.  Idempotent; later calls raise ClosedError."""
        with self._snap_lock:
            self._snap = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def k(self) -> int:
        """The largest distance this index answers."""
        return self._header["k"]

    @property
    def path(self) -> str:
        return self._store.path

    @property
    def expected_n(self) -> int:
        """The expected fingerprint count given at creation (header field)."""
        return self._header["expected_n"]

    @property
    def coding(self) -> int:
        """The block coding of the tables (codec.CODING_XOR or CODING_DELTA)."""
        return self._codes[0].coding

    @property
    def readonly(self) -> bool:
        return self._store.readonly

    @property
    def fingerprinter(self) -> bytes | None:
        """The serialised fingerprinting configuration stored at creation, if any."""
        txn = self._store.begin_read()
        try:
            return self._store.get_framed(txn, st.DB_META, st.META_FINGERPRINTER)
        finally:
            txn.abort()

    # -- snapshots ----------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        """Return a snapshot of the newest committed state, refreshed if the file changed."""
        txn = self._store.begin_read()
        old = self._snap
        if old is not None and txn.id() == old.txn_id:
            txn.abort()
            return old
        with self._snap_lock:
            snap = self._build_snapshot(txn, self._snap)
            self._snap = snap
            return snap

    def _build_snapshot(self, txn, old: Snapshot | None) -> Snapshot:
        state = State.unpack(_required(self._store, txn, st.META_STATE))
        same_tables = old is not None and old.state.tables_generation == state.tables_generation
        if same_tables:
            # The segments sub-database was not written since `old`, so its
            # pages are the same pages in this newer snapshot: the block
            # addresses stay valid for as long as `txn` lives.
            views = old.views
        else:
            views = [tables.read_table(self._store, txn, i) for i in range(len(self.plan.tables))]
            self._reload_codes(txn)
        if same_tables and old.state.log_next_seq == state.log_next_seq:
            log_values, log_tables = old.log_values, old.log_tables
        elif same_tables:
            # Only records after the last one seen are new: merge them into
            # the sorted arrays (O(L) memmove) instead of re-sorting the log.
            fresh = self._read_log(txn, old.state.log_next_seq)
            fresh = fresh[~isin_sorted(fresh, old.log_values)]
            log_values = insert_sorted(old.log_values, fresh)
            log_tables = [insert_sorted(lt, np.sort(t.apply(fresh)))
                          for lt, t in zip(old.log_tables, self.plan.tables)]
        else:
            log_values = self._read_log(txn, 0)
            log_tables = [np.sort(t.apply(log_values)) for t in self.plan.tables]
        if old is not None and old.state.removed_generation == state.removed_generation \
                and same_tables:
            removed = old.removed
        else:
            removed = self._read_removed(txn)
        if self._preload:
            for view, code in zip(views, self._codes):
                view.preload(code)
        kernel = _core.make_snapshot(
            [(t.prefix_bits, fwd, inv, self._codes[i].compiled, views[i].keys, views[i].addresses,
              log_tables[i], *((views[i].decoded, views[i].offsets) if self._preload else (None, None)))
             for i, (t, (fwd, inv)) in enumerate(zip(self.plan.tables, self._runs))],
            removed)
        return Snapshot(txn, txn.id(), state, views, log_values, log_tables, removed, kernel,
                        list(self._codes))

    def _reload_codes(self, txn) -> None:
        self._codes = [HuffmanCode.from_bytes(_required(self._store, txn, st.code_key(i)))
                       for i in range(len(self.plan.tables))]

    def _read_log(self, txn, start_seq: int) -> np.ndarray:
        parts = []
        cur = txn.cursor(db=self._store.dbs[st.DB_LOG])
        try:
            if cur.set_range(st.u64_key(start_seq)):
                for key, value in cur:
                    payload = st.unframe(value, st.DB_LOG, bytes(key))
                    (count,) = LOG_HEAD.unpack_from(payload)
                    if len(payload) != LOG_HEAD.size + 8 * count:
                        raise CorruptionError(f"log record holds {len(payload)} bytes for {count} "
                                              "fingerprints", database="log", key=bytes(key))
                    parts.append(np.frombuffer(payload, dtype="<u8", offset=LOG_HEAD.size))
        finally:
            cur.close()
        return sorted_unique(np.concatenate(parts)) if parts else EMPTY_U64

    def _read_removed(self, txn) -> np.ndarray:
        # A tombstone's key is the removed fingerprint itself, so its
        # checksum is checked before the key is used ([C3]): a flipped key
        # bit would otherwise hide one fingerprint and revive another.
        cur = txn.cursor(db=self._store.dbs[st.DB_REMOVED])
        keys = []
        try:
            for key, value in cur:
                key = bytes(key)
                if bytes(value) != st.CRC.pack(_core.crc32c(key)):
                    raise CorruptionError("tombstone checksum mismatch", database="removed", key=key)
                keys.append(key)
        finally:
            cur.close()
        if not keys:
            return EMPTY_U64
        return np.frombuffer(b"".join(keys), dtype=">u8").astype(np.uint64)

    def _drop_snapshot(self) -> None:
        """Forget the cached snapshot (LMDB needs no live read txn to resize the map)."""
        with self._snap_lock:
            self._snap = None

    # -- queries ------------------------------------------------------------

    def _check_k(self, k) -> int:
        if k is None:
            return self._header["k"]
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            raise TypeError(f"k must be an int, got {type(k).__name__}")
        if not 0 <= k <= self.k:
            raise ValueError(f"k={k} is outside 0..{self.k}, the largest distance this index answers")
        return int(k)

    def query(self, fingerprint: int, k: int | None = None, *, keys: bool = True) -> list[Match]:
        """Return every stored fingerprint within Hamming distance k, nearest first.

        Parameters: fingerprint, a 64-bit int; k, at most the index's k
        (default: the index's k); keys, whether to fetch document keys.
        Returns a list of Match(fingerprint, distance, keys), ordered by
        (distance, fingerprint).  Raises TypeError/ValueError for bad
        arguments, CorruptionError if a block read fails its checks.
        Cost: one probe per table, each decoding about one block.
        """
        q = _check_fingerprint(fingerprint)
        k = self._check_k(k)
        snap = self._snapshot()
        found = _core.query(snap.kernel, q, k)
        if not found:
            return []
        if not keys:
            return [Match(f, d, ()) for f, d in found]
        return [Match(f, d, ks) for (f, d), ks in zip(found, self._keys_of([f for f, _ in found], snap))]

    def query_many(self, fingerprints, k: int | None = None) -> np.ndarray:
        """Answer query() for a batch; return one structured array of all matches.

        The result has fields ``query`` (index into the batch),
        ``fingerprint`` and ``distance``, grouped by query and ordered by
        (distance, fingerprint) within each.  Large batches are split across
        threads (the kernel releases the GIL).  Use :meth:`keys` for document
        keys.
        """
        qs = _as_fingerprints(fingerprints)
        k = self._check_k(k)
        snap = self._snapshot()
        workers = min(os.cpu_count() or 1, 8)
        if len(qs) < PARALLEL_QUERY_MIN or workers == 1:
            return _to_matches(*_core.query_many(snap.kernel, qs, k), offset=0)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="ndindex")
        bounds = np.linspace(0, len(qs), workers + 1).astype(np.int64)
        futures = [self._pool.submit(_core.query_many, snap.kernel, qs[a:b], k)
                   for a, b in zip(bounds[:-1], bounds[1:])]
        parts = [_to_matches(*f.result(), offset=int(a)) for f, a in zip(futures, bounds[:-1])]
        return np.concatenate(parts)

    def keys(self, fingerprint: int) -> tuple:
        """Return the document keys stored with a fingerprint (empty if none)."""
        fp = _check_fingerprint(fingerprint)
        return self._keys_of([fp])[0]

    def _keys_of(self, fps, snap: Snapshot | None = None) -> list[tuple]:
        # With a snapshot, its own transaction, so that the keys belong to
        # the same committed state as the fingerprints found in it (a fresh
        # transaction could see a later remove or add); other threads may
        # share the snapshot, so its lock is held while the cursor lives.
        if snap is not None:
            with snap.txn_lock:
                return self._keys_in(snap.txn, fps)
        txn = self._store.begin_read()
        try:
            return self._keys_in(txn, fps)
        finally:
            txn.abort()

    def _keys_in(self, txn, fps) -> list[tuple]:
        out = []
        cur = txn.cursor(db=self._store.dbs[st.DB_DOCS])
        try:
            for fp in fps:
                kb = st.u64_key(fp)
                found = []
                if cur.set_key(kb):
                    for value in cur.iternext_dup():
                        found.append(_unpack_doc_value(bytes(value), kb))
                out.append(tuple(sorted(found, key=lambda v: (isinstance(v, str), v))))
        finally:
            cur.close()
        return out

    def __contains__(self, fingerprint) -> bool:
        fp = _check_fingerprint(fingerprint)
        return bool(_core.query(self._snapshot().kernel, fp, 0))

    def __len__(self) -> int:
        """Number of distinct live fingerprints.  Cost: O(log + tombstones) exact probes."""
        snap = self._snapshot()
        # live = (tables | log) - removed
        log_new = ~self._in_tables(snap, snap.log_values)
        hidden = self._in_tables(snap, snap.removed) | isin_sorted(snap.removed, snap.log_values)
        return snap.state.table_entries + int(log_new.sum()) - int(hidden.sum())

    def _in_tables(self, snap: Snapshot, values: np.ndarray) -> np.ndarray:
        """Boolean mask: which values are stored in the tables (ignoring log and tombstones)."""
        if not len(values) or not snap.views[0].n_blocks:
            return np.zeros(len(values), dtype=bool)
        fwd, inv = self._runs[0]
        table_only = _core.make_snapshot(
            [(64, fwd, inv, snap.codes[0].compiled, snap.views[0].keys, snap.views[0].addresses,
              EMPTY_U64, None, None)], EMPTY_U64)
        qidx, _, _ = _core.query_many(table_only, values, 0)
        mask = np.zeros(len(values), dtype=bool)
        mask[np.frombuffer(qidx, dtype=np.int64)] = True
        return mask

    # -- writes -------------------------------------------------------------

    def add(self, fingerprints, keys=None) -> int:
        """Add fingerprints (with optional document keys); durable when it returns.

        Parameters: fingerprints, a uint64 array or an iterable of ints;
        keys, None or one str/bytes key per fingerprint.  Equal fingerprints
        share one table entry and keep all their keys.  Returns the number
        of fingerprints given.  The batch goes to the append log in one
        transaction; if the log then reaches ``log_limit`` the same
        transaction merges it into the tables, so nothing is written twice.
        Raises TypeError/ValueError for bad input (nothing is written),
        CapacityError if the disk is full (nothing is lost).
        """
        self._check_writable()
        fps = _as_fingerprints(fingerprints)
        doc_items = _doc_items(fps, keys)
        if not len(fps):
            return 0
        distinct = sorted_unique(fps)

        def body(txn):
            state = State.unpack(_required(self._store, txn, st.META_STATE))
            self._put_doc_items(txn, doc_items)
            # Adding a removed fingerprint revives it: drop its tombstone.
            removed = self._read_removed(txn)
            revived = distinct[isin_sorted(distinct, removed)]
            for fp in revived:
                txn.delete(st.u64_key(int(fp)), db=self._store.dbs[st.DB_REMOVED])
            if len(revived):
                state.removed_generation += 1
            if state.log_entries + len(distinct) >= self.log_limit:
                self._compact_txn(txn, state, extra=distinct, full=False)
            else:
                payload = LOG_HEAD.pack(len(distinct)) + distinct.astype("<u8").tobytes()
                self._store.put_framed(txn, st.DB_LOG, st.u64_key(state.log_next_seq), payload)
                state.log_next_seq += 1
                state.log_entries += len(distinct)
            self._store.put_framed(txn, st.DB_META, st.META_STATE, state.pack())

        # A compaction writes every table again beside the old one (copy on write).
        t = len(self.plan.tables)
        self._store.write(body, before_grow=self._drop_snapshot,
                          expect_bytes=8 * len(distinct) * (t + 2)
                          + (8 * t * self._table_entries_hint() if len(distinct) >= self.log_limit else 0))
        return len(fps)

    def _table_entries_hint(self) -> int:
        snap = self._snap
        return snap.state.table_entries if snap is not None else 0

    def check_and_add(self, fingerprint: int, key=None, k: int | None = None) -> list[Match]:
        """Return the near-duplicates of fingerprint; add it only if there are none.

        The crawler's call: one query, then an add when the result is empty.
        With several writers in one process the pair is atomic (one writer
        lock); across processes another writer may add in between.
        """
        fp = _check_fingerprint(fingerprint)
        k = self._check_k(k)
        with self._check_lock:
            found = self.query(fp, k)
            if not found:
                self.add([fp], None if key is None else [key])
        return found

    def remove(self, fingerprints=None, keys=None) -> int:
        """Remove fingerprints, or document keys; removed entries never return in results.

        By fingerprint: the fingerprint and all its keys go.  By key: the key
        goes, and a fingerprint whose last key went is removed too, even if
        it was also added once without a key.  Space
        is reclaimed by the next compaction.  Returns the number of
        fingerprints that became removed.  Unknown fingerprints or keys are
        ignored.
        """
        self._check_writable()
        if fingerprints is None and keys is None:
            raise TypeError("remove() needs fingerprints= or keys=")
        fps = _as_fingerprints(fingerprints) if fingerprints is not None else EMPTY_U64
        key_list = [] if keys is None else ([keys] if isinstance(keys, (str, bytes)) else list(keys))
        raw_keys = [st.encode_doc_key(key) for key in key_list]

        def body(txn):
            state = State.unpack(_required(self._store, txn, st.META_STATE))
            gone = set(int(v) for v in fps)
            for fp in gone:
                self._delete_docs_of(txn, fp)
            for raw in raw_keys:
                for fp in self._fps_of_key(txn, raw):
                    self._delete_doc(txn, fp, raw)
                    if not txn.get(st.u64_key(fp), db=self._store.dbs[st.DB_DOCS]):
                        gone.add(fp)
            added = 0
            db = self._store.dbs[st.DB_REMOVED]
            for fp in gone:
                kb = st.u64_key(fp)
                if txn.put(kb, st.CRC.pack(_core.crc32c(kb)), db=db, overwrite=False):
                    added += 1
            if added:
                state.removed_generation += 1
                self._store.put_framed(txn, st.DB_META, st.META_STATE, state.pack())
            return added

        return self._store.write(body, before_grow=self._drop_snapshot)

    def compact(self, full: bool = False) -> dict:
        """Merge the append log and removals into the tables, in one transaction.

        Rewrites only the blocks whose key range receives or loses entries,
        unless most blocks would change, the table size drifted far from
        what its Huffman code was built for, or full=True: then each table
        is rebuilt and its code recomputed.  Readers see either the old or
        the new tables, never a mix.  Returns a summary dict (entries,
        blocks rewritten, seconds).
        """
        self._check_writable()
        t0 = time.perf_counter()
        report = {}

        def body(txn):
            state = State.unpack(_required(self._store, txn, st.META_STATE))
            report.update(self._compact_txn(txn, state, extra=EMPTY_U64, full=full))
            self._store.put_framed(txn, st.DB_META, st.META_STATE, state.pack())

        t = len(self.plan.tables)
        snap = self._snap  # the last snapshot's counts suffice for an estimate
        log_entries = snap.state.log_entries if snap is not None else 0
        self._store.write(body, before_grow=self._drop_snapshot,
                          expect_bytes=8 * t * (self._table_entries_hint() + log_entries))
        report["seconds"] = time.perf_counter() - t0
        return report

    def _compact_txn(self, txn, state: State, extra: np.ndarray, full: bool) -> dict:
        """Merge log + extra - removed into every table inside txn; update state."""
        new = merge_sorted(self._read_log(txn, 0), extra, EMPTY_U64)
        removed = self._read_removed(txn)
        if len(removed):
            new = new[~isin_sorted(new, removed)]
        entries = state.table_entries
        drift = entries and (entries + len(new)) / max(state.code_n, 1)
        rebuild_codes = full or entries == 0 or (drift and not
                                                 1 / CODE_DRIFT_FACTOR <= drift <= CODE_DRIFT_FACTOR)
        rewritten = 0
        full_tables = 0
        new_entries = None
        # The codes come from this transaction, not from self._codes: a
        # retried or aborted transaction must not leave a code in memory
        # that the file does not hold, and another process may have
        # rebuilt the codes since this one last read them.  Snapshots
        # reload the codes once the committed tables_generation moves.
        codes = [HuffmanCode.from_bytes(_required(self._store, txn, st.code_key(i)))
                 for i in range(len(self.plan.tables))]
        for i, design in enumerate(self.plan.tables):
            view = tables.read_table(self._store, txn, i)
            new_p = np.sort(design.apply(new)) if len(new) else EMPTY_U64
            gone_p = np.sort(design.apply(removed)) if len(removed) else EMPTY_U64
            if not len(new_p) and not len(gone_p) and not rebuild_codes:
                new_entries = entries if new_entries is None else new_entries
                continue
            touched = _touched_blocks(view, new_p, gone_p)
            if rebuild_codes or not view.n_blocks or touched > FULL_REBUILD_FRACTION * view.n_blocks:
                existing = tables.decode_table(view, codes[i]) if view.n_blocks else EMPTY_U64
                merged = merge_sorted(existing, new_p, gone_p)
                if rebuild_codes:
                    codes[i] = HuffmanCode.from_values(merged, codes[i].coding,
                                                       expected_n=self._header["expected_n"]
                                                       if not len(merged) else None)
                    self._store.put_framed(txn, st.DB_META, st.code_key(i), codes[i].to_bytes())
                enc = codec.encode(merged, codes[i])
                tables.delete_table(txn, self._store, i)
                tables.write_blocks(txn, self._store, i, enc.keys, enc.blocks)
                rewritten += enc.n_blocks
                full_tables += 1
                count = len(merged)
            else:
                n, delta = tables.rewrite_incremental(txn, self._store, i, view, codes[i],
                                                      new_p, gone_p)
                rewritten += n
                count = entries + delta
            if new_entries is None:
                new_entries = count
            elif new_entries != count:
                raise CorruptionError(f"table {i} holds {count} entries after compaction, "
                                      f"table 0 holds {new_entries}", database="segments")
        # The log and the tombstones are now in the tables.
        txn.drop(self._store.dbs[st.DB_LOG], delete=False)
        txn.drop(self._store.dbs[st.DB_REMOVED], delete=False)
        state.tables_generation += 1
        state.removed_generation += 1
        state.log_entries = 0
        state.table_entries = int(new_entries if new_entries is not None else entries)
        if rebuild_codes:
            state.code_n = max(state.table_entries, 1)
        return dict(entries=state.table_entries, blocks_rewritten=rewritten,
                    tables_rebuilt=full_tables, codes_rebuilt=bool(rebuild_codes))

    def _put_doc_items(self, txn, items) -> None:
        if not items:
            return
        docs = txn.cursor(db=self._store.dbs[st.DB_DOCS])
        keys = txn.cursor(db=self._store.dbs[st.DB_KEYS])
        try:
            docs.putmulti([(st.u64_key(fp), _pack_doc_value(st.u64_key(fp), raw)) for fp, raw in items],
                          dupdata=True)
            keys.putmulti([(raw, _pack_key_value(raw, fp)) for fp, raw in items], dupdata=True)
        finally:
            docs.close()
            keys.close()

    def _fps_of_key(self, txn, raw: bytes) -> list[int]:
        cur = txn.cursor(db=self._store.dbs[st.DB_KEYS])
        out = []
        try:
            if cur.set_key(raw):
                for value in cur.iternext_dup():
                    out.append(_unpack_key_value(bytes(value), raw))
        finally:
            cur.close()
        return out

    def _delete_doc(self, txn, fp: int, raw: bytes) -> None:
        kb = st.u64_key(fp)
        txn.delete(kb, _pack_doc_value(kb, raw), db=self._store.dbs[st.DB_DOCS])
        txn.delete(raw, _pack_key_value(raw, fp), db=self._store.dbs[st.DB_KEYS])

    def _delete_docs_of(self, txn, fp: int) -> None:
        kb = st.u64_key(fp)
        cur = txn.cursor(db=self._store.dbs[st.DB_DOCS])
        raws = []
        try:
            if cur.set_key(kb):
                raws = [_unpack_doc_raw(bytes(v), kb) for v in cur.iternext_dup()]
        finally:
            cur.close()
        for raw in raws:
            self._delete_doc(txn, fp, raw)

    def _check_writable(self) -> None:
        if self._store.readonly:
            raise ReadOnlyError(f"{self.path}: opened read-only")

    # -- inspection ---------------------------------------------------------

    def stats(self) -> dict:
        """Return counts, sizes and bits per fingerprint per table, log size and the plan."""
        snap = self._snapshot()
        n = snap.state.table_entries
        per_table = []
        for i, (design, view) in enumerate(zip(self.plan.tables, snap.views)):
            value_bytes = sum(tables.SEGMENT_HEADER_BYTES + c * codec.BLOCK_BYTES
                              for _, _, c in view.segments)
            per_table.append(dict(
                table=i, prefix_bits=design.prefix_bits, entries=n, blocks=view.n_blocks,
                segments=len(view.segments), bytes=value_bytes,
                bits_per_fingerprint=(value_bytes * 8 / n) if n else 0.0,
                coding=codec.CODING_NAMES[snap.codes[i].coding]))
        file_bytes = self._store.file_bytes()
        return dict(
            path=self.path, k=self.k, fingerprints=len(self), table_entries=n,
            log_entries=len(snap.log_values), removed_pending=len(snap.removed),
            tables=per_table, file_bytes=file_bytes, used_bytes=self._store.used_bytes(),
            file_bits_per_fingerprint_per_table=(file_bytes * 8 / n / len(per_table)) if n else 0.0,
            entropy_bound_bits=codec.entropy_bound_bits(n) if n else 0.0,
            plan=self.plan.describe())

    def verify(self) -> dict:
        """Check every checksum, ordering and directory entry; raise on the first problem.

        Decodes every block of every table, checks that blocks and segments
        are in order and that block keys match the directory, that all
        tables hold the same fingerprints, and that the log, tombstones and
        document records pass their checksums.  Raises CorruptionError
        naming the first problem; returns a summary otherwise.  Cost: a full
        read of the file.
        """
        txn = self._store.begin_read()
        try:
            state = State.unpack(_required(self._store, txn, st.META_STATE))
            st.unpack_header(_required(self._store, txn, st.META_HEADER), self.path)
            plans.Plan.from_bytes(_required(self._store, txn, st.META_PLAN))
            reference = None
            blocks = 0
            for i, design in enumerate(self.plan.tables):
                code = HuffmanCode.from_bytes(_required(self._store, txn, st.code_key(i)))
                view = tables.read_table(self._store, txn, i)
                values = tables.decode_table(view, code)
                if len(values) > 1 and not np.all(values[1:] > values[:-1]):
                    raise CorruptionError(f"table {i}: values out of order across blocks",
                                          database="segments")
                counts = codec.block_counts(np.concatenate(
                    [np.frombuffer(view.segment_blocks(s), np.uint8)
                     for s in range(len(view.segments))]) if view.segments else np.empty(0, np.uint8))
                ends = np.cumsum(counts.astype(np.int64)) - 1
                if len(ends) and not np.array_equal(values[ends], view.keys):
                    raise CorruptionError(f"table {i}: a directory key differs from its block's "
                                          "last value", database="segments")
                if len(values) != state.table_entries:
                    raise CorruptionError(f"table {i} holds {len(values)} entries, state says "
                                          f"{state.table_entries}", database="segments")
                original = np.sort(design.invert(values))
                if reference is None:
                    reference = original
                elif not np.array_equal(reference, original):
                    raise CorruptionError(f"table {i} holds different fingerprints from table 0",
                                          database="segments")
                blocks += view.n_blocks
            log_values = self._read_log(txn, 0)
            removed = self._read_removed(txn)
            self._verify_small_records(txn)
            return dict(tables=len(self.plan.tables), blocks=blocks, table_entries=state.table_entries,
                        log_entries=len(log_values), removed_pending=len(removed))
        finally:
            txn.abort()

    def _verify_small_records(self, txn) -> None:
        """Check the checksum of every tombstone and document-key record."""
        def tombstone(key, value):
            if value != st.CRC.pack(_core.crc32c(key)):
                raise CorruptionError("tombstone checksum mismatch", database="removed", key=key)

        for db, check in ((st.DB_REMOVED, tombstone), (st.DB_DOCS, lambda k, v: _unpack_doc_value(v, k)),
                          (st.DB_KEYS, lambda k, v: _unpack_key_value(v, k))):
            cur = txn.cursor(db=self._store.dbs[db])
            try:
                for key, value in cur:
                    check(bytes(key), bytes(value))
            finally:
                cur.close()

    def vacuum_into(self, dest) -> int:
        """Write a compacted copy of the index to a new file; return its size in bytes.

        LMDB never shrinks a file: pages freed by compaction (the old copy of
        rewritten blocks, the emptied log) are kept for reuse, so after heavy
        churn a file can hold up to one table set of free pages.  This writes
        only the live pages, like SQLite's VACUUM INTO; replace the original
        with it while no other process has the index open.  Raises
        FileExistsError if dest exists.
        """
        dest = os.fspath(dest)
        if os.path.exists(dest):
            raise FileExistsError(f"{dest}: already exists")
        try:
            self._store.env.copy(dest, compact=True)
        except Exception as exc:
            if os.path.exists(dest):
                os.unlink(dest)
            raise st.translate_error(exc, dest) from exc
        return os.path.getsize(dest)

    def items(self, chunk: int = 65536):
        """Yield (fingerprints, keys) chunks of every live fingerprint, in order.

        fingerprints is a sorted uint64 array of at most chunk values and keys
        the matching list of key tuples (as :meth:`keys`).  All chunks come
        from one snapshot, so a concurrent writer never shows half a change.
        """
        snap = self._snapshot()
        values = self._fingerprints_in(snap)
        for start in range(0, len(values), chunk):
            part = values[start:start + chunk]
            yield part, self._keys_of(part.tolist(), snap)

    def fingerprints(self) -> np.ndarray:
        """Return every live fingerprint, sorted (decodes table 0)."""
        return self._fingerprints_in(self._snapshot())

    def _fingerprints_in(self, snap: Snapshot) -> np.ndarray:
        values = tables.decode_table(snap.views[0], snap.codes[0]) if snap.views[0].n_blocks \
            else EMPTY_U64
        values = merge_sorted(np.sort(self.plan.tables[0].invert(values)), snap.log_values, snap.removed)
        return values

    def iter_chunks(self, chunk_size: int = 1 << 20, *, part: int = 0, parts: int = 1):
        """Yield the live fingerprints as sorted uint64 arrays of about chunk_size each.

        The same set as fingerprints(), with bounded memory: table 0 is
        decoded a run of segments at a time (each array is sorted, arrays
        are not ordered among themselves), tombstoned values dropped; the
        append log's values not in the tables come last.  One snapshot
        serves the whole iteration.  part/parts yield only share `part` of
        `parts` (contiguous runs of segments; the log goes with the last
        part), so processes can split one index between them.
        Memory: O(chunk_size + log).  Raises CorruptionError for a bad block.
        """
        if not 0 <= part < parts:
            raise ValueError(f"need 0 <= part < parts, got part={part}, parts={parts}")
        snap = self._snapshot()
        view, code, design = snap.views[0], snap.codes[0], self.plan.tables[0]
        n_seg = len(view.segments)
        lo, hi = part * n_seg // parts, (part + 1) * n_seg // parts
        pending, size = [], 0
        for s in range(lo, hi):
            pending.append(codec.decode(view.segment_blocks(s), code))
            size += len(pending[-1])
            if size >= chunk_size or s == hi - 1:
                values = np.sort(design.invert(np.concatenate(pending)))
                pending, size = [], 0
                if len(snap.removed):
                    values = values[~isin_sorted(values, snap.removed)]
                if len(values):
                    yield values
        if part == parts - 1 and len(snap.log_values):
            log = snap.log_values[~self._in_tables(snap, snap.log_values)]
            log = log[~isin_sorted(log, snap.removed)]
            for a in range(0, len(log), chunk_size):
                yield log[a:a + chunk_size]


# -- helpers -------------------------------------------------------------------


def _required(store: st.Store, txn, key: bytes) -> bytes:
    payload = store.get_framed(txn, st.DB_META, key)
    if payload is None:
        raise CorruptionError(f"required record {key.decode()!r} is missing", database="meta", key=key)
    return payload


def _check_k_value(k) -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 0 <= k <= plans.MAX_PLANNER_K:
        raise ValueError(f"k must be in 0..{plans.MAX_PLANNER_K}, got {k}")
    return int(k)


def _check_log_limit(limit) -> None:
    if not isinstance(limit, (int, np.integer)) or limit < 1:
        raise ValueError(f"log_limit must be a positive int, got {limit!r}")


def _inverse_runs(design: plans.TableDesign):
    return tuple((dst, src, n) for src, dst, n in design.runs())


def _touched_blocks(view: tables.TableView, new_p: np.ndarray, gone_p: np.ndarray) -> int:
    if not view.n_blocks:
        return 0
    at = np.minimum(np.searchsorted(view.keys, np.concatenate([new_p, gone_p])), view.n_blocks - 1)
    return len(np.unique(at))


def _to_matches(qidx: bytes, fps: bytes, dists: bytes, offset: int) -> np.ndarray:
    out = np.empty(len(dists), dtype=MATCH_DTYPE)
    out["query"] = np.frombuffer(qidx, dtype=np.int64) + offset
    out["fingerprint"] = np.frombuffer(fps, dtype=np.uint64)
    out["distance"] = np.frombuffer(dists, dtype=np.uint8)
    return out


def _doc_items(fps: np.ndarray, keys) -> list:
    """Validate keys against fps; return [(fp, typed key bytes)] (no I/O)."""
    if keys is None:
        return []
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a sequence with one key per fingerprint, not a single str/bytes")
    keys = list(keys)
    if len(keys) != len(fps):
        raise ValueError(f"got {len(keys)} keys for {len(fps)} fingerprints")
    return [(int(fp), st.encode_doc_key(key)) for fp, key in zip(fps, keys) if key is not None]


def _pack_doc_value(fp_key: bytes, raw: bytes) -> bytes:
    """docs value: CRC-32C of (fingerprint key + typed key), then the typed key (FORMAT.md 7.6)."""
    return st.CRC.pack(_core.crc32c(fp_key + raw)) + raw


def _unpack_doc_raw(value: bytes, fp_key: bytes) -> bytes:
    raw = value[4:]
    if len(value) < 6 or st.CRC.unpack(value[:4])[0] != _core.crc32c(fp_key + raw):
        raise CorruptionError("document key record checksum mismatch", database="docs", key=fp_key)
    return raw


def _unpack_doc_value(value: bytes, fp_key: bytes):
    return st.decode_doc_key(_unpack_doc_raw(value, fp_key))


def _pack_key_value(raw: bytes, fp: int) -> bytes:
    """keys value: the fingerprint (u64 BE), then CRC-32C of (typed key + fingerprint)."""
    kb = st.u64_key(fp)
    return kb + st.CRC.pack(_core.crc32c(raw + kb))


def _unpack_key_value(value: bytes, raw: bytes) -> int:
    if len(value) != 12 or st.CRC.unpack(value[8:])[0] != _core.crc32c(raw + value[:8]):
        raise CorruptionError("key record checksum mismatch", database="keys", key=raw)
    return st.U64_BE.unpack(value[:8])[0]


def open(path, *, readonly: bool = False, **kwargs) -> Index:  # noqa: A001 - mirrors sqlite3/lmdb
    """Open an existing index (ndindex.open), as Index.open."""
    return Index.open(path, readonly=readonly, **kwargs)
