"""The ``ndindex`` subcommands on documents: create, add --docs/--jsonl,
similar, pairs, clusters (see :mod:`ndindex.cli`).
"""

from __future__ import annotations

import json
import os
import sys

# cli_common first: it readies numpy's import.
from ndindex.cli_common import (EXIT_NONE, EXIT_OK, FileError, subcommand, dedup_module,
                                document_paths, document_text, fingerprinter_of, hex_fp, key_json,
                                key_text, open_index, plural, prefix_range, print_json, read_lines)
from ndindex import cli_index  # noqa: I001 - after cli_common
from ndindex.errors import NdindexError
from ndindex.index import Index

#: Documents per Index.add_documents call of ``ndindex add --docs/--jsonl``: one
#: commit each, and enough texts for its fingerprinting to use every core.
ADD_BATCH_DOCS = 20_000
#: ... and at most this many characters of text held at once.
ADD_BATCH_CHARS = 256 << 20


def add_document_commands(commands) -> None:
    """Register the document queries: similar, pairs, clusters."""
    threshold_help = ("Jaccard similarity of word 3-shingles to reach (default: the index's, "
                      "0.8; not below it)")
    p = subcommand(commands, "similar", "find stored documents near-duplicate to a text or file",
                    "Print the stored documents whose Jaccard similarity of word 3-shingles with "
                    "the query reaches the threshold, most similar first: candidates share a "
                    "lookup key with the query, whatever their simhash distance, and each is "
                    "verified by its sketch.  The query is a FILE (text in any character set), "
                    "--text, or --key of a stored document (left out of its own results).  Given "
                    "several FILEs or a directory, each file (directories recursively) is a query, "
                    "and those with similar documents are printed, then a count.  A text "
                    "of fewer than 4 distinct word 3-shingles (about 6 words; at threshold 0.9, 9 "
                    "shingles, about 11 words) can only match the same words: a note on stderr "
                    "says so.",
                    ["ndindex similar docs.ndx draft.md",
                     "ndindex similar docs.ndx --text 'the quick brown fox jumps over the lazy dog'",
                     "ndindex similar docs.ndx --key notes/a.txt --threshold 0.9 --json",
                     "ndindex similar docs.ndx draft.md --limit 5",
                     "ndindex similar docs.ndx incoming/ --json"],
                    cmd_similar)
    p.add_argument("index", metavar="INDEX")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("file", nargs="*", default=[], metavar="FILE",
                      help="a text file; several, or directories: a query each")
    what.add_argument("--file", dest="file_option", metavar="PATH",
                      help="the same as FILE (as `ndindex query --file`)")
    what.add_argument("--text", metavar="TEXT", help="this text")
    what.add_argument("--key", metavar="KEY", help="the stored document of this key")
    p.add_argument("--threshold", type=float, metavar="J", help=threshold_help)
    p.add_argument("--limit", type=int, metavar="N", help="print at most N documents")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "pairs", "list every pair of near-duplicate stored documents",
                    "Print every pair of stored documents whose Jaccard similarity of word "
                    "3-shingles reaches the threshold, verified: similarity, then both keys, one "
                    "pair a line.  Reads every document (time and memory grow with the documents, "
                    "and with the pairs: m identical texts make m(m-1)/2 of them; `clusters` does "
                    "not expand them).",
                    ["ndindex pairs docs.ndx", "ndindex pairs docs.ndx --threshold 0.9 --json"],
                    cmd_pairs)
    p.add_argument("index", metavar="INDEX")
    p.add_argument("--threshold", type=float, metavar="J", help=threshold_help)
    p.add_argument("--json", action="store_true", help="print JSON")

    p = subcommand(commands, "clusters", "group the stored documents into near-duplicate clusters",
                    "Print the groups of stored documents joined by near-duplicate pairs "
                    "(union-find over the verified pairs), largest first.  Reads every document.",
                    ["ndindex clusters docs.ndx", "ndindex clusters docs.ndx --min-size 3",
                     "ndindex clusters docs.ndx --threshold 0.9 --json"],
                    cmd_clusters)
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


