"""The dedup job: exact and near-duplicate files in directory trees.

``dedup(paths)`` walks the trees, reads each text file's text
(:mod:`ndindex.textfile`: compressed files through their decompressor, any
character set), finds exact duplicates by a BLAKE2b hash of the bytes and
near-duplicates with the index's document API (``Index.add_documents``,
``Index.near_duplicate_pairs``: candidates from lookup keys, whatever their
simhash distance, kept when the bottom-k Jaccard of word 3-shingles reaches
the threshold), and joins both kinds of links into clusters with union-find
(:mod:`ndindex.cluster`).  The walk and the reads are
:mod:`ndindex.dedup_files`.

What a file is.  A file is one inode, counted once, under its first real
name in walk order (roots sorted, names sorted, depth first).  Its other
names are links, not copies: hard links, and with ``follow_symlinks`` the
symbolic links to it; the report lists them beside the file and counts them
apart.  A symlink is followed only to what no real name reaches, so a file
keeps its name, and its state, whether or not symlinks are followed.

What a run reports and remembers.  A run reports clusters among the files it
found under its paths.  The index remembers every file it has read, from
this run or an earlier one over other paths; a file is forgotten only when
it is gone from disk, so one ``--index`` can serve several sets of paths.

One file holds the job's memory: the index (``--index FILE``), created with
the default fingerprinter, so that a re-run reads only what changed.  It
holds three kinds of documents (FORMAT.md 7.9):

- a *text document* for each distinct text: key TEXT_PREFIX + the BLAKE2b
  of the file's bytes + how the text was taken (plain or HTML).  Files with
  the same bytes share it, so identical copies are fingerprinted once and
  are linked by their hash, never expanded into pairs of sketches;
- a *file record* for each file remembered, keyed by its path
  (:func:`index_key`), whose application data holds its size, mtime_ns,
  kind and content hash (:class:`_FileState`).  It is stored as a document
  because documents are what the index keeps data with; its text is a token
  unique to the key, so it is never anyone's near-duplicate;
- a *marker* (MARKER_KEY) that names the file a dedup index.

Only :class:`_DedupIndex` knows this layout; walking, reading, pairing and
reporting go through its methods, and :func:`check_index` checks it.

Crash safety (Ctrl-C and kill included).  Files are stored in batches, one
at least every COMMIT_SECONDS, each batch one ``Index.transaction()``: its
file records, its new text documents, and the removal of text documents no
file uses any more commit together or not at all.  An interrupted run keeps
every batch committed before it; the files of the batch in flight are read
again by the next run.  (The earlier two-file layout needed a protocol of
pending keys because an LMDB file and an SQLite file cannot commit
together; one file does not.)  Pairs are not stored: each run computes them
from the stored sketches (``near_duplicate_pairs``), so there is no pairing
state to resume.  The first run builds its index (marker included) as
``.<name>.dedup.ndx`` beside it, holding ``.<name>.dedup`` (an flock) while
it works, and renames it into place; a later run deletes what a killed
first run left there.

An index of the earlier layout (an index plus its SQLite state file
``<index>.files``) is replaced on first use, with a note: a text document's
lookup keys need the whole text, which the state file never kept, so every
file is read again as on a first run.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import re
import struct
import time
from typing import Callable, Iterable, Sequence

from ndindex import store as st, validate
from ndindex.cluster import clusters_from_pairs
from ndindex.dedup_files import (KIND_BINARY, KIND_PLAIN, KIND_TEXT, KIND_UNDECODABLE,
                                 TEXT_HTML, Options, Walk, examined, tally)
from ndindex.errors import CorruptionError, NdindexError, ReadOnlyError
from ndindex.fingerprint import Fingerprinter
from ndindex.index import Index
from ndindex.plan import check_k

#: Default size limits of the files considered, in bytes (inclusive); a
#: compressed file's limits apply to its size and to its decompressed size.
DEFAULT_MIN_SIZE_BYTES = 1
DEFAULT_MAX_SIZE_BYTES = 64 << 20
#: Most files per stored batch (one index transaction).
BATCH_FILES = 2048
#: Most text characters held for one batch (texts wait in memory until stored).
BATCH_TEXT_CHARS = 64 << 20
#: A batch is stored at least this often, so an interrupted run keeps its work.
COMMIT_SECONDS = 1.0
#: Near-duplicates linked per text, the most similar first (see _capped).
DEFAULT_MAX_CANDIDATES = 64
#: Clusters up to this many files report every pairwise distance; larger
#: ones report the links that joined them and each file's link to the
#: representative.
MAX_PAIRWISE_FILES = 16
#: A new index is planned for this many distinct fingerprints at first.
DEFAULT_EXPECTED_FILES = 1_000_000
#: The simhash distance a new index's tables answer (``ndindex query``).
#: Near-duplicates do not depend on it, so it is the engine's small default:
#: each table costs about 5 bytes a document.
DEFAULT_INDEX_K = 3
#: Document keys are at most 500 bytes (records.MAX_DOC_KEY_BYTES); longer
#: paths are keyed by a digest, prefixed by a NUL that no path contains.
MAX_PATH_KEY_BYTES = 500

#: The skip reason of a file of each kind that is not compared.
_KIND_SKIP = {KIND_BINARY: "binary", KIND_UNDECODABLE: "undecodable"}
# The clock that times commits (a test may replace it).
_clock = time.monotonic


# -- results ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DuplicateFile:
    """One file of a cluster.

    ``path`` is a str (undecodable bytes as surrogate escapes, so it works
    with ``open()``); ``display_path`` is printable (bad bytes and control
    characters as ``\\xNN``).
    ``links`` holds the file's other names found by the run, as (path, kind)
    with kind "hard link" or "symlink": links, not copies.
    """

    path: str
    size: int
    content_hash: str
    simhash: int | None
    links: tuple = ()

    @property
    def display_path(self) -> str:
        return display_path(self.path)


@dataclasses.dataclass(frozen=True)
class Pair:
    """A link between files ``a`` and ``b`` (positions in the cluster's files).

    ``distance`` is the Hamming distance of the simhashes (None unless both
    files are text with words), ``similarity`` the Jaccard estimate of the
    sketches (1.0 for identical bytes), ``exact`` whether the bytes are
    identical.
    """

    a: int
    b: int
    distance: int | None
    similarity: float
    exact: bool


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A group of duplicate files: identical bytes, or near-duplicates, or both.

    ``files[0]`` is the representative (the largest file; the first path
    among equals), the file every other is compared with: ``pairs`` holds
    (0, i) for every other file i, and every pair of a cluster of at most
    MAX_PAIRWISE_FILES files.
    """

    files: tuple
    pairs: tuple

    @property
    def kind(self) -> str:
        """"exact" if all files are byte-identical, "near" otherwise."""
        return "exact" if len({f.content_hash for f in self.files}) == 1 else "near"

    @property
    def representative(self) -> DuplicateFile:
        """The file the others are compared with: ``files[0]``."""
        return self.files[0]

    @property
    def reclaimable_bytes(self) -> int:
        """Bytes freed by keeping one file of each content (exact copies only)."""
        sizes = {}
        for f in self.files:
            sizes.setdefault(f.content_hash, []).append(f.size)
        return sum(sum(s) - s[0] for s in sizes.values())


@dataclasses.dataclass
class DedupResult:
    """What :func:`dedup` found: clusters, counts and the files it could not read.

    Every entry the walk meets is counted once: ``files_scanned`` files were
    checked for duplicates (``files_read`` read now, ``files_unchanged``
    known from an earlier run); ``skipped`` counts the others by reason
    ("symlink" not followed, "broken symlink", "special", "index", "too
    small", "too large", "binary", "undecodable"); ``links`` counts other
    names of files and directories already counted ("hard link",
    "symlink"); ``errors`` lists (path, problem) of files that could not be
    read.  ``files_removed`` counts remembered files forgotten because they
    are gone from disk.  ``notes`` holds sentences about the index itself
    (one replaced because it could not serve this run).  Iterating over it
    yields the clusters.
    """

    clusters: list
    index_path: str
    files_scanned: int = 0
    files_read: int = 0
    files_unchanged: int = 0
    files_removed: int = 0
    bytes_read: int = 0
    skipped: dict = dataclasses.field(default_factory=dict)
    links: dict = dataclasses.field(default_factory=dict)
    errors: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def __iter__(self):
        return iter(self.clusters)

    def __len__(self):
        return len(self.clusters)

    @property
    def duplicate_files(self) -> int:
        """Files beyond the first of each cluster."""
        return sum(len(c.files) - 1 for c in self.clusters)


#: Control characters (C0, DEL, C1): a newline in a name broke the line it
#: was printed on, an escape sequence reached the terminal as one.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """text with its control characters as ``\\xNN``: safe on a terminal line."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def display_path(path) -> str:
    """Return a printable form of a path: undecodable bytes and control
    characters as ``\\xNN``."""
    return printable(os.fsencode(path).decode("utf-8", "backslashreplace"))


def default_index_path(paths: Sequence) -> str:
    """Return the default index of a dedup over ``paths``.

    ``$XDG_CACHE_HOME/ndindex/dedup-<16 hex digits>.ndx`` (``~/.cache`` when
    XDG_CACHE_HOME is unset), the digits a hash of the sorted absolute paths,
    so a re-run over the same roots finds its index.
    """
    roots = sorted(os.fsencode(os.path.abspath(p)) for p in paths)
    digest = hashlib.blake2b(b"\0".join(roots), digest_size=8).hexdigest()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "ndindex", f"dedup-{digest}.ndx")


