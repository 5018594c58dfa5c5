"""The ``ndindex`` subcommands on index files: add, query, remove, compact,
vacuum, stats, verify, recover, export, import, upgrade (see :mod:`ndindex.cli`).
"""

from __future__ import annotations

import argparse
import array
import importlib
import os
import sys

# cli_common first: it readies numpy's import.
from ndindex.cli_common import (EXIT_ERROR, EXIT_NONE, EXIT_OK, FileError, Progress, dedup_module,
                                document_text, error_line, fingerprinter_of, hex_fp, key_json,
                                key_text, open_index, parse_fingerprint, plural, prefix_range,
                                print_json, read_lines, textfile_module, upgrade_module)

import numpy as np  # noqa: E402, I001 - after cli_common

from ndindex.errors import CorruptionError, NdindexError
from ndindex.locks import NotAlone
from ndindex.plan import psm_max_probes

#: Fingerprints per index.add call of ``ndindex add`` (one transaction each).
ADD_BATCH_LINES = 100_000


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
        fp = parse_fingerprint(parts[0])
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None
    return fp, (parts[1] if len(parts) > 1 else None)


class _FingerprintLines:
    """The (fingerprint, key or None) items of a fingerprint list, 8 bytes a
    line (and a list slot a line once a key appears): as a list of tuples,
    2M lines took 490 MB."""

    def __init__(self):
        self.fps = array.array("Q")
        self.keys = None   # [key or None], once a line has a key

    def append(self, item) -> None:
        fp, key = item
        if key is not None and self.keys is None:
            self.keys = [None] * len(self.fps)
        self.fps.append(fp)
        if self.keys is not None:
            self.keys.append(key)


def _read_fingerprint_lines(source: str, skip_invalid: bool, verb: str = "add"):
    """Return (fingerprints, keys or None, invalid count) of a fingerprint
    list (see read_lines)."""
    lines, invalid = read_lines(source, skip_invalid, _parse_line, _FingerprintLines(), verb)
    return np.frombuffer(lines.fps, dtype=np.uint64), lines.keys, invalid


def cmd_add(args) -> int:
    fps, keys, invalid = _read_fingerprint_lines(args.source, args.skip_invalid)
    added = 0
    progress = Progress(not args.json, interval=1.0)
    try:
        with open_index(args.index) as ix:
            for start in range(0, len(fps), ADD_BATCH_LINES):
                added += ix.add(fps[start:start + ADD_BATCH_LINES],
                                keys=None if keys is None else keys[start:start + ADD_BATCH_LINES])
                progress("add", min(start + ADD_BATCH_LINES, len(fps)), len(fps))
            total = len(ix)
    finally:
        progress.clear()
    if args.json:
        print_json(dict(added=added, skipped=0, invalid=invalid, fingerprints=total))
    else:
        print(f"added {plural(added, 'fingerprint')} ({total:,} distinct in the index)"
              + (f"; skipped {plural(invalid, 'invalid line')}" if invalid else ""))
    return EXIT_OK


def _match_json(fp: int, distance: int, keys) -> dict:
    return dict(fingerprint=fp, fingerprint_hex=hex_fp(fp), distance=distance,
                keys=[key_json(key) for key in keys])


def _match_line(fp: int, distance: int, keys) -> str:
    return f"  {hex_fp(fp)}  distance {distance:2d}  {', '.join(map(key_text, keys))}".rstrip()


def cmd_query(args) -> int:
    if args.skip_invalid and args.fingerprints_from is None:
        raise ValueError("--skip-invalid goes with --fingerprints-from")
    if args.fingerprints_from is not None:
        return _query_list(args)
    with open_index(args.index, readonly=True) as ix:
        k = ix.k if args.k is None else args.k
        if args.fingerprint is not None:
            q = args.fingerprint
            matches = ix.query(q, k, max_probes=args.max_probes)
        else:
            if args.text is not None:
                text = args.text
            else:
                try:
                    text = document_text(args.file)
                except textfile_module.NotText as exc:
                    raise FileError(args.file, f"{exc}; documents must be text") from None
            q, margins = fingerprinter_of(ix).simhash_with_weights(text)
            # A probabilistic query orders its probes by the text's own margins
            # (Index.query_text's rule; the text is fingerprinted once here).
            probabilistic = ix.plan.probabilistic or args.max_probes is not None
            if not margins.any():
                # No word: its simhash, 0, says nothing of the text (as `similar`).
                print("ndindex: note: the text has no words to fingerprint: no stored "
                      "fingerprint is its near-duplicate", file=sys.stderr)
                matches = []
            else:
                matches = ix.query(q, k, margins=margins if probabilistic else None,
                                   max_probes=args.max_probes)
    if args.json:
        print_json(dict(query=q, query_hex=hex_fp(q), k=k, matches=[
            _match_json(m.fingerprint, m.distance, m.keys) for m in matches]))
    else:
        print(f"query {hex_fp(q)} k={k}: {plural(len(matches), 'match', 'matches')}")
        for m in matches:
            print(_match_line(m.fingerprint, m.distance, m.keys))
    return EXIT_OK if matches else EXIT_NONE


