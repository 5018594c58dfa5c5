"""The index file: one LMDB environment, its sub-databases, records and keys.

Everything LMDB-specific lives here.  Callers above see ``Store`` methods,
framed (checksummed) records and ndindex exceptions; LMDB's own exceptions
are translated at this boundary and chained with ``from``.

The layout is normative in format-spec/FORMAT.md section 7; names here are
the spec's.  Why LMDB: a single memory-mapped file with copy-on-write
B-trees gives readers consistent snapshots that never block the writer, and
committed transactions survive a crash without a recovery step (SQLite's
WAL would need a journal beside the file and a page cache we would have to
copy out of; the kernels want the mapped bytes themselves).
"""

from __future__ import annotations

import errno
import os
import struct
import sys
import threading

import lmdb

from ndindex import _core
from ndindex.errors import (CapacityError, ClosedError, CorruptionError, FormatError,
                            NdindexError, ReadOnlyError)

FORMAT_VERSION = 1
MAGIC = b"ndindex\0"
#: Sub-database names (FORMAT.md 7.1).
DB_META = b"meta"
DB_SEGMENTS = b"segments"
DB_LOG = b"log"
DB_DOCS = b"docs"
DB_KEYS = b"keys"
DB_REMOVED = b"removed"
ALL_DBS = (DB_META, DB_SEGMENTS, DB_LOG, DB_DOCS, DB_KEYS, DB_REMOVED)
DUPSORT_DBS = (DB_DOCS, DB_KEYS)
#: Keys in the meta database.
META_HEADER = b"header"
META_PLAN = b"plan"
META_STATE = b"state"
META_FINGERPRINTER = b"fingerprinter"
META_CODE_PREFIX = b"code:"

HEADER = struct.Struct("<8sHHBBBBQ")  # magic, read_v, write_v, f, k, t, reserved, expected_n
STATE = struct.Struct("<QQQQQQ")  # tables_gen, log_next_seq, removed_gen, table_entries, code_n, log_entries
CRC = struct.Struct("<I")
U64_BE = struct.Struct(">Q")

#: The map is address space, not memory or disk: LMDB extends the file only
#: as pages are written.  Starting at 1 TiB on 64-bit systems means the map
#: practically never has to grow, and growing is the one moment a query in
#: another thread of the same process could see its mapping move.
INITIAL_MAP_SIZE_BYTES = (1 << 40) if sys.maxsize > 2**32 else (256 << 20)
#: Grow the map before a large write (tests turn it off to reach the retry path).
PREGROW_MAP = True
#: LMDB keys are at most 511 bytes; a document key also carries a type byte
#: and, in the docs database, a checksum.
MAX_DOC_KEY_BYTES = 500


def frame(payload: bytes) -> bytes:
    """Return payload followed by its CRC-32C (FORMAT.md [F2])."""
    return payload + CRC.pack(_core.crc32c(payload))


def unframe(value, database: bytes, key: bytes) -> bytes:
    """Return the payload of a framed record; CorruptionError if the checksum fails."""
    value = bytes(value)
    if len(value) < 4:
        raise CorruptionError(f"record of {len(value)} bytes is too short for its checksum",
                              database=database.decode(), key=key)
    payload, (stored,) = value[:-4], CRC.unpack(value[-4:])
    if _core.crc32c(payload) != stored:
        raise CorruptionError("record checksum mismatch", database=database.decode(), key=key)
    return payload


def code_key(table: int) -> bytes:
    return META_CODE_PREFIX + bytes([table])


def segment_key(table: int, last: int) -> bytes:
    """Key of a segment: u8 table, u64 big-endian last fingerprint (FORMAT.md [F6])."""
    return bytes([table]) + U64_BE.pack(last)


def u64_key(value: int) -> bytes:
    return U64_BE.pack(value)


