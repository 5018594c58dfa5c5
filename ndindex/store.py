"""The index file: one LMDB environment, opened, created, read and written safely.

Everything LMDB-specific lives here and in :mod:`ndindex.pages`.  Callers
above see ``Store`` methods, framed records and ndindex exceptions; LMDB's
own exceptions are translated at this boundary and chained with ``from``.

Why LMDB: a single memory-mapped file with copy-on-write B-trees gives
readers consistent snapshots that never block the writer, multi-process
locking, and committed transactions that survive a crash with no recovery
step.  What LMDB does not give, the store adds:

- **Reads never go through LMDB's tree code.**  A read transaction pins a
  snapshot; the records are then read from our own read-only mapping by the
  bounds-checked page reader, so a damaged page gives CorruptionError, not an
  assertion or a fault.
- **Writes check the pages LMDB will walk first**: the main and free trees
  whole (the free list's page lists too: LMDB reuses what they name
  unchecked), and the path to every key written (``WriteTxn``).
- **Opening checks both meta pages against the commit record** the index
  writes in every transaction (``state.txnid``), so LMDB cannot silently
  open an older commit because a meta page was damaged (FORMAT.md [F9]).
- **Create is atomic** (build beside, sync, link into place) and the lock
  file is allocated before LMDB maps it, so a full disk is an error, not
  SIGBUS.

The layout is normative in format-spec/FORMAT.md section 7.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
import sys
import threading

import lmdb

from ndindex import _core, pages, records as rec
from ndindex.descriptors import Descriptor
from ndindex.errors import (CapacityError, ClosedError, CorruptionError, FormatError,
                            NdindexError, ReadOnlyError, interrupts_deferred)

#: The map is address space, not memory or disk: LMDB extends the file only
#: as pages are written.  1 TiB on 64-bit systems means it never has to grow.
INITIAL_MAP_SIZE_BYTES = (1 << 40) if sys.maxsize > 2**32 else (256 << 20)
#: Indexes one 64-bit process can hold open at once: 128 TiB of user
#: address space (4-level paging) over the map (127 measured: the process's
#: own mappings take the rest).
MAX_OPEN_INDEXES = 127 if sys.maxsize > 2**32 else 8
#: LMDB's reader table: one 64-byte slot per reader.
MAX_READERS = 256
#: Bytes of the lock file written before LMDB maps it (LMDB needs about
#: 64 x MAX_READERS + 192; a larger file is used as is).
LOCK_FILE_BYTES = 64 * 1024
#: Snapshot attempts before giving up when writers keep overwriting the
#: meta page a new read transaction refers to.
SNAPSHOT_RETRIES = 100
#: A failed write with this little room left, or this close to the process's
#: file size limit, is taken for a full disk.
FULL_DISK_SLACK_BYTES = 1 << 20

DURABILITY_FULL = "full"
DURABILITY_NORMAL = "normal"


def translate_error(exc: Exception, path: str, database: str = "lmdb",
                    key: bytes | None = None) -> Exception:
    """Map an LMDB (or OS) error to the ndindex exception a caller can act on.

    database and key name where a corruption was met, when the caller knows.
    """
    if isinstance(exc, NdindexError):
        return exc
    text = str(exc)
    code = getattr(exc, "errno", None)
    if isinstance(exc, lmdb.MapFullError):
        return CapacityError(f"{path}: map full")
    if isinstance(exc, lmdb.ReadersFullError):
        return CapacityError(f"{path}: {MAX_READERS} snapshots are open at once across the "
                             "processes reading the file; end some (close idle indexes)")
    if isinstance(exc, lmdb.MemoryError) or code == errno.ENOMEM:
        # Most often the address space, not memory: every open index
        # reserves INITIAL_MAP_SIZE_BYTES of it for LMDB's map.
        return CapacityError(
            f"{path}: out of memory or address space: each open index reserves "
            f"{INITIAL_MAP_SIZE_BYTES >> 30:,} GiB of address space for its map, so a process "
            f"holds about {MAX_OPEN_INDEXES} at once; close some ({_reason(exc)})")
    if isinstance(exc, lmdb.DiskError) or code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) \
            or "No space left" in text or os.strerror(errno.EFBIG) in text \
            or (os.strerror(errno.EIO) in text and _out_of_space(path)):
        return CapacityError(f"{path}: disk full ({exc}); the last committed state is intact")
    if isinstance(exc, (lmdb.InvalidError, lmdb.VersionMismatchError, lmdb.IncompatibleError)):
        return FormatError(f"{path}: not an ndindex file ({exc})")
    if isinstance(exc, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadTxnError,
                        lmdb.PanicError, lmdb.BadValsizeError, lmdb.BadRslotError)):
        return CorruptionError(f"{path}: LMDB reports corruption ({exc})", database=database,
                               key=key)
    if isinstance(exc, lmdb.ReadonlyError) or code in (errno.EROFS, errno.EACCES, errno.EPERM) \
            or "Read-only file system" in text or "Permission denied" in text:
        return ReadOnlyError(f"{path}: cannot write ({_reason(exc)})")
    if isinstance(exc, lmdb.Error) and "closed/deleted/dropped" in text:
        # py-lmdb's word for an environment closed by another thread meanwhile.
        return ClosedError(f"{path}: index is closed")
    if isinstance(exc, (lmdb.Error, OSError)):
        return NdindexError(f"{path}: {_reason(exc)}")
    return exc


def _reason(exc: Exception) -> str:
    """An OS or LMDB error's reason without the file name it carries: the
    caller names the index, and the file the error names may be a temporary
    one (Store.create builds the index under another name)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    head, sep, rest = text.partition(": ")
    return rest if sep and os.sep in head else text


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