def cmd_create(args) -> int:
    """ndindex create; --docs, --threshold and --bottom-k choose the document pipeline."""
    from ndindex.fingerprint import Fingerprinter
    docs = args.docs or args.threshold is not None or args.bottom_k is not None
    if docs and args.no_fingerprinter:
        raise ValueError("--docs, --threshold and --bottom-k need the fingerprinter that "
                         "--no-fingerprinter leaves out")
    options = {name: value for name, value in (("threshold", args.threshold),
                                               ("bottom_k", args.bottom_k)) if value is not None}
    fpr = None if args.no_fingerprinter else Fingerprinter(**options)
    with Index.create(args.index, k=args.k, expected_n=args.n, fingerprinter=fpr,
                      plan="psm" if args.psm else None,
                      coding=args.coding) as ix:
        prefixes = [t.prefix_bits for t in ix.plan.tables]
        info = dict(path=args.index, k=ix.k, expected_n=args.n, tables=len(prefixes),
                    prefix_bits=[min(prefixes), max(prefixes)],
                    probabilistic=ix.plan.probabilistic, fingerprinter=fpr is not None)
    if docs:
        info["documents"] = dict(threshold=fpr.threshold, bottom_k=fpr.bottom_k)
    if args.json:
        print_json(info)
        return EXIT_OK
    print(f"created {info['path']}: k={info['k']}, {plural(info['tables'], 'table')} "
          f"({prefix_range(*info['prefix_bits'])}"
          + (", probabilistic" if info["probabilistic"] else "")
          + f"), planned for {args.n:,} fingerprints"
          + (f"; documents: threshold {fpr.threshold:g}, bottom-{fpr.bottom_k} sketches"
             if docs else ""))
    return EXIT_OK


def cmd_add_documents(args) -> int:
    """ndindex add: documents with --docs or --jsonl, else a fingerprint list (cli_index.cmd_add)."""
    if not args.docs and args.jsonl is None:
        return cli_index.cmd_add(args)
    if args.docs and args.jsonl is not None:
        raise ValueError("give --docs or --jsonl, not both")
    if args.source != "-":
        raise ValueError(f"{args.source}: a fingerprint list, and --docs or --jsonl: give one")
    invalid = 0
    if args.jsonl is not None:
        docs, invalid = _read_document_lines(args.jsonl, args.skip_invalid)
        items = iter(docs.items())
    counts = dict(added=0, skipped=0)
    with open_index(args.index) as ix:
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
        print_json(dict(added=counts["added"], skipped=counts["skipped"], invalid=invalid,
                   fingerprints=total))
    else:
        print(f"added {plural(counts['added'], 'document')} "
              f"({plural(total, 'distinct fingerprint')} in the index)"
              + (f"; skipped {plural(counts['skipped'], 'document')}" if counts["skipped"] else "")
              + (f"; skipped {plural(invalid, 'invalid line')}" if invalid else ""))
    return EXIT_OK


def _document_files(paths, counts: dict):
    """Yield (key, text) of the files under paths; report and count the others."""
    from ndindex.records import MAX_DOC_KEY_BYTES

    def key_problem(path):
        size = _key_bytes(_document_key(os.path.normpath(path)))
        if size > MAX_DOC_KEY_BYTES:
            return f"path of {size} bytes, above the {MAX_DOC_KEY_BYTES} of a key"
        return None

    for path, text in _file_texts(paths, counts, key_problem):
        yield _document_key(os.path.normpath(path)), text     # ./a.txt is a.txt


def _file_texts(paths, counts: dict, problem_of=None):
    """Yield (path, text) of the files under paths (directories recursively);
    report on stderr and count in counts["skipped"] those that are not text,
    cannot be read, or of which problem_of(path) names a problem."""
    from ndindex.textfile import NotText
    for path, problem in document_paths(paths):
        if not problem and problem_of is not None:
            problem = problem_of(path)
        if not problem:
            try:
                yield path, document_text(path)
                continue
            except OSError as exc:
                problem = exc.strerror or str(exc)
            except NotText as exc:                  # binary, undecodable
                problem = str(exc)
        print(f"ndindex: {dedup_module.display_path(path)}: {problem}, skipped", file=sys.stderr)
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
        fpr = fingerprinter_of(ix)
        empty = [k for k in keys if len(fpr.sketch(batch[k])) == 0]
        if not empty:
            raise
    for key in empty:
        print(f"ndindex: {key_text(key)}: no words to fingerprint, skipped", file=sys.stderr)
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
    """Return ({key: text}, invalid count) of a JSON-lines file (see read_lines).

    A key given again replaces its text (and moves to its new place).
    """
    items, invalid = read_lines(source, skip_invalid, _parse_document_line)
    docs = {}
    for key, text in items:
        docs.pop(key, None)
        docs[key] = text
    return docs, invalid


def _threshold_of(ix: Index, threshold) -> float:
    """The threshold a document query ran at: the given one, or the index's."""
    return fingerprinter_of(ix).threshold if threshold is None else threshold


def _exact_only_note(ix: Index, text, threshold: float) -> str | None:
    """A sentence when a query text is too short for any other text to reach threshold."""
    from ndindex.fingerprint.bands import min_values_for
    fewest = min_values_for(threshold)
    shingles = len(fingerprinter_of(ix).sketch(text))
    if shingles >= fewest:
        return None
    if shingles == 0:
        return "the text has no words to compare: no document can match it"
    return (f"the text has {shingles} distinct word 3-shingle{'s' if shingles != 1 else ''}, "
            f"fewer than {fewest}: no other text can reach similarity {threshold:g} with it, "
            "so it matches only texts of the same words")


