"""Benchmark the dedup job against a datasketch MinHashLSH pipeline.

Generates N text files of 1-10 KB (seeded English-like text: a Zipf
vocabulary of pseudo-words in sentences and paragraphs) with planted
duplicates -- exact copies, a few words changed, a header and footer added,
white space reflowed -- then runs, on the same files and in the same run:

* ``ndindex.dedup`` (a fresh index; candidates that share a lookup key of
  the bottom-k sketch, verified by its estimate of the Jaccard similarity
  of word 3-shingles >= 0.8; docs/documents.md), and
* a datasketch pipeline: read, BLAKE2b for exact copies, MinHash (128
  permutations) of the same word 3-shingles, MinHashLSH(threshold=0.8),
  candidates verified by the MinHash Jaccard estimate >= 0.8, union-find.

Reports files per second of each, their ratio, and the precision and recall
of each against the planted pairs (a pair counts when both files are in one
reported cluster).  Both start from a cold cache of their own: the page
cache is warmed by one untimed read of every file first, so neither pays
the disk.

    python tools/bench/bench_dedup.py [--files 100000] [--dir DIR] [--jobs N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

import ndindex
from ndindex.cluster import clusters_from_pairs

SYLLABLES = ("ka to ri mu se la po ne vi da ro mi sa te lo nu be ga fi ho ju ke "
             "li ma no pe qu ra si tu va we xi yo ze an en in on un ar er or ir").split()
HEADERS = ["Copyright (c) {y} Example Holdings Ltd. All rights reserved.",
           "DRAFT {y} -- internal circulation only, do not forward.",
           "From the archive of the records office, volume {y}."]
FOOTERS = ["Printed on {y}-03-14. Page generated automatically.",
           "-- end of document {y} --",
           "Questions? Contact the editors; reference number {y}."]


def vocabulary(rng, n_words=30000, n_topics=400, topic_words=300):
    """A Zipf vocabulary of pseudo-words, and topics: each a Zipf over its own
    words.  A document mixes the common vocabulary with one topic's words, as
    real text mixes function words with its subject's (without topics every
    document would be a sample of one distribution, which real text is not)."""
    words = set()
    while len(words) < n_words:
        words.add("".join(rng.choice(SYLLABLES, rng.integers(1, 4))))
    words = np.array(sorted(words))
    rng.shuffle(words)
    zipf = 1.0 / np.arange(1, n_words + 1) ** 1.07
    topics = [rng.choice(n_words, topic_words, replace=False) for _ in range(n_topics)]
    tz = 1.0 / np.arange(1, topic_words + 1) ** 0.9
    return words, zipf / zipf.sum(), topics, tz / tz.sum()


def document(rng, vocab, size):
    """English-like text of about size bytes: sentences in paragraphs, lines <= 72."""
    words, probs, topics, tprobs = vocab
    n = max(20, size // 6)
    topic = topics[rng.integers(len(topics))]
    common = rng.choice(len(words), n, p=probs)
    own = topic[rng.choice(len(topic), n, p=tprobs)]
    tokens = words[np.where(rng.random(n) < 0.45, own, common)].tolist()
    ends = np.cumsum(rng.integers(6, 20, n // 6 + 2))
    for e in ends[ends < n]:
        tokens[e - 1] += "."
        if e < n:
            tokens[e] = tokens[e].capitalize()
    tokens[0] = tokens[0].capitalize()
    lines, line, width = [], [], 0
    for w in tokens:
        line.append(w)
        width += len(w) + 1
        if width > 66:
            lines.append(" ".join(line))
            line, width = [], 0
    lines.append(" ".join(line))
    return "\n".join(lines)[:size].rsplit(" ", 1)[0] + "\n"


def variant(rng, text, vocab, how):
    words, probs = vocab[0], vocab[1]
    if how == "exact":
        return text
    if how == "words":        # a few words changed
        toks = text.split(" ")
        for i in rng.choice(len(toks), min(len(toks), int(rng.integers(2, 6))), replace=False):
            toks[i] = words[rng.choice(len(words), p=probs)]
        return " ".join(toks)
    if how == "header":       # a header and a footer added
        y = int(rng.integers(1990, 2030))
        return (HEADERS[rng.integers(len(HEADERS))].format(y=y) + "\n\n" + text + "\n"
                + FOOTERS[rng.integers(len(FOOTERS))].format(y=y) + "\n")
    # white space reflowed: other line width, doubled spaces, CRLF
    width = int(rng.integers(40, 100))
    out, line = [], ""
    for w in text.split():
        if len(line) + len(w) + 1 > width:
            out.append(line)
            line = w
        else:
            line = f"{line}  {w}" if line and rng.random() < 0.1 else (f"{line} {w}" if line else w)
    out.append(line)
    return "\r\n".join(out) + "\r\n"


def generate(root: str, n_files: int, seed: int = 7, dup_rate: float = 0.15) -> list:
    """Write the tree; return the planted group of every file (index = file number)."""
    truth_path = os.path.join(root, "truth.json")
    if os.path.exists(truth_path):
        with open(truth_path) as fh:
            saved = json.load(fh)
        if saved["files"] == n_files and saved["seed"] == seed:
            return saved["groups"]
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng)
    texts, groups = [], []
    kinds = ["exact", "words", "header", "reflow"]
    for i in range(n_files):
        if i > 10 and rng.random() < dup_rate:
            src = int(rng.integers(0, i))
            how = kinds[rng.choice(4, p=[0.2, 0.3, 0.3, 0.2])]
            texts.append(variant(rng, texts[src], vocab, how))
            groups.append(groups[src])
        else:
            texts.append(document(rng, vocab, int(rng.integers(1000, 10001))))
            groups.append(i)
        path = os.path.join(root, "docs", f"{i // 1000:03d}", f"doc{i:06d}.txt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", newline="") as fh:
            fh.write(texts[-1])
    with open(truth_path, "w") as fh:
        json.dump({"files": n_files, "seed": seed, "groups": groups}, fh)
    return groups


def file_paths(root, n):
    return [os.path.join(root, "docs", f"{i // 1000:03d}", f"doc{i:06d}.txt") for i in range(n)]


def score(clusters_as_numbers: list, groups: list) -> tuple[float, float, int]:
    """Precision and recall of the pairs inside clusters against the planted pairs."""
    truth = {}
    for i, g in enumerate(groups):
        truth.setdefault(g, []).append(i)
    true_pairs = {(a, b) for m in truth.values() for x, a in enumerate(m) for b in m[x + 1:]}
    found = {(a, b) for m in clusters_as_numbers for x, a in enumerate(sorted(m))
             for b in sorted(m)[x + 1:]}
    hit = len(found & true_pairs)
    return (hit / len(found) if found else 1.0), hit / max(len(true_pairs), 1), len(true_pairs)


def run_ndindex(root, n, jobs):
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = ndindex.dedup([os.path.join(root, "docs")], index=os.path.join(tmp, "b.ndx"),
                               jobs=jobs)
        seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        again = ndindex.dedup([os.path.join(root, "docs")], index=os.path.join(tmp, "b.ndx"),
                              jobs=jobs)
        rerun = time.perf_counter() - t1
        # What the job keeps between runs: the index, and whatever lies beside it.
        stored = sum(os.path.getsize(os.path.join(tmp, name)) for name in os.listdir(tmp)
                     if name.startswith("b.ndx") and not name.endswith("-lock"))
        names = sorted(n for n in os.listdir(tmp) if not n.endswith("-lock"))
    number = {p: i for i, p in enumerate(file_paths(root, n))}
    clusters = [[number[f.path] for f in c.files] for c in result.clusters]
    assert again.files_read == 0 and len(again.clusters) == len(result.clusters)
    return seconds, clusters, rerun, stored, names


_WORD = re.compile(r"\w+")


def run_datasketch(root, n, threshold=0.8, num_perm=128):
    from datasketch import MinHash, MinHashLSH
    paths = file_paths(root, n)
    t0 = time.perf_counter()
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    sketches, hashes = [], []
    for i, p in enumerate(paths):
        with open(p, "rb") as fh:
            data = fh.read()
        hashes.append(hashlib.blake2b(data, digest_size=16).digest())
        toks = _WORD.findall(data.decode("utf-8", "replace").casefold())
        shingles = {" ".join(toks[j:j + 3]).encode() for j in range(max(1, len(toks) - 2))}
        m = MinHash(num_perm=num_perm)
        m.update_batch(list(shingles))
        lsh.insert(i, m)
        sketches.append(m)
    left, right = [], []
    first = {}
    for i, h in enumerate(hashes):
        if h in first:
            left.append(first[h])
            right.append(i)
        else:
            first[h] = i
    for i, m in enumerate(sketches):
        for j in lsh.query(m):
            if j > i and hashes[i] != hashes[j] and m.jaccard(sketches[j]) >= threshold:
                left.append(i)
                right.append(j)
    clusters = [c.tolist() for c in clusters_from_pairs(n, left, right)]
    return time.perf_counter() - t0, clusters


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--dir", help="where to generate (kept and reused); default a temp dir")
    ap.add_argument("--jobs", type=int, default=None, help="ndindex dedup processes (default: CPUs)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="bench-dedup-")
    os.makedirs(root, exist_ok=True)
    t0 = time.perf_counter()
    groups = generate(root, args.files, args.seed)
    gen = time.perf_counter() - t0
    total = 0
    for p in file_paths(root, args.files):     # warm the page cache for both
        total += os.path.getsize(p)
        with open(p, "rb") as fh:
            fh.read()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"# bench_dedup  {time.strftime('%Y-%m-%d %H:%M')}  commit {commit}  "
          f"{platform.machine()} {os.cpu_count()} cores  python {platform.python_version()}  "
          f"load {os.getloadavg()[0]:.2f}")
    planted = args.files - len(set(groups))
    print(f"files: {args.files:,} ({total / 2**20:.0f} MiB, {planted:,} planted duplicates: "
          f"exact, words changed, header+footer, reflowed); generated in {gen:.0f} s")
    nd_s, nd_clusters, rerun, stored, names = run_ndindex(root, args.files, args.jobs)
    p, r, n_true = score(nd_clusters, groups)
    print(f"ndindex dedup (jobs={args.jobs or os.cpu_count()}): {nd_s:8.1f} s  "
          f"{args.files / nd_s:8.0f} files/s  precision {p:.4f}  recall {r:.4f}  "
          f"({len(nd_clusters)} clusters; re-run unchanged: {rerun:.1f} s, 0 files read)")
    print(f"kept between runs: {stored:,} bytes, {stored / args.files:,.0f} bytes per file "
          f"({', '.join(names)})")
    ds_s, ds_clusters = run_datasketch(root, args.files)
    p2, r2, _ = score(ds_clusters, groups)
    print(f"datasketch MinHashLSH (1 process): {ds_s:8.1f} s  {args.files / ds_s:8.0f} files/s  "
          f"precision {p2:.4f}  recall {r2:.4f}  ({len(ds_clusters)} clusters)")
    print(f"ratio (ndindex files/s / datasketch files/s): {ds_s / nd_s:.2f}x; "
          f"planted pairs: {n_true:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
