"""Documents in the index file: their records, lookup keys and the queries over them.

An index created with a fingerprinter stores, for each document (a text
under a document key), in the same file and the same transactions as its
fingerprints (FORMAT.md 7.9):

- its simhash in the tables, with the key, exactly as ``Index.add`` does;
- its *document record* in the documents space, under fingerprint + key:
  its lookup keys, application data (the dedup job keeps a file's size and
  modification time there), and its bottom-k sketch (``docrecord``);
- one *lookup-key record* per lookup key (``fingerprint.bands``), under
  lookup key + fingerprint, so that a query finds the fingerprints of the
  documents sharing one of its lookup keys, then their records.

A document key names one document: adding a text under a key that holds
one replaces it.  Removing a document (by key, or its fingerprint) removes
its record and those of its lookup-key records that no other document of
the same fingerprint still needs.

This module computes the operations and answers the queries; the Index
applies the operations through its writer.  Knows nothing of LMDB.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ndindex import _core, docrecord
from ndindex.chunks import RECORD_DELETE, RECORD_PUT
from ndindex.errors import CorruptionError
from ndindex.records import SPACE_DOCS, SPACE_LOOKUP, U64_BE, decode_doc_key, encode_doc_key

if TYPE_CHECKING:  # the fingerprinting modules load on first use of documents
    from ndindex.documents import DocumentSketches
    from ndindex.fingerprint import Fingerprinter
    from ndindex.fingerprint.bands import KeyDesign

#: Document record value: version, number of lookup keys, data length; then
#: the lookup keys (u64 LE), the data, and the sketch record.
DOC_HEAD = struct.Struct("<BHH")
DOC_VERSION = 1
MAX_DATA_BYTES = 1024


class DocumentMatch(NamedTuple):
    """A stored document found near-duplicate: its key, estimated Jaccard, simhash."""

    key: str | bytes
    similarity: float
    fingerprint: int


class StoredDocument(NamedTuple):
    """A document record as stored: lookup keys, application data, sketch."""

    lookup_keys: np.ndarray
    data: bytes
    sketch: np.ndarray


# -- configuration ----------------------------------------------------------------------


def as_fingerprinter(value) -> "Fingerprinter":
    """A Fingerprinter from itself or its to_bytes(); TypeError otherwise."""
    from ndindex.fingerprint import Fingerprinter
    if isinstance(value, Fingerprinter):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Fingerprinter.from_bytes(bytes(value))
    raise TypeError(f"fingerprinter must be a Fingerprinter or its bytes, got "
                    f"{type(value).__name__} (the default one: "
                    "ndindex.fingerprint.Fingerprinter())")


def key_design_for(fingerprinter: "Fingerprinter") -> "KeyDesign":
    """The lookup-key design an index stores for its fingerprinter's threshold."""
    from ndindex.fingerprint.bands import KeyDesign
    if not fingerprinter.threshold > 0:
        raise ValueError("a fingerprinter for documents needs a threshold above 0, got "
                         f"{fingerprinter.threshold}")
    return KeyDesign.for_threshold(fingerprinter.threshold)


@dataclasses.dataclass(frozen=True)
class DocConfig:
    """How an index fingerprints documents: its fingerprinter and lookup-key design."""

    fingerprinter: "Fingerprinter"
    design: "KeyDesign"

    @classmethod
    def from_records(cls, fingerprinter: bytes, design: bytes | None) -> "DocConfig":
        from ndindex.fingerprint.bands import KeyDesign
        fp = as_fingerprinter(fingerprinter)
        return cls(fp, key_design_for(fp) if design is None else KeyDesign.from_bytes(design))

    def fingerprint(self, texts: list, workers: int | None,
                    simhash: bool = True) -> "DocumentSketches":
        """Sketches, lookup keys and (unless simhash=False) simhashes of texts."""
        from ndindex.documents import fingerprint_documents
        return fingerprint_documents(texts, self.fingerprinter, self.design, workers=workers,
                                     simhash=simhash)

    def check_threshold(self, threshold) -> float:
        """The threshold a query asks for (default the fingerprinter's), checked.

        Below the fingerprinter's threshold the lookup keys no longer find
        every pair with good probability, so it is refused.
        """
        if threshold is None:
            return float(self.fingerprinter.threshold)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or \
                not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
        if threshold < self.fingerprinter.threshold:
            raise ValueError(f"threshold {threshold} is below {self.fingerprinter.threshold}, "
                             "the lowest this index's lookup keys were designed for; create "
                             "the index with a fingerprinter of a lower threshold")
        return float(threshold)


