"""The portable dump: an index's live state as one zstd-compressed stream.

``export_index`` writes, ``import_index`` reads; the byte layout is
normative in format-spec/dump.md (statements [D1]...).  A dump holds what a
query can observe -- k, the plan, the block coding, expected_n, the
fingerprinter record, every live fingerprint and its document keys, and the
stored documents (their sketches and data; dump version 2) -- and
nothing of how the file happened to store it (log, tombstones, LMDB pages),
so export -> import -> export gives the same bytes, and a dump moves between
machines and library versions that read its dump version.

Every section carries a CRC-32C of its bytes and the trailer counts what came
before, so a truncated or damaged dump raises CorruptionError naming the
section instead of importing part of an index.
"""

from __future__ import annotations

import errno
import os
import struct
from typing import BinaryIO

import numpy as np
import zstandard

from ndindex import _core, chunks as ch, docstore, store as st
from ndindex.arrays import EMPTY_U64
from ndindex.errors import CorruptionError, FormatError
from ndindex.index import Index
from ndindex.plan import Plan
from ndindex.records import (MAX_RECORD_VALUE_BYTES, SPACE_DOCS, U64_BE, LogRecord,
                             decode_doc_key, encode_doc_key)

MAGIC = b"NDXDUMP\0"
#: The newest dump version this module reads; it writes version 1 for an
#: index without documents (so that readers of version 1 take it) and
#: DOCUMENTS_VERSION for one with them ([D14]).
DUMP_VERSION = 2
DOCUMENTS_VERSION = 2
#: Fingerprints per chunk ([D7]); readers accept any count up to MAX_CHUNK.
CHUNK_FINGERPRINTS = 65536
MAX_CHUNK = 1 << 20
#: zstd level of the writer (readers do not care; fixed so dumps repeat).
ZSTD_LEVEL = 9

HEAD = struct.Struct("<8sHHBBHQ")        # magic, version, reserved, k, coding, reserved, expected_n
U32 = struct.Struct("<I")
U16 = struct.Struct("<H")
TRAILER = struct.Struct("<IQQ")          # end marker 0, fingerprints, keys
TRAILER_V2 = struct.Struct("<IQQQ")      # end marker 0, fingerprints, keys, documents
DOC_HEAD = struct.Struct("<QH")          # fingerprint, typed key length
#: Documents per document chunk: writers put at most this many ([D15]);
#: readers accept up to MAX_DOCUMENT_CHUNK.
CHUNK_DOCUMENTS = 1024
MAX_DOCUMENT_CHUNK = 1 << 16


def _crc(data: bytes) -> bytes:
    return U32.pack(_core.crc32c(data))


def export_index(index: Index, out: BinaryIO) -> dict:
    """Write the dump of an open index to a binary stream; return the counts.

    Cost: one decode of table 0, read in slices (memory bounded, not O(N)),
    and one ordered pass over the key records beside it (Index.items), then
    one over the document records; all from one snapshot (a concurrent
    writer does not tear the dump).
    """
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
    writer = cctx.stream_writer(out, closefd=False)
    plan = index.plan.to_bytes()
    fpr = index.fingerprinter or b""
    view = index._view()
    snap, pend = view
    documents = bool(fpr) and next(snap.space_records(SPACE_DOCS, pend), None) is not None
    version = DOCUMENTS_VERSION if documents else 1
    header = (HEAD.pack(MAGIC, version, 0, index.k, index.coding, 0, index.expected_n)
              + U32.pack(len(plan)) + plan + U32.pack(len(fpr)) + fpr)
    writer.write(header + _crc(header))
    n_fps = n_keys = 0
    previous = 0
    for fps, keys in index._items(CHUNK_FINGERPRINTS, view):
        deltas = np.diff(fps, prepend=np.uint64(previous))   # the first from the last chunk
        parts = [U32.pack(len(fps)), deltas.astype("<u8").tobytes()]
        if not any(keys):
            parts.append(bytes(U16.size * len(fps)))   # no keys: a zero count each
        for ks in keys if any(keys) else ():
            parts.append(U16.pack(len(ks)))
            for key in ks:
                raw = encode_doc_key(key)
                parts.append(U16.pack(len(raw)) + raw)
            n_keys += len(ks)
        body = b"".join(parts)
        writer.write(body + _crc(body))
        previous = int(fps[-1])
        n_fps += len(fps)
    counts = dict(fingerprints=n_fps, keys=n_keys)
    if version == 1:
        trailer = TRAILER.pack(0, n_fps, n_keys)
    else:
        writer.write(U32.pack(0))     # the fingerprint chunks end
        counts["documents"] = _write_documents(writer, snap.space_records(SPACE_DOCS, pend))
        trailer = TRAILER_V2.pack(0, n_fps, n_keys, counts["documents"])
    writer.write(trailer + _crc(trailer))
    writer.close()      # ends the frame (its checksum); closefd=False keeps out open
    return counts


