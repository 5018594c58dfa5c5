"""Fingerprint files: chunked, zstd-compressed, checksummed streams of fingerprints.

The container the batch join reads its stored side F from and writes its
pairs to, specified normatively in ``format-spec/fpfile.md`` (statements
[FF1]...).  A file is a 16-byte header, then chunks, each a 16-byte chunk
header and a zstd frame holding one column per field, then a footer listing
every chunk's offset and the total count, then a 16-byte trailer pointing
at the footer.  So a file can be read as a stream (chunk after chunk, the
footer's totals confirming that nothing was lost) or by chunk number (a
worker seeks straight to its share), and truncation anywhere is detected:
the trailer is the last thing written.

Columns of 64-bit values are stored as deltas of neighbours (modulo 2^64)
split into 8 byte planes before zstd.  Sorted fingerprints then put long
runs of zeros in the high planes: a chunk of 1M fingerprints from a sorted
set of 100M costs about 5 bytes each instead of 8, and zstd alone on the raw
little-endian words saves almost nothing.

Two kinds share the container: ``KIND_FINGERPRINTS`` (fingerprints and
optional byte-string keys) and ``KIND_PAIRS`` (the batch join's output: q,
f, distance).  Writers write to ``<path>.tmp`` and rename on close, so a
crashed writer never leaves a half file under the final name.
"""

from __future__ import annotations

import contextlib
import os
import struct
import weakref

import numpy as np
import zstandard

from ndindex import _core, store, validate
from ndindex.chunks import zstd_exact
from ndindex.errors import CorruptionError, FormatError

MAGIC = b"\x89NDFP\r\n\x1a"
END_MAGIC = b"NDFPEND\n"
VERSION = 1
KIND_FINGERPRINTS = 0
KIND_PAIRS = 1
KIND_NAMES = {KIND_FINGERPRINTS: "fingerprints", KIND_PAIRS: "pairs"}
FLAG_KEYS = 0x0001
HEADER = struct.Struct("<8sBBHI")        # magic, version, kind, flags, crc32c of bytes 0..11
CHUNK_HEAD = struct.Struct("<IIII")      # crc32c, count, raw bytes, stored bytes
FOOTER_HEAD = struct.Struct("<IIIIQ")    # crc32c, 0, chunks, reserved 0, total count
TRAILER = struct.Struct("<Q8s")          # footer offset, END_MAGIC
#: Largest count in one chunk (keeps a chunk's columns well under 2^32 bytes).
MAX_CHUNK_COUNT = 1 << 24
DEFAULT_CHUNK_COUNT = 1 << 20
DEFAULT_ZSTD_LEVEL = 3
PAIR_DTYPE = np.dtype([("q", np.uint64), ("f", np.uint64), ("distance", np.uint8)])
_DATABASE = "fpfile"


# -- columns -------------------------------------------------------------------


def _pack_u64(values: np.ndarray) -> bytes:
    """Delta (mod 2^64) then byte planes, least significant plane first ([FF9])."""
    v = np.ascontiguousarray(values, dtype="<u8")
    delta = np.empty_like(v)
    if len(v):
        delta[0] = v[0]
        np.subtract(v[1:], v[:-1], out=delta[1:])
    return delta.view(np.uint8).reshape(-1, 8).T.tobytes()


def _unpack_u64(raw: memoryview, count: int) -> np.ndarray:
    planes = np.frombuffer(raw, dtype=np.uint8, count=8 * count).reshape(8, count)
    delta = np.ascontiguousarray(planes.T).view("<u8").reshape(-1)
    return np.cumsum(delta, dtype=np.uint64)   # wraps modulo 2^64, undoing the deltas


def _pack_keys(keys) -> bytes:
    raws = [_key_bytes(key) for key in keys]
    lengths = np.array([len(r) for r in raws], dtype="<u4")
    return lengths.tobytes() + b"".join(raws)


def _key_bytes(key) -> bytes:
    if key is None:
        return b""
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"keys must be str, bytes or None, got {type(key).__name__}")


# -- writing -------------------------------------------------------------------


