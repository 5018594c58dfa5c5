"""Interrupt-point sweep: Ctrl-C at each point of a call where Python runs signal handlers.

Run:  python tools/sweep_interrupt_points.py [--scenario NAME ...] [--points 300] [--seed 1]
                                             [--timeout 60] [--workdir DIR] [--expect-clean]

sweep_interrupt.py sends SIGINT at random moments; this sends it at chosen
points of one call, the way SQLite's fault simulator fails the n-th
allocation for n = 1, 2, 3, ...  CPython runs a Python signal handler only
at certain points of the main thread: as a Python function starts, as a C
call returns (its eval-breaker checks; also at a loop's backward jump,
which this does not aim at).  sys.setprofile reports exactly those as
"call" and "c_return" events.  For each scenario (one call on a small
index: open, create, add, remove, transactions (nested too), compact, vacuum, sync,
close, queries, documents, an upgrade: SCENARIOS) a second run counts the
call's events (the first pays what a process does once) and records the
content the call leaves; then each trial runs the call on a fresh copy of the
index and, at its n-th event, sends a real SIGINT to the process: Python's
handler raises KeyboardInterrupt right there, or, where ndindex holds
Ctrl-C back (errors.interrupts_deferred), at the end of that block.  Each
trial then checks:

- the call raised KeyboardInterrupt or returned: nothing else;
- the content (fingerprints with their keys, and documents) is the one
  before the call or the one after it, never a part: in the same Index and
  after a reopen, whose verify() passes;
- the same Index goes on: an add, a query of it, close();
- after close(): no ndindex thread running, no file named after the index
  but its lock file (no journal, no build copy; an empty build name no one
  holds is let be: the next writable open deletes it), and no more file
  descriptors open than before the trial (a leaked one holds an flock).

A bad trial is reported with the point: the ndindex frames it was in
(file:line function, innermost first) and the C call it followed.

Points: every event of a call that has at most --points, else --points of
them spread evenly from a seeded offset.  Trials run in a child process; a
trial still running after --timeout seconds has every thread's stack
printed (faulthandler) and counts as a hang, and a new child takes the
trials after it.  Found: a Ctrl-C while a writer opened left its journal
locked and its threads running; one as vacuum claimed its copy's name left
the name held (baad42f); one as a thread pool started its second worker
left both running unrecorded (c2b8eee); one as os.open returned left the
descriptor, and its lock, open (descriptors.py); one part way through
close() left the writer open behind a closed file (a9b8556, fb9457a,
81b7897).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, NamedTuple

MARKER = (1 << 63) + 12345          # the fingerprint each trial adds after the call
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()


# -- scenarios: (durability, documents, prepare, call) -------------------------------


def _fps(seed: int, n: int):
    import numpy as np
    return np.random.default_rng(seed).integers(0, 2**62, n, dtype=np.uint64)


def _texts(seed: int, n: int) -> list:
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(30)) for _ in range(n)]


def _transaction(ix):
    with ix.transaction():
        for fp in _fps(7, 30).tolist():
            ix.check_and_add(fp)
        ix.remove(_fps(1, 10))


def _savepoint(ix):
    # An inner block whose exception the outer block catches: its
    # operations are undone, the outer block's commit (before or after).
    with ix.transaction():
        ix.add(_fps(11, 20), keys=[f"s{i}" for i in range(20)])
        try:
            with ix.transaction():
                ix.add(_fps(12, 20))
                ix.remove(keys=[f"k{i}" for i in range(0, 60, 3)])
                raise LookupError("the inner block fails")
        except LookupError:
            pass
        ix.remove(_fps(1, 5))


def _vacuum_prepare(ix):
    ix.remove(_fps(1, 1500))
    ix.compact()


class Scenario(NamedTuple):
    call: Callable                  # call(ix, path) -> its result (ix None for an opening call)
    durability: str = "full"
    documents: bool = False
    prepare: Callable | None = None  # prepare(ix), before the call, not interrupted
    opens: bool = False             # the call opens (or makes) the index itself
    again: bool = False             # an interrupted call is made again, whole, before the checks
    options: dict = {}              # more keywords for Index.open
    base: str = "standard"          # "standard" (make_base) or "v1" (tests/data's format-1 file)
    makes: bool = False             # the call makes a new index at path + ".new": none, or whole


def _add(ix, path):
    return ix.add(_fps(5, 200), keys=[f"n{i}" for i in range(200)])


def _long_log(ix):
    from ndindex import compaction
    ix._compactor.close()
    ix.add(_fps(10, compaction.CLOSE_FLUSH_OPS + 100))


def _transaction_large(ix, path):
    # More additions than reader.PENDING_SCAN_MAX: its queries index them
    # under the writer's lock.
    with ix.transaction():
        for fp in _fps(7, 1100).tolist():
            ix.check_and_add(fp)


def _cli(*argv):
    """The ndindex command, in this process (its output dropped): a Ctrl-C
    it caught is its exit status 130, raised here as the interrupt."""
    import contextlib
    import io

    from ndindex.cli import main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = main([a.format(**_CLI_FILES) for a in argv])
    if status == 130:
        raise KeyboardInterrupt
    if status not in (0, 1):
        raise RuntimeError(f"ndindex {' '.join(argv)}: exit status {status}")
    return status


#: Files the command scenarios read, made once per child (make_cli_files).
_CLI_FILES: dict = {}


def make_cli_files(workdir: str, base: str) -> None:
    from ndindex.dump import export_index
    from ndindex.index import Index
    lines = os.path.join(workdir, "cli-lines.txt")
    with open(lines, "w") as fh:
        fh.writelines(f"{fp:#x} c{i}\n" for i, fp in enumerate(_fps(12, 300).tolist()))
    keys = os.path.join(workdir, "cli-keys.txt")
    with open(keys, "w") as fh:
        fh.writelines(f"k{i}\n" for i in range(0, 600, 5))
    dump = os.path.join(workdir, "cli-base.ndxdump")
    if not os.path.exists(dump):
        with Index.open(base, readonly=True) as ix, open(dump, "wb") as fh:
            export_index(ix, fh)
    _CLI_FILES.update(lines=lines, keys=keys, dump=dump)


def _upgrade(ix, path):
    from ndindex import upgrade
    return upgrade.upgrade(path, backup=False)


BACKGROUND = {"background_compaction": True, "log_limit": 300}

SCENARIOS = {
    "open": Scenario(lambda ix, path: _open(path, "full"), opens=True),
    "open-normal": Scenario(lambda ix, path: _open(path, "normal"), "normal", opens=True),
    "create": Scenario(lambda ix, path: _create(path), opens=True, makes=True),
    "add": Scenario(_add),
    "add-normal": Scenario(_add, "normal"),
    "add-background": Scenario(lambda ix, path: ix.add(_fps(6, 2000)), "normal",
                               options=BACKGROUND),
    "remove": Scenario(lambda ix, path: ix.remove(_fps(1, 50))),
    "remove-keys": Scenario(lambda ix, path: ix.remove(keys=[f"k{i}" for i in range(0, 600, 7)]),
                            "normal"),
    "transaction": Scenario(lambda ix, path: _transaction(ix)),
    "transaction-normal": Scenario(lambda ix, path: _transaction(ix), "normal"),
    "transaction-large": Scenario(_transaction_large, "normal"),
    "savepoint": Scenario(lambda ix, path: _savepoint(ix)),
    "savepoint-normal": Scenario(lambda ix, path: _savepoint(ix), "normal"),
    "check_and_add_many": Scenario(lambda ix, path: ix.check_and_add_many(_fps(8, 100)),
                                   "normal"),
    "compact": Scenario(lambda ix, path: ix.compact()),
    "compact-full": Scenario(lambda ix, path: ix.compact(full=True)),
    "compact-background": Scenario(lambda ix, path: ix.compact(), "normal",
                                   prepare=lambda ix: ix.add(_fps(6, 2000)), options=BACKGROUND),
    "vacuum": Scenario(lambda ix, path: ix.vacuum(), prepare=_vacuum_prepare),
    "vacuum_into": Scenario(lambda ix, path: ix.vacuum_into(path + ".copy"), "normal",
                            prepare=lambda ix: ix.add(_fps(9, 100))),
    "sync": Scenario(lambda ix, path: ix.sync(), "normal", prepare=lambda ix: ix.add(_fps(9, 100))),
    "close": Scenario(lambda ix, path: ix.close(), "normal",
                      prepare=lambda ix: ix.add(_fps(9, 100)), again=True),
    # close() flushing a long log into runs (background compaction on, its
    # thread stopped first so that the flush is close()'s own).
    "close-flush": Scenario(lambda ix, path: ix.close(), prepare=_long_log, again=True,
                            options={"background_compaction": True}),
    "query": Scenario(lambda ix, path: [ix.query(fp, k=3) for fp in _fps(1, 5).tolist()]),
    "query_many": Scenario(lambda ix, path: ix.query_many(_fps(1, 300), k=3)),
    "add_documents": Scenario(lambda ix, path: ix.add_documents(
        _texts(3, 20), [f"d{i}" for i in range(20)]), documents=True),
    "add_documents-normal": Scenario(lambda ix, path: ix.add_documents(
        _texts(4, 20), [f"d{i}" for i in range(0, 40, 2)]), "normal", documents=True),
    "similar": Scenario(lambda ix, path: ix.similar(_texts(2, 1)[0]), documents=True),
    "pairs": Scenario(lambda ix, path: list(ix.near_duplicate_pairs()), documents=True),
    "upgrade": Scenario(_upgrade, opens=True, again=True, base="v1"),
    # The ndindex command (in this process): it catches the Ctrl-C itself.
    "cli-add": Scenario(lambda ix, path: _cli("add", path, "{lines}"), opens=True),
    "cli-remove": Scenario(lambda ix, path: _cli("remove", path, "--keys-from", "{keys}"),
                           opens=True),
    "cli-compact": Scenario(lambda ix, path: _cli("compact", path, "--full"), opens=True),
    "cli-vacuum": Scenario(lambda ix, path: _cli("vacuum", path), opens=True,
                           prepare=_vacuum_prepare),
    "cli-import": Scenario(lambda ix, path: _cli("import", "{dump}", path + ".new"), opens=True,
                           makes=True),
}



def _open(path, durability):
    from ndindex.index import Index
    return Index.open(path, durability=durability, background_compaction=False)


def _create(path):
    from ndindex.index import Index
    return Index.create(path + ".new", k=3, expected_n=10_000, background_compaction=False)


def make_base(path: str, durability: str, documents: bool) -> None:
    """The index every trial starts from: 3,000 fingerprints (600 with keys)
    in runs, 500 more in the log; with documents, 40 of them."""
    from ndindex.index import Index
    fingerprinter = None
    if documents:
        from ndindex.fingerprint import Fingerprinter
        fingerprinter = Fingerprinter()
    fps = _fps(1, 3500)
    with Index.create(path, k=3, expected_n=10_000, log_limit=2000, fingerprinter=fingerprinter,
                      background_compaction=False, durability=durability) as ix:
        ix.add(fps[:3000])
        ix.add(fps[:600], keys=[f"k{i}" for i in range(600)])
        if documents:
            ix.add_documents(_texts(2, 40), [f"d{i}" for i in range(40)])
        ix.compact()
        ix.add(fps[3000:])


# -- the child: trials -------------------------------------------------------------


def content(ix) -> tuple:
    pairs = [(fp, tuple(sorted(map(repr, ks))))
             for fps, keys in ix.items() for fp, ks in zip(fps.tolist(), keys)]
    docs = sorted(ix.documents()) if ix.fingerprinter is not None else []
    return pairs, docs


def _without_marker(c: tuple) -> tuple:
    return [p for p in c[0] if p[0] != MARKER], c[1]


def _named_after(path: str) -> list:
    """The files named after the index: beside it, and its builds' hidden names."""
    folder, base = os.path.split(path)
    return glob.glob(glob.escape(path) + "*") + glob.glob(os.path.join(glob.escape(folder),
                                                                       "." + glob.escape(base) + "*"))


