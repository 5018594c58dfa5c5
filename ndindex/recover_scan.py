"""Every value of a damaged file whose checksum verifies: the page scan of ``recover``.

Each page is looked at on its own, without trusting LMDB's trees (the
damage may be in them): a page that names itself as a leaf is parsed node
by node, every offset and size checked against the page and the file; a
value kept in overflow pages is read only after its page number and length
are checked against the file; an overflow run that no readable leaf points
to is read too, its key rebuilt from the value itself (FORMAT.md 7.7-7.9
put the run id and the last entry in every chunk's header).  A value is
kept only if its checksum verifies, and the checksum covers its key ([F2]).
:mod:`ndindex.recover` chooses among what this finds and rebuilds the index.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import mmap
import os
import struct

import numpy as np

from ndindex import _core, chunks as ch, pages
from ndindex import records as rec
from ndindex.errors import CorruptionError

#: LMDB page flags and node flags (format-spec/lmdb.md sections 2 and 5).
P_LEAF = 0x02
P_OVERFLOW = 0x04
P_DIRTY = 0x10
F_BIGDATA = 0x01
F_SUBDATA = 0x02
F_DUPDATA = 0x04
PAGE_HEADER_BYTES = 16
NODE_HEADER_BYTES = 8
#: The meta pages (0 and 1) are LMDB's; data pages start here.
FIRST_DATA_PAGE = 2
#: Page sizes tried, most likely first, when both meta pages are damaged.
PAGE_SIZES = (4096, 8192, 16384, 32768, 65536, 2048, 1024, 512)
#: Meta records a salvage reads; other names are ignored.
META_NAMES = (rec.KEY_HEADER, rec.KEY_PLAN, rec.KEY_STATE, rec.KEY_MANIFEST,
              rec.KEY_FINGERPRINTER, rec.KEY_KEY_DESIGN)


@dataclasses.dataclass
class Found:
    """Every value of the file whose checksum verifies, by kind and key.

    Each maps a key to the distinct values found under it (usually one:
    the file keeps identical stale copies of values in its free pages).
    """

    meta: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    log: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    chunks: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    #: Names of the named databases the main tree's leaves list.
    databases: set = dataclasses.field(default_factory=set)
    #: Pages read as leaves; overflow runs read without a leaf pointing to
    #: them; values (leaf nodes, overflow runs) that verified as nothing
    #: (LMDB's free list among them).
    leaf_pages: int = 0
    overflow_runs: int = 0
    unreadable_values: int = 0

    def add(self, table: dict, key, value) -> None:
        values = table[key]
        if not any(v == value for v in values):
            values.append(value)


class FileImage:
    """The damaged file, mapped read-only, with its page size and page count."""

    def __init__(self, path: str):
        self.path = path
        self.size = os.path.getsize(path)
        with open(path, "rb") as fh:
            self.buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if self.size else b""
        head = self.buf[:2 * pages.MAX_PAGE_BYTES]
        self.metas = [_meta_or_none(head, 0, 0)]
        hints = [self.metas[0]["psize"]] if self.metas[0] else PAGE_SIZES
        self.metas.append(next((m for m in (_meta_or_none(head, 1, p) for p in hints) if m), None))
        parsed = [m for m in self.metas if m is not None]
        self.psize = parsed[0]["psize"] if parsed else _guess_page_size(self.buf, self.size)
        self.npages = self.size // self.psize
        #: The newest transaction a meta page names (None if both are damaged).
        self.newest_txnid = max((m["txnid"] for m in parsed), default=None)

    def close(self) -> None:
        if isinstance(self.buf, mmap.mmap):
            with contextlib.suppress(BufferError):  # a view still held: unmapped when it goes
                self.buf.close()

    def page_headers(self):
        """(mp_pgno, mp_flags) arrays of every whole page of the file."""
        n = self.npages
        if n == 0:
            return np.empty(0, np.uint64), np.empty(0, np.uint16)
        raw = np.frombuffer(self.buf, dtype=np.uint8, count=n * self.psize).reshape(n, self.psize)
        head = np.ascontiguousarray(raw[:, :PAGE_HEADER_BYTES])
        del raw  # no view of the map may outlive this call (close() unmaps it)
        return head[:, 0:8].copy().view("<u8").ravel(), head[:, 10:12].copy().view("<u2").ravel()


def _meta_or_none(head: bytes, slot: int, psize: int):
    try:
        return _core.lmdb_meta(head, slot, psize)
    except (CorruptionError, ValueError):
        return None


def _guess_page_size(buf, size: int) -> int:
    """The page size under which most early pages name themselves (both meta pages damaged)."""
    best, best_hits = PAGE_SIZES[0], -1
    for psize in PAGE_SIZES:
        hits = sum(1 for p in range(FIRST_DATA_PAGE, min(size // psize, 256))
                   if struct.unpack_from("<Q", buf, p * psize)[0] == p)
        if hits > best_hits:
            best, best_hits = psize, hits
    return best


def scan_leaves(image: FileImage, found: Found) -> set:
    """Read every node of every page that names itself a leaf; return the overflow pages used.

    A node's value is taken as a meta record, a log record or a chunk if
    its checksum verifies as one of them (the database it came from is not
    trusted: a value must prove what it is).
    """
    pgnos, flags = image.page_headers()
    idx = np.arange(len(pgnos), dtype=np.uint64)
    leaves = np.flatnonzero((pgnos == idx) & ((flags & ~np.uint16(P_DIRTY)) == P_LEAF))
    claimed = set()
    psize, buf = image.psize, image.buf
    for p in leaves.tolist():
        if p < FIRST_DATA_PAGE:
            continue
        found.leaf_pages += 1
        base = p * psize
        # mp_upper is not needed (each node is checked against the page);
        # a mp_lower beyond the page is cut to it.
        (lower,) = struct.unpack_from("<H", buf, base + 12)
        for i in range((min(lower, psize) - PAGE_HEADER_BYTES) // 2):
            (off,) = struct.unpack_from("<H", buf, base + PAGE_HEADER_BYTES + 2 * i)
            node = _leaf_node(image, base, off)
            if node is None:
                found.unreadable_values += 1
                continue
            key, value, overflow = node
            if value is None:
                found.databases.add(key)
            elif _take(found, key, value):
                if overflow is not None:
                    claimed.add(overflow)
            else:
                found.unreadable_values += 1
    return claimed


def _leaf_node(image: FileImage, base: int, off: int):
    """(key, value, overflow page or None) of one leaf node, bounds-checked; None if impossible."""
    psize, buf = image.psize, image.buf
    if not PAGE_HEADER_BYTES <= off <= psize - NODE_HEADER_BYTES:
        return None
    lo, hi, nflags, ksize = struct.unpack_from("<HHHH", buf, base + off)
    dsize = lo | hi << 16
    kstart = base + off + NODE_HEADER_BYTES
    if kstart + ksize > base + psize or nflags & ~(F_BIGDATA | F_SUBDATA | F_DUPDATA):
        return None
    key = bytes(buf[kstart:kstart + ksize])
    if nflags & (F_SUBDATA | F_DUPDATA):
        return key, None, None  # a named database's record (main tree): not data
    dstart = kstart + ksize
    if not nflags & F_BIGDATA:
        if dstart + dsize > base + psize:
            return None
        return key, memoryview(buf)[dstart:dstart + dsize], None
    if dstart + 8 > base + psize:
        return None
    (ov,) = struct.unpack_from("<Q", buf, dstart)
    start = ov * psize + PAGE_HEADER_BYTES
    # The overflow page's own header is not needed to read the value (only
    # its place and length are), so a damaged header loses nothing: the
    # value's checksum decides.
    if not FIRST_DATA_PAGE <= ov < image.npages or start + dsize > image.npages * psize:
        return None
    return key, memoryview(buf)[start:start + dsize], ov


def _take(found: Found, key: bytes, value) -> bool:
    """File a value under meta, log or chunks if it verifies as one; return whether it did."""
    if key in META_NAMES or key.startswith(b"journal:"):
        payload = unframe_value(value, key)
        if payload is not None:
            found.add(found.meta, key, payload)
            return True
    if len(key) == 8:
        payload = unframe_value(value, key)
        if payload is not None:
            found.add(found.log, rec.U64_BE.unpack(key)[0], payload)
            return True
    if len(key) >= 5 and _chunk_verifies(key, value):
        found.add(found.chunks, key, bytes(value))
        return True
    return False


def unframe_value(value, key: bytes):
    """The payload of a framed value, or None if its frame or checksum fails."""
    try:
        return rec.unframe(value, "", key)
    except CorruptionError:
        return None


def _chunk_verifies(key: bytes, value) -> bool:
    """Whether a value's header checksum (and kind-specific shape) verifies under key."""
    if len(value) < 8:
        return False
    kind = value[4]
    try:
        if kind in (rec.KIND_HUFFMAN, rec.KIND_RAW):
            ch.unpack_fp_chunk(key, value)
        elif kind == rec.KIND_TOMBSTONES:
            tombstone_chunk(key, value)
        elif kind == rec.KIND_RECORDS:
            ch.unpack_record_chunk(key, value)
        else:
            return False
    except CorruptionError:
        return False
    return True