# -- the index: file records, text documents, marker ---------------------------

#: Key prefixes no path key has (paths are absolute: "/..."; long ones "\0...").
TEXT_PREFIX = b"\x01"
MARKER_KEY = b"\x02ndindex-dedup"
#: The marker's data: the layout of this module, so a newer one is refused.
LAYOUT_VERSION = 1
_MARKER_DATA = b"ndindex-dedup/%d"
#: A file record's data: layout version, kind, text mode, size, mtime_ns,
#: BLAKE2b-128 of the bytes; then the path when the key is its digest.
_FILE_DATA = struct.Struct("<BBBQq16s")
_FILE_DATA_VERSION = 1
#: Longest path a digest-keyed file record keeps (documents hold 1 KiB of data).
_MAX_DATA_PATH_BYTES = 1024 - _FILE_DATA.size


def index_key(path: bytes):
    """Return the document key of a file record: the path as str if UTF-8, else bytes.

    Paths longer than MAX_PATH_KEY_BYTES are keyed by NUL + their BLAKE2b-256.
    """
    if len(path) > MAX_PATH_KEY_BYTES:
        return b"\0" + hashlib.blake2b(path, digest_size=32).digest()
    try:
        return path.decode("utf-8")
    except UnicodeDecodeError:
        return path


def text_key(content_hash: bytes, text_mode: int) -> bytes:
    """Return the key of the text document of a file's bytes taken as text_mode."""
    return TEXT_PREFIX + content_hash + bytes((text_mode,))


