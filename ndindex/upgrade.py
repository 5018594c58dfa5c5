"""Upgrading an index file to the newest format (``ndindex upgrade``).

A format-2 file of the delta coding gets restart tables (coding 2), a
format-3 file packed raw blocks (FORMAT.md 5.3), and a format-3 or 4 file
tombstone runs and padded log records (7.8, [F19]), all format 5:
:func:`upgrade` names the new format and coding in its header and
compacts it fully, which rewrites every table in it (FORMAT.md 7.2).  A
format-1 file is rebuilt in the newest format (5, or 2 for the xor
coding), in two parts:

- :class:`FormatV1Reader` reads a format-1 file on its own: file format 1
  is frozen (``git show 9521845:format-spec/FORMAT.md``, section 7), so
  its layout is restated here rather than borrowed from the format-2
  modules, which keep changing.  Only the block codec and the plan record
  are shared, as the two formats share them.  Every checksum format 1
  defines is verified before the record it covers is used, every count and
  length is checked against the bytes that hold it, and the invariants
  that tie the records together ([F7]-[F12]) are checked too: a damaged
  file raises CorruptionError naming the record, never an upgrade that
  silently lost or invented data.
- :func:`upgrade` writes a new index with the same settings, every live
  fingerprint and every document key through the public API, checks it
  against the source, and for an in-place upgrade swaps it in without ever
  leaving the user without a whole index at the original name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import os
import re
import secrets
import stat
import struct
import time

import lmdb
import numpy as np

from ndindex import _core, codec, pages, plan as plans, validate
from ndindex.arrays import EMPTY_U64, merge_unique
from ndindex.descriptors import Descriptor
from ndindex.errors import CorruptionError, FormatError, NdindexError, ReadOnlyError
from ndindex.index import Index
from ndindex.records import format_version_of
from ndindex.store import (check_lock_file, check_path_for_open, fsync_path, pick_meta,
                           publish, translate_error)
from ndindex.writer import put_header

# -- format 1, as its spec defines it (section 7) ----------------------------------

V1_VERSION = 1
MAGIC = b"ndindex\0"
DB_META, DB_SEGMENTS, DB_LOG = "meta", "segments", "log"
DB_DOCS, DB_KEYS, DB_REMOVED = "docs", "keys", "removed"
V1_DBS = (DB_META, DB_SEGMENTS, DB_LOG, DB_DOCS, DB_KEYS, DB_REMOVED)
DUPSORT_DBS = (DB_DOCS, DB_KEYS)
#: The named database only format 2 has: how a format-2 file is told apart.
V2_ONLY_DB = "chunks"
KEY_HEADER, KEY_PLAN, KEY_STATE = b"header", b"plan", b"state"
KEY_FINGERPRINTER, KEY_CODE_PREFIX = b"fingerprinter", b"code:"

HEADER = struct.Struct("<8sHHBBBBQ")   # magic, read_v, write_v, f, k, t, reserved, expected_n
STATE = struct.Struct("<QQQQQQ")       # tables_gen, log_next_seq, removed_gen, table_entries,
#                                        code_n, log_entries
CRC = struct.Struct("<I")
U64_BE = struct.Struct(">Q")
LOG_COUNT = struct.Struct("<I")
SEGMENT_HEAD = struct.Struct("<IHH")   # checksum, n_blocks, reserved
SEGMENT_HEADER_BYTES = 512
SEGMENT_MAX_BLOCKS = 63
BLOCK_BYTES = codec.BLOCK_BYTES
#: Typed document keys: a type byte (0 bytes, 1 text) and 1..500 bytes.
MAX_DOC_KEY_BYTES = 500
#: Rows the page checker returns per call, to bound its memory.
PAGE_SCAN_ROWS = 65536
#: Read transactions begun before giving up on a file whose writer keeps committing.
SNAPSHOT_RETRIES = 10

# -- the upgrade ---------------------------------------------------------------------

#: Fingerprints per Index.add call (one durable commit each).
ADD_BATCH_FINGERPRINTS = 1 << 16
#: The backup of an in-place upgrade: the format-1 file under this suffix.
BACKUP_SUFFIX = ".v1"
#: The temporary name the new file is built under, beside its destination.
_BUILD_NAME = ".{name}.{tag}.upgrading"
_BUILD_TAG_HEX = 12


def _bad(message: str, database: str, key: bytes | None = None, offset: int | None = None):
    return CorruptionError(message, database=database, key=key, offset=offset)


def _unframe(value, database: str, key: bytes) -> bytes:
    """Payload of a format-1 framed record: payload, then CRC-32C of the payload ([F2])."""
    value = bytes(value)
    if len(value) < CRC.size:
        raise _bad(f"{len(value)}-byte record is too short for its checksum", database, key)
    payload = value[:-CRC.size]
    if _core.crc32c(payload) != CRC.unpack_from(value, len(payload))[0]:
        raise _bad("record checksum mismatch", database, key)
    return payload


def _decode_doc_key(raw: bytes, database: str, key: bytes):
    """A typed document key (7.6) as str or bytes; CorruptionError if impossible."""
    if not 2 <= len(raw) <= 1 + MAX_DOC_KEY_BYTES:
        raise _bad(f"document key of {len(raw) - 1} bytes (1..{MAX_DOC_KEY_BYTES})", database, key)
    if raw[0] == 1:
        try:
            return raw[1:].decode("utf-8")
        except UnicodeDecodeError:
            raise _bad("text document key is not UTF-8", database, key) from None
    if raw[0] == 0:
        return raw[1:]
    raise _bad(f"document key type byte {raw[0]:#04x} unknown", database, key)


class FormatV1Reader:
    """A format-1 index file opened read-only, its records checked as they are read.

    Opening checks the LMDB meta pages, that the file is not truncated
    ([F3]), and every page of the named databases' trees with the project's
    page reader (so that LMDB's own tree code never walks a damaged page),
    then reads the header, plan, codes, state and fingerprinter records.
    Everything then comes from one LMDB read transaction, one snapshot.

    Attributes after opening: ``k``, ``expected_n``, ``coding``, ``plan``,
    ``fingerprinter`` (bytes or None), ``read_version``, ``write_version``
    and the ``state`` counters (a dict).  Use as a context manager or call
    :meth:`close`.
    """

    def __init__(self, path, *, lock: bool | None = None):
        """Open path.

        lock: whether LMDB may use its lock file (registering this reader,
        so that a concurrent format-1 writer does not reuse pages it reads);
        None tries and opens without one when the directory refuses it;
        False is for a caller that holds the file exclusively already.
        Raises FileNotFoundError, IsADirectoryError, FormatError (not a
        format-1 ndindex file, or a read version above 1), CorruptionError.
        """
        self.path = os.fsdecode(path)
        self._env = None
        self._txn = None
        names, self._checked_txnid = _check_pages(self.path)
        missing = [name for name in V1_DBS if name not in names]
        if missing:
            raise FormatError(f"{self.path}: not a format-1 ndindex file (no "
                              f"{', '.join(missing)} database)")
        self._env = _open_env(self.path, lock)
        try:
            self._txn = self._begin_checked()
            self._dbs = {name: self._env.open_db(name.encode(), txn=self._txn, create=False,
                                                 dupsort=name in DUPSORT_DBS)
                         for name in V1_DBS}
            self._read_settings()
        except lmdb.Error as exc:
            self.close()
            raise translate_error(exc, self.path) from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End the read transaction and close the file.  Idempotent."""
        txn, self._txn = self._txn, None
        env, self._env = self._env, None
        try:
            if txn is not None:
                txn.abort()
        except lmdb.Error as exc:  # callers see ndindex errors only
            raise translate_error(exc, self.path) from exc
        finally:
            if env is not None:
                try:
                    env.close()
                except lmdb.Error as exc:
                    raise translate_error(exc, self.path) from exc

    # In C: no point for a Ctrl-C between the with statement and them (see Index).
    __enter__ = _core.enter_self
    __exit__ = _core.exit_closing

    def _begin_checked(self):
        """Begin the read transaction; check the trees of its own snapshot first.

        The pages were checked for the newest commit before LMDB opened;
        a format-1 writer in another process may have committed since, so
        the snapshot this transaction pins is checked again when it differs.
        """
        for _ in range(SNAPSHOT_RETRIES):
            txn = self._env.begin(buffers=True)
            if txn.id() == self._checked_txnid or \
                    _check_pages(self.path, txnid=txn.id()) is not None:
                return txn
            txn.abort()  # its meta page was overwritten meanwhile: begin again
        raise NdindexError(f"{self.path}: the file keeps changing; stop its writers and retry")

    # -- settings (7.2, 7.3) --------------------------------------------------------

    def _meta(self, key: bytes, required: bool = True):
        value = self._txn.get(key, db=self._dbs[DB_META])
        if value is None:
            if required:
                raise FormatError(f"{self.path}: not a format-1 ndindex file (no {key.decode()!r} "
                                  "record in meta)")
            return None
        return _unframe(value, DB_META, key)

    def _read_settings(self) -> None:
        header = self._meta(KEY_HEADER)
        if len(header) != HEADER.size:
            raise _bad(f"header is {len(header)} bytes, expected {HEADER.size}", DB_META,
                       KEY_HEADER)
        magic, read_v, write_v, f, k, t, reserved, expected_n = HEADER.unpack(header)
        if magic != MAGIC:
            raise FormatError(f"{self.path}: not an ndindex file (magic {magic!r})")
        if read_v > V1_VERSION:
            raise FormatError(f"{self.path}: header read version {read_v} > supported {V1_VERSION}")
        if f != 64 or reserved != 0:
            raise _bad(f"header f={f} reserved={reserved}, expected 64 and 0", DB_META, KEY_HEADER)
        self.read_version, self.write_version = read_v, write_v
        self.k, self.expected_n = k, expected_n
        self.plan = plans.Plan.from_bytes(self._meta(KEY_PLAN))
        if len(self.plan.tables) != t:
            raise _bad(f"header names {t} tables, the plan has {len(self.plan.tables)}",
                       DB_META, KEY_PLAN)
        # Format 1 wrote only what its planner accepts: k 0..12, expected_n
        # >= 1, a plan covering k.  Anything else is damage, not a setting.
        if not (k <= plans.MAX_PLANNER_K and expected_n >= 1 and self.plan.k >= k):
            raise _bad(f"header k={k} expected_n={expected_n} with a plan for k={self.plan.k}",
                       DB_META, KEY_HEADER)
        self.codes = [codec.HuffmanCode.from_bytes(self._meta(KEY_CODE_PREFIX + bytes([i])))
                      for i in range(t)]
        codings = {code.coding for code in self.codes}
        if len(codings) != 1:
            raise _bad(f"the tables' codes name different codings {sorted(codings)}",
                       DB_META, KEY_CODE_PREFIX)
        self.coding = codings.pop()
        state = self._meta(KEY_STATE)
        if len(state) != STATE.size:
            raise _bad(f"state record is {len(state)} bytes, expected {STATE.size}",
                       DB_META, KEY_STATE)
        self.state = dict(zip(("tables_generation", "log_next_seq", "removed_generation",
                               "table_entries", "code_n", "log_entries"), STATE.unpack(state)))
        self.fingerprinter = self._meta(KEY_FINGERPRINTER, required=False)

    # -- fingerprints (7.4, 7.5) -------------------------------------------------------

    def fingerprints(self, progress=None) -> np.ndarray:
        """Return the live fingerprints, sorted: (tables | log) - tombstones ([F10]).

        Decodes every block of every table and checks that all tables hold
        the same fingerprints ([F9]), as many as the state record says.
        progress(phase, done, total), if given, is called after each table.
        Cost: a full read of the tables; memory O(N) (three arrays of N).
        Raises CorruptionError naming the first bad record.
        """
        t = len(self.plan.tables)
        reference = None
        for i, design in enumerate(self.plan.tables):
            values = np.sort(design.invert(self._table_values(i)))
            if len(values) != self.state["table_entries"]:
                raise _bad(f"table {i} holds {len(values)} fingerprints, the state record says "
                           f"{self.state['table_entries']}", DB_SEGMENTS)
            if reference is None:
                reference = values
            elif not np.array_equal(reference, values):
                raise _bad(f"table {i} holds different fingerprints from table 0", DB_SEGMENTS)
            if progress is not None:
                progress("reading", i + 1, t)
        self._check_no_stray_segments(t)
        return merge_unique([reference, self.log_values()], self.tombstones())

    def _table_values(self, table: int) -> np.ndarray:
        """The permuted values of one table, in order, every segment checked ([F7], [F8])."""
        parts, last = [], None
        cur = self._txn.cursor(db=self._dbs[DB_SEGMENTS])
        try:
            found = cur.set_range(bytes([table]))
            while found:
                key = bytes(cur.key())
                if key[0] != table:
                    break
                values = self._segment_values(key, cur.value(), table)
                if last is not None and values[0] <= last:
                    raise _bad("segment values do not increase from the previous segment",
                               DB_SEGMENTS, key)
                last = values[-1]
                parts.append(values)
                found = cur.next()
        finally:
            cur.close()
        return np.concatenate(parts) if parts else EMPTY_U64

    def _segment_values(self, key: bytes, value, table: int) -> np.ndarray:
        mv = memoryview(value)
        if len(key) != 9:
            raise _bad(f"segment key of {len(key)} bytes, expected 9", DB_SEGMENTS, key)
        if len(mv) < SEGMENT_HEADER_BYTES:
            raise _bad(f"segment of {len(mv)} bytes is shorter than its header", DB_SEGMENTS, key)
        stored, n, reserved = SEGMENT_HEAD.unpack_from(mv, 0)
        if _core.crc32c(mv[4:SEGMENT_HEADER_BYTES]) != stored:
            raise _bad("segment header checksum mismatch", DB_SEGMENTS, key, 0)
        if not 1 <= n <= SEGMENT_MAX_BLOCKS or reserved:
            raise _bad(f"segment header claims {n} blocks (reserved {reserved})", DB_SEGMENTS,
                       key, 4)
        if len(mv) != SEGMENT_HEADER_BYTES + n * BLOCK_BYTES:
            raise _bad(f"segment is {len(mv)} bytes, its header implies "
                       f"{SEGMENT_HEADER_BYTES + n * BLOCK_BYTES}", DB_SEGMENTS, key)
        block_keys = np.frombuffer(mv[8:8 + 8 * n], dtype="<u8").astype(np.uint64)
        if n > 1 and not np.all(block_keys[1:] > block_keys[:-1]):
            raise _bad("segment block keys do not increase", DB_SEGMENTS, key, 8)
        if int(block_keys[-1]) != U64_BE.unpack_from(key, 1)[0]:
            raise _bad("segment key differs from its last block key", DB_SEGMENTS, key)
        blocks = mv[SEGMENT_HEADER_BYTES:]
        try:
            values = codec.decode(blocks, self.codes[table])
        except CorruptionError as exc:
            # The codec knows only the block's place in the buffer it was given.
            reason = str(exc).rsplit(" (database=", 1)[0]
            offset = None if exc.offset is None else SEGMENT_HEADER_BYTES + exc.offset
            raise _bad(f"table {table}: {reason}", DB_SEGMENTS, key, offset) from exc
        ends = np.cumsum(codec.block_counts(blocks).astype(np.int64)) - 1
        if not np.array_equal(values[ends], block_keys):
            raise _bad("a block key differs from its block's last value", DB_SEGMENTS, key, 8)
        return values

    def _check_no_stray_segments(self, tables: int) -> None:
        cur = self._txn.cursor(db=self._dbs[DB_SEGMENTS])
        try:
            if cur.set_range(bytes([tables])):
                key = bytes(cur.key())
                raise _bad(f"a segment of table {key[0]}; the plan has {tables} tables",
                           DB_SEGMENTS, key)
        finally:
            cur.close()

    def log_values(self) -> np.ndarray:
        """The distinct fingerprints of the append log, sorted (7.5).

        Each record's checksum, count and order is checked, its sequence
        number must follow the previous one's, the last must precede the
        state's ``log_next_seq``, and the counts must sum to ``log_entries``.
        """
        parts, expected_seq, total = [], None, 0
        cur = self._txn.cursor(db=self._dbs[DB_LOG])
        try:
            for key, value in cur:
                key = bytes(key)
                if len(key) != 8:
                    raise _bad(f"log key of {len(key)} bytes, expected 8", DB_LOG, key)
                seq = U64_BE.unpack(key)[0]
                if expected_seq is not None and seq != expected_seq:
                    raise _bad(f"log record {seq} follows record {expected_seq - 1}", DB_LOG, key)
                expected_seq = seq + 1
                payload = _unframe(value, DB_LOG, key)
                if len(payload) < LOG_COUNT.size:
                    raise _bad(f"{len(payload)}-byte log record has no count", DB_LOG, key)
                (count,) = LOG_COUNT.unpack_from(payload)
                if len(payload) != LOG_COUNT.size + 8 * count:
                    raise _bad(f"log record of {len(payload)} bytes claims {count} fingerprints",
                               DB_LOG, key)
                values = np.frombuffer(payload, "<u8", offset=LOG_COUNT.size).astype(np.uint64)
                if count > 1 and not np.all(values[1:] > values[:-1]):
                    raise _bad("log record fingerprints are not sorted and distinct", DB_LOG, key)
                parts.append(values)
                total += count
        finally:
            cur.close()
        if expected_seq is not None and expected_seq != self.state["log_next_seq"]:
            raise _bad(f"the last log record is {expected_seq - 1}, the state record says the next "
                       f"is {self.state['log_next_seq']}", DB_LOG)
        if total != self.state["log_entries"]:
            raise _bad(f"the log holds {total} fingerprints, the state record says "
                       f"{self.state['log_entries']}", DB_LOG)
        return np.unique(np.concatenate(parts)) if parts else EMPTY_U64

    def tombstones(self) -> np.ndarray:
        """The removed fingerprints, sorted; each tombstone's checksum checked ([F14])."""
        out = []
        cur = self._txn.cursor(db=self._dbs[DB_REMOVED])
        try:
            for key, value in cur:
                key = bytes(key)
                if len(key) != 8 or bytes(value) != CRC.pack(_core.crc32c(key)):
                    raise _bad("tombstone checksum mismatch", DB_REMOVED, key)
                out.append(U64_BE.unpack(key)[0])
        finally:
            cur.close()
        return np.array(out, dtype=np.uint64)

    # -- document keys (7.6) ----------------------------------------------------------

    def items(self, live: np.ndarray, chunk: int = ADD_BATCH_FINGERPRINTS):
        """Yield (fingerprints, keys) for the sorted live fingerprints, chunk at a time.

        keys is a list with one tuple of document keys (str or bytes) per
        fingerprint.  Every ``docs`` record's checksum is checked.  Keys of
        a fingerprint that is not live (none in a sound file: [F13]) are
        counted in ``self.orphan_keys`` and not yielded.  Cost: one pass
        over ``docs`` in key order, merged with live.
        """
        self.orphan_keys = 0
        cur = self._txn.cursor(db=self._dbs[DB_DOCS])
        try:
            records = iter(cur)
            pending = next(records, None)
            for start in range(0, len(live), chunk):
                fps = live[start:start + chunk]
                keys = []
                for fp in fps.tolist():
                    found = []
                    while pending is not None:
                        fp_key = bytes(pending[0])
                        if len(fp_key) != 8:
                            raise _bad(f"docs key of {len(fp_key)} bytes, expected 8", DB_DOCS,
                                       fp_key)
                        at = U64_BE.unpack(fp_key)[0]
                        if at > fp:
                            break
                        key = self._doc_key(fp_key, pending[1])
                        if at == fp:
                            found.append(key)
                        else:
                            self.orphan_keys += 1
                        pending = next(records, None)
                    keys.append(tuple(found))
                yield fps, keys
            while pending is not None:
                self._doc_key(bytes(pending[0]), pending[1])
                self.orphan_keys += 1
                pending = next(records, None)
        finally:
            cur.close()

    @staticmethod
    def _doc_key(fp_key: bytes, value):
        value = bytes(value)
        if len(value) < CRC.size + 2:
            raise _bad(f"docs record of {len(value)} bytes is too short", DB_DOCS, fp_key)
        raw = value[CRC.size:]
        if CRC.unpack_from(value)[0] != _core.crc32c(fp_key + raw):
            raise _bad("document key record checksum mismatch", DB_DOCS, fp_key)
        return _decode_doc_key(raw, DB_DOCS, fp_key)

    def check_key_mirror(self) -> int:
        """Check every ``keys`` record and that ``keys`` mirrors ``docs`` ([F12]); return the pairs.

        The two databases are ordered differently, so each side is reduced
        to its count and an order-free digest: the sum of a 128-bit BLAKE2b
        hash of every (fingerprint, typed key) pair.  Cost: one pass over
        each, O(1) memory.  Raises CorruptionError on a bad checksum or when
        the two disagree.
        """
        def digest(pairs):
            total, n = 0, 0
            for fp_key, raw in pairs:
                total += int.from_bytes(hashlib.blake2b(fp_key + raw, digest_size=16).digest(),
                                        "little")
                n += 1
            return n, total % (1 << 128)

        def docs_pairs():
            cur = self._txn.cursor(db=self._dbs[DB_DOCS])
            try:
                for key, value in cur:
                    key = bytes(key)
                    self._doc_key(key, value)
                    yield key, bytes(value)[CRC.size:]
            finally:
                cur.close()

        def keys_pairs():
            cur = self._txn.cursor(db=self._dbs[DB_KEYS])
            try:
                for raw, value in cur:
                    raw, value = bytes(raw), bytes(value)
                    if len(value) != 12:
                        raise _bad(f"keys record of {len(value)} bytes, expected 12", DB_KEYS, raw)
                    if CRC.unpack_from(value, 8)[0] != _core.crc32c(raw + value[:8]):
                        raise _bad("key record checksum mismatch", DB_KEYS, raw)
                    _decode_doc_key(raw, DB_KEYS, raw)
                    yield value[:8], raw
            finally:
                cur.close()

        docs, keys = digest(docs_pairs()), digest(keys_pairs())
        if docs != keys:
            raise _bad(f"the keys database ({keys[0]} records) does not mirror docs ({docs[0]} "
                       "records)", DB_KEYS)
        return docs[0]


# -- checking LMDB's pages before LMDB reads them --------------------------------------


def _check_pages(path: str, txnid: int | None = None, trees: bool = True):
    """Check the file's LMDB structure; return (names of its databases, transaction id).

    txnid None: the commit LMDB will open (the newer meta page), checked
    before LMDB maps the file: both meta pages parse and the file is as
    long as that commit's pages ([F3]).  Otherwise the commit txnid, whose
    meta page must still name it (else None is returned).  Then every page
    of the main tree and of every named tree in it is checked, with the
    overflow pages values start on: LMDB's own tree code asserts or reads
    past the file on some damaged pages, the page reader reports them.  The
    nested trees of fingerprints with several document keys (``docs`` and
    ``keys`` duplicates) are left to LMDB; trees=False checks the main tree
    only.  Raises FormatError (not an LMDB file), CorruptionError.  Cost:
    one read of the trees' pages.
    """
    check_path_for_open(path)
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(24)
    if size < 8192 or head[16:20] != struct.pack("<I", 0xBEEFC0DE):
        raise FormatError(f"{path}: not an ndindex file ({size} bytes, no LMDB meta page)")
    fm = pages.FileMap(path)
    try:
        metas = fm.metas()
        if txnid is None:
            _, meta = pick_meta(metas, path)
        else:
            meta = metas[txnid & 1]
            if isinstance(meta, CorruptionError) or meta["txnid"] != txnid:
                return None
        psize = meta["psize"]
        if (meta["last_pg"] + 1) * psize > size:
            raise CorruptionError(f"{path}: file is truncated: {size} bytes, its pages reach "
                                  f"{(meta['last_pg'] + 1) * psize}", database="lmdb")
        buf = fm.buffer(size)
        main = pages.Tree.from_record(meta["main"])
        view = pages.PageView(buf, psize, meta["last_pg"] + 1, meta["txnid"], {"main": main})
        present = {bytes(key) for key in _scan(view, "main")}
        names = [name for name in V1_DBS + (V2_ONLY_DB,) if name.encode() in present]
        view.trees.update(pages.named_trees(buf, psize, view.npages, main, names))
        for name in names if trees else ():
            for _ in _scan(view, name):
                pass
        return set(names), meta["txnid"]
    finally:
        fm.close()


def _scan(view: pages.PageView, tree: str):
    """Yield the key of every entry of a tree, checking every page (and overflow run) on the way."""
    start, skip = b"", False
    while True:
        rows = _core.lmdb_scan(view.buf, view.psize, view.npages, view.trees[tree], start, b"",
                               PAGE_SCAN_ROWS, True)
        for key, _off, _length, _flags in rows[1 if skip and rows and rows[0][0] == start else 0:]:
            yield key
        if len(rows) < PAGE_SCAN_ROWS:
            return
        # Keys are distinct within a tree (duplicates nest below one key):
        # the next call starts at the last key seen and skips it.
        start, skip = rows[-1][0], True


def _open_env(path: str, lock: bool | None) -> lmdb.Environment:
    kwargs = dict(subdir=False, readonly=True, max_dbs=len(V1_DBS) + 1, readahead=False,
                  meminit=False, map_size=max(os.path.getsize(path), 1 << 20))
    if lock is not False:
        check_lock_file(path)
    try:
        try:
            return lmdb.open(os.fsencode(path), lock=lock is not False, **kwargs)
        except lmdb.Error as exc:
            if lock is not None or not _is_permission_error(exc):
                raise
            # A read-only directory cannot hold the lock file; nothing can
            # write there either, so reading without it is safe.
            return lmdb.open(os.fsencode(path), lock=False, **kwargs)
    except lmdb.Error as exc:
        raise translate_error(exc, path) from exc


def _is_permission_error(exc: lmdb.Error) -> bool:
    return "Permission denied" in str(exc) or "Read-only file system" in str(exc)


# -- the upgrade ---------------------------------------------------------------------


def file_format(path) -> int:
    """Return the file format of an index file: 1 or 2.

    Format 1 has a ``segments`` database, format 2 ``chunks`` (the main
    tree's pages are checked first).  A format-2 file must also open.
    Raises FileNotFoundError, IsADirectoryError, FormatError (not an
    ndindex file), CorruptionError.  Cost: O(1) in the index's size.
    """
    path = os.fsdecode(path)
    names, _ = _check_pages(path, trees=False)
    if V2_ONLY_DB in names:
        Index.open(path, readonly=True).close()
        return 2
    if DB_SEGMENTS in names:
        return 1
    raise FormatError(f"{path}: not an ndindex file (an LMDB file without ndindex's databases)")


def upgrade(src, dest=None, *, backup: bool = True, progress=None) -> dict:
    """Bring an index file to the newest format; return what was done.

    A format-2 file of the delta coding gets restart tables, a format-3
    file packed raw blocks, a format-3 or 4 file tombstone runs and padded
    log records (format 5 all, see _newer_blocks: in place, or into a copy
    at dest); a format-5 file or one of the xor coding is left alone
    (``upgraded=False``).  The rest of this describes a format-1 file,
    rebuilt in the newest format: 5 for the delta coding (with restart
    tables), 2 for xor.

    Parameters: src, the format-1 file; dest, where to write the new
    index (must not exist), or None to upgrade in place: the original is
    kept as ``<src>.v1`` (deleted at the end when backup is False) and the
    new file takes its name.  progress(phase, done, total), if given, is
    called as the work advances: phases "reading" (tables decoded), "adding"
    (fingerprints written), "compacting", "checking".

    The new index has the source's k, plan, expected_n, block coding (with
    restart tables for delta) and fingerprinter record, every live
    fingerprint and its document keys.  Before it is put in place it passes
    ``verify()`` and its fingerprints, their keys, ``len()`` and settings
    are compared with the source's.  An in-place upgrade needs src to
    itself: it takes LMDB's lock file exclusively (ReadOnlyError if another
    process has the file open; one that opens it meanwhile waits).

    Crash safety (in place): the new file is built and synced under a
    temporary name beside src.  Then ``<src>.v1`` is made a second name of
    the original (a hard link: src never stops naming the original), the
    directory synced, and the new file renamed over src (atomic), the
    directory synced again; last, with backup=False, ``<src>.v1`` is
    deleted.  A crash before the rename leaves src the untouched format-1
    file (and maybe ``<src>.v1``, the same file, and a temporary, both
    cleared by the next run); a crash after it leaves src the complete
    new file.  Where hard links are not supported the backup is a
    copy, synced before the rename.

    Returns a dict: upgraded, rebuilt (a format-1 file; False for restart
    tables added in place or to a copy), source, output, backup (path or
    None),
    fingerprints, keys, tables, log_fingerprints, tombstones,
    orphan_keys (keys of fingerprints that were not live, dropped),
    source_bytes, output_bytes, seconds (total and per phase).
    Raises FileNotFoundError, FileExistsError (dest, or a ``<src>.v1``
    that is another file), FormatError (not an ndindex file),
    CorruptionError (a damaged source: src is untouched and nothing is
    left at dest), ReadOnlyError, CapacityError.  Cost: one read of the
    source, one build of the new index with a full compaction, one read
    of the new index.
    """
    src = os.fsdecode(src)
    validate.progress(progress)
    t0 = time.perf_counter()
    if file_format(src) == 2:
        return _newer_blocks(src, None if dest is None else os.fsdecode(dest), progress, t0)
    if dest is not None:
        dest = os.fsdecode(dest)
        if os.path.lexists(dest):
            raise FileExistsError(errno.EEXIST, "already exists", dest)
        with FormatV1Reader(src) as reader:
            result = _build_checked(reader, dest, progress, t0)
        result.update(source=src, output=dest, backup=None)
        result["seconds"]["total"] = time.perf_counter() - t0
        return result
    # Through a symbolic link, the file it names is upgraded (the link keeps naming it).
    real = os.path.realpath(src)
    directory = os.path.dirname(real)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ReadOnlyError(f"{src}: cannot write in its directory; upgrade it with -o OUT "
                            "to another place")
    backup_path = real + BACKUP_SUFFIX
    with _exclusive(real):
        _clear_leftovers(real)
        if os.path.lexists(backup_path) and not _same_file(backup_path, real):
            raise FileExistsError(errno.EEXIST, "already exists (move it away first: the "
                                  "upgrade keeps the original under this name)", backup_path)
        with FormatV1Reader(real, lock=False) as reader:
            result = _build_checked(reader, real, progress, t0)
        _swap_in(result.pop("built"), real, backup_path, backup)
    result.update(source=src, output=src, backup=backup_path if backup else None)
    result["seconds"]["total"] = time.perf_counter() - t0
    return result


def _newer_blocks(src: str, dest: str | None, progress, t0: float) -> dict:
    """Give a format-2 file of the delta coding restart tables, a format-3
    file packed raw blocks, a format-3 or 4 file tombstone runs and padded
    log records; see upgrade().

    In place, the header names coding 2 and format 5 in one commit, and
    compact(full=True) rewrites every table in it: runs of both codings,
    and raw blocks of both forms, are valid in a format-5 file meanwhile,
    so a crash at any point leaves a whole index, which the next upgrade
    finishes.  (A format-3 or 4 file needs only the header: every such
    file is a valid format-5 file.)  With dest, a vacuumed copy of src is
    upgraded, and src is left as it is.  The xor coding is kept: it is
    there to measure the paper's scheme.
    """
    with Index.open(src, readonly=True) as ix:
        if _is_newest(ix) and not _older_runs(ix):
            return dict(upgraded=False, format=ix._header.read_version, source=src,
                        output=None, backup=None, seconds=dict(total=time.perf_counter() - t0))
        if dest is not None:
            if os.path.lexists(dest):
                raise FileExistsError(errno.EEXIST, "already exists", dest)
            ix.vacuum_into(dest)
    target = src if dest is None else dest
    if dest is None:
        with _exclusive(os.path.realpath(src)):
            pass  # no process has it open, of any version (they hold LMDB's lock file)
    source_bytes = os.path.getsize(src)
    seconds = {}
    with Index.open(target, background_compaction=False) as ix:
        coding = newest_coding(ix.coding)
        if not _is_newest(ix):
            version = format_version_of(coding)
            header = dataclasses.replace(ix._header, coding=coding, read_version=version,
                                         write_version=version)
            # Alone for the header's commit: a process of this version that
            # opens the file meanwhile waits, then reads the new header; one
            # that opened it since the check above makes this fail.  (One of
            # a version before the open lock's wait could still slip in
            # between the two.)
            with ix._alone("or upgrade a copy with -o OUT"):
                ix._store.write(lambda wt: put_header(wt, header), sync=True)
                ix._header = header
        t = time.perf_counter()
        ix.compact(full=True, progress=progress)
        seconds["compact"] = time.perf_counter() - t
        t = time.perf_counter()
        ix.verify()
        seconds["check"] = time.perf_counter() - t
        if _older_runs(ix):
            raise NdindexError(f"{target}: a table kept blocks of its old coding after a "
                               "full compaction")
        fingerprints, tables = len(ix), len(ix.plan.tables)
    return dict(upgraded=True, rebuilt=False, format=format_version_of(coding), source=src,
                output=target, backup=None,
                fingerprints=fingerprints, keys=None, tables=tables, orphan_keys=0,
                source_bytes=source_bytes, output_bytes=os.path.getsize(target),
                seconds=dict(seconds, total=time.perf_counter() - t0))


def newest_coding(coding: int) -> int:
    """The coding an upgrade gives a file of this one: delta gains restart
    tables; xor stays (it is there to measure the paper's scheme)."""
    return codec.CODING_RESTARTS if coding == codec.CODING_DELTA else coding


def _is_newest(ix: Index) -> bool:
    """Whether a file's header names the newest coding and format it can have."""
    coding = newest_coding(ix.coding)
    return coding == ix.coding and ix._header.read_version >= format_version_of(coding)


def _older_runs(ix: Index) -> bool:
    """Whether a Huffman run of another coding than the file's is left."""
    return any(r.coding not in (None, ix.coding) for r in ix._snapshot().manifest.runs)


def _build_checked(reader: FormatV1Reader, dest: str, progress, t0: float) -> dict:
    """Build the new copy of reader beside dest and check it.

    For an in-place upgrade (dest is the source) the copy stays under its
    temporary name, returned as ``built``; otherwise it is linked to dest
    (never over an existing file).  On any error the temporary is deleted.
    """
    progress = progress or (lambda phase, done, total: None)
    seconds = {}
    tmp = os.path.join(os.path.dirname(os.path.abspath(dest)),
                       _BUILD_NAME.format(name=os.path.basename(dest),
                                          tag=secrets.token_hex(_BUILD_TAG_HEX // 2)))
    try:
        live = reader.fingerprints(progress)
        tombstones = len(reader.tombstones())
        log_fingerprints = len(reader.log_values())
        seconds["read"] = time.perf_counter() - t0
        t = time.perf_counter()
        counts = _write(reader, live, tmp, progress)
        seconds["write"] = time.perf_counter() - t
        t = time.perf_counter()
        _check_copy(reader, live, tmp, progress)
        seconds["check"] = time.perf_counter() - t
        with contextlib.suppress(OSError):
            os.unlink(tmp + "-lock")
        if dest == reader.path:   # the new file takes the original's place and its mode
            os.chmod(tmp, stat.S_IMODE(os.stat(reader.path).st_mode))
        fsync_path(tmp)
        if dest != reader.path:
            publish(tmp, dest)   # never clobbers a dest that appeared meanwhile
            with contextlib.suppress(FileNotFoundError):  # linked, not renamed
                os.unlink(tmp)
            tmp = None
    except BaseException:
        if tmp is not None:
            for leftover in (tmp, tmp + "-lock"):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        raise
    result = dict(upgraded=True, rebuilt=True,
                  format=format_version_of(newest_coding(reader.coding)),
                  fingerprints=len(live), keys=counts["keys"],
                  tables=len(reader.plan.tables), log_fingerprints=log_fingerprints,
                  tombstones=tombstones, orphan_keys=reader.orphan_keys,
                  source_bytes=os.path.getsize(reader.path),
                  output_bytes=os.path.getsize(tmp if tmp is not None else dest),
                  seconds=seconds)
    if tmp is not None:
        result["built"] = tmp
    return result


def _write(reader: FormatV1Reader, live: np.ndarray, path: str, progress) -> dict:
    """Create the new index at path and add every live fingerprint and key."""
    n_keys = 0
    with Index.create(path, k=reader.k, expected_n=reader.expected_n, plan=reader.plan,
                      coding=newest_coding(reader.coding), fingerprinter=reader.fingerprinter,
                      background_compaction=False) as ix:
        progress("adding", 0, len(live))
        done = 0
        for fps, keys in reader.items(live):
            flat_fps, flat_keys = [], []
            for fp, ks in zip(fps.tolist(), keys):
                for key in ks or (None,):
                    flat_fps.append(fp)
                    flat_keys.append(key)
                n_keys += len(ks)
            ix.add(np.array(flat_fps, dtype=np.uint64), keys=flat_keys)
            done += len(fps)
            progress("adding", done, len(live))
        progress("compacting", 0, 1)
        ix.compact(full=True)
        progress("compacting", 1, 1)
    return dict(keys=n_keys)


def _check_copy(reader: FormatV1Reader, live: np.ndarray, path: str, progress) -> None:
    """Raise NdindexError unless the index at path holds exactly what reader does.

    Cost: one verify() of the new index, then reading every key back
    (Index.items), which dominates.
    """
    progress("checking", 0, len(live))
    pairs = reader.check_key_mirror()
    with Index.open(path, readonly=True) as ix:
        ix.verify()
        settings = (ix.k, ix.expected_n, ix.coding, ix.plan.to_bytes(), ix.fingerprinter)
        expected = (reader.k, reader.expected_n, newest_coding(reader.coding),
                    reader.plan.to_bytes(), reader.fingerprinter)
        if settings != expected:
            raise NdindexError(f"{path}: the new index's settings differ from the source's")
        if len(ix) != len(live) or not np.array_equal(ix.fingerprints(), live):
            raise NdindexError(f"{path}: the new index holds {len(ix)} fingerprints, the "
                               f"source {len(live)}, or different ones")
        n_keys = done = 0
        for (fps, keys), (src_fps, src_keys) in zip(ix.items(ADD_BATCH_FINGERPRINTS),
                                                     reader.items(live, ADD_BATCH_FINGERPRINTS)):
            if not np.array_equal(fps, src_fps) or \
                    [set(k) for k in keys] != [set(k) for k in src_keys]:
                raise NdindexError(f"{path}: the new index's document keys differ from the "
                                   "source's")
            n_keys += sum(len(k) for k in keys)
            done += len(fps)
            progress("checking", done, len(live))
        if done != len(live) or n_keys + reader.orphan_keys != pairs:
            raise NdindexError(f"{path}: {n_keys} document keys copied of the source's {pairs}")
        progress("checking", len(live), len(live))


def _swap_in(built: str, src: str, backup_path: str, keep_backup: bool) -> None:
    """Put the built file at src, the original at backup_path (see upgrade: crash safety)."""
    directory = os.path.dirname(os.path.abspath(src))
    if not os.path.lexists(backup_path):
        try:
            os.link(src, backup_path)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise
            _copy_synced(src, backup_path)
        fsync_path(directory)
    os.replace(built, src)
    fsync_path(directory)
    if not keep_backup:
        os.unlink(backup_path)
        fsync_path(directory)


def _copy_synced(src: str, dest: str) -> None:
    """Copy src to dest through a temporary name, synced, so dest is whole or absent."""
    tmp = f"{dest}.{secrets.token_hex(_BUILD_TAG_HEX // 2)}.copying"  # see _clear_leftovers
    try:
        with open(src, "rb") as fin, open(tmp, "xb") as fout:
            while chunk := fin.read(1 << 20):
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
        os.rename(tmp, dest)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _exclusive(path: str):
    """A with block holding LMDB's lock file of path exclusively: no other
    process has the file open.

    Every LMDB process holds a shared fcntl lock on byte 0 of
    ``<path>-lock`` while it has the file open (and waits for one when it
    opens), so holding an exclusive one keeps every format-1 reader and
    writer out.  The reader then opens the file without LMDB's lock: LMDB
    would downgrade this process's lock to a shared one.  Its beginning
    and end are C (_core.Block), Ctrl-C held back: as a contextlib
    generator, a Ctrl-C as its __exit__ began left the lock held while the
    traceback lived.
    """
    held = []

    def take() -> None:
        try:
            lock_file = Descriptor(path + "-lock", os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise translate_error(exc, path) from exc
        try:
            fcntl.lockf(lock_file.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError as exc:
            lock_file.close()
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise translate_error(exc, path) from exc
            raise ReadOnlyError(f"{path}: another process has the index open; close it "
                                "first, or upgrade a copy with -o OUT") from None
        held.append(lock_file)

    def let_go(*exc) -> bool:
        held.pop().close()   # releases the lock
        return False

    return _core.Block(None, take, let_go)


def _clear_leftovers(src: str) -> int:
    """Delete what an interrupted in-place upgrade of src left beside it; return how many.

    Only names this module (and the index it builds) make from src's name:
    ``.<name>.<hex>.upgrading`` with its lock file and the temporaries of
    create and vacuum made from that name, and ``<name>.v1.<hex>.copying``,
    the backup's copy where the file system has no hard links.  Called with
    src held exclusively, so no other upgrade of src is running.
    """
    directory = os.path.dirname(os.path.abspath(src))
    name = re.escape(os.path.basename(src))
    tag = r"\.[0-9a-f]{%d}\." % _BUILD_TAG_HEX
    pattern = re.compile(r"(\.?\." + name + tag + r"upgrading(\W.*)?"
                         + "|" + name + re.escape(BACKUP_SUFFIX) + tag + r"copying)\Z", re.S)
    removed = 0
    for name in os.listdir(directory):
        if pattern.match(name):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
                removed += 1
    return removed


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