def encode_doc_key(key) -> bytes:
    """Typed bytes of a document key: 0x00 + bytes, or 0x01 + UTF-8 of a str."""
    if isinstance(key, str):
        raw = b"\x01" + key.encode("utf-8")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        raw = b"\x00" + bytes(key)
    else:
        raise TypeError(f"document keys must be str or bytes, got {type(key).__name__}")
    if len(raw) - 1 > MAX_DOC_KEY_BYTES:
        raise ValueError(f"document key is {len(raw) - 1} bytes, at most {MAX_DOC_KEY_BYTES} allowed")
    if len(raw) == 1:
        raise ValueError("document keys must not be empty")
    return raw


def decode_doc_key(raw: bytes):
    """Inverse of encode_doc_key."""
    if raw[:1] == b"\x01":
        return raw[1:].decode("utf-8")
    if raw[:1] == b"\x00":
        return raw[1:]
    raise CorruptionError(f"document key type byte {raw[:1].hex()} unknown", database="docs")


def translate_error(exc: Exception, path: str) -> Exception:
    """Map an LMDB error to the ndindex exception a caller can act on."""
    if isinstance(exc, lmdb.MapFullError):
        return CapacityError(f"{path}: map full")
    if isinstance(exc, (lmdb.DiskError,)) or getattr(exc, "errno", None) == errno.ENOSPC \
            or "No space left" in str(exc) or os.strerror(errno.EFBIG) in str(exc) \
            or (os.strerror(errno.EIO) in str(exc) and _out_of_space(path)):
        return CapacityError(f"{path}: disk full ({exc}); the last committed state is intact")
    if isinstance(exc, (lmdb.InvalidError, lmdb.VersionMismatchError, lmdb.IncompatibleError)):
        return FormatError(f"{path}: not an ndindex file ({exc})")
    if isinstance(exc, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadTxnError,
                        lmdb.PanicError)):
        return CorruptionError(f"{path}: LMDB reports corruption ({exc})", database="lmdb")
    if isinstance(exc, lmdb.ReadonlyError):
        return ReadOnlyError(f"{path}: opened read-only")
    if not isinstance(exc, lmdb.Error):
        return exc
    return NdindexError(f"{path}: {exc}")


#: A failed write with this little room left on the file system, or this
#: close to the process's file size limit, is taken for a full disk.
FULL_DISK_SLACK_BYTES = 1 << 20


def _out_of_space(path: str) -> bool:
    """Whether the file system or the file size limit (RLIMIT_FSIZE) is exhausted.

    LMDB reports a short write as EIO rather than the ENOSPC or EFBIG that
    caused it, so an EIO is read as a full disk only when the OS says so.
    """
    try:
        vfs = os.statvfs(os.path.dirname(os.path.abspath(path)))
        if vfs.f_bavail * vfs.f_frsize < FULL_DISK_SLACK_BYTES:
            return True
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        return soft != resource.RLIM_INFINITY and os.path.getsize(path) + FULL_DISK_SLACK_BYTES > soft
    except (OSError, ImportError, AttributeError):
        return False