def tombstone_chunk(key: bytes, value):
    """(fps, stamps, first, last) of a tombstone chunk checked on its own (not against neighbours)."""
    raw = bytes(value)
    if len(raw) < ch.FP_CHUNK_HEAD.size:
        raise CorruptionError("tombstone chunk too short", database=rec.DB_CHUNKS, key=key)
    flags = raw[5]
    low = ch.FP_CHUNK_HEAD.unpack_from(raw)[6]
    fps, stamps, _ = ch.unpack_tombstone_chunk(key, raw, None if flags & ch.FLAG_FIRST else low,
                                               repeats=True)
    return fps, stamps, bool(flags & ch.FLAG_FIRST), bool(flags & ch.FLAG_LAST)


def scan_overflow(image: FileImage, found: Found, claimed: set, space_of_run: dict,
                  table_spaces) -> None:
    """Read the overflow runs no readable leaf pointed to, rebuilding each chunk's key.

    A chunk's header holds its run id and its last entry; the space comes
    from the manifest (space_of_run) or is tried among table_spaces; a
    record chunk's separator is tried among its last key's separators.
    The header checksum, which covers the key, tells the right one.
    """
    pgnos, flags = image.page_headers()
    idx = np.arange(len(pgnos), dtype=np.uint64)
    heads = np.flatnonzero((pgnos == idx) & ((flags & ~np.uint16(P_DIRTY)) == P_OVERFLOW))
    psize, end = image.psize, image.npages * image.psize
    for p in heads.tolist():
        if p < FIRST_DATA_PAGE or p in claimed:
            continue
        found.overflow_runs += 1
        # The run's length (mp_pages) is not trusted: the chunk's own header
        # says how long it is, and the checksum whether that is right.
        start = p * psize + PAGE_HEADER_BYTES
        got = _overflow_chunk(image.buf, start, end, space_of_run, table_spaces)
        if got is None:
            found.unreadable_values += 1
            continue
        key, value = got
        found.add(found.chunks, key, value)


