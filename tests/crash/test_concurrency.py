"""Readers in threads and in another process see only committed states while one writer works.

The writer runs a fixed sequence of operations: add batch b, now and then
remove an earlier batch whole, compact every few batches (and add()
compacts by itself, the log limit being small).  Each batch is a seed
fingerprint and near-duplicates of it, all within distance 2, so one
query for the seed at k=2 finds the whole batch if it is visible.

A reader asks for every seed in one query_many() call, which answers from
one snapshot, and checks that each batch is all there or all absent and
that the set of visible batches is the state after some prefix of the
operations, never earlier than the prefix it saw last.  Any exception in
any thread or process fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from ndindex import pages
from ndindex.errors import BusyError, ClosedError
from ndindex.index import Index
from ndindex.records import U64_BE

N_BATCHES = 120
N_READER_THREADS = 2


def seeds() -> np.ndarray:
    return np.random.default_rng(17).integers(0, 2**64, N_BATCHES, dtype=np.uint64)


def batch(b: int) -> np.ndarray:
    """The seed of batch b and near-duplicates of it (1 and 2 bits away)."""
    rng = np.random.default_rng([17, b])
    seed = seeds()[b]
    bits = rng.choice(64, size=12, replace=False).astype(np.uint64)
    one = seed ^ (np.uint64(1) << bits)
    two = seed ^ (np.uint64(1) << bits[:6]) ^ (np.uint64(1) << bits[6:])
    return np.unique(np.concatenate([[seed], one, two]))


def operations() -> list[tuple[str, int]]:
    ops = []
    for b in range(N_BATCHES):
        ops.append(("add", b))
        if b % 5 == 4:
            ops.append(("remove", b - 3))
        if b % 9 == 8:
            ops.append(("compact", b % 27 == 26))
    return ops


def states() -> list[frozenset]:
    """The visible batches after 0, 1, 2, ... operations."""
    out, now = [frozenset()], set()
    for op, arg in operations():
        if op == "add":
            now.add(arg)
        elif op == "remove":
            now.discard(arg)
        out.append(frozenset(now))
    return out


def run_writer(ix: Index, pause: float = 0.002, before_op=None) -> None:
    for op, arg in operations():
        if before_op is not None:
            before_op()
        if op == "add":
            ix.add(batch(arg), keys=[f"{arg}/{i}" for i in range(len(batch(arg)))])
        elif op == "remove":
            ix.remove(batch(arg))
        else:
            ix.compact(full=arg)
        time.sleep(pause)


class Checker:
    """Checks successive query_many() answers against the writer's states."""

    def __init__(self):
        self.states = states()
        self.sizes = [len(batch(b)) for b in range(N_BATCHES)]
        self.owner = {int(fp): b for b in range(N_BATCHES) for fp in batch(b)}
        self.at = 0
        self.checks = 0

    def check(self, found: np.ndarray) -> None:
        counts = np.zeros(N_BATCHES, dtype=np.int64)
        for q, fp in zip(found["query"].tolist(), found["fingerprint"].tolist()):
            b = self.owner.get(fp)
            assert b is not None, f"fingerprint {fp:#x} was never added"
            if b == q:
                counts[q] += 1
        partial = [b for b in range(N_BATCHES) if counts[b] not in (0, self.sizes[b])]
        assert not partial, f"batches seen in part: {[(b, counts[b]) for b in partial]}"
        visible = frozenset(int(b) for b in np.flatnonzero(counts))
        later = [j for j in range(self.at, len(self.states)) if self.states[j] == visible]
        assert later, f"visible batches {sorted(visible)} are no state at or after {self.at}"
        self.at = later[0]
        self.checks += 1


