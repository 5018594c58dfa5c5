"""The ``ndindex`` command: a thin layer over the public API.

Each subcommand is a function ``_cmd_<name>(args) -> int`` registered in
``_build_parser``; add new ones there.  Errors are one line on stderr, with
exit status 2: ``ndindex: error: ...`` for usage and bad values (argparse's
two-line message included), ``ndindex: <file>: <problem>`` for files.
The dedup job itself lives in :mod:`ndindex.dedup`, the dump in
:mod:`ndindex.dump`; this module parses, prints and maps errors to statuses.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Sequence

# ndindex does no linear algebra, but numpy's OpenBLAS starts a thread per
# core that spins for its first tenth of a second: as much CPU again as a
# whole `ndindex query`.  Set before numpy's first import; a caller's own
# setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402 - after the setting above

from ndindex.errors import BusyError, CorruptionError, NdindexError
from ndindex.index import Index
from ndindex.plan import Plan, candidate_designs, choose_plan, psm_max_probes

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
_dedup = _LazyModule("ndindex.dedup")   # not ndindex.dedup: the package attribute is the function
_upgrade = _LazyModule("ndindex.upgrade")
_textfile = _LazyModule("ndindex.textfile")

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
#: Fingerprints per index.add call of ``ndindex add`` (one transaction each).
ADD_BATCH_LINES = 100_000

_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}


class _UsageError(Exception):
    """Raised by the parser instead of printing usage and exiting."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse would print usage and call sys.exit(2)
        raise _UsageError(message)


