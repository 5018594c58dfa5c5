"""Chunks: the values that hold a run's entries (FORMAT.md 7.6-7.8).

A run is a sorted sequence of entries of one *space* (a permuted table, the
tombstones, or a record space).  It is stored as chunks, one LMDB value each
of at most 16 pages, keyed by space, run id and the chunk's last entry (or,
for records, a separator no smaller than its last key), so the chunks tree
orders them.  Every chunk header names its run, carries the *low fence* (the
previous chunk's last entry) and a checksum over its key and header, so a
damaged tree page that routes a lookup to the wrong chunk is noticed.

Three chunk kinds:

- fingerprint chunks (KIND_HUFFMAN, KIND_RAW): up to 63 blocks of 1 KB, the
  key of each block in the header; Huffman-delta blocks are ndindex.codec's;
  raw blocks (small runs: cheap to merge and to probe) hold 127 plain
  values, or up to 1024 packed ones (offsets from the block's first value,
  format 4), binary-searchable in place;
- tombstone chunks (KIND_TOMBSTONES): (fingerprint, stamp) pairs;
- record chunks (KIND_RECORDS): records (key bytes, put/delete flag, value
  bytes) in zstd-compressed sub-blocks of about 4 KB, with a directory of
  each sub-block's first key.

Pure functions: no I/O.
"""

from __future__ import annotations

import dataclasses
import struct
import threading

import numpy as np
import zstandard

from ndindex import _core, codec
from ndindex.errors import CorruptionError
from ndindex.records import (CHUNK_PAGES, KIND_HUFFMAN, KIND_RAW, KIND_RECORDS, KIND_TOMBSTONES,
                             OVERFLOW_HEADER_BYTES, SPACE_FPS_BY_KEY, DB_CHUNKS)

BLOCK_BYTES = codec.BLOCK_BYTES
#: A chunk fills at most 16 LMDB pages of 4 KB: LMDB stores a value larger
#: than a page in its own run of overflow pages behind a 16-byte header.
CHUNK_MAX_BYTES = CHUNK_PAGES * 4096 - OVERFLOW_HEADER_BYTES
CHUNK_MAX_BLOCKS = 63
FP_CHUNK_HEAD = struct.Struct("<IBBHIIQQ")  # crc kind flags n_blocks run_id reserved low_fence entries
FLAG_FIRST = 1
FLAG_LAST = 2
#: Values of a plain raw block, and the most of a packed one (FORMAT.md 5.3).
RAW_BLOCK_VALUES = (BLOCK_BYTES - 8) // 8
RAW_BLOCK_MAX_VALUES = 1024
TOMBSTONE = struct.Struct("<QI")
TOMBSTONES_PER_CHUNK = (CHUNK_MAX_BYTES - FP_CHUNK_HEAD.size) // TOMBSTONE.size
RECORD_CHUNK_HEAD = struct.Struct("<IBBHIIIHH")  # crc kind flags n_blocks run_id records dir_bytes fence_len filter_bytes
DIR_ENTRY = struct.Struct("<IIIIH")  # offset comp_len raw_len crc first_key_len
RECORD_HEAD = struct.Struct("<HBI")  # key length, flag, value length
RECORD_PUT = 0
RECORD_DELETE = 1
#: Uncompressed bytes per record sub-block, and sub-blocks per chunk.
RECORD_BLOCK_BYTES = 4096
RECORD_CHUNK_BLOCKS = 48
#: Filter bits per record (a Bloom filter of 7 probes: about 0.8% false hits).
FILTER_BITS = 10
#: How a record space groups its keys for lookups and filters (FORMAT.md
#: 7.9): 1 = all but the last 8 bytes (a document key), 0 = the first 8.
GROUP_MODES = {SPACE_FPS_BY_KEY: 1}
#: LMDB keys are at most 511 bytes: 1 space + 4 run id + the separator.
MAX_SEPARATOR_BYTES = 506
ZSTD_LEVEL = 3


def run_prefix(space: int, run_id: int) -> bytes:
    return bytes([space]) + run_id.to_bytes(4, "big")


