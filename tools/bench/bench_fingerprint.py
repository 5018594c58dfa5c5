#!/usr/bin/env python3
"""Throughput of the fingerprint layer against datasketch and simhash, same run.

    python tools/bench/bench_fingerprint.py [--peer-mb 2] [--repeat 3]

Documents: every /usr/share/doc/*/copyright file and /usr/share/common-licenses
text on this machine (real English prose, see tools/eval/corpus.py), one
document per file.  MB/s counts UTF-8 input bytes per second on one core,
best of --repeat runs.  Peers (the bench extra) run on the first --peer-mb MB
of the same documents, since they are 10-100x slower; every rate is divided
by the peer's rate measured in this run.

Rows:
  ndindex simhash        Fingerprinter() (word 3-shingles, tf), per document
  ndindex simhash words  FeatureSpec('words', 1), per document
  ndindex minhash 128    Fingerprinter().minhash, 128 values, per document
  ndindex both           simhash + minhash 128
  ndindex fingerprint()  simhash + bottom-1024 sketch: what the default
                         near-duplicate pipeline stores per document
  ... one long text      fingerprint() of the documents joined into one text of
                         --long-mb MB (hundreds of pieces): its rate over the
                         per-document rate says whether cost stays linear
  datasketch MinHash     MinHash(num_perm=128).update_batch(word 3-shingles);
                         shingling in Python (re + join) included, as a user
                         of datasketch must do it
  datasketch update only update_batch alone on prepared shingles
  simhash Simhash        the simhash package on the same word 3-shingles (str)
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eval"))

import corpus  # noqa: E402

from ndindex.fingerprint import FeatureSpec, Fingerprinter  # noqa: E402


def best_rate(fn, docs, nbytes, repeat) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for d in docs:
            fn(d)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-mb", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--long-mb", type=float, default=64.0)
    args = ap.parse_args(argv)
    docs = corpus.plain_english()
    sizes = [len(d.encode()) for d in docs]
    total = sum(sizes)
    peer_docs, acc = [], 0
    for d, s in zip(docs, sizes):
        if acc >= args.peer_mb * 1e6:
            break
        peer_docs.append(d)
        acc += s
    peer_bytes = acc

    fp = Fingerprinter()
    fp_words = Fingerprinter(features=FeatureSpec("words", 1))
    rows = []

    def ours(name, fn):
        rows.append((name, best_rate(fn, docs, total, args.repeat), total,
                     best_rate(fn, peer_docs, peer_bytes, args.repeat)))

    ours("ndindex simhash (words3 tf)", fp.simhash)
    ours("ndindex simhash (words1 tf)", fp_words.simhash)
    ours("ndindex minhash 128", fp.minhash)
    ours("ndindex simhash + minhash", lambda d: (fp.simhash(d), fp.minhash(d)))
    ours("ndindex fingerprint() (default)", fp.fingerprint)
    joined = "\n".join(docs)
    long_text = joined * max(1, round(args.long_mb * 1e6 / len(joined.encode())))
    long_bytes = len(long_text.encode())
    long_rate = best_rate(fp.fingerprint, [long_text], long_bytes, 1)
    del long_text

    peers = {}
    word = re.compile(r"\w+")

    def shingles(d):
        toks = word.findall(d.lower())
        return [" ".join(toks[i:i + 3]).encode() for i in range(len(toks) - 2)]
    try:
        from datasketch import MinHash

        def ds(d):
            m = MinHash(num_perm=128)
            m.update_batch(shingles(d))
            return m
        peers["datasketch MinHash 128"] = best_rate(ds, peer_docs, peer_bytes, args.repeat)
        prepared = [shingles(d) for d in peer_docs]

        def ds_update(sh):
            MinHash(num_perm=128).update_batch(sh)
        peers["datasketch update_batch only"] = best_rate(ds_update, prepared, peer_bytes,
                                                          args.repeat)
    except ImportError:
        print("datasketch missing: pip install -e '.[bench]'", file=sys.stderr)
    try:
        from simhash import Simhash
        # Simhash(text) counts its own char 4-grams, and with numpy 2 a count
        # above 255 overflows its uint8 bit array: give it the word 3-shingles
        # (weight 1 each), the same features as ours, shingling included.
        peers["simhash Simhash(shingles)"] = best_rate(
            lambda d: Simhash([s.decode() for s in shingles(d)]), peer_docs, peer_bytes, 1)
    except ImportError:
        print("simhash missing: pip install -e '.[bench]'", file=sys.stderr)

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=os.path.dirname(os.path.abspath(__file__))
                                ).stdout.strip()
    except OSError:
        commit = "?"
    print(f"# bench_fingerprint  {time.strftime('%Y-%m-%d')}  commit {commit}  "
          f"{platform.machine()} {platform.processor() or ''} python {platform.python_version()}")
    print(f"# documents: {len(docs)} files, {total / 1e6:.1f} MB "
          f"(copyright files + common-licenses); peers on the first {len(peer_docs)} files, "
          f"{peer_bytes / 1e6:.1f} MB; one core, best of {args.repeat}")
    print()
    names = list(peers)
    head = f"{'method':34} {'MB/s all':>9} {'MB/s peer set':>13}"
    head += "".join(f" {'x ' + n.split()[0] + ' ' + n.split()[-1]:>22}" for n in names)
    print(head)
    for name, rate, _, rate_peer in rows:
        line = f"{name:34} {rate:9.1f} {rate_peer:13.1f}"
        line += "".join(f" {rate_peer / peers[n]:22.1f}" for n in names)
        print(line)
    for n, r in peers.items():
        print(f"{n:34} {'':>9} {r:13.2f}")
    print(f"\none long text of {long_bytes / 1e6:.0f} MB, fingerprint(): {long_rate:.1f} MB/s, "
          f"{long_rate / rows[-1][1]:.2f}x the per-document rate (>= 0.5: linear)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
