"""Benchmark probabilistic simhash matching on an index file against the permuted tables.

Run:  python tools/bench/bench_psm_index.py > tools/bench/results/psm_index.txt
      (options: --n 10000000 --background 1000000 --sweep P...; about 15 minutes)
Needs the eval extra for the corpus loader (pip install -e '.[eval]').

Both engines are ndindex.Index files in the same process, one after the
other, compacted into one Huffman run per table, queried in place (blocks
read from the mapped file):

- the permuted tables: ``Index.create(k=k, expected_n=N)`` (the planner's
  design: 4 tables at k = 3, 66 at k = 10); exact;
- PSM: ``Index.create(k=k, expected_n=N, plan="psm")``: one table, the
  identity permutation, ``plan.psm_header_bits(N)`` prefix bits; a query
  probes the first max_probes flip sets of the prefix in VOSH order of its
  flip probabilities (the stored default flip model applied to its margins).

Part 1, k = 3 and 6 at N random fingerprints plus the planted near-duplicates:
every document of the offline corpus (tools/eval/corpus.py), fingerprinted
by the default Fingerprinter, so that queries carry real margins and their
partners real flips.  Queries: the distinct simhashes of the corpus's eval
half (tools/eval/eval_psm.py's split; the default flip model was fitted on
the other half); truth: each query's corpus partners at distance 1..k, by
brute force.  File bytes per fingerprint, recall, p50 of single queries.
With --sweep P..., PSM indexes of those prefix lengths too (how
psm_header_bits was chosen).

Part 2, the document pipeline at k = 10 (its query_k): the eval half's
documents stored with --background random fingerprints (the density of an
index of that many documents); each document queries the index for
simhash candidates within 10 bits, and a candidate is kept when the
bottom-k sketch similarity is >= 0.8 (Fingerprinter.threshold).  Truth:
exact Jaccard of word 3-shingle sets >= 0.8.  Precision, recall, index
bytes per document and query time of today's 66 tables and of PSM.

Times are p50 of single Index.query calls (one thread, each timed loop run
twice and the second kept, so both engines read warm pages); read them as
ratios within one run, the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eval"))

import eval_psm  # noqa: E402

from ndindex import plan as plans, reader  # noqa: E402
from ndindex.fingerprint import Fingerprinter  # noqa: E402
from ndindex.index import Index  # noqa: E402

K_ONLINE = (3, 6)
K_PIPELINE = 10
TIMED_QUERIES = 2000
ONLINE_PROBES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PIPELINE_PROBES = (16, 64, 128, 256, 512, 1024)


def build(path: str, stored: np.ndarray, k: int, plan) -> Index:
    """An index of the stored values, compacted into one run per table."""
    ix = Index.create(path, k=k, expected_n=len(stored), plan=plan, background_compaction=False)
    ix.add(stored)
    ix.compact(full=True)
    return ix


def p50_us(fn, queries: list) -> float:
    """p50 of fn(q) over the queries; the loop runs twice and the second is timed."""
    for q in queries:
        fn(q)
    lat = []
    for q in queries:
        t = time.perf_counter_ns()
        fn(q)
        lat.append(time.perf_counter_ns() - t)
    return float(np.percentile(lat, 50)) / 1000


def found_pairs(queries: np.ndarray, matches: np.ndarray) -> set:
    q = queries[matches["query"]].tolist()
    return {(a, b) for a, b in zip(q, matches["fingerprint"].tolist()) if a != b}


def file_bytes(ix: Index) -> int:
    return os.path.getsize(ix.path)


# -- part 1: k = 3 and 6 at N ------------------------------------------------------------


def truth_within(fps: np.ndarray, queries: np.ndarray, k: int) -> set:
    """Each query's corpus partners at distance 1..k (brute force)."""
    truth = set()
    for q in queries.tolist():
        d = eval_psm.popcount(fps ^ np.uint64(q))
        truth |= {(q, int(f)) for f in np.unique(fps[(d <= k) & (d > 0)])}
    return truth


