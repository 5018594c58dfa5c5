"""The dedup job: exact and near-duplicate files in directory trees.

``dedup(paths)`` walks the trees, reads each text file's text
(:mod:`ndindex.textfile`: compressed files through their decompressor, any
character set), fingerprints it with the default near-duplicate pipeline of
:class:`ndindex.fingerprint.Fingerprinter` (simhash candidates within k bits,
kept when the bottom-k Jaccard of word 3-shingles reaches the threshold),
finds exact duplicates by a BLAKE2b hash of the bytes, and joins both kinds
of links into clusters with union-find (:mod:`ndindex.cluster`).

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

Two files hold the job's memory, so that a re-run reads only what changed:
the index (``--index FILE``, an ordinary ndindex file) maps simhash ->
document keys (the paths) and answers the k-bit candidate queries; the state
file ``<index>.files``, an SQLite database beside it, holds one row per file
(path, size, mtime_ns, kind, content hash, simhash, sketch) and the verified
near-duplicate pairs.  Only :class:`_State` knows where the state lives and
how it is kept consistent with the index; walking, reading, pairing and
reporting go through its methods.

Crash safety (Ctrl-C included).  Files are stored in batches, one at least
every COMMIT_SECONDS: for each batch the state (1) records the batch's index
keys as pending and commits, (2) removes those keys from the index and adds
the new fingerprints (each one LMDB transaction), (3) writes the file rows,
drops the pending keys and commits.  An interruption anywhere leaves pending
keys behind; the next run first removes them from the index and forgets
their rows, so those files are read again and index and state agree.  An
interrupted run keeps every batch committed before it.  Near-duplicate pairs
are computed for rows flagged ``paired = 0`` and the flag is set in the same
transaction as the pairs, so an interrupted pairing step resumes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import os
import signal
import sqlite3
import stat
import time
from typing import Callable, Iterable, Sequence

import numpy as np

from ndindex import textfile
from ndindex.cluster import clusters_from_pairs
from ndindex.errors import NdindexError, ReadOnlyError
from ndindex.fingerprint import Fingerprinter
from ndindex.index import Index
from ndindex.plan import MAX_PLANNER_K

#: Default size limits of the files considered, in bytes (inclusive); a
#: compressed file's limits apply to its size and to its decompressed size.
DEFAULT_MIN_SIZE_BYTES = 1
DEFAULT_MAX_SIZE_BYTES = 64 << 20
#: Most files per stored batch (one index transaction and one state commit).
BATCH_FILES = 2048
#: A batch is stored at least this often, so an interrupted run keeps its work.
COMMIT_SECONDS = 1.0
#: Files per task handed to a worker process.
TASK_FILES = 16
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
#: ones report the links that joined them and each file's link to the
#: representative.
MAX_PAIRWISE_FILES = 16
#: The index is planned for this many distinct fingerprints at first.
DEFAULT_EXPECTED_FILES = 1_000_000
#: Version of the state file's schema (meta "schema").
STATE_SCHEMA_VERSION = 1
#: A file that keeps changing while it is read is skipped after this many tries.
READ_ATTEMPTS = 2
#: Document keys are at most 500 bytes (records.MAX_DOC_KEY_BYTES); longer
#: paths are keyed by a digest, prefixed by a NUL that no path contains.
MAX_PATH_KEY_BYTES = 500

#: Extensions skipped without reading unless binaries are asked for.  The
#: compressed ones (textfile.COMPRESSED_EXTENSIONS) are read as text unless
#: decompression is off or the name inside says binary (x.tar.gz).
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
KIND_TEXT = 0         # fingerprinted: in the index, near and exact duplicates
KIND_PLAIN = 1        # text without shingles (too short): exact duplicates only
KIND_BINARY = 2       # binary: exact duplicates only, and only with include_binary
KIND_UNDECODABLE = 3  # text-like, but no character set decodes it: as binary
#: The skip reason of a file of each kind that is not compared.
_KIND_SKIP = {KIND_BINARY: "binary", KIND_UNDECODABLE: "undecodable"}

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

# The clock that times commits (a test may replace it).
_clock = time.monotonic


# -- results ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DuplicateFile:
    """One file of a cluster.

    ``path`` is a str (undecodable bytes as surrogate escapes, so it works
    with ``open()``); ``display_path`` is printable (bad bytes as ``\\xNN``).
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
    are gone from disk.  Iterating over it yields the clusters.
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