def read_until(ix: Index, done: threading.Event, errors: list, checks: list,
               checked: threading.Event | None = None) -> None:
    checker = Checker()
    queries = seeds()
    try:
        while not done.is_set():
            checker.check(ix.query_many(queries, k=2))
            if checked is not None:
                checked.set()
            b = int(np.random.default_rng(checker.checks).integers(N_BATCHES))
            got = ix.query(int(queries[b]), 2)
            assert len(got) in (0, len(batch(b))), f"batch {b}: {len(got)} of {len(batch(b))}"
            keys_of = {int(fp): (f"{b}/{i}",) for i, fp in enumerate(batch(b))}
            for m in got:
                assert m.keys == keys_of[m.fingerprint], (b, m)
        checker.check(ix.query_many(queries, k=2))
        assert checker.at == len(checker.states) - 1, "the final state was not seen"
        checks.append(checker.checks)
    except BaseException as exc:  # noqa: BLE001 - reported by the main thread
        errors.append(exc)


READER_PROCESS = textwrap.dedent("""
    import sys, threading, time
    sys.path.insert(0, sys.argv[2])
    from test_concurrency import read_until
    from ndindex.index import Index
    ix = Index.open(sys.argv[1], readonly=True)
    done, errors, checks = threading.Event(), [], []
    threads = [threading.Thread(target=read_until, args=(ix, done, errors, checks))
               for _ in range(2)]
    for t in threads:
        t.start()
    print("reading", flush=True)
    sys.stdin.readline()  # the writer finished
    done.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    print("checks", sum(checks), flush=True)
""")


