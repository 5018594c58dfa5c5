"""Permuted tables as LMDB segments: layout, reading, merging and writing.

A table is a sorted run of permuted fingerprints cut into 1024-byte blocks
(ndindex.codec).  Blocks are stored in *segments* of up to
``SEGMENT_MAX_BLOCKS`` blocks, one LMDB value each, keyed by table number
and the segment's last value (FORMAT.md 7.4).  Why segments: LMDB stores a
value larger than a page in its own run of overflow pages with one 16-byte
header, so 63 blocks plus a 512-byte header fill 16 pages almost exactly
(0.76% slack), whereas one block per value would waste a quarter of every
page.  The segment header lists the key of every block in it, so the key
directory is two-level: LMDB's B-tree over segments, then the header.

Compaction rewrites only the blocks whose key range receives or loses
entries; untouched blocks are copied as bytes.  The unit LMDB rewrites is
the segment value, so a segment with one changed block is written whole.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from ndindex import _core, codec
from ndindex.arrays import merge_sorted
from ndindex.errors import CorruptionError
from ndindex.store import DB_SEGMENTS, U64_BE, Store, segment_key

SEGMENT_MAX_BLOCKS = 63
SEGMENT_HEADER_BYTES = 512
SEGMENT_HEAD = struct.Struct("<IHH")  # checksum, n_blocks, reserved
BLOCK_BYTES = codec.BLOCK_BYTES


def pack_segment(keys: np.ndarray, blocks: np.ndarray) -> bytes:
    """Return a segment value: header with block keys, then the blocks (FORMAT.md 7.4)."""
    n = len(keys)
    if not 1 <= n <= SEGMENT_MAX_BLOCKS:
        raise ValueError(f"a segment holds 1..{SEGMENT_MAX_BLOCKS} blocks, got {n}")
    header = bytearray(SEGMENT_HEADER_BYTES)
    struct.pack_into("<HH", header, 4, n, 0)
    header[8:8 + 8 * n] = keys.astype("<u8").tobytes()
    struct.pack_into("<I", header, 0, _core.crc32c(bytes(header[4:])))
    return bytes(header) + blocks.tobytes()


def unpack_segment_header(value, key: bytes) -> np.ndarray:
    """Check a segment's header and return its block keys (uint64)."""
    mv = memoryview(value)
    if len(mv) < SEGMENT_HEADER_BYTES + BLOCK_BYTES:
        raise CorruptionError(f"segment of {len(mv)} bytes is too short", database="segments", key=key)
    stored, n, reserved = SEGMENT_HEAD.unpack_from(mv, 0)
    if _core.crc32c(mv[4:SEGMENT_HEADER_BYTES]) != stored:
        raise CorruptionError("segment header checksum mismatch", database="segments", key=key)
    if not 1 <= n <= SEGMENT_MAX_BLOCKS or reserved != 0:
        raise CorruptionError(f"segment header claims {n} blocks", database="segments", key=key,
                              offset=4)
    if len(mv) != SEGMENT_HEADER_BYTES + n * BLOCK_BYTES:
        raise CorruptionError(f"segment is {len(mv)} bytes, its header implies "
                              f"{SEGMENT_HEADER_BYTES + n * BLOCK_BYTES}", database="segments", key=key)
    keys = np.frombuffer(mv[8:8 + 8 * n], dtype="<u8").astype(np.uint64)
    if n > 1 and not np.all(keys[1:] > keys[:-1]):
        raise CorruptionError("segment block keys do not increase", database="segments", key=key)
    if U64_BE.unpack(key[1:9])[0] != int(keys[-1]):
        raise CorruptionError("segment key differs from its last block key", database="segments", key=key)
    return keys


@dataclasses.dataclass
class TableView:
    """The directory of one table in one transaction: every block's key and address.

    ``segments`` lists (lmdb key, first block index, block count) in order;
    ``values`` keeps the segment buffers (memoryviews into the map) alive.
    """

    keys: np.ndarray
    addresses: np.ndarray
    segments: list
    values: list
    decoded: np.ndarray | None = None  # the whole table, when the index preloads
    offsets: np.ndarray | None = None  # where each block starts in decoded, plus the end

    def preload(self, code: codec.HuffmanCode) -> None:
        """Decode the whole table into memory (``decoded`` and ``offsets``)."""
        if self.decoded is None:
            self.decoded = decode_table(self, code)
            counts = np.concatenate([codec.block_counts(self.segment_blocks(i))
                                     for i in range(len(self.segments))]) if self.segments \
                else np.empty(0, np.uint16)
            self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.uint64)]).astype(np.uint64)

    @property
    def n_blocks(self) -> int:
        return len(self.keys)

    def segment_blocks(self, i: int) -> memoryview:
        """The blocks of segment i as one buffer."""
        _, _, n = self.segments[i]
        return memoryview(self.values[i])[SEGMENT_HEADER_BYTES:SEGMENT_HEADER_BYTES + n * BLOCK_BYTES]