class Store:
    """An open index file: the LMDB environment and its sub-databases.

    Use :meth:`create` or :meth:`open`.  Writers go through :meth:`write`,
    which retries once with a larger map when LMDB reports the map full;
    readers use :meth:`begin_read`.
    """

    def __init__(self, path: str, env: lmdb.Environment, readonly: bool, create: bool = False):
        self.path = path
        self._env = env
        self.readonly = readonly
        # Sub-databases are created only with a new file: creating them in
        # an existing one would write into a file that may not be ours
        # before the header check can refuse it.
        self.dbs = {name: env.open_db(name, create=create and not readonly,
                                      dupsort=name in DUPSORT_DBS)
                    for name in ALL_DBS}
        self._write_lock = threading.Lock()
        #: Called before the map is remapped at a new size, to drop every
        #: buffer into the old map (Index sets it to drop its snapshot).
        self.before_remap = None

    # -- opening -----------------------------------------------------------

    @classmethod
    def open(cls, path, *, readonly: bool = False, create: bool = False) -> "Store":
        """Open (or create) the file at path.

        Raises FileNotFoundError if it does not exist and create is false,
        FormatError if it is not an LMDB file or is truncated, and
        CorruptionError if LMDB finds damage.  A read-only file or directory
        opens with readonly=True (without a lock file if none can be made).
        """
        path = os.fspath(path)
        exists = os.path.exists(path)
        if not exists and not create:
            raise FileNotFoundError(f"{path}: no such index")
        if exists:
            _check_not_truncated(path)
        size = max(INITIAL_MAP_SIZE_BYTES, 2 * (os.path.getsize(path) if exists else 0))
        kwargs = dict(subdir=False, max_dbs=len(ALL_DBS), map_size=size, readonly=readonly,
                      meminit=False, max_readers=256)
        try:
            try:
                env = lmdb.open(path, **kwargs)
            except lmdb.Error as exc:
                if not (readonly and _is_permission_error(exc)):
                    raise
                # A read-only directory cannot hold the lock file; without it
                # LMDB cannot coordinate with writers, which is acceptable
                # because nothing can write here either.
                env = lmdb.open(path, lock=False, **kwargs)
            if exists:
                _check_map_covers_file(env, path)
            return cls(path, env, readonly, create=not exists)
        except lmdb.NotFoundError as exc:
            raise FormatError(f"{path}: not an ndindex file (sub-database missing)") from exc
        except lmdb.Error as exc:
            raise translate_error(exc, path) from exc

    def close(self) -> None:
        """Close the environment; later use raises ClosedError."""
        env, self._env = self._env, None
        if env is not None:
            env.close()

    @property
    def env(self) -> lmdb.Environment:
        if self._env is None:
            raise ClosedError(f"{self.path}: index is closed")
        return self._env

    # -- transactions ------------------------------------------------------

    def begin_read(self) -> lmdb.Transaction:
        """Begin a read transaction (a snapshot); buffers point into the map."""
        try:
            return self.env.begin(buffers=True)
        except lmdb.MapResizedError:
            # Another process grew the map: adopt its size and retry.  The
            # remap moves the map, so block addresses taken from the old one
            # must go first (a reused snapshot would read unmapped pages).
            if self.before_remap is not None:
                self.before_remap()
            self.env.set_mapsize(0)
            return self.env.begin(buffers=True)
        except lmdb.Error as exc:
            raise translate_error(exc, self.path) from exc

    def write(self, body, before_grow=None, expect_bytes: int = 0):
        """Run body(txn) in one write transaction and commit it durably.

        expect_bytes, an estimate of the pages body will write, lets the map
        grow before the transaction starts.  If the map fills up anyway, the
        transaction is aborted, ``before_grow`` is called (to drop read
        snapshots, which LMDB requires before a resize), the map doubles,
        and body runs again from the start; body must be safe to repeat.  A
        full disk raises CapacityError with nothing lost: the aborted
        transaction leaves the last committed state intact.
        """
        if self.readonly:
            raise ReadOnlyError(f"{self.path}: opened read-only")
        with self._write_lock:
            # Growing first saves re-running a large body after MapFullError.
            # The map is address space, not disk: LMDB extends the file only
            # as pages are written, so generous sizes cost nothing.
            need = self.used_bytes() + 2 * expect_bytes
            if PREGROW_MAP and need > self.env.info()["map_size"]:
                if before_grow is not None:
                    before_grow()
                self.env.set_mapsize(max(need, 2 * self.env.info()["map_size"]))
            for _attempt in range(40):
                try:
                    with self.env.begin(write=True) as txn:
                        return body(txn)
                except lmdb.MapFullError:
                    if before_grow is not None:
                        before_grow()
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)
                except lmdb.MapResizedError:
                    if before_grow is not None:
                        before_grow()
                    self.env.set_mapsize(0)
                except lmdb.Error as exc:
                    raise translate_error(exc, self.path) from exc
            raise CapacityError(f"{self.path}: could not grow the map")

    # -- records -----------------------------------------------------------

    def get_framed(self, txn, db: bytes, key: bytes):
        """Return the payload of a framed record, or None if absent."""
        value = txn.get(key, db=self.dbs[db])
        return None if value is None else unframe(value, db, key)

    def put_framed(self, txn, db: bytes, key: bytes, payload: bytes) -> None:
        txn.put(key, frame(payload), db=self.dbs[db])

    def file_bytes(self) -> int:
        return os.path.getsize(self.path)

    def used_bytes(self) -> int:
        """Bytes of the file's pages in use (excluding LMDB's free list)."""
        info = self.env.info()
        stat = self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]


