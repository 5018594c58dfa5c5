"""Finding and reading the files of a dedup job (:mod:`ndindex.dedup`).

The walk yields each file once, under its first real name in walk order,
with its other names as links; reading takes a file's bytes (checked
unchanged while read), its BLAKE2b hash and, for a text file, its text
(:mod:`ndindex.textfile`), in worker processes when asked.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import os
import re
import signal
import stat
from typing import TYPE_CHECKING, Sequence

from ndindex import procs, textfile
from ndindex.fingerprint.html import html_to_text

if TYPE_CHECKING:
    from ndindex.dedup import DedupResult

#: Files per task handed to a worker process.
TASK_FILES = 16
#: A file that keeps changing while it is read is skipped after this many tries.
READ_ATTEMPTS = 2

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

# File kinds (_FileState.kind).
KIND_TEXT = 0         # text with words: has a text document; near and exact duplicates
KIND_PLAIN = 1        # text without a word to fingerprint: exact duplicates only
KIND_BINARY = 2       # binary: exact duplicates only, and only with include_binary
KIND_UNDECODABLE = 3  # text-like, but no character set decodes it: as binary
# How a text was taken from its file (part of its text document's key).
TEXT_PLAIN = 0
TEXT_HTML = 1


def tally(counts: dict, key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


@dataclasses.dataclass(frozen=True)
class Options:
    follow_symlinks: bool
    min_size: int
    max_size: int
    include_binary: bool
    decompress: bool


def _extensions(name: bytes) -> tuple[str, str]:
    """Return the lower-case extension of a file name and, for a compressed
    file, the extension of the name inside ("x.html.gz" -> ("gz", "html"))."""
    base = name.rsplit(b"/", 1)[-1].decode("ascii", "replace").lower()
    parts = base.split(".")
    outer = parts[-1] if len(parts) > 1 and parts[0] else ""
    inner = parts[-2] if len(parts) > 2 and outer in textfile.COMPRESSED_EXTENSIONS else ""
    return outer, inner


def _binary_by_name(path: bytes, opts: Options) -> bool:
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


class Walk:
    """Walk roots: every regular file once, under its first real name.

    Real entries (not symlinks) are walked first, depth first in sorted
    order; with follow_symlinks the symlinks met are then followed, the
    newest last, to what the real walk did not reach.  Files and directories
    are known by (st_dev, st_ino): a second name of either is a link (a
    loop is a symlink to a directory already walked).
    """

    def __init__(self, opts: Options, exclude: set, result: DedupResult, progress=None):
        self.opts = opts
        self.progress = progress
        self.exclude = exclude
        self.result = result
        self.files: dict = {}       # (dev, ino) -> _Found, or None when skipped
        self.found: list = []       # the _Found in walk order
        self.dirs: set = set()
        self.pending_dirs: list = []  # directories met, to walk next
        self.symlinks = collections.deque()   # symlinks met, to follow after the real walk

    def run(self, roots: Sequence[bytes]) -> list:
        for root in sorted(set(roots)):
            try:
                st = os.lstat(root)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, os.fsdecode(root)) from None
            self._entry(root, st)
        self._descend()
        while self.symlinks:
            path = self.symlinks.popleft()
            try:
                st = os.stat(path)
            except OSError:
                tally(self.result.skipped, "broken symlink")
                continue
            self._entry(path, st, via_symlink=True)
            self._descend()
        return self.found

    def _entry(self, path: bytes, st, via_symlink: bool = False) -> None:
        if stat.S_ISLNK(st.st_mode):
            if self.opts.follow_symlinks:
                self.symlinks.append(path)
            else:
                tally(self.result.skipped, "symlink")
        elif stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in self.dirs:
                tally(self.result.links, "symlink")
            else:
                self.dirs.add((st.st_dev, st.st_ino))
                self.pending_dirs.append(path)
        else:
            self._file(path, st, via_symlink)

    def _file(self, path: bytes, st, via_symlink: bool) -> None:
        key = (st.st_dev, st.st_ino)
        if key in self.files:
            kind = "symlink" if via_symlink else "hard link"
            tally(self.result.links, kind)
            if self.files[key] is not None:
                self.files[key].links.append((path, kind))
            return
        reason = self._skip_reason(path, st)
        if reason is not None:
            self.files[key] = None
            tally(self.result.skipped, reason)
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


# -- reading -----------------------------------------------------------------------


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
    text_mode: int = TEXT_PLAIN
    text: str | None = None       # a KIND_TEXT file's text, until it is stored
    error: str | None = None      # unreadable: the reason
    skip: str | None = None       # not compared: the reason


#: A word character, as the fingerprinter's tokenizer counts them (isalnum or
#: "_"): a text without one has nothing to fingerprint.
_WORD_CHAR = re.compile(r"\w")


def _examine(item: _Found, opts: Options) -> _Record:
    """Read one file, hash it and take its text; never raises for the file's sake."""
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
    if outer in HTML_EXTENSIONS:
        text = html_to_text(text)
        rec.text_mode = TEXT_HTML
    if _WORD_CHAR.search(text) is None:
        rec.kind = KIND_PLAIN      # no words to compare: exact duplicates only
        return rec
    rec.text = text
    return rec


def _examine_many(items: list, opts: Options) -> list:
    return [_examine(item, opts) for item in items]


def _ignore_sigint() -> None:
    # Workers leave Ctrl-C to the parent, which stops the pool and keeps
    # the files consistent; a worker's own traceback would only be noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def examined(todo: list, opts: Options, jobs):
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
    # Not fork (procs): this process may hold threads, an open Index among them.
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=procs.context(),
                                                  initializer=_ignore_sigint)
    try:
        tasks = (todo[i:i + TASK_FILES] for i in range(0, len(todo), TASK_FILES))
        flight = collections.deque()
        for task in tasks:
            flight.append(procs.PoolTask(pool, _examine_many, task, opts))
            if len(flight) >= 4 * workers:
                yield from flight.popleft().result()
        while flight:
            yield from flight.popleft().result()
    finally:
        procs.shutdown(pool)


