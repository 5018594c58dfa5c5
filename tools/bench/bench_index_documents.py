"""Benchmark documents stored in an index: similar() latency, bytes per document, ingestion.

Builds an index of N documents (default 1,000,000) through
``Index.add_documents`` and measures, in the same run:

* ``similar(text)`` p50/p90/p99 on 2 KB texts, fingerprinting included: texts
  new to the index, and edited copies of stored documents (their answers
  are verified near-duplicates);
* bytes per document of the file after ``compact(full=True)``, by space
  (tables, document keys, document records, lookup keys);
* ingestion in documents/s (fingerprinting in parallel, background
  compaction on) and the full compaction's time.

The corpus is generated (seeded, nothing is downloaded): documents of
pseudo-words drawn from a Zipf vocabulary mixed with one of 400 topic
vocabularies, 30-600 words long; 10% of them are edited copies of an
earlier document (2-6 words changed, some truncated), the near-duplicates.
``--windows`` uses overlapping windows of the offline English corpus
instead, the worst case for any banding scheme: most documents share long
passages with hundreds of others, so every query has hundreds of
candidates to verify.

    python tools/bench/bench_index_documents.py [--docs 1000000] [--dir DIR] [--windows] [--reuse]

Latencies are taken with the file in the page cache (it is read once
first), as every benchmark here measures ndindex.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from ndindex import Index  # noqa: E402
from ndindex.fingerprint import Fingerprinter  # noqa: E402
from ndindex.records import SPACE_NAMES  # noqa: E402

SYLLABLES = ("ka to ri mu se la po ne vi da ro mi sa te lo nu be ga fi ho ju ke "
             "li ma no pe qu ra si tu va we xi yo ze an en in on un ar er or ir").split()
BATCH = 20000


class Corpus:
    """A seeded generator of documents with planted near-duplicates."""

    def __init__(self, seed: int = 11, n_words: int = 50000, n_topics: int = 400,
                 topic_words: int = 400):
        rng = np.random.default_rng(seed)
        words = set()
        while len(words) < n_words:
            words.add("".join(rng.choice(SYLLABLES, rng.integers(1, 4))))
        self.words = np.array(sorted(words))
        rng.shuffle(self.words)
        zipf = 1.0 / np.arange(1, n_words + 1) ** 1.07
        self.cdf = np.cumsum(zipf / zipf.sum())
        self.topics = [rng.choice(n_words, topic_words, replace=False) for _ in range(n_topics)]
        tz = 1.0 / np.arange(1, topic_words + 1) ** 0.9
        self.tcdf = np.cumsum(tz / tz.sum())

    def _draw(self, rng, cdf, n):
        return np.minimum(np.searchsorted(cdf, rng.random(n)), len(cdf) - 1)

    def document(self, rng, n_words: int) -> str:
        topic = self.topics[rng.integers(len(self.topics))]
        common = self._draw(rng, self.cdf, n_words)
        own = topic[self._draw(rng, self.tcdf, n_words)]
        return " ".join(self.words[np.where(rng.random(n_words) < 0.45, own, common)].tolist())

    def edit(self, rng, text: str) -> str:
        toks = text.split(" ")
        for i in rng.choice(len(toks), min(len(toks), int(rng.integers(2, 7))), replace=False):
            toks[i] = self.words[self._draw(rng, self.cdf, 1)[0]]
        if rng.random() < 0.3:
            toks = toks[:max(5, len(toks) - int(rng.integers(1, 6)))]
        return " ".join(toks)

    def documents(self, n: int, seed: int, dup_rate: float = 0.10) -> list[str]:
        rng = np.random.default_rng(seed)
        lengths = np.exp(rng.uniform(np.log(30), np.log(600), n)).astype(int)
        out = []
        for i in range(n):
            if i > 100 and rng.random() < dup_rate:
                out.append(self.edit(rng, out[int(rng.integers(0, i))]))
            else:
                out.append(self.document(rng, int(lengths[i])))
        return out


def windows(n: int, seed: int) -> list[str]:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "eval"))
    from bench_documents import synthetic
    return synthetic(n, seed)


def percentiles(seconds: list) -> str:
    ms = np.array(seconds) * 1e3
    return (f"p50 {np.percentile(ms, 50):.3f} ms, p90 {np.percentile(ms, 90):.3f} ms, "
            f"p99 {np.percentile(ms, 99):.3f} ms")


def build(path: str, texts: list, workers: int) -> list[str]:
    lines = []
    if os.path.exists(path):
        os.unlink(path)
    started = time.perf_counter()
    with Index.create(path, k=3, expected_n=len(texts), fingerprinter=Fingerprinter()) as ix:
        for a in range(0, len(texts), BATCH):
            ix.add_documents(texts[a:a + BATCH], [f"doc/{i:08d}" for i in
                                                  range(a, min(len(texts), a + BATCH))],
                             workers=workers, skip_empty=True)
            done = min(len(texts), a + BATCH)
            if done % (10 * BATCH) == 0:
                print(f"  {done:,} documents, {time.perf_counter() - started:.0f} s",
                      file=sys.stderr, flush=True)
        ingest = time.perf_counter() - started
        t = time.perf_counter()
        ix.compact(full=True)
        full = time.perf_counter() - t
    lines.append(f"ingestion: {len(texts):,} documents in {ingest:.1f} s = "
                 f"{len(texts) / ingest:,.0f} docs/s (workers={workers}, background compaction)")
    lines.append(f"compact(full=True) afterwards: {full:.1f} s")
    return lines


def sizes(ix: Index, n: int) -> list[str]:
    snap = ix._snapshot()
    by = {}
    for r in snap.manifest.runs:
        name = SPACE_NAMES.get(r.space, "tables")
        by[name] = by.get(name, 0) + r.value_bytes
    file_bytes = os.path.getsize(ix.path)
    lines = ["| space | bytes / document |", "|---|---|"]
    lines += [f"| {name} | {b / n:.1f} |" for name, b in sorted(by.items())]
    lines.append(f"| **file** (after compact(full=True) and vacuum) | **{file_bytes / n:.1f}** |")
    return lines


def warm(path: str) -> float:
    """Read the file once so that its pages are in the page cache (the method of
    tools/bench/README.md: ndindex reads in place from a warm page cache, as
    FAISS keeps its codes in memory); returns the seconds it took."""
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.read(16 << 20):
            pass
    return time.perf_counter() - t


def latency(ix: Index, queries: list, label: str) -> str:
    for q in queries[:20]:
        ix.similar(q)
    seconds, found = [], 0
    for q in queries:
        t = time.perf_counter()
        hits = ix.similar(q)
        seconds.append(time.perf_counter() - t)
        found += len(hits)
    return (f"| {label} | {len(queries)} | {percentiles(seconds)} | "
            f"{found / len(queries):.2f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--windows", action="store_true", help="overlapping windows of real text")
    ap.add_argument("--reuse", action="store_true", help="keep an index built by an earlier run")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(__file__)).stdout.strip()
    print(f"# bench_index_documents {time.strftime('%Y-%m-%d')} commit {commit} "
          f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}")
    kind = "windows" if args.windows else "generated"
    path = os.path.join(args.dir, f"bench-docs-{kind}-{args.docs}.ndx")
    if args.windows:
        texts = windows(args.docs, 1)
        fresh = [t for t in windows(20 * args.queries, 2) if 1800 <= len(t) <= 2300]
    else:
        corpus = Corpus()
        texts = corpus.documents(args.docs, 1)
        rng = np.random.default_rng(3)
        fresh = [corpus.document(rng, 330) for _ in range(args.queries)]
    rng = np.random.default_rng(4)
    long_ones = [t for t in texts if 1500 <= len(t) <= 2600]
    edited = [Corpus.edit(corpus, rng, long_ones[int(i)]) if not args.windows else
              long_ones[int(i)] for i in rng.integers(0, len(long_ones), args.queries)]
    print(f"{len(texts):,} {kind} documents, {sum(map(len, texts)) / len(texts):,.0f} "
          f"characters on average; queries {np.mean([len(q) for q in fresh]):,.0f} characters")
    if not (args.reuse and os.path.exists(path)):
        for line in build(path, texts, args.workers):
            print(line)
    with Index.open(path, readonly=True) as ix:
        print("\nBytes per document (file after a full compaction):\n")
        for line in sizes(ix, len(texts)):
            print(line)
        seconds = warm(path)
        print(f"\nsimilar(text), fingerprinting included, one thread, page cache warm "
              f"(the file read once first, {seconds:.1f} s):\n")
        print("| queries | n | latency | verified matches per query |")
        print("|---|---|---|---|")
        print(latency(ix, fresh, "new 2 KB texts"))
        print(latency(ix, edited, "edited copies of stored 2 KB documents"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
