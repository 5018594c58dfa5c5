"""The ``ndindex`` command: a thin layer over the public API.

This module parses the command line and maps errors to exit statuses; each
subcommand is a function ``cmd_<name>(args) -> int`` registered in
``_build_parser``: in :mod:`ndindex.cli_index` (add, query, remove,
compact, vacuum, stats, verify, recover, export, import, upgrade),
:mod:`ndindex.cli_documents` (create, add --docs, similar, pairs,
clusters), :mod:`ndindex.cli_dedup` (dedup), and here (plan); what they
share is in :mod:`ndindex.cli_common`.  Errors are one line on stderr, with
exit status 2: ``ndindex: error: ...`` for usage and bad values (argparse's
two-line message included), ``ndindex: <file>: <problem>`` for files.
The dedup job itself lives in :mod:`ndindex.dedup`, the dump in
:mod:`ndindex.dump`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

# cli_common first: it readies numpy's import.
from ndindex.cli_common import (EXIT_BROKEN_PIPE, EXIT_CODES_HELP, EXIT_ERROR, EXIT_INTERRUPTED,
                                EXIT_OK, MAX_REPORTED_LINES, FileError, InvalidInput, subcommand,
                                error_line, one_line, parse_fingerprint)
from ndindex import cli_dedup, cli_documents, cli_index  # noqa: I001 - after cli_common
from ndindex import __version__
from ndindex.errors import NdindexError
from ndindex.records import FORMAT_VERSION
from ndindex.plan import Plan, candidate_designs, choose_plan, psm_max_probes


class _UsageError(Exception):
    """Raised by the parser instead of printing usage and exiting."""


class _Parser(argparse.ArgumentParser):
    #: Said after "unrecognized arguments" or a missing required option: how
    #: the command takes what was given.
    stray_hint = ""

    def parse_known_args(self, args=None, namespace=None):
        # A subcommand's extra arguments are reported by the top parser, which
        # knows no hint: report them here.
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self.stray_hint:
            self.error(f"unrecognized arguments: {' '.join(extras)} ({self.stray_hint})")
        return namespace, extras

    def error(self, message):   # argparse would print usage and call sys.exit(2)
        if self.stray_hint and message.startswith("the following arguments are required"):
            message += f" ({self.stray_hint})"
        raise _UsageError(message)


def _query_fingerprint(text: str) -> int:
    """parse_fingerprint, saying how to query a file or a text given in its place."""
    try:
        return parse_fingerprint(text)
    except argparse.ArgumentTypeError as exc:
        if os.path.exists(text):
            raise argparse.ArgumentTypeError(f"{exc}; to query this file: --file {text}") from None
        if any(c.isspace() for c in text):
            raise argparse.ArgumentTypeError(f"{exc}; to query a text: --text TEXT") from None
        raise


_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}


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


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ndindex", description="Embedded near-duplicate index tools: find "
                     "duplicate files (dedup) and manage index files.",
                     epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"ndindex {__version__} (file format {FORMAT_VERSION})")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    p = subcommand(commands, "dedup", "find exact and near-duplicate files under directories",
                    "Walk PATHs, fingerprint text-like files, and report clusters of files that "
                    "are byte-identical or near-duplicates (Jaccard of word 3-shingles >= the "
                    "threshold, whatever their simhash distance).  Text in any character set is "
                    "read, and compressed files through their decompressor.  Each cluster is "
                    "printed once, its representative (*) first; --json and --csv give every "
                    "pair.  The index, one file, makes a re-run read only new and changed files; "
                    "one --index may serve different PATHs: a file is forgotten only when it is "
                    "gone from disk.",
                    ["ndindex dedup /usr/share/common-licenses",
                     "ndindex dedup --index docs.ndx ~/Documents ~/Downloads",
                     "ndindex dedup --json src/ > clusters.json",
                     "ndindex dedup --csv --include-binary --min-size 1K photos/ > dups.csv"],
                    cli_dedup.cmd_dedup)
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

    p = subcommand(commands, "create", "create an empty index",
                    "Create an index file for fingerprints within distance k.  It stores the "
                    "default fingerprinter, so documents and texts can be added and queried.  With "
                    "--docs (implied by --threshold and --bottom-k), say so and choose the "
                    "document pipeline's threshold (the lowest `similar`, `pairs` and `clusters` "
                    "accept) and sketch size.",
                    ["ndindex create pages.ndx -k 3 -n 10M", "ndindex create docs.ndx --docs",
                     "ndindex create strict.ndx --docs --threshold 0.9 --bottom-k 256",
                     "ndindex create wide.ndx -k 10 --psm"],
                    cli_documents.cmd_create)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("-k", type=int, default=3, metavar="K", help="largest query distance (default 3)")
    p.add_argument("-n", type=_count, default=1_000_000, metavar="N",
                   help="expected number of fingerprints (default 1M)")
    p.add_argument("--coding", choices=["delta+restarts", "delta", "xor"],
                   default="delta+restarts",
                   help="block coding (default delta+restarts; delta or xor make a file that "
                        "ndindex before format 3 can open too; the default makes a format-5 "
                        "file)")
    p.add_argument("--psm", action="store_true",
                   help="probabilistic simhash matching: one table, probed at the most likely "
                        "flip sets of its prefix (far smaller and faster at large k; may miss "
                        "a near-duplicate; docs/psm.md)")
    p.add_argument("--no-fingerprinter", action="store_true",
                   help="store no fingerprinter (fingerprints only)")
    p.add_argument("--docs", "--documents", action="store_true",
                   help="an index for documents (ndindex add --docs, similar, clusters)")
    p.add_argument("--threshold", type=float, metavar="J",
                   help="with --docs: the lowest Jaccard similarity queries may ask for "
                        "(default 0.8; lower thresholds store more lookup keys)")
    p.add_argument("--bottom-k", type=int, metavar="K",
                   help="with --docs: values per document sketch (default 1024; a smaller "
                        "sketch is smaller and coarser)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "add", "add fingerprints (from a file or stdin) or documents",
                    "Add fingerprints, one per line as decimal or 0x-hex, optionally followed by "
                    "white space and a document key (UTF-8); blank lines and lines starting with # "
                    "are ignored.  Any invalid line stops the whole input unless --skip-invalid.  "
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
                    cli_documents.cmd_add_documents)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("source", nargs="?", default="-", metavar="FILE",
                   help="fingerprint list (default -: stdin)")
    p.add_argument("--docs", "--documents", nargs="+", metavar="PATH",
                   help="add these files as documents, keyed by path (directories recursively)")
    p.add_argument("--jsonl", metavar="FILE",
                   help='add the documents of JSON lines {"key": K, "text": T} from FILE '
                        "(- for stdin)")
    p.add_argument("--skip-invalid", action="store_true",
                   help="add the valid lines and count the invalid ones (default: report "
                        f"the invalid lines, up to {MAX_REPORTED_LINES}, and add nothing)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "query", "find stored fingerprints near a fingerprint, text or file",
                    "Print every stored fingerprint within distance k of the query, nearest first, "
                    "with its document keys.  A text or file is fingerprinted with the index's "
                    "fingerprinter.  On a probabilistic (psm) index the query probes the most "
                    "likely flip sets of its prefix (a text's own flip probabilities, from the "
                    "fingerprinter's flip model), up to --max-probes of them.  With "
                    "--fingerprints-from, every fingerprint of a list is queried in one batch "
                    "and the queries with a match are printed, each with its line's key.",
                    ["ndindex query pages.ndx 0x0123456789abcdef",
                     "ndindex query docs.ndx --text 'the quick brown fox' -k 6",
                     "ndindex query docs.ndx --file draft.md --json",
                     "ndindex query pages.ndx --fingerprints-from new-crawl.txt"],
                    cli_index.cmd_query)
    p.add_argument("index", metavar="INDEX")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("fingerprint", nargs="?", type=_query_fingerprint, metavar="FINGERPRINT")
    what.add_argument("--text", metavar="TEXT", help="fingerprint this text")
    what.add_argument("--file", metavar="PATH", help="fingerprint this file")
    what.add_argument("--fingerprints-from", metavar="FILE",
                      help="query every fingerprint of a list as `add` reads it (- for stdin; "
                           "a key after a fingerprint labels its query)")
    p.add_argument("--skip-invalid", action="store_true",
                   help="with --fingerprints-from: query the valid lines and count the invalid "
                        "ones (default: report the invalid lines and query nothing)")
    p.add_argument("-k", type=int, metavar="K", help="distance (default: the index's k)")
    p.add_argument("--max-probes", type=int, metavar="N",
                   help="flip sets to probe: probabilistic matching (default on a psm index: "
                        f"{psm_max_probes(3)} at k=3, {psm_max_probes(10)} at k=10; with --text "
                        "or --file, makes the query probabilistic on any index)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "remove", "remove fingerprints or document keys",
                    "Remove fingerprints (with all their keys) or document keys (a fingerprint "
                    "goes with its last key).",
                    ["ndindex remove pages.ndx --fingerprint 0x0123456789abcdef",
                     "ndindex remove docs.ndx --key notes/old.md",
                     "ndindex remove pages.ndx --fingerprints-from added.txt",
                     "find old/ -type f | ndindex remove docs.ndx --keys-from -"],
                    cli_index.cmd_remove)
    p.stray_hint = "name what to remove: --fingerprint FP... or --key KEY..."
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--fingerprint", type=parse_fingerprint, nargs="+", default=[], metavar="FP")
    p.add_argument("--key", nargs="+", default=[], metavar="KEY")
    p.add_argument("--fingerprints-from", metavar="FILE",
                   help="also the fingerprints of a list as `add` reads it (- for stdin; a "
                        "key after a fingerprint is ignored: the list that added them removes "
                        "them)")
    p.add_argument("--keys-from", metavar="FILE",
                   help="also the keys of FILE, one a line as it is (UTF-8; - for stdin; "
                        "blank lines skipped)")
    p.add_argument("--skip-invalid", action="store_true",
                   help="remove what the valid lines name and count the invalid ones "
                        "(default: report the invalid lines and remove nothing)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "compact", "merge the append log and removals into the tables",
                    "Flush the append log into the tables' runs and do every merge that is "
                    "due, now, in steps of one commit each (an interrupted compaction keeps "
                    "the steps it finished).  --full merges each table into one run, drops "
                    "every tombstone and, when no other process has the index open, gives "
                    "the free space back to the disk as `ndindex vacuum` does.",
                    ["ndindex compact pages.ndx", "ndindex compact pages.ndx --full --json"],
                    cli_index.cmd_compact)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--full", action="store_true",
                   help="one run a table, no tombstones, free space given back")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "vacuum", "give an index's free space back to the disk",
                    "Rewrite INDEX with only its live pages, like SQLite's VACUUM: the file "
                    "keeps the pages that compaction and removals freed (later commits reuse "
                    "them) until this gives them back.  INDEX must not be open in another "
                    "process; one that opens it meanwhile waits for the new file.  With -o, "
                    "write the compacted copy to OUT instead and leave INDEX as it is "
                    "(VACUUM INTO), which works while other processes use INDEX.  Runs are "
                    "not merged: `ndindex compact --full` merges them and then vacuums.",
                    ["ndindex vacuum pages.ndx", "ndindex vacuum pages.ndx -o pages-small.ndx",
                     "ndindex vacuum pages.ndx --json"],
                    cli_index.cmd_vacuum)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write the copy here (must not exist) and leave INDEX as it is")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "stats", "print counts, sizes and the plan",
                    "Print the number of fingerprints, the file size and the tables' size in bits "
                    "per fingerprint; --tables adds a line per table.",
                    ["ndindex stats pages.ndx", "ndindex stats pages.ndx --tables",
                     "ndindex stats pages.ndx --json"], cli_index.cmd_stats)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--tables", action="store_true", help="also print one line per table")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "verify", "check every checksum, order and directory entry",
                    "Read the whole index and check it; exit 2 naming the first problem.  With "
                    "--repair, a damaged index is then salvaged as `ndindex recover` does, into "
                    "INDEX.recovered (or -o OUT), and the exit status is recover's.",
                    ["ndindex verify pages.ndx", "ndindex verify --repair pages.ndx",
                     "ndindex verify --repair pages.ndx -o fixed.ndx"], cli_index.cmd_verify)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--repair", action="store_true",
                   help="if the check fails, salvage what verifies into a new index")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="with --repair: the new index (default INDEX.recovered)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "recover", "salvage a damaged index into a new one",
                    "Read a damaged index page by page without trusting LMDB's trees, keep every "
                    "fingerprint and document key whose records still verify (the newest "
                    "consistent state: the runs its manifest lists, its tombstones and log), and "
                    "write them to a new index with the same k, plan, coding and fingerprinter, "
                    "like SQLite's .recover.  DAMAGED is left as it is.  Prints what was recovered "
                    "and, on stderr, what could not be read.  Exit status: 0 everything recovered, "
                    "1 partial (some records could not be read; the new index holds the rest), 2 "
                    "nothing recoverable or a usage error.",
                    ["ndindex recover pages.ndx -o pages-recovered.ndx",
                     "ndindex recover pages.ndx -o pages-recovered.ndx --json"],
                    cli_index.cmd_recover)
    p.stray_hint = "the new index is named by -o: ndindex recover DAMAGED -o OUT"
    p.add_argument("index", metavar="DAMAGED")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the new index (must not exist)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = subcommand(commands, "export", "write a portable zstd-compressed dump",
                    "Write the live fingerprints, keys, documents, plan and settings of an index "
                    "as a dump (format-spec/dump.md); import gives back an identical index.",
                    ["ndindex export pages.ndx -o pages.ndxdump",
                     "ndindex export pages.ndx > pages.ndxdump"],
                    cli_index.cmd_export)
    p.stray_hint = "the dump goes to -o FILE, or to stdout"
    p.add_argument("index", metavar="INDEX")
    p.add_argument("-o", "--output", default="-", metavar="FILE", help="dump file (default stdout)")

    p = subcommand(commands, "import", "create an index from a dump",
                    "Create a new index with the dump's plan and settings and add "
                    "everything in it.",
                    ["ndindex import pages.ndxdump copy.ndx",
                     "ndindex import - copy.ndx < pages.ndxdump"],
                    cli_index.cmd_import)
    p.add_argument("dump", metavar="DUMP", help="dump file, or - for stdin")
    p.add_argument("index", metavar="INDEX", help="the new index (must not exist)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "upgrade", "bring an index file to the newest file format",
                    "A format-2 index of the delta coding gets restart tables (faster queries, "
                    "2.4% larger tables), a format-3 index packed raw blocks (smaller files while "
                    "new fingerprints wait to merge) and a format-3 or 4 index tombstones in "
                    "several runs (smaller commits as fingerprints are removed), all format 5: its "
                    "header names the new format and coding and a full compaction rewrites every "
                    "table, then it is verified; INDEX must not be open in another process, and a "
                    "crash leaves a whole index that the next upgrade finishes (with -o, a "
                    "compacted copy is upgraded instead).  An index made before file format 2 "
                    "(which this version cannot open) is rewritten as a format-2 index with the "
                    "same k, plan, coding, fingerprinter, fingerprints and document keys, verified "
                    "and compared with the original before it is used; in place, the original is "
                    "kept as INDEX.v1 (unless --no-backup), and a crash at any moment leaves at "
                    "INDEX either the whole original or the whole new index.  A file already in "
                    "the newest format for its coding is left alone and reported, with exit "
                    "status 0.",
                    ["ndindex upgrade pages.ndx",
                     "ndindex upgrade pages.ndx -o pages-v2.ndx",
                     "ndindex upgrade pages.ndx --no-backup --json"],
                    cli_index.cmd_upgrade)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write the new index here (must not exist) and leave INDEX as it is")
    p.add_argument("--no-backup", action="store_true",
                   help="in place: delete the original once the new index is in place "
                        "(default: keep it as INDEX.v1)")
    p.add_argument("--json", action="store_true", help="print JSON")

    plan = subcommand(commands, "plan", "choose a table design for n fingerprints and k",
                       "Print the table design the planner chooses and the candidates it weighed.",
                       ["ndindex plan -n 10M -k 3", "ndindex plan -n 100k -k 10 --json"], cmd_plan)
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
    cli_documents.add_document_commands(commands)
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


def cmd_plan(args) -> int:
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


# -- entry point ------------------------------------------------------------------


def _named_files(args) -> list:
    """The files a command line names (its index, input, dump, output)."""
    names = ("index", "source", "dump", "file", "jsonl", "output")
    return [v for v in (getattr(args, n, None) for n in names) if isinstance(v, str) and v != "-"]


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
    args = None
    try:
        # (the parser too: a Ctrl-C while it is built is an interruption)
        args = _build_parser().parse_args(argv)
        return args.run(args)
    except SystemExit as exc:           # --help and --version exit through here
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        print("ndindex: interrupted; the index is consistent, a re-run resumes", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except InvalidInput as exc:
        print(f"ndindex: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (OSError, NdindexError, FileError) as exc:
        print(error_line(exc, getattr(args, "index", None), _named_files(args))
              + cli_index.repair_hint(exc, args), file=sys.stderr)
        return EXIT_ERROR
    except (_UsageError, ValueError, TypeError) as exc:
        print(f"ndindex: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
