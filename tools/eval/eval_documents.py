#!/usr/bin/env python3
"""Precision and recall of the document pipeline on real text, against exact
Jaccard over all pairs.

    python tools/eval/eval_documents.py --out bench-out/eval-documents

Needs the eval extra (scipy): pip install -e '.[eval]'.  Writes results.md
and results.json to --out and prints results.md.

Truth: a pair is a near-duplicate at t when the exact Jaccard similarity of
the sets of word 3-shingles (normalised text, stop words kept; the 64-bit
XXH64 of each shingle) is >= t, for t = 0.8 and 0.9, over all pairs of each
corpus, by an exact all-pairs join with prefix filtering (allpairs.py; no
sampling).  The pipeline is ndindex.documents.near_duplicate_pairs at
threshold t with its defaults (bottom-1024 sketches, 20 bands of 5 rows),
one process.  Precision = reported pairs that are true / reported;
recall = true pairs reported / true pairs.

Corpora, all read from this machine (tools/eval/corpus.py):

* copyright: /usr/share/doc/*/copyright and /usr/share/common-licenses
  (the set the key design was chosen on);
* man: manual pages of sections 1, 5, 8 (held out);
* packages: Debian package descriptions (dpkg status, apt lists) and
  manual-page NAME lines (held out);
* changelogs: items of the Debian changelogs under /usr/share/doc (short)
  and their release entries, READMEs and NEWS files (long), added after
  every design choice was made (held out from all of them).

Long texts are whole files of more than 200 words; short ones are
paragraphs (blank-line separated) and descriptions of 3-200 words.  Texts
with the same word sequence as an earlier one are dropped (they are found
trivially, by the exact key).  Short pairs are also split by the word
count of the shorter text: texts of up to 11 words rely on deletion keys,
longer ones on band keys.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import allpairs  # noqa: E402
import corpus  # noqa: E402
from ndindex.arrays import sorted_unique  # noqa: E402
from ndindex.documents import band_candidates, near_duplicate_pairs  # noqa: E402
from ndindex.fingerprint import Fingerprinter, extract  # noqa: E402

THRESHOLDS = (0.8, 0.9)
WORD = re.compile(r"\w+")
#: Word-count buckets of the shorter text of a short pair.
BUCKETS = ((3, 5, "3-5 words"), (6, 11, "6-11 words"), (12, 19, "12-19 words"),
           (20, 49, "20-49 words"), (50, 200, "50-200 words"))


def _key(text: str) -> str:
    return " ".join(WORD.findall(text.casefold()))


def build(max_short: int, max_long: int, seed: int) -> dict:
    """Return {corpus: {"short": [...], "long": [...]}} with exact repeats dropped."""
    groups = {"copyright": ([], []), "man": ([], []), "packages": ([], []),
              "changelogs": ([], [])}
    seen = set()

    def add(group, text, allow_long=True):
        key = _key(text)
        words = len(key.split())
        if key in seen or words < 3:
            return
        if words > 200:
            if allow_long:
                seen.add(key)
                groups[group][1].append(text)
        else:
            seen.add(key)
            groups[group][0].append(text)

    for path, text in corpus.files():
        group = "man" if "/man/" in path else "copyright"
        add(group, text)
        for para in re.split(r"\n\s*\n", text):
            add(group, para, allow_long=False)
    for text in corpus.package_descriptions() + corpus.man_name_lines():
        add("packages", text)
        for para in re.split(r"\n\s*\n", text):
            add("packages", para, allow_long=False)
    items, entries = corpus.changelog_texts()
    for text in items + entries:
        add("changelogs", text)
    rng = random.Random(seed)
    out = {}
    for name, (short, long_) in groups.items():
        out[name] = {"short": rng.sample(short, min(len(short), max_short)),
                     "long": rng.sample(long_, min(len(long_), max_long))}
    return out


def evaluate(texts: list[str], fp: Fingerprinter, size: str) -> dict:
    """Truth and pipeline results for one list of texts."""
    sets = [sorted_unique(extract(fp.text(t), fp.minhash_features)) for t in texts]
    words = np.array([len(WORD.findall(t)) for t in texts])
    started = time.perf_counter()
    truth_l, truth_r, truth_j = allpairs.similar_pairs(sets, min(THRESHOLDS))
    truth_seconds = time.perf_counter() - started
    n = len(texts)
    out = {"texts": n, "truth_seconds": round(truth_seconds, 2), "thresholds": {}}
    for t in THRESHOLDS:
        seen = {}

        def counting(docs):
            pairs = band_candidates(docs)
            seen["candidates"] = len(pairs[0])
            return pairs

        started = time.perf_counter()
        got = near_duplicate_pairs(texts, t, workers=1, fingerprinter=fp, candidates=counting)
        seconds = time.perf_counter() - started
        true_codes = set((truth_l[truth_j >= t] * n + truth_r[truth_j >= t]).tolist())
        got_a, got_b = got.pairs["a"], got.pairs["b"]
        got_codes = (got_a * n + got_b).tolist()
        hit = np.array([c in true_codes for c in got_codes], dtype=bool)
        got_set = set(got_codes)
        tl, tr = truth_l[truth_j >= t], truth_r[truth_j >= t]
        found = np.array([c in got_set for c in (tl * n + tr).tolist()], dtype=bool)
        cells = {}
        if size == "long":
            cells["long"] = _cell(hit, np.ones(len(hit), bool), found, np.ones(len(found), bool))
        else:
            shorter_got = np.minimum(words[got_a], words[got_b])
            shorter_true = np.minimum(words[tl], words[tr])
            cells["short"] = _cell(hit, np.ones(len(hit), bool), found, np.ones(len(found), bool))
            for lo, hi, name in BUCKETS:
                cells[name] = _cell(hit, (shorter_got >= lo) & (shorter_got <= hi), found,
                                    (shorter_true >= lo) & (shorter_true <= hi))
        out["thresholds"][str(t)] = {"seconds": round(seconds, 2),
                                     "docs_per_second": round(n / seconds),
                                     "candidates": seen.get("candidates"),
                                     "exact_only": len(got.exact_only), "cells": cells}
    return out


def _cell(hit, got_mask, found, true_mask) -> dict:
    reported, true = int(got_mask.sum()), int(true_mask.sum())
    correct, recalled = int(hit[got_mask].sum()), int(found[true_mask].sum())
    return {"reported": reported, "true": true,
            "precision": round(correct / reported, 4) if reported else None,
            "recall": round(recalled / true, 4) if true else None}


def summary(results: dict) -> list[str]:
    """All corpora together, per size and threshold (the targets' cells)."""
    lines = ["| texts | t | true pairs | reported | precision | recall |", "|---|---|---|---|---|---|"]
    for size in ("short", "long"):
        for t in map(str, THRESHOLDS):
            true = reported = correct = recalled = 0
            for sizes in results.values():
                if size not in sizes:
                    continue
                c = sizes[size]["thresholds"][t]["cells"][size]
                true += c["true"]
                reported += c["reported"]
                correct += round((c["precision"] or 0) * c["reported"])
                recalled += round((c["recall"] or 0) * c["true"])
            lines.append(f"| {size} | {t} | {true} | {reported} | "
                         f"{correct / max(reported, 1):.4f} | {recalled / max(true, 1):.4f} |")
    return lines


def report(results: dict, info: dict) -> str:
    lines = ["# Document pipeline: precision and recall on real text", "",
             f"Command: `python tools/eval/eval_documents.py --max-short {info['max_short']} "
             f"--max-long {info['max_long']}`; {info['date']}, commit {info['commit']}.", "",
             "All corpora:", ""] + summary(results) + ["", "Per corpus (copyright: the "
             "tuning set; man, packages: held out; changelogs: added after the design was "
             "fixed), and short pairs by the word count of the shorter text:", "",
             "| corpus | texts | t | cell | true pairs | reported | precision | recall | "
             "candidates | docs/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, sizes in results.items():
        for size, res in sizes.items():
            for t, r in res["thresholds"].items():
                for cell, c in r["cells"].items():
                    p = "-" if c["precision"] is None else f"{c['precision']:.4f}"
                    rc = "-" if c["recall"] is None else f"{c['recall']:.4f}"
                    lines.append(f"| {name} | {res['texts']} | {t} | {cell} | {c['true']} | "
                                 f"{c['reported']} | {p} | {rc} | {r['candidates']} | "
                                 f"{r['docs_per_second']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-out/eval-documents")
    parser.add_argument("--max-short", type=int, default=60_000)
    parser.add_argument("--max-long", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--from-json", help="rewrite results.md from a results.json")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as fh:
            saved = json.load(fh)
        print(report(saved["results"], saved["info"]))
        return 0
    fp = Fingerprinter()
    data = build(args.max_short, args.max_long, args.seed)
    results = {}
    for name, sizes in data.items():
        results[name] = {}
        for size in ("short", "long"):
            if sizes[size]:
                results[name][size] = evaluate(sizes[size], fp, size)
                print(f"{name} {size}: {len(sizes[size])} texts", file=sys.stderr)
    import subprocess
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    info = {"max_short": args.max_short, "max_long": args.max_long,
            "date": time.strftime("%Y-%m-%d"), "commit": commit}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump({"info": info, "results": results}, fh, indent=1)
    text = report(results, info)
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
