#!/usr/bin/env python3
"""Quality of the fingerprint layer on real text: simhash and MinHash against
exact Jaccard similarity of word 3-shingles, for all pairs.

    python tools/eval/eval_fingerprint.py --out bench-out/eval-fingerprint

Needs the eval extra (scipy for the all-pairs Jaccard, matplotlib for the
plots, datasketch as the peer): pip install -e '.[eval]'.  Writes
results.json, results.md and two PNGs to --out.  The corpus (tools/eval/
corpus.py) is built from files on this machine and described in results.md.

Truth: a pair is a near-duplicate when the exact Jaccard similarity of the
sets of word 3-shingles (normalised text, stop words kept) is >= 0.8.
Precision = true pairs found / pairs reported; recall = true pairs found /
true pairs.  Evaluated separately on short documents (paragraphs of 50-200
words) and long ones (whole files).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import corpus  # noqa: E402
from ndindex import _core, codec  # noqa: E402

from ndindex.fingerprint import (FeatureSpec, Fingerprinter, MinHashFamily,  # noqa: E402
                                 bottom_k, bottom_k_jaccard, extract, jaccard_estimates, lsh_candidate_pairs,
                                 optimal_bands, popcount64)

TRUTH_SHINGLES = FeatureSpec(unit="words", ngram=3)
THRESHOLD = 0.8
K_RANGE = range(1, 11)
K_MAX = 16
#: simhash variants whose candidates feed the verified pipelines
PIPELINE_VARIANTS = ("words1-tf", "words3-tf", "chars5-tf")

#: simhash feature pipelines compared (name -> Fingerprinter keyword arguments)
VARIANTS = {
    "words1-tf": dict(features=FeatureSpec("words", 1)),
    "words1-stop-logtf": dict(features=FeatureSpec("words", 1, stop_words="english"),
                              weighting="logtf"),
    "words1-stop-tfidf": dict(features=FeatureSpec("words", 1, stop_words="english"),
                              weighting="tfidf"),
    "words2-stop-tf": dict(features=FeatureSpec("words", 2, stop_words="english")),
    "words3-tf": dict(features=FeatureSpec("words", 3)),
    "words3-binary": dict(features=FeatureSpec("words", 3), weighting="binary"),
    "chars5-tf": dict(features=FeatureSpec("chars", 5)),
}


def exact_jaccard_pairs(sets: list[np.ndarray], min_j: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (codes, J) of all pairs i < j with exact Jaccard >= min_j
    (code = i * n + j), by sparse products in row blocks."""
    from scipy import sparse
    n = len(sets)
    vocab, inverse = np.unique(np.concatenate(sets), return_inverse=True)
    rows = np.repeat(np.arange(n), [len(s) for s in sets])
    a = sparse.csr_matrix((np.ones(len(rows), np.int32), (rows, inverse)),
                          shape=(n, len(vocab)))
    sizes = np.array([len(s) for s in sets], dtype=np.int64)
    at = a.T.tocsc()
    codes, js = [], []
    for start in range(0, n, 512):
        block = (a[start:start + 512] @ at).tocoo()
        i = block.row.astype(np.int64) + start
        j = block.col.astype(np.int64)
        keep = j > i
        i, j, inter = i[keep], j[keep], block.data[keep].astype(np.int64)
        jac = inter / (sizes[i] + sizes[j] - inter)
        ok = jac >= min_j
        codes.append(i[ok] * n + j[ok])
        js.append(jac[ok])
    codes, js = np.concatenate(codes), np.concatenate(js)
    order = np.argsort(codes)
    return codes[order], js[order]