# -- before LMDB touches a file ------------------------------------------------


def _read_only_fs(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


#: What the file types an index cannot be are called in errors.
_SPECIAL_FILES = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_path_for_open(path: str) -> None:
    """Refuse what is not a regular file, with the error a user can act on.

    A named pipe would not just fail: opening one to read waits for a
    writer, so a reader's open (``ndindex stats PIPE``) hung for good."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not an index file", path)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "no such index", path)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise translate_error(exc, path) from exc
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _SPECIAL_FILES if test(mode)), "not a regular file")
        raise FormatError(f"{path}: not an ndindex file ({what})")


def check_access(path: str, readonly: bool) -> None:
    """check_path_for_open, and for a writer, that the file can be written."""
    check_path_for_open(path)
    if not readonly and not os.access(path, os.W_OK):
        why = "on a read-only file system" if _read_only_fs(path) else "no permission to write"
        raise ReadOnlyError(f"{path}: {why}; open it with readonly=True")


#: A writer looks for reader slots of dead processes at most this often.
READER_CHECK_SECONDS = 1.0
#: How long create waits for another process creating the same index.
BUILD_WAIT_SECONDS = 10.0


#: Builds of a whole index, made through Index.create of its own beside the
#: path it becomes: recover's rebuild and the dedup job's first index.
INDEX_BUILDS = ("recover", "dedup", "import")


def build_path(path: str, what: str) -> str:
    """The one name beside path under which create ("creating"), vacuum
    ("vacuum") or an INDEX_BUILDS kind builds what becomes path (FORMAT.md
    section 7)."""
    path = os.path.abspath(path)
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{what}")


def same_inode(fd: int, name: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(name)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def check_directory_of(path: str) -> None:
    """FileNotFoundError naming path's directory if there is none: a file
    about to be built there would otherwise fail naming its hidden build
    name ("/x/.y.ndx.recover: No such file or directory")."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(errno.ENOENT, "no such directory", parent)


def claim_build(tmp: str, path: str) -> Descriptor:
    """Open the build name tmp and hold it (an flock); return the Descriptor.

    The lock tells a live builder from a leftover of a killed one.  Waits
    while another process builds under the name (then, as a rule, path
    exists and publish says so); FileExistsError if that takes longer
    than BUILD_WAIT_SECONDS.
    """
    import fcntl
    import time
    deadline = time.monotonic() + BUILD_WAIT_SECONDS
    while True:
        build = Descriptor(tmp, os.O_RDWR | os.O_CREAT)   # closed if dropped
        try:
            fcntl.flock(build.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The name may have gone (its builder finished, or a leftover
            # was cleared) between the open and the lock: then try again.
            if same_inode(build.fd, tmp):
                return build
        except BlockingIOError:
            pass
        except BaseException:
            build.close()   # not left to the traceback, which keeps it (descriptors.py)
            raise
        build.close()
        if time.monotonic() > deadline:
            raise FileExistsError(errno.EEXIST, "another process is creating it", path)
        time.sleep(0.01)
        if _core.take_held_interrupt():   # waiting inside index_build's hold
            raise KeyboardInterrupt


def release_build(build: Descriptor, tmp: str) -> None:
    """Drop the build name (still holding it, so no one else's goes) and the lock."""
    try:
        if same_inode(build.fd, tmp):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    finally:
        build.close()


def clear_build_leftover(path: str, what: str) -> None:
    """Delete what a killed build of path (create, vacuum or an INDEX_BUILDS
    kind) left under its build name (only a name no live builder holds)."""
    tmp = build_path(path, what)
    try:
        held = Descriptor(tmp, os.O_RDONLY)   # closed if dropped
    except OSError:
        return  # nothing there (as a rule), or nothing this process may clear
    import fcntl
    try:
        fcntl.flock(held.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if what in INDEX_BUILDS:
            _unlink_all(index_build_files(path, what)[2])
    except OSError:
        held.close()  # a builder holds it, or the name stays: a later open tries again
        return
    except BaseException:
        held.close()  # an interrupt, whose traceback would keep it (descriptors.py)
        raise
    release_build(held, tmp)


def clear_build_leftovers(path: str) -> None:
    """clear_build_leftover of every kind of build (a writer's open)."""
    for what in ("creating", "vacuum") + INDEX_BUILDS:
        clear_build_leftover(path, what)


def index_build_files(path: str, what: str) -> tuple[str, str, tuple]:
    """(held name, index name, every file the build can leave) of an
    INDEX_BUILDS build of path: it holds `.<file>.<what>` and builds the
    index as `.<file>.<what>.ndx` (which has build names of its own)."""
    held = build_path(path, what)
    tmp = held + ".ndx"
    return held, tmp, (tmp, tmp + "-lock", build_path(tmp, "creating"), build_path(tmp, "vacuum"))


def index_build(path: str, what: str):
    """A with block holding the build name of an INDEX_BUILDS build of path;
    it binds the name to build the index under.  What a killed build left is
    deleted first (the name is this process's now), and what remains is
    deleted at the end: the caller renames or links its index to path before.

    Its beginning and end are C (_core.Block), Ctrl-C held back: as a
    contextlib generator, a Ctrl-C as its __exit__ began left the build
    name's flock held while the traceback lived, and a retry in the same
    process waited for itself ("another process is creating it").  The wait
    for another builder's name ends at a Ctrl-C all the same (claim_build).
    """
    check_directory_of(path)
    held_name, tmp, leftovers = index_build_files(path, what)
    claimed = []

    def begin() -> str:
        build = claim_build(held_name, path)
        try:
            _unlink_all(leftovers)
        except BaseException:
            release_build(build, held_name)
            raise
        claimed.append(build)
        return tmp

    def end(*exc) -> bool:
        try:
            with contextlib.suppress(OSError):  # never hiding the error that stopped the build
                _unlink_all(leftovers)
        finally:
            release_build(claimed.pop(), held_name)
        return False

    return _core.Block(None, begin, end)


def _unlink_all(names) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def publish(tmp: str, path: str) -> None:
    """Give the finished file tmp its name path, never replacing an existing path,
    and sync the directory (the name lasts through a crash).

    A hard link fails if path appeared meanwhile, so nothing is clobbered;
    where the file system has no hard links, a rename checked just before
    (a race with another creator remains, as with any rename).  Raises
    FileExistsError if path exists.
    """
    try:
        os.link(tmp, path)
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, "already exists", path) from None
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "already exists", path) from None
        os.rename(tmp, path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def aside_name(dest: str, kind: str) -> str:
    """A new hidden name beside dest, ``.NAME.XXXX.kind``, to write dest's file
    under before publish() gives it its name (dest's directory checked)."""
    full = os.path.abspath(dest)
    check_directory_of(full)
    return os.path.join(os.path.dirname(full),
                        f".{os.path.basename(full)}.{os.urandom(6).hex()}.{kind}")


@contextlib.contextmanager
def written_aside(dest: str, kind: str):
    """Yield a new hidden name beside dest to write a file under; once the block
    ends, the file takes the name dest (publish, then the directory is synced),
    and on an exception it is deleted.  A killed writer leaves only the hidden
    ``.NAME.XXXX.kind`` file, never a part of one under dest."""
    tmp = aside_name(dest, kind)
    try:
        yield tmp
        publish(tmp, dest)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # the published name is a link of its own


def lock_file_error(path: str, what: str) -> CorruptionError:
    """The error for a damaged lock file: the index file is fine, and the
    first process to open it once none has it open writes the lock file afresh."""
    return CorruptionError(
        f"{path}-lock: LMDB's lock file is damaged: {what}; the index file is not: close "
        "every process that has the index open, and the next open makes the lock file again",
        database="lock")


#: LMDB's lock file (mdb.c, MDB_txninfo): two 64-byte lines of header (the
#: reader mutex, the newest transaction id and the count of reader slots in
#: use; the writer mutex), then the reader slots, 64 bytes each.
LMDB_LOCK_MAGIC = 0xBEEFC0DE
LMDB_LOCK_HEAD_BYTES = 128
LMDB_READER_SLOT_BYTES = 64


def check_lock_file(path: str) -> None:
    """CorruptionError if the lock file, which another process has open, counts
    more reader slots than it holds (see Store.check_lock_table).

    Checked before LMDB opens it: py-lmdb's open begins a transaction, which
    takes a slot by a walk over that many and keeps the count for close's walk
    (SIGSEGV).  A lock file no process has open is written afresh by the
    opener, whatever it holds.
    """
    layout = _core.lmdb_lock_layout()
    if layout is None:
        return
    count_at = layout[1]
    try:
        lock_file = Descriptor(path + "-lock", os.O_RDONLY)
    except OSError:
        return  # LMDB's open says what is wrong
    with lock_file as fd:
        head = os.pread(fd, count_at + 4, 0)
        slots = (os.fstat(fd).st_size - LMDB_LOCK_HEAD_BYTES) // LMDB_READER_SLOT_BYTES
        if len(head) < count_at + 4 or struct.unpack_from("=I", head)[0] != LMDB_LOCK_MAGIC:
            return  # never written, or LMDB refuses it as it opens (Store.open)
        count = struct.unpack_from("=I", head, count_at)[0]
        from ndindex import locks  # (it imports this module)
        # Every process with an LMDB environment open locks its lock file's byte 0.
        if count <= slots or not locks.held_elsewhere(fd, 0):
            return
    raise lock_file_error(path, f"it counts {count:,} reader slots, in a table of {slots:,}")


def prepare_lock_file(path: str, readonly: bool) -> bool:
    """Make sure LMDB's lock file exists with its pages allocated; return whether to lock.

    LMDB creates ``<path>-lock``, sizes it with ftruncate and maps it; on a
    full disk the first store into that sparse mapping kills the process
    with SIGBUS.  Writing the bytes first turns that into ENOSPC here.
    Existing bytes are never overwritten: another process may be using them.
    A read-only opener that cannot create the file opens without a lock
    (nothing can write where it cannot create a file).
    """
    lock = path + "-lock"
    try:
        lock_file = Descriptor(lock, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        if readonly and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return os.path.exists(lock) and os.access(lock, os.R_OK | os.W_OK)
        raise translate_error(exc, lock) from exc       # the lock file's problem
    with lock_file as fd:
        size = os.fstat(fd).st_size
        if size < LOCK_FILE_BYTES:
            try:
                os.pwrite(fd, bytes(LOCK_FILE_BYTES - size), size)
                os.fsync(fd)
            except OSError as exc:
                raise translate_error(exc, lock) from exc
    return True


def pick_meta(metas: list, path: str) -> tuple[int, dict]:
    """The meta page LMDB will open (slot, meta); CorruptionError if either is damaged.

    Both must parse: LMDB itself refuses a meta page with a bad magic or
    version, and one with a damaged root or size would mislead it.
    """
    for slot, meta in enumerate(metas):
        if isinstance(meta, CorruptionError):
            why = str(meta).removesuffix(" (database=lmdb)")
            raise CorruptionError(f"{path}: meta page {slot} is damaged: {why}", database="lmdb")
    slot = 1 if metas[0]["txnid"] < metas[1]["txnid"] else 0
    return slot, metas[slot]


def _looks_like_lmdb(path: str) -> bool:
    """Whether either meta page carries LMDB's magic.

    Page 1 counts too: a file whose meta page 0 alone is damaged is a
    damaged index (CorruptionError from pick_meta), not a foreign file.
    """
    magic = struct.pack("<I", 0xBEEFC0DE)
    head = pages.read_head(path)
    return head[16:20] == magic or any(
        head[psize + 16:psize + 20] == magic and head[psize:psize + 8] == struct.pack("<Q", 1)
        for psize in (512 << i for i in range(8)))


# -- the store -----------------------------------------------------------------



class Store:
    """An open index file: the LMDB environment, our mapping of it, write transactions.

    Use :meth:`create` or :meth:`open`.
    """

    def __init__(self, path: str, env: lmdb.Environment, readonly: bool, durability: str):
        self.path = path
        self._env = env
        self.readonly = readonly
        self.durability = durability
        self.filemap = pages.FileMap(path)
        self.filemap.metas()
        self.check_lock_table()  # open_db begins a transaction
        self._dbs = {name: env.open_db(name.encode(), create=False) for name in rec.ALL_DBS}
        self._write_lock = threading.RLock()
        self.bytes_written = 0  # by this process's commits (values and pages are not counted apart)
        self._readers_checked = 0.0   # time.monotonic() of the last clear_dead_readers

    # -- opening and creating --------------------------------------------------

    @classmethod
    def open(cls, path, *, readonly: bool = False, durability: str = DURABILITY_FULL) -> "Store":
        """Open the index file at path, which the caller has checked with
        check_access (Index.open does, as it takes the open lock first).

        Raises FormatError (not an LMDB/ndindex file), CorruptionError
        (damaged meta pages or main tree, truncated file), ReadOnlyError
        (cannot write where asked to), CapacityError (no room for the lock
        file).
        """
        path = os.fsdecode(path)
        size = os.path.getsize(path)
        if size < 8192 or not _looks_like_lmdb(path):
            raise FormatError(f"{path}: not an ndindex file ({size} bytes, no LMDB meta page)")
        fm = pages.FileMap(path)
        try:
            slot, meta = pick_meta(fm.metas(), path)
            psize = meta["psize"]
            file_pages = size // psize
            if meta["last_pg"] >= file_pages and not _tail_is_free(fm, meta, file_pages):
                raise CorruptionError(f"{path}: file is truncated: {size} bytes, its pages reach "
                                      f"{(meta['last_pg'] + 1) * psize}", database="lmdb")
            # LMDB looks up the named databases in the main tree as it opens
            # them: check that tree whole first.
            buf = fm.buffer(size)
            npages = min(file_pages, meta["last_pg"] + 1)
            pages_ok = pages.PageView(buf, psize, npages, meta["txnid"],
                                      {"main": pages.Tree.from_record(meta["main"])})
            pages_ok.scan("main", check_all=True)
        finally:
            fm.close()
        lock = prepare_lock_file(path, readonly)
        if lock:
            check_lock_file(path)
        try:
            # As bytes: py-lmdb encodes a str path as strict UTF-8, which a
            # name in another encoding (os.fsdecode's surrogates) fails.
            env = lmdb.open(os.fsencode(path), subdir=False, readonly=readonly, lock=lock,
                            max_dbs=len(rec.ALL_DBS) + 1, map_size=INITIAL_MAP_SIZE_BYTES,
                            metasync=False, readahead=False, meminit=False,
                            max_readers=MAX_READERS)
        except lmdb.Error as exc:
            if "already open in this process" in str(exc):
                # py-lmdb's guard: LMDB opens a file once per process.
                raise NdindexError(
                    f"{path}: this process has the index open already (an Index not "
                    "closed yet); use that one, or close it first") from exc
            # The index file passed above: LMDB refused the header of the
            # lock file, which it reads only while another process has it
            # open (the first opener writes it afresh).
            if lock and isinstance(exc, lmdb.InvalidError):
                raise lock_file_error(path, "its header is not LMDB's (MDB_INVALID)") from exc
            if lock and isinstance(exc, lmdb.VersionMismatchError):
                raise FormatError(
                    f"{path}-lock: another process has the index open, and LMDB's lock file "
                    "says another layout (MDB_VERSION_MISMATCH): that process runs another "
                    "LMDB build, or the lock file is damaged (the index file is not); open it "
                    "from the same installation, or once every process has closed it") from exc
            raise translate_error(exc, path) from exc
        try:
            return cls(path, env, readonly, durability)
        except lmdb.NotFoundError as exc:
            v1 = _is_format_v1(env)
            _close_quietly(env)
            if v1:
                raise FormatError(f"{path}: an index in file format 1; this version of ndindex "
                                  f"reads format {rec.FORMAT_VERSION}: convert it with "
                                  f"`ndindex upgrade {path}`") from exc
            raise FormatError(f"{path}: not an ndindex file (a named database is missing)") from exc
        except lmdb.Error as exc:
            _close_quietly(env)
            raise translate_error(exc, path) from exc
        except BaseException:
            _close_quietly(env)
            raise

    @staticmethod
    def create(path, initial: dict) -> None:
        """Create a new index file atomically; initial maps meta keys to payloads.

        The file is built beside the target under a temporary name, synced,
        and linked into place, so a crash at any point leaves either no
        index or a complete one (open it with :meth:`open`).  Raises
        FileExistsError if path exists, ReadOnlyError or CapacityError if
        the directory cannot take it, FileNotFoundError if there is no
        such directory.
        """
        path = os.fsdecode(path)
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "already exists", path)
        check_directory_of(path)
        tmp = build_path(path, "creating")
        build = None
        try:
            build = claim_build(tmp, path)
            os.ftruncate(build.fd, 0)  # a killed creator's leftover, if any
            env = lmdb.open(os.fsencode(tmp), subdir=False, max_dbs=len(rec.ALL_DBS) + 1,
                            map_size=1 << 26, lock=False, meminit=False)
            try:
                dbs = {}
                # Two commits, each writing the state record with its own
                # transaction id, so that both meta pages name a
                # transaction that wrote one ([F9]).
                for _ in range(2):
                    with env.begin(write=True) as txn:
                        if not dbs:
                            dbs = {n: env.open_db(n.encode(), txn=txn, create=True)
                                   for n in rec.ALL_DBS}
                            for key, payload in initial.items():
                                txn.put(key, rec.frame(key, payload), db=dbs[rec.DB_META])
                        state = rec.State(txnid=txn.id())
                        txn.put(rec.KEY_STATE, rec.frame(rec.KEY_STATE, state.pack()),
                                db=dbs[rec.DB_META])
                env.sync(True)
            finally:
                env.close()
            fsync_path(tmp)
            # The lock file before the index appears: a disk too full for it
            # fails the create with nothing left behind, not an index that
            # then cannot be opened (and blocks a second create).
            made_lock = not os.path.lexists(path + "-lock")
            try:
                prepare_lock_file(path, readonly=False)
            except BaseException:
                if made_lock:
                    with contextlib.suppress(OSError):
                        os.unlink(path + "-lock")
                raise
            publish(tmp, path)
        except (lmdb.Error, OSError) as exc:
            if isinstance(exc, FileExistsError):
                raise
            raise translate_error(exc, path) from exc
        finally:
            if build is not None:
                release_build(build, tmp)

    #: What ClosedError says once the environment is gone (see disown).
    closed_reason = "index is closed"

    def disown(self, reason: str) -> None:
        """In a child of fork(): let go of the parent's environment without closing
        it; later use raises ClosedError(reason).

        LMDB's environment belongs to the process that opened it: a child
        that used it shared the parent's reader slot and write state, and
        one that closed it (or aborted its read transactions) would clear
        the parent's reader slots.  Dropped unclosed, py-lmdb frees nothing
        in a child of the process that opened it, and forgets the file: the
        child may open it again itself.
        """
        self._env, self._dbs = None, {}
        self.closed_reason = reason

    def close(self) -> None:
        """Close the environment; later use raises ClosedError."""
        env, self._env = self._env, None
        if env is not None:
            try:
                self.filemap.close()
            finally:
                try:
                    env.close()
                except lmdb.Error as exc:
                    raise translate_error(exc, self.path) from exc

    @property
    def env(self) -> lmdb.Environment:
        if self._env is None:
            raise ClosedError(f"{self.path}: {self.closed_reason}")
        return self._env

    # -- reading ---------------------------------------------------------------

    def latest_txnid(self) -> int:
        """The newest committed transaction id, from the meta pages (two loads)."""
        return max(self.meta_txnids())

    def meta_txnids(self) -> tuple[int, int]:
        """The transaction ids of meta pages 0 and 1."""
        psize = self.filemap.psize
        buf = self.filemap.buffer(2 * psize)
        return (struct.unpack_from("<Q", buf, pages.META_TXNID_OFFSET)[0],
                struct.unpack_from("<Q", buf, psize + pages.META_TXNID_OFFSET)[0])

    def check_lock_table(self) -> None:
        """CorruptionError if LMDB's reader table counts more slots than it has.

        Every process with the index open maps ``<path>-lock`` and LMDB
        trusts its count of reader slots: a reader taking a slot, a writer
        looking for the oldest snapshot and close all loop over that many.
        A count past the table (a damaged lock file) made them read past the
        mapping: SIGSEGV in every process that began a transaction.  One
        load (mdb_env_info), before each transaction this store begins.
        """
        try:
            info = self.env.info()
        except lmdb.Error as exc:
            raise translate_error(exc, self.path) from exc
        if info["num_readers"] > info["max_readers"]:
            raise lock_file_error(self.path, f"it counts {info['num_readers']:,} reader slots, "
                                  f"in a table of {info['max_readers']:,}")

    def _check_write_txnid(self, txn) -> None:
        """CorruptionError unless a write transaction follows the newest commit.

        LMDB takes a writer's transaction id, and with it the meta page the
        writer builds on, from the lock file (mti_txnid), which holds the
        newest commit's id while its writer mutex is held (a writer that
        died mid-commit is cleaned up as the next one takes it).  A damaged
        id would build on the older meta page, undoing the last commit.
        """
        latest = self.latest_txnid()
        if txn.id() != latest + 1:
            named = (txn.id() - 1) % (1 << 64)
            raise lock_file_error(self.path, f"it names transaction {named:,} as the "
                                  f"newest commit, the index {latest:,}")

    def snapshot(self):
        """Begin a read transaction and return (txn, PageView) of its snapshot.

        The caller aborts txn when done; the view is valid until then.
        Raises CorruptionError if the snapshot's meta page, main tree or
        named trees are damaged.
        """
        env = self.env
        self.check_lock_table()
        txnid = None
        for _ in range(SNAPSHOT_RETRIES):
            try:
                try:
                    txn = ReadTxn(env.begin(buffers=True), self.path)
                except lmdb.MapResizedError:
                    env.set_mapsize(0)
                    continue
                except lmdb.ReadersFullError:
                    # Slots of readers that died may fill the table: free
                    # them and try once more (else the error stands).
                    if not env.reader_check():
                        raise
                    continue
                txnid = txn.id()
            except lmdb.Error as exc:
                raise translate_error(exc, self.path) from exc
            try:
                view = self._view_of(txnid)
            except BaseException:
                txn.abort()
                raise
            if view is not None:
                return txn, view
            txn.abort()  # a writer reused the meta page meanwhile: begin again
        held = self.meta_txnids()
        if txnid is not None and txnid not in held:
            # LMDB took the id from the lock file, and it stayed wrong through
            # every retry (a writer reusing a meta page moves it on).
            raise lock_file_error(self.path, f"it names transaction {txnid:,}, which neither "
                                  f"meta page of the index holds ({held[0]:,}, {held[1]:,})")
        raise CorruptionError(f"{self.path}: no meta page matches the reader's transaction",
                              database="lmdb")

    def _view_of(self, txnid: int):
        fm = self.filemap
        size = fm.file_bytes()
        psize = fm.psize
        buf = fm.buffer(size)
        meta = _meta_at(buf, txnid & 1, psize)
        if meta is None or meta["txnid"] != txnid:
            return None
        npages = min(size // psize, meta["last_pg"] + 1)
        main = pages.Tree.from_record(meta["main"])
        trees = pages.named_trees(buf, psize, npages, main, rec.ALL_DBS)
        trees["main"] = main
        trees["free"] = pages.Tree.from_record(meta["free"])._replace(flags=0x08)
        return pages.PageView(buf, psize, npages, txnid, trees, meta["last_pg"])

    # -- writing ---------------------------------------------------------------

    def write(self, body, *, sync: bool = True):
        """Run body(WriteTxn) in one write transaction and commit it.

        sync=True makes the commit durable before returning (data and meta
        page flushed); sync=False flushes the data but leaves the meta page
        to the next sync, so an OS crash may undo this commit but never
        corrupts the file (LMDB's MDB_NOMETASYNC).  body must not keep the
        WriteTxn.  A full disk raises CapacityError with nothing lost.
        """
        if self.readonly:
            raise ReadOnlyError(f"{self.path}: opened read-only")
        env = self.env
        self.check_in_place()
        self.clear_dead_readers()
        with self._write_lock:
            self.check_lock_table()
            try:
                txn = env.begin(write=True)
            except lmdb.Error as exc:
                raise translate_error(exc, self.path) from exc
            try:
                self._check_write_txnid(txn)
                wt = WriteTxn(self, txn)
                result = body(wt)
                txn.commit()
            except BaseException as exc:
                # An abort failing now would hide why the write failed, which
                # matters more; LMDB frees the transaction either way.
                with contextlib.suppress(lmdb.Error):
                    txn.abort()
                if isinstance(exc, (lmdb.Error, OSError)) and not isinstance(exc, FileNotFoundError):
                    raise translate_error(exc, self.path) from exc
                raise
            self.bytes_written += wt.bytes_put
        if sync:
            # Outside the write lock: another thread's commit need not wait
            # for this fsync (LMDB's env sync takes no transaction lock), and
            # whatever it commits meanwhile is flushed too.
            try:
                env.sync(True)
            except lmdb.Error as exc:
                raise translate_error(exc, self.path) from exc
        return result

    def in_place(self) -> bool:
        """Whether path still names the file this store has open."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self.filemap.file_id

    def check_in_place(self) -> None:
        """Raise ReadOnlyError unless path still names the file this store has
        open.  Deleted or moved, the file takes commits that no later open of
        path would find (as SQLite's SQLITE_READONLY_DBMOVED says); its
        content can still be read, and vacuum_into() saves it.  One stat, a
        microsecond a commit."""
        if not self.in_place():
            raise ReadOnlyError(f"{self.path}: the index file was deleted, moved or replaced "
                                "since it was opened; writes would be lost (vacuum_into() "
                                "saves what it holds)")

    def clear_dead_readers(self) -> None:
        """Free the reader slots of processes that died inside a read (at most once
        every READER_CHECK_SECONDS).

        A reader killed while its snapshot was open leaves its slot in LMDB's
        lock file, naming that snapshot: LMDB then reuses no page freed after
        it, and a writer's file grew with every compaction for as long as the
        writer stayed open (LMDB clears such slots only when an environment is
        opened with no one else in it).
        """
        import time
        now = time.monotonic()
        if now - self._readers_checked < READER_CHECK_SECONDS:
            return
        self._readers_checked = now
        self.check_lock_table()
        try:
            self.env.reader_check()
        except lmdb.Error as exc:
            raise translate_error(exc, self.path) from exc

    def sync(self) -> None:
        """Flush every commit to disk (the meta page included)."""
        if not self.readonly:
            try:
                self.env.sync(True)
            except lmdb.Error as exc:
                raise translate_error(exc, self.path) from exc

    def file_bytes(self) -> int:
        return os.path.getsize(self.path)

    def readers(self) -> list[tuple[int, int]]:
        """(pid, txnid) of every read transaction open on the file, in any
        process: LMDB's reader table (mdb_reader_list's text, parsed; a slot
        between reads, txnid "-", is left out).  Slots of processes that died
        inside a read are freed first: they hold back page reuse too, but no
        one will end them (clear_dead_readers, unthrottled)."""
        self.check_lock_table()
        try:
            self.env.reader_check()
            text = self.env.readers()
        except lmdb.Error as exc:
            raise translate_error(exc, self.path) from exc
        out = []
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) == 3 and parts[0].isdigit() and parts[2].isdigit():
                out.append((int(parts[0]), int(parts[2])))
        return out

    def copy_to(self, dest: str, fd: int | None = None) -> None:
        """Write a compacted copy of the environment (only live pages) to dest, a
        new name, or to fd, open on dest and empty."""
        try:
            if fd is None:
                self.env.copy(os.fsencode(dest), compact=True)
            else:
                self.env.copyfd(fd, compact=True)
        except lmdb.Error as exc:
            raise translate_error(exc, dest) from exc


class ReadTxn:
    """An LMDB read transaction pinning a snapshot, as :meth:`Store.snapshot` hands it out.

    Only id() and abort() are offered, and abort() raises ndindex errors:
    the callers above the store (index, reader) end snapshots without
    knowing about LMDB.
    """

    __slots__ = ("_txn", "_path")

    def __init__(self, txn, path: str):
        self._txn = txn
        self._path = path

    def id(self) -> int:  # noqa: A003 - mirrors lmdb.Transaction.id
        return self._txn.id()

    def abort(self) -> None:
        try:
            self._txn.abort()
        except lmdb.Error as exc:
            raise translate_error(exc, self._path) from exc


class WriteTxn:
    """A write transaction whose every key is checked on disk before LMDB walks to it.

    ``view`` is the committed snapshot the transaction builds on, read
    through the page reader; reads of records in a write go through it.
    """

    def __init__(self, store: Store, txn):
        self._store = store
        self._txn = txn
        self.txnid = txn.id()
        self.bytes_put = 0
        view = store._view_of(self.txnid - 1)
        if view is None:
            raise CorruptionError(f"{store.path}: no meta page names the last commit "
                                  f"({self.txnid - 1})", database="lmdb")
        self.view = view
        # LMDB walks the main tree (named database records) and the free
        # list (page reuse) in every write: check them whole.
        view.check("main")
        view.check("free")
        self._checked = set()

    def _check_path(self, db: str, key: bytes) -> None:
        if (db, key) in self._checked:
            return
        self.view.scan(db, key, limit=1, check_all=True)
        self._checked.add((db, key))

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self._check_path(db, key)
        try:
            self._txn.put(key, value, db=self._store._dbs[db])
        except lmdb.Error as exc:  # here the database and key are known: name them
            raise translate_error(exc, self._store.path, db, key) from exc
        self.bytes_put += len(key) + len(value)

    def put_framed(self, key: bytes, payload: bytes) -> None:
        self.put(rec.DB_META, key, rec.frame(key, payload))

    def delete(self, db: str, key: bytes) -> bool:
        self._check_path(db, key)
        try:
            return self._txn.delete(key, db=self._store._dbs[db])
        except lmdb.Error as exc:
            raise translate_error(exc, self._store.path, db, key) from exc


def _is_format_v1(env: lmdb.Environment) -> bool:
    """Whether the environment holds format 1's named databases (its main tree was checked)."""
    try:
        with env.begin() as txn:
            return txn.get(b"segments") is not None and txn.get(b"chunks") is None
    except lmdb.Error:
        return False


def _meta_at(buf, slot: int, psize: int):
    try:
        return _core.lmdb_meta(buf, slot, psize)
    except CorruptionError:
        return None


def _tail_is_free(fm: pages.FileMap, meta: dict, file_pages: int) -> bool:
    """Whether the pages past the end of the file are all on the free list.

    LMDB's last_pg may name pages that a transaction allocated and freed
    again without writing (mdb.c: "the file may be shorter if the freeDB
    lists the final pages").  Such a file is whole; any other short file is
    truncated.
    """
    size = file_pages * meta["psize"]
    buf = fm.buffer(size)
    free = pages.PageView(buf, meta["psize"], file_pages, meta["txnid"],
                          {"free": pages.Tree.from_record(meta["free"])._replace(flags=0x08)})
    try:
        listed = set()
        for _, value in free.scan("free"):
            ids = _core_idl(value)
            listed.update(ids)
    except CorruptionError:
        return False
    return all(p in listed for p in range(file_pages, meta["last_pg"] + 1))


def _core_idl(value) -> list:
    """Page numbers of an LMDB free-list record (a count, then the ids)."""
    raw = bytes(value)
    if len(raw) < 8 or len(raw) % 8:
        raise CorruptionError("free-list record size impossible", database="lmdb")
    n = struct.unpack_from("<Q", raw)[0]
    if n != len(raw) // 8 - 1:
        raise CorruptionError("free-list record count disagrees with its size", database="lmdb")
    return list(struct.unpack_from(f"<{n}Q", raw, 8))


def check_commit_records(store: Store) -> None:
    """Both meta pages must name transactions that wrote our state record ([F9]).

    Every commit rewrites the state record with its own transaction id.  A
    damaged transaction id in a meta page would make LMDB open the other,
    older commit, silently undoing the last one; a damaged root would make
    it read garbage.  Checked in O(1): one lookup per meta page.
    """
    metas = store.filemap.metas()
    slot, picked = pick_meta(metas, store.path)
    size = store.filemap.file_bytes()
    buf = store.filemap.buffer(size)
    found = {}
    for s, meta in enumerate(metas):
        if meta["txnid"] == 0 and meta["main"]["root"] == (1 << 64) - 1:
            continue  # the empty initial meta page of a new environment
        npages = min(size // meta["psize"], meta["last_pg"] + 1)
        try:
            main = pages.Tree.from_record(meta["main"])
            trees = pages.named_trees(buf, meta["psize"], npages, main, [rec.DB_META])
            view = pages.PageView(buf, meta["psize"], npages, meta["txnid"], trees)
            raw = view.get(rec.DB_META, rec.KEY_STATE)
            state = rec.State.unpack(rec.unframe(raw, rec.DB_META, rec.KEY_STATE)) if raw is not None \
                else None
        except CorruptionError as exc:
            if s == slot:
                raise
            raise CorruptionError(f"{store.path}: meta page {s} (transaction {meta['txnid']}) "
                                  f"leads to damaged pages: {exc}", database="lmdb") from exc
        if state is None:
            raise CorruptionError(f"{store.path}: meta page {s} (transaction {meta['txnid']}) has "
                                  "no state record", database="lmdb")
        if state.txnid != meta["txnid"]:
            other = metas[1 - s]["txnid"]
            raise CorruptionError(
                f"{store.path}: meta page {s} names transaction {meta['txnid']}, but its state "
                f"record was written by transaction {state.txnid}: the meta page is damaged; "
                f"LMDB would open transaction {max(meta['txnid'], other)} "
                f"({'this page' if meta['txnid'] > other else 'the other page, an older state'})",
                database="lmdb")
        found[s] = state.txnid
    if len(found) == 2 and abs(found[0] - found[1]) != 1:
        raise CorruptionError(f"{store.path}: the meta pages name transactions {found[0]} and "
                              f"{found[1]}, not consecutive ones", database="lmdb")


def restamp_commits(path: str) -> None:
    """Give a copied environment two commits that carry their own state record.

    LMDB's compacting copy renumbers transactions, so the state record no
    longer names the transaction that wrote it ([F9]).  Two commits, each
    rewriting the state with its own id, restore the invariant on both meta
    pages; then the file is synced.
    """
    try:
        env = lmdb.open(os.fsencode(path), subdir=False, max_dbs=len(rec.ALL_DBS) + 1, lock=False,
                        map_size=INITIAL_MAP_SIZE_BYTES, meminit=False)
    except lmdb.Error as exc:
        raise translate_error(exc, path) from exc
    try:
        meta_db = env.open_db(rec.DB_META.encode(), create=False)
        for _ in range(2):
            with env.begin(write=True) as txn:
                raw = txn.get(rec.KEY_STATE, db=meta_db)
                if raw is None:
                    raise CorruptionError("state record is missing", database=rec.DB_META,
                                          key=rec.KEY_STATE)
                state = rec.State.unpack(rec.unframe(raw, rec.DB_META, rec.KEY_STATE))
                state.txnid = txn.id()
                txn.put(rec.KEY_STATE, rec.frame(rec.KEY_STATE, state.pack()), db=meta_db)
        env.sync(True)
    except lmdb.Error as exc:
        _close_quietly(env)
        raise translate_error(exc, path) from exc
    except BaseException:
        _close_quietly(env)
        raise
    try:
        env.close()
    except lmdb.Error as exc:
        raise translate_error(exc, path) from exc
    fsync_path(path)


def _close_quietly(env: lmdb.Environment) -> None:
    """Close an environment on a failure path: the failure being reported matters more."""
    with contextlib.suppress(lmdb.Error):
        env.close()


def fsync_path(path: str) -> None:
    fd = -1
    try:
        # Not a Descriptor: path may be a directory, which FileIO refuses.
        with interrupts_deferred():
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        os.fsync(fd)
    finally:
        if fd >= 0:
            os.close(fd)