def tables_row(stored, queries, truth, k, timed, workdir) -> dict:
    """The permuted tables for k: file bytes and p50 (recall is 1 by construction: checked)."""
    path = os.path.join(workdir, f"tables-{k}.ndx")
    ix = build(path, stored, k, None)
    row = dict(plan=ix.plan, bytes=file_bytes(ix),
               values=sum(t["bytes"] for t in ix.stats()["tables"]),
               p50=p50_us(lambda q: ix.query(q, k, keys=False), timed))
    assert truth <= found_pairs(queries, ix.query_many(queries, k)), "the tables are exact"
    ix.close()
    os.unlink(path)
    return row


def online(fps, stored, queries, qprobs, workdir, sweep: list, log) -> None:
    n = len(stored)
    order = np.random.default_rng(1).permutation(len(queries))[:TIMED_QUERIES]
    timed = queries[order].tolist()
    prob_of = dict(zip(queries.tolist(), qprobs))
    truth = {k: truth_within(fps, queries, k) for k in K_ONLINE}
    tables = {}
    print(f"\n## 1. N = {n:,} stored, {len(queries):,} queries\n")
    for k in K_ONLINE:
        tables[k] = t = tables_row(stored, queries, truth[k], k, timed, workdir)
        print(f"k = {k}: {len(truth[k]):,} true pairs within k; permuted tables: "
              f"{len(t['plan'].tables)} tables, p = {t['plan'].tables[0].prefix_bits}; file "
              f"{t['bytes'] / n:.3f} bytes/fp (table blocks {t['values'] / n:.3f}); recall "
              f"1.0000; p50 {t['p50']:.1f} us", flush=True)
        log(f"part 1: tables k = {k} done")
    default_p = plans.psm_header_bits(n)
    for p in [default_p] + [b for b in sweep if b != default_p]:
        sweeping = p != default_p
        path = os.path.join(workdir, f"psm-{p}.ndx")
        ix = build(path, stored, max(K_ONLINE), plans.psm_plan(n, max(K_ONLINE), header_bits=p))
        size, values = file_bytes(ix), ix.stats()["tables"][0]["bytes"]
        label = f"PSM, p = {p} (sweep)" if sweeping else 'PSM (plan="psm")'
        print(f"\n{label}: 1 table, p = {p} prefix bits"
              + ("" if sweeping else f" (psm_header_bits({n:,}))")
              + f"; file {size / n:.3f} bytes/fp (table blocks {values / n:.3f})")
        for k in K_ONLINE:
            if sweeping and k != K_ONLINE[0]:
                continue
            t = tables[k]
            default = plans.psm_max_probes(k)
            print(f"  k = {k}: file / the {len(t['plan'].tables)} tables' file = "
                  f"{size / t['bytes']:.4f} (1/{t['bytes'] / size:.2f}); tables' p50 "
                  f"{t['p50']:.1f} us")
            print(f"  {'max_probes':>10} {'recall':>8} {'p50 us':>8} {'x tables':>9}")
            rows = []
            budgets = (4, 16, 64) if sweeping else \
                sorted(set(ONLINE_PROBES) | {default} | ({1024} if k > 3 else set()))
            for m in budgets:
                got = found_pairs(queries, ix.query_many(queries, k, probabilities=qprobs,
                                                         max_probes=m))
                recall = len(got & truth[k]) / len(truth[k])
                us = p50_us(lambda q: ix.query(q, k, keys=False, probabilities=prob_of[q],
                                               max_probes=m), timed)
                rows.append((m, recall, us))
                mark = "  <- default" if m == default and not sweeping else ""
                print(f"  {m:>10} {recall:>8.4f} {us:>8.1f} {us / t['p50']:>9.2f}{mark}",
                      flush=True)
            if sweeping:
                continue
            fit = [r for r in rows if r[2] <= t["p50"]]
            print("  recall in the tables' time: "
                  + (f"{max(r[1] for r in fit):.4f}" if fit else "none (one probe is slower)"))
            got = found_pairs(queries, ix.query_many(queries, k))      # no probabilities
            us = p50_us(lambda q: ix.query(q, k, keys=False), timed)
            print(f"  without probabilities (flip sets by size), max_probes {default}: recall "
                  f"{len(got & truth[k]) / len(truth[k]):.4f}, p50 {us:.1f} us")
        ix.close()
        if not sweeping:
            directories_ab(path, timed, prob_of, K_ONLINE[0])
        os.unlink(path)
        log(f"part 1: PSM p = {p} done")