def _write_documents(writer, records) -> int:
    """Write document chunks of (fingerprint, typed key, record value) ([D14]); return
    how many documents.  records: (key, value) of the documents space, in key order."""
    n = 0
    batch = []

    def flush():
        body = U32.pack(len(batch)) + b"".join(batch)
        writer.write(body + _crc(body))
        batch.clear()
    for key, value in records:
        value = bytes(value)
        batch.append(DOC_HEAD.pack(U64_BE.unpack_from(key)[0], len(key) - 8) + key[8:]
                     + U32.pack(len(value)) + value)
        n += 1
        if len(batch) == CHUNK_DOCUMENTS:
            flush()
    if batch:
        flush()
    return n


class _Reader:
    """Exact reads from the decompressed stream; a short read is corruption."""

    def __init__(self, raw: BinaryIO, name: str):
        self.name = name
        self.raw = raw
        self.dobj = zstandard.ZstdDecompressor().decompressobj()
        self.buffer = bytearray()

    def _fill(self, n: int) -> None:
        try:
            while len(self.buffer) < n and not self.dobj.eof:
                data = self.raw.read(1 << 16)
                if not data:
                    return
                self.buffer += self.dobj.decompress(data)
        except zstandard.ZstdError as exc:
            raise CorruptionError(f"{self.name}: dump is not a valid zstd stream ({exc})",
                                  database="dump") from exc

    def peek(self, n: int) -> bytes:
        """The next n bytes (fewer at the end), left to be read."""
        self._fill(n)
        return bytes(self.buffer[:n])

    def read(self, n: int, what: str) -> bytes:
        self._fill(n)
        if len(self.buffer) < n:
            raise CorruptionError(f"{self.name}: dump truncated in the {what} "
                                  f"({len(self.buffer)} of {n} bytes)", database="dump")
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    def at_end(self) -> bool:
        """Whether the frame ended (its checksum verified) with nothing after it."""
        self._fill(1)
        return not self.buffer and self.dobj.eof and not self.dobj.unused_data \
            and not self.raw.read(1)

    def check(self, body: bytes, what: str) -> None:
        if self.read(4, what) != _crc(body):
            raise CorruptionError(f"{self.name}: {what} checksum mismatch", database="dump")


def read_header(raw: BinaryIO, name: str = "dump") -> tuple[_Reader, dict]:
    """Read and check a dump's header; return the reader and the fields."""
    r = _Reader(raw, name)
    head = r.read(HEAD.size, "header")
    magic, version, reserved, k, coding, reserved2, expected_n = HEAD.unpack(head)
    if magic != MAGIC:
        raise FormatError(f"{name}: not an ndindex dump (magic {magic!r})")
    if version > DUMP_VERSION:
        raise FormatError(f"{name}: dump version {version} > supported {DUMP_VERSION}")
    if reserved or reserved2:
        raise CorruptionError(f"{name}: reserved header fields are not zero", database="dump")
    (n_plan,) = U32.unpack(r.read(4, "header"))
    plan = r.read(n_plan, "header")
    (n_fpr,) = U32.unpack(r.read(4, "header"))
    fpr = r.read(n_fpr, "header")
    r.check(head + U32.pack(n_plan) + plan + U32.pack(n_fpr) + fpr, "header")
    return r, dict(version=version, k=k, coding=coding, expected_n=expected_n,
                   plan=Plan.from_bytes(plan), fingerprinter=fpr or None)


