"""Operations not yet in the runs: the append log's net effect, and a writer's pending ones.

Both reduce a sequence of operations to its net effect: a fingerprint's
last operation decides whether it is added or removed; a record's (a
document key, a document, a lookup key: FORMAT.md 7.9) last operation
whether it is put or deleted.  ``LogOverlay`` holds the committed log
(arrays and record layers, extended as records arrive); ``PendingOps``
holds what one writer has not committed yet (a transaction, or
durability="normal"), changed one operation at a time, so its additions
live in a growable buffer the query kernel scans.

Records are found by *group*, the part of the record key a lookup names:
the fingerprint of a keys-by-fingerprint, document or lookup-key record
(its first 8 bytes, the lookup key for the last), the document key of a
fingerprints-by-key record (all but its last 8 bytes).
"""

from __future__ import annotations

import threading

import numpy as np

from ndindex import _core, chunks as ch
from ndindex.arrays import (EMPTY_U64, add_recent, copy_holding_gil, insert_sorted, isin_sorted,
                            sorted_unique)
from ndindex.errors import interrupts_deferred
from ndindex.records import (LOG_RECORD_SPACES, SPACE_DOCS, SPACE_FPS_BY_KEY, SPACE_KEYS_BY_FP,
                             U64_BE, LogRecord)


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Union of two sorted distinct arrays: b's new values inserted into a (O(len a) memmove)."""
    if not len(b):
        return a
    if not len(a):
        return b
    return insert_sorted(a, b[~isin_sorted(b, a)])


def _minus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if not len(a) or not len(b):
        return a
    return a[~isin_sorted(a, b)]


def record_group(space: int, key: bytes) -> bytes:
    """The part of a record key that lookups name (see the module docstring)."""
    return key[:-8] if space == SPACE_FPS_BY_KEY else key[:8]


