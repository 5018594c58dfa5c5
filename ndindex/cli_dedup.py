"""``ndindex dedup``: runs :func:`ndindex.dedup.dedup` and prints its clusters
as text, JSON or CSV (see :mod:`ndindex.cli`).
"""

from __future__ import annotations

import os
import sys

from ndindex.cli_common import (EXIT_FOUND, EXIT_OK, Progress, dedup_module, hex_fp, plural,
                                print_json)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_dedup(args) -> int:
    index = args.index
    if index is None:
        index = dedup_module.default_index_path(args.paths)
    for path in args.paths:     # a missing PATH is an error, before any work
        if not os.path.lexists(path):
            raise FileNotFoundError(2, "No such file or directory", path)
    if not args.quiet:
        print(f"ndindex: index {index}", file=sys.stderr)
    progress = Progress(not args.quiet)
    given = {name: getattr(args, name) for name in ("min_size", "max_size", "max_candidates")
             if getattr(args, name) is not None}
    try:
        result = dedup_module.dedup(args.paths, index=index, k=args.k, threshold=args.threshold,
                              follow_symlinks=args.follow_symlinks,
                              include_binary=args.include_binary, decompress=args.decompress,
                              jobs=args.jobs, progress=progress, **given)
    finally:
        progress.clear()
    if not args.quiet:
        for path, problem in result.errors:
            print(f"ndindex: {dedup_module.display_path(path)}: {problem} (skipped)", file=sys.stderr)
        for note in result.notes:
            print(f"ndindex: {note}", file=sys.stderr)
    if args.json:
        print_json(_dedup_json(result))
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
                 simhash=None if f.simhash is None else hex_fp(f.simhash),
                 representative=representative,
                 links=[dict(path=dedup_module.display_path(p), kind=kind) for p, kind in f.links])
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
                errors=[dict(path=dedup_module.display_path(p), error=e) for p, e in result.errors],
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
                          "" if f.simhash is None else hex_fp(f.simhash), int(i == 0),
                          "" if p is None or p.distance is None else p.distance,
                          "" if p is None else f"{p.similarity:.4f}",
                          ";".join(dedup_module.display_path(path) for path, _ in f.links)])


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
                print(f"      {'':>10}    also {dedup_module.display_path(path)} ({kind}, not a copy)")
        print()
    if result.clusters:
        print("* the representative: the largest file, which the others are compared with.")
    parts = [f"{plural(result.files_scanned, 'file')} checked ({result.files_read:,} read, "
             f"{result.files_unchanged:,} unchanged"
             + (f", {result.files_removed:,} gone from disk forgotten" if result.files_removed
                else "") + ")"]
    if result.skipped:
        parts.append("skipped: " + ", ".join(
            f"{n:,} {_SKIPPED_WORDS.get(why, (why, why))[n != 1]}"
            for why, n in sorted(result.skipped.items())))
    if result.links:
        parts.append(", ".join(plural(n, kind) for kind, n in sorted(result.links.items()))
                     + " to files or directories already counted (links, not copies)")
    if result.errors:
        parts.append(f"{len(result.errors):,} unreadable")
    print("; ".join(parts) + ".")
    if result.clusters:
        exact = sum(c.reclaimable_bytes for c in result.clusters)
        print(f"{plural(len(result.clusters), 'cluster')}, "
              f"{plural(result.duplicate_files, 'duplicate file')}, "
              f"{_human(exact)} in exact copies.")
    else:
        print("no duplicates.")