def directories_ab(path: str, timed: list, prob_of: dict, k: int, rounds: int = 3) -> None:
    """p50 at the default budget with the table's runs listed (run directories, the
    default for a probabilistic plan) and found through the chunks tree, alternating."""
    m = plans.psm_max_probes(k)
    listed = reader.DIRECTORY_MAX_CHUNKS_PSM
    times = {"listed": [], "tree": []}
    try:
        for _ in range(rounds):
            for name, limit in (("listed", listed), ("tree", reader.DIRECTORY_MAX_CHUNKS)):
                reader.DIRECTORY_MAX_CHUNKS_PSM = limit
                with Index.open(path, readonly=True) as ix:
                    times[name].append(p50_us(lambda q: ix.query(
                        q, k, keys=False, probabilities=prob_of[q], max_probes=m), timed))
    finally:
        reader.DIRECTORY_MAX_CHUNKS_PSM = listed
    a, b = np.median(times["listed"]), np.median(times["tree"])
    print(f"  k = {k}, max_probes {m}, runs listed in directories (DIRECTORY_MAX_CHUNKS_PSM) "
          f"against the chunks tree ({reader.DIRECTORY_MAX_CHUNKS} chunks), {rounds} rounds "
          f"alternating: p50 {a:.1f} / {b:.1f} us ({a / b:.2f}x)")


# -- part 2: the document pipeline -----------------------------------------------------


def pipeline(data, halves, background, workdir, log) -> None:
    fpr = Fingerprinter()
    groups = data["groups"]
    docs, fps, probs = {}, [], []
    for name, g in groups.items():
        idx = np.nonzero(halves[name])[0]
        docs[name] = idx
        fps.append(g["fps"][idx])
        probs.append(fpr.flip_probabilities(g["weights"][idx]))
    stored = np.unique(np.concatenate(fps + [background]))
    n = len(stored)
    print(f"\n## 2. Document pipeline, k = {K_PIPELINE}: the eval half's documents "
          f"({', '.join(f'{len(v):,} {k}' for k, v in docs.items())}) among {len(background):,} "
          f"random fingerprints: N = {n:,}\n")
    engines = [("66 tables (today)", None, [None])] + \
        [("PSM", "psm", sorted(set(PIPELINE_PROBES) | {plans.psm_max_probes(K_PIPELINE)})
          + ["uniform"])]
    for label, plan, budgets in engines:
        path = os.path.join(workdir, f"pipeline-{plan}.ndx")
        t0 = time.perf_counter()
        ix = build(path, stored, K_PIPELINE, plan)
        built = time.perf_counter() - t0
        size = file_bytes(ix)
        values = sum(t["bytes"] for t in ix.stats()["tables"])
        p = ix.plan.tables[0].prefix_bits
        print(f"{label}: {len(ix.plan.tables)} table(s), p = {p}; file {size / n:.2f} bytes per "
              f"document (table blocks {values / n:.2f}); built in {built:.0f} s")
        print(f"  {'max_probes':>10} {'group':>6} {'candidates':>10} {'P':>6} {'R':>6} "
              f"{'us/query':>9}")
        for m in budgets:
            for (name, g), q, pr in zip(groups.items(), fps, probs):
                if m is None:
                    run = lambda: ix.query_many(q, K_PIPELINE)  # noqa: E731
                elif m == "uniform":
                    run = lambda: ix.query_many(q, K_PIPELINE)  # noqa: E731
                else:
                    run = lambda: ix.query_many(q, K_PIPELINE, probabilities=pr,  # noqa: E731
                                                max_probes=m)
                run()      # warm: the second pass is timed
                t0 = time.perf_counter()
                matches = run()
                us = (time.perf_counter() - t0) * 1e6 / len(q)
                row = score_group(g, docs[name], q, matches, fpr)
                shown = "exact" if m is None else (
                    f"{plans.psm_max_probes(K_PIPELINE)}, no p" if m == "uniform" else str(m))
                print(f"  {shown:>10} {name:>6} {row['candidates']:>10} "
                      f"{row['precision']:>6.3f} {row['recall']:>6.3f} {us:>9.1f}", flush=True)
        ix.close()
        os.unlink(path)
        log(f"part 2: {label} done")


