"""Benchmark probabilistic simhash matching (one table) against the permuted tables.

Run:  python tools/bench/bench_psm.py [--n 10000000] [--ks 3 6] > tools/bench/results/psm.txt
Needs the eval extra for the corpus loader (pip install -e '.[eval]').

Data: N random 64-bit fingerprints (seeded) plus the planted near-duplicates:
every document of the offline corpus (tools/eval/corpus.py: 11,000
paragraphs and files), fingerprinted by the default Fingerprinter, so that
queries carry real weight vectors and their partners real flips.  Queries
are the distinct simhashes of the corpus's eval half (tools/eval/eval_psm.py
splits by near-duplicate component; the default flip model was fitted on
the other half); truth is each query's corpus partners at distance 1..k,
found by brute force.

Engines, same stored values, same k, same process, one after the other:

- the permuted tables: ndindex.Index with choose_plan(N, k) (4 tables at
  k = 3, 28 at k = 6), queried in place (blocks read from the map) and
  after Index.preload() (decoded tables in memory); exact, recall 1;
- PSM: one ndindex.psm.PsmTable (sorted values, header directory over the
  top round(log2 N) bits), probed in VOSH order of the query's flip
  probabilities up to max_probes headers.

Also the VOSH generator alone: the Python reference against the C kernel.

Bytes per fingerprint: what each stores, one table of ndindex.codec blocks
(block keys included) per table; the Index file too, and the memory each
holds while querying.  Times are p50 of single queries (one thread).
Report ratios; the machine is shared.
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

from ndindex import vosh  # noqa: E402
from ndindex.fingerprint import Fingerprinter  # noqa: E402

VOSH_SETS = 20_000


def bench_vosh() -> None:
    """The VOSH generator: the Python reference against the C kernel, per set."""
    import itertools
    p = np.random.default_rng(3).random(64) * 0.3
    best = {}
    for name, fn in (("python", lambda: list(itertools.islice(vosh.flip_sets_upto(p, 3),
                                                               VOSH_SETS))),
                     ("c", lambda: vosh.flip_masks(p, 3, max_probes=VOSH_SETS))):
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        best[name] = min(times) / VOSH_SETS * 1e9
    print(f"VOSH, first {VOSH_SETS:,} flip sets of <= 3 of 64 bits (best of 3): Python "
          f"{best['python']:.0f} ns/set, C {best['c']:.0f} ns/set, "
          f"{best['python'] / best['c']:.1f}x")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="random fingerprints stored")
    ap.add_argument("--ks", type=int, nargs="+", default=[3, 6])
    ap.add_argument("--workdir", default=None, help="where index files go (default: a temp dir)")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"# bench_psm  {time.strftime('%Y-%m-%d %H:%M')}  commit {commit}  {platform.machine()}"
          f"  {os.cpu_count()} cores  load {os.getloadavg()[0]:.2f}  N={args.n:,} random + corpus",
          flush=True)
    log = lambda msg: print(f"  {msg}", file=sys.stderr, flush=True)  # noqa: E731
    bench_vosh()
    data = eval_psm.load(log)
    rng = np.random.default_rng(eval_psm.SPLIT_SEED)
    fps, weights, is_eval = [], [], []
    for name, g in data["groups"].items():
        fps.append(g["fps"])
        weights.append(g["weights"])
        is_eval.append(eval_psm.split(g, rng))
    fps, weights, is_eval = map(np.concatenate, (fps, weights, is_eval))
    probs = Fingerprinter().flip_probabilities(weights)   # the stored default model
    uq, first = np.unique(fps[is_eval], return_index=True)
    queries, qprobs = uq, probs[np.nonzero(is_eval)[0][first]]
    background = np.random.default_rng(7).integers(0, 2**64, args.n, dtype=np.uint64)
    stored = np.unique(np.concatenate([fps, background]))
    print(f"stored {len(stored):,} distinct fingerprints; {len(queries):,} queries "
          f"(corpus eval half)")
    with tempfile.TemporaryDirectory(prefix="ndindex-bench-psm-", dir=args.workdir) as workdir:
        for k in args.ks:
            truth = set()
            for q in queries.tolist():
                d = eval_psm.popcount(fps ^ np.uint64(q))
                truth |= {(q, int(f)) for f in np.unique(fps[(d <= k) & (d > 0)])}
            r = eval_psm.bphs_vs_psm(stored, queries, qprobs, truth, k, workdir, log)
            report(r)
    return 0


def report(r: dict) -> None:
    ratio = r["psm_bytes_per_fp"] / r["bphs_bytes_per_fp"]
    print(f"\nk = {r['k']}: {r['tables']} permuted tables ({r['scheme'].splitlines()[0]}); "
          "PSM one table, "
          f"p = {r['header_bits']} header bits; {r['truth_pairs']:,} true pairs within k")
    print(f"  bytes per fingerprint (codec blocks + keys): tables {r['bphs_bytes_per_fp']:.4f}, "
          f"PSM {r['psm_bytes_per_fp']:.4f}, ratio {ratio:.5f} (1/{1 / ratio:.3f}); "
          f"Index file {r['bphs_file_bytes_per_fp']:.3f}")
    print(f"  memory while querying: tables preloaded {r['bphs_ram_bytes_per_fp']:.1f} B/fp "
          f"(in place: the mapped file), PSM {r['psm_ram_bytes_per_fp']:.1f} B/fp "
          f"(values + directory)")
    print(f"  permuted tables: recall 1.000, p50 {r['bphs_p50_us']:.1f} us in place, "
          f"{r['bphs_preload_p50_us']:.1f} us preloaded")
    print(f"  {'max_probes':>10} {'mean probes':>12} {'recall':>8} {'p50 us':>8} "
          f"{'x in place':>11} {'x preloaded':>12}")
    for x in r["psm"]:
        print(f"  {x['max_probes']:>10} {x['mean_probes']:>12.0f} {x['recall']:>8.4f} "
              f"{x['p50_us']:>8.1f} {x['p50_us'] / r['bphs_p50_us']:>11.2f} "
              f"{x['p50_us'] / r['bphs_preload_p50_us']:>12.2f}")
    print(f"  PSM recall at equal time: {eval_psm.fmt_recall(r['recall_at_equal_time_inplace'])} "
          f"(tables in place), {eval_psm.fmt_recall(r['recall_at_equal_time_preload'])} "
          "(tables preloaded)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