def _unheld_build_name(f: str) -> bool:
    """A build's hidden name no one holds: a build interrupted as it claimed
    it leaves it, and the next writable open deletes it (as a killed one's)."""
    import fcntl
    if not os.path.basename(f).startswith(".") or not os.path.isfile(f):
        return False
    fd = os.open(f, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return os.path.getsize(f) == 0
    except OSError:
        return False
    finally:
        os.close(fd)


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _ndindex_threads(before=frozenset(), wait: float = 3.0) -> list:
    """Names of the ndindex threads running that were not in before (after
    waiting up to wait seconds for them to end)."""
    import threading
    deadline = time.monotonic() + wait
    while True:
        alive = [t.name for t in threading.enumerate()
                 if t.name.startswith("ndindex-") and t not in before]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


class Trigger:
    """A profile function: counts "call" and "c_return" events; at the n-th
    (n > 0) it stops profiling and sends this process a real SIGINT."""

    def __init__(self, n: int):
        self.n, self.count = n, 0
        self.where = ""

    def __call__(self, frame, event, arg):
        if event == "call" or event == "c_return":
            self.count += 1
            if self.count == self.n:
                sys.setprofile(None)
                self.where = _where(frame, event, arg)
                os.kill(os.getpid(), signal.SIGINT)


def _where(frame, event, arg) -> str:
    """The point as a report names it: the ndindex frames from the innermost
    out (file:line function), and the C function for a c_return."""
    names = []
    while frame is not None and len(names) < 4:
        if "ndindex" in frame.f_code.co_filename and "sweep_" not in frame.f_code.co_filename:
            names.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} "
                         f"{frame.f_code.co_name}")
        frame = frame.f_back
    what = f"after {getattr(arg, '__qualname__', arg)}() in " if event == "c_return" else "in "
    return what + " < ".join(names)