def _count(counts: dict, key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


# -- walking -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Options:
    follow_symlinks: bool
    min_size: int
    max_size: int
    include_binary: bool
    decompress: bool
    fingerprinter: Fingerprinter
    html_fingerprinter: Fingerprinter


def _extensions(name: bytes) -> tuple[str, str]:
    """Return the lower-case extension of a file name and, for a compressed
    file, the extension of the name inside ("x.html.gz" -> ("gz", "html"))."""
    base = name.rsplit(b"/", 1)[-1].decode("ascii", "replace").lower()
    parts = base.split(".")
    outer = parts[-1] if len(parts) > 1 and parts[0] else ""
    inner = parts[-2] if len(parts) > 2 and outer in textfile.COMPRESSED_EXTENSIONS else ""
    return outer, inner


def _binary_by_name(path: bytes, opts: _Options) -> bool:
    outer, inner = _extensions(path)
    if opts.decompress and outer in textfile.COMPRESSED_EXTENSIONS:
        return inner in BINARY_EXTENSIONS
    return outer in BINARY_EXTENSIONS


@dataclasses.dataclass
class _Found:
    """A regular file the walk found: its name, size, mtime and other names."""

    path: bytes
    size: int
    mtime_ns: int
    links: list = dataclasses.field(default_factory=list)   # [(path, kind)]


class _Walk:
    """Walk roots: every regular file once, under its first real name.

    Real entries (not symlinks) are walked first, depth first in sorted
    order; with follow_symlinks the symlinks met are then followed, the
    newest last, to what the real walk did not reach.  Files and directories
    are known by (st_dev, st_ino): a second name of either is a link (a
    loop is a symlink to a directory already walked).
    """

    def __init__(self, opts: _Options, exclude: set, result: DedupResult, progress=None):
        self.opts = opts
        self.progress = progress
        self.exclude = exclude
        self.result = result
        self.files: dict = {}       # (dev, ino) -> _Found, or None when skipped
        self.found: list = []       # the _Found in walk order
        self.dirs: set = set()
        self.pending_dirs: list = []  # directories met, to walk next
        self.symlinks: list = []    # symlinks met, to follow after the real walk

    def run(self, roots: Sequence[bytes]) -> list:
        for root in sorted(set(roots)):
            try:
                st = os.lstat(root)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, os.fsdecode(root)) from None
            self._entry(root, st)
        self._descend()
        while self.symlinks:
            path = self.symlinks.pop(0)
            try:
                st = os.stat(path)
            except OSError:
                _count(self.result.skipped, "broken symlink")
                continue
            self._entry(path, st, via_symlink=True)
            self._descend()
        return self.found

    def _entry(self, path: bytes, st, via_symlink: bool = False) -> None:
        if stat.S_ISLNK(st.st_mode):
            if self.opts.follow_symlinks:
                self.symlinks.append(path)
            else:
                _count(self.result.skipped, "symlink")
        elif stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in self.dirs:
                _count(self.result.links, "symlink")
            else:
                self.dirs.add((st.st_dev, st.st_ino))
                self.pending_dirs.append(path)
        else:
            self._file(path, st, via_symlink)

    def _file(self, path: bytes, st, via_symlink: bool) -> None:
        key = (st.st_dev, st.st_ino)
        if key in self.files:
            kind = "symlink" if via_symlink else "hard link"
            _count(self.result.links, kind)
            if self.files[key] is not None:
                self.files[key].links.append((path, kind))
            return
        reason = self._skip_reason(path, st)
        if reason is not None:
            self.files[key] = None
            _count(self.result.skipped, reason)
            return
        self.files[key] = found = _Found(path, st.st_size, st.st_mtime_ns)
        self.found.append(found)
        if self.progress is not None and len(self.found) % 1000 == 0:
            self.progress("scan", len(self.found), 0)

    def _skip_reason(self, path: bytes, st) -> str | None:
        if not stat.S_ISREG(st.st_mode):
            return "special"
        if path in self.exclude:
            return "index"
        if st.st_size < self.opts.min_size:
            return "too small"
        if st.st_size > self.opts.max_size:
            return "too large"
        if not self.opts.include_binary and _binary_by_name(path, self.opts):
            return "binary"
        return None

    def _descend(self) -> None:
        """Walk the directories queued so far, depth first, names sorted."""
        stack = list(reversed(self.pending_dirs))
        self.pending_dirs = []
        while stack:
            directory = stack.pop()
            try:
                with os.scandir(directory) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                self.result.errors.append((os.fsdecode(directory), exc.strerror or str(exc)))
                continue
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError as exc:
                    self.result.errors.append((os.fsdecode(entry.path),
                                               exc.strerror or str(exc)))
                    continue
                self._entry(entry.path, st)
            stack.extend(reversed(self.pending_dirs))
            self.pending_dirs = []


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
    skip: str | None = None       # not compared: the reason