def _matches_json(matches) -> list:
    return [dict(key=key_json(m.key), similarity=round(m.similarity, 4),
                 fingerprint_hex=hex_fp(m.fingerprint)) for m in matches]


def _print_similar(what: str, threshold: float, matches) -> None:
    print(f"similar to {what} (threshold {threshold:g}): {plural(len(matches), 'document')}")
    for m in matches:
        print(f"  {m.similarity:.4f}  {key_text(m.key)}")


def cmd_similar(args) -> int:
    note = None
    files = [args.file_option] if args.file_option is not None else args.file
    if len(files) > 1 or any(os.path.isdir(f) for f in files):
        return _similar_files(args, files)
    file = files[0] if files else None
    with open_index(args.index, readonly=True) as ix:
        if args.key is not None:
            key = _document_key(args.key)
            try:
                matches = ix.similar(key=key, threshold=args.threshold, limit=args.limit)
            except KeyError:
                raise NdindexError(f"no document has the key {args.key!r}") from None
            query = dict(key=key_json(key))
        else:
            if args.text is not None:
                text, query = args.text, dict(text=args.text)
            else:
                from ndindex.textfile import NotText
                try:
                    text = document_text(file)
                except NotText as exc:
                    raise FileError(file, f"{exc}; documents must be text") from None
                query = dict(file=key_json(_document_key(file)))
            matches = ix.similar(text, threshold=args.threshold, limit=args.limit)
        threshold = _threshold_of(ix, args.threshold)
        if args.key is None:
            note = _exact_only_note(ix, text, threshold)
    if note is not None:
        print(f"ndindex: note: {note}", file=sys.stderr)
    if args.json:
        print_json(dict(query=query, threshold=threshold, note=note,
                        matches=_matches_json(matches)))
    else:
        what = (f"key {key_text(_document_key(args.key))}" if args.key is not None
                else "the text" if args.text is not None else file)
        _print_similar(what, threshold, matches)
    return EXIT_OK if matches else EXIT_NONE


def _similar_files(args, paths) -> int:
    """ndindex similar with several files or a directory: each file that has
    similar stored documents is printed as it is found, then a count."""
    counts = dict(skipped=0)
    checked, found = 0, []
    with open_index(args.index, readonly=True) as ix:
        threshold = _threshold_of(ix, args.threshold)
        for path, text in _file_texts(paths, counts):
            checked += 1
            matches = ix.similar(text, threshold=args.threshold, limit=args.limit)
            if not matches:
                continue
            if args.json:
                found.append(dict(file=key_json(_document_key(path)),
                                  matches=_matches_json(matches)))
            else:
                _print_similar(dedup_module.display_path(path), threshold, matches)
                found.append(path)
    if args.json:
        print_json(dict(threshold=threshold, checked=checked, matched=len(found),
                        skipped=counts["skipped"], files=found))
    else:
        print(f"checked {plural(checked, 'file')}: {len(found):,} with similar documents"
              + (f"; skipped {plural(counts['skipped'], 'file')}" if counts["skipped"] else ""))
    return EXIT_OK if found else EXIT_NONE


def cmd_pairs(args) -> int:
    with open_index(args.index, readonly=True) as ix:
        pairs = ix.near_duplicate_pairs(args.threshold)
        threshold = _threshold_of(ix, args.threshold)
    if args.json:
        print_json(dict(threshold=threshold, pairs=[
            dict(a=key_json(a), b=key_json(b), similarity=round(s, 4)) for a, b, s in pairs]))
    else:
        for a, b, s in pairs:
            print(f"{s:.4f}  {key_text(a)}  {key_text(b)}")
        print(f"{plural(len(pairs), 'pair')} at similarity >= "
              f"{threshold:g}.")
    return EXIT_OK


def cmd_clusters(args) -> int:
    with open_index(args.index, readonly=True) as ix:
        clusters = ix.clusters(args.threshold, min_size=args.min_size)
        threshold = _threshold_of(ix, args.threshold)
    if args.json:
        print_json(dict(threshold=threshold, min_size=args.min_size,
                   clusters=[[key_json(k) for k in c] for c in clusters]))
    else:
        for n, cluster in enumerate(clusters, 1):
            print(f"cluster {n}: {len(cluster)} document{'s' if len(cluster) != 1 else ''}")
            for key in cluster:
                print(f"  {key_text(key)}")
            print()
        members = sum(len(c) for c in clusters)
        print(f"{plural(len(clusters), 'cluster')} of {plural(members, 'document')} at "
              f"similarity >= {threshold:g}.")
    return EXIT_OK