class FingerprintWriter:
    """Write a fingerprint file (or a pair file) chunk by chunk.

    Use as a context manager; the file appears under ``path`` only when it
    is closed without an exception.  Until then it is written under a hidden
    name beside it, deleted if the block fails, close() fails (a full disk)
    or the writer is dropped unclosed; a killed process leaves only that.
    Parameters: path; kind, KIND_FINGERPRINTS or KIND_PAIRS; keys, whether
    fingerprints carry keys (bytes; str is stored as UTF-8, None as empty);
    chunk_size, entries per chunk (1..2^24); level, the zstd level.  Raises
    FileExistsError if path exists.  Memory: one chunk.
    """

    def __init__(self, path, *, kind: int = KIND_FINGERPRINTS, keys: bool = False,
                 chunk_size: int = DEFAULT_CHUNK_COUNT, level: int = DEFAULT_ZSTD_LEVEL):
        if kind not in KIND_NAMES:
            raise ValueError(f"kind must be one of {sorted(KIND_NAMES)}, got {kind}")
        if keys and kind != KIND_FINGERPRINTS:
            raise ValueError("only fingerprint files carry keys")
        if not 1 <= chunk_size <= MAX_CHUNK_COUNT:
            raise ValueError(f"chunk_size must be in 1..{MAX_CHUNK_COUNT}, got {chunk_size}")
        self.path = os.fsdecode(path)
        if os.path.exists(self.path):
            raise FileExistsError(f"{self.path}: already exists")
        self.kind, self.keys, self.chunk_size = kind, bool(keys), int(chunk_size)
        self._tmp = store.aside_name(self.path, "writing")
        self._file = open(self._tmp, "xb")
        self._discard = weakref.finalize(self, _discard, self._file, self._tmp)
        self._zstd = zstandard.ZstdCompressor(level=level)
        self._pending: list = []
        self._pending_n = 0
        self._offsets: list[int] = []
        self.count = 0
        head = HEADER.pack(MAGIC, VERSION, kind, FLAG_KEYS if self.keys else 0, 0)[:12]
        self._file.write(head + struct.pack("<I", _core.crc32c(head)))

    def write(self, fingerprints, keys=None) -> None:
        """Append fingerprints (a uint64 array) and, for a keyed file, one key each."""
        if self.kind != KIND_FINGERPRINTS:
            raise TypeError("this is a pair file: use write_pairs()")
        # validate, as Index.add: a cast wrapped -1 to 2^64 - 1 and cut 1.7 to 1.
        fps = validate.fingerprints(fingerprints)
        if self.keys != (keys is not None):
            raise ValueError("a keyed file needs one key per fingerprint" if self.keys
                             else "this file was opened without keys")
        if keys is not None:
            keys = list(keys)
            if len(keys) != len(fps):
                raise ValueError(f"got {len(keys)} keys for {len(fps)} fingerprints")
        self._add((fps, keys), len(fps))

    def write_pairs(self, pairs: np.ndarray) -> None:
        """Append pairs: a structured array with fields q, f, distance (PAIR_DTYPE)."""
        if self.kind != KIND_PAIRS:
            raise TypeError("this is a fingerprint file: use write()")
        pairs = np.asarray(pairs)
        if pairs.dtype.names is None or not set(PAIR_DTYPE.names) <= set(pairs.dtype.names):
            # A plain array would cast into every field of each pair.
            raise TypeError(f"pairs must be a structured array with fields q, f, distance "
                            f"(fpfile.PAIR_DTYPE), got dtype {pairs.dtype}")
        if pairs.dtype != PAIR_DTYPE:
            pairs = pairs[list(PAIR_DTYPE.names)].astype(PAIR_DTYPE)
        pairs = pairs.reshape(-1)
        self._add(pairs, len(pairs))

    def _add(self, item, n: int) -> None:
        self._pending.append(item)
        self._pending_n += n
        while self._pending_n >= self.chunk_size:
            self._flush(self.chunk_size)

    def _flush(self, n: int) -> None:
        """Write the first n pending entries as one chunk."""
        taken, rest, got = [], [], 0
        for item in self._pending:
            size = len(item[0]) if self.kind == KIND_FINGERPRINTS else len(item)
            if got >= n:
                rest.append(item)
                continue
            cut = min(size, n - got)
            if self.kind == KIND_FINGERPRINTS:
                fps, keys = item
                taken.append((fps[:cut], None if keys is None else keys[:cut]))
                if cut < size:
                    rest.append((fps[cut:], None if keys is None else keys[cut:]))
            else:
                taken.append(item[:cut])
                if cut < size:
                    rest.append(item[cut:])
            got += cut
        self._pending, self._pending_n = rest, self._pending_n - got
        if self.kind == KIND_FINGERPRINTS:
            fps = np.concatenate([t[0] for t in taken])
            raw = _pack_u64(fps)
            if self.keys:
                raw += _pack_keys([key for t in taken for key in t[1]])
        else:
            pairs = np.concatenate(taken)
            raw = _pack_u64(pairs["q"]) + _pack_u64(pairs["f"]) + pairs["distance"].tobytes()
        stored = self._zstd.compress(raw)
        head = CHUNK_HEAD.pack(0, got, len(raw), len(stored))
        crc = _core.crc32c(head[4:] + stored)
        self._offsets.append(self._file.tell())
        self._file.write(struct.pack("<I", crc) + head[4:])
        self._file.write(stored)
        self.count += got

    def close(self) -> None:
        """Write the last chunk, the footer and the trailer; move the file into place."""
        if self._file is None:
            return
        try:
            if self._pending_n:
                self._flush(self._pending_n)
            footer_at = self._file.tell()
            body = FOOTER_HEAD.pack(0, 0, len(self._offsets), 0, self.count)[4:]
            body += np.array(self._offsets, dtype="<u8").tobytes()
            trailer = TRAILER.pack(footer_at, END_MAGIC)
            crc = _core.crc32c(body + trailer[:8])
            self._file.write(struct.pack("<I", crc) + body + trailer)
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            store.publish(self._tmp, self.path)   # FileExistsError if path appeared
        finally:
            # Published, the hidden name is a link of its own; else the file
            # (a full disk's half) goes.
            self.abort()

    def abort(self) -> None:
        """Discard the file being written."""
        self._file = None
        self._discard()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _discard(file, tmp: str) -> None:
    """Close and delete an unpublished file (its writer's finalizer)."""
    file.close()
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def write_fingerprints(path, fingerprints, keys=None, *, chunk_size: int = DEFAULT_CHUNK_COUNT) -> int:
    """Write fingerprints (and optional keys) to a new fingerprint file; return the count.

    fingerprints may be one uint64 array or list of ints (with keys, if
    given), or an iterable of arrays (written as they come, so memory stays
    at one chunk).  Fingerprints are checked as Index.add checks them.
    """
    with FingerprintWriter(path, keys=keys is not None, chunk_size=chunk_size) as w:
        if keys is not None or isinstance(fingerprints, (int, np.integer, np.ndarray)) or (
                isinstance(fingerprints, (list, tuple))
                and not (fingerprints and isinstance(fingerprints[0], (np.ndarray, list, tuple)))):
            w.write(fingerprints, keys)
        else:
            for part in fingerprints:
                w.write(part)
    return w.count