def _overflow_chunk(buf, start: int, limit: int, space_of_run: dict, table_spaces):
    """(key, value) of the chunk stored at buf[start:...], or None."""
    if start + ch.FP_CHUNK_HEAD.size > limit:
        return None
    kind = buf[start + 4]
    (run_id,) = struct.unpack_from("<I", buf, start + 8)
    prefix_of = (lambda space: ch.run_prefix(space, run_id))
    if kind in (rec.KIND_HUFFMAN, rec.KIND_RAW):
        (n,) = struct.unpack_from("<H", buf, start + 6)
        length = ch.FP_CHUNK_HEAD.size + (8 + ch.BLOCK_BYTES) * n
        if not 1 <= n <= ch.CHUNK_MAX_BLOCKS or start + length > limit:
            return None
        (last,) = struct.unpack_from("<Q", buf, start + ch.FP_CHUNK_HEAD.size + 8 * (n - 1))
        spaces = [space_of_run[run_id]] if run_id in space_of_run else table_spaces
        tails = [last.to_bytes(8, "big")]
    elif kind == rec.KIND_TOMBSTONES:
        (entries,) = struct.unpack_from("<Q", buf, start + 24)
        length = ch.FP_CHUNK_HEAD.size + ch.TOMBSTONE.size * entries
        if entries < 1 or start + length > limit:
            return None
        (last,) = struct.unpack_from("<Q", buf, start + length - ch.TOMBSTONE.size)
        spaces, tails = [rec.SPACE_TOMBSTONES], [last.to_bytes(8, "big")]
    elif kind == rec.KIND_RECORDS:
        length, last_key = _record_chunk_extent(buf, start, limit)
        if length is None:
            return None
        spaces = [space_of_run[run_id]] if run_id in space_of_run else list(rec.RECORD_SPACES)
        tails = _separators(last_key)
    else:
        return None
    value = bytes(buf[start:start + length])
    for space in spaces:
        for tail in tails:
            key = prefix_of(space) + tail
            if _chunk_verifies(key, value):
                return key, value
    return None


def _record_chunk_extent(buf, start: int, limit: int):
    """(length, last record key) of a record chunk from its directory, or (None, None).

    Only the header's layout is used here (7.9: fence, directory, filter,
    then the sub-blocks back to back); the last sub-block is read through
    the chunk reader (its CRC checked, raw or zstd), and the header
    checksum under the rebuilt key decides afterwards.
    """
    head = ch.RECORD_CHUNK_HEAD
    if start + head.size > limit:
        return None, None
    _, _, _, n, _, _, dir_bytes, fence_len, filter_bytes = head.unpack_from(buf, start)
    pos = start + head.size + fence_len
    dir_end = pos + dir_bytes
    if n < 1 or dir_end + filter_bytes > limit:
        return None, None
    entry = None
    for _ in range(n):
        if pos + ch.DIR_ENTRY.size > dir_end:
            return None, None
        entry = ch.DIR_ENTRY.unpack_from(buf, pos)
        pos += ch.DIR_ENTRY.size + entry[4]
    off, clen, rlen = entry[:3]
    if start + off + clen > limit or rlen > 1 << 24:
        return None, None
    try:
        raw = ch.raw_block(b"", bytes(buf[start:start + off + clen]), entry)
        records = ch.unpack_records(raw)
    except CorruptionError:
        return None, None
    if not records:
        return None, None
    return off + clen, records[-1][0]


def _separators(last_key: bytes) -> list:
    """Every byte string a chunk whose last record key is last_key may be keyed by (7.9)."""
    out = [last_key]
    for n in range(len(last_key)):
        if last_key[n] < 0xFF:
            out.append(last_key[:n] + bytes([last_key[n] + 1]))
    return out