def check_batch(texts, keys, data) -> tuple[list, list, list | None]:
    """(texts, typed keys, data) of an add_documents call, checked."""
    if isinstance(texts, (str, bytes, bytearray, memoryview)):
        if not isinstance(keys, (str, bytes)) and isinstance(keys, Sequence):
            raise TypeError(f"one text takes one key, got a {type(keys).__name__} of keys: "
                            "give a list of texts with a list of keys")
        texts, keys = [texts], [keys]
        if data is not None and not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data of one text is bytes or None, got {type(data).__name__}")
        data = None if data is None else [bytes(data)]
    elif isinstance(keys, (str, bytes)) or not isinstance(texts, Iterable) \
            or not isinstance(keys, Iterable):
        # Any iterables (generators too, as add() takes), read whole: the
        # call is one commit, all or nothing.
        raise TypeError("give one text and one key, or sequences (or iterables) of texts and keys")
    keys = list(keys)
    texts = list(texts)
    if len(keys) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(keys)} keys")
    raws = [encode_doc_key(k) for k in keys]
    if len(set(raws)) != len(raws):
        seen = set()
        dup = next(k for k, r in zip(keys, raws) if r in seen or seen.add(r))
        raise ValueError(f"document key {dup!r} is given twice in one call")
    if data is not None:
        if isinstance(data, (str, bytes, bytearray, memoryview)) or not isinstance(data, Iterable):
            raise TypeError(f"data of several texts is a sequence of bytes, got "
                            f"{type(data).__name__}")
        data = [_data_bytes(d) for d in data]
        if len(data) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(data)} data values")
        too_big = [len(d) for d in data if len(d) > MAX_DATA_BYTES]
        if too_big:
            raise ValueError(f"document data is {too_big[0]} bytes, at most {MAX_DATA_BYTES}")
    return texts, raws, data


def _data_bytes(d) -> bytes:
    # bytes(5) is five zero bytes, bytes("x") a TypeError of its own: neither
    # is what the caller meant, so only bytes-like values (and None) pass.
    if d is None:
        return b""
    if not isinstance(d, (bytes, bytearray, memoryview)):
        raise TypeError(f"document data must be bytes or None, got {type(d).__name__}")
    return bytes(d)


def non_empty(docs: "DocumentSketches", raws: list, skip_empty: bool) -> np.ndarray:
    """Indices of the documents with at least one shingle; ValueError for others
    unless skip_empty."""
    empty = np.flatnonzero(np.diff(docs.offsets) == 0)
    if len(empty) and not skip_empty:
        key = decode_doc_key(raws[int(empty[0])])
        raise ValueError(f"document {key!r} has no words to fingerprint ({len(empty)} such "
                         "text(s) in this call); pass skip_empty=True to skip them")
    return np.flatnonzero(np.diff(docs.offsets) > 0)


# -- records --------------------------------------------------------------------------


def pack_document(lookup_keys: np.ndarray, sketch: np.ndarray, data: bytes = b"") -> bytes:
    """Return the document record value (FORMAT.md 7.9)."""
    if len(data) > MAX_DATA_BYTES:
        raise ValueError(f"document data is {len(data)} bytes, at most {MAX_DATA_BYTES}")
    keys = np.ascontiguousarray(lookup_keys, dtype="<u8")
    return DOC_HEAD.pack(DOC_VERSION, len(keys), len(data)) + keys.tobytes() + bytes(data) + \
        docrecord.encode_record(sketch)


def unpack_document(value, key: bytes = b"") -> StoredDocument:
    """Parse a document record value; CorruptionError if it is not one."""
    value = bytes(value)
    if len(value) < DOC_HEAD.size:
        raise CorruptionError("document record too short", database="documents", key=key)
    version, n, dlen = DOC_HEAD.unpack_from(value)
    start = DOC_HEAD.size + 8 * n
    if version != DOC_VERSION or start + dlen > len(value):
        raise CorruptionError(f"document record version {version}, {n} lookup keys and "
                              f"{dlen} data bytes do not fit its {len(value)} bytes",
                              database="documents", key=key)
    keys = np.frombuffer(value, "<u8", n, DOC_HEAD.size).astype(np.uint64)
    return StoredDocument(keys, value[start:start + dlen],
                          docrecord.decode_record(value[start + dlen:]))


