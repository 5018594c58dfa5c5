#!/usr/bin/env python3
"""Probabilistic simhash matching on real text: VOSH order against random
order, PSM against the permuted tables, and PSM as the candidate generator of
the document pipeline.

    python tools/eval/eval_psm.py --out bench-out/eval-psm

Needs the eval extra (pip install -e '.[eval]').  Writes results.json,
results.md and three PNGs to --out (docs/psm-results.md and docs/img/psm_*
are copies).  About 3 minutes on the project's 2-core machine with the
default --background 1000000.

Data.  The offline corpus of tools/eval/corpus.py (Debian copyright files,
common licenses, manual pages): paragraphs of 50-200 words ("short") and
whole files ("long"), each fingerprinted by the default Fingerprinter
(simhash of words, tf; V kept; bottom-1024 sketch of word 3-shingles).
Near-duplicate truth: exact Jaccard of word 3-shingle sets >= 0.8.

Split.  Documents are grouped into the connected components of the truth
pairs; each component (singletons too) goes to the fit half or the eval
half by a seeded coin.  The flip model is fitted on the fit half's pairs
only; every number reported is measured on the eval half.

Parts (each in results.md):
1. flip models compared on the eval pairs;
2. Figure 5 of the paper: for pairs at simhash distance exactly h (h = 1..6),
   the rank of the true flip set among all C(64, h) sets, VOSH order against
   random order;
3. the same in PSM's setting: flips of the top p header bits only, sizes
   0..k merged (k = 3, 6, 10), VOSH against random order and against the
   natural order (by size, random within a size);
4. PSM (one table) against the permuted tables (ndindex.Index, the paper's
   BPHS) over the corpus plus --background random fingerprints: bytes per
   fingerprint, p50 query time, recall, recall at equal time;
5. the document pipeline at k = 10: PSM candidates from one table at
   several max_probes against the exact 66-table candidates, precision and
   recall at Jaccard >= 0.8 after bottom-k verification, bytes per document.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import corpus  # noqa: E402
from eval_fingerprint import TRUTH_SHINGLES, exact_jaccard_pairs, hamming_pairs  # noqa: E402

from ndindex import codec, plan as plans, psm, vosh  # noqa: E402
from ndindex.cluster import component_labels  # noqa: E402
from ndindex.fingerprint import Fingerprinter, FlipModel, extract, normalised_margins  # noqa: E402
from ndindex.index import Index  # noqa: E402

THRESHOLD = 0.8
SPLIT_SEED = 20111024
#: Most probes spent on one pair in part 2 (C(64, 4) = 635,376 fits), and
#: the pairs sampled for h >= 4, where a pair may cost a million probes.
FIG5_CAP = 1 << 20
FIG5_MAX_PAIRS = 300
HEADER_KS = (3, 6, 10)
HEADER_CAP = 1 << 17
#: k of part 4, with the PSM budgets measured (None: powers of two up to
#: 16384, and the exhaustive count).  k = 10 is the document pipeline's.
BPHS_KS = {3: None, 6: None, 10: (16, 64, 256, 1024, 4096)}
PIPELINE_K = 10
PIPELINE_PROBES = (1, 4, 16, 64, 256, 1024, 4096)
TIMED_QUERIES = 2000


# -- data -------------------------------------------------------------------------


def load(log) -> dict:
    """Fingerprints, weights, sketches and truth pairs of the short and long documents."""
    short, long_, info = corpus.documents()
    fpr = Fingerprinter()
    groups = {}
    for name, docs in (("short", short), ("long", long_)):
        t0 = time.perf_counter()
        sets = [np.unique(extract(d, TRUTH_SHINGLES)) for d in docs]
        codes, js = exact_jaccard_pairs(sets, THRESHOLD)
        pairs = [fpr.simhash_with_weights(d) for d in docs]
        groups[name] = dict(
            n=len(docs), truth=codes,
            fps=np.array([p[0] for p in pairs], dtype=np.uint64),
            weights=np.stack([p[1] for p in pairs]),
            sketches=[fpr.sketch(d) for d in docs])
        log(f"[{name}] {len(docs)} documents, {len(codes)} pairs with J >= {THRESHOLD} "
            f"({time.perf_counter() - t0:.1f} s)")
    return dict(groups=groups, corpus=info)


def split(group: dict, rng) -> np.ndarray:
    """Whether each document is in the eval half: a coin per truth component."""
    n = group["n"]
    labels = component_labels(n, group["truth"] // n, group["truth"] % n)
    coin = rng.random(n) < 0.5
    return coin[labels]


def directed_pairs(group: dict, in_half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) truth pairs inside one half, both directions (either may be the query)."""
    n = group["n"]
    i, j = group["truth"] // n, group["truth"] % n
    keep = in_half[i]
    return np.concatenate([i[keep], j[keep]]), np.concatenate([j[keep], i[keep]])


