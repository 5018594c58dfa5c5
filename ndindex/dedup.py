"""The dedup job: exact and near-duplicate files in directory trees.

``dedup(paths)`` walks the trees, fingerprints text-like files with the
default near-duplicate pipeline of :class:`ndindex.fingerprint.Fingerprinter`
(simhash candidates within k bits, kept when the bottom-k Jaccard of word
3-shingles reaches the threshold), finds exact duplicates by a BLAKE2b
content hash, and joins both kinds of links into clusters with union-find
(:mod:`ndindex.cluster`).

Two files hold the job's memory, so that a re-run reads only what changed:

* the index (``--index FILE``, an ordinary ndindex file) maps simhash ->
  document keys (the paths) and answers the k-bit candidate queries;
* the state file ``<index>.files``, an SQLite database beside it, holds one
  row per file (path, size, mtime_ns, content hash, simhash, sketch) and
  the verified near-duplicate pairs.

Why SQLite for the state and not the index file: the state is a relational
table keyed by path, updated and deleted by path, with a secondary lookup
by content hash -- what SQLite is for -- while the index stores fingerprint
-> keys and must keep its own format (FORMAT.md) free of one application's
bookkeeping.

Crash safety (Ctrl-C included).  Files are processed in batches; for each
batch the job (1) records the batch's index keys in the state's ``pending``
table and commits, (2) removes those keys from the index and adds the new
fingerprints (each one LMDB transaction), (3) writes the file rows, drops
the pending keys and commits.  An interruption anywhere leaves pending keys
behind; the next run first removes them from the index and forgets their
state rows, so those files are read again and index and state agree.
Near-duplicate pairs are computed for rows flagged ``paired = 0`` and the
flag is set in the same SQLite transaction as the pairs, so an interrupted
pairing step resumes where it stopped.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import os
import signal
import sqlite3
import stat
import time
from typing import Callable, Iterable, Sequence

import numpy as np

from ndindex.cluster import clusters_from_pairs
from ndindex.errors import NdindexError
from ndindex.fingerprint import Fingerprinter, looks_binary
from ndindex.index import Index

#: Default size limits of the files considered, in bytes (inclusive).
DEFAULT_MIN_SIZE_BYTES = 1
DEFAULT_MAX_SIZE_BYTES = 64 << 20
#: Files per ingest batch: one index transaction and one state commit each.
BATCH_FILES = 2048
#: Queries per near-duplicate pairing step (one state commit each).
PAIR_BATCH_FILES = 4096
#: Queries per index call while pairing (bounds the matches held at once).
QUERY_BATCH_FILES = 256
#: Candidates verified per file, nearest first (see _pair).
DEFAULT_MAX_CANDIDATES = 64
#: The verification prefilter: sketch prefix compared first, and how far
#: below the threshold its estimate may fall before a pair is dropped.
PREFILTER_VALUES = 32
PREFILTER_MARGIN = 0.3
#: Clusters up to this many files report every pairwise distance; larger
#: ones report the links that joined them.
MAX_PAIRWISE_FILES = 16
#: The index is planned for this many distinct fingerprints at first.
DEFAULT_EXPECTED_FILES = 1_000_000
#: Version of the state file's schema (meta "schema").
STATE_SCHEMA_VERSION = 1
#: A file that keeps changing while it is read is skipped after this many tries.
READ_ATTEMPTS = 2
#: Document keys are at most 500 bytes (store.MAX_DOC_KEY_BYTES); longer
#: paths are keyed by a digest, prefixed by a NUL that no path contains.
MAX_PATH_KEY_BYTES = 500

#: Extensions read as text (after a binary sniff: a .txt full of NULs is binary).
TEXT_EXTENSIONS = frozenset("""
txt text md markdown rst adoc asciidoc org tex latex bib rtf csv tsv log nfo me
html htm xhtml xml svg json jsonl yaml yml toml ini cfg conf properties env
py pyi pyx c h cc cpp cxx hh hpp hxx m mm java kt kts scala groovy go rs rb pl pm
php js mjs cjs ts tsx jsx vue css scss sass less sh bash zsh fish ps1 bat cmd
lua r jl swift cs fs vb sql el clj cljs erl ex exs hs ml mli nim zig d dart
f f90 pas cmake mk make in am ac diff patch po pot srt vtt man 1 2 3 4 5 6 7 8
""".split())
#: Extensions skipped without reading unless binaries are asked for.
BINARY_EXTENSIONS = frozenset("""
png jpg jpeg gif bmp ico webp tif tiff psd heic avif pdf ps eps djvu
zip gz tgz bz2 xz zst lz4 lzma 7z rar tar jar war ear whl egg apk deb rpm dmg iso img
exe dll so dylib o a lib obj pyc pyo pyd class wasm beam elc
mp3 mp4 m4a m4v mkv avi mov webm wav flac ogg oga opus aac wma wmv flv
woff woff2 ttf otf eot sqlite sqlite3 db ndx lmdb mdb parquet npy npz pkl pickle
doc docx xls xlsx ppt pptx odt ods odp
""".split())
HTML_EXTENSIONS = frozenset(("html", "htm", "xhtml"))

# File kinds in the state (files.kind).
KIND_TEXT = 0      # fingerprinted: in the index, near and exact duplicates
KIND_PLAIN = 1     # text without shingles (too short): exact duplicates only
KIND_BINARY = 2    # binary: exact duplicates only, and only with include_binary

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value BLOB);
CREATE TABLE IF NOT EXISTS files(
    id INTEGER PRIMARY KEY,
    path BLOB NOT NULL UNIQUE,      -- os.fsencode(path): names need not be UTF-8
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    content_hash BLOB NOT NULL,     -- BLAKE2b-128 of the bytes
    simhash INTEGER,                -- signed 64-bit view of the fingerprint
    sketch BLOB,                    -- bottom-k sketch, uint32 little-endian
    prefix BLOB,                    -- its first PREFILTER_VALUES values (kept in memory)
    paired INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS files_hash ON files(content_hash);
CREATE INDEX IF NOT EXISTS files_unpaired ON files(paired) WHERE paired = 0;
CREATE TABLE IF NOT EXISTS pairs(
    a INTEGER NOT NULL, b INTEGER NOT NULL, distance INTEGER NOT NULL,
    similarity REAL NOT NULL, PRIMARY KEY (a, b)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS pairs_b ON pairs(b);
CREATE TABLE IF NOT EXISTS pending(path BLOB PRIMARY KEY);
"""