def trial(name: str, base: str, path: str, n: int, expected: dict | None) -> dict:
    """Run scenario name on a copy of base, interrupted at event n (0: never).
    Returns {"events", "content_after"} for n = 0, else {"outcome", "detail"}."""
    import threading

    from ndindex.index import Index
    sc = SCENARIOS[name]
    for f in _named_after(path):
        os.remove(f)
    shutil.copyfile(base, path)
    fds, threads = _fd_count(), frozenset(threading.enumerate())
    options = {"background_compaction": False, "log_limit": 2000, **sc.options}
    ix = None
    if not sc.opens:
        ix = Index.open(path, durability=sc.durability, **options)
        if sc.prepare is not None:
            sc.prepare(ix)
    elif sc.prepare is not None:
        with Index.open(path, durability=sc.durability, **options) as prepared:
            sc.prepare(prepared)
    before = None
    if not sc.makes and sc.base != "v1":
        probe = ix if ix is not None else Index.open(path, readonly=True)
        before = content(probe)
        if probe is not ix:
            probe.close()
    trigger = Trigger(n)
    LAST_WHERE[0] = ""
    interrupted, result, raised = False, None, None
    sys.setprofile(trigger)
    try:
        result = sc.call(ix, path)
    except KeyboardInterrupt:
        interrupted = True
    except BaseException as exc:        # noqa: BLE001 - reported, not hidden
        raised = exc
    finally:
        sys.setprofile(None)
        LAST_WHERE[0] = trigger.where
    try:
        for _ in range(200):            # an interrupt held back to the end lands here
            pass
    except KeyboardInterrupt:
        interrupted = True
    if raised is not None:
        if n == 0:
            raise raised
        return bad("raised", f"{type(raised).__name__}: {raised}")
    target = path + ".new" if sc.makes else path
    if interrupted and sc.again:
        result = sc.call(ix, path)       # again, whole this time
    if isinstance(result, Index):
        ix = result
    elif sc.makes and interrupted and not os.path.exists(target):
        return _after_close(target, fds, threads, None, None, interrupted, fresh=True)
    if ix is None or ix._store._env is None:     # an opening call that did not, or close()
        ix = Index.open(target, durability=sc.durability, **options)
    if n == 0:
        after = content(ix)
        ix.close()
        for f in _named_after(path + ".copy"):
            os.remove(f)
        return {"events": trigger.count, "content_after": after}
    after = expected["content_after"]
    if before is None:                   # a new index, or an upgrade: whole or not made
        before = after
    got = content(ix)
    if got != before and got != after:
        ix.close()
        return bad("partial", f"content of {len(got[0])} entries is neither before "
                              f"({len(before[0])}) nor after ({len(after[0])})")
    try:
        ix.add([MARKER])
        if not ix.query(MARKER, k=0):
            return bad("unusable", "the marker added after the call is not found")
    except Exception as exc:             # noqa: BLE001
        return bad("unusable", f"{type(exc).__name__}: {exc}")
    finally:
        ix.close()
    copy = path + ".copy"                # vacuum_into's: whole or absent
    if os.path.exists(copy):
        with Index.open(copy, readonly=True) as c:
            c.verify()
            if content(c) not in (before, after):
                return bad("partial", "vacuum_into's copy holds neither before nor after")
        for f in _named_after(copy):
            os.remove(f)
    return _after_close(target, fds, threads, before, after, interrupted)