def popcount(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(np.asarray(x, dtype=np.uint64)).astype(np.int64)


# -- 1. flip models -----------------------------------------------------------------


def alternative_models(wa: np.ndarray, wb: np.ndarray) -> dict:
    """Flip-probability functions of z = |V| / rms(V) fitted on the fit pairs."""
    from scipy.optimize import minimize
    z = normalised_margins(wa)
    flipped = (wa > 0) != (wb > 0)
    sign = np.where(wa > 0, 1.0, -1.0)
    rms = np.sqrt(np.mean(wa * wa, axis=1, keepdims=True))
    y = (-sign * (wb - wa) / np.where(rms > 0, rms, 1)).ravel()
    knots = np.concatenate([[0.0], np.quantile(y[y > 0], np.linspace(0.05, 0.999, 15))])
    surv = np.array([(y > t).mean() for t in knots])

    def log_linear(k, p):
        lp = np.log(np.maximum(p, 1e-300))
        slope = (lp[-1] - lp[-2]) / (k[-1] - k[-2])
        return lambda x: np.exp(np.where(x <= k[-1], np.interp(x, k, lp),
                                         lp[-1] + slope * (x - k[-1])))

    bins = np.quantile(z[flipped], np.linspace(0, 0.995, 16))
    edges = np.concatenate([[-1.0], (bins[1:] + bins[:-1]) / 2, [np.inf]])
    rate = np.array([(flipped[(z > lo) & (z <= hi)].sum() + 0.5) / (((z > lo) & (z <= hi)).sum() + 1)
                     for lo, hi in zip(edges[:-1], edges[1:])])
    rate = np.minimum.accumulate(rate)
    zz, ff = z.ravel(), flipped.ravel()

    def nll(w):
        t = w[0] + w[1] * zz
        return float(np.sum(np.logaddexp(0, t) - ff * t))
    w = minimize(nll, [-1.0, -5.0]).x
    raw = (-sign * (wb - wa)).ravel()
    mu_raw, sd_raw = float(raw.mean()), float(raw.std())
    return {
        f"normal on raw margins |V| (mu={mu_raw:.2f}, sigma={sd_raw:.2f})":
            ("raw", FlipModel(mu_raw, sd_raw)),
        "empirical survival of Y (16 knots)": log_linear(knots, surv),
        "binned flip rate (16 knots)": log_linear(np.maximum.accumulate(bins), rate),
        f"logistic on z (a={w[0]:.3f}, b={w[1]:.3f})":
            lambda x, w=w: 1 / (1 + np.exp(-(w[0] + w[1] * x))),
    }


def eval_nll(prob_fn, wa, wb) -> float:
    """Mean negative log-likelihood of the observed flips per pair (64 bits)."""
    p = np.clip(prob_fn(wa), 1e-12, 1 - 1e-12)
    flipped = (wa > 0) != (wb > 0)
    return float(-np.mean(np.sum(np.where(flipped, np.log(p), np.log1p(-p)), axis=1)))


# -- 2. Figure 5: exact-h flip sets over all 64 bits ----------------------------------


def vosh_rank(probs: np.ndarray, target: int, h: int, cap: int) -> float:
    """1-based rank of the target mask among the size-h sets in VOSH order (inf past cap)."""
    limit = 1024
    while True:
        masks = vosh.flip_masks(probs, h, exact=True, max_probes=min(limit, cap))
        hit = np.nonzero(masks == np.uint64(target))[0]
        if len(hit):
            return float(hit[0] + 1)
        if limit >= cap or len(masks) < min(limit, cap):
            return math.inf
        limit *= 32


def figure5(fps, probs, a, b, log) -> dict:
    out = {}
    diff = fps[a] ^ fps[b]
    dist = popcount(diff)
    rng = np.random.default_rng(SPLIT_SEED)
    for h in range(1, 7):
        idx = np.nonzero(dist == h)[0]
        if h > 3 and len(idx) > FIG5_MAX_PAIRS:   # h <= 3: every pair (at most C(64, 3) probes)
            idx = np.sort(rng.choice(idx, FIG5_MAX_PAIRS, replace=False))
        ranks = np.array([vosh_rank(probs[a[r]], int(diff[r]), h, FIG5_CAP) for r in idx])
        total = math.comb(64, h)
        found = ranks[np.isfinite(ranks)]
        res = dict(pairs=int(len(idx)), sets=total, cap=FIG5_CAP,
                   found_within_cap=int(len(found)), ranks=ranks.tolist())
        for q in (0.5, 0.9, 0.95, 1.0):
            need = math.ceil(q * len(idx))
            vosh_probes = float(np.sort(ranks)[need - 1]) if need else 0.0
            random_probes = q * total    # expected rank quantile of a random order
            res[f"probes_{q}"] = {"vosh": vosh_probes, "random": random_probes,
                                  "ratio": random_probes / vosh_probes
                                  if math.isfinite(vosh_probes) and vosh_probes else None}
        out[str(h)] = res
        r95, r100 = res["probes_0.95"], res["probes_1.0"]
        log(f"[fig5] h={h}: {len(idx)} pairs; 95% recall at {r95['vosh']:.0f} probes "
            f"(random {r95['random']:.0f}, {fmt_ratio(r95['ratio'])}); 100% at "
            f"{r100['vosh']:.0f} (random {r100['random']:.0f}, {fmt_ratio(r100['ratio'])})")
    return out


def fmt_ratio(r) -> str:
    return f"{r:.1f}x" if r else "n/a"


def fmt_recall(r) -> str:
    return "none (one probe is slower)" if r is None else f"{r:.3f}"


# -- 3. header probing (PSM's setting) ----------------------------------------------


def header_ranks(fps, probs, a, b, p: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """For pairs within k: VOSH rank of the partner's header, and its header flip count."""
    within = np.nonzero(popcount(fps[a] ^ fps[b]) <= k)[0]
    ranks, sizes = [], []
    for r in within:
        q, f = int(fps[a[r]]), int(fps[b[r]])
        target = f >> (64 - p)
        limit, rank = 256, math.inf
        while True:
            heads = psm.probe_headers(q, probs[a[r]], p, k, min(limit, HEADER_CAP))
            hit = np.nonzero(heads == np.uint64(target))[0]
            if len(hit):
                rank = float(hit[0] + 1)
                break
            if len(heads) < min(limit, HEADER_CAP) or limit >= HEADER_CAP:
                break
            limit *= 16
        ranks.append(rank)
        sizes.append(((q ^ f) >> (64 - p)).bit_count())
    return np.array(ranks), np.array(sizes, dtype=np.int64)


def header_curves(ranks, sizes, p, k, grid) -> dict:
    """Recall at each probe budget: VOSH (measured), random and by-size (expected)."""
    total = psm.flip_set_count(p, k)
    offsets = np.cumsum([0] + [math.comb(p, h) for h in range(k + 1)])
    by_size = [float(np.mean(np.clip((x - offsets[sizes]) / np.array(
        [math.comb(p, s) for s in sizes]), 0, 1))) for x in grid]
    return {"grid": [int(x) for x in grid],
            "vosh": [float(np.mean(ranks <= x)) for x in grid],
            "random": [min(1.0, x / total) for x in grid],
            "by_size": by_size, "exhaustive_probes": total}


def probes_for(curve: list, grid: list, target: float):
    for x, r in zip(grid, curve):
        if r >= target - 1e-12:
            return x
    return None


# -- 4. PSM against the permuted tables ---------------------------------------------


def codec_bytes(sorted_values: np.ndarray) -> int:
    """Bytes of one table in ndindex.codec blocks: the blocks plus 8 bytes of block key each."""
    code = codec.HuffmanCode.from_values(sorted_values)
    enc = codec.encode(sorted_values, code)
    return int(enc.blocks.nbytes + 8 * enc.n_blocks)


def table_bytes(fps: np.ndarray, plan: plans.Plan) -> list[int]:
    return [codec_bytes(np.sort(design.apply(fps))) for design in plan.tables]


def p50_us(fn, queries, n: int) -> float:
    lat = []
    for q in queries[:n]:
        t = time.perf_counter_ns()
        fn(q)
        lat.append((time.perf_counter_ns() - t) / 1000)
    return float(np.percentile(lat, 50))


def bphs_vs_psm(stored, queries, qprobs, truth: set, k: int, workdir: str, log,
                budgets=None) -> dict:
    """One k: the permuted-table Index and one PSM table over the same stored values."""
    n = len(stored)
    plan = plans.choose_plan(n, k)
    path = os.path.join(workdir, f"bphs-k{k}.ndx")
    ix = Index.create(path, k=k, expected_n=n, plan=plan)
    ix.add(stored)
    ix.compact()
    stats = ix.stats()
    qlist = [int(q) for q in queries]
    order = np.random.default_rng(1).permutation(len(qlist))[:TIMED_QUERIES]
    timed = [qlist[i] for i in order]
    ix.query(timed[0], k, keys=False)
    bphs_inplace = p50_us(lambda q: ix.query(q, k, keys=False), timed, TIMED_QUERIES)
    if hasattr(ix, "preload"):
        ix.preload()
    # Format 2 has no preload (tables are always read in place): the "preloaded"
    # figure is then a second pass over warm pages and verified blocks.
    ix.query(timed[0], k, keys=False)
    bphs_preload = p50_us(lambda q: ix.query(q, k, keys=False), timed, TIMED_QUERIES)
    exact = ix.query_many(queries, k)
    ix.close()
    os.unlink(path)
    if os.path.exists(path + "-lock"):
        os.unlink(path + "-lock")
    found_exact = {(int(q), int(f)) for q, f in
                   zip(queries[exact["query"]].tolist(), exact["fingerprint"].tolist())}
    assert truth <= found_exact, "the permuted tables are exact"
    perm_bytes = table_bytes(stored, plan)
    table = psm.PsmTable(stored)
    p = table.header_bits
    psm_bytes = codec_bytes(table.values)
    total = psm.flip_set_count(p, k)
    if budgets is None:
        budgets = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, total})
    budgets = [m for m in budgets if m <= total]
    rows = []
    prob_of = {int(q): pr for q, pr in zip(queries.tolist(), qprobs)}
    for m in budgets:
        matches, probes = table.query_many(queries, qprobs, k, m)
        got = {(int(q), int(f)) for q, f in
               zip(queries[matches["query"]].tolist(), matches["fingerprint"].tolist()) if q != f}
        t50 = p50_us(lambda q: table.query(q, prob_of[q], k, m), timed, TIMED_QUERIES)
        rows.append(dict(max_probes=m, recall=len(got & truth) / max(len(truth), 1),
                         p50_us=t50, mean_probes=float(probes.mean())))
    res = dict(k=k, n=n, header_bits=p, tables=len(plan.tables), scheme=plan.describe(),
               truth_pairs=len(truth), bphs_p50_us=bphs_inplace, bphs_preload_p50_us=bphs_preload,
               bphs_table_bytes=perm_bytes, bphs_bytes_per_fp=sum(perm_bytes) / n,
               bphs_file_bytes_per_fp=stats["file_bytes"] / n,
               psm_bytes_per_fp=psm_bytes / n, psm_ram_bytes_per_fp=table.nbytes / n,
               bphs_ram_bytes_per_fp=8.0 * len(plan.tables), psm=rows)
    for name, ref in (("inplace", bphs_inplace), ("preload", bphs_preload)):
        fit = [r for r in rows if r["p50_us"] <= ref]
        # None: even one probe is slower than the tables
        res[f"recall_at_equal_time_{name}"] = max((r["recall"] for r in fit), default=None)
    log(f"[bphs k={k}] N={n:,} {len(plan.tables)} tables p50 {bphs_inplace:.1f} us "
        f"(preloaded {bphs_preload:.1f}); PSM p={p}: " + "; ".join(
            f"{r['max_probes']}: R={r['recall']:.3f} {r['p50_us']:.1f} us" for r in rows))
    log(f"[bphs k={k}] bytes/fp: tables {res['bphs_bytes_per_fp']:.2f} (file "
        f"{res['bphs_file_bytes_per_fp']:.2f}), PSM {res['psm_bytes_per_fp']:.2f}; recall at "
        f"equal time: {fmt_recall(res['recall_at_equal_time_inplace'])} (in place), "
        f"{fmt_recall(res['recall_at_equal_time_preload'])} (preloaded)")
    return res