def _examine(item: _Found, opts: _Options) -> _Record:
    """Read one file and fingerprint it; never raises for the file's sake."""
    rec = _Record(item.path, item.size, item.mtime_ns)
    for attempt in range(READ_ATTEMPTS):
        try:
            data, rec.size, rec.mtime_ns = _read_file(item.path, opts.follow_symlinks,
                                                      opts.max_size)
            break
        except _Changed as exc:
            if attempt == READ_ATTEMPTS - 1:
                rec.error = str(exc)
                return rec
        except OSError as exc:
            rec.error = exc.strerror or str(exc)
            return rec
    rec.content_hash = hashlib.blake2b(data, digest_size=16).digest()
    outer, inner = _extensions(item.path)
    try:
        if opts.decompress and outer in textfile.COMPRESSED_EXTENSIONS:
            data = textfile.decompress(data, outer, opts.max_size)
            outer = inner
        text = textfile.decode(data)
    except textfile.NotText as exc:
        if exc.reason == "corrupt":
            rec.error = str(exc)
        elif exc.reason == "too large":
            rec.skip = "too large"
        else:
            rec.kind = KIND_BINARY if exc.reason == "binary" else KIND_UNDECODABLE
            if not opts.include_binary:
                rec.skip = exc.reason
        return rec
    fp = opts.html_fingerprinter if outer in HTML_EXTENSIONS else opts.fingerprinter
    simhash, sketch = fp.fingerprint(text)
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


