#!/usr/bin/env python3
"""Benchmark the document pipeline: texts in, verified near-duplicate pairs out.

Part 1, speed and quality, one core each, same texts, same run:

* ndindex: ``ndindex.documents.near_duplicate_pairs(texts, 0.8, workers=1)``
  (bottom-1024 sketches of word 3-shingles, 20 bands of 5 rows plus exact
  and deletion keys, candidates verified by the sketches);
* datasketch: word 3-shingles of the same normalised text (casefold NFKC,
  ``\\w+`` words) built in Python, ``MinHash(num_perm=128).update_batch``,
  ``MinHashLSH(threshold=0.8, num_perm=128)`` insert then query of every
  text, candidates kept when ``MinHash.jaccard >= 0.8``.

Texts: the real short texts of tools/eval (paragraphs of copyright files
and manual pages, package descriptions; --short of them) and, separately,
whole files of more than 200 words (--long).  Precision and recall are
against the exact Jaccard >= 0.8 of word 3-shingles over all pairs
(tools/eval/allpairs.py, untimed).

Part 2, storage for the lead's sizing (--docs synthetic documents, default
1M, each a random run of 30-400 consecutive words of the corpus text):
bytes per document of the record (Rice-coded sketch) and of the lookup
keys as (u64 key, u32 document id) entries, raw and with the sorted keys
delta-coded (LEB128); and the same documents stored in an index file keyed
by a path, as add_documents (``ndindex add --docs``, dedup) stores them:
the file's bytes per document after compact(full=True).

    python tools/bench/bench_documents.py [--short 59000] [--long 5000] [--docs 1000000]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import unicodedata

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eval"))

import allpairs  # noqa: E402
import corpus  # noqa: E402
import eval_documents  # noqa: E402
from ndindex.arrays import sorted_unique  # noqa: E402
from ndindex.docrecord import encode_record  # noqa: E402
from ndindex.documents import (band_candidates, fingerprint_documents,  # noqa: E402
                               near_duplicate_pairs, verify)
from ndindex.fingerprint import Fingerprinter, extract  # noqa: E402

WORD = re.compile(r"\w+")
THRESHOLD = 0.8


def datasketch_pairs(texts: list[str]) -> set:
    """The datasketch pipeline, end to end: shingles, MinHash, LSH, verification."""
    from datasketch import MinHash, MinHashLSH
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=128)
    sketches = []
    for i, text in enumerate(texts):
        words = WORD.findall(unicodedata.normalize("NFKC", text).casefold())
        shingles = {" ".join(words[j:j + 3]) for j in range(max(1, len(words) - 2))}
        m = MinHash(num_perm=128)
        m.update_batch([s.encode("utf-8") for s in shingles])
        sketches.append(m)
        lsh.insert(i, m, check_duplication=False)
    pairs = set()
    for i, m in enumerate(sketches):
        for j in lsh.query(m):
            if j > i and m.jaccard(sketches[j]) >= THRESHOLD:
                pairs.add((i, j))
    return pairs


def quality(got: set, truth: set) -> tuple[float, float]:
    hit = len(got & truth)
    return (hit / len(got) if got else 1.0), (hit / len(truth) if truth else 1.0)


def speed(texts: list[str], name: str, fp: Fingerprinter, repeat: int) -> list[str]:
    sets = [sorted_unique(extract(fp.text(t), fp.minhash_features)) for t in texts]
    left, right, _ = allpairs.similar_pairs(sets, THRESHOLD)
    truth = set(zip(left.tolist(), right.tolist()))
    best = {}
    for _ in range(repeat):   # alternate the two, best of `repeat` each
        started = time.perf_counter()
        ours = near_duplicate_pairs(texts, THRESHOLD, workers=1)
        best["ndindex"] = min(best.get("ndindex", 1e9), time.perf_counter() - started)
        started = time.perf_counter()
        theirs = datasketch_pairs(texts)
        best["datasketch"] = min(best.get("datasketch", 1e9), time.perf_counter() - started)
    ours = set(zip(ours.pairs["a"].tolist(), ours.pairs["b"].tolist()))
    lines = [f"{name}: {len(texts)} texts, {len(truth)} true pairs at Jaccard >= {THRESHOLD}",
             "| pipeline | seconds | docs/s | precision | recall |", "|---|---|---|---|---|"]
    for label, got in (("ndindex", ours), ("datasketch MinHashLSH", theirs)):
        seconds = best["ndindex" if label == "ndindex" else "datasketch"]
        p, r = quality(got, truth)
        lines.append(f"| {label} | {seconds:.2f} | {len(texts) / seconds:,.0f} | {p:.4f} | {r:.4f} |")
    lines.append(f"ratio (docs/s ndindex / datasketch): {best['datasketch'] / best['ndindex']:.2f}x")
    # Untimed above: what the records and keys of these texts cost, and the
    # verification kernel's rate on their candidates.
    docs = fingerprint_documents(texts, fp, workers=1)
    record_bytes = sum(len(encode_record(docs.sketch(i))) for i in range(len(docs)))
    left, right = band_candidates(docs)
    started = time.perf_counter()
    verify(docs, left, right, THRESHOLD)
    seconds = max(time.perf_counter() - started, 1e-9)
    lines.append(f"record {record_bytes / len(docs):.1f} B/text "
                 f"({8 * record_bytes / max(1, len(docs.values)):.1f} bits a value, "
                 f"{len(docs.values) / len(docs):.0f} values), "
                 f"{len(docs.keys) / len(docs):.1f} lookup keys/text; "
                 f"{len(left):,} candidates verified in {seconds:.3f} s "
                 f"({len(left) / seconds / 1e6:.2f} M pairs/s)")
    return lines


def synthetic(n: int, seed: int) -> list[str]:
    words = WORD.findall(corpus.english_text())
    rng = np.random.default_rng(seed)
    lengths = rng.integers(30, 401, n)
    starts = rng.integers(0, len(words) - 401, n)
    return [" ".join(words[s:s + k]) for s, k in zip(starts.tolist(), lengths.tolist())]


def leb128_bytes(values: np.ndarray) -> int:
    v = values.astype(np.uint64)
    out = np.ones(len(v), np.int64)
    for shift in range(7, 64, 7):
        out += v >= (np.uint64(1) << np.uint64(shift))
    return int(out.sum())


def storage(n: int, seed: int, fp: Fingerprinter, workers: int) -> list[str]:
    texts = synthetic(n, seed)
    started = time.perf_counter()
    docs = fingerprint_documents(texts, fp, workers=workers)
    sketch_seconds = time.perf_counter() - started
    sketch_lengths = np.diff(docs.offsets)
    record_bytes = sum(len(encode_record(docs.sketch(i))) for i in range(n))
    keys = np.sort(docs.keys)
    entries = len(keys)
    delta = leb128_bytes(np.diff(keys)) + 8
    # Candidates a query meets: other documents holding one of its keys, per
    # document (an upper bound: a document sharing two keys counts twice).
    owner = np.repeat(np.arange(n), np.diff(docs.key_offsets))[np.argsort(docs.keys)]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    group = np.diff(np.r_[starts, entries])
    per_doc = np.bincount(owner, weights=np.repeat(group - 1, group), minlength=n)
    two_kb = [t for t in synthetic(4000, seed + 1) if 1800 <= len(t.encode()) <= 2300][:500]
    times = []
    for text in two_kb:
        started = time.perf_counter()
        fingerprint_documents([text], fp, workers=1)
        times.append(time.perf_counter() - started)
    lines = [f"storage: {n:,} synthetic documents (30-400 words of the corpus text), "
             f"fingerprinted in {sketch_seconds:.1f} s with {workers} workers",
             f"sketch values per document: mean {sketch_lengths.mean():.1f}, "
             f"max {sketch_lengths.max()}",
             f"record (Rice-coded sketch): {record_bytes / n:.1f} B/doc "
             f"({record_bytes * 8 / max(1, sketch_lengths.sum()):.1f} bits a value; "
             f"raw uint32 {4 * sketch_lengths.mean():.1f} B/doc)",
             f"lookup keys: {entries / n:.2f} per doc; as (u64 key, u32 id) entries "
             f"{12 * entries / n:.1f} B/doc; keys delta-coded + u32 id "
             f"{(delta + 4 * entries) / n:.1f} B/doc",
             f"ndindex documents total (record + raw entries): "
             f"{(record_bytes + 12 * entries) / n:.1f} B/doc; with delta-coded keys "
             f"{(record_bytes + delta + 4 * entries) / n:.1f} B/doc",
             f"candidates per document at {n:,} documents (others sharing a key, an upper "
             f"bound): p50 {np.median(per_doc):.0f}, p90 {np.percentile(per_doc, 90):.0f}, "
             f"p99 {np.percentile(per_doc, 99):.0f}, mean {per_doc.mean():.1f}",
             f"fingerprinting one ~2 KB text (sketch + keys, one call): p50 "
             f"{1e6 * np.median(times):.0f} us over {len(times)} texts"]
    # An index maps document ids to the caller's keys; the file below
    # includes them (the same paths), so add them for comparison.
    key_bytes = sum(len(p) + 8 for p in _paths(n)) / n
    lines.append(f"with the same document keys as below (path + u64 id each, {key_bytes:.1f} "
                 f"B/doc): {(record_bytes + 12 * entries) / n + key_bytes:.1f} B/doc raw, "
                 f"{(record_bytes + delta + 4 * entries) / n + key_bytes:.1f} B/doc delta-coded")
    lines += index_layout(texts, fp, workers)
    return lines


def _paths(n: int) -> list[str]:
    return [f"/data/corpus/part-{i // 1000:04d}/doc-{i:07d}.txt" for i in range(n)]


def index_layout(texts, fp: Fingerprinter, workers: int) -> list[str]:
    """The same documents in an index file, keyed by the paths above: what
    add_documents (and so ndindex add --docs and dedup) stores on disk."""
    from ndindex import Index
    n = len(texts)
    paths = _paths(n)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "docs.ndx")
        started = time.perf_counter()
        with Index.create(path, expected_n=n, fingerprinter=fp,
                          background_compaction=False) as ix:
            for start in range(0, n, 100_000):
                ix.add_documents(texts[start:start + 100_000], paths[start:start + 100_000],
                                 workers=workers)
            ix.compact(full=True)
        seconds = time.perf_counter() - started
        size = os.path.getsize(path)
    return [f"in an index file (add_documents keyed by the paths, then compact(full=True), "
            f"{seconds:.0f} s): {size / n:.1f} B/doc, simhash tables, records, lookup keys "
            f"and paths included"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", type=int, default=59_000)
    parser.add_argument("--long", type=int, default=5_000)
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="workers of the storage part")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"# bench_documents  {time.strftime('%Y-%m-%d %H:%M')}  commit {commit}  "
          f"{platform.machine()} {os.cpu_count()} cores  load {os.getloadavg()[0]:.2f}")
    print(f"command: python tools/bench/bench_documents.py --short {args.short} --long {args.long} "
          f"--docs {args.docs} --repeat {args.repeat}\n")
    fp = Fingerprinter()
    data = eval_documents.build(10**9, 10**9, args.seed)
    import random
    rng = random.Random(args.seed)
    short = [t for group in data.values() for t in group["short"]]
    long_ = [t for group in data.values() for t in group["long"]]
    for texts, name, count in ((short, "short texts", args.short), (long_, "long texts", args.long)):
        if count:
            sample = rng.sample(texts, min(count, len(texts)))
            print("\n".join(speed(sample, name, fp, args.repeat)), "\n", flush=True)
    if args.docs:
        print("\n".join(storage(args.docs, args.seed, fp, args.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