# -- 5. the document pipeline ---------------------------------------------------------


def verified(codes: np.ndarray, n: int, sketches, fpr: Fingerprinter) -> np.ndarray:
    keep = [c for c in codes.tolist()
            if fpr.similarity(sketches[c // n], sketches[c % n]) >= fpr.threshold]
    return np.array(keep, dtype=np.int64)


def score(found: np.ndarray, truth: np.ndarray) -> dict:
    tp = int(np.isin(found, truth).sum())
    return {"reported": int(len(found)), "tp": tp, "true": int(len(truth)),
            "precision": tp / len(found) if len(found) else 1.0,
            "recall": tp / len(truth) if len(truth) else 1.0}


def pipeline(group, in_eval, background: np.ndarray, log, name: str) -> dict:
    """k = 10 candidates on the eval documents: exact (66 tables) against PSM."""
    fpr = Fingerprinter()
    docs = np.nonzero(in_eval)[0]
    n = len(docs)
    fps = group["fps"][docs]
    probs = fpr.flip_probabilities(group["weights"][docs])
    sketches = [group["sketches"][i] for i in docs]
    remap = -np.ones(group["n"], dtype=np.int64)
    remap[docs] = np.arange(n)
    ti, tj = remap[group["truth"] // group["n"]], remap[group["truth"] % group["n"]]
    ok = (ti >= 0) & (tj >= 0)
    truth = np.sort(np.minimum(ti, tj)[ok] * n + np.maximum(ti, tj)[ok])
    cand, _ = hamming_pairs(fps, PIPELINE_K)
    cand = np.sort(cand)
    today = dict(score(verified(cand, n, sketches, fpr), truth), candidates=int(len(cand)))
    out = {"docs": n, "truth_pairs": int(len(truth)), "today": today, "psm": []}
    log(f"[pipeline {name}] {n} eval docs, {len(truth)} true pairs; 66 tables (exact k=10): "
        f"{len(cand)} candidates, P={today['precision']:.3f} R={today['recall']:.3f}")
    for label, stored in (("corpus", fps), ("corpus+background", np.concatenate([fps, background]))):
        table = psm.PsmTable(stored)
        for m in PIPELINE_PROBES:
            if m > psm.flip_set_count(table.header_bits, PIPELINE_K):
                continue
            t0 = time.perf_counter()
            matches, probes = table.query_many(fps, probs, PIPELINE_K, m)
            seconds = time.perf_counter() - t0
            # matched values back to eval documents (background values are not documents)
            left, right = _doc_pairs(fps, matches)
            codes = np.unique(np.minimum(left, right) * n + np.maximum(left, right))
            row = dict(stored=label, n_stored=len(table), header_bits=table.header_bits,
                       max_probes=m, mean_probes=float(probes.mean()),
                       us_per_query=1e6 * seconds / n,
                       candidates=int(len(codes)),
                       candidate_recall=float(np.isin(cand, codes).mean()) if len(cand) else 1.0,
                       **score(verified(codes, n, sketches, fpr), truth))
            out["psm"].append(row)
            log(f"[pipeline {name}] PSM {label} (N={len(table):,}, p={table.header_bits}) "
                f"max_probes={m}: candidates {row['candidates']} "
                f"({row['candidate_recall']:.3f} of the exact ones), P={row['precision']:.3f} "
                f"R={row['recall']:.3f}, {row['us_per_query']:.1f} us/query")
    return out


def _doc_pairs(fps: np.ndarray, matches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(query doc, matched doc) for every match whose value is a document's simhash."""
    by_value = np.argsort(fps, kind="stable")
    sv = fps[by_value]
    lo = np.searchsorted(sv, matches["fingerprint"], side="left")
    hi = np.searchsorted(sv, matches["fingerprint"], side="right")
    counts = hi - lo
    left = np.repeat(matches["query"], counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    right = by_value[np.repeat(lo, counts) + offsets]
    keep = left != right
    return left[keep], right[keep]


def bytes_per_document(n_values: list[int]) -> dict:
    """Table bytes per document of the 66-table k = 10 design and of one PSM table."""
    rng = np.random.default_rng(5)
    out = {}
    for n in n_values:
        values = rng.integers(0, 2**64, n, dtype=np.uint64)
        plan = plans.choose_plan(n, PIPELINE_K)
        one = codec_bytes(np.sort(values))
        # every permuted table of random values costs the same within a block
        # or two: measure two, count t
        tables = [codec_bytes(np.sort(d.apply(values))) for d in plan.tables[:2]]
        out[str(n)] = dict(tables=len(plan.tables), psm=one / n,
                           permuted=float(np.mean(tables)) * len(plan.tables) / n)
    return out


# -- output ---------------------------------------------------------------------------


def write_plots(res: dict, out_dir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter
    paths = []
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, h in zip(axes.ravel(), range(1, 7)):
        r = res["figure5"][str(h)]
        ranks = np.sort(np.array(r["ranks"]))
        total = r["sets"]
        xs = np.unique(np.concatenate([ranks[np.isfinite(ranks)], [1, min(total, r["cap"])]]))
        ax.plot(xs, [np.mean(ranks <= x) for x in xs], "-", color="C0", label="VOSH")
        grid = np.logspace(0, math.log10(total), 200)
        ax.plot(grid, grid / total, "--", color="C1", label="random order")
        ax.set_xscale("log")
        ax.set_title(f"h = {h} ({r['pairs']} pairs, C(64,{h}) = {total:,})", fontsize=9)
        ax.set_xlabel("probes")
        ax.set_ylabel("recall")
        ax.grid(alpha=0.3)
    axes[0, 0].legend()
    fig.suptitle("Flip sets of exactly h bits over all 64: VOSH order against random order "
                 "(eval pairs, J >= 0.8)")
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "psm_vosh_vs_random.png"))
    fig.savefig(paths[-1], dpi=100)
    fig, axes = plt.subplots(1, len(HEADER_KS), figsize=(13, 4))
    for ax, k in zip(axes, HEADER_KS):
        r = res["headers"][str(k)]
        for key, style in (("vosh", "-"), ("by_size", "-."), ("random", "--")):
            ax.plot(r["grid"], r[key], style, label=key.replace("_", " "))
        ax.set_xscale("log")
        ax.set_title(f"k = {k}: {r['pairs']} pairs, p = {r['header_bits']} header bits", fontsize=9)
        ax.set_xlabel("probes (flipped headers)")
        ax.set_ylabel("recall of pairs within k")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "psm_header_recall.png"))
    fig.savefig(paths[-1], dpi=100)
    fig, axes = plt.subplots(1, len(res["bphs"]), figsize=(5 * len(res["bphs"]), 4))
    for ax, r in zip(np.atleast_1d(axes), res["bphs"]):
        ax.plot([x["p50_us"] for x in r["psm"]], [x["recall"] for x in r["psm"]], "-o", ms=3,
                label="PSM, one table (max_probes varies)")
        ax.axvline(r["bphs_p50_us"], color="C1", ls="--",
                   label=f"{r['tables']} permuted tables (recall 1)")
        ax.axvline(r["bphs_preload_p50_us"], color="C2", ls=":", label="same, preloaded")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("p50 query time (us)")
        ax.set_ylabel("recall of pairs within k")
        ax.set_title(f"k = {r['k']}, N = {r['n']:,}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "psm_vs_bphs.png"))
    fig.savefig(paths[-1], dpi=100)
    return paths


def markdown(res: dict) -> str:
    m = res["model"]
    lines = ["# PSM evaluation", "", f"Corpus: {json.dumps(res['corpus'])}", "",
             f"Split: fit half {res['split']['fit_pairs']} directed pairs, eval half "
             f"{res['split']['eval_pairs']} directed pairs (J >= {THRESHOLD}).", "",
             f"## 1. Flip model (fitted on the fit half): mu = {m['mu']:.4f}, "
             f"sigma = {m['sigma']:.4f}", "",
             "| model | eval NLL per pair | h=2 p95 / max | h=3 p95 / max |", "|---|---|---|---|"]
    for name, r in res["models"].items():
        lines.append(f"| {name} | {r['nll']:.3f} | {r['p95_2']:.0f} / {r['max_2']:.0f} | "
                     f"{r['p95_3']:.0f} / {r['max_3']:.0f} |")
    lines += ["", "## 2. Figure 5: exactly h flipped bits among 64 (probes to reach a recall)", "",
              "| h | pairs | sets | 50% VOSH | 95% VOSH / random / ratio | 100% VOSH / random / "
              "ratio |", "|---|---|---|---|---|---|"]
    for h, r in res["figure5"].items():
        a, b, c = r["probes_0.5"], r["probes_0.95"], r["probes_1.0"]
        lines.append(f"| {h} | {r['pairs']} | {r['sets']:,} | {a['vosh']:.0f} | {b['vosh']:.0f} / "
                     f"{b['random']:.0f} / {fmt_ratio(b['ratio'])} | {c['vosh']:.0f} / "
                     f"{c['random']:.0f} / {fmt_ratio(c['ratio'])} |")
    lines += ["", "## 3. Header probing (sizes 0..k merged)", "",
              "| k | p | pairs | exhaustive probes | 95% recall: VOSH / by size / random | "
              "99%: VOSH / by size / random |", "|---|---|---|---|---|---|"]
    for k, r in res["headers"].items():
        lines.append(f"| {k} | {r['header_bits']} | {r['pairs']} | {r['exhaustive_probes']:,} | "
                     f"{r['probes_95']} | {r['probes_99']} |")
    lines += ["", "## 4. PSM (one table) against the permuted tables", ""]
    for r in res["bphs"]:
        lines += [f"### k = {r['k']}, N = {r['n']:,}, {r['tables']} tables; PSM p = "
                  f"{r['header_bits']}", "",
                  f"bytes per fingerprint: tables {r['bphs_bytes_per_fp']:.2f} (index file "
                  f"{r['bphs_file_bytes_per_fp']:.2f}), PSM {r['psm_bytes_per_fp']:.2f} "
                  f"(ratio {r['psm_bytes_per_fp'] / r['bphs_bytes_per_fp']:.3f}); RAM when "
                  f"decoded: tables {r['bphs_ram_bytes_per_fp']:.1f}, PSM "
                  f"{r['psm_ram_bytes_per_fp']:.1f}", "",
                  f"permuted tables p50 {r['bphs_p50_us']:.1f} us (preloaded "
                  f"{r['bphs_preload_p50_us']:.1f} us), recall 1; PSM recall at equal time "
                  f"{fmt_recall(r['recall_at_equal_time_inplace'])} (in place) / "
                  f"{fmt_recall(r['recall_at_equal_time_preload'])} (preloaded)", "",
                  "| max_probes | mean probes | recall | p50 us |", "|---|---|---|---|"]
        for x in r["psm"]:
            lines.append(f"| {x['max_probes']} | {x['mean_probes']:.0f} | {x['recall']:.4f} | "
                         f"{x['p50_us']:.1f} |")
        lines.append("")
    lines += ["## 5. Document pipeline, k = 10, eval documents only", "",
              "Speed and bytes of the k = 10 designs over the corpus plus the background: "
              "part 4, k = 10.", ""]
    for name, r in res["pipeline"].items():
        t = r["today"]
        lines += [f"### {name}: {r['docs']} documents, {r['truth_pairs']} true pairs", "",
                  f"today (66 tables, exact): {t['candidates']} candidates, P {t['precision']:.3f}"
                  f" R {t['recall']:.3f}", "",
                  "| stored | N | p | max_probes | mean probes | candidates | of exact | P | R | "
                  "us/query |", "|---|---|---|---|---|---|---|---|---|---|"]
        for x in r["psm"]:
            lines.append(f"| {x['stored']} | {x['n_stored']:,} | {x['header_bits']} | "
                         f"{x['max_probes']} | {x['mean_probes']:.0f} | {x['candidates']} | "
                         f"{x['candidate_recall']:.3f} | {x['precision']:.3f} | {x['recall']:.3f} | "
                         f"{x['us_per_query']:.1f} |")
        lines.append("")
    lines += ["Table bytes per document (random fingerprints, codec blocks + block keys):", "",
              "| N | k=10 tables | permuted | PSM | ratio |", "|---|---|---|---|---|"]
    for n, r in res["bytes_per_document"].items():
        lines.append(f"| {int(n):,} | {r['tables']} | {r['permuted']:.1f} | {r['psm']:.2f} | "
                     f"{r['permuted'] / r['psm']:.1f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench-out/eval-psm")
    ap.add_argument("--background", type=int, default=1_000_000,
                    help="random fingerprints stored beside the corpus in parts 3-5")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw the plots and results.md of --out from its results.json")
    args = ap.parse_args(argv)
    if args.replot:
        with open(os.path.join(args.out, "results.json")) as fh:
            res = json.load(fh)
        with open(os.path.join(args.out, "results.md"), "w") as fh:
            fh.write(markdown(res))
        write_plots(res, args.out)
        return 0
    os.makedirs(args.out, exist_ok=True)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    t_start = time.perf_counter()
    data = load(log)
    groups = data["groups"]
    rng = np.random.default_rng(SPLIT_SEED)
    halves = {name: split(g, rng) for name, g in groups.items()}
    # directed pairs of both groups, in one array of weights and fingerprints
    fit_a, fit_b, ev_a, ev_b, fps, weights, offset = [], [], [], [], [], [], 0
    for name, g in groups.items():
        a, b = directed_pairs(g, ~halves[name])
        fit_a.append(a + offset)
        fit_b.append(b + offset)
        a, b = directed_pairs(g, halves[name])
        ev_a.append(a + offset)
        ev_b.append(b + offset)
        fps.append(g["fps"])
        weights.append(g["weights"])
        offset += g["n"]
    fit_a, fit_b, ev_a, ev_b = map(np.concatenate, (fit_a, fit_b, ev_a, ev_b))
    fps, weights = np.concatenate(fps), np.concatenate(weights)
    res = {"corpus": data["corpus"], "split": {"fit_pairs": int(len(fit_a)),
                                               "eval_pairs": int(len(ev_a))}}
    # 1. the model, fitted on the fit half's pairs (fit() takes each pair both ways,
    # so passing both directions again leaves the moments unchanged)
    model = FlipModel.fit(weights[fit_a], weights[fit_b])
    res["model"] = {"mu": model.mu, "sigma": model.sigma}
    log(f"flip model on the fit half: mu={model.mu:.4f} sigma={model.sigma:.4f}")
    probs = model.probabilities(weights)
    candidates = {f"normal (mu={model.mu:.4f}, sigma={model.sigma:.4f}) [chosen]":
                  model.probabilities}
    for name, fn in alternative_models(weights[fit_a], weights[fit_b]).items():
        if isinstance(fn, tuple):   # the normal model on |V| itself, not |V| / rms(V)
            candidates[name] = lambda w, m=fn[1]: 0.5 * np.frompyfunc(math.erfc, 1, 1)(
                (np.abs(w) - m.mu) / (m.sigma * math.sqrt(2))).astype(float)
        else:
            candidates[name] = lambda w, fn=fn: fn(normalised_margins(w))
    candidates["no model (all bits alike)"] = lambda w: np.full(w.shape, 0.1)
    res["models"] = {}
    dist = popcount(fps[ev_a] ^ fps[ev_b])
    for name, fn in candidates.items():
        row = {"nll": eval_nll(fn, weights[ev_a], weights[ev_b])}
        for h in (2, 3):
            idx = np.nonzero(dist == h)[0]
            pr = fn(weights[ev_a[idx]])
            ranks = np.sort([vosh_rank(pr[i], int(fps[ev_a[r]] ^ fps[ev_b[r]]), h, math.comb(64, h))
                             for i, r in enumerate(idx)])
            row[f"p95_{h}"] = float(ranks[math.ceil(0.95 * len(ranks)) - 1])
            row[f"max_{h}"] = float(ranks[-1])
        res["models"][name] = row
        log(f"[model] {name}: NLL {row['nll']:.3f}, h=3 p95 {row['p95_3']:.0f} max {row['max_3']:.0f}")
    # 2. Figure 5
    res["figure5"] = figure5(fps, probs, ev_a, ev_b, log)
    # 3. header probing at the size of parts 4-5
    n_total = len(np.unique(fps)) + args.background
    p = psm.default_header_bits(n_total)
    res["headers"] = {}
    for k in HEADER_KS:
        ranks, sizes = header_ranks(fps, probs, ev_a, ev_b, p, k)
        total = psm.flip_set_count(p, k)
        grid = sorted({int(x) for x in np.unique(np.logspace(0, math.log10(total), 60).astype(int))}
                      | {total})
        curves = header_curves(ranks, sizes, p, k, grid)
        curves.update(header_bits=p, pairs=int(len(ranks)))
        for target in (0.95, 0.99):
            curves[f"probes_{int(target * 100)}"] = " / ".join(
                str(probes_for(curves[key], grid, target)) for key in ("vosh", "by_size", "random"))
        res["headers"][str(k)] = curves
        log(f"[headers k={k} p={p}] {len(ranks)} pairs; probes for 95%: {curves['probes_95']}; "
            f"99%: {curves['probes_99']} (VOSH / by size / random; exhaustive {total:,})")
    # 4. PSM against the permuted tables, corpus + background
    background = np.random.default_rng(99).integers(0, 2**64, args.background, dtype=np.uint64)
    stored = np.unique(np.concatenate([fps, background]))
    eval_docs = np.zeros(len(fps), dtype=bool)
    start = 0
    for name, g in groups.items():
        eval_docs[start:start + g["n"]] = halves[name]
        start += g["n"]
    qidx = np.nonzero(eval_docs)[0]
    uq, first = np.unique(fps[qidx], return_index=True)
    queries, qprobs = uq, probs[qidx[first]]
    res["bphs"] = []
    with tempfile.TemporaryDirectory(prefix="ndindex-eval-psm-") as workdir:
        for k, budgets in BPHS_KS.items():
            # truth: each eval query's corpus partners at distance 1..k, by brute
            # force (distance 0, the query's own value, is found by any order)
            truth = set()
            for q in queries.tolist():
                d = popcount(fps ^ np.uint64(q))
                truth |= {(q, int(f)) for f in np.unique(fps[(d <= k) & (d > 0)])}
            res["bphs"].append(bphs_vs_psm(stored, queries, qprobs, truth, k, workdir, log,
                                           budgets))
    # 5. the document pipeline
    res["pipeline"] = {name: pipeline(g, halves[name], background, log, name)
                       for name, g in groups.items()}
    res["bytes_per_document"] = bytes_per_document([10_000, 1_000_000, 10_000_000])
    log(f"bytes per document: {res['bytes_per_document']}")
    res["seconds"] = time.perf_counter() - t_start
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=float)
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(markdown(res))
    try:
        for path in write_plots(res, args.out):
            log(f"wrote {path}")
    except ImportError:
        log("matplotlib missing: no plots (pip install -e '.[eval]')")
    log(f"wrote {args.out}/results.md ({res['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