def _examined(todo: list, opts: _Options, jobs):
    """Yield the records of todo's files in order, read by `jobs` processes.

    At most a few tasks per worker are in flight, so the caller stores
    results as they come and an interruption loses only those in flight.
    """
    workers = (os.cpu_count() or 1) if jobs is None else max(1, int(jobs))
    workers = min(workers, max(1, len(todo) // 64))
    if workers == 1:
        for item in todo:
            yield _examine(item, opts)
        return
    pool = concurrent.futures.ProcessPoolExecutor(workers, initializer=_ignore_sigint)
    try:
        tasks = (todo[i:i + TASK_FILES] for i in range(0, len(todo), TASK_FILES))
        flight = collections.deque()
        for task in tasks:
            flight.append(pool.submit(_examine_many, task, opts))
            if len(flight) >= 4 * workers:
                yield from flight.popleft().result()
        while flight:
            yield from flight.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


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


def _state_error(path: str, exc: sqlite3.Error) -> NdindexError:
    """Translate an SQLite error on the state file into what a user can act on."""
    text = str(exc)
    if "readonly" in text or "unable to open" in text or "read-only" in text:
        where = os.path.dirname(os.path.abspath(path))
        why = "read-only file system" if os.statvfs(where).f_flag & os.ST_RDONLY \
            else "not writable"
        return ReadOnlyError(f"{path}: cannot write the dedup state file ({why}); give an "
                             "--index on a writable disk")
    return NdindexError(f"{path}: not a dedup state file ({text})")


class _State:
    """The job's memory of files: rows in SQLite beside the index, and the
    index's keys, kept consistent (see the module docstring).

    Every read and write of the state goes through these methods; the rest
    of the job knows paths, records and rows, not where they are kept.
    """

    def __init__(self, path: str):
        self.path = path
        self.ix = None
        try:
            self.db = sqlite3.connect(path, isolation_level=None)
        except sqlite3.Error as exc:
            raise _state_error(path, exc) from exc
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
            schema = self._meta("schema")
            if schema is None:
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)",
                                (STATE_SCHEMA_VERSION,))
        except sqlite3.Error as exc:
            self.db.close()
            raise _state_error(path, exc) from exc
        if int(schema or 0) > STATE_SCHEMA_VERSION:
            self.db.close()
            raise NdindexError(f"{path}: state schema {int(schema)} > supported "
                               f"{STATE_SCHEMA_VERSION}")

    def attach(self, ix: Index) -> None:
        """Use ix as the index whose keys the rows describe."""
        self.ix = ix

    def close(self) -> None:
        self.db.close()

    def _meta(self, key: str):
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def _transaction(self):
        return _Transaction(self.db)

    def reset(self) -> None:
        """Forget every file (the index was made anew)."""
        with self._transaction() as db:
            db.execute("DELETE FROM files")
            db.execute("DELETE FROM pairs")
            db.execute("DELETE FROM pending")

    def recover(self) -> None:
        """Undo an interrupted batch: its keys leave the index and its rows the state."""
        paths = [bytes(r[0]) for r in self.db.execute("SELECT path FROM pending")]
        if paths:
            self.ix.remove(keys=[index_key(p) for p in paths])
            with self._transaction() as db:
                _delete_paths(db, paths)
                db.execute("DELETE FROM pending")

    def use_options(self, options: str) -> None:
        """Drop the pairs verified under other pairing options (no file is re-read)."""
        if self._meta("pairing") != options:
            with self._transaction() as db:
                db.execute("DELETE FROM pairs")
                db.execute("UPDATE files SET paired = 0")
                db.execute("INSERT OR REPLACE INTO meta VALUES ('pairing', ?)", (options,))

    def known(self) -> dict:
        """Return path -> (size, mtime_ns, kind) of every file remembered."""
        return {bytes(p): (s, m, k) for p, s, m, k in
                self.db.execute("SELECT path, size, mtime_ns, kind FROM files")}

    def forget(self, paths: list) -> None:
        """Forget files: index keys first, then rows (pending protects the gap)."""
        for start in range(0, len(paths), BATCH_FILES):
            part = paths[start:start + BATCH_FILES]
            with self._transaction() as db:
                db.executemany("INSERT OR IGNORE INTO pending VALUES (?)", [(p,) for p in part])
            self.ix.remove(keys=[index_key(p) for p in part])
            with self._transaction() as db:
                _delete_paths(db, part)
                db.execute("DELETE FROM pending")

    def store(self, records: list) -> None:
        """Store a batch of examined files: pending keys, index remove + add, rows.

        A record with an error, or skipped and not binary, leaves no row (it
        is read again next time); binary and undecodable files keep a row so
        that they are not read again.
        """
        if not records:
            return
        with self._transaction() as db:
            db.executemany("INSERT OR IGNORE INTO pending VALUES (?)",
                           [(r.path,) for r in records])
        keys = [index_key(r.path) for r in records]
        self.ix.remove(keys=keys)   # a changed file's old fingerprint, or a crashed run's
        indexed = [(r.simhash, key) for r, key in zip(records, keys)
                   if r.error is None and r.skip is None and r.kind == KIND_TEXT]
        if indexed:
            self.ix.add([fp for fp, _ in indexed], keys=[key for _, key in indexed])
        with self._transaction() as db:
            for r in records:
                if r.error is not None or (r.skip is not None and r.kind not in _KIND_SKIP):
                    _delete_paths(db, [r.path])
                    continue
                row = (r.size, r.mtime_ns, r.kind, r.content_hash,
                       None if r.simhash is None else _signed(r.simhash), r.sketch,
                       None if r.sketch is None else r.sketch[:4 * PREFILTER_VALUES])
                old = db.execute("SELECT id FROM files WHERE path = ?", (r.path,)).fetchone()
                if old is None:
                    db.execute("INSERT INTO files(path, size, mtime_ns, kind, content_hash, "
                               "simhash, sketch, prefix, paired) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
                               (r.path, *row))
                else:
                    db.execute("DELETE FROM pairs WHERE a = ? OR b = ?", (old[0], old[0]))
                    db.execute("UPDATE files SET size = ?, mtime_ns = ?, kind = ?, "
                               "content_hash = ?, simhash = ?, sketch = ?, prefix = ?, "
                               "paired = 0 WHERE id = ?", (*row, old[0]))
            db.execute("DELETE FROM pending")

    def text_rows(self) -> list:
        """Return (id, simhash, content_hash, sketch prefix, paired) of every text file."""
        return self.db.execute("SELECT id, simhash, content_hash, prefix, paired FROM files "
                               "WHERE kind = ?", (KIND_TEXT,)).fetchall()

    def save_pairs(self, pairs: list, ids: list) -> None:
        """Store verified pairs (a, b, distance, similarity) and flag ids as paired."""
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO pairs VALUES (?, ?, ?, ?)", pairs)
            db.executemany("UPDATE files SET paired = 1 WHERE id = ?", [(i,) for i in ids])

    def sketches(self, ids) -> dict:
        """Return id -> bottom-k sketch (uint32 array) of the given text files."""
        out = {}
        ids = sorted(ids)
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            marks = ",".join("?" * len(part))
            for i, blob in self.db.execute(
                    f"SELECT id, sketch FROM files WHERE id IN ({marks})", part):
                out[i] = np.frombuffer(blob, dtype="<u4").astype(np.uint32)
        return out

    def files(self, kinds: tuple) -> list:
        """Return (id, path, size, content_hash, simhash) of the files of these
        kinds, ordered by path."""
        marks = ",".join("?" * len(kinds))
        return [(i, bytes(p), s, bytes(h), None if fp is None else _unsigned(fp))
                for i, p, s, h, fp in self.db.execute(
                    f"SELECT id, path, size, content_hash, simhash FROM files "
                    f"WHERE kind IN ({marks}) ORDER BY path", kinds)]

    def pairs(self):
        """Yield every verified pair (a, b, distance, similarity) of file ids."""
        yield from self.db.execute("SELECT a, b, distance, similarity FROM pairs")