def write_pairs(path, batches, *, chunk_size: int = DEFAULT_CHUNK_COUNT) -> int:
    """Write pair batches (arrays of PAIR_DTYPE) to a new pair file; return the pair count."""
    with FingerprintWriter(path, kind=KIND_PAIRS, chunk_size=chunk_size) as w:
        if isinstance(batches, np.ndarray):
            batches = [batches]
        for batch in batches:
            w.write_pairs(batch)
    return w.count


# -- reading -------------------------------------------------------------------


class FingerprintReader:
    """Read a fingerprint or pair file by chunk number or as a stream.

    Opening reads the header and the footer (two small reads) and checks
    both.  Raises FormatError if the file is not a fingerprint file or has a
    newer version, CorruptionError if a checksum or a length is wrong or the
    file is truncated; a chunk is only checked when read.
    """

    def __init__(self, path):
        self.path = os.fsdecode(path)
        self._file = open(self.path, "rb")
        try:
            self._read_header()
            self._read_footer()
        except BaseException:
            self._file.close()
            raise
        self._zstd = zstandard.ZstdDecompressor()

    def _error(self, message: str, offset: int | None = None) -> CorruptionError:
        return CorruptionError(f"{self.path}: {message}", database=_DATABASE, offset=offset)

    def _read_header(self) -> None:
        raw = self._file.read(HEADER.size)
        if len(raw) < 8 or raw[:8] != MAGIC:
            raise FormatError(f"{self.path}: not a fingerprint file (magic {raw[:8].hex()}, "
                              f"expected {MAGIC.hex()})")
        if len(raw) < HEADER.size:
            raise self._error(f"header is {len(raw)} bytes, expected {HEADER.size}")
        _, version, kind, flags, crc = HEADER.unpack(raw)
        if crc != _core.crc32c(raw[:12]):
            raise self._error("header checksum mismatch", 12)
        if version > VERSION:
            raise FormatError(f"{self.path}: fingerprint file version {version} > supported {VERSION}")
        if version == 0:
            raise self._error("header version 0", 8)
        if kind not in KIND_NAMES:
            raise self._error(f"header kind {kind}, expected one of {sorted(KIND_NAMES)}", 9)
        if flags & ~FLAG_KEYS or (flags & FLAG_KEYS and kind != KIND_FINGERPRINTS):
            raise self._error(f"header flags 0x{flags:04x} set reserved bits", 10)
        self.version, self.kind, self.has_keys = version, kind, bool(flags & FLAG_KEYS)

    def _read_footer(self) -> None:
        size = os.fstat(self._file.fileno()).st_size
        if size < HEADER.size + FOOTER_HEAD.size + TRAILER.size:
            raise self._error(f"truncated: {size} bytes cannot hold a footer and trailer")
        self._file.seek(size - TRAILER.size)
        footer_at, end = TRAILER.unpack(self._file.read(TRAILER.size))
        if end != END_MAGIC:
            raise self._error("truncated or damaged: no trailer at the end of the file",
                              size - TRAILER.size)
        if not HEADER.size <= footer_at <= size - TRAILER.size - FOOTER_HEAD.size:
            raise self._error(f"trailer points at footer offset {footer_at} outside the file",
                              size - TRAILER.size)
        self._file.seek(footer_at)
        footer = self._file.read(size - footer_at)
        crc, zero, n_chunks, reserved, total = FOOTER_HEAD.unpack_from(footer)
        if crc != _core.crc32c(footer[4:-8]):
            raise self._error("footer checksum mismatch", footer_at)
        if zero != 0 or reserved != 0 or len(footer) != FOOTER_HEAD.size + 8 * n_chunks + TRAILER.size:
            raise self._error(f"footer of {len(footer)} bytes does not hold {n_chunks} chunk offsets",
                              footer_at)
        offsets = np.frombuffer(footer, dtype="<u8", count=n_chunks, offset=FOOTER_HEAD.size)
        bounds = np.append(offsets, footer_at).astype(np.int64)
        if n_chunks and (offsets[0] != HEADER.size or np.any(np.diff(bounds) <= CHUNK_HEAD.size)):
            raise self._error("footer chunk offsets are out of order", footer_at)
        if not n_chunks and footer_at != HEADER.size:
            raise self._error("footer lists no chunks but the file holds chunk bytes", footer_at)
        self.n_chunks, self.count, self._bounds = int(n_chunks), int(total), bounds

    def chunk(self, i: int):
        """Return chunk i: a uint64 array, (array, list of key bytes) if keyed, or pairs.

        Raises IndexError for a bad number, CorruptionError naming the chunk
        for a bad checksum, length or payload.  Cost: one read and one zstd
        decompression of the chunk.
        """
        if not 0 <= i < self.n_chunks:
            raise IndexError(f"chunk {i} of {self.n_chunks}")
        start, end = int(self._bounds[i]), int(self._bounds[i + 1])
        self._file.seek(start)
        data = self._file.read(end - start)
        crc, count, raw_bytes, stored_bytes = CHUNK_HEAD.unpack_from(data)
        if crc != _core.crc32c(memoryview(data)[4:]):
            raise self._error(f"chunk {i}: checksum mismatch", start)
        if stored_bytes != len(data) - CHUNK_HEAD.size or not 1 <= count <= MAX_CHUNK_COUNT:
            raise self._error(f"chunk {i}: header claims {count} entries in {stored_bytes} bytes, "
                              f"{len(data) - CHUNK_HEAD.size} bytes present", start)
        try:
            raw = zstd_exact(data[CHUNK_HEAD.size:], raw_bytes, self._zstd)
        except ValueError as exc:
            raise self._error(f"chunk {i}: {exc}", start) from None
        return self._columns(memoryview(raw), count, i, start)

    def _columns(self, raw: memoryview, count: int, i: int, start: int):
        fixed = 8 * count if self.kind == KIND_FINGERPRINTS else 17 * count
        extra = 4 * count if self.has_keys else 0
        if len(raw) < fixed + extra or (not self.has_keys and len(raw) != fixed):
            raise self._error(f"chunk {i}: payload of {len(raw)} bytes for {count} entries", start)
        if self.kind == KIND_PAIRS:
            out = np.empty(count, dtype=PAIR_DTYPE)
            out["q"] = _unpack_u64(raw[:8 * count], count)
            out["f"] = _unpack_u64(raw[8 * count:16 * count], count)
            out["distance"] = np.frombuffer(raw[16 * count:], dtype=np.uint8)
            if count and out["distance"].max() > 64:
                raise self._error(f"chunk {i}: a distance exceeds 64", start)
            return out
        fps = _unpack_u64(raw[:fixed], count)
        if not self.has_keys:
            return fps
        lengths = np.frombuffer(raw[fixed:fixed + extra], dtype="<u4").astype(np.int64)
        ends = fixed + extra + np.cumsum(lengths)
        if len(raw) != (ends[-1] if count else fixed + extra):
            raise self._error(f"chunk {i}: key lengths add up to {int(lengths.sum())} bytes, "
                              f"{len(raw) - fixed - extra} present", start)
        starts = ends - lengths
        body = bytes(raw)
        return fps, [body[a:b] for a, b in zip(starts.tolist(), ends.tolist())]

    def chunks(self, start: int = 0, stop: int | None = None):
        """Yield chunks start..stop-1 in order (see chunk()); memory: one chunk."""
        stop = self.n_chunks if stop is None else min(stop, self.n_chunks)
        for i in range(start, stop):
            yield self.chunk(i)

    def __iter__(self):
        return self.chunks()

    def read_all(self):
        """Return every entry: one array (fingerprints or pairs); keys are dropped."""
        parts = [c[0] if self.has_keys else c for c in self.chunks()]
        if parts:
            return np.concatenate(parts)
        return np.empty(0, dtype=PAIR_DTYPE if self.kind == KIND_PAIRS else np.uint64)

    def check(self) -> dict:
        """Read every chunk and check it and the footer's total; raise on the first problem."""
        total = sum(len(c[0] if self.has_keys else c) for c in self.chunks())
        if total != self.count:
            raise self._error(f"chunks hold {total} entries, footer says {self.count}")
        return dict(kind=KIND_NAMES[self.kind], chunks=self.n_chunks, count=total,
                    keys=self.has_keys)

    def close(self) -> None:
        self._file.close()

    # In C: no point for a Ctrl-C between the with statement and them (see Index).
    __enter__ = _core.enter_self
    __exit__ = _core.exit_closing


def read_fingerprints(path) -> np.ndarray:
    """Return every fingerprint of a fingerprint file, in file order."""
    with FingerprintReader(path) as r:
        if r.kind != KIND_FINGERPRINTS:
            raise ValueError(f"{r.path} holds {KIND_NAMES[r.kind]}, not fingerprints")
        return r.read_all()


def read_pairs(paths):
    """Yield the pair batches of one or more pair files, one per chunk."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for path in paths:
        with FingerprintReader(path) as r:
            if r.kind != KIND_PAIRS:
                raise ValueError(f"{r.path} holds {KIND_NAMES[r.kind]}, not pairs")
            yield from r.chunks()


def is_fpfile(path) -> bool:
    """Return True if the file at path starts with the fingerprint-file magic."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except (IsADirectoryError, FileNotFoundError):
        return False