def _query_list(args) -> int:
    """ndindex query --fingerprints-from: one query_many over the list; the
    queries with a match are printed in the list's order, then a count."""
    fps, labels, invalid = _read_fingerprint_lines(args.fingerprints_from, args.skip_invalid,
                                                   "query")
    with open_index(args.index, readonly=True) as ix:
        k = ix.k if args.k is None else args.k
        found = ix.query_many(fps, k, max_probes=args.max_probes)
        distinct = np.unique(found["fingerprint"])
        keys = dict(zip(distinct.tolist(), ix.keys_many(distinct)))
    # query_many groups the matches by query, in the batch's order
    results = []
    for i, fp, d in zip(found["query"].tolist(), found["fingerprint"].tolist(),
                        found["distance"].tolist()):
        if not results or results[-1][0] != i:
            results.append((i, []))
        results[-1][1].append((fp, d, keys[fp]))
    queries = fps.tolist()
    if args.json:
        print_json(dict(k=k, queried=len(fps), matched=len(results), invalid=invalid, queries=[
            dict(query=queries[i], query_hex=hex_fp(queries[i]),
                 key=None if labels is None or labels[i] is None else key_json(labels[i]),
                 matches=[_match_json(*m) for m in matches])
            for i, matches in results]))
    else:
        lines = []
        for i, matches in results:
            label = "" if labels is None or labels[i] is None else f" ({key_text(labels[i])})"
            lines.append(f"query {hex_fp(queries[i])}{label} k={k}: "
                         f"{plural(len(matches), 'match', 'matches')}")
            lines.extend(_match_line(*m) for m in matches)
            if len(lines) >= 10000:
                print("\n".join(lines))
                lines = []
        if lines:
            print("\n".join(lines))
        print(f"queried {plural(len(fps), 'fingerprint')}: {len(results):,} with a match"
              + (f"; skipped {plural(invalid, 'invalid line')}" if invalid else ""))
    return EXIT_OK if results else EXIT_NONE


def _parse_key_line(raw: bytes):
    """A key of a --keys-from list: the line as it is, less its line end; None if blank."""
    line = raw.rstrip(b"\r\n")
    if not line.strip():
        return None
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None


def cmd_remove(args) -> int:
    if not (args.fingerprint or args.key or args.fingerprints_from or args.keys_from):
        raise ValueError("remove needs --fingerprint FP..., --key KEY..., --fingerprints-from "
                         "FILE or --keys-from FILE")
    if args.fingerprints_from == "-" and args.keys_from == "-":
        raise ValueError("--fingerprints-from and --keys-from cannot both read stdin")
    fps = np.array(args.fingerprint, dtype=np.uint64)
    keys, invalid = list(args.key), 0
    # Every list is read and checked before anything is removed.
    if args.fingerprints_from is not None:
        listed, _, bad = _read_fingerprint_lines(args.fingerprints_from, args.skip_invalid,
                                                 "remove")
        fps, invalid = np.concatenate([fps, listed]), invalid + bad
    if args.keys_from is not None:
        listed, bad = read_lines(args.keys_from, args.skip_invalid, _parse_key_line,
                                 verb="remove")
        keys, invalid = keys + listed, invalid + bad
    with open_index(args.index) as ix:
        removed = stored = 0
        with ix.transaction():      # one commit: all of it, or none of it
            if keys:                # first: every named key is still there to count
                removed, stored = ix._remove(None, keys)
            if len(fps):
                removed += ix.remove(fingerprints=fps)
        total = len(ix)
    if args.json:
        print_json(dict(removed=removed, fingerprints=total, invalid=invalid,
                        **(dict(keys_removed=stored) if keys else {})))
    else:
        # A key removed alone (its fingerprint held by other keys) removes no
        # fingerprint: say what went, not "removed 0".
        print("removed " + (f"{plural(stored, 'key')} ({len(keys):,} named) and " if keys else "")
              + f"{plural(removed, 'fingerprint')} ({total:,} left)"
              + (f"; skipped {plural(invalid, 'invalid line')}" if invalid else ""))
    return EXIT_OK


