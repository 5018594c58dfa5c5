"""Oracle soak: a churned index checked against brute force after every cycle.

Run:  python tools/soak_oracle.py [--cycles 200] [--n 1000000] [--seed 1]
                                  [--durability full|normal] [--dir DIR]

The tests' oracles run on small indexes, where a table has one or two
runs and the background lister, held runs and tombstone runs rarely come
into play.  This keeps one index of --n fingerprints open for --cycles
cycles with background compaction on and a small log limit, so that it
passes through many compaction states at a size where all of them occur.
Each cycle removes and adds a random 0.5-5% (some removed fingerprints come
back, some removals name absent ones; a tenth of the new ones come with a
document key, and some keyed ones are removed by key), runs a transaction
of check_and_add calls (near-duplicates of stored fingerprints among
them), and now and then reopens the index or compacts it.  After every
cycle, while the compactor goes on in the background:

- len() equals the oracle's count;
- stored fingerprints sampled at random are found (k=0), removed ones not;
- keys() of sampled fingerprints, keyed and not, are the oracle's;
- queries within k=3 (near-duplicates and random values) return exactly
  the brute-force answer over the oracle set;
- check_and_add returned matches exactly when brute force found some.

A second thread queries anchors (fingerprints never removed, each with its
key) all along and fails the run if one is ever missing or without its
key.  Any difference stops the run with
the cycle, the operation and the index's run shape.  Exit status 0 when
every cycle agreed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

from sweep_common import popcount64  # np.bitwise_count where numpy has it (2.0)

K = 3


def flip(rng, fps: np.ndarray, most: int) -> np.ndarray:
    """fps with 0..most random bits flipped each."""
    bits = rng.integers(0, 64, (len(fps), most), dtype=np.uint64)
    use = np.arange(most) < rng.integers(0, most + 1, (len(fps), 1))
    masks = np.where(use, np.uint64(1) << bits, np.uint64(0))
    # A bit drawn twice flips once: at most `most`, which is all the
    # callers need.
    return fps ^ np.bitwise_or.reduce(masks, axis=1)


def brute(live: np.ndarray, q: int, k: int) -> set:
    """The stored fingerprints within k of q, by popcount over all of them."""
    d = popcount64(live ^ np.uint64(q))
    return set(live[d <= k].tolist())


class Mismatch(AssertionError):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Mismatch(what)


def verify(ix, live: np.ndarray, gone: np.ndarray, keyed: dict, rng) -> int:
    """Compare the index with the oracle; return the queries checked."""
    check(len(ix) == len(live), f"len() {len(ix)} != oracle {len(live)}")
    with_key = list(keyed.items())
    for i in rng.integers(0, len(with_key), min(200, len(with_key))) if with_key else ():
        fp, key = with_key[i]
        got = ix.keys(fp)
        check(got == (key,), f"keys({fp:#x}) = {got}, not ({key!r},)")
    for fp in rng.choice(live, 200).tolist():
        if fp not in keyed:
            got = ix.keys(fp)
            check(got == (), f"keys({fp:#x}) = {got} of a fingerprint added without one")
    sample = np.unique(rng.choice(live, size=min(2000, len(live))))
    m = ix.query_many(sample, 0)
    check(len(np.unique(m["query"])) == len(sample),
          f"{len(sample) - len(np.unique(m['query']))} stored fingerprints not found (k=0)")
    if len(gone):
        absent = np.unique(rng.choice(gone, size=min(2000, len(gone))))
        absent = absent[~np.isin(absent, live)]
        m = ix.query_many(absent, 0)
        check(len(m) == 0, f"{len(m)} removed fingerprints found, e.g. {m[:3]}")
    qs = np.concatenate([flip(rng, rng.choice(live, 40), K + 1),
                         rng.integers(0, 2**64, 10, dtype=np.uint64)])
    many = ix.query_many(qs, K)
    for i, q in enumerate(qs.tolist()):
        want = brute(live, q, K)
        got = set(many["fingerprint"][many["query"] == i].tolist())
        check(got == want, f"query_many({q:#x}, k={K}): missing {sorted(want - got)[:3]}, "
                           f"extra {sorted(got - want)[:3]}")
        one = {m.fingerprint for m in ix.query(q, K, keys=False)}
        check(one == want, f"query({q:#x}, k={K}): missing {sorted(want - one)[:3]}, "
                           f"extra {sorted(one - want)[:3]}")
    return len(sample) + len(qs) * 2 + 400


def shape(ix) -> str:
    st = ix.stats()
    return (f"runs {[t['runs'] for t in st['tables']]}, log {st['log_entries']:,}, "
            f"file {os.path.getsize(ix.path) / 1e6:.0f} MB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--durability", choices=["full", "normal"], default="full")
    ap.add_argument("--log-limit", type=int, default=20_000)
    ap.add_argument("--dir", help="where the index goes (default: a temp dir)")
    args = ap.parse_args(argv)
    from ndindex import Index

    rng = np.random.default_rng(args.seed)
    opts = dict(durability=args.durability, log_limit=args.log_limit)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = os.path.join(d, "soak.ndx")
        anchors = np.unique(rng.integers(0, 2**64, 1000, dtype=np.uint64))
        live = np.unique(np.concatenate([anchors, rng.integers(0, 2**64, args.n,
                                                              dtype=np.uint64)]))
        gone = np.empty(0, dtype=np.uint64)
        keyed = {int(fp): f"anchor-{i}" for i, fp in enumerate(anchors.tolist())}
        ix = Index.create(path, k=K, expected_n=args.n, **opts)
        ix.add(anchors, keys=[keyed[fp] for fp in anchors.tolist()])
        ix.add(live[: len(live) // 2])
        ix.add(live[len(live) // 2:])
        stop, failure = threading.Event(), []

        def watch():
            r = np.random.default_rng(args.seed + 1)
            while not stop.is_set():
                try:
                    a = r.choice(anchors, 50)
                    m = current[0].query_many(flip(r, a, K), K)
                    found = {(int(q), int(f)) for q, f in zip(m["query"], m["fingerprint"])}
                    missing = [i for i in range(len(a)) if (i, int(a[i])) not in found]
                    if missing:
                        failure.append(f"anchor {int(a[missing[0]]):#x} missing "
                                       f"({len(missing)} of 50)")
                        return
                    one = int(a[0])
                    got = [mt.keys for mt in current[0].query(one, 0) if mt.fingerprint == one]
                    if got != [(keyed_anchor[one],)]:
                        failure.append(f"anchor {one:#x}: query(k=0, keys=True) gave {got}")
                        return
                except Exception as exc:  # noqa: BLE001 - reported by the main thread
                    if not stop.is_set() and not isinstance(exc, _closed_errors()):
                        failure.append(f"watcher: {type(exc).__name__}: {exc}")
                        return

        keyed_anchor = dict(keyed)  # the watcher's: never changed
        current = [ix]
        watcher = threading.Thread(target=watch, name="soak-anchors")
        watcher.start()
        checked, began, failed = 0, time.monotonic(), False
        try:
            for cycle in range(1, args.cycles + 1):
                what = "remove"
                frac = float(rng.uniform(0.005, 0.05))
                out = np.unique(rng.choice(live, int(len(live) * frac)))
                out = out[~np.isin(out, anchors)]
                ghosts = rng.integers(0, 2**64, 50, dtype=np.uint64)
                ix.remove(fingerprints=np.concatenate([out, ghosts]))
                for fp in out.tolist():
                    keyed.pop(fp, None)
                what = "remove by key"
                by_key = [fp for fp in list(keyed)[len(anchors):] if rng.random() < 0.01]
                ix.remove(keys=[keyed.pop(fp) for fp in by_key])
                out = np.union1d(out, np.array(by_key, dtype=np.uint64))
                live = np.setdiff1d(live, out, assume_unique=True)
                gone = np.union1d(gone, out)
                if len(gone) > args.n // 2:
                    # Bounded, or its set operations come to dominate a cycle.
                    gone = np.unique(rng.choice(gone, args.n // 2))
                what = "add"
                back = np.unique(rng.choice(gone, int(len(out) * 0.2)))
                new = np.unique(np.concatenate([back, rng.integers(
                    0, 2**64, len(out) - len(back), dtype=np.uint64)]))
                for part in np.array_split(new, int(rng.integers(1, 8))):
                    with_keys = rng.random(len(part)) < 0.1
                    with_keys &= ~np.isin(part, back)
                    keys = [f"k{fp:x}" if w else None
                            for fp, w in zip(part.tolist(), with_keys.tolist())]
                    ix.add(part, keys=keys)
                    keyed.update((fp, key) for fp, key in zip(part.tolist(), keys) if key)
                live = np.union1d(live, new)
                gone = np.setdiff1d(gone, new, assume_unique=True)
                what = "check_and_add"
                items = np.concatenate([flip(rng, rng.choice(live, 20), K + 1),
                                        rng.integers(0, 2**64, 80, dtype=np.uint64)])
                added = []
                with ix.transaction():
                    for fp in items.tolist():
                        want = brute(live, fp, K) | \
                            brute(np.array(added, dtype=np.uint64), fp, K)
                        got = {m.fingerprint for m in ix.check_and_add(fp)}
                        check(got == want, f"check_and_add({fp:#x}): {sorted(got)[:3]} != "
                                           f"{sorted(want)[:3]}")
                        if not want:
                            added.append(fp)
                added = np.array(added, dtype=np.uint64)
                live = np.union1d(live, added)
                gone = np.setdiff1d(gone, added)
                what = "verify"
                checked += verify(ix, live, gone, keyed, rng)
                roll = rng.random()
                if roll < 0.05:
                    what = "reopen"
                    ix.close()
                    ix = Index.open(path, **opts)
                    current[0] = ix
                    checked += verify(ix, live, gone, keyed, rng)
                elif roll < 0.08:
                    what = "compact"
                    ix.compact(full=bool(rng.random() < 0.3))
                    checked += verify(ix, live, gone, keyed, rng)
                if failure:
                    raise Mismatch(failure[0])
                if cycle % 10 == 0 or cycle == args.cycles:
                    print(f"cycle {cycle:4d}: {len(live):,} stored, {checked:,} answers checked, "
                          f"{shape(ix)}, {time.monotonic() - began:.0f} s", flush=True)
        except Mismatch as exc:
            print(f"MISMATCH at cycle {cycle} ({what}): {exc}\n  index: {shape(ix)}", flush=True)
            failed = True
            return 1
        finally:
            stop.set()
            watcher.join()
            ix.close()
            if failed and args.dir:
                # The evidence outlives the temporary directory: the index as
                # the failing cycle left it (close() commits what was pending).
                keep = os.path.join(args.dir, f"soak-failed-seed{args.seed}-{os.getpid()}")
                shutil.copytree(d, keep)
                np.save(os.path.join(keep, "oracle-live.npy"), live)
                print(f"  kept in {keep}", flush=True)
    print(f"all {args.cycles} cycles agreed with brute force")
    return 0


def _closed_errors() -> tuple:
    from ndindex.errors import ClosedError
    return (ClosedError,)


if __name__ == "__main__":
    sys.exit(main())