def _read_keys(r: _Reader, count: int, parts: list):
    """A chunk's document keys: a tuple per fingerprint, or None when none has
    any.  Appends the bytes read to parts (the chunk's checksum covers them)."""
    # A chunk without keys (as a rule) ends in a zero count per fingerprint:
    # read at once, not one count at a time (a third of an import's time).
    # Were any count not zero, the first such would be among these bytes.
    zeros = r.peek(U16.size * count)
    if len(zeros) == U16.size * count and not any(zeros):
        parts.append(r.read(len(zeros), "chunk keys"))
        return None
    keys = []
    for _ in range(count):
        nk = r.read(2, "chunk keys")
        parts.append(nk)
        ks = []
        for _ in range(U16.unpack(nk)[0]):
            ln = r.read(2, "chunk keys")
            raw = r.read(U16.unpack(ln)[0], "chunk keys")
            parts += [ln, raw]
            try:
                ks.append(decode_doc_key(raw))
            except (CorruptionError, UnicodeDecodeError, IndexError) as exc:
                raise CorruptionError(f"{r.name}: bad document key ({exc})",
                                      database="dump") from exc
        keys.append(tuple(ks))
    return keys


class Counts:
    """What a dump's chunks held so far, for its trailer's check ([D11])."""

    def __init__(self):
        self.fingerprints = self.keys = self.documents = 0


def read_chunks(r: _Reader, counts: Counts):
    """Yield (fingerprints, keys) chunks up to the count 0 that ends them; check
    their order and checksums, counting them in counts.

    keys: a tuple of document keys per fingerprint, or None for a chunk
    whose fingerprints have none.
    """
    previous = None
    while True:
        head = r.read(4, "chunk header")
        (count,) = U32.unpack(head)
        if count == 0:
            return
        if count > MAX_CHUNK:
            raise CorruptionError(f"{r.name}: chunk of {count} fingerprints > {MAX_CHUNK}",
                                  database="dump")
        raw_deltas = r.read(8 * count, "chunk")
        deltas = np.frombuffer(raw_deltas, dtype="<u8").astype(np.uint64)
        parts = [head, raw_deltas]
        keys = _read_keys(r, count, parts)
        r.check(b"".join(parts), "chunk")
        start = np.uint64(0 if previous is None else previous)
        with np.errstate(over="ignore"):
            fps = np.cumsum(deltas, dtype=np.uint64) + start
        # strictly increasing, and no wrap past 2^64 ([D8])
        if (previous is not None and deltas[0] == 0) or np.any(deltas[1:] == 0) \
                or np.any(fps[1:] < fps[:-1]) or (previous is not None and fps[0] <= previous):
            raise CorruptionError(f"{r.name}: fingerprints out of order", database="dump")
        previous = int(fps[-1])
        counts.fingerprints += count
        counts.keys += sum(len(k) for k in keys) if keys is not None else 0
        yield fps, keys


def read_documents(r: _Reader, counts: Counts):
    """Yield document chunks, lists of (fingerprint, typed key, record value), up
    to the count 0 that ends them ([D14], [D15]); check their checksums, their
    order and that each key and record parses."""
    last = None
    while True:
        head = r.read(4, "document chunk header")
        (count,) = U32.unpack(head)
        if count == 0:
            return
        if count > MAX_DOCUMENT_CHUNK:
            raise CorruptionError(f"{r.name}: document chunk of {count} documents > "
                                  f"{MAX_DOCUMENT_CHUNK}", database="dump")
        parts, docs = [head], []
        for _ in range(count):
            fixed = r.read(DOC_HEAD.size, "document chunk")
            fp, n = DOC_HEAD.unpack(fixed)
            raw = r.read(n, "document chunk")
            size = r.read(4, "document chunk")
            (n_value,) = U32.unpack(size)
            if n_value > MAX_RECORD_VALUE_BYTES:
                raise CorruptionError(f"{r.name}: document record of {n_value} bytes > "
                                      f"{MAX_RECORD_VALUE_BYTES}", database="dump")
            value = r.read(n_value, "document chunk")
            parts += [fixed, raw, size, value]
            docs.append((fp, raw, value))
        r.check(b"".join(parts), "document chunk")
        for fp, raw, value in docs:
            if last is not None and (fp, raw) <= last:
                raise CorruptionError(f"{r.name}: documents out of order", database="dump")
            last = (fp, raw)
            try:
                decode_doc_key(raw)
                docstore.unpack_document(value, raw)
            except (CorruptionError, UnicodeDecodeError, IndexError, ValueError) as exc:
                raise CorruptionError(f"{r.name}: bad document of fingerprint {fp:#018x} "
                                      f"({exc})", database="dump") from exc
        counts.documents += count
        yield docs