def doc_record_key(fp: int, raw: bytes) -> bytes:
    return U64_BE.pack(fp) + raw


def lookup_record_key(lookup_key: int, fp: int) -> bytes:
    return U64_BE.pack(lookup_key) + U64_BE.pack(fp)


# -- the operations of adds and removes ------------------------------------------------


def documents_of(snap, pending, fp: int) -> dict:
    """{typed key: StoredDocument} of the documents stored under a fingerprint."""
    return documents_of_many(snap, pending, [fp])[0]


def documents_of_many(snap, pending, fps) -> list[dict]:
    """documents_of() of each fingerprint (one batched lookup)."""
    groups = [U64_BE.pack(fp) for fp in fps]
    return [{key[8:]: unpack_document(value, key) for key, value in found.items()}
            for found in snap.record_groups(SPACE_DOCS, groups, pending)]


def removal_records(snap, pending, deletes: dict) -> list:
    """Document-record deletions for deleted key pairs.

    deletes: {fingerprint: set of typed keys going}.  Returns (space, key,
    flag, value) deletes of their document records; each delete's value
    lists the lookup keys whose records go with it: those no remaining
    document of the same fingerprint lists ([D1]).
    """
    out = []
    for (fp, raws), docs in zip(deletes.items(),
                                documents_of_many(snap, pending, list(deletes))):
        gone = [raw for raw in raws if raw in docs]
        if not gone:
            continue
        kept = set()
        for raw, doc in docs.items():
            if raw not in raws:
                kept.update(doc.lookup_keys.tolist())
        for raw in gone:
            lks = set(docs[raw].lookup_keys.tolist()) - kept
            kept |= lks  # each lookup-key record goes with one delete only
            out.append((SPACE_DOCS, doc_record_key(fp, raw), RECORD_DELETE,
                        np.array(sorted(lks), dtype="<u8").tobytes()))
    return out


def addition_records(fps: np.ndarray, docs: "DocumentSketches", raws: list, data) -> list:
    """Document-record puts storing documents i = 0..n-1 under (fps[i], raws[i])."""
    return [(SPACE_DOCS, doc_record_key(fp, raw), RECORD_PUT,
             pack_document(docs.lookup_keys(i), docs.sketch(i), data[i] if data else b""))
            for i, (fp, raw) in enumerate(zip(fps.tolist(), raws))]


def lookup_keys_of(flag: int, value) -> np.ndarray:
    """The lookup keys a document-record operation puts (its record's) or deletes
    (its value), uint64."""
    if flag == RECORD_PUT:
        n = int.from_bytes(bytes(value[1:3]), "little")
        return np.frombuffer(value, "<u8", n, DOC_HEAD.size).astype(np.uint64)
    if len(value) % 8:
        raise CorruptionError("document delete lists a partial lookup key", database="documents")
    return np.frombuffer(value, "<u8").astype(np.uint64)


def replaced_lookups(removals: list, additions: list) -> list:
    """Merge a replacement's removals and additions into one list of operations.

    A document replaced by one of the same fingerprint keeps its record key:
    the put replaces the delete, and the lookup keys the delete listed that
    the new document does not hold become explicit lookup-key deletions.
    """
    puts = {key: value for _, key, _, value in additions}
    out = []
    for space, key, flag, value in removals:
        if key not in puts:
            out.append((space, key, flag, value))
            continue
        fp = key[:8]
        kept = set(lookup_keys_of(RECORD_PUT, puts[key]).tolist())
        out += [(SPACE_LOOKUP, U64_BE.pack(lk) + fp, RECORD_DELETE, b"")
                for lk in lookup_keys_of(flag, value).tolist() if lk not in kept]
    return out + additions


