"""Byte layouts of the format-v2 records: framing, header, state, manifest, log.

Pure functions, no I/O.  Each layout is normative in format-spec/FORMAT.md
(section numbers in the docstrings); field names here are the spec's.
Chunk layouts (the runs' values) live in :mod:`ndindex.chunks`.

Every value the index reads is *framed*: its payload followed by the
CRC-32C of (its LMDB key, then the payload).  Taking the key into the
checksum means a value found under the wrong key, which a damaged tree page
could route a lookup to, fails its check instead of passing for the right
record.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from ndindex import _core
from ndindex.codec import CODE_RECORD_BYTES, CODING_RESTARTS
from ndindex.errors import CorruptionError, FormatError

#: The newest format version this code reads and writes.  Version 3 is
#: version 2 with block coding 2 (restart records, FORMAT.md 5.4); version
#: 4 is version 3 with packed raw blocks (5.3); version 5 is version 4 with
#: several tombstone runs (7.8).  A new file of coding 2 says 5, any other
#: stays at 2, so that readers of version 2 go on opening it; a version-3
#: or 4 file keeps what its readers expect (plain raw blocks, one
#: tombstone run) until `ndindex upgrade`.
FORMAT_VERSION = 5
#: The first version whose files may hold packed raw blocks.
PACKED_RAW_VERSION = 4
#: The first version whose files may hold several tombstone runs, and
#: padded log records.
TOMBSTONE_RUNS_VERSION = PADDED_LOG_VERSION = 5


def format_version_of(coding: int) -> int:
    """The format version of a new file whose tables use this block coding."""
    return FORMAT_VERSION if coding == CODING_RESTARTS else 2


def oldest_version_of(coding: int) -> int:
    """The oldest format version a file of this block coding can have."""
    return 3 if coding == CODING_RESTARTS else 2

MAGIC = b"ndindex\0"
CRC = struct.Struct("<I")
U64_BE = struct.Struct(">Q")

#: Named LMDB databases of a v2 file (FORMAT.md 7.1).
DB_META = "meta"
DB_LOG = "log"
DB_CHUNKS = "chunks"
ALL_DBS = (DB_META, DB_LOG, DB_CHUNKS)
#: Keys of the meta database.
KEY_HEADER = b"header"
KEY_PLAN = b"plan"
KEY_STATE = b"state"
KEY_MANIFEST = b"manifest"
KEY_FINGERPRINTER = b"fingerprinter"
KEY_KEY_DESIGN = b"keydesign"

#: Spaces: the first byte of a chunk key.  Tables are 0..t-1.
SPACE_TOMBSTONES = 0xF0
#: The most tombstone runs a manifest may list (FORMAT.md [M3]).
MAX_TOMBSTONE_RUNS = 64
SPACE_KEYS_BY_FP = 0xF1
SPACE_FPS_BY_KEY = 0xF2
#: Documents (7.9): u64 BE fingerprint + typed key -> the document record.
SPACE_DOCS = 0xF3
#: Lookup keys (7.9): u64 BE lookup key + u64 BE fingerprint -> empty.
SPACE_LOOKUP = 0xF4
RECORD_SPACES = (SPACE_KEYS_BY_FP, SPACE_FPS_BY_KEY, SPACE_DOCS, SPACE_LOOKUP)
#: Record spaces a log record names record by record: document keys have
#: their own compact entries (one for both mirror spaces); lookup-key
#: records are derived from the documents' records when the log is flushed,
#: except deletions a document replaced under the same fingerprint implies.
LOG_RECORD_SPACES = (SPACE_DOCS, SPACE_LOOKUP)
SPACE_NAMES = {SPACE_TOMBSTONES: "tombstones", SPACE_KEYS_BY_FP: "keys-by-fingerprint",
               SPACE_FPS_BY_KEY: "fingerprints-by-key", SPACE_DOCS: "documents",
               SPACE_LOOKUP: "lookup-keys"}
#: The largest record value (a document record: lookup keys and sketch).
MAX_RECORD_VALUE_BYTES = 1 << 20

#: Run kinds (FORMAT.md 7.6).
KIND_HUFFMAN = 1
KIND_RAW = 2
KIND_RECORDS = 3
KIND_TOMBSTONES = 4

#: Document keys: a type byte (0 bytes, 1 text) then 1..500 bytes.
MAX_DOC_KEY_BYTES = 500


def space_name(space: int) -> str:
    return SPACE_NAMES.get(space, f"table {space}")


# -- framing -------------------------------------------------------------------


def frame(key: bytes, payload: bytes) -> bytes:
    """Return payload followed by CRC-32C(key + payload) (FORMAT.md [R1])."""
    return payload + CRC.pack(_core.crc32c(key + payload))


def unframe(value, database: str, key: bytes) -> bytes:
    """Return the payload of a framed value; CorruptionError if its checksum fails."""
    value = bytes(value)
    if len(value) < 4:
        raise CorruptionError(f"{len(value)}-byte record is too short for its checksum",
                              database=database, key=key)
    payload = value[:-4]
    if _core.crc32c(key + payload) != CRC.unpack_from(value, len(payload))[0]:
        raise CorruptionError("record checksum mismatch", database=database, key=key)
    return payload


# -- header (7.2) ----------------------------------------------------------------

HEADER = struct.Struct("<8sHHBBBBQ16s")  # magic, read_v, write_v, f, k, t, coding, expected_n, file_id


@dataclasses.dataclass(frozen=True)
class Header:
    """The header record (FORMAT.md 7.2)."""

    k: int
    tables: int
    expected_n: int
    file_id: bytes
    coding: int = 1
    read_version: int = FORMAT_VERSION
    write_version: int = FORMAT_VERSION

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.read_version, self.write_version, 64, self.k,
                           self.tables, self.coding, self.expected_n, self.file_id)

    @classmethod
    def unpack(cls, payload: bytes, path: str) -> "Header":
        """Validate a header payload; FormatError naming what is unsupported ([F4]-[F6])."""
        if len(payload) < 24 or payload[:8] != MAGIC:
            raise FormatError(f"{path}: not an ndindex file (bad header)")
        read_v, write_v = struct.unpack_from("<HH", payload, 8)
        if read_v > FORMAT_VERSION:
            raise FormatError(f"{path}: header read version {read_v} > supported {FORMAT_VERSION}")
        if len(payload) != HEADER.size:
            raise CorruptionError(f"header is {len(payload)} bytes, expected {HEADER.size}",
                                  database=DB_META, key=KEY_HEADER)
        _, _, _, f, k, t, coding, expected_n, file_id = HEADER.unpack(payload)
        if f != 64 or coding > CODING_RESTARTS or not 1 <= t or k > 63 or expected_n < 1 or \
                read_v < oldest_version_of(coding):
            raise CorruptionError(f"header f={f} k={k} t={t} coding={coding} expected_n="
                                  f"{expected_n} read version {read_v} impossible",
                                  database=DB_META, key=KEY_HEADER)
        return cls(k, t, expected_n, file_id, coding, read_v, write_v)


# -- state (7.3) -----------------------------------------------------------------

STATE = struct.Struct("<QQQQQQQ")


@dataclasses.dataclass
class State:
    """What every commit rewrites: its own txnid, the log's extent, the manifest's generation."""

    txnid: int = 0
    log_first_seq: int = 0
    log_next_seq: int = 0
    log_ops: int = 0
    manifest_generation: int = 0
    journal_id: int = 0
    journal_offset: int = 0

    @property
    def log_records(self) -> int:
        """Records (commits) the log holds."""
        return self.log_next_seq - self.log_first_seq

    def pack(self) -> bytes:
        return STATE.pack(self.txnid, self.log_first_seq, self.log_next_seq, self.log_ops,
                          self.manifest_generation, self.journal_id, self.journal_offset)

    @classmethod
    def unpack(cls, payload: bytes) -> "State":
        if len(payload) != STATE.size:
            raise CorruptionError(f"state record is {len(payload)} bytes, expected {STATE.size}",
                                  database=DB_META, key=KEY_STATE)
        st = cls(*STATE.unpack(payload))
        if st.log_first_seq > st.log_next_seq:
            raise CorruptionError("state: log starts after its end", database=DB_META,
                                  key=KEY_STATE)
        return st


# -- manifest (7.4) --------------------------------------------------------------

RUN_HEAD = struct.Struct("<BBBBIQIIQQ")  # space kind level flags run_id entries chunks merge_into first last
MANIFEST_HEAD = struct.Struct("<QII")    # generation, next_run_id, n_runs
#: Run flags: the run is a merge input (live above its cursor) or output (live up to it).
RUN_MERGE_INPUT = 1
RUN_MERGE_OUTPUT = 2


@dataclasses.dataclass
class Run:
    """One sorted run of a space (FORMAT.md 7.4): where its chunks are and what they hold.

    ``first``/``last`` bound the values (fingerprint runs; 0 otherwise).  A
    run taking part in an incremental merge has a ``cursor``: an input holds
    live entries only above it, the output only up to it (inclusive); an
    empty cursor means the merge has not consumed anything yet.
    ``code`` is the Huffman code record of a KIND_HUFFMAN run.
    """

    space: int
    kind: int
    level: int
    run_id: int
    entries: int
    chunks: int
    value_bytes: int = 0
    first: int = 0
    last: int = 0
    flags: int = 0
    cursor: bytes = b""
    code: bytes = b""
    merge_into: int = 0
    #: A record run being written by a merge: its last chunk's separator,
    #: the low fence of the chunk the next step writes.
    fence: bytes = b""

    @property
    def merge_input(self) -> bool:
        return bool(self.flags & RUN_MERGE_INPUT)

    @property
    def merge_output(self) -> bool:
        return bool(self.flags & RUN_MERGE_OUTPUT)

    @property
    def coding(self) -> int | None:
        """A Huffman run's block coding (its code record's first byte), else None."""
        return self.code[0] if self.kind == KIND_HUFFMAN and self.code else None

    def pack(self) -> bytes:
        code = self.code if self.kind == KIND_HUFFMAN else b""
        return (RUN_HEAD.pack(self.space, self.kind, self.level, self.flags, self.run_id,
                              self.entries, self.chunks, self.merge_into, self.first, self.last)
                + struct.pack("<QH", self.value_bytes, len(self.cursor)) + self.cursor
                + struct.pack("<H", len(self.fence)) + self.fence
                + struct.pack("<B", len(code)) + code)

    @classmethod
    def unpack_from(cls, buf: bytes, pos: int) -> tuple["Run", int]:
        def need(n):
            if pos + n > len(buf):
                raise CorruptionError("manifest ends inside a run", database=DB_META,
                                      key=KEY_MANIFEST, offset=pos)
        need(RUN_HEAD.size + 10)
        space, kind, level, flags, run_id, entries, chunks, merge_into, first, last = \
            RUN_HEAD.unpack_from(buf, pos)
        pos += RUN_HEAD.size
        value_bytes, clen = struct.unpack_from("<QH", buf, pos)
        pos += 10
        need(clen + 2)
        cursor = bytes(buf[pos:pos + clen])
        pos += clen
        (flen,) = struct.unpack_from("<H", buf, pos)
        pos += 2
        need(flen + 1)
        fence = bytes(buf[pos:pos + flen])
        pos += flen
        code_len = buf[pos]
        pos += 1
        need(code_len)
        code = bytes(buf[pos:pos + code_len])
        pos += code_len
        bad = None
        if kind not in (KIND_HUFFMAN, KIND_RAW, KIND_RECORDS, KIND_TOMBSTONES):
            bad = f"kind {kind}"
        elif bool(flags) != bool(merge_into) or \
                (flags & RUN_MERGE_OUTPUT and merge_into != run_id) or \
                (flags & RUN_MERGE_INPUT and merge_into == run_id):
            bad = f"merge link {merge_into}"
        elif flags & ~(RUN_MERGE_INPUT | RUN_MERGE_OUTPUT) or flags == 3:
            bad = f"flags {flags:#x}"
        elif code_len != (CODE_RECORD_BYTES if kind == KIND_HUFFMAN else 0):
            bad = f"code of {code_len} bytes for kind {kind}"
        elif clen and not flags:
            bad = "cursor without merge flags"
        elif kind in (KIND_HUFFMAN, KIND_RAW) and clen not in (0, 8):
            bad = f"{clen}-byte cursor"
        elif entries and first > last:
            bad = "first value above last"
        if bad:
            raise CorruptionError(f"manifest: run {run_id} has impossible {bad}",
                                  database=DB_META, key=KEY_MANIFEST)
        if fence and not flags & RUN_MERGE_OUTPUT:
            raise CorruptionError(f"manifest: run {run_id} has a fence but writes no merge",
                                  database=DB_META, key=KEY_MANIFEST)
        return cls(space, kind, level, run_id, entries, chunks, value_bytes, first, last,
                   flags, cursor, code, merge_into, fence), pos


@dataclasses.dataclass
class Manifest:
    """The runs of every space, newest first within a space (FORMAT.md 7.4)."""

    generation: int = 0
    next_run_id: int = 1
    runs: list = dataclasses.field(default_factory=list)

    def pack(self) -> bytes:
        return MANIFEST_HEAD.pack(self.generation, self.next_run_id, len(self.runs)) + \
            b"".join(r.pack() for r in self.runs)

    @classmethod
    def unpack(cls, payload: bytes) -> "Manifest":
        if len(payload) < MANIFEST_HEAD.size:
            raise CorruptionError("manifest too short", database=DB_META, key=KEY_MANIFEST)
        generation, next_run_id, n = MANIFEST_HEAD.unpack_from(payload)
        pos = MANIFEST_HEAD.size
        runs = []
        for _ in range(n):
            run, pos = Run.unpack_from(payload, pos)
            if run.run_id >= next_run_id or run.run_id == 0:
                raise CorruptionError(f"manifest: run id {run.run_id} outside 1..{next_run_id - 1}",
                                      database=DB_META, key=KEY_MANIFEST)
            runs.append(run)
        if pos != len(payload):
            raise CorruptionError("manifest has trailing bytes", database=DB_META,
                                  key=KEY_MANIFEST, offset=pos)
        if len({r.run_id for r in runs}) != len(runs):
            raise CorruptionError("manifest names a run twice", database=DB_META,
                                  key=KEY_MANIFEST)
        return cls(generation, next_run_id, runs)

    def of(self, space: int) -> list:
        """The runs of one space, newest first."""
        return [r for r in self.runs if r.space == space]

    def replace(self, space: int, runs: list) -> None:
        """Set the runs of one space (newest first), keeping the others."""
        self.runs = [r for r in self.runs if r.space != space] + list(runs)

    def new_run_id(self) -> int:
        run_id = self.next_run_id
        self.next_run_id += 1
        return run_id


def read_meta(view, key: bytes, cls):
    """The meta record key (KEY_STATE, KEY_MANIFEST) of a page view or write
    transaction's view, unpacked by cls (State, Manifest): CorruptionError
    if it is missing or damaged."""
    raw = view.get(DB_META, key)
    if raw is None:
        raise CorruptionError(f"{key.decode()} record is missing", database=DB_META, key=key)
    return cls.unpack(unframe(raw, DB_META, key))


# -- log records (7.5) -----------------------------------------------------------

LOG_HEAD = struct.Struct("<IIIII")  # adds, removes, key puts, key deletes, records
#: LMDB's header before a value stored in overflow pages, and the most
#: pages a fingerprint chunk takes (FORMAT.md 7.7).
OVERFLOW_HEADER_BYTES = 16
CHUNK_PAGES = 16


def log_padding(payload_bytes: int, psize: int) -> int:
    """Zero bytes a writer of format 5 puts after a log record's entries
    ([F19]): a framed value of half a page or more then fills, with LMDB's
    overflow header, a power of two of pages up to CHUNK_PAGES, or a
    multiple of CHUNK_PAGES.  The log's values come and go with every
    flush; of any other size they split the runs of 16 free pages a chunk
    needs (a 10,000-fingerprint record takes 20 pages), and the file grew
    instead (bench_churn_commits.py: 1.11x the file before 10M churn
    unpadded, 1.06x padded)."""
    size = payload_bytes + 4 + OVERFLOW_HEADER_BYTES
    if 2 * (payload_bytes + 4) < psize:
        return 0  # stored in a leaf page
    pages = -(-size // psize)
    target = 1 << (pages - 1).bit_length() if pages <= CHUNK_PAGES \
        else -(-pages // CHUNK_PAGES) * CHUNK_PAGES
    return target * psize - size
LOG_ENTRY = struct.Struct("<BBHI")  # space, flag, key length, value length
#: An empty list of a record's fingerprints (shared, read-only).
_NO_VALUES = np.empty(0, np.uint64)
_NO_VALUES.flags.writeable = False


def _u64s(payload, n: int, pos: int) -> np.ndarray:
    """n little-endian u64 at pos: a read-only view of the payload where that is
    the machine's order (nothing changes a record's arrays).  A copy, and an
    array for an empty list, took half of a one-item record's reading, which
    a fresh open's first query does for each record of the log."""
    if not n:
        return _NO_VALUES
    return np.frombuffer(payload, "<u8", n, pos).astype(np.uint64, copy=False)