class RecordOps:
    """Record operations reduced to their net effect: (space, key) -> (flag, value).

    Indexed by (space, group) so that a lookup costs one dict access.
    Pending operations are read by queries of other threads while the
    writer changes them (PendingOps): readers iterate copies of the dicts
    (a list() of a dict's items is taken at once under the GIL; a loop
    over the dict itself raised "dictionary changed size during
    iteration"), and the index of document lookup keys is kept with the
    count of document changes it was built at (_docs_changes), so that one
    built while the writer put a document is built again, not kept.
    """

    __slots__ = ("groups", "n", "_lookups", "_docs_changes")

    def __init__(self):
        self.groups: dict = {}
        self.n = 0
        self._lookups = None  # (_docs_changes when built, {lookup key: fps})
        self._docs_changes = 0

    def __len__(self) -> int:
        return self.n

    def set(self, space: int, key: bytes, flag: int, value: bytes = b"") -> None:
        group = self.groups.setdefault((space, record_group(space, key)), {})
        if key not in group:
            self.n += 1
        group[key] = (flag, value)
        if space == SPACE_DOCS:
            self._docs_changes += 1  # after the change: see lookup_hits

    def set_key(self, fp: int, raw: bytes, put: bool) -> None:
        """A document key operation: both of its mirror records (7.9)."""
        flag = ch.RECORD_PUT if put else ch.RECORD_DELETE
        fpb = U64_BE.pack(fp)
        self.set(SPACE_KEYS_BY_FP, fpb + raw, flag)
        self.set(SPACE_FPS_BY_KEY, raw + fpb, flag)

    def get(self, space: int, key: bytes):
        group = self.groups.get((space, record_group(space, key)))
        return None if group is None else group.get(key)

    def group(self, space: int, group: bytes) -> dict:
        """{key: (flag, value)} of one group (empty if none)."""
        return self.groups.get((space, group), {})

    def items(self, space: int | None = None):
        """(space, key, flag, value) of every operation (of one space), unordered."""
        for (sp, _), group in list(self.groups.items()):
            if space is None or sp == space:
                for key, (flag, value) in list(group.items()):
                    yield sp, key, flag, value

    def update(self, newer: "RecordOps") -> None:
        """Apply newer's operations after these (dict updates, group by group)."""
        for g, ops in list(newer.groups.items()):
            mine = self.groups.get(g)
            if mine is None:
                ops = dict(ops)
                self.groups[g] = ops
                self.n += len(ops)
            else:
                before = len(mine)
                mine.update(ops)
                self.n += len(mine) - before
            if g[0] == SPACE_DOCS:
                self._docs_changes += 1

    def lookup_hits(self, lookup_key: int) -> list:
        """Fingerprints of the documents put here that list lookup_key.

        Lookup-key records are derived from document records when the log
        is flushed; until then lookups use this index of the puts (built on
        first use, O(documents here)).  Deleted documents are not listed.
        """
        built = self._lookups
        changes = self._docs_changes  # read before the documents
        if built is None or built[0] != changes:
            from ndindex.docstore import lookup_keys_of
            index = {}
            for _, key, flag, value in self.items(SPACE_DOCS):
                if flag == ch.RECORD_PUT:
                    fp = U64_BE.unpack_from(key)[0]
                    for lk in lookup_keys_of(flag, value).tolist():
                        index.setdefault(lk, set()).add(fp)
            built = self._lookups = (changes, index)
        return list(built[1].get(lookup_key, ()))

    def changed_since(self, before: "RecordOps") -> "RecordOps":
        """The operations here that before (an earlier copy of these) lacks or
        holds otherwise; a group that did not change is skipped by one
        comparison of its dicts (in C)."""
        changed = RecordOps()
        for (space, g), group in list(self.groups.items()):
            theirs = before.groups.get((space, g))
            if theirs == group:
                continue
            theirs = theirs or {}
            for key, op in list(group.items()):
                if theirs.get(key) != op:
                    changed.set(space, key, *op)
        return changed

    def copy(self) -> "RecordOps":
        out = RecordOps()
        out.groups = {g: dict(d) for g, d in list(self.groups.items())}
        out.n = self.n
        return out

    def apply_record(self, record: LogRecord) -> None:
        for fp, raw in record.key_puts:
            self.set_key(fp, raw, True)
        for fp, raw in record.key_deletes:
            self.set_key(fp, raw, False)
        for space, key, flag, value in record.records:
            self.set(space, key, flag, value)

    def to_record_parts(self) -> tuple[list, list, list]:
        """(key puts, key deletes, other records), sorted, as a LogRecord holds them."""
        puts, deletes, other = [], [], []
        for sp, key, flag, value in self.items():
            if sp == SPACE_KEYS_BY_FP:
                pair = (U64_BE.unpack_from(key)[0], key[8:])
                (puts if flag == ch.RECORD_PUT else deletes).append(pair)
            elif sp in LOG_RECORD_SPACES:
                other.append((sp, key, flag, value))
        return sorted(puts), sorted(deletes), sorted(other)


class PackedLayer:
    """Committed record operations of some log records, packed: {space: raw stream}.

    Each space's operations are one sorted raw record stream (the format of
    record sub-blocks), searched by binary search over record offsets and
    merged in C: no Python object per operation, so a log of a million
    key operations costs its bytes, not a million dicts.
    """

    __slots__ = ("streams", "n", "_offsets", "_lookups")

    def __init__(self, streams: dict, n: int):
        self.streams = streams
        self.n = n
        self._offsets = {}
        self._lookups = None

    @classmethod
    def of_record(cls, record: LogRecord) -> "PackedLayer":
        """The operations of one log record (distinct within it)."""
        by_space = {}
        for pairs, flag in ((record.key_puts, ch.RECORD_PUT), (record.key_deletes, ch.RECORD_DELETE)):
            for fp, raw in pairs:
                fpb = U64_BE.pack(fp)
                by_space.setdefault(SPACE_KEYS_BY_FP, []).append((fpb + raw, flag, b""))
                by_space.setdefault(SPACE_FPS_BY_KEY, []).append((raw + fpb, flag, b""))
        for space, key, flag, value in record.records:
            by_space.setdefault(space, []).append((key, flag, value))
        streams = {space: _core.records_pack(sorted(recs)) for space, recs in by_space.items()}
        return cls(streams, sum(len(r) for r in by_space.values()))

    @classmethod
    def merged(cls, older: "PackedLayer", newer: "PackedLayer") -> "PackedLayer":
        streams = {}
        n = 0
        for space in set(older.streams) | set(newer.streams):
            parts = [x.streams[space] for x in (newer, older) if space in x.streams]
            raw, count = _core.records_merge(parts, None, None, False)
            streams[space] = raw
            n += count
        return cls(streams, n)

    def group(self, space: int, group: bytes) -> list:
        """[(key, flag, value)] of the operations whose key begins with group."""
        raw = self.streams.get(space)
        if raw is None:
            return []
        offsets = self._offsets.get(space)
        if offsets is None:
            offsets = self._offsets[space] = _core.records_offsets(raw)
        return _core.records_prefix(raw, offsets, group)

    def lookup_hits(self, lookup_key: int) -> list:
        """Fingerprints of the documents put here that list lookup_key (see
        RecordOps.lookup_hits)."""
        if self._lookups is None:
            ops = RecordOps()
            for key, flag, value in _core.records_unpack(self.streams.get(SPACE_DOCS, b"")):
                ops.set(SPACE_DOCS, key, flag, value)
            self._lookups = ops
        return self._lookups.lookup_hits(lookup_key)