# -- results ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DuplicateFile:
    """One file of a cluster.

    ``path`` is a str (undecodable bytes as surrogate escapes, so it works
    with ``open()``); ``display_path`` is printable (bad bytes as ``\\xNN``).
    """

    path: str
    size: int
    content_hash: str
    simhash: int | None

    @property
    def display_path(self) -> str:
        return display_path(self.path)


@dataclasses.dataclass(frozen=True)
class Pair:
    """A link between files ``a`` and ``b`` (positions in the cluster's files).

    ``distance`` is the Hamming distance of the simhashes (None for binary
    files), ``similarity`` the Jaccard estimate of the sketches (1.0 for
    identical bytes), ``exact`` whether the bytes are identical.
    """

    a: int
    b: int
    distance: int | None
    similarity: float
    exact: bool


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A group of duplicate files: identical bytes, or near-duplicates, or both."""

    files: tuple
    pairs: tuple

    @property
    def kind(self) -> str:
        """"exact" if all files are byte-identical, "near" otherwise."""
        return "exact" if len({f.content_hash for f in self.files}) == 1 else "near"

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

    Iterating over it yields the clusters.
    """

    clusters: list
    index_path: str
    files_scanned: int = 0
    files_read: int = 0
    files_unchanged: int = 0
    files_removed: int = 0
    bytes_read: int = 0
    skipped: dict = dataclasses.field(default_factory=dict)
    errors: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def __iter__(self):
        return iter(self.clusters)

    def __len__(self):
        return len(self.clusters)

    @property
    def duplicate_files(self) -> int:
        """Files beyond the first of each cluster."""
        return sum(len(c.files) - 1 for c in self.clusters)


def display_path(path) -> str:
    """Return a printable form of a path: undecodable bytes as ``\\xNN``."""
    raw = os.fsencode(path)
    return raw.decode("utf-8", "backslashreplace")


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


# -- walking -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Options:
    follow_symlinks: bool
    min_size: int
    max_size: int
    include_binary: bool
    fingerprinter: Fingerprinter
    html_fingerprinter: Fingerprinter


def _extension(name: bytes) -> str:
    base = name.rsplit(b"/", 1)[-1]
    dot = base.rfind(b".")
    return base[dot + 1:].decode("ascii", "replace").lower() if dot > 0 else ""


