"""What the ``ndindex`` command's modules share: exit codes, opening an index,
reading input lines, printing JSON and progress, and the subcommand helper.

The command is :mod:`ndindex.cli` (the parser and the entry point), with
its subcommands in :mod:`ndindex.cli_index` (fingerprint index files),
:mod:`ndindex.cli_documents` (documents) and :mod:`ndindex.cli_dedup`.
Each imports this module first: it keeps numpy's OpenBLAS from spinning
up threads (see below).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import stat
import sys
import time
from typing import TYPE_CHECKING, Sequence

# ndindex does no linear algebra, but numpy's OpenBLAS starts a thread per
# core that spins for its first tenth of a second: as much CPU again as a
# whole `ndindex query`.  Set before numpy's first import; a caller's own
# setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from ndindex.errors import BusyError  # noqa: E402 - after the setting above
from ndindex.index import Index  # noqa: E402 - imports numpy

if TYPE_CHECKING:
    from ndindex.fingerprint import Fingerprinter


class _LazyModule:
    """A module imported when one of its attributes is first used."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)


# What only some subcommands need is imported by them, so that `ndindex
# query` pays for numpy and the index alone (tests/unit/test_lazy_imports.py):
# the dedup job (fingerprinting, sqlite3, worker processes), the upgrade
# (a format-1 reader), text decoding (the fingerprint package, zstd), the
# dump and csv.
dedup_module = _LazyModule("ndindex.dedup")   # not ndindex.dedup: the package attribute is the function
upgrade_module = _LazyModule("ndindex.upgrade")
textfile_module = _LazyModule("ndindex.textfile")


EXIT_OK = 0
#: dedup: duplicates found (like diff); query: no match (like grep).
EXIT_FOUND = 1
EXIT_NONE = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
#: The reader of the output closed the pipe (128 + SIGPIPE, as a killed process).
EXIT_BROKEN_PIPE = 141

EXIT_CODES_HELP = """exit status:
  0    success; dedup: no duplicates; query, similar: at least one match
  1    dedup: duplicates found (like diff); query, similar: no match (like grep)
  2    error: bad arguments, unreadable or corrupt index or dump, a missing
       PATH (one line on stderr: "ndindex: <file>: <problem>")
  130  interrupted (Ctrl-C); the index stays consistent and a re-run resumes
  141  the output's reader closed the pipe (ndindex stats X | head); nothing printed"""

#: Invalid input lines printed before the rest are only counted.
MAX_REPORTED_LINES = 10


def parse_fingerprint(text: str) -> int:
    """Parse a fingerprint: 0x-prefixed hex or decimal, 0..2^64-1."""
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a fingerprint: {text!r} (decimal or 0x-hex)") from None
    if not 0 <= value < 1 << 64:
        raise argparse.ArgumentTypeError(f"fingerprint {text} is outside 0..2^64-1")
    return value


#: An open that waits this long for another process's vacuum says so on stderr.
BUSY_NOTICE_SECONDS = 1.0


def open_index(path: str, readonly: bool = False) -> Index:
    """Index.open, saying on stderr why it waits when another process holds the
    file for a vacuum or an upgrade (it waits for it, as Index.open does)."""
    try:
        return Index.open(path, readonly=readonly, timeout=BUSY_NOTICE_SECONDS)
    except BusyError:
        print(f"ndindex: {path}: another process is vacuuming or upgrading this index; "
              "waiting for it (Ctrl-C to give up)", file=sys.stderr, flush=True)
    return Index.open(path, readonly=readonly)


def subcommand(commands, name, help, description, examples, run):
    """Add a subcommand whose --help ends with examples and the exit codes."""
    parser = commands.add_parser(
        name, help=help, description=description,
        epilog="examples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=run)
    return parser


class Progress:
    """A one-line progress bar on stderr, drawn only on a terminal, at most every interval s."""

    def __init__(self, enabled: bool, interval: float = 0.1):
        self.enabled = enabled and sys.stderr.isatty()
        self.interval = interval
        self.last = 0.0
        self.drawn = False

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < self.interval and done != total):
            return
        self.last = now
        if total:
            width = 30
            fill = int(width * done / total)
            line = f"{phase:8s} [{'#' * fill}{'.' * (width - fill)}] {done:,}/{total:,}"
        else:
            line = f"{phase:8s} {done:,} files"
        sys.stderr.write("\r" + line[:100].ljust(60))
        sys.stderr.flush()
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            sys.stderr.write("\r" + " " * 60 + "\r")
            sys.stderr.flush()


def plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def hex_fp(fp: int) -> str:
    return f"0x{int(fp):016x}"


def key_json(key):
    """A document key for JSON: str as is, bytes as {"bytes_hex": ...}."""
    return key if isinstance(key, str) else {"bytes_hex": bytes(key).hex()}