class LayeredRecords:
    """The log's record operations as immutable packed layers, newest last.

    A new snapshot extends its predecessor's log by a few records; copying
    the operations per snapshot would cost O(log size) per commit.  Layers
    are merged like a binary counter (a layer joins the one below once it
    is at least half that size), so a snapshot copies O(log n) references
    and each operation is merged O(log n) times in all (in C).
    """

    def __init__(self, layers: tuple = ()):
        self.layers = layers

    def __len__(self) -> int:
        return sum(layer.n for layer in self.layers)

    def push(self, layer: PackedLayer) -> "LayeredRecords":
        layers = list(self.layers)
        while layers and 2 * layer.n >= layers[-1].n:
            layer = PackedLayer.merged(layers.pop(), layer)
        return LayeredRecords(tuple(layers) + (layer,))

    def group(self, space: int, group: bytes) -> dict:
        """{key: (flag, value)} of one group, newest operation winning."""
        out = {}
        for layer in reversed(self.layers):
            for key, flag, value in layer.group(space, group):
                if space == SPACE_FPS_BY_KEY and len(key) != len(group) + 8:
                    continue
                out.setdefault(key, (flag, value))
        return out

    def lookup_hits(self, lookup_key: int) -> set:
        out = set()
        for layer in self.layers:
            out.update(layer.lookup_hits(lookup_key))
        return out

    def streams(self) -> dict:
        """{space: one raw stream of the net operations}, all layers merged (C)."""
        if not self.layers:
            return {}
        layer = self.layers[0]
        for newer in self.layers[1:]:
            layer = PackedLayer.merged(layer, newer)
        return layer.streams

    def flattened(self) -> RecordOps:
        out = RecordOps()
        for space, raw in self.streams().items():
            for key, flag, value in _core.records_unpack(raw):
                out.set(space, key, flag, value)
        return out