def cmd_compact(args) -> int:
    progress = Progress(not args.json, interval=1.0)
    try:
        with open_index(args.index) as ix:
            report = ix.compact(full=args.full, progress=progress)
    finally:
        progress.clear()
    if args.json:
        print_json(report)
    else:
        runs = report["runs"]
        print(f"compacted: {plural(report['steps'], 'step')}, "
              f"{plural(max(runs) if runs else 0, 'run')} per table, {report['file_bytes']:,} bytes"
              + (" (free space given back)" if report.get("vacuumed") else
                 " (another process has the index open: its free space stays until "
                 "`ndindex vacuum`)" if args.full else "")
              + f", {report['seconds']:.3f} s")
    return EXIT_OK


def cmd_vacuum(args) -> int:
    if args.output is not None:
        with open_index(args.index, readonly=True) as ix:
            before = os.path.getsize(args.index)
            after = ix.vacuum_into(args.output)
        target = args.output
    else:
        with open_index(args.index) as ix:
            before = os.path.getsize(args.index)
            try:
                after = ix.vacuum()
            except NotAlone:
                raise FileError(args.index, "another process has the index open; close it "
                                "first, or write a compacted copy with -o OUT") from None
        target = args.index
    if args.json:
        print_json(dict(path=target, bytes_before=before, bytes_after=after))
    else:
        print(f"{target}: {after:,} bytes, {before - after:,} given back to the disk"
              if args.output is None else
              f"{target}: {after:,} bytes, a compacted copy of {args.index} ({before:,} bytes)")
    return EXIT_OK


def cmd_stats(args) -> int:
    with open_index(args.index, readonly=True) as ix:
        info = ix.stats()
    if args.json:
        print_json(info)
        return EXIT_OK
    # The path as given, as the other commands print it (info's is absolute).
    for line in _stats_lines(dict(info, path=args.index), args.tables):
        print(line)
    return EXIT_OK