def _token(key) -> str:
    """A one-word text unique to a key: what a file record or the marker is
    fingerprinted as (one shingle, shared with no other document)."""
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return "ndxfile" + hashlib.blake2b(raw, digest_size=12).hexdigest()


@dataclasses.dataclass(frozen=True)
class _FileState:
    """What the index remembers of a file (a file record's data)."""

    path: bytes | None     # None: a path too long to keep, known only by its digest
    size: int
    mtime_ns: int
    kind: int
    text_mode: int
    content_hash: bytes

    @property
    def text_key(self) -> bytes | None:
        """The key of the file's text document (None unless KIND_TEXT)."""
        return text_key(self.content_hash, self.text_mode) if self.kind == KIND_TEXT else None

    def pack(self, key) -> bytes:
        head = _FILE_DATA.pack(_FILE_DATA_VERSION, self.kind, self.text_mode, self.size,
                               self.mtime_ns, self.content_hash)
        digest_keyed = isinstance(key, bytes) and key[:1] == b"\0"
        if digest_keyed and self.path is not None and len(self.path) <= _MAX_DATA_PATH_BYTES:
            return head + self.path
        return head

    @classmethod
    def unpack(cls, key, data: bytes) -> "_FileState":
        if len(data) < _FILE_DATA.size:
            raise CorruptionError(f"dedup file record of {len(data)} bytes", database="documents",
                                  key=_raw(key))
        version, kind, mode, size, mtime_ns, digest = _FILE_DATA.unpack_from(data)
        if version != _FILE_DATA_VERSION or kind > KIND_UNDECODABLE or mode > TEXT_HTML:
            raise CorruptionError(f"dedup file record version {version}, kind {kind}, text "
                                  f"mode {mode}", database="documents", key=_raw(key))
        if isinstance(key, str):
            path = os.fsencode(key)
        elif key[:1] == b"\0":
            path = bytes(data[_FILE_DATA.size:]) or None
        else:
            path = bytes(key)
        return cls(path, size, mtime_ns, kind, mode, digest)


def _raw(key) -> bytes:
    return key.encode("utf-8", "surrogateescape") if isinstance(key, str) else bytes(key)


def _stored_documents(ix: Index, keys) -> dict:
    """Return {key: (simhash, sketch)} of the given stored documents.

    The document API has no call that returns a stored document's simhash
    or sketch by key (``similar(key=...)`` reads both internally, and
    ``near_duplicate_pairs`` reports only pairs at the threshold); until it
    has one, read them the way ``Index.similar`` does.  Used only for the
    files of reported clusters.
    """
    from ndindex import docstore, records
    snap, pending = ix._view()
    keys = list(keys)
    raws = [records.encode_doc_key(key) for key in keys]
    held = [(key, raw, fp) for key, raw, fps in zip(keys, raws, snap.fps_of_keys(raws, pending))
            for fp in fps]
    out = {}
    found = docstore.documents_of_many(snap, pending, [fp for _, _, fp in held])
    for (key, raw, fp), docs in zip(held, found):
        doc = docs.get(raw)
        if doc is not None and key not in out:
            out[key] = (fp, doc.sketch)
    return out