class LogOverlay:
    """The net effect of the log records of a snapshot, in order.

    adds and removes are sorted, distinct and disjoint; ``ops`` holds the
    record operations (document keys, documents, lookup keys).  The adds
    are held as two sorted disjoint arrays (older, recent), merged when
    ``adds`` is read (arrays.add_recent).
    """

    def __init__(self):
        self._adds = (EMPTY_U64, EMPTY_U64)
        self.removes = EMPTY_U64
        self.ops = LayeredRecords()
        self.records = 0

    @property
    def adds(self) -> np.ndarray:
        older, recent = self._adds
        if len(recent):
            older = insert_sorted(older, recent)
            self._adds = (older, EMPTY_U64)
        return older

    @adds.setter
    def adds(self, values: np.ndarray) -> None:
        self._adds = (values, EMPTY_U64)

    def n_adds(self) -> int:
        return len(self._adds[0]) + len(self._adds[1])

    def added(self, values: np.ndarray) -> np.ndarray:
        """A mask of the values that are among the adds, without merging the adds."""
        older, recent = self._adds
        return isin_sorted(values, older) | isin_sorted(values, recent)

    def copy(self) -> "LogOverlay":
        out = LogOverlay()
        out._adds, out.removes, out.ops, out.records = self._adds, self.removes, self.ops, \
            self.records
        return out

    def apply(self, record: LogRecord) -> None:
        """Apply one record after everything applied so far."""
        self.apply_all([record])

    def _add(self, values: np.ndarray) -> np.ndarray:
        """Additions only (sorted, distinct): into the recent part, O(values + recent).
        Returns those that were not among the adds."""
        if len(values) and len(self.removes):
            back = values[isin_sorted(values, self.removes)]
            if len(back):
                self.removes = _minus(self.removes, back)
        fresh = values[~self.added(values)]
        self._adds = add_recent(*self._adds, fresh)
        return fresh

    def apply_all(self, records: list) -> np.ndarray | None:
        """Apply records in order, as apply() one by one does, in one sort.

        A value's last operation decides whether it is added or removed:
        a stable sort of every operation by value (the state first, then
        the records in order) puts it last among its equals.  One record
        at a time cost a merge into the whole log each: reading a log of
        30 records took the compactor 60% of its flush time.

        Returns, when the records only add, the values they added that the
        adds lacked (sorted; what a snapshot's per-table log takes in);
        otherwise None.
        """
        if not records:
            return EMPTY_U64
        fresh = None
        if not any(len(r.removes) for r in records):
            fresh = self._add(records[0].adds if len(records) == 1 else
                              sorted_unique(np.concatenate([r.adds for r in records])))
        elif len(records) == 1:
            (record,) = records
            self.adds = _union(_minus(self.adds, record.removes), record.adds)
            self.removes = _union(_minus(self.removes, record.adds), record.removes)
        else:
            parts = [self.adds, self.removes]
            for r in records:
                parts += [r.adds, r.removes]
            values = np.concatenate(parts)
            is_add = np.concatenate([np.full(len(a), i % 2 == 0) for i, a in enumerate(parts)])
            order = np.argsort(values, kind="stable")
            ordered = values[order]
            last = np.ones(len(ordered), dtype=bool)
            np.not_equal(ordered[1:], ordered[:-1], out=last[:-1])
            kept, added = ordered[last], is_add[order][last]
            self.adds, self.removes = kept[added], kept[~added]
        for record in records:
            self._push_ops(record)
        return fresh

    def _push_ops(self, record: LogRecord) -> None:
        if record.key_puts or record.key_deletes or record.records:
            self.ops = self.ops.push(PackedLayer.of_record(record))
        self.records += 1


#: Pending additions a query scans one by one, at most: past this many
#: (about 0.4 us a query), the others are indexed per table, as the log is
#: (PendingOps.query_view).  Scanned whole, a transaction of n check_and_add
#: calls cost O(n^2): 17 us a call at 100,000 in one transaction.
PENDING_SCAN_MAX = 1024