# -- header ------------------------------------------------------------------


def pack_header(k: int, tables: int, expected_n: int) -> bytes:
    """Header payload (FORMAT.md 7.2)."""
    return HEADER.pack(MAGIC, FORMAT_VERSION, FORMAT_VERSION, 64, k, tables, 0, expected_n)


def unpack_header(payload: bytes, path: str) -> dict:
    """Validate a header payload; FormatError naming what is unsupported."""
    if len(payload) < HEADER.size:
        raise FormatError(f"{path}: header is {len(payload)} bytes, expected {HEADER.size}")
    magic, read_v, write_v, f, k, t, reserved, expected_n = HEADER.unpack_from(payload)
    if magic != MAGIC:
        raise FormatError(f"{path}: not an ndindex file (magic {magic!r})")
    if read_v > FORMAT_VERSION:
        raise FormatError(f"{path}: header read version {read_v} > supported {FORMAT_VERSION}")
    if f != 64 or reserved != 0:
        raise FormatError(f"{path}: header f={f} reserved={reserved}, expected 64 and 0")
    return dict(read_version=read_v, write_version=write_v, k=k, tables=t,
                expected_n=expected_n)


# -- file checks before LMDB maps anything -----------------------------------


def _is_permission_error(exc: lmdb.Error) -> bool:
    return "Permission denied" in str(exc) or "Read-only file system" in str(exc)


# LMDB meta pages: two at the start of the file (page 0 and 1), each holding
# mm_last_pg at a fixed offset.  A file shorter than the pages they name
# would be read past its end through the map (SIGBUS), so it is refused
# before LMDB touches it.
_META_OFFSET = 16  # page header
_PAGE_BYTES = 4096


def _read_meta_last_page(path: str) -> int | None:
    with open(path, "rb") as fh:
        head = fh.read(8192 + 256)
    best = None
    for page in (0, 1):
        base = page * _PAGE_BYTES + _META_OFFSET
        if len(head) < base + 136:
            return None
        magic, _version = struct.unpack_from("<II", head, base)
        if magic != 0xBEEFC0DE:
            return None
        # After magic and version: mm_address(8), mm_mapsize(8), two MDB_db
        # records of 48 bytes, then mm_last_pg(8) and mm_txnid(8).
        last_pg, txnid = struct.unpack_from("<QQ", head, base + 120)
        if best is None or txnid > best[1]:
            best = (last_pg, txnid)
    return best[0]


def _check_not_truncated(path: str) -> None:
    size = os.path.getsize(path)
    if size < 8192:
        raise FormatError(f"{path}: not an ndindex file ({size} bytes is too small)")
    last = _read_meta_last_page(path)
    if last is None:
        raise FormatError(f"{path}: not an ndindex file (no LMDB meta page)")
    if (last + 1) * _PAGE_BYTES > size:
        raise CorruptionError(
            f"{path}: file is truncated: {size} bytes, its pages reach {(last + 1) * _PAGE_BYTES}",
            database="lmdb")


def _check_map_covers_file(env: lmdb.Environment, path: str) -> None:
    info = env.info()
    if (info["last_pgno"] + 1) * env.stat()["psize"] > os.path.getsize(path):
        raise CorruptionError(f"{path}: file is truncated", database="lmdb")