def _delete_paths(db, paths: list) -> None:
    """Delete the rows of these paths and their pairs."""
    for p in paths:
        row = db.execute("SELECT id FROM files WHERE path = ?", (p,)).fetchone()
        if row is not None:
            db.execute("DELETE FROM pairs WHERE a = ? OR b = ?", (row[0], row[0]))
            db.execute("DELETE FROM files WHERE id = ?", (row[0],))


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
          decompress: bool = True, max_candidates: int = DEFAULT_MAX_CANDIDATES,
          jobs: int | None = 1, progress: Callable[[str, int, int], None] | None = None,
          ) -> DedupResult:
    """Find exact and near-duplicate files under paths; return a DedupResult.

    Parameters:
        paths: files and directories (str, bytes or os.PathLike).
        index: the index file to keep between runs (default
            :func:`default_index_path`); its state lives in ``<index>.files``.
            One index may serve different paths: files outside this run's
            paths are remembered, not reported, and forgotten once gone.
        k: simhash candidates within k bits (default the fingerprinter's
            query_k, 10), 0..plan.MAX_PLANNER_K and at most the index's k.
        threshold: Jaccard similarity of word 3-shingles a candidate must
            reach (default the fingerprinter's, 0.8).
        follow_symlinks: follow symbolic links to what no real name reaches
            (a symlink to a file found anyway is listed as its link).
        min_size, max_size: only files of this many bytes (inclusive); a
            compressed file must also decompress to at most max_size.
        include_binary: also report byte-identical binary (and undecodable) files.
        decompress: read .gz, .bz2, .xz, .lzma and .zst files as the text
            inside (otherwise they are binary).
        max_candidates: index candidates verified per file, nearest first.
        jobs: processes reading and fingerprinting (None: one per CPU).
        progress: called as progress(phase, done, total) now and then.

    Returns a :class:`DedupResult`: its ``clusters`` (iterate it for them),
    each file counted once by category, and the files it could not read
    (``errors``, not raised).  Raises OSError when a path does not exist,
    NdindexError when the index or its state file is unusable (ReadOnlyError
    when it cannot be written), ValueError for bad parameters.  Cost: one
    read of every new or changed file and one index query per such file,
    one stat per remembered file outside the paths; a re-run over an
    unchanged tree reads no file.
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
    if not 0 <= k <= MAX_PLANNER_K:
        raise ValueError(f"k must be in 0..{MAX_PLANNER_K}, got {k}")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    opts = _Options(follow_symlinks, int(min_size), int(max_size), bool(include_binary),
                    bool(decompress), base, dataclasses.replace(base, html=True))
    index_path = os.fspath(index) if index is not None else default_index_path(roots)
    os.makedirs(os.path.dirname(os.path.abspath(index_path)) or ".", exist_ok=True)
    state_path = index_path + ".files"
    state = _open_state(index_path, state_path, base, k)
    result = DedupResult(clusters=[], index_path=index_path)
    try:
        state.recover()
        state.use_options(f"k={k} threshold={threshold!r} max_candidates={max_candidates}")
        exclude = {os.fsencode(os.path.abspath(p)) for p in
                   (index_path, state_path, index_path + "-lock", state_path + "-wal",
                    state_path + "-shm", state_path + "-journal")}
        found = _Walk(opts, exclude, result, progress).run(roots)
        known = state.known()
        todo = []
        for item in found:
            size, mtime_ns, kind = known.get(item.path, (None, None, None))
            if (size, mtime_ns) != (item.size, item.mtime_ns):
                todo.append(item)
            elif kind in _KIND_SKIP and not include_binary:
                _count(result.skipped, _KIND_SKIP[kind])
            else:
                result.files_unchanged += 1
        walked = {item.path for item in found}
        gone = [p for p in known if p not in walked and not os.path.lexists(p)]
        result.files_removed = len(gone)
        state.forget(gone)
        _ingest(state, todo, opts, jobs, result, progress)
        result.files_scanned = result.files_read + result.files_unchanged
        _pair(state, base, k, threshold, max_candidates, progress)
        result.clusters = _clusters(state, found, include_binary, base)
    finally:
        state.close()
        if state.ix is not None:
            state.ix.close()
    result.seconds = time.perf_counter() - t0
    return result


def _open_state(index_path: str, state_path: str, fp: Fingerprinter, k: int) -> _State:
    """Open (or create) the state file, then the index, and attach the index.

    The state is created first, so an index never exists without one unless
    it was not made by dedup; a state orphaned by a deleted index is reset.
    """
    index_exists = os.path.exists(index_path)
    if index_exists and not os.path.exists(state_path):
        raise NdindexError(f"{index_path}: an index without a dedup state file ({state_path}); "
                           "use another --index, or delete it")
    state = _State(state_path)
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
    except BaseException:
        state.close()
        raise
    state.attach(ix)
    return state


def _comparable(raw: bytes) -> bytes:
    # The unicode_version field is informative ([FP50]): a Python upgrade must
    # not orphan an index.  The flip model only orders probes ([FP80]), so an
    # index written before it existed stays usable.  Every other field must match.
    cfg = Fingerprinter.from_bytes(raw).to_dict()
    cfg.pop("unicode_version", None)
    cfg.pop("flip_model", None)
    return repr(sorted(cfg.items())).encode()


def _ingest(state: _State, todo: list, opts: _Options, jobs, result: DedupResult,
            progress) -> None:
    """Read, fingerprint and store the new and changed files.

    A batch is stored when it holds BATCH_FILES files or COMMIT_SECONDS have
    passed since the last store, so an interrupted run keeps what it read
    up to the last second or so.
    """
    batch: list = []
    last = _clock()
    done = 0
    for record in _examined(todo, opts, jobs):
        batch.append(record)
        done += 1
        if len(batch) >= BATCH_FILES or _clock() - last >= COMMIT_SECONDS:
            _store(state, batch, opts, result)
            batch = []
            last = _clock()
            if progress is not None:
                progress("read", done, len(todo))
    _store(state, batch, opts, result)
    if progress is not None and todo:
        progress("read", done, len(todo))


def _store(state: _State, records: list, opts: _Options, result: DedupResult) -> None:
    """Store a batch, then count each file in one category."""
    state.store(records)
    for r in records:
        result.bytes_read += r.size
        if r.error is not None:
            result.errors.append((os.fsdecode(r.path), r.error))
        elif r.skip is not None:
            _count(result.skipped, r.skip)
        else:
            result.files_read += 1


def _pair(state: _State, fp: Fingerprinter, k: int, threshold: float, max_candidates: int,
          progress) -> None:
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
    rows = state.text_rows()
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
    for start in range(0, len(todo), PAIR_BATCH_FILES):
        batch = todo[start:start + PAIR_BATCH_FILES]
        found = [_candidates(state.ix, batch[i:i + QUERY_BATCH_FILES], simhashes, sorted_simhashes,
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
            sketches = state.sketches(ids[need].tolist())
            matrix = sketch_matrix([sketches[i] for i in ids[need].tolist()])
            sims = jaccard_many(matrix, np.searchsorted(need, a), np.searchsorted(need, b),
                                fp.bottom_k)
            ok = sims >= threshold
            pairs = list(zip(ids[a[ok]].tolist(), ids[b[ok]].tolist(), dist[ok].tolist(),
                             sims[ok].tolist()))
        state.save_pairs(pairs, ids[batch].tolist())
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


def _clusters(state: _State, found: list, include_binary: bool, fp: Fingerprinter) -> list:
    """Join exact groups and verified pairs among this run's files into clusters.

    Remembered files outside this run's paths take no part.  Returns the
    clusters, largest first, each with its representative first.
    """
    kinds = (KIND_TEXT, KIND_PLAIN) + ((KIND_BINARY, KIND_UNDECODABLE) if include_binary else ())
    links = {item.path: tuple((os.fsdecode(p), kind) for p, kind in item.links)
             for item in found}
    rows = [row for row in state.files(kinds) if row[1] in links]
    pos = {row[0]: n for n, row in enumerate(rows)}
    left, right = [], []
    first_of: dict = {}
    for n, row in enumerate(rows):
        if row[3] in first_of:
            left.append(first_of[row[3]])
            right.append(n)
        else:
            first_of[row[3]] = n
    verified = {}
    for a, b, dist, sim in state.pairs():
        if a in pos and b in pos:
            left.append(pos[a])
            right.append(pos[b])
            verified[(min(pos[a], pos[b]), max(pos[a], pos[b]))] = sim
    out = []
    for members in clusters_from_pairs(len(rows), left, right):
        # representative first: the largest file, the first path among equals
        members = sorted(members.tolist(), key=lambda m: (-rows[m][2], m))
        members = members[:1] + sorted(members[1:])
        files = tuple(DuplicateFile(os.fsdecode(rows[m][1]), rows[m][2], rows[m][3].hex(),
                                    rows[m][4], links[rows[m][1]]) for m in members)
        pairs = _cluster_pairs(state, members, rows, files, verified, fp)
        out.append(Cluster(files, tuple(pairs)))
    out.sort(key=lambda c: (-len(c.files), c.files[0].path))
    return out


def _cluster_pairs(state: _State, members: list, rows: list, files: tuple, verified: dict,
                   fp: Fingerprinter) -> list:
    """Return the Pairs of a cluster: the representative with every other file,
    and all pairs of a small cluster or the verified links of a large one."""
    where = {m: n for n, m in enumerate(members)}
    wanted = {(0, y) for y in range(1, len(members))}
    if len(members) <= MAX_PAIRWISE_FILES:
        wanted |= {(x, y) for x in range(len(members)) for y in range(x + 1, len(members))}
    else:
        wanted |= {tuple(sorted((where[a], where[b]))) for a, b in verified
                   if a in where and b in where}
    need = {rows[members[x]][0] for pair in wanted for x in pair
            if files[x].simhash is not None and files[pair[0]].content_hash
            != files[pair[1]].content_hash}
    sketches = state.sketches(need)
    out = []
    for x, y in sorted(wanted):
        fa, fb = files[x], files[y]
        exact = fa.content_hash == fb.content_hash
        dist = None if fa.simhash is None or fb.simhash is None \
            else (fa.simhash ^ fb.simhash).bit_count()
        key = (min(members[x], members[y]), max(members[x], members[y]))
        if exact:
            sim = 1.0
        elif key in verified:
            sim = verified[key]
        elif fa.simhash is not None and fb.simhash is not None:
            sim = fp.similarity(sketches[rows[members[x]][0]], sketches[rows[members[y]][0]])
        else:
            sim = 0.0
        out.append(Pair(x, y, dist, float(sim), exact))
    return out