class _DedupIndex:
    """The job's memory: one index file of file records and text documents,
    kept consistent (see the module docstring).

    ``files`` maps each file record's key to its _FileState, ``texts`` each
    text document's key to its simhash (None until looked up, for texts
    stored by this run), ``refs`` each text to the number of file records
    using it.  Every change goes through :meth:`store` and :meth:`forget`,
    one transaction per batch.
    """

    def __init__(self, ix: Index):
        self.ix = ix
        self.fingerprinter = Fingerprinter.from_bytes(ix.fingerprinter)
        self.files: dict = {}
        self.texts: dict = {}
        for key, fp, data in ix.documents():
            if key == MARKER_KEY:
                continue
            if isinstance(key, bytes) and key[:1] == TEXT_PREFIX:
                self.texts[key] = fp
            else:
                self.files[key] = _FileState.unpack(key, data)
        self.refs = collections.Counter(s.text_key for s in self.files.values()
                                        if s.kind == KIND_TEXT)

    @classmethod
    def open(cls, path: str, fingerprinter: Fingerprinter, k: int | None, threshold: float,
             notes: list) -> "_DedupIndex":
        """Open the dedup index at path, or create it; replace one that cannot serve.

        An index of the earlier two-file layout, or one made with another
        fingerprinting pipeline or for a higher threshold than asked, is
        the job's own cache and is replaced (every file is read again), with
        a note.  Raises NdindexError for a file that is not a dedup index,
        ValueError for k above the index's.
        """
        why = _unwritable(path)
        if why is not None:
            raise ReadOnlyError(f"{path}: the dedup job cannot write its index here ({why}); "
                                "use another --index")
        _replace_two_file_layout(path, notes)
        if os.path.exists(path):
            ix = Index.open(path)
            try:
                reason = _unusable(ix, fingerprinter, threshold)
                if reason is None and k is not None and k > ix.k:
                    raise ValueError(f"k={k} is above the index's k={ix.k}; use another --index")
            except BaseException:
                ix.close()
                raise
            if reason is None:
                return cls(ix)
            ix.close()
            _unlink(path, path + "-lock")
            notes.append(f"{path}: {reason}: replaced by a new index; every file is read again")
        return cls(_create(path, fingerprinter, k, threshold))

    def close(self) -> None:
        self.ix.close()

    def forget(self, keys: list) -> None:
        """Forget files (their records, and the texts no other file uses)."""
        for start in range(0, len(keys), BATCH_FILES):
            part = keys[start:start + BATCH_FILES]
            self._commit({}, {}, part)

    def store(self, records: list) -> list:
        """Store a batch of examined files in one transaction; return the records
        as stored (a text without a word to fingerprint becomes KIND_PLAIN).

        A record with an error, or skipped and not binary, is forgotten (it
        is read again next time); binary and undecodable files keep a record
        so that they are not read again.
        """
        files, texts, gone = {}, {}, []
        for r in records:
            key = index_key(r.path)
            if r.error is not None or (r.skip is not None and r.kind not in _KIND_SKIP):
                if key in self.files:
                    gone.append(key)
                continue
            state = _FileState(r.path, r.size, r.mtime_ns, r.kind, r.text_mode, r.content_hash)
            if r.kind == KIND_TEXT and state.text_key not in self.texts:
                texts.setdefault(state.text_key, r.text)
            files[key] = state
        wordless = self._commit(files, texts, gone)
        for r in records:
            if r.kind == KIND_TEXT and text_key(r.content_hash, r.text_mode) in wordless:
                r.kind = KIND_PLAIN
        return records

    def _commit(self, files: dict, texts: dict, gone: list) -> set:
        """Write file records, add new texts, remove the gone files and the
        texts nobody uses any more: one transaction.  Returns the keys of the
        texts that had no word to fingerprint (their files are stored as
        KIND_PLAIN).  The in-memory maps change only once it committed."""
        refs = collections.Counter(self.refs)
        for key in list(files) + gone:
            old = self.files.get(key)
            if old is not None and old.kind == KIND_TEXT:
                refs[old.text_key] -= 1
        with self.ix.transaction():
            wordless = self._add_texts(texts)
            for key in list(files):
                state = files[key]
                if state.kind == KIND_TEXT and state.text_key in wordless:
                    files[key] = state = dataclasses.replace(state, kind=KIND_PLAIN)
                if state.kind == KIND_TEXT:
                    refs[state.text_key] += 1
            if files:
                keys = list(files)
                self.ix.add_documents([_token(key) for key in keys], keys,
                                      data=[files[key].pack(key) for key in keys], workers=1)
            unused = [key for key, n in refs.items() if n <= 0]
            if gone or unused:
                self.ix.remove(keys=gone + unused)
        for key in gone:
            del self.files[key]
        self.files.update(files)
        for key in unused:
            del refs[key]
            self.texts.pop(key, None)
        self.texts.update((key, None) for key in texts if key not in wordless)
        self.refs = refs
        return wordless

    def _add_texts(self, texts: dict) -> set:
        """Add text documents; return the keys of those without a word to fingerprint."""
        if not texts:
            return set()
        keys = list(texts)
        try:
            # workers=1: the job's reading processes already use the other
            # cores, and a pool per batch would cost more than it saves.
            self.ix.add_documents([texts[k] for k in keys], keys, workers=1)
            return set()
        except ValueError:
            # A word character the tokenizer does not count as one (the
            # check in _examine is only a necessary condition): find them.
            wordless = {k for k in keys if len(self.fingerprinter.sketch(texts[k])) == 0}
            if not wordless:
                raise
        rest = [k for k in keys if k not in wordless]
        if rest:
            self.ix.add_documents([texts[k] for k in rest], rest, workers=1)
        return wordless

    def text_pairs(self, threshold: float) -> list:
        """Return (text a, text b, similarity) of every near-duplicate pair of texts."""
        return [(a, b, s) for a, b, s in self.ix.near_duplicate_pairs(threshold)
                if a in self.texts and b in self.texts]

    def simhashes(self, keys) -> dict:
        """Return {text key: simhash} (looked up for texts stored by this run)."""
        missing = [k for k in keys if self.texts.get(k) is None]
        if missing:
            for key, (fp, _) in _stored_documents(self.ix, missing).items():
                self.texts[key] = fp
        return {k: self.texts[k] for k in keys}

    def similarity(self, a: bytes, b: bytes) -> float:
        """Return the bottom-k similarity of two stored texts."""
        stored = _stored_documents(self.ix, [a, b])
        return float(self.fingerprinter.similarity(stored[a][1], stored[b][1]))