def _after_close(path, fds, threads_before, before, after, interrupted, fresh=False) -> dict:
    from ndindex.index import Index
    threads = _ndindex_threads(threads_before)
    if threads:
        return bad("thread", f"still running after close(): {threads}")
    left = sorted(os.path.basename(f) for f in _named_after(path)
                  if f not in (path, path + "-lock") and not _unheld_build_name(f))
    if left:
        return bad("leftover", f"files beside the index after close(): {left}")
    if _fd_count() != fds:
        return bad("fd", f"{_fd_count() - fds} file descriptors more than before the trial")
    if fresh:
        return {"outcome": "ok", "interrupted": interrupted}
    with Index.open(path, readonly=True) as again:
        again.verify()
        got = _without_marker(content(again))
        if not again.query(MARKER, k=0):
            return bad("lost", "the marker is not in the reopened index")
    if got != before and got != after:
        return bad("partial", "the reopened content is neither before nor after the call")
    return {"outcome": "ok", "interrupted": interrupted}


def bad(outcome: str, detail: str) -> dict:
    return {"outcome": outcome, "detail": detail}


def child_main(name: str, workdir: str, points: list) -> None:
    """Count (points empty), or run the trials of points; one JSON line each."""
    import faulthandler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sc = SCENARIOS[name]
    base = os.path.join(workdir, f"{name}.base.ndx")
    if sc.base == "v1":
        base = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                            "format-v1.ndx")
    elif not os.path.exists(base):
        make_base(base, sc.durability, sc.documents)
    if name.startswith("cli-"):
        make_cli_files(workdir, base)
    path = os.path.join(workdir, f"{name}.ndx")
    # Twice: the first run pays what a process does once (imports, pools),
    # which the trials do not see.
    trial(name, base, path, 0, None)
    reference = trial(name, base, path, 0, None)
    if not points:
        print(json.dumps({"events": reference["events"]}), flush=True)
        return
    for n in points:
        print(json.dumps({"start": n}), flush=True)
        faulthandler.dump_traceback_later(TIMEOUT[0], exit=True)
        try:
            out = trial(name, base, path, n, reference)
        except BaseException as exc:     # noqa: BLE001 - a failed check's own error
            out = bad("error", f"{type(exc).__name__}: {exc}")
        faulthandler.cancel_dump_traceback_later()
        # A Ctrl-C as contextlib's redirect_stdout() ended (a command
        # scenario) left sys.stdout on its StringIO, and every later line of
        # this child went there: the parent read a child that ended mid-trial.
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        out["n"] = n
        out["where"] = LAST_WHERE[0]
        print(json.dumps(out), flush=True)