def _walk(roots: Sequence[bytes], opts: _Options, exclude: set, skipped: dict, errors: list):
    """Yield (path, size, mtime_ns) of the regular files under roots, sorted per directory.

    Symlinks are skipped unless follow_symlinks; then directories and files
    are remembered by (st_dev, st_ino), so a loop or a second link to a
    visited tree is entered once.  Hard links to one file count once.
    """
    seen_dirs: set = set()
    seen_files: set = set()

    def skip(reason):
        skipped[reason] = skipped.get(reason, 0) + 1

    def visit_file(path: bytes, st) -> tuple | None:
        if not stat.S_ISREG(st.st_mode):
            skip("special")
            return None
        if (st.st_dev, st.st_ino) in seen_files:
            skip("hard link")
            return None
        seen_files.add((st.st_dev, st.st_ino))
        if path in exclude:
            skip("index")
            return None
        if st.st_size < opts.min_size:
            skip("too small")
            return None
        if st.st_size > opts.max_size:
            skip("too large")
            return None
        if not opts.include_binary and _extension(path) in BINARY_EXTENSIONS:
            skip("binary")
            return None
        return (path, st.st_size, st.st_mtime_ns)

    stack = []
    for root in roots:
        try:
            st = os.stat(root) if opts.follow_symlinks else os.lstat(root)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, os.fsdecode(root)) from None
        if stat.S_ISDIR(st.st_mode):
            stack.append(root)
            seen_dirs.add((st.st_dev, st.st_ino))
        elif stat.S_ISLNK(st.st_mode):
            skip("symlink")
        else:
            found = visit_file(root, st)
            if found:
                yield found
    # depth first, names in sorted order, so output and batches are stable
    stack.reverse()
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            errors.append((os.fsdecode(directory), exc.strerror or str(exc)))
            continue
        subdirs = []
        for entry in entries:
            try:
                if entry.is_symlink():
                    if not opts.follow_symlinks:
                        skip("symlink")
                        continue
                    st = entry.stat(follow_symlinks=True)
                else:
                    st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                if entry.is_symlink():
                    skip("broken symlink")
                else:
                    errors.append((os.fsdecode(entry.path), exc.strerror or str(exc)))
                continue
            if stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in seen_dirs:
                    skip("symlink loop")
                    continue
                seen_dirs.add((st.st_dev, st.st_ino))
                subdirs.append(entry.path)
            else:
                found = visit_file(entry.path, st)
                if found:
                    yield found
        stack.extend(reversed(subdirs))


# -- reading and fingerprinting ------------------------------------------------


class _Changed(Exception):
    """The file changed while it was read."""


def _read_file(path: bytes, follow_symlinks: bool, max_size: int) -> tuple[bytes, int, int]:
    """Return (content, size, mtime_ns) of a regular file, read in one go.

    Opens without following a symlink (unless follow_symlinks) and without
    blocking (a FIFO put in place of the file is refused, not waited on);
    raises _Changed when size or mtime moved while reading.
    """
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise _Changed("no longer a regular file")
        if before.st_size > max_size:
            raise _Changed(f"grew to {before.st_size} bytes, above the size limit")
        chunks = []
        remaining = max_size + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns) \
            or len(data) != after.st_size:
        raise _Changed("changed while being read")
    return data, after.st_size, after.st_mtime_ns


@dataclasses.dataclass
class _Record:
    path: bytes
    size: int
    mtime_ns: int
    kind: int = KIND_TEXT
    content_hash: bytes = b""
    simhash: int | None = None
    sketch: bytes | None = None
    error: str | None = None      # unreadable: the reason
    skip: str | None = None       # not considered: the reason


def _examine(item: tuple, opts: _Options) -> _Record:
    """Read one file and fingerprint it; never raises for the file's sake."""
    path, size, mtime_ns = item
    rec = _Record(path, size, mtime_ns)
    for attempt in range(READ_ATTEMPTS):
        try:
            data, rec.size, rec.mtime_ns = _read_file(path, opts.follow_symlinks, opts.max_size)
            break
        except _Changed as exc:
            if attempt == READ_ATTEMPTS - 1:
                rec.error = str(exc)
                return rec
        except OSError as exc:
            rec.error = exc.strerror or str(exc)
            return rec
    rec.content_hash = hashlib.blake2b(data, digest_size=16).digest()
    ext = _extension(path)
    if looks_binary(data):    # also for text extensions: a .txt full of NULs is binary
        rec.kind = KIND_BINARY
        if not opts.include_binary:
            rec.skip = "binary"
        return rec
    fp = opts.html_fingerprinter if ext in HTML_EXTENSIONS else opts.fingerprinter
    simhash, sketch = fp.fingerprint(data)
    if len(sketch) == 0:
        rec.kind = KIND_PLAIN      # no shingles to compare: exact duplicates only
        return rec
    rec.simhash = int(simhash)
    rec.sketch = np.asarray(sketch, dtype="<u4").tobytes()
    return rec


def _examine_many(items: list, opts: _Options) -> list:
    return [_examine(item, opts) for item in items]