def fp_chunk_key(space: int, run_id: int, last: int) -> bytes:
    return run_prefix(space, run_id) + int(last).to_bytes(8, "big")


def _bad(why: str, key: bytes | None = None, offset: int | None = None) -> CorruptionError:
    return CorruptionError(why, database=DB_CHUNKS, key=key, offset=offset)


# -- fingerprint chunks (7.6) ----------------------------------------------------


def encode_raw(values: np.ndarray, packed: bool = False) -> codec.EncodedTable:
    """Encode sorted distinct values as raw blocks (C kernel): plain ones of up
    to RAW_BLOCK_VALUES, or, packed (files of format 4), packed ones wherever
    they hold more."""
    values = np.ascontiguousarray(values, dtype=np.uint64)
    cap = len(values) // RAW_BLOCK_VALUES + 1
    blocks = np.empty(cap * BLOCK_BYTES, dtype=np.uint8)
    keys = np.empty(cap, dtype=np.uint64)
    nb = _core.raw_encode(values, blocks, keys, packed)
    return codec.EncodedTable(blocks[:nb * BLOCK_BYTES], keys[:nb])


def decode_raw(blocks, key: bytes | None = None) -> np.ndarray:
    """Decode raw blocks, checking checksums, counts, order and padding."""
    buf = np.frombuffer(blocks, dtype=np.uint8)
    out = np.empty(len(buf) // BLOCK_BYTES * RAW_BLOCK_MAX_VALUES, dtype=np.uint64)
    try:
        n = _core.raw_decode(buf, out)
    except CorruptionError as exc:
        raise _bad(f"raw {str(exc).rsplit(' (database=', 1)[0]}", key) from exc
    return out[:n]


def encode_values(values: np.ndarray, kind: int, code: codec.HuffmanCode | None,
                  packed: bool = False):
    """Blocks for sorted distinct values: Huffman-delta (with code) or raw
    (packed where they hold more, if packed)."""
    if kind == KIND_HUFFMAN:
        return codec.encode(values, code)
    return encode_raw(values, packed)


def pack_fp_chunks(space: int, run_id: int, kind: int, enc: codec.EncodedTable, counts,
                   low_fence: int | None, is_last: bool) -> list[tuple[bytes, bytes]]:
    """Cut encoded blocks into chunks of at most 63 blocks; return (key, value) pairs.

    low_fence: the last value of the run's previous chunk, or None when these
    are the run's first chunks.  is_last marks the final chunk as the run's
    last.  counts: entries per block.
    """
    out = []
    nb = enc.n_blocks
    blocks = enc.blocks.reshape(nb, BLOCK_BYTES) if nb else enc.blocks
    counts = np.asarray(counts, dtype=np.int64)
    n_chunks = -(-nb // CHUNK_MAX_BLOCKS)
    bounds = np.linspace(0, nb, n_chunks + 1).round().astype(np.int64) if n_chunks else []
    for c, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        keys = enc.keys[a:b]
        last = int(keys[-1])
        flags = (FLAG_FIRST if c == 0 and low_fence is None else 0) | \
            (FLAG_LAST if is_last and c == n_chunks - 1 else 0)
        head = FP_CHUNK_HEAD.pack(0, kind, flags, b - a, run_id, 0,
                                  0 if low_fence is None else low_fence, int(counts[a:b].sum()))
        body = head[4:] + keys.astype("<u8").tobytes()
        key = fp_chunk_key(space, run_id, last)
        crc = _core.crc32c(key + body)
        # One copy of the blocks (join reads the array's buffer), where
        # tobytes() and + made two: a sixth of the GIL's time in a stream.
        out.append((key, b"".join((struct.pack("<I", crc), body, blocks[a:b]))))
        low_fence = last
    return out


def marked_last(key: bytes, value) -> bytes:
    """A fingerprint or record chunk's value with FLAG_LAST set, its header checksum
    redone: for a merge whose final step has nothing left to write (every
    remaining value removed), the chunk written last becomes the run's last."""
    v = bytearray(value)
    if v[4] == KIND_RECORDS:
        _, _, _, _, _, _, dir_bytes, fence_len, filt = RECORD_CHUNK_HEAD.unpack_from(v)
        head = RECORD_CHUNK_HEAD.size + fence_len + dir_bytes + filt
    else:
        head = FP_CHUNK_HEAD.size + 8 * FP_CHUNK_HEAD.unpack_from(v)[3]
    v[5] |= FLAG_LAST
    struct.pack_into("<I", v, 0, _core.crc32c(key + bytes(v[4:head])))
    return bytes(v)


def block_entry_counts(enc: codec.EncodedTable, kind: int) -> np.ndarray:
    """Entries per block of freshly encoded blocks."""
    if kind == KIND_HUFFMAN:
        return codec.block_counts(enc.blocks).astype(np.int64)
    return np.frombuffer(enc.blocks.reshape(-1, BLOCK_BYTES)[:, 4:6].tobytes(), "<u2").astype(np.int64)


@dataclasses.dataclass
class FpChunk:
    """A checked fingerprint chunk (the blocks are checked when decoded)."""

    key: bytes
    kind: int
    flags: int
    run_id: int
    low_fence: int
    entries: int
    block_keys: np.ndarray
    blocks: memoryview

    @property
    def last(self) -> int:
        return int.from_bytes(self.key[5:13], "big")

    def decode(self, code: codec.HuffmanCode | None) -> np.ndarray:
        """Every value of the chunk; CorruptionError naming the chunk if a block is bad."""
        try:
            vals = codec.decode(self.blocks, code) if self.kind == KIND_HUFFMAN \
                else decode_raw(self.blocks, self.key)
        except CorruptionError as exc:
            reason = str(exc).rsplit(" (database=", 1)[0]
            raise _bad(f"chunk block: {reason}", self.key) from exc
        n = len(self.block_keys)
        if len(vals) != self.entries:
            raise _bad(f"chunk holds {len(vals)} values, its header says {self.entries}", self.key)
        if len(vals) and (int(vals[-1]) != self.last or
                          (not self.flags & FLAG_FIRST and int(vals[0]) <= self.low_fence)):
            raise _bad("chunk values disagree with its key or fence", self.key)
        if self.kind == KIND_HUFFMAN:
            ends = np.cumsum(codec.block_counts(self.blocks).astype(np.int64)) - 1
        else:
            ends = np.cumsum(np.frombuffer(bytes(self.blocks), np.uint8).reshape(n, BLOCK_BYTES)[:, 4:6]
                             .copy().view("<u2").reshape(-1).astype(np.int64)) - 1
        if not np.array_equal(vals[ends], self.block_keys):
            raise _bad("a block key differs from its block's last value", self.key)
        return vals


def unpack_fp_chunk(key: bytes, value) -> FpChunk:
    """Check a fingerprint chunk's header against its key (as the C kernel does)."""
    mv = memoryview(value)
    if len(key) != 13:
        raise _bad(f"fingerprint chunk key of {len(key)} bytes", key)
    if len(mv) < FP_CHUNK_HEAD.size:
        raise _bad("chunk shorter than its header", key)
    crc, kind, flags, n, run_id, reserved, low, entries = FP_CHUNK_HEAD.unpack_from(mv)
    if kind not in (KIND_HUFFMAN, KIND_RAW):
        raise _bad(f"chunk kind {kind} is not a fingerprint kind", key)
    if not 1 <= n <= CHUNK_MAX_BLOCKS:
        raise _bad(f"chunk claims {n} blocks", key, 6)
    head = FP_CHUNK_HEAD.size + 8 * n
    if len(mv) != head + n * BLOCK_BYTES:
        raise _bad(f"chunk is {len(mv)} bytes, its header implies {head + n * BLOCK_BYTES}", key)
    if _core.crc32c(key + bytes(mv[4:head])) != crc:
        raise _bad("chunk header checksum mismatch", key)
    if flags & ~(FLAG_FIRST | FLAG_LAST) or reserved:
        raise _bad("chunk reserved bits set", key)
    if run_id != int.from_bytes(key[1:5], "big"):
        raise _bad(f"chunk names run {run_id}, its key another", key)
    block_keys = np.frombuffer(mv[FP_CHUNK_HEAD.size:head], "<u8").astype(np.uint64)
    if n > 1 and not np.all(block_keys[1:] > block_keys[:-1]):
        raise _bad("chunk block keys do not increase", key)
    if int(block_keys[-1]) != int.from_bytes(key[5:13], "big"):
        raise _bad("chunk's last block key differs from its key", key)
    if not flags & FLAG_FIRST and low >= int(block_keys[0]):
        raise _bad("chunk's low fence is not below its first block", key)
    return FpChunk(key, kind, flags, run_id, low, entries, block_keys, mv[head:])


# -- tombstone chunks (7.7) ------------------------------------------------------


def pack_tombstone_chunks(space: int, run_id: int, fps: np.ndarray, stamps: np.ndarray):
    """Chunks of (fingerprint, stamp) pairs, fps sorted and distinct."""
    out = []
    n = len(fps)
    low = None
    pairs = np.empty(n, dtype=[("fp", "<u8"), ("stamp", "<u4")])
    pairs["fp"] = fps
    pairs["stamp"] = stamps
    for a in range(0, n, TOMBSTONES_PER_CHUNK):
        b = min(n, a + TOMBSTONES_PER_CHUNK)
        last = int(fps[b - 1])
        flags = (FLAG_FIRST if a == 0 else 0) | (FLAG_LAST if b == n else 0)
        key = fp_chunk_key(space, run_id, last)
        body = FP_CHUNK_HEAD.pack(0, KIND_TOMBSTONES, flags, 0, run_id, 0,
                                  0 if low is None else low, b - a)[4:] + pairs[a:b].tobytes()
        out.append((key, struct.pack("<I", _core.crc32c(key + body)) + body))
        low = last
    return out


def unpack_tombstone_chunk(key: bytes, value, low_expected: int | None,
                           repeats: bool = False):
    """(fps, stamps, is_last) of a tombstone chunk, checked; low_expected: previous chunk's last.

    repeats: accept a fingerprint repeated in a row (what compactions before
    the fix in compaction._newest_tombstones wrote; recover takes them in).
    """
    raw = bytes(value)
    if len(key) != 13 or len(raw) < FP_CHUNK_HEAD.size:
        raise _bad("tombstone chunk too short", key)
    crc, kind, flags, n_blocks, run_id, reserved, low, entries = FP_CHUNK_HEAD.unpack_from(raw)
    if _core.crc32c(key + raw[4:]) != crc:
        raise _bad("tombstone chunk checksum mismatch", key)
    if kind != KIND_TOMBSTONES or n_blocks or reserved or flags & ~3 or \
            len(raw) != FP_CHUNK_HEAD.size + TOMBSTONE.size * entries or entries < 1:
        raise _bad("tombstone chunk header impossible", key)
    if (low_expected is None) != bool(flags & FLAG_FIRST) or \
            (low_expected is not None and low != low_expected):
        raise _bad("tombstone chunk fences do not match its neighbours", key)
    pairs = np.frombuffer(raw, dtype=[("fp", "<u8"), ("stamp", "<u4")], count=entries,
                          offset=FP_CHUNK_HEAD.size)
    fps = pairs["fp"].astype(np.uint64)
    increasing = fps[1:] >= fps[:-1] if repeats else fps[1:] > fps[:-1]
    if (len(fps) > 1 and not np.all(increasing)) or int(fps[-1]) != \
            int.from_bytes(key[5:], "big") or (low_expected is not None and int(fps[0]) <= low):
        raise _bad("tombstone chunk values out of order", key)
    return fps, pairs["stamp"].astype(np.uint32), bool(flags & FLAG_LAST)


# -- record chunks (7.8) ---------------------------------------------------------

# zstandard's (de)compressor objects must not be shared between threads.
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c = getattr(_local, "compressor", None)
    if c is None:
        c = _local.compressor = zstandard.ZstdCompressor(
            level=ZSTD_LEVEL, write_checksum=False, write_content_size=False, write_dict_id=False)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "decompressor", None)
    if d is None:
        d = _local.decompressor = zstandard.ZstdDecompressor()
    return d


def pack_records(records) -> bytes:
    """Serialise (key, flag, value) records, in order: a raw record stream (C)."""
    return _core.records_pack(records)


def unpack_records(raw, key: bytes | None = None) -> list:
    """The (key, flag, value) records of a raw stream, checked (C)."""
    try:
        return _core.records_unpack(raw)
    except CorruptionError as exc:
        raise _bad(str(exc.args[0]) if exc.args else "bad record block", key) from None


def separator(a: bytes, b: bytes) -> bytes:
    """The shortest byte string s with a <= s < b (LevelDB's FindShortestSeparator)."""
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    if n < len(a) and n < len(b) and a[n] + 1 < b[n]:
        return a[:n] + bytes([a[n] + 1])
    return a


def filter_bytes_for(records: int) -> int:
    """Bytes of a chunk's group filter: FILTER_BITS per record, 8..65535."""
    return max(8, min(0xFFFF, (records * FILTER_BITS + 7) // 8))


def pack_record_chunks(space: int, run_id: int, records: list, low_fence: bytes | None,
                       is_last: bool, next_first: bytes | None = None) -> list:
    """Cut sorted records (distinct keys) into record chunks; return (key, value) pairs."""
    return pack_record_stream(space, run_id, _core.records_pack(records), low_fence, is_last,
                              next_first)


def pack_record_stream(space: int, run_id: int, raw: bytes, low_fence: bytes | None,
                       is_last: bool, next_first: bytes | None = None) -> list:
    """Cut a raw record stream (sorted, distinct keys) into record chunks.

    low_fence: the previous chunk's separator (None for the run's first
    chunk).  next_first: the first key after these records, if the run goes
    on (separators stay below it).  Sub-blocks are zstd frames, or stored as
    they are when compression does not make them smaller.
    """
    blocks = _core.records_split(raw, RECORD_BLOCK_BYTES)
    mode = GROUP_MODES.get(space, 0)
    mv = memoryview(raw)
    out = []
    groups = [blocks[i:i + RECORD_CHUNK_BLOCKS] for i in range(0, len(blocks), RECORD_CHUNK_BLOCKS)]
    for g, group in enumerate(groups):
        last_key = group[-1][3]
        following = groups[g + 1][0][2] if g + 1 < len(groups) else next_first
        sep = last_key if following is None else separator(last_key, following)
        if len(sep) > MAX_SEPARATOR_BYTES:
            raise ValueError("record keys too long for a chunk separator")
        key = run_prefix(space, run_id) + sep
        flags = (FLAG_FIRST if low_fence is None else 0) | \
            (FLAG_LAST if is_last and g == len(groups) - 1 else 0)
        fence = b"" if low_fence is None else low_fence
        stored = []
        for start, end, _, _, _ in group:
            plain = mv[start:end]
            packed = _compressor().compress(plain)
            stored.append(packed if len(packed) < len(plain) else bytes(plain))
        count = sum(b[4] for b in group)
        filt = _core.record_filter(mv[group[0][0]:group[-1][1]], mode, filter_bytes_for(count))
        dir_bytes = sum(DIR_ENTRY.size + len(b[2]) for b in group)
        offset = RECORD_CHUNK_HEAD.size + len(fence) + dir_bytes + len(filt)
        directory = []
        for (start, end, first, _, _), data in zip(group, stored):
            directory.append(DIR_ENTRY.pack(offset, len(data), end - start, _core.crc32c(data),
                                            len(first)) + first)
            offset += len(data)
        head = RECORD_CHUNK_HEAD.pack(0, KIND_RECORDS, flags, len(group), run_id, count,
                                      dir_bytes, len(fence), len(filt))
        body = head[4:] + fence + b"".join(directory) + filt
        crc = _core.crc32c(key + body)
        out.append((key, struct.pack("<I", crc) + body + b"".join(stored)))
        low_fence = sep
    return out


@dataclasses.dataclass
class RecordChunk:
    """A checked record chunk; sub-blocks are checked as they are read."""

    key: bytes
    flags: int
    records: int
    low_fence: bytes | None
    blocks: list  # (offset, stored_len, raw_len, crc, first_key)
    value: memoryview

    @property
    def separator(self) -> bytes:
        return self.key[5:]

    @property
    def first_keys(self) -> list:
        return [b[4] for b in self.blocks]

    def raw_block(self, i: int):
        """Sub-block i's raw records, its checksum and first key checked (and decompressed)."""
        raw = raw_block(self.key, self.value, self.blocks[i])
        first = self.blocks[i][4]
        if bytes(raw[RECORD_HEAD.size:RECORD_HEAD.size + len(first)]) != first or \
                int.from_bytes(raw[:2], "little") != len(first):
            raise _bad(f"record sub-block {i}: first key differs from the directory", self.key)
        return raw

    def block(self, i: int) -> list:
        """The records of sub-block i."""
        return _core_records(self.key, self.raw_block(i), b"", self.blocks[i][4])

    def all_records(self) -> list:
        """Every record, checked for order against the chunk's fences."""
        out = []
        for i in range(len(self.blocks)):
            out.extend(self.block(i))
        if len(out) != self.records:
            raise _bad(f"chunk holds {len(out)} records, its header says {self.records}", self.key)
        keys = [r[0] for r in out]
        if any(a >= b for a, b in zip(keys, keys[1:])):
            raise _bad("record keys do not increase", self.key)
        if keys and (keys[-1] > self.separator or
                     (self.low_fence is not None and keys[0] <= self.low_fence)):
            raise _bad("record keys lie outside the chunk's fences", self.key)
        return out


def raw_block(key: bytes, value, entry):
    """The raw records of one sub-block of a record chunk (entry from its directory)."""
    off, clen, rlen, crc, _ = entry
    data = value[off:off + clen]
    if _core.crc32c(data) != crc:
        raise _bad("record sub-block checksum mismatch", key)
    if clen == rlen:
        return data
    try:
        return zstd_exact(data, rlen)
    except ValueError as exc:
        raise _bad(f"record sub-block: {exc}", key) from None


def zstd_exact(data, size: int, decompressor=None) -> bytes:
    """Decompress one zstd frame that must hold exactly size bytes.

    The frame header's own content size is checked before anything is
    allocated: a damaged header can claim petabytes, which decompress()
    would try to allocate (MemoryError; found by fuzz/record_chunk.py).
    Raises ValueError saying what is wrong.
    """
    try:
        claimed = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise ValueError(f"not a zstd frame ({exc})") from None
    if claimed not in (-1, size):
        raise ValueError(f"zstd frame claims {claimed} bytes, expected {size}")
    try:
        raw = (decompressor or _decompressor()).decompress(data, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise ValueError(f"zstd frame does not decode ({exc})") from None
    if len(raw) != size:
        raise ValueError(f"zstd frame holds {len(raw)} bytes, expected {size}")
    return raw


def _core_records(key: bytes, raw, prefix: bytes, first: bytes) -> list:
    try:
        return _core.records_find(raw, prefix, first)
    except CorruptionError as exc:
        raise _bad(str(exc.args[0]) if exc.args else "bad record block", key) from None


def find_records(key: bytes, value, entry, prefix: bytes, last: list | None = None) -> list:
    """The records of one sub-block whose key begins with prefix.

    last, a list [tag, raw] the caller keeps across calls, holds the last
    sub-block read: lookups in key order then check and decompress each
    sub-block once, not once a lookup.
    """
    if last is None:
        return _core_records(key, raw_block(key, value, entry), prefix, entry[4])
    tag = (key, entry[0])
    if last[0] != tag:
        last[:] = [tag, raw_block(key, value, entry)]
    return _core_records(key, last[1], prefix, entry[4])


def unpack_record_chunk(key: bytes, value, group: bytes | None = None):
    """Check a record chunk's header, directory and filter against its key (C).

    Returns a RecordChunk; with a group, only the sub-blocks that may hold
    keys beginning with it (none when the filter rules the group out).
    """
    flags, records, fence, blocks, _ = _core.record_chunk(key, value, group)
    return RecordChunk(key, flags, records, fence, blocks, memoryview(value))