@dataclasses.dataclass
class LogRecord:
    """One committed batch of operations, reduced to its net effect (FORMAT.md 7.6).

    adds and removes are disjoint sorted uint64 arrays; key_puts and
    key_deletes are disjoint sorted lists of (fingerprint, typed key);
    records are sorted distinct (space, key, flag, value) operations on
    the document and lookup-key spaces.
    """

    adds: np.ndarray
    removes: np.ndarray
    key_puts: list
    key_deletes: list
    records: list = dataclasses.field(default_factory=list)

    def ops(self) -> int:
        """Operations the record holds (what the state's log_ops counts)."""
        return len(self.adds) + len(self.removes) + len(self.key_puts) + \
            len(self.key_deletes) + len(self.records)

    def pack(self) -> bytes:
        parts = [LOG_HEAD.pack(len(self.adds), len(self.removes), len(self.key_puts),
                               len(self.key_deletes), len(self.records)),
                 self.adds.astype("<u8").tobytes(), self.removes.astype("<u8").tobytes()]
        for fp, raw in self.key_puts + self.key_deletes:
            parts.append(struct.pack("<QH", fp, len(raw)))
            parts.append(raw)
        for space, key, flag, value in self.records:
            parts.append(LOG_ENTRY.pack(space, flag, len(key), len(value)))
            parts.append(key)
            parts.append(value)
        return b"".join(parts)

    @classmethod
    def unpack(cls, payload: bytes, key: bytes) -> "LogRecord":
        """The record of a payload (bytes: its arrays are views of them, so a
        view of the file's map would pin it; unframe() gives bytes)."""
        def bad(why):
            return CorruptionError(f"log record: {why}", database=DB_LOG, key=key)
        if len(payload) < LOG_HEAD.size:
            raise bad("too short")
        na, nr, npu, nd, nrec = LOG_HEAD.unpack_from(payload)
        pos = LOG_HEAD.size
        if pos + 8 * (na + nr) > len(payload):
            raise bad("counts exceed the record")
        adds, removes = _u64s(payload, na, pos), _u64s(payload, nr, pos + 8 * na)
        pos += 8 * (na + nr)
        pairs = []
        for _ in range(npu + nd):
            if pos + 10 > len(payload):
                raise bad("key entry runs past the record")
            fp, n = struct.unpack_from("<QH", payload, pos)
            pos += 10
            if not 2 <= n <= MAX_DOC_KEY_BYTES + 1 or pos + n > len(payload):
                raise bad(f"key of {n} bytes")
            pairs.append((fp, bytes(payload[pos:pos + n])))
            pos += n
        records = []
        for _ in range(nrec):
            if pos + LOG_ENTRY.size > len(payload):
                raise bad("record entry runs past the record")
            space, flag, klen, vlen = LOG_ENTRY.unpack_from(payload, pos)
            pos += LOG_ENTRY.size
            if space not in LOG_RECORD_SPACES or flag > 1 or klen < 9 or \
                    vlen > MAX_RECORD_VALUE_BYTES or pos + klen + vlen > len(payload):
                raise bad(f"record entry (space {space:#x}, flag {flag}, {klen}+{vlen} bytes)")
            records.append((space, bytes(payload[pos:pos + klen]), flag,
                            bytes(payload[pos + klen:pos + klen + vlen])))
            pos += klen + vlen
        if pos != len(payload) and np.frombuffer(payload, np.uint8, len(payload) - pos, pos).any():
            raise bad("trailing bytes")  # zero bytes after the entries are padding ([F19])
        if (na > 1 and not np.all(adds[1:] > adds[:-1])) or \
                (nr > 1 and not np.all(removes[1:] > removes[:-1])):
            raise bad("fingerprints not sorted and distinct")
        if nrec > 1 and any((a[0], a[1]) >= (b[0], b[1]) for a, b in zip(records, records[1:])):
            raise bad("record entries not sorted and distinct")
        return cls(adds, removes, pairs[:npu], pairs[npu:], records)