def hamming_pairs(fps: np.ndarray, k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (codes, distance) of all pairs i < j within Hamming distance k_max."""
    n = len(fps)
    codes, dists = [], []
    for start in range(0, n, 256):
        x = fps[start:start + 256, None] ^ fps[None, :]
        d = popcount64(x)
        i, j = np.nonzero(d <= k_max)
        i = i + start
        keep = j > i
        codes.append(i[keep] * n + j[keep])
        dists.append(d[i[keep] - start, j[keep]])
    return np.concatenate(codes), np.concatenate(dists)


def _all_pairs(n: int) -> np.ndarray:
    i, j = np.triu_indices(n, 1)
    return i.astype(np.int64) * n + j


def score(found: np.ndarray, truth: np.ndarray) -> dict:
    """Precision and recall of a set of pair codes against the true codes."""
    tp = int(np.isin(found, truth).sum())
    return {"reported": int(len(found)), "true": int(len(truth)), "tp": tp,
            "precision": tp / len(found) if len(found) else 1.0,
            "recall": tp / len(truth) if len(truth) else 1.0}


def datasketch_lsh(shingle_lists: list[list[bytes]], threshold: float, num_perm: int = 128):
    """Candidate pairs and sketches from datasketch MinHash + MinHashLSH."""
    from datasketch import MinHash, MinHashLSH
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    sketches = []
    for i, sh in enumerate(shingle_lists):
        m = MinHash(num_perm=num_perm)
        m.update_batch(sh)
        sketches.append(m)
        lsh.insert(i, m)
    n = len(shingle_lists)
    codes = set()
    for i, m in enumerate(sketches):
        for j in lsh.query(m):
            if j != i:
                codes.add(min(i, j) * n + max(i, j))
    codes = np.array(sorted(codes), dtype=np.int64)
    hv = np.stack([m.hashvalues for m in sketches])
    return codes, hv


def evaluate(name: str, docs: list[str], log) -> dict:
    """All measurements on one document set."""
    n = len(docs)
    t0 = time.perf_counter()
    sets = [np.unique(extract(d, TRUTH_SHINGLES)) for d in docs]
    truth_codes, truth_j = exact_jaccard_pairs(sets, 0.5)
    truth = {t: truth_codes[truth_j >= t] for t in (0.7, 0.8, 0.9)}
    log(f"[{name}] {n} docs, true pairs J>=0.7/0.8/0.9: "
        f"{[len(v) for v in truth.values()]} ({time.perf_counter() - t0:.1f}s)")
    out = {"docs": n, "true_pairs": {str(t): int(len(v)) for t, v in truth.items()},
           "simhash": {}, "pipeline": {}, "lsh": {}, "datasketch": {}}

    # simhash variants at k = 1..10
    fingerprints = {}
    for vname, kwargs in VARIANTS.items():
        fp = Fingerprinter(**{k: v for k, v in kwargs.items() if k != "weighting"},
                           weighting="tf" if kwargs.get("weighting") == "tfidf"
                           else kwargs.get("weighting", "tf"))
        if kwargs.get("weighting") == "tfidf":
            fp = fp.learn_idf(docs)
        fps = fp.simhash_many(docs)
        fingerprints[vname] = fps
        codes, dist = hamming_pairs(fps, K_MAX)
        out["simhash"][vname] = {str(k): score(codes[dist <= k], truth[THRESHOLD])
                                 for k in range(1, K_MAX + 1)}
        best = out["simhash"][vname]
        log(f"[{name}] simhash {vname}: k=3 P={best['3']['precision']:.3f} "
            f"R={best['3']['recall']:.3f}; k=10 R={best['10']['recall']:.3f}")

    # MinHash sketches (ours) of the truth shingles
    family = MinHashFamily(128, seed=1)
    sketches = np.stack([family.sketch(s) for s in sets])

    # pipelines: simhash candidates within k, verified by a p-value MinHash
    # sketch or a bottom-k sketch (exact for sets of < k shingles)
    bottoms = {bk: [bottom_k(s, bk) for s in sets] for bk in (256, 1024)}
    for vname in PIPELINE_VARIANTS:
        codes, dist = hamming_pairs(fingerprints[vname], K_MAX)
        # verify every candidate within K_MAX once, then slice by k
        bottom_est = {bk: np.array([bottom_k_jaccard(sk[c // n], sk[c % n], bk) for c in codes])
                      for bk, sk in bottoms.items()}
        for k in (3, 6, 8, 10, 12, 16, 64):
            cand = codes[dist <= k] if k < 64 else _all_pairs(n)
            for p in (64, 128):
                est = jaccard_estimates(sketches[:, :p], cand // n, cand % n)
                r = score(cand[est >= THRESHOLD], truth[THRESHOLD])
                out["pipeline"][f"{vname} k<={k} minhash{p}"] = dict(r, candidates=int(len(cand)))
            if k == 64:  # all pairs: bottom-k needs a Python loop per pair, too slow
                continue
            for bk in bottoms:
                keep = (dist <= k) & (bottom_est[bk] >= THRESHOLD)
                r = score(codes[keep], truth[THRESHOLD])
                out["pipeline"][f"{vname} k<={k} bottom{bk}"] = dict(r, candidates=int(len(cand)))
        log(f"[{name}] pipeline {vname}: " + "; ".join(
            f"{key.split(' ', 1)[1]} P={r['precision']:.3f} R={r['recall']:.3f}"
            for key, r in out["pipeline"].items() if key.startswith(vname) and "bottom256" in key))

    # MinHash LSH banding (ours), raw candidates and verified by the sketch
    for t in (0.7, 0.8, 0.9):
        bands, rows = optimal_bands(t, 128)
        left, right = lsh_candidate_pairs(sketches, bands=bands, rows=rows)
        cand = left * n + right
        est = jaccard_estimates(sketches, left, right)
        out["lsh"][str(t)] = {"bands": bands, "rows": rows,
                              "raw": score(cand, truth[t]),
                              "verified": score(cand[est >= t], truth[t])}
        log(f"[{name}] LSH t={t} b={bands} r={rows}: raw {out['lsh'][str(t)]['raw']}")

    # datasketch MinHash + MinHashLSH on the same shingles (as strings)
    from ndindex.fingerprint import tokens
    shingles = []
    for d in docs:
        toks = tokens(d, FeatureSpec("words", 1))
        grams = [" ".join(toks[i:i + 3]).encode() for i in range(len(toks) - 2)] \
            or [" ".join(toks).encode()]
        shingles.append(grams)
    for t in (0.7, 0.8, 0.9):
        cand, hv = datasketch_lsh(shingles, t)
        est = jaccard_estimates(hv, cand // n, cand % n) if len(cand) else np.empty(0)
        out["datasketch"][str(t)] = {"raw": score(cand, truth[t]),
                                     "verified": score(cand[est >= t], truth[t])}
        log(f"[{name}] datasketch t={t}: raw {out['datasketch'][str(t)]['raw']}")
    # the default pipeline exactly as Fingerprinter() runs it
    fpr = Fingerprinter()
    pairs = [fpr.fingerprint(d) for d in docs]
    fps = np.array([p[0] for p in pairs], dtype=np.uint64)
    codes, dist = hamming_pairs(fps, fpr.query_k)
    kept = np.array([c for c in codes if fpr.similarity(pairs[c // n][1], pairs[c % n][1])
                     >= fpr.threshold], dtype=np.int64)
    out["default"] = dict(score(kept, truth[fpr.threshold]), candidates=int(len(codes)),
                          query_k=fpr.query_k, bottom_k=fpr.bottom_k,
                          sketch_values_mean=float(np.mean([len(p[1]) for p in pairs])))
    log(f"[{name}] default pipeline: {out['default']}")
    out["_fingerprints"] = fps
    return out


def leading_bit_histogram(fps: np.ndarray) -> np.ndarray:
    """Counts of h = position of the leading 1-bit of XORs of successive
    sorted distinct fingerprints (Manku et al., Figure 2a)."""
    return np.array(_core.delta_histogram(np.unique(np.asarray(fps, dtype=np.uint64)),
                                          codec.CODING_XOR))


def write_plots(results: dict, hist: np.ndarray, out_dir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (name, res) in zip(axes, ((n, results[n]) for n in ("short", "long"))):
        for idx, (vname, by_k) in enumerate(res["simhash"].items()):
            ks = list(K_RANGE)
            ax.plot(ks, [by_k[str(k)]["precision"] for k in ks], "-o", ms=3, color=f"C{idx}",
                    label=f"{vname} precision")
            ax.plot(ks, [by_k[str(k)]["recall"] for k in ks], "--x", ms=3, color=f"C{idx}",
                    label=f"{vname} recall")
        ax.set_title(f"simhash vs exact Jaccard >= {THRESHOLD} ({name}, n={res['docs']})")
        ax.set_xlabel("Hamming distance k")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("precision / recall")
    axes[1].legend(fontsize=6, ncol=2, loc="lower right")
    fig.tight_layout()
    path = os.path.join(out_dir, "precision_recall_vs_k.png")
    fig.savefig(path, dpi=110)
    paths.append(path)
    fig, ax = plt.subplots(figsize=(7, 4))
    total = hist.sum()
    ax.bar(np.arange(64), hist / max(total, 1))
    ax.set_xlabel("bit position h of the leading 1 of XOR(successive sorted fingerprints)")
    ax.set_ylabel("fraction")
    ax.set_title(f"Figure 2a shape: {total + 1} distinct simhashes (default, words1-tf)")
    fig.tight_layout()
    path = os.path.join(out_dir, "xor_leading_bit.png")
    fig.savefig(path, dpi=110)
    paths.append(path)
    return paths


def markdown(results: dict, info: dict) -> str:
    lines = ["# Fingerprint quality", "", f"Corpus: {json.dumps(info)}", "",
             f"Truth: exact Jaccard of word 3-shingles >= {THRESHOLD} "
             "(LSH rows: >= their own threshold).", ""]
    for name in ("short", "long"):
        res = results[name]
        lines += [f"## {name} documents (n={res['docs']}, true pairs {res['true_pairs']})", "",
                  "### simhash, Hamming distance <= k (precision / recall)", "",
                  "| variant | " + " | ".join(f"k={k}" for k in K_RANGE) + " |",
                  "|---|" + "---|" * len(K_RANGE)]
        for vname, by_k in res["simhash"].items():
            lines.append(f"| {vname} | " + " | ".join(
                f"{by_k[str(k)]['precision']:.2f} / {by_k[str(k)]['recall']:.2f}"
                for k in K_RANGE) + " |")
        lines += ["", "### MinHash LSH (128 values) and datasketch MinHashLSH", "",
                  "| method | t | bands x rows | raw P / R | verified P / R |", "|---|---|---|---|---|"]
        for t, r in res["lsh"].items():
            lines.append(f"| ndindex LSH | {t} | {r['bands']}x{r['rows']} | "
                         f"{r['raw']['precision']:.3f} / {r['raw']['recall']:.3f} | "
                         f"{r['verified']['precision']:.3f} / {r['verified']['recall']:.3f} |")
        for t, r in res["datasketch"].items():
            lines.append(f"| datasketch MinHashLSH | {t} | auto | "
                         f"{r['raw']['precision']:.3f} / {r['raw']['recall']:.3f} | "
                         f"{r['verified']['precision']:.3f} / {r['verified']['recall']:.3f} |")
        d = res["default"]
        lines += ["", f"### default pipeline (Fingerprinter()): simhash words1-tf within "
                  f"k={d['query_k']}, bottom-{d['bottom_k']} Jaccard >= {THRESHOLD}", "",
                  f"candidates {d['candidates']}, reported {d['reported']}, "
                  f"precision {d['precision']:.3f}, recall {d['recall']:.3f}, "
                  f"mean sketch values stored {d['sketch_values_mean']:.0f}"]
        lines += ["", "### pipelines: simhash variant within k, then a sketch's estimate "
                  f">= {THRESHOLD} (k<=64: all pairs, the verifier alone)", "",
                  "| simhash, k, verifier | candidates | precision | recall |",
                  "|---|---|---|---|"]
        for key, r in res["pipeline"].items():
            lines.append(f"| {key} | {r['candidates']} | {r['precision']:.3f} | "
                         f"{r['recall']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def replot(out_dir: str) -> None:
    """Redraw the plots from an earlier run's results.json."""
    with open(os.path.join(out_dir, "results.json")) as fh:
        results = json.load(fh)
    write_plots(results, np.array(results["xor_leading_bit_histogram"]), out_dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench-out/eval-fingerprint")
    ap.add_argument("--max-short", type=int, default=8000)
    ap.add_argument("--max-long", type=int, default=3000)
    ap.add_argument("--replot", action="store_true", help="only redraw the plots of --out")
    args = ap.parse_args(argv)
    if args.replot:
        replot(args.out)
        return 0
    os.makedirs(args.out, exist_ok=True)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    short, long_, info = corpus.documents(args.max_short, args.max_long)
    log(f"corpus: {json.dumps(info)}")
    results = {"short": evaluate("short", short, log), "long": evaluate("long", long_, log)}
    hist = leading_bit_histogram(np.concatenate([results[n].pop("_fingerprints")
                                                 for n in ("short", "long")]))
    results["xor_leading_bit_histogram"] = hist.tolist()
    results["corpus"] = info
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(markdown(results, info))
    try:
        for path in write_plots(results, hist, args.out):
            log(f"wrote {path}")
    except ImportError:
        log("matplotlib missing: no plots (pip install -e '.[plot]')")
    log(f"wrote {args.out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