def _stats_lines(info: dict, per_table: bool) -> list[str]:
    """The text of ``ndindex stats``: a summary, then a line per table if asked.

    Sizes per fingerprint count only what the runs hold: fingerprints still
    in the log (not yet compacted) are named apart, not averaged in.
    """
    tables = info["tables"]
    prefixes = sorted({t["prefix_bits"] for t in tables})
    in_runs = sum(tables[0]["run_entries"]) if tables else 0
    table_bytes = sum(t["bytes"] for t in tables)
    lines = [f"{info['path']}: {plural(info['fingerprints'], 'fingerprint')}, k={info['k']}, "
             f"{info['file_bytes']:,} bytes"]
    summary = (f"  {plural(len(tables), 'table')} ({prefix_range(prefixes[0], prefixes[-1])}): "
               f"{plural(in_runs, 'fingerprint')} each in runs, {table_bytes:,} bytes")
    if in_runs:
        bits = 8 * table_bytes / in_runs / len(tables)
        summary += (f", {bits:.2f} bits per fingerprint per table "
                    f"(bound {info['entropy_bound_bits']:.2f})")
    if info["log_entries"]:
        summary += f"; {plural(info['log_entries'], 'operation')} in the log, not yet compacted"
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
                     f"{plural(info['key_runs'], 'run')}")
    # Worth a vacuum: a tenth of the file and a megabyte (a small index's
    # commits keep a few pages free as they go).
    if info.get("free_bytes", 0) >= max(1 << 20, info["file_bytes"] // 10):
        lines.append(f"  {info['free_bytes']:,} bytes free: later commits reuse them, "
                     "`ndindex vacuum` gives them back to the disk")
    if info.get("oldest_reader_lag"):
        oldest = min(info["readers"], key=lambda r: r["txnid"])
        lines.append(f"  a read open in process {oldest['pid']} is "
                     f"{plural(info['oldest_reader_lag'], 'commit')} behind: pages freed "
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
                         f"entries in {plural(t['runs'], 'run')}  {t['bytes']:,} bytes  "
                         f"{bits} bits/fingerprint")
    return lines


def cmd_verify(args) -> int:
    if args.output is not None and not args.repair:
        raise ValueError("-o is for --repair")
    progress = Progress(not args.json, interval=1.0)
    try:
        try:
            with open_index(args.index, readonly=True) as ix:
                report = ix.verify(progress=progress)
        finally:
            progress.clear()
    except NdindexError as exc:
        hint = "" if args.repair else repair_hint(exc, args)
        print(error_line(_damage_text(exc), args.index) + hint, file=sys.stderr)
        if not args.repair:
            return EXIT_ERROR
        out = args.output if args.output is not None else args.index + ".recovered"
        return _recover_into(args.index, out, args.json)
    if args.json:
        print_json(dict(ok=True, **report))
    else:
        print(f"{args.index}: ok ({plural(report['tables'], 'table')}, "
              f"{plural(report['runs'], 'run')}, {plural(report['chunks'], 'chunk')}, "
              f"{plural(report['table_entries'], 'fingerprint')} in the runs, "
              f"{plural(report['log_entries'], 'operation')} in the log)"
              + ("; nothing to repair" if args.repair else ""))
    return EXIT_OK


#: Commands whose INDEX is an existing index file the error may be about.
_READS_INDEX = {"add", "query", "remove", "compact", "stats", "verify", "export", "similar",
                "pairs", "clusters"}


def repair_hint(exc: BaseException, args) -> str:
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


def cmd_recover(args) -> int:
    return _recover_into(args.index, args.output, args.json)


def _recover_into(damaged: str, out: str, as_json: bool) -> int:
    """Run ndindex.recover and report it: 0 complete, 1 partial, 2 nothing recoverable."""
    salvage = importlib.import_module("ndindex.recover")
    progress = Progress(not as_json, interval=1.0)
    try:
        report = salvage.recover(damaged, out, progress=progress)
    finally:
        progress.clear()
    if as_json:
        print_json(report)
    for problem in report["problems"]:
        print(error_line(problem, damaged), file=sys.stderr)
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


def cmd_export(args) -> int:
    from ndindex.dump import export_index
    if args.output == "-" and _is_terminal(sys.stdout):
        # As zstd and gzip do: binary on a terminal is garbage, and a mistake.
        raise ValueError("will not write a binary dump to a terminal: give -o FILE "
                         "or redirect stdout (> FILE)")
    with open_index(args.index, readonly=True) as ix:
        if args.output == "-":
            counts = export_index(ix, sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            counts = _export_to_file(ix, args.output, export_index)
    print(f"exported {_dump_counts(counts)} to "
          f"{'stdout' if args.output == '-' else dedup_module.display_path(args.output)}",
          file=sys.stderr)
    return EXIT_OK


def _dump_counts(counts: dict) -> str:
    """'N fingerprints and M keys', with the documents of a dump that holds them."""
    said = [plural(counts["fingerprints"], "fingerprint"), plural(counts["keys"], "key")]
    if "documents" in counts:
        said.append(plural(counts["documents"], "document"))
    return ", ".join(said[:-1]) + " and " + said[-1]


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):   # replaced or closed stream
        return False


def _export_to_file(ix, output: str, export_index) -> dict:
    """Write the dump under a temporary name beside output, sync it, then give it
    its name: an export killed or interrupted halfway left a truncated dump
    under the name an archive keeps (import refused it, but later)."""
    from ndindex import store
    if os.path.lexists(output):
        raise FileExistsError(17, "already exists", output)
    with store.written_aside(output, "exporting") as tmp, open(tmp, "xb") as fh:
        counts = export_index(ix, fh)
        fh.flush()
        os.fsync(fh.fileno())
    return counts


def cmd_import(args) -> int:
    from ndindex.dump import import_index
    if args.dump == "-":
        if _is_terminal(sys.stdin):   # it would wait for a dump no one types
            raise ValueError("no dump on stdin (it is a terminal): give a dump file "
                             "or pipe one in (< FILE)")
        counts = import_index(sys.stdin.buffer, args.index, name="<stdin>")
    else:
        with open(args.dump, "rb") as fh:
            counts = import_index(fh, args.index, name=args.dump)
    if args.json:
        print_json(dict(index=args.index, **counts))
    else:
        print(f"imported {_dump_counts(counts)} into {args.index}")
    return EXIT_OK


def cmd_upgrade(args) -> int:
    if args.output is not None and args.no_backup:
        raise ValueError("--no-backup is for in-place upgrades; with -o the original is "
                         "left as it is")
    progress = Progress(not args.json, interval=1.0)
    try:
        report = upgrade_module.upgrade(args.index, args.output, backup=not args.no_backup,
                                  progress=progress)
    finally:
        progress.clear()
    if args.json:
        print_json(report)
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