class PendingOps:
    """One writer's uncommitted operations, in order, reduced to their net effect.

    lock: the writer's lock, which every change is made under; a query in
    another thread updates the index of the additions only if it can take
    it (query_view).  Queries of other threads read the operations while
    the writer changes them, without that lock (it is held for a whole
    transaction): _mu, held for a few lines by each change and by
    query_view, makes what a query takes one consistent state.  Without
    it, a query's removes() could store the sorted removals of a moment
    before the writer's last remove() as current, and the next checkpoint
    committed that stale set: removals acknowledged and lost
    (tools/soak_oracle.py with durability="normal" found it).
    """

    def __init__(self, lock=None):
        self._mu = threading.Lock()
        self._buf = np.empty(64, dtype=np.uint64)
        self._n = 0
        self._where: dict = {}      # fingerprint -> index in _buf
        self._removes: set = set()
        self._removes_sorted = EMPTY_U64
        self._removes_dirty = False
        self.ops = RecordOps()
        self._lock = lock
        #: (m, capsule, tables): _buf[:m] is indexed, per table (older,
        #: recent) sorted permuted arrays (arrays.add_recent), and the
        #: capsule (_core.pending_index) over them; None, None before the
        #: first index.  The index may hold values removed since (they are
        #: among the removals, which hide them) and values past m (a remove
        #: moved m back): never a value added that it lacks below m.
        self._index = (0, None, None)

    def __len__(self) -> int:
        return self._n + len(self._removes) + len(self.ops)

    def __bool__(self) -> bool:  # asked per query: one call, not __len__'s three
        return bool(self._n or self._removes or self.ops.n)

    def query_view(self, plan) -> tuple:
        """(additions to scan one by one, removals, pending_index capsule or
        None): what the query kernel takes for these operations, as of one
        moment, and none of it changed afterwards (the kernel reads it
        without the GIL).  Indexes the additions past PENDING_SCAN_MAX
        first, under the writer's lock (taken only if free: else this
        scans more)."""
        if self._n - self._index[0] > PENDING_SCAN_MAX:
            # Ctrl-C held back: landing just after the acquire, before the
            # try, it left the writer's lock held for ever (the checkpoint
            # thread, and close() joining it, then waited; sweep_interrupt
            # seed 15).  One fold in PENDING_SCAN_MAX additions pays for it.
            with interrupts_deferred():
                if self._lock is None or self._lock.acquire(blocking=False):
                    try:
                        self._fold(plan)
                    finally:
                        if self._lock is not None:
                            self._lock.release()
        if self._lock is not None and self._lock._is_owned():
            # The writer's own query (check_and_add, remove): nothing
            # changes while it holds the lock, so views will do.
            m, capsule, _ = self._index
            if self._removes_dirty:
                with self._mu:  # a query of another thread may be sorting them
                    self._sorted_removes()
            return self._buf[m:self._n], self._removes_sorted, capsule
        with self._mu:
            m, capsule, _ = self._index
            # A copy: a remove() moves the last addition into the place it
            # frees, which a view would show twice.  At most about
            # PENDING_SCAN_MAX values.
            return self._buf[m:self._n].copy(), self._sorted_removes(), capsule

    def _fold(self, plan) -> None:
        """Index the additions _buf[m:n] (see _index)."""
        m, _, tables = self._index
        n = self._n
        new = self._buf[m:n]
        if tables is None:
            tables = [(EMPTY_U64, EMPTY_U64)] * len(plan.tables)
        else:
            # Positions a remove gave back (it moved m down) hold values
            # indexed already: they stay out (table 0 holds every value).
            older, recent = tables[0]
            p0 = plan.tables[0].apply(new)
            new = new[~(isin_sorted(p0, older) | isin_sorted(p0, recent))]
        if len(new):
            tables = [add_recent(older, recent, np.sort(d.apply(new)))
                      for (older, recent), d in zip(tables, plan.tables)]
        index = (n, _core.pending_index(tables), tables)
        with self._mu:
            self._index = index

    def add(self, fps) -> None:
        """Add fingerprints (an iterable of ints)."""
        for fp in fps:
            self.add_one(int(fp))

    def check_and_add(self, plan, kernel, fp: int, k: int) -> list:
        """check_and_add in a transaction, the writer's lock held: kernel's
        (fingerprint, distance) pairs within k of fp among the snapshot and
        these operations, fp added to them when there are none."""
        found = _core.query(kernel, fp, k, *self.query_view(plan))
        if not found:
            self.add_one(fp)
        return found

    def add_one(self, fp: int) -> None:
        """Add one fingerprint (an int).  check_and_add's write: _mu only
        for a removal it takes back.  An append needs none: a query copies
        _buf[m:_n] reading _buf before _n, and here the value is in place
        before _n counts it, in a buffer that holds everything below _n."""
        if fp in self._removes:
            with self._mu:
                self._removes.discard(fp)
                self._removes_dirty = True
        if fp not in self._where:
            n = self._n
            if n == len(self._buf):
                self._buf = np.concatenate([self._buf, np.empty(n, np.uint64)])
            self._buf[n] = fp
            self._where[fp] = n
            self._n = n + 1

    def add_array(self, fps: np.ndarray) -> None:
        """Add sorted distinct fingerprints in bulk."""
        if len(fps) < 16:  # check_and_add's one item: the array path's set-up costs more
            self.add(fps.tolist())
            return
        with self._mu:
            if self._removes:
                hit = [int(v) for v in fps if int(v) in self._removes]
                if hit:
                    self._removes.difference_update(hit)
                    self._removes_dirty = True
            fresh = fps if not self._where else np.array(
                [v for v in fps.tolist() if v not in self._where], dtype=np.uint64)
            need = self._n + len(fresh)
            if need > len(self._buf):
                grown = np.empty(max(need, 2 * len(self._buf)), np.uint64)
                grown[:self._n] = self._buf[:self._n]
                self._buf = grown
            self._buf[self._n:need] = fresh
            self._where.update(zip(fresh.tolist(), range(self._n, need)))
            self._n = need

    def remove(self, fps) -> None:
        """Remove fingerprints (an iterable of ints)."""
        with self._mu:
            for fp in fps:
                fp = int(fp)
                i = self._where.pop(fp, None)
                if i is not None:
                    last = self._n - 1
                    if i != last:
                        moved = int(self._buf[last])
                        self._buf[i] = moved
                        self._where[moved] = i
                    self._n = last
                    m, capsule, tables = self._index
                    if i < m:  # position i now holds a value the index may lack
                        self._index = (i, capsule, tables)
                if fp not in self._removes:
                    self._removes.add(fp)
                    self._removes_dirty = True

    def copy(self) -> "PendingOps":
        """The same operations in a new set (a transaction's undo, a
        savepoint's): the structures copied as they are (C loops), not
        rebuilt from the values (a Python loop: a one-item transaction on 10,000
        pending operations under durability="normal" took 0.65 ms).  The
        copy's additions are not indexed until a query needs them."""
        out = PendingOps(self._lock)
        with self._mu:
            out._buf = copy_holding_gil(self._buf[:max(self._n, 64)])
            out._n = self._n
            out._where = self._where.copy()
            out._removes = set(self._removes)
            out._removes_sorted = self._removes_sorted
            out._removes_dirty = self._removes_dirty
        out.ops = self.ops.copy()
        return out

    def changes_since(self, before: "PendingOps") -> tuple:
        """(fingerprints added, fingerprints removed, RecordOps changed):
        the operations that turn before (an earlier copy of this set) into
        this one, a transaction's net effect.  Set operations on the dicts'
        keys (C loops): sets built from the values took 0.2 ms for every
        10,000 operations pending, in every one-item transaction."""
        with self._mu, before._mu:
            a_before, a_after = before._where.keys(), self._where.keys()
            r_before, r_after = before._removes, self._removes
            adds = sorted(a_after - a_before)
            removes = sorted((r_after - r_before) | (a_before - a_after - r_after))
        return (np.array(adds, dtype=np.uint64), np.array(removes, dtype=np.uint64),
                self.ops.changed_since(before.ops))

    def apply(self, record: LogRecord) -> None:
        """Apply a record's operations after everything pending so far."""
        self.remove(record.removes.tolist())
        self.add_array(record.adds)
        self.ops.apply_record(record)

    def adds(self) -> np.ndarray:
        """The pending additions (unsorted view; valid until the next change)."""
        return self._buf[:self._n]

    def removes(self) -> np.ndarray:
        """The pending removals, sorted (never changed afterwards)."""
        with self._mu:
            return self._sorted_removes()

    def _sorted_removes(self) -> np.ndarray:
        # _mu held: the flag and the array change together.
        if self._removes_dirty:
            self._removes_sorted = np.array(sorted(self._removes), dtype=np.uint64)
            self._removes_dirty = False
        return self._removes_sorted

    def is_added(self, fp: int) -> bool:
        return fp in self._where

    def is_removed(self, fp: int) -> bool:
        return fp in self._removes

    def to_record(self) -> LogRecord:
        """The net effect as one log record (disjoint sorted arrays and key lists)."""
        puts, deletes, other = self.ops.to_record_parts()
        return LogRecord(np.sort(self.adds()), self.removes().copy(), puts, deletes, other)