def _unusable(ix: Index, fingerprinter: Fingerprinter, threshold: float) -> str | None:
    """Why a dedup index cannot serve this run (None if it can).

    Raises NdindexError when the file is not a dedup index, or one of a
    newer layout: neither is this job's to replace.
    """
    raw = ix.fingerprinter
    marker = None
    if raw is not None:
        try:
            marker = ix.document_data(MARKER_KEY)
        except KeyError:
            pass
    if marker is None:
        raise NdindexError(f"{ix.path}: not a dedup index (an ndindex file that `ndindex dedup` "
                           "did not make); use another --index")
    version = int(marker.rsplit(b"/", 1)[-1]) if marker.startswith(b"ndindex-dedup/") else -1
    if version > LAYOUT_VERSION or version < 1:
        raise NdindexError(f"{ix.path}: dedup index layout {version} > supported "
                           f"{LAYOUT_VERSION} (made by a newer version); use another --index")
    stored = Fingerprinter.from_bytes(raw)
    if _comparable(raw) != _comparable(fingerprinter.to_bytes()):
        return "made with another fingerprinting pipeline"
    if stored.threshold > threshold:
        return (f"its lookup keys find near-duplicates at thresholds >= {stored.threshold:g}, "
                f"not {threshold:g}")
    return None


def _comparable(raw: bytes) -> bytes:
    # The unicode_version field is informative ([FP50]): a Python upgrade must
    # not orphan an index.  The flip model only orders probes ([FP80]), so an
    # index written before it existed stays usable.  The threshold is checked
    # apart: an index serves every threshold at or above its own.  Every
    # other field must match.
    cfg = Fingerprinter.from_bytes(raw).to_dict()
    for informative in ("unicode_version", "flip_model", "threshold"):
        cfg.pop(informative, None)
    return repr(sorted(cfg.items())).encode()