def _ignore_sigint() -> None:
    # Workers leave Ctrl-C to the parent, which stops the pool and keeps
    # the files consistent; a worker's own traceback would only be noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# -- the state file --------------------------------------------------------------


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _unsigned(v: int) -> int:
    return v + (1 << 64) if v < 0 else v


def index_key(path: bytes):
    """Return the index's document key for a path: str if UTF-8, else bytes.

    Paths longer than MAX_PATH_KEY_BYTES are keyed by NUL + their BLAKE2b-256.
    """
    if len(path) > MAX_PATH_KEY_BYTES:
        return b"\0" + hashlib.blake2b(path, digest_size=32).digest()
    try:
        return path.decode("utf-8")
    except UnicodeDecodeError:
        return path


class _State:
    """The state file: one SQLite database (see the module docstring)."""

    def __init__(self, path: str):
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        schema = self.get_meta("schema")
        if schema is None:
            self.set_meta("schema", STATE_SCHEMA_VERSION)
        elif int(schema) > STATE_SCHEMA_VERSION:
            raise NdindexError(f"{path}: state schema {int(schema)} > supported "
                               f"{STATE_SCHEMA_VERSION}")

    def close(self) -> None:
        self.db.close()

    def get_meta(self, key: str):
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def reset(self) -> None:
        with self.transaction():
            self.db.execute("DELETE FROM files")
            self.db.execute("DELETE FROM pairs")
            self.db.execute("DELETE FROM pending")

    def transaction(self):
        return _Transaction(self.db)

    def known(self) -> dict:
        """path -> (id, size, mtime_ns) for every row."""
        return {bytes(p): (i, s, m) for i, p, s, m in
                self.db.execute("SELECT id, path, size, mtime_ns FROM files")}


class _Transaction:
    def __init__(self, db):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, exc, tb):
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


# -- the job ---------------------------------------------------------------------


def dedup(paths: Iterable, *, index=None, k: int | None = None, threshold: float | None = None,
          follow_symlinks: bool = False, min_size: int = DEFAULT_MIN_SIZE_BYTES,
          max_size: int = DEFAULT_MAX_SIZE_BYTES, include_binary: bool = False,
          max_candidates: int = DEFAULT_MAX_CANDIDATES, jobs: int | None = 1, progress: Callable[[str, int, int], None] | None = None,
          ) -> DedupResult:
    """Find exact and near-duplicate files under paths; return the clusters.

    Parameters:
        paths: files and directories (str, bytes or os.PathLike).
        index: the index file to keep between runs (default
            :func:`default_index_path`); its state lives in ``<index>.files``.
        k: simhash candidates within k bits (default the fingerprinter's
            query_k, 10); at most the index's k.
        threshold: Jaccard similarity of word 3-shingles a candidate must
            reach (default the fingerprinter's, 0.8).
        follow_symlinks: follow symbolic links (loops are detected).
        min_size, max_size: only files of this many bytes (inclusive).
        include_binary: also report byte-identical binary files.
        max_candidates: index candidates verified per file, nearest first.
        jobs: processes reading and fingerprinting (None: one per CPU).
        progress: called as progress(phase, done, total) now and then.

    Returns a :class:`DedupResult` (iterate it for the clusters).  Files that
    cannot be read are listed in ``result.errors``, not raised.  Raises
    OSError when a path does not exist, NdindexError when the index or its
    state file is unusable, ValueError for bad parameters.  Cost: one read
    of every new or changed file and one index query per such file; a
    re-run over an unchanged tree reads no file.
    """
    t0 = time.perf_counter()
    roots = [os.fsencode(os.path.abspath(os.fsdecode(p))) for p in paths]
    if not roots:
        raise ValueError("dedup needs at least one path")
    if min_size < 0 or max_size < min_size:
        raise ValueError(f"size limits must satisfy 0 <= min_size <= max_size, got "
                         f"{min_size} and {max_size}")
    base = Fingerprinter()
    k = base.query_k if k is None else int(k)
    threshold = base.threshold if threshold is None else float(threshold)
    if not 0 <= k <= 64 or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"k must be in 0..64 and threshold in [0, 1], got {k} and {threshold}")
    opts = _Options(follow_symlinks, int(min_size), int(max_size), bool(include_binary), base,
                    dataclasses.replace(base, html=True))
    index_path = os.fspath(index) if index is not None else default_index_path(roots)
    os.makedirs(os.path.dirname(os.path.abspath(index_path)) or ".", exist_ok=True)
    state_path = index_path + ".files"
    ix, state = _open_files(index_path, state_path, base, k)
    result = DedupResult(clusters=[], index_path=index_path)
    try:
        _recover(ix, state)
        _check_options(state, k, threshold, max_candidates)
        exclude = {os.fsencode(os.path.abspath(p)) for p in
                   (index_path, state_path, index_path + "-lock", state_path + "-wal",
                    state_path + "-shm", state_path + "-journal")}
        walked = []
        for item in _walk(roots, opts, exclude, result.skipped, result.errors):
            walked.append(item)
            if progress is not None and len(walked) % 1000 == 0:
                progress("scan", len(walked), 0)
        result.files_scanned = len(walked)
        known = state.known()
        todo = [item for item in walked
                if known.get(item[0], (None, None, None))[1:] != (item[1], item[2])]
        result.files_unchanged = len(walked) - len(todo)
        present = {item[0] for item in walked}
        vanished = [p for p in known if p not in present]
        result.files_removed = len(vanished)
        _drop_files(ix, state, vanished)
        _ingest(ix, state, todo, opts, jobs, result, progress)
        _pair(ix, state, base, k, threshold, max_candidates, progress)
        result.clusters = _clusters(state, include_binary, base)
    finally:
        state.close()
        ix.close()
    result.seconds = time.perf_counter() - t0
    return result