def read_trailer(r: _Reader, version: int, counts: Counts) -> None:
    """Read the trailer after its leading 0 (read by the last chunk loop); check
    its counts and that the frame ends there ([D11])."""
    layout = TRAILER if version == 1 else TRAILER_V2
    whole = U32.pack(0) + r.read(layout.size - 4, "trailer")
    fields = layout.unpack(whole)
    r.check(whole, "trailer")
    held = (counts.fingerprints, counts.keys) + ((counts.documents,) if version > 1 else ())
    if fields[1:] != held:
        said = f"{fields[1]} fingerprints and {fields[2]} keys" + \
            (f" and {fields[3]} documents" if version > 1 else "")
        holds = f"{held[0]} and {held[1]}" + (f" and {held[2]}" if version > 1 else "")
        raise CorruptionError(f"{r.name}: trailer counts {said}, the dump holds {holds}",
                              database="dump")
    if not r.at_end():
        raise CorruptionError(f"{r.name}: the zstd frame does not end after the "
                              "trailer (truncated, or data after it)", database="dump")


def _add_documents(ix: Index, docs: list, name: str) -> None:
    """Store a document chunk's records as they were; each document's key must be
    one its fingerprint holds ([D15]).  Their lookup-key records are derived as
    the log is flushed, as add_documents' are."""
    if ix.fingerprinter is None:
        raise CorruptionError(f"{name}: documents in a dump without a fingerprinter",
                              database="dump")
    held = ix.keys_many(np.array([fp for fp, _, _ in docs], dtype=np.uint64))
    records = []
    for (fp, raw, value), keys in zip(docs, held):
        if decode_doc_key(raw) not in keys:
            raise CorruptionError(f"{name}: a document of fingerprint {fp:#018x} has a key "
                                  "the fingerprint does not hold", database="dump")
        records.append((SPACE_DOCS, U64_BE.pack(fp) + raw, ch.RECORD_PUT, value))
    ix._writer.apply(LogRecord(EMPTY_U64, EMPTY_U64, [], [], records))


def import_index(raw: BinaryIO, path, name: str = "dump") -> dict:
    """Create a new index at path from a dump stream; return the counts.

    The new index has the dump's plan, k, coding, expected_n and
    fingerprinter; every fingerprint and key is added, then the index is
    compacted; the documents of a version-2 dump are stored as they were.
    It is built under a name of its own beside path and given
    path only when whole: an import that fails, is interrupted or is
    killed leaves nothing under path (what a killed one left, the next
    open of path or import into it deletes).  Raises FileExistsError,
    FormatError (not a dump, newer version), CorruptionError (truncated
    or damaged).
    """
    path = os.fsdecode(path)
    r, head = read_header(raw, name)
    if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "already exists", path)
    counts = Counts()
    with st.index_build(path, "import") as tmp:
        with Index.create(tmp, k=head["k"], expected_n=head["expected_n"], plan=head["plan"],
                          coding=head["coding"], fingerprinter=head["fingerprinter"]) as ix:
            for fps, keys in read_chunks(r, counts):
                if keys is None:
                    ix.add(fps)
                    continue
                flat_fps, flat_keys = [], []
                for fp, ks in zip(fps.tolist(), keys):
                    for key in ks or (None,):
                        flat_fps.append(fp)
                        flat_keys.append(key)
                ix.add(np.array(flat_fps, dtype=np.uint64), keys=flat_keys)
            if head["version"] >= DOCUMENTS_VERSION:
                for docs in read_documents(r, counts):
                    _add_documents(ix, docs, r.name)
            read_trailer(r, head["version"], counts)
            ix.compact()
        st.publish(tmp, path)
    out = dict(fingerprints=counts.fingerprints, keys=counts.keys)
    if head["version"] >= DOCUMENTS_VERSION:
        out["documents"] = counts.documents
    return out