def lookup_records(doc_ops, lookup_ops=()) -> bytes:
    """The lookup-key records (a raw record stream) that document-record operations imply.

    doc_ops: (key, flag, value) of the documents space; lookup_ops: explicit
    (key, flag, value) lookup-key operations.  A put of (x, f) wins over a
    delete of it: a delete lists only lookup keys no remaining document of
    f held when it was made, so a put beside it comes from a document added
    since.
    """
    his, los, flags = [], [], []
    for key, flag, value in doc_ops:
        lks = np.unique(lookup_keys_of(flag, value))
        his.append(lks)
        los.append(np.full(len(lks), U64_BE.unpack_from(key)[0], np.uint64))
        flags.append(np.full(len(lks), flag, np.uint8))
    for key, flag, _ in lookup_ops:
        his.append(np.array([U64_BE.unpack_from(key)[0]], np.uint64))
        los.append(np.array([U64_BE.unpack_from(key, 8)[0]], np.uint64))
        flags.append(np.array([flag], np.uint8))
    if not his:
        return b""
    hi, lo, fl = np.concatenate(his), np.concatenate(los), np.concatenate(flags)
    order = np.lexsort((fl, lo, hi))
    hi, lo, fl = hi[order], lo[order], fl[order]
    first = np.ones(len(hi), bool)
    first[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    return _core.pair_records_pack(hi[first], lo[first], fl[first].tobytes())


# -- queries ----------------------------------------------------------------------------


def candidate_fingerprints(snap, pending, lookup_keys) -> list[int]:
    """Fingerprints of the stored documents sharing a lookup key, sorted."""
    groups = [U64_BE.pack(lk) for lk in sorted(set(np.asarray(lookup_keys, np.uint64).tolist()))]
    found = set()
    for records in snap.record_groups(SPACE_LOOKUP, groups, pending):
        found.update(U64_BE.unpack_from(key, 8)[0] for key in records)
    return sorted(found)


def similar(snap, pending, sketch: np.ndarray, lookup_keys, bottom_k: int, threshold: float,
            exclude: tuple | None = None) -> list[DocumentMatch]:
    """Stored documents at bottom-k similarity >= threshold, most similar first.

    exclude: a (fingerprint, typed key) not to report (the query document
    itself when it is stored).
    """
    keys, fps, sketches = [], [], [np.asarray(sketch, dtype=np.uint32)]
    candidates = candidate_fingerprints(snap, pending, lookup_keys)
    found = snap.record_groups(SPACE_DOCS, [U64_BE.pack(fp) for fp in candidates], pending)
    for fp, records in zip(candidates, found):
        for key, value in records.items():
            raw, doc = key[8:], unpack_document(value, key)
            if exclude is not None and (fp, raw) == exclude:
                continue
            keys.append(raw)
            fps.append(fp)
            sketches.append(doc.sketch)
    if not keys:
        return []
    offsets = np.zeros(len(sketches) + 1, np.int64)
    np.cumsum([len(s) for s in sketches], out=offsets[1:])
    values = np.concatenate(sketches).astype(np.uint32, copy=False)
    right = np.arange(1, len(sketches), dtype=np.int64)
    sims = np.frombuffer(_core.similarity(values, offsets, np.zeros(len(right), np.int64), right,
                                          bottom_k, float(threshold)), dtype=np.float64)
    hits = [DocumentMatch(decode_doc_key(keys[i], "documents"), float(sims[i]), fps[i])
            for i in np.flatnonzero(sims >= threshold).tolist()]
    hits.sort(key=lambda m: (-m.similarity, isinstance(m.key, str), m.key))
    return hits


class StoredSet(NamedTuple):
    """Every stored document, in (fingerprint, key) order, as the pipeline's arrays."""

    keys: list          # typed document keys
    fingerprints: np.ndarray
    docs: "DocumentSketches"


def load_all(snap, pending, bottom_k: int, design: "KeyDesign") -> StoredSet:
    """Read every document record (O(documents) time and memory)."""
    from ndindex.documents import DocumentSketches
    raws, fps, sketches, lks = [], [], [], []
    for key, value in snap.space_records(SPACE_DOCS, pending):
        doc = unpack_document(value, key)
        fps.append(U64_BE.unpack_from(key)[0])
        raws.append(key[8:])
        sketches.append(doc.sketch)
        lks.append(doc.lookup_keys)
    offsets = np.zeros(len(raws) + 1, np.int64)
    np.cumsum([len(s) for s in sketches], out=offsets[1:])
    key_offsets = np.zeros(len(raws) + 1, np.int64)
    np.cumsum([len(x) for x in lks], out=key_offsets[1:])
    values = np.concatenate(sketches).astype(np.uint32) if sketches else np.empty(0, np.uint32)
    flat = np.concatenate(lks) if lks else np.empty(0, np.uint64)
    docs = DocumentSketches(values, offsets, flat, key_offsets, bottom_k, design)
    return StoredSet(raws, np.array(fps, dtype=np.uint64), docs)