def _open_files(index_path: str, state_path: str, fp: Fingerprinter, k: int):
    """Open (or create) the state file, then the index; reset a state orphaned
    by a deleted index.  The state is created first, so an index never exists
    without one unless it was not made by dedup."""
    index_exists = os.path.exists(index_path)
    if index_exists and not os.path.exists(state_path):
        raise NdindexError(f"{index_path}: an index without a dedup state file ({state_path}); "
                           "use another --index, or delete it")
    try:
        state = _State(state_path)
    except sqlite3.DatabaseError as exc:
        raise NdindexError(f"{state_path}: unusable dedup state file ({exc})") from exc
    try:
        if index_exists:
            ix = Index.open(index_path)
            if ix.fingerprinter is None:
                ix.close()
                raise NdindexError(f"{index_path}: not a dedup index (no fingerprinter); "
                                   "use another --index")
            if _comparable(ix.fingerprinter) != _comparable(fp.to_bytes()):
                # Made by dedup (it has our state file) with another pipeline,
                # e.g. by an older version: its fingerprints cannot be compared
                # with new ones, so both files start again (a full re-read).
                ix.close()
                for extra in ("", "-lock"):
                    if os.path.exists(index_path + extra):
                        os.unlink(index_path + extra)
                index_exists = False
        if not index_exists:
            state.reset()
            ix = Index.create(index_path, k=max(k, fp.query_k), expected_n=DEFAULT_EXPECTED_FILES,
                              fingerprinter=fp.to_bytes())
        if k > ix.k:
            ix.close()
            raise ValueError(f"k={k} is above the index's k={ix.k}; use another --index")
        # Queries at k = 10 scan hundreds of entries per table; decoded
        # tables (8 bytes per file per table) make that a popcount scan.
        ix.preload()
    except BaseException:
        state.close()
        raise
    return ix, state


def _comparable(raw: bytes) -> bytes:
    # The unicode_version field is informative ([FP50]): a Python upgrade must
    # not orphan an index.  The flip model only orders probes ([FP80]), so an
    # index written before it existed stays usable.  Every other field must match.
    cfg = Fingerprinter.from_bytes(raw).to_dict()
    cfg.pop("unicode_version", None)
    cfg.pop("flip_model", None)
    return repr(sorted(cfg.items())).encode()


def _recover(ix: Index, state: _State) -> None:
    """Undo an interrupted batch: its keys leave the index and its rows the state."""
    paths = [bytes(r[0]) for r in state.db.execute("SELECT path FROM pending")]
    if not paths:
        return
    ix.remove(keys=[index_key(p) for p in paths])
    with state.transaction() as db:
        for p in paths:
            row = db.execute("SELECT id FROM files WHERE path = ?", (p,)).fetchone()
            if row is not None:
                _delete_rows(db, [row[0]])
        db.execute("DELETE FROM pending")


def _check_options(state: _State, k: int, threshold: float, max_candidates: int) -> None:
    """Pairs verified under another k or threshold are computed again (no re-read)."""
    current = f"k={k} threshold={threshold!r} max_candidates={max_candidates}"
    if state.get_meta("pairing") != current:
        with state.transaction() as db:
            db.execute("DELETE FROM pairs")
            db.execute("UPDATE files SET paired = 0")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('pairing', ?)", (current,))


def _delete_rows(db, ids: list) -> None:
    """Delete file rows and their pairs."""
    for i in ids:
        db.execute("DELETE FROM pairs WHERE a = ? OR b = ?", (i, i))
        db.execute("DELETE FROM files WHERE id = ?", (i,))