def score_group(group, docs, fps, matches, fpr) -> dict:
    """Candidates (pairs of this group's eval documents) verified by their sketches."""
    n = len(docs)
    left, right = eval_psm._doc_pairs(fps, matches)
    codes = np.unique(np.minimum(left, right) * n + np.maximum(left, right))
    sketches = [group["sketches"][i] for i in docs]
    kept = eval_psm.verified(codes, n, sketches, fpr)
    remap = -np.ones(group["n"], dtype=np.int64)
    remap[docs] = np.arange(n)
    ti, tj = remap[group["truth"] // group["n"]], remap[group["truth"] % group["n"]]
    ok = (ti >= 0) & (tj >= 0)
    truth = np.sort(np.minimum(ti, tj)[ok] * n + np.maximum(ti, tj)[ok])
    return dict(eval_psm.score(kept, truth), candidates=int(len(codes)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="random fingerprints in part 1")
    ap.add_argument("--background", type=int, default=1_000_000,
                    help="random fingerprints beside the documents in part 2")
    ap.add_argument("--sweep", type=int, nargs="*", default=[], metavar="P",
                    help="part 1 also with PSM indexes of these prefix lengths")
    ap.add_argument("--parts", default="1,2", help="parts to run (default 1,2)")
    ap.add_argument("--workdir", default=None, help="where index files go (default: a temp dir)")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"# bench_psm_index  {time.strftime('%Y-%m-%d %H:%M')}  commit {commit}  "
          f"{platform.machine()}  {os.cpu_count()} cores  load {os.getloadavg()[0]:.2f}  "
          f"argv {' '.join(sys.argv[1:]) or '(defaults)'}", flush=True)
    print(f"# PSM defaults: psm_header_bits(n) = round(log2(n / {plans.PSM_ENTRIES_PER_HEADER})), "
          f"psm_max_probes(k) = " + ", ".join(f"{plans.psm_max_probes(k)} at k = {k}"
                                              for k in (3, 6, 10)))
    log = lambda msg: print(f"  {msg}", file=sys.stderr, flush=True)  # noqa: E731
    parts = set(args.parts.split(","))
    data = eval_psm.load(log)
    rng = np.random.default_rng(eval_psm.SPLIT_SEED)
    halves = {name: eval_psm.split(g, rng) for name, g in data["groups"].items()}
    with tempfile.TemporaryDirectory(prefix="ndindex-bench-psm-index-", dir=args.workdir) as wd:
        if "1" in parts:
            fps = np.concatenate([g["fps"] for g in data["groups"].values()])
            weights = np.concatenate([g["weights"] for g in data["groups"].values()])
            is_eval = np.concatenate([halves[name] for name in data["groups"]])
            probs = Fingerprinter().flip_probabilities(weights)   # the stored default model
            queries, first = np.unique(fps[is_eval], return_index=True)
            qprobs = np.ascontiguousarray(probs[np.nonzero(is_eval)[0][first]])
            background = np.random.default_rng(7).integers(0, 2**64, args.n, dtype=np.uint64)
            stored = np.unique(np.concatenate([fps, background]))
            del background
            online(fps, stored, queries, qprobs, wd, args.sweep, log)
            del stored
        if "2" in parts:
            background = np.random.default_rng(99).integers(0, 2**64, args.background,
                                                            dtype=np.uint64)
            pipeline(data, halves, background, wd, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
