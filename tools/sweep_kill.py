"""Kill sweep: SIGKILL a writer at random moments; nothing acknowledged may be lost.

Run:  python tools/sweep_kill.py [--cycles 1000] [--jobs 2] [--seed 1]

Each job is a lane with its own index file.  A cycle forks a writer that
creates the index if there is no file (Index.create), or opens it, then
runs operations numbered from where the last cycle stopped: add (new
fingerprints, half with document keys), remove by fingerprint, remove by
key, compact, full compact, and a transaction of check_and_add calls
(new fingerprints and near-duplicates of earlier ones, one commit); with --option documents=True the index has a
fingerprinter and documents go in too (add_documents of short texts under
keys drawn from a small pool, so later ones replace earlier ones), and
removals by key take documents as well.  Operation j is a pure function of (seed, lane,
j), so the parent recomputes it instead of reading it back.  The writer
tells the parent through a pipe when it starts an operation and, after the
call returns, that the operation is acknowledged.  The parent picks an
operation and a delay (a random fraction of a time that kind of operation
took earlier in the lane) and sends SIGKILL that long after the operation
starts, so kills land inside create, add, remove and compact alike; then
it checks the file in another forked child:

- a kill inside create: there is no file, or an index that opens, verifies
  and holds nothing;
- any other kill: the file opens, verify() passes, and the index holds
  exactly the acknowledged operations' result, or that plus the operation
  in flight (committed but not yet acknowledged);
- a file that cannot be opened is "unopenable" (and the checker says
  whether create() can then make it again), one whose verify() fails is
  "verify-failed", a state matching neither is "lost" (with the
  acknowledged fingerprints and keys missing counted).

Files live on disk (the temp dir, or --workdir), not in RAM: fsync gives
each write its real length, so the kills find the windows inside them.

With --option background_compaction=True (and a small --option
log_limit=N) the writer's compaction thread flushes and merges all the
time; it announces each step, and a third of the kills aim at a random
moment inside one (counted as "background compaction").  With --option
durability='normal' an operation counts as acknowledged only after sync()
returns.  With documents, the check also compares documents() (key,
fingerprint, data) with the model.  A file named after the index still
beside it once the check's writer has opened and closed it (a killed
vacuum's copy, say) makes the cycle "leftover".

After each check the parent takes the state found as the new model; every
--fresh-every cycles (and after a file that fails) the lane starts over
without a file, so create is exercised throughout.  It prints the counts by
outcome and by the kind of operation the kill interrupted.  --expect-clean
exits 1 unless every cycle is ok.  --option NAME=VALUE passes keywords to
Index.create and ndindex.open when the library accepts them.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_common import (Child, IndexModel, accepted, api_options, parse_options,  # noqa: E402
                          remove_index_files, run_child, state_of)
from sweep_corruption import _doc_texts  # noqa: E402

K = 3
EXPECTED_N = 100_000
OPS = ("add", "add", "add", "add", "remove_fp", "remove_key", "compact", "add", "remove_fp",
       "compact_full", "check_and_add")
#: With documents: a third of the operations add documents.
OPS_DOCUMENTS = OPS + ("add_documents",) * 5
#: Document keys come from this many names, so that adds replace documents.
DOC_KEYS = 120
#: The duration assumed for an operation never timed yet (seconds).
FIRST_GUESS_SECONDS = 0.05
#: Whether this lane's index holds documents (options["documents"]; set by
#: run_lane, inherited by the forked writer and checker).
DOCUMENTS = False


def _ops() -> tuple:
    return OPS_DOCUMENTS if DOCUMENTS else OPS


class LaneModel(IndexModel):
    """IndexModel and the documents: key -> (fingerprint, data), as documents() yields them."""

    def __init__(self):
        super().__init__()
        self.docs: dict = {}

    def copy(self) -> "LaneModel":
        other = LaneModel()
        other.keys = {fp: set(ks) for fp, ks in self.keys.items()}
        other.docs = dict(self.docs)
        return other

    def add_documents(self, fps, keys: list, data: list) -> None:
        """A key names one document: its earlier document goes (as remove(keys=))."""
        self.remove(keys=[k for k in keys if k in self.docs])
        self.add(fps, keys)
        for key, fp, d in zip(keys, fps.tolist(), data):
            self.docs[key] = (fp, d)

    def remove(self, fingerprints=None, keys=None) -> None:
        super().remove(fingerprints=fingerprints, keys=keys)
        for key in keys or ():
            self.docs.pop(key, None)

    def documents(self) -> list:
        return sorted((key, fp, d) for key, (fp, d) in self.docs.items())

    @classmethod
    def of(cls, state: dict, documents: list | None) -> "LaneModel":
        """The model of a state read back (read_back's state and documents)."""
        model = cls()
        model.keys = {fp: set(ks) for fp, ks in state.items()}
        model.docs = {key: (fp, d) for key, fp, d in documents or ()}
        return model


@functools.lru_cache(maxsize=4096)
def _document_fingerprints(texts: tuple) -> np.ndarray:
    """The simhashes add_documents gives these texts (the default Fingerprinter's)."""
    from ndindex.docstore import key_design_for
    from ndindex.documents import fingerprint_documents
    from ndindex.fingerprint import Fingerprinter
    fpr = Fingerprinter()
    return fingerprint_documents(list(texts), fpr, key_design_for(fpr), workers=1,
                                 simhash=True).simhashes


def operation(seed: int, lane: int, j: int) -> tuple[str, dict]:
    """Operation j of a lane: its kind and arguments, a pure function of (seed, lane, j)."""
    rng = np.random.default_rng([seed, lane, j])
    ops = _ops()
    kind = ops[int(rng.integers(len(ops)))]
    if kind == "add":
        fps = np.unique(rng.integers(0, 2**64, int(rng.integers(1, 400)), dtype=np.uint64))
        keys = [f"{j}/{i}" for i in range(len(fps))] if j % 2 == 0 else None
        return kind, dict(fps=fps, keys=keys)
    if kind == "check_and_add":
        # New fingerprints, half of them near-duplicates (1 bit off) of an
        # earlier add's: those find a match and are not added.
        fps = rng.integers(0, 2**64, int(rng.integers(1, 200)), dtype=np.uint64)
        earlier = [i for i in range(max(0, j - 40), j) if operation_kind(seed, lane, i) == "add"]
        if earlier:
            _, args = operation(seed, lane, earlier[int(rng.integers(len(earlier)))])
            near = args["fps"][:len(fps) // 2]
            fps[:len(near)] = near ^ (np.uint64(1) << rng.integers(0, 64, len(near)).astype(np.uint64))
        return kind, dict(fps=fps)
    if kind == "add_documents":
        n = int(rng.integers(1, 30))
        texts = tuple(_doc_texts(rng, n, []))
        keys = [f"doc{int(i)}" for i in rng.choice(DOC_KEYS, n, replace=False)]
        return kind, dict(texts=texts, keys=keys, data=[f"{j}/{i}".encode() for i in range(n)],
                          fps=_document_fingerprints(texts))
    if kind in ("remove_fp", "remove_key"):
        # Fingerprints or keys of a recent add: recomputed, not remembered.
        earlier = [i for i in range(max(0, j - 40), j)
                   if operation_kind(seed, lane, i) in ("add", "add_documents")]
        if not earlier:
            return "compact", {}
        src = earlier[int(rng.integers(len(earlier)))]
        src_kind, args = operation(seed, lane, src)
        pick = rng.random(len(args["fps"])) < 0.3
        if src_kind == "add_documents":  # documents go by key
            return "remove_key", dict(keys=[k for k, p in zip(args["keys"], pick) if p])
        if kind == "remove_fp" or args["keys"] is None:
            return "remove_fp", dict(fps=args["fps"][pick])
        return kind, dict(keys=[k for k, p in zip(args["keys"], pick) if p])
    return kind, {}


def operation_kind(seed: int, lane: int, j: int) -> str:
    rng = np.random.default_rng([seed, lane, j])
    ops = _ops()
    return ops[int(rng.integers(len(ops)))]


def apply_model(model: LaneModel, kind: str, args: dict) -> None:
    if kind == "add":
        model.add(args["fps"], args["keys"])
    elif kind == "add_documents":
        model.add_documents(args["fps"], args["keys"], args["data"])
    elif kind == "check_and_add":
        for fp in args["fps"].tolist():
            if not model.query(fp, K):
                model.add([fp])
    elif kind == "remove_fp":
        model.remove(fingerprints=args["fps"])
    elif kind == "remove_key":
        model.remove(keys=args["keys"])


# -- the writer and the checker (forked children) ----------------------------------------


def writer(path: str, seed: int, lane: int, first: int, options: dict, send) -> None:
    """Create or open the index, then run operations first, first + 1, ... until killed.

    With durability "normal" an operation is acknowledged only after sync()
    returns (before, it may be in the journal only).  Each step of the
    background compaction thread is announced ("bg", "start"/"end").
    """
    import ndindex

    _announce_background_steps(send)
    normal = options.get("durability") == "normal"
    if os.path.exists(path):
        ix = ndindex.open(path, **api_options(ndindex.Index.open, options))
    else:
        send("start", "create")
        if DOCUMENTS:
            from ndindex.fingerprint import Fingerprinter
            options = dict(options, fingerprinter=Fingerprinter())
        ix = ndindex.Index.create(path, k=K, expected_n=EXPECTED_N,
                                  **api_options(ndindex.Index.create, options))
        send("ack", "create")
    for j in range(first, first + 100_000):
        kind, args = operation(seed, lane, j)
        send("start", j)
        run_operation(ix, kind, args)
        if normal:
            ix.sync()
        send("ack", j)


def run_operation(ix, kind: str, args: dict) -> None:
    """Operation (kind, args) on an open index, as the writer runs it."""
    if kind == "add":
        ix.add(args["fps"], keys=args["keys"])
    elif kind == "add_documents":
        ix.add_documents(list(args["texts"]), args["keys"], data=args["data"], workers=1)
    elif kind == "check_and_add":
        with ix.transaction():
            for fp in args["fps"].tolist():
                ix.check_and_add(fp)
    elif kind == "remove_fp":
        ix.remove(fingerprints=args["fps"])
    elif kind == "remove_key":
        ix.remove(keys=args["keys"])
    else:
        ix.compact(**accepted(ix.compact, full=kind == "compact_full"))


def _announce_background_steps(send) -> None:
    """Make the compaction thread send ("bg", "start") and ("bg", "end") around each step."""
    import threading

    try:
        from ndindex import compaction
    except ImportError:  # a library without background compaction
        return
    for name in ("_flush", "_merge_round", "_rewrite_tombstones", "_tombstone_round"):
        original = getattr(compaction.Compactor, name, None)
        if original is None:
            continue

        def step(self, *args, _original=original, **kwargs):
            background = threading.current_thread().name == "ndindex-compaction"
            if background:
                send("bg", "start")
            try:
                return _original(self, *args, **kwargs)
            finally:
                if background:
                    send("bg", "end")
        setattr(compaction.Compactor, name, step)


def read_back(path: str, options: dict, universe: set, send) -> dict:
    """Open the index after a kill, verify it, and return what it holds of universe."""
    import ndindex

    if not os.path.exists(path):
        return dict(exists=False)
    try:
        ix = ndindex.open(path, **api_options(ndindex.Index.open, options))
    except Exception as exc:
        why = f"{type(exc).__qualname__}: {exc}"[:300]
        try:  # can the file at least be made again?
            ndindex.Index.create(path, k=K, expected_n=EXPECTED_N,
                                 **api_options(ndindex.Index.create, options)).close()
            again = "create then succeeds"
        except Exception as exc2:
            again = f"create then raises {type(exc2).__qualname__}"
        return dict(exists=True, open_error=f"{why}; {again}")
    try:
        try:
            ix.verify()
        except Exception as exc:
            return dict(exists=True, verify_error=f"{type(exc).__qualname__}: {exc}"[:300])
        found = dict(exists=True, state=state_of(ix, universe),
                     documents=sorted(ix.documents()) if DOCUMENTS else None)
    finally:
        ix.close()
    return dict(found, leftovers=leftovers_of(path))


def leftovers_of(path: str) -> list:
    """Files beside the index named after it, other than it and its lock file: what a
    killed operation left that the open did not clear (a vacuum's copy, say)."""
    directory, name = os.path.split(os.path.abspath(path))
    return sorted(f for f in os.listdir(directory)
                  if name in f and f not in (name, name + "-lock"))


# -- one lane -------------------------------------------------------------------------------


def run_lane(lane: int, cycles: int, seed: int, options: dict, workdir: str, fresh_every: int,
             timeout: float, keep_dir: str | None = None) -> list[dict]:
    """Run a lane's cycles; return one record per cycle (keep_dir: see sweep)."""
    import ndindex  # noqa: F401  (imported once, before the forks)

    global DOCUMENTS
    DOCUMENTS = bool(options.get("documents"))
    path = os.path.join(workdir, f"lane-{lane}.ndx")
    remove_index_files(path)
    background = bool(options.get("background_compaction"))
    rng = np.random.default_rng([seed, lane, 1 << 40])
    taken = collections.defaultdict(lambda: [FIRST_GUESS_SECONDS])  # durations seen, by kind
    # universe: every fingerprint an add of this file may have written; the
    # check reads back exactly these (the public API has no enumeration).
    model, next_op, records, universe = LaneModel(), 0, [], set()
    for cycle in range(cycles):
        if cycle % fresh_every == 0 and cycle:
            remove_index_files(path)
            model, universe = LaneModel(), set()
        fresh = not os.path.exists(path)
        # The kill: `delay` after operation `target` starts (counted from this
        # cycle's first), a random fraction of a duration that kind of
        # operation took before, so it lands inside short operations too.
        # With background compaction, a third of the kills aim at its steps.
        target = "create" if fresh and rng.random() < 0.8 else next_op + int(rng.integers(0, 4))
        if background and not fresh and rng.random() < 1 / 3:
            target = "background"
        kind_of_target = target if target in ("create", "background") \
            else operation_kind(seed, lane, target)
        seen = taken[kind_of_target]
        delay = float(rng.random()) * 1.1 * seen[int(rng.integers(len(seen)))]
        child = Child(lambda send: writer(path, seed, lane, next_op, options, send))
        started, in_flight, acked, kill_at, escaped = {}, None, [], None, None
        bg_started, bg_running = None, False
        for kind, obj in child.messages(time.monotonic() + timeout):
            now = time.monotonic()
            if kind == "bg":
                bg_running = obj == "start"
                if bg_running:
                    bg_started = now
                    if target == "background" and kill_at is None:
                        kill_at = now + delay
                elif bg_started is not None:
                    taken["background"] = (taken["background"] + [now - bg_started])[-50:]
            elif kind == "start":
                started[obj], in_flight = now, obj
                universe.update(_added(seed, lane, obj))
                if obj == target:
                    kill_at = now + delay
            elif kind == "ack":
                op_kind = "create" if obj == "create" else operation_kind(seed, lane, obj)
                taken[op_kind] = (taken[op_kind] + [now - started[obj]])[-50:]
                acked.append(obj)
                in_flight = None
            elif kind == "escaped":
                escaped = obj
            if kill_at is not None:
                time.sleep(max(0.0, kill_at - time.monotonic()))
                break
        child.kill()
        # What the writer said before the kill landed still counts.
        for kind, obj in child.messages(time.monotonic() + 5):
            if kind == "bg":
                bg_running = obj == "start"
            elif kind == "start":
                in_flight = obj
                universe.update(_added(seed, lane, obj))
            elif kind == "ack":
                acked.append(obj)
                in_flight = None
            elif kind == "escaped":
                escaped = obj
        child.wait()
        if keep_dir and os.path.exists(path):  # as the kill left it, before the check opens it
            shutil.copyfile(path, path + ".killed")
        rec = check_cycle(path, seed, lane, cycle, model, acked, in_flight, options, escaped,
                          existed=not fresh, universe=universe)
        if bg_running:
            rec["background_step"] = True
            if target == "background" or in_flight is None:
                rec["killed_in"] = "background compaction"
        if keep_dir and rec["outcome"] != "ok" and os.path.exists(path + ".killed"):
            rec["kept"] = os.path.join(keep_dir, f"lane-{lane}-cycle-{cycle}.ndx")
            shutil.move(path + ".killed", rec["kept"])
        records.append(rec)
        next_op = max([next_op - 1] + [a for a in acked if a != "create"]
                      + ([in_flight] if isinstance(in_flight, int) else [])) + 1
        state, documents = rec.pop("state", None), rec.pop("documents", None)
        if rec["outcome"] in ("unopenable", "verify-failed", "checker-crash"):
            remove_index_files(path)  # start the lane over
            model, universe = LaneModel(), set()
        elif state is not None:
            model = LaneModel.of(state, documents)
    remove_index_files(path)
    return records


def _added(seed: int, lane: int, j) -> list[int]:
    """The fingerprints operation j adds (none unless it is an add)."""
    if j == "create":
        return []
    kind, args = operation(seed, lane, j)
    return args["fps"].tolist() if kind in ("add", "add_documents", "check_and_add") else []


def check_cycle(path, seed, lane, cycle, model, acked, in_flight, options, escaped,
                existed: bool, universe: set) -> dict:
    """Compare the file after a kill with the acknowledged state (and the one in flight)."""
    done = model.copy()
    for j in acked:
        if j != "create":
            apply_model(done, *operation(seed, lane, j))
    maybe = done.copy()
    if isinstance(in_flight, int):
        apply_model(maybe, *operation(seed, lane, in_flight))
    killed_in = "none" if in_flight is None else (
        "create" if in_flight == "create" else operation_kind(seed, lane, in_flight))
    rec = dict(lane=lane, cycle=cycle, killed_in=killed_in, acked=len(acked),
               escaped=escaped[-300:] if escaped else None)
    rec.update(_compare(path, options, done, maybe, universe,
                        must_exist=existed or "create" in acked))
    if escaped and rec["outcome"] == "ok":  # the writer failed on its own, before any kill
        rec.update(outcome="writer-error", detail=escaped[-300:])
    return rec


def _compare(path, options, done: LaneModel, maybe: LaneModel, universe: set,
             must_exist: bool) -> dict:
    """Read the file back in a forked child and compare it with the two allowed states."""
    rec = {}
    got = run_child(lambda send: read_back(path, options, universe, send), 120)
    res = got["result"]
    if res is None:
        rec.update(outcome="checker-crash", detail=got["escaped"] or f"signal {got['signal']}")
        return rec
    if not res["exists"]:
        if must_exist:
            rec.update(outcome="lost", lost_fingerprints=len(done.keys),
                       lost_keys=sum(map(len, done.keys.values())), detail="the file is gone")
        else:
            rec.update(outcome="ok", detail="no file")
        return rec
    if "open_error" in res:
        rec.update(outcome="unopenable", detail=res["open_error"])
        return rec
    if "verify_error" in res:
        rec.update(outcome="verify-failed", detail=res["verify_error"])
        return rec
    state, documents = res["state"], res.get("documents")
    got = (state, documents if DOCUMENTS else None)
    allowed = [(m.state(), m.documents() if DOCUMENTS else None) for m in (done, maybe)]
    if got in allowed:
        rec.update(outcome="ok", state=state, documents=documents,
                   detail="in-flight committed" if got != allowed[0] else "")
        if res.get("leftovers"):  # the content is right, but disk space leaks
            rec.update(outcome="leftover", detail="left beside the index after a writer's "
                       "open: " + ", ".join(res["leftovers"]))
        return rec
    want = done.state()
    if state in (done.state(), maybe.state()):  # the tables agree, the documents do not
        rec.update(outcome="lost", state=state, documents=documents, lost_fingerprints=0,
                   lost_keys=0, detail=f"documents() differs: {len(documents)} documents, "
                   f"{len(done.docs)} acknowledged")
        return rec
    missing_fps = [fp for fp in want if fp not in state]
    missing_keys = sum(len(set(want[fp]) - set(state.get(fp, ()))) for fp in want)
    rec.update(outcome="lost", state=state, lost_fingerprints=len(missing_fps),
               lost_keys=missing_keys, detail=f"{len(missing_fps)} fingerprints and {missing_keys} "
               f"keys acknowledged but missing; {len([fp for fp in state if fp not in want])} extra")
    return rec


# -- the run ---------------------------------------------------------------------------------


def _lane_entry(args) -> list[dict]:
    try:
        return run_lane(*args)
    except Exception:
        return [dict(lane=args[0], outcome="tool-error", detail=traceback.format_exc()[-800:],
                     killed_in="none")]


def sweep(cycles: int, jobs: int, seed: int, options: dict, workdir: str | None,
          fresh_every: int, timeout: float, keep_dir: str | None = None) -> dict:
    """Run the lanes; keep_dir: where each file a cycle found not ok is kept, as the
    kill left it (before the check opened it)."""
    # On disk, not in RAM: fsync gives writes their real length, so kills land inside them.
    tmp = tempfile.mkdtemp(prefix="ndx-kill-", dir=workdir)
    t0 = time.monotonic()
    try:
        lanes = max(1, jobs)
        per_lane = [cycles // lanes + (1 if i < cycles % lanes else 0) for i in range(lanes)]
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(lanes) as pool:
            parts = pool.map(_lane_entry, [(i, n, seed, options, tmp, fresh_every, timeout,
                                            keep_dir) for i, n in enumerate(per_lane)])
        records = [r for part in parts for r in part]
        return dict(records=records, seconds=time.monotonic() - t0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def summarize(run: dict) -> dict:
    recs = run["records"]
    by_outcome = collections.Counter(r["outcome"] for r in recs)
    by_op = collections.defaultdict(collections.Counter)
    for r in recs:
        by_op[r["killed_in"]][r["outcome"]] += 1
    committed = sum(1 for r in recs if r.get("detail") == "in-flight committed")
    during_background = sum(1 for r in recs if r.get("background_step"))
    bad = [r for r in recs if r["outcome"] != "ok"]
    return dict(cycles=len(recs), by_outcome=dict(by_outcome),
                by_killed_in={k: dict(v) for k, v in sorted(by_op.items())},
                in_flight_committed=committed, during_background_step=during_background,
                lost_fingerprints=sum(r.get("lost_fingerprints", 0) for r in recs),
                lost_keys=sum(r.get("lost_keys", 0) for r in recs),
                examples=bad[:8], seconds=round(run["seconds"], 1))


def print_report(s: dict, out=sys.stdout) -> None:
    print(f"{s['cycles']} kill cycles in {s['seconds']} s", file=out)
    print("by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(s["by_outcome"].items())), file=out)
    print(f"acknowledged items lost: {s['lost_fingerprints']} fingerprints, {s['lost_keys']} keys; "
          f"operations in flight found committed: {s['in_flight_committed']}; kills landing "
          f"inside a background compaction step: {s.get('during_background_step', 0)}",
          file=out)
    print("\nkilled inside   " + "outcomes", file=out)
    for op, counts in s["by_killed_in"].items():
        print(f"  {op:<23}" + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=out)
    if s["examples"]:
        print("\nfirst cycles that were not ok:", file=out)
        for r in s["examples"]:
            print(f"  lane {r['lane']} cycle {r.get('cycle')}: {r['outcome']} (killed in "
                  f"{r['killed_in']}): {str(r.get('detail'))[-200:]}"
                  + (f"; file kept: {r['kept']}" if r.get("kept") else ""), file=out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fresh-every", type=int, default=10,
                    help="start a lane over without a file every N cycles")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds a writer may run before it is killed regardless")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--workdir", help="where the lanes' files go (default: the temp dir)")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--keep-failures", metavar="DIR",
                    help="copy each file a cycle found not ok here, as the kill left it")
    ap.add_argument("--expect-clean", action="store_true", help="exit 1 unless every cycle is ok")
    args = ap.parse_args(argv)
    if args.keep_failures:
        os.makedirs(args.keep_failures, exist_ok=True)
    run = sweep(args.cycles, args.jobs, args.seed, parse_options(args.option), args.workdir,
                args.fresh_every, args.timeout, args.keep_failures)
    summary = summarize(run)
    print_report(summary)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1, default=str)
    return 1 if args.expect_clean and summary["by_outcome"].get("ok", 0) != summary["cycles"] else 0


if __name__ == "__main__":
    sys.exit(main())