TIMEOUT = [60.0]
LAST_WHERE = [""]    # the last trial's point, for its report


# -- the parent ---------------------------------------------------------------------


def _child(name, workdir, points, timeout):
    args = [sys.executable, os.path.abspath(__file__), "--child", name, "--workdir", workdir,
            "--timeout", str(timeout)]
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True), json.dumps(points)


def run_scenario(name: str, workdir: str, max_points: int, seed: int, timeout: float,
                 report=print) -> dict:
    proc, data = _child(name, workdir, [], timeout)
    out, err = proc.communicate(data)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: the counting run failed:\n{err[-3000:]}")
    events = json.loads(out.splitlines()[-1])["events"]
    if events <= max_points:
        points = list(range(1, events + 1))
    else:
        step = events / max_points
        offset = random.Random(f"{seed}:{name}").random() * step
        points = sorted({1 + int(offset + i * step) for i in range(max_points)})
    counts: dict = {}
    bads: list = []
    interrupted = 0
    todo = list(points)
    while todo:
        proc, data = _child(name, workdir, todo, timeout)
        proc.stdin.write(data)
        proc.stdin.close()
        started = None
        for line in proc.stdout:
            msg = json.loads(line)
            if "start" in msg:
                started = msg["start"]
                continue
            todo.remove(msg["n"])
            started = None
            counts[msg["outcome"]] = counts.get(msg["outcome"], 0) + 1
            interrupted += bool(msg.get("interrupted"))
            if msg["outcome"] != "ok":
                bads.append(msg)
                report(f"  {name} point {msg['n']} ({msg['where']}): {msg['outcome']}: "
                       f"{msg['detail']}")
        err = proc.stderr.read()
        proc.wait()
        if started is not None:          # the child died or hung in this trial
            todo.remove(started)
            kind = "hang" if "Timeout" in err or "most recent call first" in err else "crash"
            counts[kind] = counts.get(kind, 0) + 1
            bads.append({"n": started, "outcome": kind, "detail": err[-4000:]})
            report(f"  {name} point {started}: {kind} (exit {proc.returncode}):\n{err[-4000:]}")
        elif proc.returncode != 0:
            raise RuntimeError(f"{name}: the child failed:\n{err[-3000:]}")
    return {"scenario": name, "events": events, "points": len(points), "interrupted": interrupted,
            "outcomes": counts, "bad": bads}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                    help="one scenario (repeat for more; default: all)")
    ap.add_argument("--points", type=int, default=300, help="points per scenario at most")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a trial is a hang")
    ap.add_argument("--workdir", help="where the files go (default: a temporary directory)")
    ap.add_argument("--expect-clean", action="store_true", help="exit 1 unless every trial is ok")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    TIMEOUT[0] = args.timeout
    if args.child:
        child_main(args.child, args.workdir, json.loads(sys.stdin.read() or "[]"))
        return 0
    workdir = args.workdir or tempfile.mkdtemp(prefix="ndindex-points-")
    os.makedirs(workdir, exist_ok=True)
    total_bad = 0
    started = time.monotonic()
    try:
        for name in args.scenario or list(SCENARIOS):
            t0 = time.monotonic()
            res = run_scenario(name, workdir, args.points, args.seed, args.timeout)
            total_bad += len(res["bad"])
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(res["outcomes"].items()))
            print(f"{name:22s} {res['events']:7,d} events, {res['points']:4d} points "
                  f"({res['interrupted']} interrupted): {outcomes}  [{time.monotonic() - t0:.0f} s]",
                  flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'clean' if not total_bad else f'{total_bad} bad trials'} "
          f"in {time.monotonic() - started:.0f} s")
    return 1 if args.expect_clean and total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