# -- document keys ---------------------------------------------------------------


def encode_doc_key(key) -> bytes:
    """Typed bytes of a document key: 0x00 + bytes, or 0x01 + UTF-8 of a str."""
    if isinstance(key, str):
        try:
            raw = b"\x01" + key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"document key is not encodable as UTF-8: {exc.reason}") from None
    elif isinstance(key, (bytes, bytearray, memoryview)):
        raw = b"\x00" + bytes(key)
    else:
        raise TypeError(f"document keys must be str or bytes, got {type(key).__name__}")
    if len(raw) - 1 > MAX_DOC_KEY_BYTES:
        raise ValueError(f"document key is {len(raw) - 1} bytes, at most {MAX_DOC_KEY_BYTES} allowed")
    if len(raw) == 1:
        raise ValueError("document keys must not be empty")
    return raw


def decode_doc_key(raw: bytes, database: str = "keys"):
    """Inverse of encode_doc_key; CorruptionError for an unknown type or bad UTF-8."""
    if raw[:1] == b"\x01":
        try:
            return raw[1:].decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptionError("text document key is not UTF-8", database=database) from None
    if raw[:1] == b"\x00":
        return raw[1:]
    raise CorruptionError(f"document key type byte {raw[:1].hex()} unknown", database=database)
