"""Benchmark the k-way merge a compaction step runs (arrays.merge_unique).

Run:  python tools/bench/bench_merge.py [--against OTHER_CORE_SO] [--repeat 7]

The shapes are a streamed 30M index's merge steps, scaled to a step's
reads: a level-2 run with three level-1 runs (3M, 0.6M, 0.55M, 0.17M
values), the main level with one and with two level-2 runs, and two equal
runs.  Random 64-bit values, a few of them in two runs.  Each figure is
the best of --repeat calls; the peer is numpy: the runs concatenated,
sorted, and repeats dropped, in the same run (not ``np.unique``, whose
hash-based path for integers took seconds here).  --against times another build of
the extension (``ndindex/_core*.so`` of an older checkout) beside this
one, for before/after figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import bench_stream as bs  # noqa: E402

SHAPES = {
    "level 2 + three level-1 runs": [3_000_000, 600_000, 550_000, 170_000],
    "main + level 2": [4_000_000, 1_200_000],
    "main + two level-2 runs": [4_000_000, 1_200_000, 560_000],
    "two equal runs": [2_000_000, 2_000_000],
}


def load_core(path: str):
    spec = importlib.util.spec_from_file_location("ndindex._core", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def numpy_union(parts) -> np.ndarray:
    a = np.sort(np.concatenate(parts))
    return a[np.concatenate(([True], a[1:] != a[:-1]))]


def best_ms(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="another build of ndindex/_core (a .so) to time beside")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    from ndindex import _core
    cores = [("this build", _core)] + ([("--against", load_core(args.against))]
                                       if args.against else [])
    rng = np.random.default_rng(5)
    hide = np.empty(0, np.uint64)
    print("\n".join(bs.header("bench_merge", argv if argv is not None else sys.argv[1:],
                               f"numpy {np.__version__}")))
    print(f"{'shape':32} {'values':>10} " + " ".join(f"{n + ' ms':>14}" for n, _ in cores)
          + f" {'numpy ms':>10} {'x numpy':>8}")
    for name, sizes in SHAPES.items():
        parts = [numpy_union([rng.integers(0, 2**64, n, dtype=np.uint64)]) for n in sizes]
        parts[-1] = numpy_union([parts[-1], parts[0][::1000]])  # a few values in two runs
        want = numpy_union(parts)
        out = np.empty(sum(map(len, parts)), np.uint64)
        times = []
        for _, core in cores:
            n = core.merge_unique(parts, hide, out)
            assert np.array_equal(out[:n], want), f"{name}: the merge differs from numpy's"
            times.append(best_ms(lambda: core.merge_unique(parts, hide, out), args.repeat))
        peer = best_ms(lambda: numpy_union(parts), args.repeat)
        print(f"{name:32} {len(want):>10,} " + " ".join(f"{t:>14.1f}" for t in times)
              + f" {peer:>10.1f} {peer / times[0]:>7.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