def _create(path: str, fingerprinter: Fingerprinter, k: int | None, threshold: float) -> Index:
    """Create a dedup index at path: built beside it, marker included, then
    renamed into place, so a crash leaves no index or a whole one.

    The build holds a fixed name while it works (store.index_build), so a
    later run tells a killed build's files from a live one's and deletes
    them; a second run starting meanwhile waits for the first and opens
    its index.
    """
    fpr = dataclasses.replace(fingerprinter, threshold=min(fingerprinter.threshold, threshold))
    with st.index_build(path, "dedup") as tmp:
        if os.path.exists(path):  # another run built it while this one waited
            return Index.open(path)
        with Index.create(tmp, k=DEFAULT_INDEX_K if k is None else k,
                          expected_n=DEFAULT_EXPECTED_FILES, fingerprinter=fpr) as ix:
            ix.add_documents(_token(MARKER_KEY), MARKER_KEY, data=_MARKER_DATA % LAYOUT_VERSION)
        st.publish(tmp, path)
    return Index.open(path)


def _unwritable(path: str) -> str | None:
    """Why the index at path (or a new one there) cannot be written; None if it can."""
    target = path if os.path.exists(path) else os.path.dirname(os.path.abspath(path))
    if os.access(target, os.W_OK):
        return None
    try:
        if os.statvfs(target).f_flag & os.ST_RDONLY:
            return "a read-only file system"
    except (OSError, AttributeError):
        pass
    return "no permission to write"