def test_readers_see_only_committed_states_while_writer_adds_removes_and_compacts(tmp_path):
    path = str(tmp_path / "shared.ndx")
    ix = Index.create(path, k=2, expected_n=5000, log_limit=150)
    reader = subprocess.Popen([sys.executable, "-c", READER_PROCESS, path, os.path.dirname(__file__)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert reader.stdout.readline().strip() == "reading", reader.stderr.read()
        done, errors, checks, checked = threading.Event(), [], [], threading.Event()
        threads = [threading.Thread(target=read_until, args=(ix, done, errors, checks, checked))
                   for _ in range(N_READER_THREADS)]
        for t in threads:
            t.start()

        def wait_for_a_reader():
            # On a loaded machine the writer could finish before any reader
            # runs; waiting (bounded) for one check per operation makes the
            # overlap this test is about certain rather than likely.
            checked.wait(timeout=5)
            checked.clear()

        try:
            run_writer(ix, before_op=wait_for_a_reader)
        finally:
            done.set()
            for t in threads:
                t.join(timeout=60)
        out, err = reader.communicate("done\n", timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
        ix.close()
    if errors:
        raise errors[0]
    assert reader.returncode == 0, err
    # Each reader checks once more after the writer is done; more checks
    # than that means answers were checked while the writer worked.
    assert len(checks) == N_READER_THREADS and sum(checks) > N_READER_THREADS, checks
    assert int(out.split()[-1]) >= 2, out
    with Index.open(path) as final:
        final.verify()
        Checker().check(final.query_many(seeds(), k=2))


def test_query_keys_come_from_the_same_snapshot_as_the_fingerprints(tmp_path):
    # A writer removes and re-adds keyed fingerprints; a match must always
    # carry its keys, never those of a later state (none, after a remove).
    ix = Index.create(tmp_path / "keys.ndx", k=2, expected_n=1000, log_limit=1 << 20)
    fps, keys = [1000, 1001, 1003], ["a", "b", "c"]
    ix.add(fps, keys=keys)
    stop, errors, seen = threading.Event(), [], [0]

    def write():
        try:
            for _ in range(100):
                ix.remove(fps)
                ix.add(fps, keys=keys)
        finally:
            stop.set()

    def read():
        try:
            while not stop.is_set():
                for m in ix.query(1000, 2):
                    assert m.keys == (keys[fps.index(m.fingerprint)],), m
                    seen[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    ix.close()
    if errors:
        raise errors[0]
    assert seen[0] > 0


def _create_racing(path, results, barrier):
    barrier.wait()
    try:
        Index.create(path, k=3).close()
        results.put("created")
    except FileExistsError:
        results.put("exists")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results.put(f"{type(exc).__name__}: {exc}")


def test_processes_racing_to_create_one_index(tmp_path):
    # One wins; the others are told the index exists; the build name they
    # share (held in turn) is gone after them.
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    for round_ in range(8):
        path = str(tmp_path / f"race{round_}.ndx")
        results, barrier = ctx.Queue(), ctx.Barrier(3)
        procs = [ctx.Process(target=_create_racing, args=(path, results, barrier))
                 for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert sorted(results.get(timeout=10) for _ in procs) == ["created", "exists", "exists"]
        with Index.open(path) as ix:
            assert len(ix) == 0
    assert sorted(os.listdir(tmp_path)) == sorted(
        name for r in range(8) for name in (f"race{r}.ndx", f"race{r}.ndx-lock"))


def _vacuum_paused(path: str, copied: str, go: str) -> None:
    """Vacuum the index at path, pausing between its copy and the rename: the
    file copied appears, then the vacuum waits for the file go."""
    ix = Index.open(path, background_compaction=False)
    copy = ix._copy_compacted

    def paused(*args):
        copy(*args)
        open(copied, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
    ix._copy_compacted = paused
    ix.vacuum()
    ix.close()


def test_an_open_during_another_process_vacuum_waits_and_loses_nothing(tmp_path):
    # The vacuum copies the file and renames the copy over it.  An open that
    # went ahead meanwhile kept the replaced file: its durable add() went
    # into it and was lost.  Now the open waits for the vacuum, then opens
    # the new file.
    import multiprocessing
    path = str(tmp_path / "v.ndx")
    copied, go = str(tmp_path / "copied"), str(tmp_path / "go")
    _, live = _compacted_index(path, 23)
    vacuum = multiprocessing.get_context("fork").Process(target=_vacuum_paused,
                                                         args=(path, copied, go))
    vacuum.start()
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(copied) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.path.exists(copied)
        done = []

        def writer():
            with Index.open(path, background_compaction=False) as ix:
                ix.add([12345])
                done.append(len(ix))
        thread = threading.Thread(target=writer)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and not done  # waiting for the vacuum
        open(go, "w").close()
        thread.join(60)
        vacuum.join(60)
        assert vacuum.exitcode == 0
    finally:
        open(go, "w").close()
        vacuum.join(60)
    assert done == [len(live) + 1]
    with Index.open(path, readonly=True) as ix:
        assert 12345 in ix and len(ix) == len(live) + 1


def _start_paused_vacuum(path: str, tmp_path) -> tuple:
    """A vacuum of path in another process, paused once it holds the file
    alone (its copy made): (process, the file that lets it go on)."""
    import multiprocessing
    copied, go = str(tmp_path / "copied"), str(tmp_path / "go")
    vacuum = multiprocessing.get_context("fork").Process(target=_vacuum_paused,
                                                         args=(path, copied, go))
    vacuum.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(copied) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(copied)
    return vacuum, go


def test_an_open_with_a_timeout_during_another_process_vacuum_raises_busy(tmp_path):
    # Index.open waits for a vacuum as long as it takes, unless told a
    # timeout: then BusyError, typed, after about that long, and the
    # vacuum, and everything stored, go on untouched.
    path = str(tmp_path / "v.ndx")
    _, live = _compacted_index(path, 29)
    vacuum, go = _start_paused_vacuum(path, tmp_path)
    try:
        for readonly, timeout in ((False, 0.3), (True, 0)):
            t = time.monotonic()
            with pytest.raises(BusyError, match="vacuuming") as caught:
                Index.open(path, readonly=readonly, timeout=timeout)
            assert timeout <= time.monotonic() - t < timeout + 5
            assert isinstance(caught.value, TimeoutError)
        assert vacuum.is_alive()
    finally:
        open(go, "w").close()
        vacuum.join(60)
    assert vacuum.exitcode == 0
    with Index.open(path, readonly=True, timeout=0) as ix:
        assert len(ix) == len(live) and all(int(fp) in ix for fp in live[:100])


def test_the_command_says_why_it_waits_for_another_process_vacuum(tmp_path):
    path = str(tmp_path / "v.ndx")
    _, live = _compacted_index(path, 31)
    vacuum, go = _start_paused_vacuum(path, tmp_path)
    try:
        cmd = subprocess.Popen([sys.executable, "-m", "ndindex", "stats", path, "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = []
        reader = threading.Thread(target=lambda: line.append(cmd.stderr.readline()))
        reader.start()
        reader.join(60)
        assert line and "another process is vacuuming" in line[0] and path in line[0]
        assert cmd.poll() is None  # still waiting
    finally:
        open(go, "w").close()
        vacuum.join(60)
    out, _ = cmd.communicate(timeout=60)
    assert cmd.returncode == 0 and json.loads(out)["fingerprints"] == len(live)


def _compacted_index(path: str, seed: int) -> tuple:
    """A compacted index of 60,000 random fingerprints at path: (rng, fingerprints)."""
    rng = np.random.default_rng(seed)
    live = rng.integers(0, 2**64, 60_000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=len(live)) as ix:
        ix.add(live)
        ix.compact()
    return rng, live


def _churn(ix, rng, live, cycles: int, gap: float = 0.0) -> list:
    """Cycles of removing 5% and adding as many, a compaction each; the file's sizes."""
    sizes = []
    for _ in range(cycles):
        ix.remove(fingerprints=live[:3000])
        live = np.concatenate([live[3000:], rng.integers(0, 2**64, 3000, dtype=np.uint64)])
        ix.add(live[-3000:])
        ix.compact()
        sizes.append(os.path.getsize(ix.path))
        time.sleep(gap)
    return sizes


def test_an_idle_reader_process_does_not_make_the_writers_file_grow(tmp_path):
    # A reader that opens the index, asks once and then waits held its
    # snapshot (an LMDB read transaction) for as long as it stayed open,
    # so no page a compaction freed after it could be reused: the file grew
    # by about a third of its size with every churn cycle.  Idle, it lets
    # the snapshot go (reaper.SnapshotReaper) and the file holds steady.
    path = str(tmp_path / "idle.ndx")
    rng, live = _compacted_index(path, 18)
    reader = textwrap.dedent("""
        import sys
        from ndindex import Index, reaper
        reaper.IDLE_SNAPSHOT_SECONDS = 0.1
        ix = Index.open(sys.argv[1], readonly=True)
        ix.query(1)
        print("ready", flush=True)
        sys.stdin.readline()
        print(len(ix.query(int(sys.argv[2]), 0)), flush=True)
    """)
    with Index.open(path) as ix:
        later = int(rng.integers(0, 2**64, dtype=np.uint64))
        proc = subprocess.Popen([sys.executable, "-c", reader, path, str(later)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            sizes = _churn(ix, rng, live, 8, gap=0.25)   # gap: the reader's idle time
            ix.add([later])
            # The reader, asked again, sees the newest state.
            assert proc.communicate("go\n", timeout=60)[0].split() == ["1"]
        finally:
            if proc.poll() is None:
                proc.kill()
    assert sizes[-1] <= 1.3 * sizes[1], sizes


def test_a_reader_killed_inside_a_read_does_not_make_the_writers_file_grow(tmp_path,
                                                                          monkeypatch):
    # Its slot in LMDB's lock file outlived it, naming its snapshot: no page
    # freed after that was reused while the writer stayed open.  The writer
    # now clears slots of dead processes (Store.clear_dead_readers).
    import signal
    from ndindex import store
    monkeypatch.setattr(store, "READER_CHECK_SECONDS", 0.0)
    path = str(tmp_path / "dead.ndx")
    rng, live = _compacted_index(path, 19)
    reader = textwrap.dedent("""
        import sys
        from ndindex import Index, reaper
        reaper.IDLE_SNAPSHOT_SECONDS = 1e9   # it would hold its snapshot: then it dies
        ix = Index.open(sys.argv[1], readonly=True)
        ix.query(1)
        print("ready", flush=True)
        sys.stdin.read()
    """)
    with Index.open(path) as ix:
        proc = subprocess.Popen([sys.executable, "-c", reader, path], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        proc.stdin.close()
        proc.stdout.close()
        sizes = _churn(ix, rng, live, 6)
        assert f" {proc.pid} " not in ix._store.env.readers()
    assert sizes[-1] <= 1.3 * sizes[1], sizes


def test_removals_pending_under_normal_durability_survive_queries_of_other_threads(tmp_path):
    # A query reads the writer's pending operations without the writer's
    # lock.  It used to store the sorted removals it computed as current
    # even when the writer had removed more meanwhile, and the checkpoint
    # then committed that stale set: acknowledged removals came back.
    path = str(tmp_path / "normal.ndx")
    rng = np.random.default_rng(23)
    stored = np.unique(rng.integers(0, 2**64, 100_000, dtype=np.uint64))
    removed = []
    done, errors = threading.Event(), []

    def ask():
        r = np.random.default_rng(5)
        try:
            while not done.is_set():
                ix.query_many(r.integers(0, 2**64, 20, dtype=np.uint64), 3)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    interval = sys.getswitchinterval()
    with Index.create(path, k=3, expected_n=200_000, durability="normal",
                      background_compaction=False) as ix:
        ix.add(stored)
        asker = threading.Thread(target=ask)
        asker.start()
        sys.setswitchinterval(1e-5)  # switch threads often: the window is a few lines
        try:
            for part in np.array_split(rng.permutation(stored)[:60_000], 60):
                ix.remove(fingerprints=part)
                removed.append(part)
        finally:
            sys.setswitchinterval(interval)
            done.set()
            asker.join()
        assert not errors, errors
        removed = np.concatenate(removed)
        assert len(ix) == len(stored) - len(removed)
        ix.sync()
        assert len(ix.query_many(removed, 0)) == 0
    with Index.open(path, readonly=True) as ix:
        assert len(ix) == len(stored) - len(removed)
        assert len(ix.query_many(removed, 0)) == 0


def test_pending_document_lookups_follow_a_put_made_while_they_were_built(tmp_path,
                                                                          monkeypatch):
    # Queries of other threads build the index of pending documents' lookup
    # keys while the writer may put documents.  Simulated here: the writer
    # puts document b in the middle of the build.  The loop over the live
    # dict raised "dictionary changed size during iteration", and an index
    # built so was kept, missing b, until the next put.
    from ndindex import docstore
    from ndindex.fingerprint import Fingerprinter
    from ndindex.records import SPACE_DOCS

    def pending_docs(path, text, key):
        ix = Index.create(path, k=3, fingerprinter=Fingerprinter(), durability="normal")
        ix.add_documents([text], [key])
        ops = ix._writer.pending.ops
        docs = [(sp, k, f, v) for sp, k, f, v in ops.items(SPACE_DOCS)]
        return ix, ops, docs

    text_a = "the first document talks about sailing boats on a windy lake"
    text_b = "an entirely different text about baking bread with rye flour"
    ix_a, ops, docs_a = pending_docs(str(tmp_path / "a.ndx"), text_a, "a")
    ix_b, _, docs_b = pending_docs(str(tmp_path / "b.ndx"), text_b, "b")
    try:
        (_, key_b, flag_b, value_b), = docs_b
        lk_b = int(docstore.lookup_keys_of(flag_b, value_b)[0])
        fp_b = U64_BE.unpack_from(key_b)[0]
        real = docstore.lookup_keys_of
        put = []

        def writer_puts_b_meanwhile(flag, value):
            if not put:
                put.append(True)
                ops.set(SPACE_DOCS, key_b, flag_b, value_b)
            return real(flag, value)

        monkeypatch.setattr(docstore, "lookup_keys_of", writer_puts_b_meanwhile)
        assert ops.lookup_hits(lk_b) in ([], [fp_b])  # built while b went in
        assert put
        assert ops.lookup_hits(lk_b) == [fp_b]
    finally:
        ix_a.close()
        ix_b.close()


def test_a_query_that_meets_another_threads_close_raises_closed_error(tmp_path, monkeypatch):
    # close() in one thread while another takes a snapshot: the snapshot
    # asked the closed descriptor for the file's size and raised OSError
    # EBADF (tools/soak_oracle.py's watcher, at a reopen), where a closed
    # index raises ClosedError.
    path = str(tmp_path / "c.ndx")
    with Index.create(path, k=3, expected_n=1000) as ix:
        ix.add(np.arange(1, 100, dtype=np.uint64))
    ix = Index.open(path, background_compaction=False)
    real = pages.FileMap.file_bytes

    def closed_meanwhile(filemap):
        ix._store.close()  # where the other thread's close() lands
        return real(filemap)

    monkeypatch.setattr(pages.FileMap, "file_bytes", closed_meanwhile)
    ix._let_go_of_snapshot()
    with pytest.raises(ClosedError):
        ix.query(5, 3)
    monkeypatch.undo()
    ix.close()
    with Index.open(path, readonly=True) as again:
        assert len(again) == 99


def test_an_environment_closed_by_another_thread_reads_as_closed_error(tmp_path):
    # The other window: the snapshot took the environment, then close() ran,
    # and LMDB's begin() said "closed/deleted/dropped object".
    from ndindex.store import translate_error
    path = str(tmp_path / "e.ndx")
    Index.create(path, k=3, expected_n=1000).close()
    ix = Index.open(path, background_compaction=False)
    env = ix._store.env
    ix.close()
    with pytest.raises(Exception) as raised:
        env.begin()
    assert isinstance(translate_error(raised.value, path), ClosedError)


def test_a_batch_that_meets_another_threads_close_raises_closed_error(tmp_path, monkeypatch):
    # query_many took its view, then another thread closed the index before
    # the batch reached its thread pool: submitting raised RuntimeError
    # ("cannot schedule new futures after shutdown"), or, before the pool's
    # first use, made a new pool that outlived the index.
    from ndindex import index_queries
    path = str(tmp_path / "b.ndx")
    rng = np.random.default_rng(7)
    with Index.create(path, k=3, expected_n=10_000) as ix:
        ix.add(rng.integers(0, 2**64, 5000, dtype=np.uint64))
    qs = rng.integers(0, 2**64, index_queries.PARALLEL_QUERY_MIN, dtype=np.uint64)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # the batch is split, on any machine
    for warm in (False, True):
        ix = Index.open(path, background_compaction=False)
        if warm:
            ix.query_many(qs)  # the pool exists
        real = Index._view

        def closed_meanwhile(self):
            view = real(self)
            closer = threading.Thread(target=self.close)
            closer.start()
            closer.join()
            return view

        monkeypatch.setattr(Index, "_view", closed_meanwhile)
        with pytest.raises(ClosedError):
            ix.query_many(qs)
        monkeypatch.setattr(Index, "_view", real)
        assert ix._pool is False
    with Index.open(path, readonly=True) as again:
        assert len(again) == 5000


def test_a_compaction_that_meets_another_threads_close_raises_closed_error(tmp_path,
                                                                         monkeypatch):
    # compact() in one thread, close() in another: close() shut the merge
    # threads' pool down under the step, which raised RuntimeError; now
    # close() waits for the step under way and the next one raises
    # ClosedError.  Nothing is lost either way.
    from ndindex import compaction
    path = str(tmp_path / "m.ndx")
    rng = np.random.default_rng(8)
    ix = Index.create(path, k=3, expected_n=100_000, background_compaction=False,
                      log_limit=1000)
    added = 0
    for _ in range(6):
        added += ix.add(rng.integers(0, 2**64, 3000, dtype=np.uint64))
        ix._compactor.step(force_flush=True)  # several runs a table: merges to do
    added += ix.add(rng.integers(0, 2**64, 3000, dtype=np.uint64))  # and a log to flush
    comp = ix._compactor
    real = compaction.Compactor._step
    closers = []

    def close_during_the_first_step(self, snap, force_flush, full):
        if not closers:
            closers.append(threading.Thread(target=ix.close))
            closers[0].start()
            deadline = time.monotonic() + 10
            while not comp._stop.is_set() and time.monotonic() < deadline:
                time.sleep(0.001)
            assert comp._stop.is_set()
        return real(self, snap, force_flush, full)

    monkeypatch.setattr(compaction.Compactor, "_step", close_during_the_first_step)
    with pytest.raises(ClosedError):
        ix.compact()
    closers[0].join(10)
    assert not closers[0].is_alive()
    monkeypatch.undo()
    with Index.open(path, background_compaction=False) as again:
        assert len(again) == added
        again.verify()


_CHILD_OF_FORK = textwrap.dedent("""
    import os, signal, sys, threading
    import numpy as np
    from ndindex.errors import ClosedError
    from ndindex.index import Index
    path, durability = sys.argv[1], sys.argv[2]
    ix = Index.open(path, durability=durability)
    ix.query(5)
    busy = threading.Event()

    def hold_the_locks():  # a thread of the parent inside a write at the fork
        with ix._writer.lock, ix._snap_lock:
            busy.set()
            threading.Event().wait(5)

    threading.Thread(target=hold_the_locks, daemon=True).start()
    busy.wait()
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang ends the child, not the machine's patience
        outcomes = []
        for name, call in [("query", lambda: ix.query(5)), ("len", lambda: len(ix)),
                           ("query_many", lambda: ix.query_many(np.arange(5000, dtype=np.uint64))),
                           ("add", lambda: ix.add([7])), ("compact", ix.compact),
                           ("stats", ix.stats)]:
            try:
                call()
                outcomes.append(name + " ran")
            except ClosedError as exc:
                outcomes.append(name + (" refused" if "fork" in str(exc) else " closed"))
        ix.close()
        with Index.open(path) as mine:   # the child's own open works
            mine.add([11])
        print(" ".join(outcomes), flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    # The parent's snapshot keeps its LMDB reader slot (a child's abort of
    # the inherited transaction cleared it).
    slots = [line.split() for line in ix._store.env.readers().splitlines()[1:]]
    print("slot", [str(os.getpid()), str(ix._snap.txnid)] in [s[::2] for s in slots], flush=True)
    ix.add([13])
    ix.close()
    with Index.open(path, readonly=True) as again:
        print("parent", os.waitstatus_to_exitcode(status), 7 in again, 11 in again, 13 in again)
""")


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_an_index_used_in_a_child_of_fork_refuses_and_never_hangs(tmp_path, durability):
    # LMDB's environment belongs to the process that opened it, and a
    # child of fork() has none of the parent's threads: a lock one of them
    # held stays held.  Writing through an inherited index hung (a scratch
    # test adding from a fork Pool beside the parent, 1 run in 4); now every
    # call raises ClosedError naming the fork, the child may open the index
    # itself, and the parent goes on.
    path = str(tmp_path / "f.ndx")
    with Index.create(path, k=3, expected_n=10_000) as ix:
        ix.add(np.arange(1, 1000, dtype=np.uint64) * np.uint64(1 << 40))
    out = subprocess.run([sys.executable, "-c", _CHILD_OF_FORK, path, durability],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    child, slot, parent = out.stdout.strip().splitlines()
    assert child == "query refused len refused query_many refused add refused " \
                    "compact refused stats refused"
    assert slot == "slot True"
    assert parent == "parent 0 False True True"


_FINGERPRINTING_CHILD_OF_FORK = textwrap.dedent("""
    import os, signal
    from ndindex.documents import fingerprint_documents
    if __name__ == "__main__":
        texts = [f"words of document number {i} and some more of them" for i in range(200)]
        fingerprint_documents(texts, workers=2)   # the parent's pool of workers
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)  # a hang ends the child
            print("child", len(fingerprint_documents(texts, workers=2)), flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("status", os.waitstatus_to_exitcode(status))
        print("parent", len(fingerprint_documents(texts, workers=2)))
""")


def test_a_child_of_fork_fingerprints_in_parallel_with_pools_of_its_own(tmp_path):
    # The parent's pool of fingerprinting processes was reused in the child,
    # which has none of its threads: the call waited for ever (SIGALRM);
    # and the parent's fork server cannot start the child's workers.
    script = tmp_path / "fork_fingerprints.py"
    script.write_text(_FINGERPRINTING_CHILD_OF_FORK)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["child", "200", "status", "0", "parent", "200"]