def _count(text: str) -> int:
    """Parse a fingerprint count: 10000000, 1e7, 10M, 8B (K, M, G/B, T; decimal)."""
    text = text.strip().replace("_", "").replace(",", "")
    scale = _SUFFIXES.get(text[-1:].lower(), 1)
    number = text[:-1] if scale != 1 else text
    try:
        value = float(number) * scale if any(c in number for c in ".eE") \
            else int(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    return int(value)


def _fingerprint(text: str) -> int:
    """Parse a fingerprint: 0x-prefixed hex or decimal, 0..2^64-1."""
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a fingerprint: {text!r} (decimal or 0x-hex)") from None
    if not 0 <= value < 1 << 64:
        raise argparse.ArgumentTypeError(f"fingerprint {text} is outside 0..2^64-1")
    return value


def _size(text: str) -> int:
    """Parse a byte size: 4096, 64K, 64M, 1G (binary units)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().rstrip("ib").rstrip("b") if text.strip().lower()[-1:] == "b" \
        else text.strip().lower()
    scale = units.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if scale != 1 else t) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64K, 64M)") from None


#: An open that waits this long for another process's vacuum says so on stderr.
BUSY_NOTICE_SECONDS = 1.0


def _open_index(path: str, readonly: bool = False) -> Index:
    """Index.open, saying on stderr why it waits when another process holds the
    file for a vacuum or an upgrade (it waits for it, as Index.open does)."""
    try:
        return Index.open(path, readonly=readonly, timeout=BUSY_NOTICE_SECONDS)
    except BusyError:
        print(f"ndindex: {path}: another process is vacuuming or upgrading this index; "
              "waiting for it (Ctrl-C to give up)", file=sys.stderr, flush=True)
    return Index.open(path, readonly=readonly)


def _sub(commands, name, help, description, examples, run):
    """Add a subcommand whose --help ends with examples and the exit codes."""
    parser = commands.add_parser(
        name, help=help, description=description,
        epilog="examples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=run)
    return parser


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ndindex", description="Embedded near-duplicate index tools: find "
                     "duplicate files (dedup) and manage index files.",
                     epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    p = _sub(commands, "dedup", "find exact and near-duplicate files under directories",
             "Walk PATHs, fingerprint text-like files, and report clusters of files that are "
             "byte-identical or near-duplicates (Jaccard of word 3-shingles >= the "
             "threshold, whatever their simhash distance).  Text in any character set is "
             "read, and compressed files through their decompressor.  Each cluster is "
             "printed once, its representative (*) first; --json and --csv give every pair.  "
             "The index, one file, makes a re-run read only new and changed files; one "
             "--index may serve different PATHs: a file is forgotten only when it is gone "
             "from disk.",
             ["ndindex dedup /usr/share/common-licenses",
              "ndindex dedup --index docs.ndx ~/Documents ~/Downloads",
              "ndindex dedup --json src/ > clusters.json",
              "ndindex dedup --csv --include-binary --min-size 1K photos/ > dups.csv"],
             _cmd_dedup)
    p.add_argument("paths", nargs="+", metavar="PATH", help="files and directories to scan")
    p.add_argument("--index", metavar="FILE",
                   help="index to keep between runs (default: a file under "
                        "$XDG_CACHE_HOME/ndindex/, printed on stderr)")
    p.add_argument("-k", type=int, metavar="K",
                   help="simhash distance a new index answers for `ndindex query` (default 3; "
                        "near-duplicates do not depend on it)")
    p.add_argument("--threshold", type=float, metavar="J",
                   help="Jaccard similarity a near-duplicate must reach (default 0.8)")
    # Defaults of None stand for ndindex.dedup's (named in the help; a test
    # checks them): reading them here would import the dedup job for every command.
    p.add_argument("--max-candidates", type=int, metavar="C",
                   help="candidates verified per file, nearest first (default 64)")
    p.add_argument("--follow-symlinks", action="store_true",
                   help="follow symbolic links to files and directories no real name "
                        "reaches; a link to a file found anyway is listed as its link, "
                        "not a copy")
    p.add_argument("--min-size", type=_size, metavar="SIZE",
                   help="skip smaller files (default 1 byte: empty files are skipped)")
    p.add_argument("--max-size", type=_size, metavar="SIZE",
                   help="skip larger files (default 64M)")
    p.add_argument("--include-binary", action="store_true",
                   help="also report byte-identical binary (and undecodable) files")
    p.add_argument("--no-decompress", dest="decompress", action="store_false",
                   help="treat .gz, .bz2, .xz, .lzma and .zst files as binary instead of "
                        "reading the text inside (at most --max-size bytes of it)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="processes reading and fingerprinting (default: one per CPU)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON document")
    out.add_argument("--csv", action="store_true", help="print CSV, one row per file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or notices")

    p = _sub(commands, "create", "create an empty index",
             "Create an index file for fingerprints within distance k.  It stores the default "
             "fingerprinter, so documents and texts can be added and queried.  With --docs "
             "(implied by --threshold and --bottom-k), say so and choose the document "
             "pipeline's threshold (the lowest `similar`, `pairs` and `clusters` accept) "
             "and sketch size.",
             ["ndindex create pages.ndx -k 3 -n 10M", "ndindex create docs.ndx --docs",
              "ndindex create strict.ndx --docs --threshold 0.9 --bottom-k 256"],
             _cmd_create)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("-k", type=int, default=3, metavar="K", help="largest query distance (default 3)")
    p.add_argument("-n", type=_count, default=1_000_000, metavar="N",
                   help="expected number of fingerprints (default 1M)")
    p.add_argument("--coding", choices=["delta+restarts", "delta", "xor"],
                   default="delta+restarts",
                   help="block coding (default delta+restarts; delta or xor make a file that "
                        "ndindex before format 3 can open too; the default makes a format-5 "
                        "file)")
    p.add_argument("--no-fingerprinter", action="store_true",
                   help="store no fingerprinter (fingerprints only)")
    p.add_argument("--docs", action="store_true",
                   help="an index for documents (ndindex add --docs, similar, clusters)")
    p.add_argument("--threshold", type=float, metavar="J",
                   help="with --docs: the lowest Jaccard similarity queries may ask for "
                        "(default 0.8; lower thresholds store more lookup keys)")
    p.add_argument("--bottom-k", type=int, metavar="K",
                   help="with --docs: values per document sketch (default 1024; a smaller "
                        "sketch is smaller and coarser)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _sub(commands, "add", "add fingerprints (from a file or stdin) or documents",
             "Add fingerprints, one per line as decimal or 0x-hex, optionally followed by white "
             "space and a document key (UTF-8); blank lines and lines starting with # are "
             "ignored.  Any invalid line stops the whole input unless --skip-invalid.  "
             "Or add documents, for `ndindex similar` and `clusters`: with --docs, files "
             "(directories recursively, text in any character set), each keyed by its path "
             "as given; with --jsonl, texts that are not files, one JSON object a line: "
             '{"key": "...", "text": "..."}.  A key names one document: adding it again '
             "replaces the document.",
             ["ndindex add pages.ndx fingerprints.txt",
              "printf '0x0123456789abcdef https://example.org/\\n' | ndindex add pages.ndx",
              "ndindex add pages.ndx crawl.txt --skip-invalid",
              "ndindex add docs.ndx --docs notes/ README.md",
              "printf '{\"key\": \"mail-1\", \"text\": \"Dear all, ...\"}\\n' | "
              "ndindex add docs.ndx --jsonl -"],
             _cmd_add_documents)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("source", nargs="?", default="-", metavar="FILE",
                   help="fingerprint list (default -: stdin)")
    p.add_argument("--docs", nargs="+", metavar="PATH",
                   help="add these files as documents, keyed by path (directories recursively)")
    p.add_argument("--jsonl", metavar="FILE",
                   help='add the documents of JSON lines {"key": K, "text": T} from FILE '
                        "(- for stdin)")
    p.add_argument("--skip-invalid", action="store_true",
                   help="add the valid lines and count the invalid ones (default: report "
                        f"the invalid lines, up to {MAX_REPORTED_LINES}, and add nothing)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _sub(commands, "query", "find stored fingerprints near a fingerprint, text or file",
             "Print every stored fingerprint within distance k of the query, nearest first, "
             "with its document keys.  A text or file is fingerprinted with the index's "
             "fingerprinter.  On a probabilistic (psm) index the query probes the most "
             "likely flip sets of its prefix (a text's own flip probabilities, from the "
             "fingerprinter's flip model), up to --max-probes of them.",
             ["ndindex query pages.ndx 0x0123456789abcdef",
              "ndindex query docs.ndx --text 'the quick brown fox' -k 6",
              "ndindex query docs.ndx --file draft.md --json"],
             _cmd_query)
    p.add_argument("index", metavar="INDEX")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("fingerprint", nargs="?", type=_fingerprint, metavar="FINGERPRINT")
    what.add_argument("--text", metavar="TEXT", help="fingerprint this text")
    what.add_argument("--file", metavar="PATH", help="fingerprint this file")
    p.add_argument("-k", type=int, metavar="K", help="distance (default: the index's k)")
    p.add_argument("--max-probes", type=int, metavar="N",
                   help="flip sets to probe: probabilistic matching (default on a psm index: "
                        f"{psm_max_probes(3)} at k=3, {psm_max_probes(10)} at k=10; with --text "
                        "or --file, makes the query probabilistic on any index)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _sub(commands, "remove", "remove fingerprints or document keys",
             "Remove fingerprints (with all their keys) or document keys (a fingerprint goes "
             "with its last key).",
             ["ndindex remove pages.ndx --fingerprint 0x0123456789abcdef",
              "ndindex remove docs.ndx --key notes/old.md"],
             _cmd_remove)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--fingerprint", type=_fingerprint, nargs="+", default=[], metavar="FP")
    p.add_argument("--key", nargs="+", default=[], metavar="KEY")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _sub(commands, "compact", "merge the append log and removals into the tables",
             "Compact the index in one transaction (rewriting only touched blocks unless "
             "--full).",
             ["ndindex compact pages.ndx", "ndindex compact pages.ndx --full --json"],
             _cmd_compact)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--full", action="store_true", help="rebuild every table and its code")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _sub(commands, "stats", "print counts, sizes and the plan",
             "Print the number of fingerprints, the file size and the tables' size in bits "
             "per fingerprint; --tables adds a line per table.",
             ["ndindex stats pages.ndx", "ndindex stats pages.ndx --tables",
              "ndindex stats pages.ndx --json"], _cmd_stats)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--tables", action="store_true", help="also print one line per table")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _sub(commands, "verify", "check every checksum, order and directory entry",
             "Read the whole index and check it; exit 2 naming the first problem.  With "
             "--repair, a damaged index is then salvaged as `ndindex recover` does, into "
             "INDEX.recovered (or -o OUT), and the exit status is recover's.",
             ["ndindex verify pages.ndx", "ndindex verify --repair pages.ndx",
              "ndindex verify --repair pages.ndx -o fixed.ndx"], _cmd_verify)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--repair", action="store_true",
                   help="if the check fails, salvage what verifies into a new index")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="with --repair: the new index (default INDEX.recovered)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _sub(commands, "recover", "salvage a damaged index into a new one",
             "Read a damaged index page by page without trusting LMDB's trees, keep every "
             "fingerprint and document key whose records still verify (the newest consistent "
             "state: the runs its manifest lists, its tombstones and log), and write them to "
             "a new index with the same k, plan, coding and fingerprinter, like SQLite's "
             ".recover.  DAMAGED is left as it is.  Prints what was recovered and, on stderr, "
             "what could not be read.  Exit status: 0 everything recovered, 1 partial (some "
             "records could not be read; the new index holds the rest), 2 nothing "
             "recoverable or a usage error.",
             ["ndindex recover pages.ndx -o pages-recovered.ndx",
              "ndindex recover pages.ndx -o pages-recovered.ndx --json"],
             _cmd_recover)
    p.add_argument("index", metavar="DAMAGED")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the new index (must not exist)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = _sub(commands, "export", "write a portable zstd-compressed dump",
             "Write the live fingerprints, keys, plan and settings of an index as a dump "
             "(format-spec/dump.md); import gives back an identical index.",
             ["ndindex export pages.ndx -o pages.ndxdump", "ndindex export pages.ndx > pages.ndxdump"],
             _cmd_export)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("-o", "--output", default="-", metavar="FILE", help="dump file (default stdout)")

    p = _sub(commands, "import", "create an index from a dump",
             "Create a new index with the dump's plan and settings and add everything in it.",
             ["ndindex import pages.ndxdump copy.ndx", "ndindex import - copy.ndx < pages.ndxdump"],
             _cmd_import)
    p.add_argument("dump", metavar="DUMP", help="dump file, or - for stdin")
    p.add_argument("index", metavar="INDEX", help="the new index (must not exist)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _sub(commands, "upgrade", "bring an index file to the newest file format",
             "A format-2 index of the delta coding gets restart tables (faster queries, 2.4% "
             "larger tables), a format-3 index packed raw blocks (smaller files while new "
             "fingerprints wait to merge) and a format-3 or 4 index tombstones in several runs "
             "(smaller commits as fingerprints are removed), all format 5: its header names "
             "the new format "
             "and coding and a full "
             "compaction rewrites every table, then it is verified; INDEX must not be open in "
             "another process, and a crash leaves a whole index that the next upgrade "
             "finishes (with -o, a compacted copy is upgraded instead).  An index made before "
             "file format 2 (which this version cannot open) is rewritten as a format-2 index "
             "with the same k, plan, coding, fingerprinter, fingerprints and document keys, "
             "verified and compared with the original before it is used; in place, the "
             "original is kept as INDEX.v1 (unless --no-backup), and a crash at any moment "
             "leaves at INDEX either the whole original or the whole new index.  A file "
             "already in the newest format for its coding is left alone and reported, with "
             "exit status 0.",
             ["ndindex upgrade pages.ndx",
              "ndindex upgrade pages.ndx -o pages-v2.ndx",
              "ndindex upgrade pages.ndx --no-backup --json"],
             _cmd_upgrade)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write the new index here (must not exist) and leave INDEX as it is")
    p.add_argument("--no-backup", action="store_true",
                   help="in place: delete the original once the new index is in place "
                        "(default: keep it as INDEX.v1)")
    p.add_argument("--json", action="store_true", help="print JSON")

    plan = _sub(commands, "plan", "choose a table design for n fingerprints and k",
                "Print the table design the planner chooses and the candidates it weighed.",
                ["ndindex plan -n 10M -k 3", "ndindex plan -n 100k -k 10 --json"], _cmd_plan)
    plan.add_argument("-n", type=_count, required=True, metavar="N",
                      help="expected number of fingerprints (e.g. 10000000, 1e7, 10M, 8B)")
    plan.add_argument("-k", type=int, required=True, metavar="K",
                      help="Hamming distance to answer, 0..12")
    plan.add_argument("--max-tables", type=int, metavar="T", help="at most T tables")
    plan.add_argument("--max-probe-entries", type=float, metavar="E",
                      help="fewest tables expecting at most E entries per probe")
    plan.add_argument("--tables", action="store_true",
                      help="also list the chosen design's tables and permutations")
    plan.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_document_commands(commands)
    return parser


def _summary(plan: Plan, n: int, reference_cost: float) -> dict:
    prefixes = [t.prefix_bits for t in plan.tables]
    cost = plan.estimated_query_cost(n)
    return {
        "tables": len(plan.tables),
        "p_min": min(prefixes),
        "p_max": max(prefixes),
        "expected_probe_entries": plan.expected_probe_entries(n),
        "estimated_query_cost": cost,
        "relative_query_cost": cost / reference_cost,
        "scheme": plan.scheme,
    }


def _within_budget(plan: Plan, args) -> bool:
    return ((args.max_tables is None or len(plan.tables) <= args.max_tables)
            and (args.max_probe_entries is None
                 or plan.expected_probe_entries(args.n) <= args.max_probe_entries))


def _cmd_plan(args) -> int:
    chosen = choose_plan(args.n, args.k, max_tables=args.max_tables,
                         max_probe_entries=args.max_probe_entries)
    reference = chosen.estimated_query_cost(args.n)
    candidates = [dict(_summary(p, args.n, reference), chosen=(p == chosen),
                       within_budget=_within_budget(p, args))
                  for p in candidate_designs(args.k)]
    if args.json:
        chosen_info = dict(_summary(chosen, args.n, reference),
                           prefix_bits=[t.prefix_bits for t in chosen.tables],
                           plan_record_hex=chosen.to_bytes().hex())
        if args.tables:
            chosen_info["permutations"] = [list(t.permutation) for t in chosen.tables]
        print(json.dumps({"n": args.n, "k": args.k, "max_tables": args.max_tables,
                          "max_probe_entries": args.max_probe_entries,
                          "chosen": chosen_info, "candidates": candidates}, indent=2))
        return EXIT_OK
    s = _summary(chosen, args.n, reference)
    print(f"chosen: {s['tables']} tables, p={s['p_min']}..{s['p_max']} ({s['scheme']})")
    print(f"  n={args.n:,} k={args.k}: {s['expected_probe_entries']:.4g} entries per probe "
          f"at worst, estimated query cost {s['estimated_query_cost']:.4g} block decodes")
    print()
    print(f"candidates for k={args.k} (cost relative to the chosen design; "
          f"* chosen, - outside the budget):")
    print(f"     {'t':>4}  {'p':>7}  {'entries/probe':>13}  {'rel. cost':>9}  scheme")
    for c in candidates:
        mark = "*" if c["chosen"] else (" " if c["within_budget"] else "-")
        print(f"  {mark}  {c['tables']:>4}  {c['p_min']:>3}..{c['p_max']:<2}  "
              f"{c['expected_probe_entries']:>13.4g}  {c['relative_query_cost']:>9.3g}  "
              f"{c['scheme']}")
    if args.tables:
        print()
        print(chosen.describe())
    return EXIT_OK


# -- index commands -----------------------------------------------------------


def _json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def _hex(fp: int) -> str:
    return f"0x{int(fp):016x}"


def _key_json(key):
    """A document key for JSON: str as is, bytes as {"bytes_hex": ...}."""
    return key if isinstance(key, str) else {"bytes_hex": bytes(key).hex()}


def _key_text(key) -> str:
    return key if isinstance(key, str) else _dedup.display_path(key)


def _fingerprinter_of(ix: Index) -> Fingerprinter:
    from ndindex.fingerprint import Fingerprinter
    raw = ix.fingerprinter
    if raw is None:
        raise _FileError(ix.path, "the index has no fingerprinter (created with "
                         "--no-fingerprinter): give fingerprints, not documents")
    return Fingerprinter.from_bytes(raw)


class _FileError(Exception):
    """A problem with one named file, printed as ``ndindex: <file>: <problem>``."""

    def __init__(self, filename: str, problem: str):
        super().__init__(problem)
        self.filename = filename


class _InvalidInput(Exception):
    """Lines of an input file that are not valid; the message lists them."""


def _parse_line(raw: bytes):
    """Return (fingerprint, key or None), or None for a blank or comment line.

    Raises ValueError saying what is wrong with the line.
    """
    try:
        line = raw.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                         f"{exc.start + 1})") from None
    if not line or line.startswith("#"):
        return None
    parts = line.split(None, 1)
    try:
        fp = _fingerprint(parts[0])
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None
    return fp, (parts[1] if len(parts) > 1 else None)


def _read_lines(source: str, skip_invalid: bool, parse) -> tuple[list, int]:
    """Return (the parsed items, invalid count) of an input file (or - for stdin).

    parse(raw line) returns an item, None for a line to skip, or raises
    ValueError.  Every line is checked before anything is added: the first
    MAX_REPORTED_LINES invalid lines are printed on stderr as
    ``ndindex: FILE:LINE: problem``, and without skip_invalid any invalid
    line raises _InvalidInput.  Memory: the whole list.
    """
    name = "<stdin>" if source == "-" else source
    fh = sys.stdin.buffer if source == "-" else open(source, "rb")
    items, invalid = [], 0
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
        raise _InvalidInput(f"{name}: {invalid:,} invalid line{'s' if invalid != 1 else ''}"
                            f"{more}; nothing added (--skip-invalid adds the valid ones)")
    return items, invalid


def _read_fingerprint_lines(source: str, skip_invalid: bool):
    """Return (fingerprints, keys, invalid count) of a fingerprint list (see _read_lines)."""
    items, invalid = _read_lines(source, skip_invalid, _parse_line)
    return [fp for fp, _ in items], [key for _, key in items], invalid


def _document_paths(paths):
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(files):
                    yield os.path.join(root, name)
        else:
            yield path


def _document_text(path: str) -> str:
    """Return a document's text in any character set (NotText if it has none)."""
    with open(path, "rb") as fh:
        return _textfile.decode(fh.read())


def _cmd_add(args) -> int:
    fps, keys, invalid = _read_fingerprint_lines(args.source, args.skip_invalid)
    added = 0
    progress = _Progress(not args.json, interval=1.0)
    try:
        with _open_index(args.index) as ix:
            for start in range(0, len(fps), ADD_BATCH_LINES):
                added += ix.add(np.array(fps[start:start + ADD_BATCH_LINES], dtype=np.uint64),
                                keys=keys[start:start + ADD_BATCH_LINES])
                progress("add", min(start + ADD_BATCH_LINES, len(fps)), len(fps))
            total = len(ix)
    finally:
        progress.clear()
    if args.json:
        _json(dict(added=added, skipped=0, invalid=invalid, fingerprints=total))
    else:
        print(f"added {added:,} fingerprints ({total:,} distinct in the index)"
              + (f"; skipped {invalid:,} invalid line{'s' if invalid != 1 else ''}"
                 if invalid else ""))
    return EXIT_OK


def _cmd_query(args) -> int:
    with _open_index(args.index, readonly=True) as ix:
        k = ix.k if args.k is None else args.k
        if args.fingerprint is not None:
            q = args.fingerprint
            matches = ix.query(q, k, max_probes=args.max_probes)
        else:
            if args.text is not None:
                text = args.text
            else:
                try:
                    text = _document_text(args.file)
                except _textfile.NotText as exc:
                    raise _FileError(args.file, f"{exc}; documents must be text") from None
            q, margins = _fingerprinter_of(ix).simhash_with_weights(text)
            # A probabilistic query orders its probes by the text's own margins
            # (Index.query_text's rule; the text is fingerprinted once here).
            probabilistic = ix.plan.probabilistic or args.max_probes is not None
            matches = ix.query(q, k, margins=margins if probabilistic else None,
                               max_probes=args.max_probes)
    if args.json:
        _json(dict(query=q, query_hex=_hex(q), k=k, matches=[
            dict(fingerprint=m.fingerprint, fingerprint_hex=_hex(m.fingerprint),
                 distance=m.distance, keys=[_key_json(key) for key in m.keys])
            for m in matches]))
    else:
        print(f"query {_hex(q)} k={k}: {len(matches)} match{'es' if len(matches) != 1 else ''}")
        for m in matches:
            keys = ", ".join(_key_text(key) for key in m.keys)
            print(f"  {_hex(m.fingerprint)}  distance {m.distance:2d}  {keys}".rstrip())
    return EXIT_OK if matches else EXIT_NONE


def _cmd_remove(args) -> int:
    if not args.fingerprint and not args.key:
        raise ValueError("remove needs --fingerprint FP... or --key KEY...")
    with _open_index(args.index) as ix:
        removed = 0
        if args.fingerprint:
            removed += ix.remove(fingerprints=args.fingerprint)
        if args.key:
            removed += ix.remove(keys=args.key)
        total = len(ix)
    if args.json:
        _json(dict(removed=removed, fingerprints=total))
    else:
        print(f"removed {removed:,} fingerprints ({total:,} left)")
    return EXIT_OK


def _cmd_compact(args) -> int:
    progress = _Progress(not args.json, interval=1.0)
    try:
        with _open_index(args.index) as ix:
            report = ix.compact(full=args.full, progress=progress)
    finally:
        progress.clear()
    if args.json:
        _json(report)
    else:
        runs = report["runs"]
        print(f"compacted: {report['steps']:,} steps, {max(runs) if runs else 0} run(s) per "
              f"table, {report['file_bytes']:,} bytes"
              + (" (free space given back)" if report.get("vacuumed") else "")
              + f", {report['seconds']:.3f} s")
    return EXIT_OK


def _cmd_stats(args) -> int:
    with _open_index(args.index, readonly=True) as ix:
        info = ix.stats()
    if args.json:
        _json(info)
        return EXIT_OK
    for line in _stats_lines(info, args.tables):
        print(line)
    return EXIT_OK


def _prefixes(low: int, high: int) -> str:
    return f"prefix of {low} bits" if low == high else f"prefixes of {low}..{high} bits"


def _stats_lines(info: dict, per_table: bool) -> list[str]:
    """The text of ``ndindex stats``: a summary, then a line per table if asked.

    Sizes per fingerprint count only what the runs hold: fingerprints still
    in the log (not yet compacted) are named apart, not averaged in.
    """
    tables = info["tables"]
    prefixes = sorted({t["prefix_bits"] for t in tables})
    in_runs = sum(tables[0]["run_entries"]) if tables else 0
    table_bytes = sum(t["bytes"] for t in tables)
    lines = [f"{info['path']}: {info['fingerprints']:,} fingerprints, k={info['k']}, "
             f"{info['file_bytes']:,} bytes"]
    summary = (f"  {_plural(len(tables), 'table')} ({_prefixes(prefixes[0], prefixes[-1])}): "
               f"{in_runs:,} fingerprints each in runs, {table_bytes:,} bytes")
    if in_runs:
        bits = 8 * table_bytes / in_runs / len(tables)
        summary += (f", {bits:.2f} bits per fingerprint per table "
                    f"(bound {info['entropy_bound_bits']:.2f})")
    if info["log_entries"]:
        summary += f"; {info['log_entries']:,} operations in the log, not yet compacted"
    lines.append(summary)
    if info.get("coding") == "delta":
        lines.append("  format 2, delta coding: `ndindex upgrade` adds restart tables "
                     "(format 5: faster queries)")
    elif info.get("format") == 3:
        lines.append("  format 3: `ndindex upgrade` packs raw blocks and lets tombstones "
                     "form several runs (format 5: smaller files and commits)")
    elif info.get("format") == 4:
        lines.append("  format 4: `ndindex upgrade` lets tombstones form several runs "
                     "(format 5: smaller commits as fingerprints are removed)")
    if info.get("key_bytes"):
        lines.append(f"  document keys: {info['key_bytes']:,} bytes in "
                     f"{_plural(info['key_runs'], 'run')}")
    if info.get("oldest_reader_lag"):
        oldest = min(info["readers"], key=lambda r: r["txnid"])
        lines.append(f"  a read open in process {oldest['pid']} is "
                     f"{_plural(info['oldest_reader_lag'], 'commit')} behind: pages freed "
                     "since it began are not reused (the file grows) until it ends")
    if info.get("probabilistic"):
        lines.append(f"  probabilistic plan: a query probes the flip sets of table 0's "
                     f"{prefixes[0]}-bit prefix, most likely first "
                     f"({psm_max_probes(info['k'])} at k={info['k']} by default)")
    if per_table:
        for t in tables:
            entries = sum(t["run_entries"])
            bits = f"{8 * t['bytes'] / entries:.2f}" if entries else "-"
            lines.append(f"  table {t['table']:3d}: p={t['prefix_bits']:2d}  {entries:,} "
                         f"entries in {_plural(t['runs'], 'run')}  {t['bytes']:,} bytes  "
                         f"{bits} bits/fingerprint")
    return lines


def _cmd_verify(args) -> int:
    if args.output is not None and not args.repair:
        raise ValueError("-o is for --repair")
    progress = _Progress(not args.json, interval=1.0)
    try:
        try:
            with _open_index(args.index, readonly=True) as ix:
                report = ix.verify(progress=progress)
        finally:
            progress.clear()
    except NdindexError as exc:
        hint = "" if args.repair else _repair_hint(exc, args)
        print(_error_line(_damage_text(exc), args.index) + hint, file=sys.stderr)
        if not args.repair:
            return EXIT_ERROR
        out = args.output if args.output is not None else args.index + ".recovered"
        return _recover_into(args.index, out, args.json)
    if args.json:
        _json(dict(ok=True, **report))
    else:
        print(f"{args.index}: ok ({report['tables']} tables, {report['runs']} runs, "
              f"{report['chunks']:,} chunks, {report['table_entries']:,} fingerprints in the "
              f"runs, {report['log_entries']:,} operations in the log)"
              + ("; nothing to repair" if args.repair else ""))
    return EXIT_OK


#: Commands whose INDEX is an existing index file the error may be about.
_READS_INDEX = {"add", "query", "remove", "compact", "stats", "verify", "export", "similar",
                "pairs", "clusters"}


def _repair_hint(exc: BaseException, args) -> str:
    """For damage found in the command's index: the command that salvages it
    (appended to the error's one line)."""
    index = getattr(args, "index", None)
    if isinstance(exc, CorruptionError) and index and \
            getattr(args, "command", None) in _READS_INDEX:
        return f"; `ndindex verify --repair {index}` salvages what it can"
    return ""


def _damage_text(exc: NdindexError) -> str:
    """The error's message, naming a record whose key is plain text by that text too."""
    key = getattr(exc, "key", None)
    text = str(exc)
    if key and all(0x20 < b < 0x7F for b in key):
        text += f" (the {getattr(exc, 'database', None) or ''} record {key.decode()!r})"
    return text


def _cmd_recover(args) -> int:
    return _recover_into(args.index, args.output, args.json)


def _recover_into(damaged: str, out: str, as_json: bool) -> int:
    """Run ndindex.recover and report it: 0 complete, 1 partial, 2 nothing recoverable."""
    salvage = importlib.import_module("ndindex.recover")
    progress = _Progress(not as_json, interval=1.0)
    try:
        report = salvage.recover(damaged, out, progress=progress)
    finally:
        progress.clear()
    if as_json:
        _json(report)
    for problem in report["problems"]:
        print(_error_line(problem, damaged), file=sys.stderr)
    if report["output"] is None:
        print(f"ndindex: {damaged}: nothing recoverable", file=sys.stderr)
    elif not as_json:
        c = report["counts"]
        lost = [f"{c[k]:,} {what}" for k, what in (
            ("table_chunks_lost", "table chunks"), ("table_blocks_lost", "table blocks"),
            ("log_records_lost", "log records"),
            ("documents_maybe_lost", "documents")) if c.get(k)]
        docs = f", {report['documents']:,} documents" if report.get("documents") else ""
        print(f"recovered {report['fingerprints']:,} fingerprints and {report['keys']:,} "
              f"document keys{docs} from {damaged} into {out}: "
              + ("complete" if report["complete"] else
                 f"partial ({len(report['problems'])} problems, listed on stderr)")
              + (f"; could not read {', '.join(lost)}" if lost else ""))
    return report["status"]


def _cmd_export(args) -> int:
    from ndindex.dump import export_index
    with _open_index(args.index, readonly=True) as ix:
        if args.output == "-":
            counts = export_index(ix, sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            if os.path.exists(args.output):
                raise FileExistsError(17, "already exists", args.output)
            try:
                with open(args.output, "wb") as fh:
                    counts = export_index(ix, fh)
            except BaseException:
                os.unlink(args.output)
                raise
    print(f"exported {counts['fingerprints']:,} fingerprints and {counts['keys']:,} keys to "
          f"{'stdout' if args.output == '-' else args.output}", file=sys.stderr)
    return EXIT_OK


def _cmd_import(args) -> int:
    from ndindex.dump import import_index
    if args.dump == "-":
        counts = import_index(sys.stdin.buffer, args.index, name="<stdin>")
    else:
        with open(args.dump, "rb") as fh:
            counts = import_index(fh, args.index, name=args.dump)
    if args.json:
        _json(dict(index=args.index, **counts))
    else:
        print(f"imported {counts['fingerprints']:,} fingerprints and {counts['keys']:,} keys "
              f"into {args.index}")
    return EXIT_OK


def _cmd_upgrade(args) -> int:
    if args.output is not None and args.no_backup:
        raise ValueError("--no-backup is for in-place upgrades; with -o the original is "
                         "left as it is")
    progress = _Progress(not args.json, interval=1.0)
    try:
        report = _upgrade.upgrade(args.index, args.output, backup=not args.no_backup,
                                  progress=progress)
    finally:
        progress.clear()
    if args.json:
        _json(report)
    elif not report["upgraded"]:
        print(f"{args.index}: already format {report['format']}, nothing to do")
    else:
        where = (f"original kept as {report['backup']}" if report["backup"]
                 else "its tables rewritten in place" if args.output is None
                 and not report["rebuilt"]
                 else "original deleted" if args.output is None
                 else f"written to {report['output']}, {args.index} left as it is")
        keys = "" if report["keys"] is None else f"{report['keys']:,} document keys, "
        print(f"upgraded {args.index} to format {report['format']}: "
              f"{report['fingerprints']:,} fingerprints, {keys}{report['tables']} tables; {where} "
              f"({report['source_bytes']:,} -> {report['output_bytes']:,} bytes, "
              f"{report['seconds']['total']:.2f} s)")
        if report["orphan_keys"]:
            print(f"ndindex: {args.index}: {report['orphan_keys']:,} document keys of removed "
                  "fingerprints were not copied", file=sys.stderr)
    return EXIT_OK


# -- documents --------------------------------------------------------------------

#: Documents per Index.add_documents call of ``ndindex add --docs/--jsonl``: one
#: commit each, and enough texts for its fingerprinting to use every core.
ADD_BATCH_DOCS = 20_000
#: ... and at most this many characters of text held at once.
ADD_BATCH_CHARS = 256 << 20


def _add_document_commands(commands) -> None:
    """Register the document queries: similar, pairs, clusters."""
    threshold_help = ("Jaccard similarity of word 3-shingles to reach (default: the index's, "
                      "0.8; not below it)")
    p = _sub(commands, "similar", "find stored documents near-duplicate to a text or file",
             "Print the stored documents whose Jaccard similarity of word 3-shingles with "
             "the query reaches the threshold, most similar first: candidates share a lookup "
             "key with the query, whatever their simhash distance, and each is verified by "
             "its sketch.  The query is a FILE (text in any character set), --text, or "
             "--key of a stored document (left out of its own results).  A text of fewer "
             "than 4 distinct word 3-shingles (about 6 words; at threshold 0.9, 9 shingles, "
             "about 11 words) can only match the same words: a note on stderr says so.",
             ["ndindex similar docs.ndx draft.md",
              "ndindex similar docs.ndx --text 'the quick brown fox jumps over the lazy dog'",
              "ndindex similar docs.ndx --key notes/a.txt --threshold 0.9 --json",
              "ndindex similar docs.ndx draft.md --limit 5"],
             _cmd_similar)
    p.add_argument("index", metavar="INDEX")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("file", nargs="?", metavar="FILE", help="a text file")
    what.add_argument("--text", metavar="TEXT", help="this text")
    what.add_argument("--key", metavar="KEY", help="the stored document of this key")
    p.add_argument("--threshold", type=float, metavar="J", help=threshold_help)
    p.add_argument("--limit", type=int, metavar="N", help="print at most N documents")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _sub(commands, "pairs", "list every pair of near-duplicate stored documents",
             "Print every pair of stored documents whose Jaccard similarity of word "
             "3-shingles reaches the threshold, verified: similarity, then both keys, one pair "
             "a line.  Reads every document (time and memory grow with the documents, and "
             "with the pairs: m identical texts make m(m-1)/2 of them; `clusters` does not "
             "expand them).",
             ["ndindex pairs docs.ndx", "ndindex pairs docs.ndx --threshold 0.9 --json"],
             _cmd_pairs)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--threshold", type=float, metavar="J", help=threshold_help)
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _sub(commands, "clusters", "group the stored documents into near-duplicate clusters",
             "Print the groups of stored documents joined by near-duplicate pairs (union-find "
             "over the verified pairs), largest first.  Reads every document.",
             ["ndindex clusters docs.ndx", "ndindex clusters docs.ndx --min-size 3",
              "ndindex clusters docs.ndx --threshold 0.9 --json"],
             _cmd_clusters)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--threshold", type=float, metavar="J", help=threshold_help)
    p.add_argument("--min-size", type=int, default=2, metavar="N",
                   help="smallest cluster printed (default 2; 1 lists every document)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _document_key(name: str):
    """A document key for a name from the command line or a path: str if it is
    UTF-8, else its bytes (a file name that is not UTF-8)."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return os.fsencode(name)


def _key_bytes(key) -> int:
    return len(key.encode("utf-8") if isinstance(key, str) else key)


def _cmd_create(args) -> int:
    """ndindex create; --docs, --threshold and --bottom-k choose the document pipeline."""
    from ndindex.codec import CODING_NAMES
    from ndindex.fingerprint import Fingerprinter
    docs = args.docs or args.threshold is not None or args.bottom_k is not None
    if docs and args.no_fingerprinter:
        raise ValueError("--docs, --threshold and --bottom-k need the fingerprinter that "
                         "--no-fingerprinter leaves out")
    options = {name: value for name, value in (("threshold", args.threshold),
                                               ("bottom_k", args.bottom_k)) if value is not None}
    fpr = None if args.no_fingerprinter else Fingerprinter(**options)
    with Index.create(args.index, k=args.k, expected_n=args.n, fingerprinter=fpr,
                      coding={name: c for c, name in CODING_NAMES.items()}[args.coding]) as ix:
        prefixes = [t.prefix_bits for t in ix.plan.tables]
        info = dict(path=ix.path, k=ix.k, expected_n=args.n, tables=len(prefixes),
                    prefix_bits=[min(prefixes), max(prefixes)],
                    probabilistic=ix.plan.probabilistic, fingerprinter=fpr is not None)
    if docs:
        info["documents"] = dict(threshold=fpr.threshold, bottom_k=fpr.bottom_k)
    if args.json:
        _json(info)
        return EXIT_OK
    print(f"created {info['path']}: k={info['k']}, {_plural(info['tables'], 'table')} "
          f"({_prefixes(*info['prefix_bits'])}"
          + (", probabilistic" if info["probabilistic"] else "")
          + f"), planned for {args.n:,} fingerprints"
          + (f"; documents: threshold {fpr.threshold:g}, bottom-{fpr.bottom_k} sketches"
             if docs else ""))
    return EXIT_OK


def _cmd_add_documents(args) -> int:
    """ndindex add: documents with --docs or --jsonl, else a fingerprint list (_cmd_add)."""
    if not args.docs and args.jsonl is None:
        return _cmd_add(args)
    if args.docs and args.jsonl is not None:
        raise ValueError("give --docs or --jsonl, not both")
    if args.source != "-":
        raise ValueError(f"{args.source}: a fingerprint list, and --docs or --jsonl: give one")
    invalid = 0
    if args.jsonl is not None:
        docs, invalid = _read_document_lines(args.jsonl, args.skip_invalid)
        items = iter(docs.items())
    counts = dict(added=0, skipped=0)
    with _open_index(args.index) as ix:
        if args.docs:
            items = _document_files(args.docs, counts)
        batch, chars = {}, 0
        for key, text in items:
            batch.pop(key, None)            # a key given again replaces its text
            batch[key] = text
            chars += len(text)
            if len(batch) >= ADD_BATCH_DOCS or chars >= ADD_BATCH_CHARS:
                _add_document_batch(ix, batch, counts)
                batch, chars = {}, 0
        _add_document_batch(ix, batch, counts)
        total = len(ix)
    if args.json:
        _json(dict(added=counts["added"], skipped=counts["skipped"], invalid=invalid,
                   fingerprints=total))
    else:
        print(f"added {counts['added']:,} document{'s' if counts['added'] != 1 else ''} "
              f"({total:,} distinct fingerprints in the index)"
              + (f"; skipped {counts['skipped']:,}" if counts["skipped"] else "")
              + (f"; skipped {invalid:,} invalid line{'s' if invalid != 1 else ''}"
                 if invalid else ""))
    return EXIT_OK


def _document_files(paths, counts: dict):
    """Yield (key, text) of the files under paths; report and count the others."""
    from ndindex.records import MAX_DOC_KEY_BYTES
    from ndindex.textfile import NotText
    for path in _document_paths(paths):
        key = _document_key(os.path.normpath(path))     # ./a.txt is a.txt
        if _key_bytes(key) > MAX_DOC_KEY_BYTES:
            problem = f"path of {_key_bytes(key)} bytes, above the {MAX_DOC_KEY_BYTES} of a key"
        else:
            try:
                yield key, _document_text(path)
                continue
            except OSError as exc:
                problem = exc.strerror or str(exc)
            except NotText as exc:                  # binary, undecodable
                problem = str(exc)
        print(f"ndindex: {_dedup.display_path(path)}: {problem}, skipped", file=sys.stderr)
        counts["skipped"] += 1


def _add_document_batch(ix: Index, batch: dict, counts: dict) -> None:
    """Add a batch of documents; a text without a word to fingerprint is reported
    and skipped (the check runs only when add_documents refuses one)."""
    if not batch:
        return
    keys = list(batch)
    try:
        counts["added"] += ix.add_documents([batch[k] for k in keys], keys)
        return
    except ValueError:
        fpr = _fingerprinter_of(ix)
        empty = [k for k in keys if len(fpr.sketch(batch[k])) == 0]
        if not empty:
            raise
    for key in empty:
        print(f"ndindex: {_key_text(key)}: no words to fingerprint, skipped", file=sys.stderr)
    counts["skipped"] += len(empty)
    rest = [k for k in keys if k not in set(empty)]
    if rest:
        counts["added"] += ix.add_documents([batch[k] for k in rest], rest)


def _parse_document_line(raw: bytes):
    """Return (key, text) of a JSON line, or None for a blank one; ValueError says why not."""
    from ndindex.records import MAX_DOC_KEY_BYTES
    if not raw.strip():
        return None
    try:
        item = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})" if hasattr(exc, "msg")
                         else f"not UTF-8 JSON ({exc})") from None
    if not isinstance(item, dict):
        raise ValueError(f'not a JSON object: {{"key": ..., "text": ...}}, got {type(item).__name__}')
    unknown = sorted(set(item) - {"key", "text"})
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (fields: key, text)")
    key, text = item.get("key"), item.get("text")
    if not isinstance(key, str) or not key:
        raise ValueError('"key" must be a non-empty string')
    if _key_bytes(key) > MAX_DOC_KEY_BYTES:
        raise ValueError(f'"key" is {_key_bytes(key)} bytes of UTF-8, at most {MAX_DOC_KEY_BYTES}')
    if not isinstance(text, str):
        raise ValueError('"text" must be a string')
    return key, text


def _read_document_lines(source: str, skip_invalid: bool) -> tuple[dict, int]:
    """Return ({key: text}, invalid count) of a JSON-lines file (see _read_lines).

    A key given again replaces its text (and moves to its new place).
    """
    items, invalid = _read_lines(source, skip_invalid, _parse_document_line)
    docs = {}
    for key, text in items:
        docs.pop(key, None)
        docs[key] = text
    return docs, invalid


def _threshold_of(ix: Index, threshold) -> float:
    """The threshold a document query ran at: the given one, or the index's."""
    return _fingerprinter_of(ix).threshold if threshold is None else threshold


def _exact_only_note(ix: Index, text, threshold: float) -> str | None:
    """A sentence when a query text is too short for any other text to reach threshold."""
    from ndindex.fingerprint.bands import min_values_for
    fewest = min_values_for(threshold)
    shingles = len(_fingerprinter_of(ix).sketch(text))
    if shingles >= fewest:
        return None
    if shingles == 0:
        return "the text has no words to compare: no document can match it"
    return (f"the text has {shingles} distinct word 3-shingle{'s' if shingles != 1 else ''}, "
            f"fewer than {fewest}: no other text can reach similarity {threshold:g} with it, "
            "so it matches only texts of the same words")


def _cmd_similar(args) -> int:
    note = None
    with _open_index(args.index, readonly=True) as ix:
        if args.key is not None:
            key = _document_key(args.key)
            try:
                matches = ix.similar(key=key, threshold=args.threshold, limit=args.limit)
            except KeyError:
                raise NdindexError(f"no document has the key {args.key!r}") from None
            query = dict(key=_key_json(key))
        else:
            if args.text is not None:
                text, query = args.text, dict(text=args.text)
            else:
                from ndindex.textfile import NotText
                try:
                    text = _document_text(args.file)
                except NotText as exc:
                    raise _FileError(args.file, f"{exc}; documents must be text") from None
                query = dict(file=args.file)
            matches = ix.similar(text, threshold=args.threshold, limit=args.limit)
        threshold = _threshold_of(ix, args.threshold)
        if args.key is None:
            note = _exact_only_note(ix, text, threshold)
    if note is not None:
        print(f"ndindex: note: {note}", file=sys.stderr)
    if args.json:
        _json(dict(query=query, threshold=threshold, note=note, matches=[
            dict(key=_key_json(m.key), similarity=round(m.similarity, 4),
                 fingerprint_hex=_hex(m.fingerprint)) for m in matches]))
    else:
        what = (f"key {_key_text(_document_key(args.key))}" if args.key is not None
                else "the text" if args.text is not None else args.file)
        print(f"similar to {what} (threshold {threshold:g}): {len(matches)} "
              f"document{'s' if len(matches) != 1 else ''}")
        for m in matches:
            print(f"  {m.similarity:.4f}  {_key_text(m.key)}")
    return EXIT_OK if matches else EXIT_NONE


def _cmd_pairs(args) -> int:
    with _open_index(args.index, readonly=True) as ix:
        pairs = ix.near_duplicate_pairs(args.threshold)
        threshold = _threshold_of(ix, args.threshold)
    if args.json:
        _json(dict(threshold=threshold, pairs=[
            dict(a=_key_json(a), b=_key_json(b), similarity=round(s, 4)) for a, b, s in pairs]))
    else:
        for a, b, s in pairs:
            print(f"{s:.4f}  {_key_text(a)}  {_key_text(b)}")
        print(f"{len(pairs):,} pair{'s' if len(pairs) != 1 else ''} at similarity >= "
              f"{threshold:g}.")
    return EXIT_OK


def _cmd_clusters(args) -> int:
    with _open_index(args.index, readonly=True) as ix:
        clusters = ix.clusters(args.threshold, min_size=args.min_size)
        threshold = _threshold_of(ix, args.threshold)
    if args.json:
        _json(dict(threshold=threshold, min_size=args.min_size,
                   clusters=[[_key_json(k) for k in c] for c in clusters]))
    else:
        for n, cluster in enumerate(clusters, 1):
            print(f"cluster {n}: {len(cluster)} document{'s' if len(cluster) != 1 else ''}")
            for key in cluster:
                print(f"  {_key_text(key)}")
            print()
        members = sum(len(c) for c in clusters)
        print(f"{_plural(len(clusters), 'cluster')} of {_plural(members, 'document')} at "
              f"similarity >= {threshold:g}.")
    return EXIT_OK


# -- dedup ----------------------------------------------------------------------


class _Progress:
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


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _cmd_dedup(args) -> int:
    index = args.index
    if index is None:
        index = _dedup.default_index_path(args.paths)
    for path in args.paths:     # a missing PATH is an error, before any work
        if not os.path.lexists(path):
            raise FileNotFoundError(2, "No such file or directory", path)
    if not args.quiet:
        print(f"ndindex: index {index}", file=sys.stderr)
    progress = _Progress(not args.quiet)
    given = {name: getattr(args, name) for name in ("min_size", "max_size", "max_candidates")
             if getattr(args, name) is not None}
    try:
        result = _dedup.dedup(args.paths, index=index, k=args.k, threshold=args.threshold,
                              follow_symlinks=args.follow_symlinks,
                              include_binary=args.include_binary, decompress=args.decompress,
                              jobs=args.jobs, progress=progress, **given)
    finally:
        progress.clear()
    if not args.quiet:
        for path, problem in result.errors:
            print(f"ndindex: {_dedup.display_path(path)}: {problem} (skipped)", file=sys.stderr)
        for note in result.notes:
            print(f"ndindex: {note}", file=sys.stderr)
    if args.json:
        _json(_dedup_json(result))
    elif args.csv:
        _dedup_csv(result)
    else:
        _dedup_text(result)
    return EXIT_FOUND if result.clusters else EXIT_OK


def _pair_json(p) -> dict:
    return dict(a=p.a, b=p.b, distance=p.distance, similarity=round(p.similarity, 4),
                exact=p.exact)


def _file_json(f, representative: bool) -> dict:
    entry = dict(path=f.display_path, size=f.size, content_hash=f.content_hash,
                 simhash=None if f.simhash is None else _hex(f.simhash),
                 representative=representative,
                 links=[dict(path=_dedup.display_path(p), kind=kind) for p, kind in f.links])
    raw = os.fsencode(f.path)
    if f.display_path.encode("utf-8", "surrogateescape") != raw:
        entry["path_bytes_hex"] = raw.hex()   # the name is not valid UTF-8
    return entry


def _dedup_json(result) -> dict:
    clusters = [dict(id=n, kind=c.kind,
                     files=[_file_json(f, i == 0) for i, f in enumerate(c.files)],
                     reclaimable_bytes=c.reclaimable_bytes,
                     pairs=[_pair_json(p) for p in c.pairs])
                for n, c in enumerate(result.clusters, 1)]
    return dict(index=result.index_path, files_scanned=result.files_scanned,
                files_read=result.files_read, files_unchanged=result.files_unchanged,
                files_removed=result.files_removed, bytes_read=result.bytes_read,
                skipped=result.skipped, links=result.links,
                errors=[dict(path=_dedup.display_path(p), error=e) for p, e in result.errors],
                duplicate_files=result.duplicate_files,
                seconds=round(result.seconds, 3), clusters=clusters)


def _dedup_csv(result) -> None:
    import csv
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["cluster", "kind", "path", "size", "content_hash", "simhash", "representative",
                  "distance_to_representative", "similarity_to_representative", "links"])
    for n, c in enumerate(result.clusters, 1):
        to_first = {p.b: p for p in c.pairs if p.a == 0}
        for i, f in enumerate(c.files):
            p = to_first.get(i)
            out.writerow([n, c.kind, f.display_path, f.size, f.content_hash,
                          "" if f.simhash is None else _hex(f.simhash), int(i == 0),
                          "" if p is None or p.distance is None else p.distance,
                          "" if p is None else f"{p.similarity:.4f}",
                          ";".join(_dedup.display_path(path) for path, _ in f.links)])


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


#: How the summary names each skip reason: (one, many).
_SKIPPED_WORDS = {
    "symlink": ("symlink not followed", "symlinks not followed"),
    "broken symlink": ("broken symlink", "broken symlinks"),
    "special": ("special file", "special files"),
    "index": ("file of the index", "files of the index"),
    "too small": ("too small", "too small"),
    "too large": ("too large", "too large"),
    "binary": ("binary", "binary"),
    "undecodable": ("undecodable (no character set fits)", "undecodable (no character set fits)"),
}


def _dedup_text(result) -> None:
    for n, c in enumerate(result.clusters, 1):
        total = sum(f.size for f in c.files)
        what = "identical files" if c.kind == "exact" else "near-duplicates"
        print(f"cluster {n}: {len(c.files)} {what}, {_human(total)}"
              + (f", {_human(c.reclaimable_bytes)} in exact copies" if c.reclaimable_bytes else ""))
        to_first = {p.b: p for p in c.pairs if p.a == 0}
        for i, f in enumerate(c.files):
            p = to_first.get(i)
            how = "" if p is None else "  (identical)" if p.exact else \
                f"  (similarity {p.similarity:.2f}, simhash distance {p.distance})"
            print(f"  {'*' if i == 0 else ' '} {f.size:>10,} B  {f.display_path}{how}")
            for path, kind in f.links:
                print(f"      {'':>10}    also {_dedup.display_path(path)} ({kind}, not a copy)")
        print()
    if result.clusters:
        print("* the representative: the largest file, which the others are compared with.")
    parts = [f"{_plural(result.files_scanned, 'file')} checked ({result.files_read:,} read, "
             f"{result.files_unchanged:,} unchanged"
             + (f", {result.files_removed:,} gone from disk forgotten" if result.files_removed
                else "") + ")"]
    if result.skipped:
        parts.append("skipped: " + ", ".join(
            f"{n:,} {_SKIPPED_WORDS.get(why, (why, why))[n != 1]}"
            for why, n in sorted(result.skipped.items())))
    if result.links:
        parts.append(", ".join(_plural(n, kind) for kind, n in sorted(result.links.items()))
                     + " to files or directories already counted (links, not copies)")
    if result.errors:
        parts.append(f"{len(result.errors):,} unreadable")
    print("; ".join(parts) + ".")
    if result.clusters:
        exact = sum(c.reclaimable_bytes for c in result.clusters)
        print(f"{_plural(len(result.clusters), 'cluster')}, "
              f"{_plural(result.duplicate_files, 'duplicate file')}, "
              f"{_human(exact)} in exact copies.")
    else:
        print("no duplicates.")


# -- entry point ------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _named_files(args) -> list:
    """The files a command line names (its index, input, dump, output)."""
    names = ("index", "source", "dump", "file", "jsonl", "output")
    return [v for v in (getattr(args, n, None) for n in names) if isinstance(v, str) and v != "-"]


def _error_line(exc: BaseException, file, named: Sequence[str] = ()) -> str:
    """Return ``ndindex: <file>: <problem>`` for an error about a file.

    The file is the exception's own (its ``filename``) or else the one the
    command works on; a message that already begins with the file's name
    keeps one copy of it, and one that begins with another file the command
    names, or a file beside it (``INDEX.files: ...``), is printed as it is.
    """
    if getattr(exc, "filename", None) is not None:
        file = exc.filename
    problem = _one_line(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
    if file is None:
        return f"ndindex: {problem}"
    name = _dedup.display_path(file)
    for prefix in (f"{name}: ", f"{os.path.abspath(name)}: "):
        while problem.startswith(prefix):
            problem = problem[len(prefix):]
    others = [n for other in named for n in (other, os.path.abspath(other)) if other != file]
    if problem.startswith(tuple(f"{n}: " for n in others)) or (
            problem.startswith((name, os.path.abspath(name))) and ": " in problem):
        return f"ndindex: {problem}"
    return f"ndindex: {name}: {problem}"


def _silence_stdout() -> None:
    # The reader closed the pipe: point stdout at /dev/null so that the
    # interpreter's final flush does not fail again with a traceback.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is not a real file (tests)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ndindex`` command line.

    Parameters: argv, the arguments without the program name (default sys.argv[1:]).
    Returns the exit status (EXIT_CODES_HELP): 0 success, 1 dedup found
    duplicates or query found nothing, 2 an error (one line on stderr naming
    the file, or one per invalid input line), 130 interrupted, 141 the
    reader of the output went away (as a process killed by SIGPIPE).
    """
    parser = _build_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        return args.run(args)
    except SystemExit as exc:           # --help and --version exit through here
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        print("ndindex: interrupted; the index is consistent, a re-run resumes", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except _InvalidInput as exc:
        print(f"ndindex: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (OSError, NdindexError, _FileError) as exc:
        print(_error_line(exc, getattr(args, "index", None), _named_files(args))
              + _repair_hint(exc, args), file=sys.stderr)
        return EXIT_ERROR
    except (_UsageError, ValueError, TypeError) as exc:
        print(f"ndindex: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
