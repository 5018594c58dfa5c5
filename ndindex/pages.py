"""Reading the index file's LMDB pages in place, never trusting a byte.

Format v2 reads every record of the index itself, from a read-only mapping
of the file, through the C page reader (``ndindex/_core/lmdbpage.c``):
LMDB's own tree code asserts (aborting the process) or reads past the file
on some damaged pages, ours reports ``CorruptionError``.  LMDB still does
what it is best at: transactions, the reader table, page allocation and
crash-safe commits.  FORMAT.md section 8 lists the LMDB fields read here.

A ``PageView`` is one committed snapshot: the mapping, the page geometry
and the roots of the named trees as of one LMDB transaction id.  It stays
valid while the LMDB read transaction that pinned that snapshot is open
(LMDB never reuses a page a live reader can reach).
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
from typing import NamedTuple

from ndindex import _core
from ndindex.descriptors import Descriptor
from ndindex.errors import ClosedError, CorruptionError

#: The largest mapping of the file.  Mappings reserve address space ahead
#: of the file (as LMDB reserves its own) and double when the file outgrows
#: them, so a growing file is remapped O(log size) times and a small index
#: takes little of the process's address space.
MAP_RESERVE_BYTES = (1 << 40) if hasattr(_core, "FileMapping") and sys.maxsize > 2**32 else 0
#: The smallest mapping: most indexes never remap.
MAP_MIN_BYTES = 1 << 30
#: The largest page size LMDB writes; meta page 1 starts one page in.
MAX_PAGE_BYTES = 65536
#: Where a meta page keeps mm_txnid: the page header (16), magic, version,
#: address and map size (24), two tree records (96), mm_last_pg (8).
META_TXNID_OFFSET = 144
#: Both meta pages of 4 KB pages (LMDB's page size is the OS's): what an
#: open reads first.  From a cold cache 8 KB took 0.3 ms to read, 2 x
#: MAX_PAGE_BYTES 0.85 ms, a quarter of a cold open.
COMMON_HEAD_BYTES = 2 * 4096


def read_head(path: str, fd: int | None = None) -> bytes:
    """The file's first bytes, enough for both meta pages: COMMON_HEAD_BYTES
    when meta page 0 reads as a meta page of pages that small, else (larger
    pages, or page 0 damaged) 2 x MAX_PAGE_BYTES.  Whatever lmdb_meta finds
    in the longer read it finds in the shorter, which holds both pages.
    fd: read the file open there, not the one now at path."""
    if fd is None:
        with Descriptor(path, os.O_RDONLY) as fd:
            return read_head(path, fd)
    head = os.pread(fd, COMMON_HEAD_BYTES, 0)
    try:
        fits = 2 * _core.lmdb_meta(head, 0)["psize"] <= len(head)
    except CorruptionError:
        fits = False
    if not fits and len(head) == COMMON_HEAD_BYTES:
        head += os.pread(fd, 2 * MAX_PAGE_BYTES - len(head), len(head))
    return head


def metas_of(head: bytes) -> list:
    """Both meta pages in head (read_head) as dicts (lmdb_meta), or the
    CorruptionError each raised; page 1 is read at the page size page 0
    gives."""
    out = []
    psize = 0
    for slot in (0, 1):
        try:
            meta = _core.lmdb_meta(head, slot, psize)
            psize = meta["psize"]
            out.append(meta)
        except CorruptionError as exc:
            out.append(exc)
    return out


class Tree(NamedTuple):
    """A B-tree's root page (None when empty), depth and LMDB flags, and the
    pages it holds (branch, leaf and overflow: its size, as LMDB counts it)."""

    root: int | None
    depth: int
    flags: int = 0
    pages: int = 0

    @classmethod
    def from_record(cls, rec: dict) -> "Tree":
        root = rec["root"]
        return cls(None if root == (1 << 64) - 1 else root, rec["depth"], rec["flags"],
                   rec["branch_pages"] + rec["leaf_pages"] + rec["overflow_pages"])


class FileMap:
    """A read-only mapping of the index file that follows its growth.

    ``geometry()`` returns the current mapping and the number of whole
    pages the file holds; readers never look past them.

    close() may come from another thread while one takes a snapshot: the
    descriptor is used and closed under a lock, so that the snapshot gets
    ClosedError, not EBADF from a closed descriptor or, worse, the size or
    mapping of a file opened meanwhile under the same number
    (tools/soak_oracle.py's watcher thread met the first at a reopen).
    Mappings handed out stay valid after close().
    """

    def __init__(self, path: str):
        self.path = path
        self._file = Descriptor(path, os.O_RDONLY)   # closed with this object if __init__ fails
        st = os.fstat(self._file.fd)
        #: (device, inode) of the file open here: whether path still names it.
        self.file_id = (st.st_dev, st.st_ino)
        self._lock = threading.Lock()
        self._map = None
        self._map_bytes = 0
        self.psize = 0

    def close(self) -> None:
        with self._lock:
            self._map = None
            self._file.close()

    def _open_fd(self) -> int:
        """The descriptor (the lock held); ClosedError once closed."""
        fd = self._file.fd
        if fd < 0:
            raise ClosedError(f"{self.path}: index is closed")
        return fd

    def file_bytes(self) -> int:
        with self._lock:
            return os.fstat(self._open_fd()).st_size

    def buffer(self, need_bytes: int):
        """A mapping covering at least need_bytes of the file (which must hold them)."""
        with self._lock:
            fd = self._open_fd()
            if self._map is None or need_bytes > self._map_bytes:
                if MAP_RESERVE_BYTES:
                    size = max(MAP_MIN_BYTES, self._map_bytes)
                    while size < 2 * need_bytes and size < MAP_RESERVE_BYTES:
                        size *= 2
                    size = max(min(size, MAP_RESERVE_BYTES), need_bytes)
                    self._map = _core.FileMapping(fd, size)
                    self._map_bytes = size
                else:
                    size = os.fstat(fd).st_size
                    self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
                    self._map_bytes = size
            return self._map

    def metas(self) -> list:
        """Both meta pages as dicts (lmdb_meta), or the CorruptionError each raised."""
        with self._lock:  # read, not mapped: the mapping may not exist yet
            out = metas_of(read_head(self.path, self._open_fd()))
        if isinstance(out[0], dict):  # page 1 parses only at page 0's page size
            self.psize = out[0]["psize"]
        return out


class PageView:
    """One committed snapshot's pages: lookups and scans of its named trees."""

    def __init__(self, buf, psize: int, npages: int, txnid: int, trees: dict,
                 last_pg: int = 0):
        self.buf = buf
        self.psize = psize
        self.npages = npages
        self.txnid = txnid
        self.trees = trees
        #: The snapshot's last page (its meta page's): the free list's
        #: records are checked as lists of pages up to it (0: not known).
        self.last_pg = last_pg

    def get(self, tree: str, key: bytes):
        """The value stored under key (a memoryview into the map), or None."""
        hit = _core.lmdb_get(self.buf, self.psize, self.npages, self.trees[tree], key)
        if hit is None:
            return None
        off, length, flags = hit
        if flags & 0x06:  # F_SUBDATA / F_DUPDATA: not a plain value in any v2 tree
            raise CorruptionError(f"{tree}: value of key {key.hex()} has node flags {flags:#x}",
                                  database=tree, key=key)
        return memoryview(self.buf)[off:off + length]

    def scan(self, tree: str, start: bytes = b"", prefix: bytes = b"", limit: int = -1,
             check_all: bool = False) -> list:
        """[(key, value)] from the first key >= start while keys begin with prefix."""
        rows = _core.lmdb_scan(self.buf, self.psize, self.npages, self.trees[tree], start,
                               prefix, limit, check_all)
        mv = memoryview(self.buf)
        out = []
        # The main tree's values are named-database records (F_SUBDATA).
        bad_flags = 0x04 if tree == "main" else 0x06
        for key, off, length, flags in rows:
            if flags & bad_flags:
                raise CorruptionError(f"{tree}: value of key {key.hex()} has node flags "
                                      f"{flags:#x}", database=tree, key=key)
            out.append((key, mv[off:off + length]))
        return out

    def check(self, tree: str) -> int:
        """Check a whole tree as scan(tree, check_all=True) does, without
        building its rows; return its number of entries."""
        return _core.lmdb_check_tree(self.buf, self.psize, self.npages, self.trees[tree],
                                     0x04 if tree == "main" else 0x06,
                                     self.last_pg if tree == "free" else 0)


def named_trees(buf, psize: int, npages: int, main: Tree, names) -> dict:
    """The trees of the named databases, read from the main tree's records."""
    trees = {}
    for name in names:
        hit = _core.lmdb_get(buf, psize, npages, tuple(main), name.encode())
        if hit is None:
            trees[name] = Tree(None, 0, 0)
            continue
        off, length, flags = hit
        if flags != 0x02:  # F_SUBDATA, inline
            raise CorruptionError(f"main database record {name!r} has node flags {flags:#x}",
                                  database="lmdb", key=name.encode())
        rec = _core.lmdb_tree(buf, psize, npages, bytes(memoryview(buf)[off:off + length]))
        trees[name] = Tree.from_record(rec)
    return trees


def meta_words(buf) -> memoryview:
    """Both meta pages (or zeros after close) as 64-bit words (LMDB writes
    them in native order)."""
    return memoryview(buf).cast("B").cast("Q")
