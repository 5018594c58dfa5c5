"""Oracle soak: a churned index checked against brute force after every cycle.

Run:  python tools/soak_oracle.py [--cycles 200] [--n 1000000] [--seed 1]
                                  [--durability full|normal] [--writers 1|2|4]
                                  [--readers R] [--k 3] [--dir DIR]

The tests' oracles run on small indexes, where a table has one or two
runs and the background lister, held runs and tombstone runs rarely come
into play.  This keeps one index of --n fingerprints open for --cycles
cycles with background compaction on and a small log limit, so that it
passes through many compaction states at a size where all of them occur.
Each cycle removes and adds a random 0.5-5% (some removed fingerprints come
back, some removals name absent ones; a tenth of the new ones come with a
document key, and some keyed ones are removed by key), runs a transaction
of check_and_add calls (near-duplicates of stored fingerprints among
them) and 20 more calls outside it (a commit each), and now and then reopens the index or compacts it.  After every
cycle, while the compactor goes on in the background:

- len() equals the oracle's count;
- stored fingerprints sampled at random are found (k=0), and no removed one
  (every one removed since the start, up to n/2 of them) is;
- keys() of sampled fingerprints, keyed and not, are the oracle's;
- queries within k=3 (near-duplicates and random values) return exactly
  the brute-force answer over the oracle set;
- check_and_add returned matches exactly when brute force found some.

A second thread queries anchors (fingerprints never removed, each with its
key) all along and fails the run if one is ever missing or without its
key.  Any difference stops the run with the cycle, the operation and the
index's run shape.  Exit status 0 when every cycle agreed.

--writers 2 or 4: as many processes write the one file at once, each with
its own compactor thread (one holds the compaction lease at a time), its
own watcher and its own part of the fingerprints (a residue class of the
low bits: Part), which only it adds and removes.  Each checks the index's
answers on its own part after every cycle (len() counts the others' too,
so it waits for the end); then the parent checks that the index holds
exactly the union of the writers' oracles, keys included.

--readers R: as many read-only processes query every writer's anchors,
near and exactly, all along (reopening now and then), and fail the run if
one is ever missing or without its key: a reader's caches (runs held in
memory, directories extended as merges grow) are filled from the file by
itself, never by a compactor of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from sweep_common import popcount64  # np.bitwise_count where numpy has it (2.0)

#: The index's k, and the distance every check asks within (--k).
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


class Part:
    """The fingerprints one writer owns: those congruent to `index` modulo
    `count` (a power of two).  Writers of other processes never touch them,
    so each one's oracle stays exact for its own fingerprints while the
    others write; answers are compared on the owned ones only."""

    def __init__(self, index: int = 0, count: int = 1):
        self.index, self.count = index, count

    def own(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.uint64)
        return values if self.count == 1 else \
            values[values & np.uint64(self.count - 1) == np.uint64(self.index)]

    def make(self, values: np.ndarray) -> np.ndarray:
        """values moved into this part (their low bits replaced)."""
        if self.count == 1:
            return values
        return (values & ~np.uint64(self.count - 1)) | np.uint64(self.index)

    def key(self, name: str) -> str:
        return name if self.count == 1 else f"w{self.index}-{name}"


def verify(ix, live: np.ndarray, gone: np.ndarray, keyed: dict, rng, part: Part) -> int:
    """Compare the index with the oracle; return the queries checked.  With
    other writers (part.count > 1), len() is theirs too and is left to the
    end, and answers are compared on this writer's fingerprints."""
    if part.count == 1:
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
        # Every one: a removal lost now and then hid among a sample's misses.
        m = ix.query_many(gone, 0)
        check(len(m) == 0, f"{len(m)} removed fingerprints found, e.g. "
                           f"{[hex(int(f)) for f in m['fingerprint'][:3]]}")
    qs = np.concatenate([flip(rng, rng.choice(live, 40), K + 1),
                         rng.integers(0, 2**64, 10, dtype=np.uint64)])
    many = ix.query_many(qs, K)
    for i, q in enumerate(qs.tolist()):
        want = brute(live, q, K)
        got = set(part.own(many["fingerprint"][many["query"] == i]).tolist())
        check(got == want, f"query_many({q:#x}, k={K}): missing {sorted(want - got)[:3]}, "
                           f"extra {sorted(got - want)[:3]}")
        one = set(part.own([m.fingerprint for m in ix.query(q, K, keys=False)]).tolist())
        check(one == want, f"query({q:#x}, k={K}): missing {sorted(want - one)[:3]}, "
                           f"extra {sorted(one - want)[:3]}")
    return len(sample) + len(qs) * 2 + 400