def _replace_two_file_layout(path: str, notes: list) -> None:
    """Delete an index of the earlier layout (index + SQLite ``<index>.files``).

    The index goes first: if the run stops in between, the state file left
    alone is recognised and deleted next time.
    """
    state = path + ".files"
    try:
        with open(state, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return
    if head not in (b"", b"SQLite format 3\x00"):
        return
    _unlink(path, path + "-lock")
    _unlink(state, state + "-wal", state + "-shm", state + "-journal")
    notes.append(f"{path}: an index of an earlier version of the dedup job (with the state "
                 f"file {state}): replaced by a one-file index; every file is read again")


def _unlink(*paths: str) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def check_index(index) -> dict:
    """Check a dedup index: the file (``Index.verify``) and the job's invariants.

    index: an open Index or a path.  Every document is the marker, a file
    record whose data parses, or a text document; every text file's text is
    stored, and every text is some text file's.  Returns counts (files,
    texts, and files per kind).  Raises CorruptionError naming the first
    broken invariant.  Cost: a full read of the file.
    """
    ix = index if isinstance(index, Index) else Index.open(index, readonly=True)
    try:
        ix.verify()
        files, texts, marker = {}, set(), None
        for key, _, data in ix.documents():
            if key == MARKER_KEY:
                marker = data
            elif isinstance(key, bytes) and key[:1] == TEXT_PREFIX:
                if len(key) != 18 or data:
                    raise CorruptionError(f"dedup text document {key.hex()} is malformed",
                                          database="documents", key=key)
                texts.add(key)
            else:
                files[key] = _FileState.unpack(key, data)
        if marker != _MARKER_DATA % LAYOUT_VERSION:
            raise CorruptionError(f"{ix.path}: dedup marker is {marker!r}", database="documents",
                                  key=MARKER_KEY)
        used = {s.text_key for s in files.values() if s.kind == KIND_TEXT}
        for problem, keys in (("text files without their text", used - texts),
                              ("texts no file uses", texts - used)):
            if keys:
                key = min(keys)
                raise CorruptionError(f"{ix.path}: {len(keys)} {problem} (first: {key.hex()})",
                                      database="documents", key=key)
        kinds = collections.Counter(s.kind for s in files.values())
        return dict(files=len(files), texts=len(texts), text_files=kinds[KIND_TEXT],
                    plain_files=kinds[KIND_PLAIN], binary_files=kinds[KIND_BINARY],
                    undecodable_files=kinds[KIND_UNDECODABLE])
    finally:
        if ix is not index:
            ix.close()


# -- the job ---------------------------------------------------------------------


def dedup(paths: Iterable, *, index=None, k: int | None = None, threshold: float | None = None,
          follow_symlinks: bool = False, min_size: int = DEFAULT_MIN_SIZE_BYTES,
          max_size: int = DEFAULT_MAX_SIZE_BYTES, include_binary: bool = False,
          decompress: bool = True, max_candidates: int = DEFAULT_MAX_CANDIDATES,
          jobs: int | None = 1, progress: Callable[[str, int, int], None] | None = None,
          ) -> DedupResult:
    """Find exact and near-duplicate files under paths; return a DedupResult.

    Parameters:
        paths: files and directories (str, bytes or os.PathLike).
        index: the index file to keep between runs (default
            :func:`default_index_path`); it holds all the job remembers.
            One index may serve different paths: files outside this run's
            paths are remembered, not reported, and forgotten once gone.
        k: the simhash distance a new index's tables answer (``ndindex
            query``; default DEFAULT_INDEX_K), 0..plan.MAX_PLANNER_K and at
            most an existing index's k.  Near-duplicates do not depend on it.
        threshold: Jaccard similarity of word 3-shingles a near-duplicate
            must reach, in (0, 1] (default the fingerprinter's, 0.8).  An
            index made for a higher threshold is replaced (every file is
            read again).
        follow_symlinks: follow symbolic links to what no real name reaches
            (a symlink to a file found anyway is listed as its link).
        min_size, max_size: only files of this many bytes (inclusive); a
            compressed file must also decompress to at most max_size.
        include_binary: also report byte-identical binary (and undecodable) files.
        decompress: read .gz, .bz2, .xz, .lzma and .zst files as the text
            inside (otherwise they are binary).
        max_candidates: near-duplicates linked per text, the most similar first.
        jobs: processes reading files (None: one per CPU); texts are
            fingerprinted in this process.
        progress: called as progress(phase, done, total) now and then.

    Returns a :class:`DedupResult`: its ``clusters`` (iterate it for them),
    each file counted once by category, and the files it could not read
    (``errors``, not raised).  Raises OSError when a path does not exist,
    NdindexError when the index is unusable (ReadOnlyError when it cannot be
    written), ValueError for bad parameters.  Cost: one read of every new or
    changed file and one fingerprinting of each new text; a pass over every
    stored document for the pairs (O(files) time and memory, plus the
    pairs found); a re-run over an unchanged tree reads no file.
    """
    t0 = time.perf_counter()
    roots = [os.fsencode(os.path.abspath(os.fsdecode(p))) for p in paths]
    if not roots:
        raise ValueError("dedup needs at least one path")
    if min_size < 0 or max_size < min_size:
        raise ValueError(f"size limits must satisfy 0 <= min_size <= max_size, got "
                         f"{min_size} and {max_size}")
    base = Fingerprinter()
    threshold = base.threshold if threshold is None else float(threshold)
    if k is not None:
        k = check_k(k)
    validate.progress(progress)
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be at least 1, got {max_candidates}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs must be a positive int, or None for one per CPU, got {jobs!r}")
    opts = Options(follow_symlinks, int(min_size), int(max_size), bool(include_binary),
                    bool(decompress))
    index_path = os.fsdecode(index) if index is not None else default_index_path(roots)
    os.makedirs(os.path.dirname(os.path.abspath(index_path)) or ".", exist_ok=True)
    result = DedupResult(clusters=[], index_path=index_path)
    db = _DedupIndex.open(index_path, base, k, threshold, result.notes)
    try:
        exclude = {os.fsencode(os.path.abspath(p)) for p in (index_path, index_path + "-lock")}
        found = Walk(opts, exclude, result, progress).run(roots)
        todo = []
        for item in found:
            known = db.files.get(index_key(item.path))
            if known is None or (known.size, known.mtime_ns) != (item.size, item.mtime_ns):
                todo.append(item)
            elif known.kind in _KIND_SKIP and not include_binary:
                tally(result.skipped, _KIND_SKIP[known.kind])
            else:
                result.files_unchanged += 1
        walked = {index_key(item.path) for item in found}
        # A path too long to keep (known by its digest only) cannot be looked
        # for: it is forgotten when a run does not find it.
        gone = [key for key, s in db.files.items() if key not in walked
                and (s.path is None or not os.path.lexists(s.path))]
        result.files_removed = len(gone)
        db.forget(gone)
        _ingest(db, todo, opts, jobs, result, progress)
        result.files_scanned = result.files_read + result.files_unchanged
        if progress is not None:
            progress("compare", 0, 1)
        pairs = _capped(db.text_pairs(threshold), max_candidates)
        if progress is not None:
            progress("compare", 1, 1)
        result.clusters = _clusters(db, found, include_binary, pairs)
    finally:
        db.close()
    result.seconds = time.perf_counter() - t0
    return result


def _ingest(db: _DedupIndex, todo: list, opts: Options, jobs, result: DedupResult,
            progress) -> None:
    """Read the new and changed files and store them.

    A batch is stored when it holds BATCH_FILES files or BATCH_TEXT_CHARS
    characters of text, or COMMIT_SECONDS have passed since the last store,
    so an interrupted run keeps what it read up to the last second or so.
    """
    batch: list = []
    chars = 0
    last = _clock()
    done = 0
    for record in examined(todo, opts, jobs):
        batch.append(record)
        chars += len(record.text or "")
        done += 1
        if len(batch) >= BATCH_FILES or chars >= BATCH_TEXT_CHARS \
                or _clock() - last >= COMMIT_SECONDS:
            _store(db, batch, result)
            batch, chars = [], 0
            last = _clock()
            if progress is not None:
                progress("read", done, len(todo))
    _store(db, batch, result)
    if progress is not None and todo:
        progress("read", done, len(todo))


def _store(db: _DedupIndex, records: list, result: DedupResult) -> None:
    """Store a batch, then count each file in one category."""
    if not records:
        return
    db.store(records)
    for r in records:
        result.bytes_read += r.size
        if r.error is not None:
            result.errors.append((os.fsdecode(r.path), r.error))
        elif r.skip is not None:
            tally(result.skipped, r.skip)
        else:
            result.files_read += 1


def _capped(pairs: list, limit: int) -> list:
    """Keep each text's `limit` most similar pairs: a pair stays when it is
    among the `limit` best of either of its texts.

    This bounds the links of a text that has very many near-duplicates (a
    license copied with thousands of different copyright lines); the
    clusters stay connected through the pairs kept.
    """
    seen: collections.Counter = collections.Counter()
    out = []
    for a, b, s in sorted(pairs, key=lambda p: (-p[2], p[0], p[1])):
        if seen[a] < limit or seen[b] < limit:
            out.append((a, b, s))
        seen[a] += 1
        seen[b] += 1
    return out


def _clusters(db: _DedupIndex, found: list, include_binary: bool, pairs: list) -> list:
    """Join exact groups and near-duplicate texts among this run's files into clusters.

    Remembered files outside this run's paths take no part: a pair of texts
    links files only when both texts belong to files of this run.  Returns
    the clusters, largest first, each with its representative first.
    """
    kinds = (KIND_TEXT, KIND_PLAIN) + ((KIND_BINARY, KIND_UNDECODABLE) if include_binary else ())
    rows = []                                   # (path, state, links), by path
    for item in found:
        state = db.files.get(index_key(item.path))
        if state is not None and state.kind in kinds:
            rows.append((item.path, state, tuple((os.fsdecode(p), kind) for p, kind in item.links)))
    rows.sort(key=lambda row: row[0])
    left, right = [], []
    first_of_hash: dict = {}
    first_of_text: dict = {}
    for n, (_, state, _) in enumerate(rows):
        if state.content_hash in first_of_hash:
            left.append(first_of_hash[state.content_hash])
            right.append(n)
        else:
            first_of_hash[state.content_hash] = n
        if state.kind == KIND_TEXT:
            first_of_text.setdefault(state.text_key, n)
    verified = {}
    for a, b, sim in pairs:
        if a in first_of_text and b in first_of_text:
            left.append(first_of_text[a])
            right.append(first_of_text[b])
            verified[(min(a, b), max(a, b))] = sim
    out = []
    for members in clusters_from_pairs(len(rows), left, right):
        # representative first: the largest file, the first path among equals
        members = sorted(members.tolist(), key=lambda m: (-rows[m][1].size, m))
        members = members[:1] + sorted(members[1:])
        states = [rows[m][1] for m in members]
        simhashes = db.simhashes([s.text_key for s in states if s.kind == KIND_TEXT])
        files = tuple(DuplicateFile(os.fsdecode(rows[m][0]), s.size, s.content_hash.hex(),
                                    simhashes.get(s.text_key), rows[m][2])
                      for m, s in zip(members, states))
        out.append(Cluster(files, tuple(_cluster_pairs(db, states, files, verified))))
    out.sort(key=lambda c: (-len(c.files), c.files[0].path))
    return out


def _cluster_pairs(db: _DedupIndex, states: list, files: tuple, verified: dict) -> list:
    """Return the Pairs of a cluster: the representative with every other file,
    and all pairs of a small cluster or the verified links of a large one."""
    text_of = [s.text_key for s in states]
    wanted = {(0, y) for y in range(1, len(files))}
    if len(files) <= MAX_PAIRWISE_FILES:
        wanted |= {(x, y) for x in range(len(files)) for y in range(x + 1, len(files))}
    else:
        first = {}
        for n, t in enumerate(text_of):
            if t is not None:
                first.setdefault(t, n)
        wanted |= {tuple(sorted((first[a], first[b]))) for a, b in verified
                   if a in first and b in first}
    out = []
    for x, y in sorted(wanted):
        fa, fb = files[x], files[y]
        exact = fa.content_hash == fb.content_hash
        dist = None if fa.simhash is None or fb.simhash is None \
            else (fa.simhash ^ fb.simhash).bit_count()
        ta, tb = text_of[x], text_of[y]
        if exact:
            sim = 1.0
        elif ta is None or tb is None:
            sim = 0.0
        elif ta == tb:
            sim = 1.0
        else:
            sim = verified.get((min(ta, tb), max(ta, tb)))
            if sim is None:                      # linked through other files
                sim = db.similarity(ta, tb)
        out.append(Pair(x, y, dist, float(sim), exact))
    return out