def _drop_files(ix: Index, state: _State, paths: list) -> None:
    """Forget files that disappeared (or no longer qualify): index first, then state."""
    for start in range(0, len(paths), BATCH_FILES):
        part = paths[start:start + BATCH_FILES]
        with state.transaction() as db:
            db.executemany("INSERT OR IGNORE INTO pending VALUES (?)", [(p,) for p in part])
        ix.remove(keys=[index_key(p) for p in part])
        with state.transaction() as db:
            ids = [r[0] for p in part
                   for r in db.execute("SELECT id FROM files WHERE path = ?", (p,))]
            _delete_rows(db, ids)
            db.execute("DELETE FROM pending")


def _batches(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _ingest(ix: Index, state: _State, todo: list, opts: _Options, jobs, result: DedupResult,
            progress) -> None:
    """Read, fingerprint and store the new and changed files, batch by batch."""
    if not todo:
        return
    workers = (os.cpu_count() or 1) if jobs is None else max(1, int(jobs))
    workers = min(workers, max(1, len(todo) // 64))
    pool = None
    if workers > 1:
        pool = concurrent.futures.ProcessPoolExecutor(workers, initializer=_ignore_sigint)
    done = 0
    try:
        for batch in _batches(todo, BATCH_FILES):
            if pool is None:
                records = _examine_many(batch, opts)
            else:
                step = max(1, len(batch) // (4 * workers))
                work = functools.partial(_examine_many, opts=opts)
                records = [r for part in pool.map(work, _batches(batch, step)) for r in part]
            _store_batch(ix, state, records, result)
            done += len(batch)
            if progress is not None:
                progress("read", done, len(todo))
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _store_batch(ix: Index, state: _State, records: list, result: DedupResult) -> None:
    """Write one batch: pending keys, index remove + add, then the rows (see module doc)."""
    keys = [index_key(r.path) for r in records]
    with state.transaction() as db:
        db.executemany("INSERT OR IGNORE INTO pending VALUES (?)", [(r.path,) for r in records])
    ix.remove(keys=keys)     # a changed file's old fingerprint, or a crashed run's leftovers
    indexed = [(r.simhash, key) for r, key in zip(records, keys)
               if r.error is None and r.skip is None and r.kind == KIND_TEXT]
    if indexed:
        ix.add([fp for fp, _ in indexed], keys=[key for _, key in indexed])
    with state.transaction() as db:
        for r in records:
            old = db.execute("SELECT id, content_hash FROM files WHERE path = ?",
                             (r.path,)).fetchone()
            if r.error is not None or (r.skip is not None and r.kind != KIND_BINARY):
                if old is not None:
                    _delete_rows(db, [old[0]])
                if r.error is not None:
                    result.errors.append((os.fsdecode(r.path), r.error))
                continue
            result.files_read += 1
            result.bytes_read += r.size
            if r.skip is not None:
                result.skipped[r.skip] = result.skipped.get(r.skip, 0) + 1
            row = (r.size, r.mtime_ns, r.kind, r.content_hash,
                   None if r.simhash is None else _signed(r.simhash), r.sketch,
                   None if r.sketch is None else r.sketch[:4 * PREFILTER_VALUES])
            if old is None:
                db.execute("INSERT INTO files(path, size, mtime_ns, kind, content_hash, simhash, "
                           "sketch, prefix, paired) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)", (r.path, *row))
            else:
                db.execute("DELETE FROM pairs WHERE a = ? OR b = ?", (old[0], old[0]))
                db.execute("UPDATE files SET size = ?, mtime_ns = ?, kind = ?, content_hash = ?, "
                           "simhash = ?, sketch = ?, prefix = ?, paired = 0 WHERE id = ?",
                           (*row, old[0]))
        db.execute("DELETE FROM pending")


def _pair(ix: Index, state: _State, fp: Fingerprinter, k: int, threshold: float,
          max_candidates: int, progress) -> None:
    """Find the verified near-duplicate pairs of every unpaired text file.

    Candidates come from the index (stored simhashes within k bits, nearest
    first, at most max_candidates distinct fingerprints per file), are
    mapped to files through the state, and are kept when their sketches
    reach the threshold.  The cap bounds the work where many unrelated
    files share most of their word frequencies (simhashes of text in one
    language concentrate: a few percent of unrelated documents can lie
    within 10 bits); true near-duplicates are nearly always the nearest.
    Byte-identical candidates are skipped: the exact groups link them.
    Each step commits its pairs with the paired flags.
    """
    rows = state.db.execute("SELECT id, simhash, content_hash, prefix, paired FROM files "
                            "WHERE kind = ?", (KIND_TEXT,)).fetchall()
    todo = np.array([n for n, r in enumerate(rows) if not r[4]], dtype=np.int64)
    if not len(todo):
        return
    # Dense arrays over every text file (row n): ids, simhashes, content
    # groups and sketch prefixes stay in memory; full sketches are read only
    # for the pairs that pass the prefilter.
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    simhashes = np.array([_unsigned(r[1]) for r in rows], dtype=np.uint64)
    groups: dict = {}
    group = np.array([groups.setdefault(bytes(r[2]), len(groups)) for r in rows], dtype=np.int64)
    prefixes = sketch_matrix([np.frombuffer(r[3], dtype="<u4") for r in rows])
    del rows
    order = np.argsort(simhashes, kind="stable")
    sorted_simhashes = simhashes[order]
    done = 0
    for batch in _batches(todo, PAIR_BATCH_FILES):
        found = [_candidates(ix, batch[i:i + QUERY_BATCH_FILES], simhashes, sorted_simhashes,
                             order, group, k, max_candidates)
                 for i in range(0, len(batch), QUERY_BATCH_FILES)]
        a = np.concatenate([f[0] for f in found])
        b = np.concatenate([f[1] for f in found])
        dist = np.concatenate([f[2] for f in found])
        _, first = np.unique(a * len(ids) + b, return_index=True)   # both ends may ask
        a, b, dist = a[first], b[first], dist[first]
        # The PREFILTER_VALUES smallest values of two sketches are the
        # bottom-32 sketches of the same sets: a Jaccard estimate with
        # standard error <= 0.09.  PREFILTER_MARGIN is over 3 of those, so a
        # true pair is lost with probability below 1e-3 at the threshold,
        # and the bulk of candidates, which share almost nothing, never
        # load their full sketches.
        rough = jaccard_many(prefixes, a, b, PREFILTER_VALUES) if len(a) else np.empty(0)
        keep = rough >= threshold - PREFILTER_MARGIN
        a, b, dist = a[keep], b[keep], dist[keep]
        pairs = []
        if len(a):
            need = np.unique(np.concatenate([a, b]))
            sketches = _sketches(state, ids[need].tolist())
            matrix = sketch_matrix([sketches[i] for i in ids[need].tolist()])
            sims = jaccard_many(matrix, np.searchsorted(need, a), np.searchsorted(need, b),
                                fp.bottom_k)
            ok = sims >= threshold
            pairs = list(zip(ids[a[ok]].tolist(), ids[b[ok]].tolist(), dist[ok].tolist(),
                             sims[ok].tolist()))
        with state.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO pairs VALUES (?, ?, ?, ?)", pairs)
            db.executemany("UPDATE files SET paired = 1 WHERE id = ?",
                           [(i,) for i in ids[batch].tolist()])
        done += len(batch)
        if progress is not None:
            progress("compare", done, len(todo))


def _candidates(ix: Index, rows, simhashes, sorted_simhashes, order, group, k: int,
                max_candidates: int):
    """Return (a, b, distance) arrays: row pairs a < b of index candidates.

    Each query keeps its max_candidates + 1 nearest fingerprints (its own is
    one of them); each fingerprint stands for every file that has it; pairs
    of byte-identical files are left to the exact groups.
    """
    matches = ix.query_many(simhashes[rows], k=k)
    q = matches["query"]
    keep = (np.arange(len(q)) - np.searchsorted(q, q, side="left")) <= max_candidates
    qrow = rows[q[keep]]
    fps = matches["fingerprint"][keep]
    dist = matches["distance"][keep].astype(np.int64)
    lo = np.searchsorted(sorted_simhashes, fps, side="left")
    count = np.searchsorted(sorted_simhashes, fps, side="right") - lo
    which = np.repeat(np.arange(len(fps)), count)
    offset = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    crow = order[lo[which] + offset]
    qrow, dist = qrow[which], dist[which]
    ok = group[crow] != group[qrow]
    return np.minimum(qrow, crow)[ok], np.maximum(qrow, crow)[ok], dist[ok]


_SENTINEL = np.int64(1 << 32)


def sketch_matrix(sketches: list) -> np.ndarray:
    """Stack bottom-k sketches into rows padded with a sentinel above every value."""
    width = max((len(v) for v in sketches), default=1) or 1
    out = np.full((len(sketches), width), _SENTINEL, dtype=np.int64)
    for i, v in enumerate(sketches):
        out[i, :len(v)] = v
    return out


def jaccard_many(matrix: np.ndarray, left, right, k: int) -> np.ndarray:
    """Return ``bottom_k_jaccard(rows[left[i]], rows[right[i]], k)`` for every i.

    matrix comes from :func:`sketch_matrix`.  Each pair's two rows are
    merged by a stable sort (timsort merges two sorted runs in one pass);
    the k smallest distinct values of the union are those whose run rank is
    <= k, and a value present in both sketches is a run of two.  Equal to
    Fingerprinter.similarity (the tests check it).
    """
    out = np.empty(len(left))
    for start in range(0, len(left), 8192):     # bounded memory
        a = np.asarray(left[start:start + 8192])
        b = np.asarray(right[start:start + 8192])
        m = np.concatenate([matrix[a], matrix[b]], axis=1)
        m.sort(axis=1)
        same = m[:, 1:] == m[:, :-1]
        same &= m[:, 1:] < _SENTINEL
        distinct = np.ones(m.shape, dtype=bool)
        distinct[:, 1:] = ~same
        distinct &= m < _SENTINEL
        rank = np.cumsum(distinct, axis=1, dtype=np.int32)
        union = np.count_nonzero(distinct & (rank <= k), axis=1)
        both = np.count_nonzero(same & (rank[:, 1:] <= k), axis=1)
        out[start:start + len(a)] = np.where(union > 0, both / np.maximum(union, 1), 1.0)
    return out


def _sketches(state: _State, ids) -> dict:
    out = {}
    ids = sorted(ids)
    for start in range(0, len(ids), 500):
        part = ids[start:start + 500]
        marks = ",".join("?" * len(part))
        for i, blob in state.db.execute(f"SELECT id, sketch FROM files WHERE id IN ({marks})", part):
            out[i] = np.frombuffer(blob, dtype="<u4").astype(np.uint32)
    return out


def _clusters(state: _State, include_binary: bool, fp: Fingerprinter) -> list:
    """Join exact groups and verified pairs into clusters, largest first."""
    kinds = (KIND_TEXT, KIND_PLAIN, KIND_BINARY) if include_binary else (KIND_TEXT, KIND_PLAIN)
    marks = ",".join("?" * len(kinds))
    rows = state.db.execute(f"SELECT id, path, size, content_hash, simhash FROM files "
                            f"WHERE kind IN ({marks}) ORDER BY path", kinds).fetchall()
    pos = {row[0]: n for n, row in enumerate(rows)}
    left, right = [], []
    first_of: dict = {}
    for n, row in enumerate(rows):
        h = bytes(row[3])
        if h in first_of:
            left.append(first_of[h])
            right.append(n)
        else:
            first_of[h] = n
    links = {}
    for a, b, dist, sim in state.db.execute("SELECT a, b, distance, similarity FROM pairs"):
        if a in pos and b in pos:
            left.append(pos[a])
            right.append(pos[b])
            links[(min(pos[a], pos[b]), max(pos[a], pos[b]))] = (dist, sim)
    out = []
    for members in clusters_from_pairs(len(rows), left, right):
        members = members.tolist()
        files = tuple(DuplicateFile(os.fsdecode(bytes(rows[m][1])), rows[m][2],
                                    bytes(rows[m][3]).hex(),
                                    None if rows[m][4] is None else _unsigned(rows[m][4]))
                      for m in members)
        out.append(Cluster(files, tuple(_cluster_pairs(state, members, rows, files, links, fp))))
    out.sort(key=lambda c: (-len(c.files), c.files[0].path))
    return out


def _cluster_pairs(state, members, rows, files, links, fp) -> list:
    if len(members) <= MAX_PAIRWISE_FILES:
        wanted = [(x, y) for x in range(len(members)) for y in range(x + 1, len(members))]
    else:   # the links that joined the cluster: exact chains and verified pairs
        where = {m: n for n, m in enumerate(members)}
        wanted = sorted({(where[a], where[b]) for a, b in links if a in where and b in where}
                        | {(x, y) for x in range(len(files)) for y in [x + 1]
                           if y < len(files) and files[x].content_hash == files[y].content_hash})
    need = {rows[members[x]][0] for pair in wanted for x in pair
            if files[x].simhash is not None}
    sketches = _sketches(state, need)
    out = []
    for x, y in wanted:
        fa, fb = files[x], files[y]
        exact = fa.content_hash == fb.content_hash
        dist = None if fa.simhash is None or fb.simhash is None \
            else (fa.simhash ^ fb.simhash).bit_count()
        if exact:
            sim = 1.0
        elif (members[x], members[y]) in links:
            sim = links[(members[x], members[y])][1]
        elif fa.simhash is not None and fb.simhash is not None:
            sim = fp.similarity(sketches[rows[members[x]][0]], sketches[rows[members[y]][0]])
        else:
            sim = 0.0
        out.append(Pair(x, y, dist, float(sim), exact))
    return out