def key_text(key) -> str:
    """A document key for a line of text: control characters (a newline, an
    escape sequence) and, in bytes keys, undecodable bytes as ``\\xNN``."""
    return dedup_module.printable(key) if isinstance(key, str) else \
        dedup_module.display_path(key)


def fingerprinter_of(ix: Index) -> Fingerprinter:
    from ndindex.fingerprint import Fingerprinter
    raw = ix.fingerprinter
    if raw is None:
        raise FileError(ix.path, "the index has no fingerprinter (created with "
                         "--no-fingerprinter): give fingerprints, not documents")
    return Fingerprinter.from_bytes(raw)


class FileError(Exception):
    """A problem with one named file, printed as ``ndindex: <file>: <problem>``."""

    def __init__(self, filename: str, problem: str):
        super().__init__(problem)
        self.filename = filename


class InvalidInput(Exception):
    """Lines of an input file that are not valid; the message lists them."""


#: The forms of read_lines' verbs: (past participle, third person).
_VERB_FORMS = {"add": ("added", "adds"), "remove": ("removed", "removes"),
               "query": ("queried", "queries")}


def read_lines(source: str, skip_invalid: bool, parse, items=None, verb: str = "add") -> tuple:
    """Return (the parsed items, invalid count) of an input file (or - for stdin).

    parse(raw line) returns an item, None for a line to skip, or raises
    ValueError; each item is appended to items (default: a new list).
    Every line is checked before anything is added: the first
    MAX_REPORTED_LINES invalid lines are printed on stderr as
    ``ndindex: FILE:LINE: problem``, and without skip_invalid any invalid
    line raises InvalidInput, saying nothing was done (verb: "add",
    "remove" or "query").  Memory: every item, as items holds them.
    """
    name = "<stdin>" if source == "-" else source
    fh = sys.stdin.buffer if source == "-" else open(source, "rb")
    items, invalid = ([] if items is None else items), 0
    try:
        for number, raw in enumerate(fh, 1):
            try:
                item = parse(raw)
            except ValueError as exc:
                invalid += 1
                if invalid <= MAX_REPORTED_LINES:
                    print(f"ndindex: {name}:{number}: {exc}", file=sys.stderr)
                continue
            if item is not None:
                items.append(item)
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()
    if invalid and not skip_invalid:
        more = f" ({invalid - MAX_REPORTED_LINES:,} not shown)" if invalid > MAX_REPORTED_LINES \
            else ""
        done, does = _VERB_FORMS[verb]
        raise InvalidInput(f"{name}: {plural(invalid, 'invalid line')}"
                            f"{more}; nothing {done} (--skip-invalid {does} the valid ones)")
    return items, invalid


#: Why a directory's entry that is not a regular file is skipped.
NOT_REGULAR = "not a regular file (a pipe, socket or device)"


def document_paths(paths):
    """Yield (path, None) for each file to read: the paths given, and the files
    under the directories among them, names sorted; (path, NOT_REGULAR) for a
    directory's entry that is a pipe, socket or device, to report and skip:
    opening a pipe waits for a writer that may never come.  A path given
    itself is read whatever it is (a shell's <(...) is a pipe)."""
    for path in paths:
        if not os.path.isdir(path):
            yield path, None
            continue
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(root, name)
                try:
                    regular = stat.S_ISREG(os.stat(full).st_mode)
                except OSError:
                    regular = True      # reading it says why (a broken link)
                yield full, None if regular else NOT_REGULAR


def document_text(path: str) -> str:
    """Return a document's text in any character set (NotText if it has none)."""
    with open(path, "rb") as fh:
        return textfile_module.decode(fh.read())


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def error_line(exc: BaseException, file, named: Sequence[str] = ()) -> str:
    """Return ``ndindex: <file>: <problem>`` for an error about a file.

    The file is the exception's own (its ``filename``) or else the one the
    command works on; a message that already begins with the file's name
    keeps one copy of it, and one that begins with another file the command
    names, or a file beside it (``INDEX.files: ...``), is printed as it is.
    """
    if getattr(exc, "filename", None) is not None:
        file = exc.filename
    problem = one_line(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
    if file is None:
        return f"ndindex: {problem}"
    name = dedup_module.display_path(file)
    for prefix in (f"{name}: ", f"{os.path.abspath(name)}: "):
        while problem.startswith(prefix):
            problem = problem[len(prefix):]
    others = [n for other in named for n in (other, os.path.abspath(other)) if other != file]
    if problem.startswith(tuple(f"{n}: " for n in others)) or (
            problem.startswith((name, os.path.abspath(name))) and ": " in problem):
        return f"ndindex: {problem}"
    return f"ndindex: {name}: {problem}"


def prefix_range(low: int, high: int) -> str:
    return f"prefix of {low} bits" if low == high else f"prefixes of {low}..{high} bits"