def read_table(store: Store, txn, table: int) -> TableView:
    """Read the directory of a table from a transaction opened with buffers=True.

    Cost: one cursor step and one header check per segment; blocks are not
    touched (they are read in place by the query kernel).
    """
    prefix = bytes([table])
    keys, segments, values = [], [], []
    first = 0
    cur = txn.cursor(db=store.dbs[DB_SEGMENTS])
    try:
        if cur.set_range(prefix):
            for k, v in cur:
                k = bytes(k)
                if k[:1] != prefix:
                    break
                if len(k) != 9:
                    raise CorruptionError(f"segment key of {len(k)} bytes", database="segments", key=k)
                block_keys = unpack_segment_header(v, k)
                if keys and block_keys[0] <= keys[-1][-1]:
                    raise CorruptionError("segments overlap", database="segments", key=k)
                keys.append(block_keys)
                segments.append((k, first, len(block_keys)))
                values.append(v)
                first += len(block_keys)
    finally:
        cur.close()
    all_keys = np.concatenate(keys) if keys else np.empty(0, np.uint64)
    addresses = np.empty(len(all_keys), dtype=np.uint64)
    for (_, start, n), v in zip(segments, values):
        _core.block_addresses(v, SEGMENT_HEADER_BYTES, n, addresses, start)
    return TableView(all_keys, addresses, segments, values)


def decode_table(view: TableView, code: codec.HuffmanCode) -> np.ndarray:
    """Decode every block of a table, in order (verifying checksums).

    Raises CorruptionError naming the segment (database, key, and offset
    inside its value) of the first bad block.
    """
    parts = []
    for i, (key, _, _) in enumerate(view.segments):
        try:
            parts.append(codec.decode(view.segment_blocks(i), code))
        except CorruptionError as exc:
            # The codec knows only the block's place in the buffer it was given.
            reason = str(exc).rsplit(" (database=", 1)[0]
            offset = None if exc.offset is None else SEGMENT_HEADER_BYTES + exc.offset
            raise CorruptionError(reason, database="segments", key=key, offset=offset) from exc
    return np.concatenate(parts) if parts else np.empty(0, np.uint64)


def write_blocks(txn, store: Store, table: int, keys: np.ndarray, blocks: np.ndarray) -> int:
    """Write blocks as segments of at most SEGMENT_MAX_BLOCKS; return segments written.

    Blocks are spread evenly over the fewest segments that hold them, so a
    later insert into any segment has room to split without cascading.
    """
    n = len(keys)
    if n == 0:
        return 0
    n_seg = -(-n // SEGMENT_MAX_BLOCKS)
    bounds = np.linspace(0, n, n_seg + 1).round().astype(np.int64)
    db = store.dbs[DB_SEGMENTS]
    blocks = blocks.reshape(n, BLOCK_BYTES)
    for a, b in zip(bounds[:-1], bounds[1:]):
        txn.put(segment_key(table, int(keys[b - 1])), pack_segment(keys[a:b], blocks[a:b]), db=db)
    return n_seg


def delete_table(txn, store: Store, table: int) -> None:
    """Delete every segment of a table."""
    prefix = bytes([table])
    cur = txn.cursor(db=store.dbs[DB_SEGMENTS])
    try:
        if cur.set_range(prefix):
            while cur.key()[:1] == prefix:
                if not cur.delete():
                    break
    finally:
        cur.close()


def rewrite_incremental(txn, store: Store, table: int, view: TableView, code: codec.HuffmanCode,
                        new: np.ndarray, gone: np.ndarray) -> tuple[int, int]:
    """Merge sorted permuted values into a table, rewriting only the affected blocks.

    new: values to insert; gone: values to delete (either may hold values
    the table does not have).  Returns (blocks rewritten, entry delta).
    """
    nb = view.n_blocks
    # A value belongs to the first block whose key is >= it; values past the
    # last key join the last block.
    def block_of(v):
        return np.minimum(np.searchsorted(view.keys, v, side="left"), nb - 1)

    new_at, gone_at = block_of(new), block_of(gone)
    affected = np.union1d(new_at, gone_at)
    rewritten, delta = 0, 0
    db = store.dbs[DB_SEGMENTS]
    for si, (skey, first, n) in enumerate(view.segments):
        lo, hi = np.searchsorted(affected, [first, first + n])
        if lo == hi:
            continue
        seg_blocks = np.frombuffer(view.segment_blocks(si), dtype=np.uint8).reshape(n, BLOCK_BYTES)
        out_keys, out_blocks = [], []
        touched = set(int(b) - first for b in affected[lo:hi])
        for j in range(n):
            if j not in touched:
                out_keys.append(view.keys[first + j:first + j + 1])
                out_blocks.append(seg_blocks[j:j + 1])
                continue
            b = first + j
            old = codec.decode(seg_blocks[j], code)
            # new and gone are sorted, so their block numbers are too: a
            # block's values are one slice, found in O(log n).
            ins = new[np.searchsorted(new_at, b):np.searchsorted(new_at, b, side="right")]
            rem = gone[np.searchsorted(gone_at, b):np.searchsorted(gone_at, b, side="right")]
            merged = merge_sorted(old, ins, rem)
            delta += len(merged) - len(old)
            rewritten += 1
            if len(merged):
                enc = codec.encode(merged, code)
                out_keys.append(enc.keys)
                out_blocks.append(enc.blocks.reshape(-1, BLOCK_BYTES))
        txn.delete(skey, db=db)
        if out_keys:
            write_blocks(txn, store, table, np.concatenate(out_keys),
                         np.concatenate(out_blocks).reshape(-1))
    return rewritten, delta
