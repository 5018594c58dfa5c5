"""Benchmark what document keys cost in the file: bytes per key beyond the key's own length.

Run:  python tools/bench/bench_keys.py [--n 400000] [--dir DIR] [--out FILE]

Two indexes are built in the same run from the same N random fingerprints
(k = 3, planned for N): one without keys, the peer, and one with a URL-like
key per fingerprint (a few hosts, sections, dates and slugs, as a crawler
stores them; about 60 bytes).  Both are filled by ``add`` in batches of
10,000 (the log, background compaction as by default), then measured twice:

- after ``compact()``: the log flushed into runs; the file keeps the free
  pages of the log it drained (LMDB never shrinks a file; they are reused
  by later adds), which is what a living index carries;
- after ``compact(full=True)``: one run per table and per key space, the
  free space given back (``vacuum``), which is what a finished index or
  ``vacuum_into`` copy weighs.

The figure is (file with keys - file without keys) / N, against the mean
key length in UTF-8: the cost beyond the key is their difference (negative
when compression saves more than the records add).  ``stats()["key_bytes"]``
(the key runs' own bytes) is reported beside it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from ndindex import Index

K = 3
BATCH = 10_000
SEED = 11
HOSTS = ["example.org", "news.example.com", "blog.example.net", "shop.example.co.uk",
         "docs.example.io", "forum.example.de"]
SECTIONS = ["world", "sport", "tech", "culture", "products", "threads", "guide", "archive"]
WORDS = ["how", "to", "near", "duplicate", "index", "review", "best", "new", "update", "city",
         "market", "release", "notes", "season", "final", "report", "open", "data", "guide"]


def url_keys(n: int, rng: np.random.Generator) -> list[str]:
    """n distinct URL-like keys: https://host/section/yyyy/mm/slug-words-i.html."""
    host = rng.integers(0, len(HOSTS), n)
    section = rng.integers(0, len(SECTIONS), n)
    year = rng.integers(2005, 2026, n)
    month = rng.integers(1, 13, n)
    slug = rng.integers(0, len(WORDS), (n, 3))
    return [f"https://{HOSTS[host[i]]}/{SECTIONS[section[i]]}/{year[i]}/{month[i]:02d}/"
            f"{WORDS[slug[i, 0]]}-{WORDS[slug[i, 1]]}-{WORDS[slug[i, 2]]}-{i}.html"
            for i in range(n)]


def build(path: str, fps: np.ndarray, keys: list | None) -> dict:
    """Fill an index by batches; return its file size after compact() and compact(full=True)."""
    t0 = time.perf_counter()
    out = {}
    with Index.create(path, k=K, expected_n=len(fps)) as ix:
        for start in range(0, len(fps), BATCH):
            ix.add(fps[start:start + BATCH],
                   keys=None if keys is None else keys[start:start + BATCH])
        ix.compact()
        out["compacted"] = os.path.getsize(path)
        out["compacted_key_bytes"] = ix.stats()["key_bytes"]
        ix.compact(full=True)
        out["full"] = os.path.getsize(path)
        out["full_key_bytes"] = ix.stats()["key_bytes"]
    out["seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400_000, help="fingerprints, one key each")
    ap.add_argument("--dir", default=None, help="where the two index files go (default: a temp dir)")
    ap.add_argument("--out", default=None, help="also append the report to this file")
    args = ap.parse_args()

    rng = np.random.default_rng(SEED)
    fps = np.unique(rng.integers(0, 2**64, args.n, dtype=np.uint64))
    rng.shuffle(fps)
    n = len(fps)
    keys = url_keys(n, rng)
    key_len = sum(len(k.encode()) for k in keys) / n
    work = tempfile.mkdtemp(dir=args.dir, prefix="bench_keys.")
    try:
        plain = build(os.path.join(work, "plain.ndx"), fps, None)
        keyed = build(os.path.join(work, "keyed.ndx"), fps, keys)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    lines = [f"# bench_keys  {time.strftime('%Y-%m-%d %H:%M')}  commit {commit}  "
             f"{platform.machine()} {os.cpu_count()} cores  python {platform.python_version()}  "
             f"load {os.getloadavg()[0]:.2f}",
             f"{n:,} fingerprints, one URL-like key each, mean key length {key_len:.1f} B "
             f"(UTF-8); k={K}, adds of {BATCH:,}"]
    for state, label in (("compacted", "after compact()         "),
                         ("full", "after compact(full=True)")):
        per_key = (keyed[state] - plain[state]) / n
        lines.append(f"{label}: file {keyed[state]:,} B with keys, {plain[state]:,} B without: "
                     f"{per_key:.1f} B per key = key length {per_key - key_len:+.1f} B "
                     f"(x{per_key / key_len:.2f}); key runs {keyed[state + '_key_bytes'] / n:.1f} "
                     "B per key")
    lines.append(f"build time: {keyed['seconds']:.1f} s with keys, {plain['seconds']:.1f} s without")
    lines.append(f"command: python tools/bench/bench_keys.py --n {args.n}")
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(report + "\n\n")


if __name__ == "__main__":
    sys.exit(main())