def shape(ix) -> str:
    st = ix.stats()
    return (f"runs {[t['runs'] for t in st['tables']]}, log {st['log_entries']:,}, "
            f"file {os.path.getsize(ix.path) / 1e6:.0f} MB")


class Oracle:
    """What one writer's fingerprints should be: live, removed, keyed; its anchors."""

    def __init__(self, anchors: np.ndarray, live: np.ndarray, keyed: dict):
        self.anchors, self.live, self.keyed = anchors, live, keyed
        self.gone = np.empty(0, dtype=np.uint64)


def anchor_keys(anchors: np.ndarray, part: Part) -> dict:
    """Each anchor's document key."""
    return {int(fp): part.key(f"anchor-{i}") for i, fp in enumerate(anchors.tolist())}


def initial(rng, n: int, part: Part) -> Oracle:
    """A writer's starting content: 1,000 keyed anchors and n fingerprints."""
    anchors = np.unique(part.make(rng.integers(0, 2**64, 1000, dtype=np.uint64)))
    live = np.unique(np.concatenate([anchors, part.make(
        rng.integers(0, 2**64, n, dtype=np.uint64))]))
    return Oracle(anchors, live, anchor_keys(anchors, part))


def load_initial(ix, o: Oracle) -> None:
    ix.add(o.anchors, keys=[o.keyed[fp] for fp in o.anchors.tolist()])
    ix.add(o.live[: len(o.live) // 2])
    ix.add(o.live[len(o.live) // 2:])


def check_anchors(ix, anchors: np.ndarray, keyed: dict, rng) -> str | None:
    """One round of the anchors' check (the watcher's and a reader process's):
    50 anchors with up to K bits flipped each find their anchor (query_many),
    and the first one's exact query gives its key; what differed, or None."""
    a = rng.choice(anchors, 50)
    m = ix.query_many(flip(rng, a, K), K)
    found = {(int(q), int(f)) for q, f in zip(m["query"], m["fingerprint"])}
    missing = [i for i in range(len(a)) if (i, int(a[i])) not in found]
    if missing:
        return (f"{len(missing)} of 50 anchors missing "
                f"(e.g. {[hex(int(a[i])) for i in missing[:2]]})")
    one = int(a[0])
    got = [mt.keys for mt in ix.query(one, 0) if mt.fingerprint == one]
    if got != [(keyed[one],)]:
        return f"anchor {one:#x}: query(k=0, keys=True) gave {got}"
    return None


def soak(path: str, opts: dict, args, o: Oracle, rng, part: Part) -> int:
    """Run args.cycles cycles on the index at path (open); 0 if every one
    agreed with the oracle, else 1 (the evidence kept under args.dir)."""
    from ndindex import Index
    ix = Index.open(path, **opts)
    anchors, live, gone, keyed = o.anchors, o.live, o.gone, o.keyed
    stop, failure = threading.Event(), []

    def watch():
        r = np.random.default_rng(args.seed + 1)
        while not stop.is_set():
            try:
                problem = check_anchors(current[0], anchors, keyed_anchor, r)
                if problem:
                    failure.append(problem)
                    return
            except Exception as exc:  # noqa: BLE001 - reported by the main thread
                if not stop.is_set() and not isinstance(exc, _closed_errors()):
                    failure.append(f"watcher: {type(exc).__name__}: {exc}")
                    return

    keyed_anchor = dict(keyed)  # the watcher's: never changed
    current = [ix]
    watcher = threading.Thread(target=watch, name="soak-anchors")
    watcher.start()
    who = "" if part.count == 1 else f"writer {part.index}: "
    checked, began, failed, cycle, what = 0, time.monotonic(), False, 0, "open"
    try:
        for cycle in range(1, args.cycles + 1):
            what = "remove"
            frac = float(rng.uniform(0.005, 0.05))
            out = np.unique(rng.choice(live, int(len(live) * frac)))
            out = out[~np.isin(out, anchors)]
            ghosts = part.make(rng.integers(0, 2**64, 50, dtype=np.uint64))
            ghosts = ghosts[~np.isin(ghosts, live)]
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
            new = np.unique(np.concatenate([back, part.make(rng.integers(
                0, 2**64, len(out) - len(back), dtype=np.uint64))]))
            for chunk in np.array_split(new, int(rng.integers(1, 8))):
                with_keys = rng.random(len(chunk)) < 0.1
                with_keys &= ~np.isin(chunk, back)
                keys = [part.key(f"k{fp:x}") if w else None
                        for fp, w in zip(chunk.tolist(), with_keys.tolist())]
                ix.add(chunk, keys=keys)
                keyed.update((fp, key) for fp, key in zip(chunk.tolist(), keys) if key)
            live = np.union1d(live, new)
            gone = np.setdiff1d(gone, new, assume_unique=True)
            what = "check_and_add"
            items = part.make(np.concatenate([flip(rng, rng.choice(live, 20), K + 1),
                                              rng.integers(0, 2**64, 80, dtype=np.uint64)]))
            added = []
            with ix.transaction():
                for fp in items.tolist():
                    want = brute(live, fp, K) | \
                        brute(np.array(added, dtype=np.uint64), fp, K)
                    found = [m.fingerprint for m in ix.check_and_add(fp)]
                    got = set(part.own(found).tolist())
                    check(got == want, f"check_and_add({fp:#x}): {sorted(got)[:3]} != "
                                       f"{sorted(want)[:3]}")
                    if not found:  # (another writer's fingerprint may be the match)
                        added.append(fp)
            # The same without a transaction: a commit each, the shape of log
            # (many one-item records) that compaction.FLUSH_RECORDS flushes.
            for fp in part.make(rng.integers(0, 2**64, 20, dtype=np.uint64)).tolist():
                want = brute(live, fp, K) | brute(np.array(added, dtype=np.uint64), fp, K)
                found = [m.fingerprint for m in ix.check_and_add(fp)]
                got = set(part.own(found).tolist())
                check(got == want, f"check_and_add({fp:#x}), no transaction: "
                                   f"{sorted(got)[:3]} != {sorted(want)[:3]}")
                if not found:
                    added.append(fp)
            added = np.array(added, dtype=np.uint64)
            live = np.union1d(live, added)
            gone = np.setdiff1d(gone, added)
            what = "verify"
            checked += verify(ix, live, gone, keyed, rng, part)
            roll = rng.random()
            if roll < 0.05:
                what = "reopen"
                ix.close()
                ix = Index.open(path, **opts)
                current[0] = ix
                checked += verify(ix, live, gone, keyed, rng, part)
            elif roll < 0.08:
                what = "compact"
                ix.compact(full=bool(rng.random() < 0.3))
                checked += verify(ix, live, gone, keyed, rng, part)
            if failure:
                raise Mismatch(failure[0])
            if cycle % 10 == 0 or cycle == args.cycles:
                print(f"{who}cycle {cycle:4d}: {len(live):,} stored, {checked:,} answers "
                      f"checked, {shape(ix)}, {time.monotonic() - began:.0f} s", flush=True)
    except Mismatch as exc:
        print(f"{who}MISMATCH at cycle {cycle} ({what}): {exc}\n  index: {shape(ix)}",
              flush=True)
        failed = True
        return 1
    finally:
        stop.set()
        watcher.join()
        ix.close()
        o.live, o.gone, o.keyed = live, gone, keyed
        if failed and args.dir:
            keep_evidence(path, args, live, part)
    return 0


def keep_evidence(path: str, args, live: np.ndarray, part: Part) -> None:
    """The index as the failing cycle left it (close() commits what was
    pending) and the oracle's live set, where they outlive the temporary
    directory."""
    keep = os.path.join(args.dir, f"soak-failed-seed{args.seed}-{os.getpid()}")
    shutil.copytree(os.path.dirname(path), keep)
    np.save(os.path.join(keep, f"oracle-live{'' if part.count == 1 else part.index}.npy"),
            live)
    print(f"  kept in {keep}", flush=True)


def index_opts(args) -> dict:
    """The options every process opens the index with."""
    return dict(durability=args.durability, log_limit=args.log_limit)


def worker_main(args) -> int:
    """One of --writers processes: its part's cycles on the shared index."""
    part = Part(args.worker, args.writers)
    d = os.path.dirname(args.path)
    anchors = np.load(os.path.join(d, f"anchors{part.index}.npy"))
    o = Oracle(anchors, np.load(os.path.join(d, f"live{part.index}.npy")),
               anchor_keys(anchors, part))
    # Spawned: default_rng([seed, 0]) would replay default_rng(seed), the parent's.
    rng = np.random.default_rng(np.random.SeedSequence(args.seed).spawn(part.count)[part.index])
    rc = soak(args.path, index_opts(args), args, o, rng, part)
    np.save(os.path.join(d, f"final-live{part.index}.npy"), o.live)
    with open(os.path.join(d, f"final-keyed{part.index}.json"), "w") as fh:
        json.dump({str(fp): key for fp, key in o.keyed.items()}, fh)
    return rc


def reader_main(args) -> int:
    """A read-only process beside the writers (--readers): until its stdin
    closes, queries every writer's anchors (never removed, each with its
    key) near and exactly, and reopens the index now and then; exit 1 at
    the first anchor missing or without its key."""
    from ndindex import Index
    d = os.path.dirname(args.path)
    keyed = {}
    for i in range(args.writers):
        keyed.update(anchor_keys(np.load(os.path.join(d, f"anchors{i}.npy")),
                                 Part(i, args.writers)))
    anchors = np.fromiter(keyed, dtype=np.uint64, count=len(keyed))
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    rng = np.random.default_rng([args.seed, 99, args.reader])
    checks, ix = 0, Index.open(args.path, readonly=True)
    try:
        while True:  # at least once
            problem = check_anchors(ix, anchors, keyed, rng)
            if problem:
                print(f"reader {args.reader}: MISMATCH after {checks:,} checks: {problem}",
                      flush=True)
                return 1
            checks += 1
            if done.is_set():
                break
            if rng.random() < 0.002:
                ix.close()
                ix = Index.open(args.path, readonly=True)
    finally:
        ix.close()
    print(f"reader {args.reader}: {checks:,} checks of 50 anchors agreed", flush=True)
    return 0


def writers_main(args, d: str, opts: dict) -> int:
    """--writers processes on one index, each churning its own part, and
    --readers read-only ones; at the end the index must hold exactly the
    union of the writers' oracles."""
    from ndindex import Index
    path = os.path.join(d, "soak.ndx")
    rng = np.random.default_rng(args.seed)
    oracles = [initial(rng, args.n // args.writers, Part(i, args.writers))
               for i in range(args.writers)]
    with Index.create(path, k=K, expected_n=args.n, **opts) as ix:
        for i, o in enumerate(oracles):
            load_initial(ix, o)
            np.save(os.path.join(d, f"anchors{i}.npy"), o.anchors)
            np.save(os.path.join(d, f"live{i}.npy"), o.live)
    common = [sys.executable, os.path.abspath(__file__), "--path", path,
              "--writers", str(args.writers), "--cycles", str(args.cycles),
              "--n", str(args.n // args.writers), "--seed", str(args.seed),
              "--durability", args.durability, "--log-limit", str(args.log_limit),
              "--k", str(args.k)] + \
        (["--dir", args.dir] if args.dir else [])
    readers = [subprocess.Popen(common + ["--reader", str(i)], stdin=subprocess.PIPE)
               for i in range(args.readers)]
    procs = [subprocess.Popen(common + ["--worker", str(i)]) for i in range(args.writers)]
    codes = [p.wait() for p in procs]
    for r in readers:
        r.stdin.close()  # the writers are done: the readers stop
    read_codes = [r.wait() for r in readers]
    if any(codes) or any(read_codes):
        print(f"writers exited {codes}, readers {read_codes}", flush=True)
        return 1
    live = np.unique(np.concatenate([np.load(os.path.join(d, f"final-live{i}.npy"))
                                     for i in range(args.writers)]))
    keyed = {}
    for i in range(args.writers):
        with open(os.path.join(d, f"final-keyed{i}.json")) as fh:
            keyed.update((int(fp), key) for fp, key in json.load(fh).items())
    with Index.open(path, **opts) as ix:
        stored = ix.fingerprints()
        ok = len(ix) == len(live) and np.array_equal(np.sort(stored), live)
        if ok:
            sample = np.random.default_rng(args.seed).choice(
                np.fromiter(keyed, dtype=np.uint64, count=len(keyed)), 500)
            ok = all(ix.keys(int(fp)) == (keyed[int(fp)],) for fp in sample.tolist())
        if not ok:
            print(f"MISMATCH at the end: the index holds {len(ix):,} fingerprints "
                  f"({len(np.setdiff1d(live, stored)):,} of the writers' missing, "
                  f"{len(np.setdiff1d(stored, live)):,} more), or keys differ", flush=True)
            if args.dir:
                keep_evidence(path, args, live, Part())
            return 1
    writers = f"{args.writers} writer{'s' if args.writers > 1 else ''}"
    readers = "" if not args.readers else \
        f" (beside {args.readers} reader process{'es' if args.readers > 1 else ''})"
    print(f"all {args.cycles} cycles of {writers} agreed with brute force{readers}, "
          f"and the index holds exactly their {len(live):,} fingerprints")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--durability", choices=["full", "normal"], default="full")
    ap.add_argument("--log-limit", type=int, default=20_000)
    ap.add_argument("--k", type=int, default=3,
                    help="the index's k (its plan of tables follows, with --n) and the "
                         "checks' distance")
    ap.add_argument("--writers", type=int, choices=[1, 2, 4], default=1,
                    help="writer processes, each churning its own part of the index")
    ap.add_argument("--readers", type=int, default=0,
                    help="read-only processes querying every writer's anchors all along")
    ap.add_argument("--dir", help="where the index goes (default: a temp dir)")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--reader", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global K
    K = args.k
    if args.worker is not None:
        return worker_main(args)
    if args.reader is not None:
        return reader_main(args)
    from ndindex import Index

    opts = index_opts(args)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        if args.writers > 1 or args.readers:
            return writers_main(args, d, opts)
        path = os.path.join(d, "soak.ndx")
        rng = np.random.default_rng(args.seed)
        o = initial(rng, args.n, Part())
        with Index.create(path, k=K, expected_n=args.n, **opts) as ix:
            load_initial(ix, o)
        if soak(path, opts, args, o, rng, Part()):
            return 1
    print(f"all {args.cycles} cycles agreed with brute force")
    return 0


def _closed_errors() -> tuple:
    from ndindex.errors import ClosedError
    return (ClosedError,)


if __name__ == "__main__":
    sys.exit(main())
