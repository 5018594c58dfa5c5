"""Bad input, misuse and hostile environments give typed errors and lose nothing stored.

Covers, for a format-2 index: wrong argument types and ranges
(TypeError/ValueError, nothing written), empty input, paths that are
directories or missing, use after close (ClosedError), writes to a
read-only index, file or file system (ReadOnlyError), a mapping of the
file that must grow while it is read, and a full disk on create, open,
add and compact (CapacityError, everything committed before intact).

How a full disk is made, from the most real to the most targeted:

- a 4 MiB tmpfs mounted for the test (when the process may mount one; the
  test is skipped otherwise): the disk really fills, in a child process,
  so a SIGBUS would show as a signal;
- RLIMIT_FSIZE in a child process with SIGXFSZ ignored: writes past the
  limit fail with EFBIG at the system call, as on a full disk;
- ENOSPC injected at the system call boundary in this process
  (os.pwrite for the lock file, the journal's write_with_gil) and
  lmdb.DiskError/MapFullError at LMDB's commit, through the proxy of
  tests/crash/test_lmdb_errors.py's kind.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import subprocess
import sys
import textwrap
import time

import lmdb
import numpy as np
import pytest

import ndindex
import ndindex.journal as jr
import ndindex.store as st
from ndindex import (CapacityError, ClosedError, FormatError, NdindexError, ReadOnlyError, pages,
                     records as rec)
from ndindex import recover
from ndindex.index import Index
from tests.interrupts import ctrl_c_at_call

K = 3


def stored_fingerprints() -> np.ndarray:
    return np.unique(np.random.default_rng(11).integers(0, 2**64, 500, dtype=np.uint64))


@pytest.fixture
def path(tmp_path) -> str:
    """An index holding stored_fingerprints() (half in runs, half in the log), with keys."""
    p = str(tmp_path / "index.ndx")
    fps = stored_fingerprints()
    with Index.create(p, k=K, expected_n=1000, background_compaction=False) as ix:
        ix.add(fps[:250], keys=[f"t{i}" for i in range(250)])
        ix.compact()
        ix.add(fps[250:], keys=[f"l{i}".encode() for i in range(250, len(fps))])
    return p


@pytest.fixture
def ix(path):
    with Index.open(path, background_compaction=False) as index:
        yield index


def assert_intact(index: Index) -> None:
    """Every stored fingerprint is there with its key, nothing else, and verify() passes."""
    fps = stored_fingerprints()
    index.verify()
    assert len(index) == len(fps)
    assert np.array_equal(index.fingerprints(), fps)
    assert index.keys(int(fps[0])) == ("t0",)
    assert index.keys(int(fps[-1])) == (f"l{len(fps) - 1}".encode(),)


def assert_file_intact(p) -> None:
    with Index.open(p, readonly=True) as index:
        assert_intact(index)


# -- wrong types and ranges ----------------------------------------------------


BAD_FINGERPRINTS = [
    ("str", "123", TypeError),
    ("bytes", b"\x01" * 8, TypeError),
    ("float", 1.5, TypeError),
    ("float-integral", 2.0, TypeError),
    ("none", None, TypeError),
    ("bool", True, TypeError),
    ("negative", -1, ValueError),
    ("too-large", 1 << 64, ValueError),
    ("huge", 10**30, ValueError),
    ("numpy-float", np.float64(3.0), TypeError),
]


@pytest.mark.parametrize("name,value,error", BAD_FINGERPRINTS, ids=[b[0] for b in BAD_FINGERPRINTS])
def test_bad_fingerprint_raises_for_every_entry_point(ix, name, value, error):
    with pytest.raises(error):
        ix.query(value)
    with pytest.raises(error):
        ix.keys(value)
    with pytest.raises(error):
        ix.check_and_add(value)
    with pytest.raises(error):
        value in ix  # noqa: B015
    with pytest.raises(error):
        ix.add([1, value])
    with pytest.raises(error):
        ix.query_many([1, value])
    with pytest.raises(error):
        ix.remove([1, value])
    assert_intact(ix)


@pytest.mark.parametrize("batch,error", [
    ("a string", TypeError),
    (b"bytes", TypeError),
    (1.5, TypeError),
    (np.array([1.0, 2.0]), TypeError),
    (np.array([1, -2], dtype=np.int64), ValueError),
    (np.array(["1", "2"]), TypeError),
    (np.array([[1, 2]], dtype=np.uint64), ValueError),
    ([1, "2"], TypeError),
    ([[1, 2]], ValueError),
    (object(), TypeError),
], ids=["str", "bytes", "float", "float-array", "negative-array", "str-array", "2-d-array",
        "mixed-list", "nested-list", "object"])
def test_bad_fingerprint_batch_raises_and_writes_nothing(ix, batch, error):
    with pytest.raises(error):
        ix.add(batch)
    with pytest.raises(error):
        ix.query_many(batch)
    with pytest.raises(error):
        ix.remove(batch)
    assert_intact(ix)


@pytest.mark.parametrize("keys,error", [
    ("one-string", TypeError),
    (b"one-bytes", TypeError),
    ([1, 2], TypeError),
    ([1.0, "x"], TypeError),
    (["only-one"], ValueError),
    (["a", "b", "c"], ValueError),
    (["", "b"], ValueError),
    ([b"", "b"], ValueError),
    (["x" * (rec.MAX_DOC_KEY_BYTES + 1), "b"], ValueError),
    ([b"x" * (rec.MAX_DOC_KEY_BYTES + 1), "b"], ValueError),
    (["\udcff", "b"], ValueError),
    (5, TypeError),
], ids=["str", "bytes", "ints", "float", "too-few", "too-many", "empty-str", "empty-bytes",
        "long-str", "long-bytes", "lone-surrogate", "int"])
def test_bad_keys_raise_and_write_nothing(ix, keys, error):
    with pytest.raises(error, match="key"):
        ix.add([12345, 67890], keys=keys)
    assert 12345 not in ix and 67890 not in ix
    assert_intact(ix)


def test_a_progress_that_cannot_be_called_raises_before_any_work(ix, path, tmp_path):
    # It raised 'str' object is not callable at its first report, the work
    # under way (compact had merged, recover had read the file).
    from ndindex import upgrade
    before = ix.stats()["log_records"]
    calls = [lambda: ix.compact(progress="x"), lambda: ix.verify(progress=3),
             lambda: recover.recover(path, str(tmp_path / "out.ndx"), progress="x"),
             lambda: upgrade.upgrade(path, str(tmp_path / "up.ndx"), progress=1),
             lambda: ndindex.dedup([str(tmp_path)], index=str(tmp_path / "d.ndx"), progress="x")]
    for call in calls:
        with pytest.raises(TypeError, match="progress must be a callable"):
            call()
    assert ix.stats()["log_records"] == before
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path), os.path.basename(path) + "-lock"]


@pytest.mark.parametrize("coding", [0, 1, 2, "xor", "delta", "delta+restarts"])
def test_a_coding_is_its_constant_or_the_name_stats_gives_it(tmp_path, coding):
    with Index.create(str(tmp_path / "c.ndx"), k=3, expected_n=100, coding=coding) as ix:
        ix.add([7])
        name = ix.stats()["coding"]
    assert name == (coding if isinstance(coding, str) else
                    ["xor", "delta", "delta+restarts"][coding])


@pytest.mark.parametrize("coding", [3, True, "Delta", None, 1.0])
def test_an_unknown_coding_is_a_value_error_naming_the_choices(tmp_path, coding):
    with pytest.raises(ValueError, match=r"coding must be one of \[0, 1, 2\] or \['delta'"):
        Index.create(str(tmp_path / "c.ndx"), coding=coding)
    assert os.listdir(tmp_path) == []


def test_longest_key_is_accepted(ix):
    key = "k" * rec.MAX_DOC_KEY_BYTES
    ix.add([42], keys=[key])
    assert ix.keys(42) == (key,)


@pytest.mark.parametrize("k,error", [
    (-1, ValueError), (K + 1, ValueError), (64, ValueError), (True, TypeError),
    (False, TypeError), (1.0, TypeError), ("2", TypeError),
])
def test_k_out_of_range_or_wrong_type_raises(ix, k, error):
    fp = int(stored_fingerprints()[0])
    with pytest.raises(error):
        ix.query(fp, k)
    with pytest.raises(error):
        ix.query_many([fp], k)
    with pytest.raises(error):
        ix.check_and_add(fp, k=k)


@pytest.mark.parametrize("k,error", [(-1, ValueError), (65, ValueError), (13, ValueError),
                                     (True, TypeError), (2.0, TypeError), (None, TypeError)])
def test_create_with_bad_k_raises_and_leaves_no_file(tmp_path, k, error):
    p = tmp_path / "x.ndx"
    with pytest.raises(error):
        Index.create(p, k=k)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kwargs,error", [
    (dict(expected_n=0), ValueError), (dict(expected_n=-5), ValueError),
    (dict(durability="sometimes"), ValueError), (dict(log_limit=0), ValueError),
    (dict(coding=7), ValueError), (dict(plan="4 tables"), ValueError),
    (dict(plan=4), TypeError),
], ids=["n=0", "n<0", "durability", "log_limit", "coding", "plan name", "plan type"])
def test_create_with_bad_parameters_raises_and_leaves_no_file(tmp_path, kwargs, error):
    with pytest.raises(error):
        Index.create(tmp_path / "x.ndx", **kwargs)
    assert os.listdir(tmp_path) == []


def test_remove_without_arguments_raises(ix):
    with pytest.raises(TypeError):
        ix.remove()
    with pytest.raises(TypeError):
        ix.remove(keys=[3])
    assert_intact(ix)


# -- empty input ---------------------------------------------------------------


def test_empty_input_is_accepted_and_changes_nothing(ix):
    assert ix.add([]) == 0
    assert ix.add(np.empty(0, dtype=np.uint64), keys=[]) == 0
    assert ix.remove([]) == 0
    assert ix.remove(keys=[]) == 0
    assert len(ix.query_many([])) == 0
    with ix.transaction():
        pass
    assert_intact(ix)


def test_empty_index_answers_empty(tmp_path):
    with Index.create(tmp_path / "e.ndx", k=K) as index:
        assert len(index) == 0 and index.query(7) == [] and index.keys(7) == ()
        assert len(index.fingerprints()) == 0 and list(index.items()) == []
        index.compact(full=True)
        index.verify()


# -- paths -----------------------------------------------------------------------


def test_create_over_existing_file_raises_and_keeps_it(path):
    with pytest.raises(FileExistsError):
        Index.create(path)
    assert_file_intact(path)


def test_open_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        Index.open(tmp_path / "missing.ndx")
    assert not (tmp_path / "missing.ndx").exists()


@pytest.mark.parametrize("timeout, error", [("1", TypeError), (True, TypeError), ([1], TypeError),
                                            (-0.5, ValueError), (float("nan"), ValueError)])
def test_open_with_a_bad_timeout_raises_and_opens_nothing(path, timeout, error):
    with pytest.raises(error, match="timeout"):
        Index.open(path, timeout=timeout)
    # Nothing holds the file: a vacuum, which needs it alone, goes ahead.
    with Index.open(path, background_compaction=False, timeout=0) as index:
        index.vacuum()
    assert_file_intact(path)


def test_directory_path_raises_and_is_left_alone(tmp_path):
    d = tmp_path / "dir.ndx"
    d.mkdir()
    for readonly in (False, True):
        with pytest.raises(IsADirectoryError):
            Index.open(d, readonly=readonly)
    with pytest.raises(FileExistsError):
        Index.create(d)
    assert d.is_dir() and os.listdir(d) == []
    assert sorted(os.listdir(tmp_path)) == ["dir.ndx"]


SPECIAL_FILE_OPENS = textwrap.dedent("""
    import sys
    import ndindex
    from ndindex.errors import FormatError
    from ndindex.recover import salvage
    from ndindex.upgrade import file_format
    path = sys.argv[1]
    calls = [lambda: ndindex.open(path), lambda: ndindex.open(path, readonly=True),
             lambda: salvage(path), lambda: file_format(path)]
    for call in calls:
        try:
            call()
        except FormatError as exc:
            print(exc)
        else:
            print("opened")
""")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_or_a_device_is_not_an_index_and_opens_fail_at_once(tmp_path):
    # Opening a named pipe to read waits for a writer: a reader's open of
    # one hung for good.  In a child, so that a hang fails the test.
    pipe = tmp_path / "pipe.ndx"
    os.mkfifo(pipe)
    for path, what in ((str(pipe), "a named pipe"), (os.devnull, "a character device")):
        out = subprocess.run([sys.executable, "-c", SPECIAL_FILE_OPENS, path],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [f"{path}: not an ndindex file ({what})"] * 4
        cli = subprocess.run([sys.executable, "-m", "ndindex", "stats", path],
                             capture_output=True, text=True, timeout=60)
        assert (cli.returncode, cli.stdout) == (2, "")
        assert f"not an ndindex file ({what})" in cli.stderr
    assert sorted(os.listdir(tmp_path)) == ["pipe.ndx"]  # no lock file beside it


def test_a_file_built_in_a_missing_directory_names_the_directory(tmp_path):
    # Builds write under a hidden name beside the target first: the error
    # named that ("/x/.r.ndx.recover: No such file or directory"), and
    # create's was an NdindexError.
    path = str(tmp_path / "a.ndx")
    missing = str(tmp_path / "nowhere")
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        ix.add([1, 2, 3])
        for call in (lambda: Index.create(os.path.join(missing, "b.ndx")),
                     lambda: ix.vacuum_into(os.path.join(missing, "c.ndx")),
                     lambda: recover.recover(path, os.path.join(missing, "d.ndx"))):
            with pytest.raises(FileNotFoundError, match="no such directory") as info:
                call()
            assert info.value.filename == missing
    assert not os.path.exists(missing)
    cli = subprocess.run([sys.executable, "-m", "ndindex", "recover", path, "-o",
                          os.path.join(missing, "e.ndx")], capture_output=True, text=True,
                         timeout=120)
    assert (cli.returncode, cli.stderr) == (2, f"ndindex: {missing}: no such directory\n")


def test_vacuum_leaves_a_file_it_cannot_shrink_as_it_is(tmp_path):
    # The copy's two stamping commits made a new index's 28 KB file 40 KB,
    # and ndindex vacuum said "-12,288 given back to the disk".
    path = str(tmp_path / "v.ndx")
    Index.create(path, k=3, expected_n=1000).close()
    before = os.path.getsize(path)
    with Index.open(path) as ix:
        assert ix.vacuum() == before
        ix.add([5])
        assert 5 in ix
    assert sorted(os.listdir(tmp_path)) == ["v.ndx", "v.ndx-lock"]
    cli = subprocess.run([sys.executable, "-m", "ndindex", "vacuum", path, "--json"],
                         capture_output=True, text=True, timeout=120)
    doc = json.loads(cli.stdout)
    assert cli.returncode == 0 and doc["bytes_before"] >= doc["bytes_after"]


# -- closed and read-only indexes ----------------------------------------------


def test_closed_index_raises_closed_error(path):
    index = Index.open(path)
    index.query(1)
    index.close()
    index.close()  # idempotent
    fp = int(stored_fingerprints()[0])
    for call in (lambda: index.query(fp), lambda: index.query_many([fp]), lambda: index.keys(fp),
                 lambda: fp in index, lambda: len(index), lambda: index.add([1]),
                 lambda: index.remove([fp]), lambda: index.compact(), lambda: index.verify(),
                 lambda: index.stats(), lambda: index.fingerprints(), lambda: list(index.items()),
                 lambda: index.check_and_add(7), lambda: index.sync()):
        with pytest.raises(ClosedError):
            call()
    assert_file_intact(path)


def test_an_index_names_its_file_and_state_and_is_neither_pickled_nor_copied(path):
    import copy
    import pickle
    with Index.open(path) as ix:
        assert repr(ix) == f"<ndindex.Index {path!r} k={ix.k} writable>"
        for call in (lambda: pickle.dumps(ix), lambda: copy.copy(ix), lambda: copy.deepcopy(ix)):
            with pytest.raises(TypeError, match="cannot be pickled or copied: open the file"):
                call()
    assert repr(ix) == f"<ndindex.Index {path!r} k={ix.k} closed>"
    with Index.open(path, readonly=True) as ix:
        assert repr(ix).endswith(" read-only>")


def _ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_in_a_wait_on_a_pool_is_a_keyboard_interrupt_and_the_index_goes_on(
        path, monkeypatch):
    import concurrent.futures
    from ndindex import index_queries, threadpool
    from ndindex.errors import result_of
    fps = stored_fingerprints()
    with Index.open(path) as ix:
        want = ix.query_many(fps[:4000])
        monkeypatch.setattr(index_queries, "PARALLEL_QUERY_MIN", 1)
        monkeypatch.setattr(threadpool.Job, "result", _ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            ix.query_many(fps[:4000])                   # its thread pool's jobs
        monkeypatch.undo()
        monkeypatch.setattr(index_queries, "PARALLEL_QUERY_MIN", 1)
        assert np.array_equal(ix.query_many(fps[:4000]), want)   # and the Index goes on
    # result_of (the process pools' futures): Ctrl-C as Condition.wait takes its
    # lock back surfaces as RuntimeError "cannot release un-acquired lock".
    def unheld(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("cannot release un-acquired lock")
    monkeypatch.setattr(concurrent.futures.Future, "result", unheld)
    with pytest.raises(KeyboardInterrupt):
        result_of(concurrent.futures.Future())
    monkeypatch.undo()
    broken = concurrent.futures.Future()
    broken.set_exception(RuntimeError("something else"))
    with pytest.raises(RuntimeError, match="something else"):
        result_of(broken)


def _then_ctrl_c(fn):
    """fn, followed by a real SIGINT to this process: the KeyboardInterrupt
    is raised inside the wrapper, as fn returns to its caller."""
    import signal

    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):                    # bytecodes for the handler to run at
            pass
        return out

    return wrapper


def _child_that_must_end(script: str, *args, hung: str) -> list:
    """Run script (python -c) with args; fail with `hung` if it outlives 60 s
    (a lock a Ctrl-C left held); it must exit 0.  Returns its output's words."""
    try:
        done = subprocess.run([sys.executable, "-c", script, *map(str, args)],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(hung)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


_CTRL_C_IN_A_CONDITION = textwrap.dedent("""
    import sys, threading
    from ndindex import index_queries
    from ndindex.index import Index

    MAIN = threading.get_ident()

    def taken_then_ctrl_c(self):
        # Condition.__enter__ as Ctrl-C can cut it: the lock taken, then the
        # KeyboardInterrupt raised before the with statement holds it, so no
        # __exit__ ever lets it go.  (Signals reach the main thread alone;
        # current_thread() here would register a thread still starting.)
        self._lock.acquire()
        if threading.get_ident() == MAIN:
            raise KeyboardInterrupt
        return self

    enter = threading.Condition.__enter__
    index_queries.PARALLEL_QUERY_MIN = 1
    with Index.open(sys.argv[1], log_limit=100) as ix:
        ix.add([1 << 40])                           # the compactor runs
        ix.query_many([1, 2, 3])                    # query_many's pool runs
        threading.Condition.__enter__ = taken_then_ctrl_c
        for fp in range(2 << 40, (2 << 40) + 20):
            for call in (lambda: ix.add([fp]), lambda: ix.query_many([fp, 1, 2, 3]),
                         lambda: ix.compact()):
                try:
                    call()
                except KeyboardInterrupt:
                    pass
        threading.Condition.__enter__ = enter
        ix.add([3 << 40])
        print(bool(ix.query(3 << 40, k=0)), bool(ix.query(2 << 40, k=0)), flush=True)
    print("closed")
""")


def test_ctrl_c_in_the_writer_s_signals_and_pool_waits_leaves_no_lock_held(path):
    """After every commit the writer wakes the background compactor, and
    query_many and compact() wait for jobs on their thread pools.  With a
    threading.Event and concurrent.futures, Ctrl-C landing in the Event's
    set() or a Future's result() (or submit's Semaphore) could leave their
    lock held: the compactor, or the worker finishing the job, then waited
    for it forever, and close() joined them forever (tools/sweep_interrupt.py,
    about once in 200 runs each)."""
    assert _child_that_must_end(_CTRL_C_IN_A_CONDITION, path,
                                hung="close() waits for a lock that Ctrl-C left held") == \
        ["True", "True", "closed"]


_CTRL_C_AS_A_POOL_STARTS_A_WORKER = textwrap.dedent("""
    import os, signal, sys
    import multiprocessing.process as mpp
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a runner may ignore it)
    from ndindex import documents, dedup_files
    from ndindex.cli import main

    start = mpp.BaseProcess.start

    def start_then_ctrl_c(self):
        # A real SIGINT as a pool's worker has started: the executor records
        # a worker only once start() returns.
        start(self)
        os.kill(os.getpid(), signal.SIGINT)

    texts = [f"text {i} " * 40 for i in range(64)]
    documents.TEXTS_PER_TASK = 4
    dedup_files.TASK_FILES = 1
    mpp.BaseProcess.start = start_then_ctrl_c
    try:
        documents.fingerprint_documents(texts, workers=2)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    # (the command reports Ctrl-C by its exit status)
    print(main(["dedup", "-q", "--jobs", "2", "--index", sys.argv[2], sys.argv[1]]), flush=True)
    mpp.BaseProcess.start = start
    print(len(documents.fingerprint_documents(texts, workers=2)), flush=True)   # the kept pool goes on
""")


def test_ctrl_c_as_a_process_pool_starts_a_worker_leaves_none_behind(tmp_path):
    """ProcessPoolExecutor.submit starts a worker and records it after
    start() returns: Ctrl-C in between left a worker the pool never sent a
    stop, and the process waited for it for ever at exit (`ndindex dedup
    --jobs 2` interrupted at random moments: 2 hangs in 40)."""
    corpus = tmp_path / "files"
    corpus.mkdir()
    for i in range(200):
        (corpus / f"f{i}.txt").write_text(f"file {i % 50} " + "words in a file " * 30)
    assert _child_that_must_end(
        _CTRL_C_AS_A_POOL_STARTS_A_WORKER, corpus, tmp_path / "dedup.ndx",
        hung="the process waited at exit for a worker no pool had recorded") == \
        ["interrupted", "130", "64"]


_CTRL_C_AFTER_THE_WRITER_LOCK = textwrap.dedent("""
    import os, signal, sys, threading, time
    import numpy as np
    from ndindex import overlay
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a runner may ignore it)
    from ndindex.index import Index

    class SigintAfterAcquire:
        # The writer's lock, with a real SIGINT right after each acquire that
        # succeeds: Ctrl-C between the acquire and the try that releases it.
        def __init__(self, lock):
            self._l = lock
        def acquire(self, *args, **kwargs):
            got = self._l.acquire(*args, **kwargs)
            if got:
                os.kill(os.getpid(), signal.SIGINT)
            return got
        def release(self):
            self._l.release()
        def _is_owned(self):
            return self._l._is_owned()

    def free(lock):
        got = lock.acquire(timeout=5)
        if got:
            lock.release()
        return got

    fps = np.arange(1, overlay.PENDING_SCAN_MAX * 2, dtype=np.uint64) << np.uint64(20)
    with Index.open(sys.argv[1], durability=sys.argv[2]) as ix:
        try:
            with ix.transaction():
                ix.add(fps)
                ix._writer.pending._lock = SigintAfterAcquire(ix._writer.lock)
                ix.query(int(fps[0]))
                time.sleep(1)   # (not reached: the held-back SIGINT is raised)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        got = []
        other = threading.Thread(target=lambda: got.append(free(ix._writer.lock)))
        other.start()
        other.join()
        print("free" if got == [True] else "held", flush=True)
        print(int(fps[0]) in ix, flush=True)     # the transaction was discarded
        ix.add(fps[:3])
    with Index.open(sys.argv[1]) as ix:
        print(int(fps[2]) in ix, int(fps[5]) in ix, flush=True)
""")


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_ctrl_c_as_a_query_takes_the_writer_lock_to_index_pending_adds_leaves_it_free(
        path, durability):
    """A query in a transaction of more than PENDING_SCAN_MAX additions
    indexes them under the writer's lock, taken without a with statement:
    Ctrl-C just after the acquire left the lock held, and the checkpoint
    thread (durability "normal"), other threads' writes and close() waited
    for ever (sweep_interrupt seed 15, run 77)."""
    assert _child_that_must_end(
        _CTRL_C_AFTER_THE_WRITER_LOCK, path, durability,
        hung="close() waited for the writer's lock that Ctrl-C left held") == \
        ["interrupted", "free", "False", "True", "False"]


@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("call", ["compact", "vacuum"])
def test_ctrl_c_just_after_a_file_lock_is_taken_leaves_it_to_other_processes(
        path, monkeypatch, call):
    """compact() takes the compaction lease, vacuum() the open lock
    exclusively, each a byte lock on the file: Ctrl-C just after the lock
    call returned, before the try that lets it go, left it held until the
    process closed the file (no other process compacted; every other open
    waited)."""
    import fcntl
    import signal
    from ndindex import locks
    byte = locks.LEASE_BYTE if call == "compact" else locks.OPEN_BYTE
    real = locks.byte_lock

    def sigint_after_taking(fd, which, kind, wait=False):
        got = real(fd, which, kind, wait)
        if got and which == byte and kind == fcntl.F_WRLCK:
            os.kill(os.getpid(), signal.SIGINT)
        return got

    with Index.open(path, background_compaction=False) as ix:
        ix.add([7 << 30])
        monkeypatch.setattr(locks, "byte_lock", sigint_after_taking)
        with pytest.raises(KeyboardInterrupt):
            getattr(ix, call)()
        monkeypatch.undo()
        other = os.open(path, os.O_RDWR)     # another open file description: as another process
        try:
            assert real(other, byte, fcntl.F_RDLCK), "the lock stayed held"
            real(other, byte, fcntl.F_UNLCK)
        finally:
            os.close(other)
        assert 7 << 30 in ix
        ix.compact()                          # and both work again
        ix.vacuum()


def test_wakeup_behaves_as_an_event():
    import threading
    import time
    from ndindex.threadpool import Wakeup
    w = Wakeup()
    assert not w.is_set() and w.wait(0.01) is False
    woken = []
    waiters = [threading.Thread(target=lambda: woken.append(w.wait(10))) for _ in range(3)]
    for t in waiters:
        t.start()
    time.sleep(0.05)
    w.set()
    for t in waiters:
        t.join(10)
    assert woken == [True, True, True] and w.is_set() and w.wait(0) is True
    w.clear()
    assert not w.is_set()
    t0 = time.monotonic()
    assert w.wait(0.05) is False and time.monotonic() - t0 >= 0.04


def test_read_only_index_refuses_writes(path):
    fp = int(stored_fingerprints()[0])
    with Index.open(path, readonly=True) as index:
        assert index.readonly
        for call in (lambda: index.add([1]), lambda: index.add([1], keys=["k"]),
                     lambda: index.remove([fp]), lambda: index.remove(keys=["t0"]),
                     lambda: index.compact(), lambda: index.compact(full=True),
                     lambda: index.check_and_add(99), lambda: index.sync(),
                     lambda: index.vacuum(), lambda: index.transaction().__enter__()):
            with pytest.raises(ReadOnlyError):
                call()
        assert_intact(index)


def _privileged() -> bool:
    """Whether this process ignores file permissions (root, CAP_DAC_OVERRIDE)."""
    return os.geteuid() == 0 if hasattr(os, "geteuid") else False


def test_read_only_file_opens_read_only(path):
    os.chmod(path, 0o444)
    try:
        assert_file_intact(path)
        if not _privileged():
            with pytest.raises(ReadOnlyError):
                Index.open(path)
    finally:
        os.chmod(path, 0o644)
    assert_file_intact(path)


def test_file_the_process_may_not_write_refuses_a_writer(path, monkeypatch):
    # Root ignores file modes: what an ordinary user meets is simulated by
    # the check Store.open makes (os.access), answered as for that user.
    real_access = os.access
    monkeypatch.setattr(st.os, "access", lambda p, mode, *a, **kw: False if mode & os.W_OK and
                        os.fspath(p) == path else real_access(p, mode, *a, **kw))
    with pytest.raises(ReadOnlyError, match="readonly=True"):
        Index.open(path)
    monkeypatch.undo()
    assert_file_intact(path)


def test_read_only_directory_opens_read_only_without_a_lock_file(tmp_path, path, monkeypatch):
    # A copy in a directory where the lock file cannot be created (EROFS, as
    # on a read-only file system; EACCES for an ordinary user in a
    # read-only directory): readers open without a lock, writers are refused.
    d = tmp_path / "ro"
    d.mkdir()
    copy = str(d / "index.ndx")
    with open(path, "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    real_open = os.open

    def refusing(p, flags, *args, **kwargs):
        if os.fspath(p) == copy + "-lock" and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", p)
        return real_open(p, flags, *args, **kwargs)

    monkeypatch.setattr(st.os, "open", refusing)
    assert_file_intact(copy)
    assert not os.path.exists(copy + "-lock")
    with pytest.raises(ReadOnlyError):
        Index.open(copy)
    monkeypatch.undo()
    assert_file_intact(copy)


def test_lmdb_readonly_error_on_write_is_read_only_error():
    err = st.translate_error(lmdb.ReadonlyError("mdb_txn_begin: Permission denied"), "x.ndx")
    assert isinstance(err, ReadOnlyError)
    for code in (errno.EROFS, errno.EACCES, errno.EPERM):
        assert isinstance(st.translate_error(OSError(code, os.strerror(code)), "x.ndx"),
                          ReadOnlyError)


# -- the file mapping grows with the file ----------------------------------------


def test_mapping_grows_with_the_file(tmp_path, monkeypatch):
    # Mappings start at MAP_MIN_BYTES and double as the file outgrows them.
    monkeypatch.setattr(pages, "MAP_MIN_BYTES", 64 << 10)
    p = str(tmp_path / "grow.ndx")
    rng = np.random.default_rng(3)
    added = []
    with Index.create(p, k=K, expected_n=100_000, background_compaction=False) as index:
        first = index._store.filemap._map_bytes
        for i in range(6):
            batch = rng.integers(0, 2**64, 10_000, dtype=np.uint64)
            index.add(batch, keys=[f"{i}/{j}" for j in range(len(batch))])
            added.append(batch)
            if i % 2:
                index.compact(full=i == 5)
            assert [m.fingerprint for m in index.query(int(batch[7]), 0)] == [int(batch[7])]
        assert index._store.filemap._map_bytes >= 8 * first
        index.verify()
    added = np.unique(np.concatenate(added))
    with Index.open(p, readonly=True) as index:
        assert np.array_equal(index.fingerprints(), added)
        assert index.keys(int(batch[5])) == ("5/5",)


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from ndindex.index import Index
    with Index.open(sys.argv[1], background_compaction=False) as ix:
        rng = np.random.default_rng(4)
        for _ in range(6):
            ix.add(rng.integers(0, 2**64, 40_000, dtype=np.uint64))
        ix.compact()
        ix.add([777])
""")


def test_reader_follows_a_file_grown_by_another_process(path, monkeypatch):
    monkeypatch.setattr(pages, "MAP_MIN_BYTES", 64 << 10)
    fps = stored_fingerprints()
    with Index.open(path, readonly=True) as reader:
        before = reader._store.filemap._map_bytes
        assert [m.fingerprint for m in reader.query(int(fps[0]), 0)] == [int(fps[0])]
        out = subprocess.run([sys.executable, "-c", WRITER, path], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        assert os.path.getsize(path) > before
        assert 777 in reader
        assert len(reader.query_many(fps, k=0)) == len(fps)
        assert len(reader) == len(fps) + 240_000 + 1
        reader.verify()


# -- full disk -------------------------------------------------------------------


@pytest.mark.parametrize("error", [lmdb.DiskError("mdb_txn_commit: No space left on device"),
                                   lmdb.MapFullError("mdb_put: MDB_MAP_FULL"),
                                   lmdb.Error("mdb_txn_commit: File too large")],
                         ids=["ENOSPC", "map-full", "EFBIG"])
def test_full_disk_at_commit_raises_capacity_error_and_loses_nothing(path, monkeypatch, error):
    # The commit is where LMDB writes its pages: the error is injected there
    # (WriteTxn's last step), for an add, a remove, a transaction, a
    # compaction and a full compaction.
    index = Index.open(path, background_compaction=False)
    real = st.WriteTxn.put_framed

    def full(self, key, payload):
        if key == rec.KEY_STATE:
            raise error
        return real(self, key, payload)

    monkeypatch.setattr(st.WriteTxn, "put_framed", full)
    for call in (lambda: index.add([1, 2, 3], keys=["a", "b", "c"]), lambda: index.add([4]),
                 lambda: index.remove(stored_fingerprints()[:5]), lambda: index.compact(),
                 lambda: index.compact(full=True), lambda: _in_transaction(index)):
        with pytest.raises(CapacityError):
            call()
        monkeypatch.setattr(st.WriteTxn, "put_framed", real)
        assert_intact(index)
        monkeypatch.setattr(st.WriteTxn, "put_framed", full)
    monkeypatch.undo()
    index.add([1, 2, 3], keys=["a", "b", "c"])
    assert index.keys(2) == ("b",)
    index.close()


def test_a_background_compaction_on_a_full_disk_neither_stalls_writes_nor_hides(
        path, monkeypatch, caplog):
    # The disk fills up under the compactor's commits (they write the
    # manifest; add() commits do not).  Waiting for a compactor that cannot
    # progress held every add() 40 ms (STOP_WAIT_SECONDS), and only a later
    # compact() said why.  Now the writer goes on, stats() and the log say
    # why, the thread retries less and less often, and once the disk has
    # room compact() does what is owed: nothing was lost.
    import threading
    import time

    from ndindex import compaction
    real = st.WriteTxn.put_framed

    def full(self, key, payload):
        if key == rec.KEY_MANIFEST:
            raise lmdb.DiskError("mdb_txn_commit: No space left on device")
        return real(self, key, payload)

    monkeypatch.setattr(st.WriteTxn, "put_framed", full)
    index = Index.open(path, log_limit=100)
    comp = index._compactor
    waits = []

    class Watched(type(comp._progress)):
        def wait(self, timeout=None):
            waits.append(timeout)
            return super().wait(timeout)

    comp._progress = Watched()
    rng = np.random.default_rng(5)
    added = [rng.integers(0, 2**64, 50, dtype=np.uint64)]
    index.add(added[0])
    deadline = time.monotonic() + 30
    while comp.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(comp.error, CapacityError)
    began = time.monotonic()
    for _ in range(40):  # 2,000 operations: 20x log_limit, past the stop line
        added.append(rng.integers(0, 2**64, 50, dtype=np.uint64))
        index.add(added[-1])
    assert waits == []  # no add() waited for the compactor
    assert index.stats()["compaction_error"].startswith("CapacityError: ")
    time.sleep(1.2)
    # Tries at 0.5 s, then 1 s, 2 s ... after each failure, however many
    # writes came: at most three in the 1.2 s or so since the first.
    elapsed = time.monotonic() - began
    assert 1 <= comp.failures <= 2 + int(np.log2(1 + elapsed / compaction.IDLE_WAIT_SECONDS))
    failed = [r for r in caplog.records if "background compaction failed" in r.getMessage()]
    assert len(failed) == 1 and "No space left on device" in failed[0].getMessage()
    assert threading.active_count() >= 2 and comp._thread.is_alive()

    monkeypatch.setattr(st.WriteTxn, "put_framed", real)  # room again
    index.compact()
    assert index.stats()["compaction_error"] is None and comp.failures == 0
    assert index.stats()["log_entries"] == 0
    everything = np.union1d(stored_fingerprints(), np.concatenate(added))
    assert np.array_equal(index.fingerprints(), everything)
    index.verify()
    index.close()


def test_an_untyped_failure_of_background_compaction_is_logged_with_its_traceback(
        path, monkeypatch, caplog):
    # An error of no ndindex type in a background step is a bug: its
    # traceback goes to the log, for a report; the thread carries on.
    import time

    from ndindex import compaction

    def broken(self, snap, force_flush, full):
        raise RuntimeError("a bug in a step")
    monkeypatch.setattr(compaction.Compactor, "_step", broken)
    index = Index.open(path, log_limit=100)
    index.add(np.arange(1000, 1300, dtype=np.uint64))
    deadline = time.monotonic() + 30
    while index._compactor.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert index.stats()["compaction_error"] == "RuntimeError: a bug in a step"
    [record] = [r for r in caplog.records if "background compaction failed" in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
    assert index._compactor._thread.is_alive()
    with pytest.raises(RuntimeError, match="a bug in a step"):
        index.compact()  # compact() meets it itself
    monkeypatch.undo()
    index.compact()
    assert index.stats()["compaction_error"] is None and len(index) == 500 + 300
    index.close()


@pytest.mark.parametrize("durability", ["full", "normal"])
@pytest.mark.parametrize("how", ["deleted", "moved", "replaced"])
def test_writes_to_an_index_whose_file_was_deleted_or_moved_raise_read_only_error(
        path, tmp_path, durability, how):
    # The open file no longer bears its name: writes went on and were
    # acknowledged into a file no later open finds (a deleted one: gone at
    # close), and a full compaction raised FileNotFoundError.  Now every
    # write refuses, as SQLite's SQLITE_READONLY_DBMOVED does; reads go on,
    # and vacuum_into saves the content.
    index = Index.open(path, durability=durability)
    moved = str(tmp_path / "moved.ndx")
    if how == "deleted":
        os.unlink(path)
    else:
        os.rename(path, moved)
        if how == "replaced":  # by another index (made elsewhere: LMDB knows the name open)
            with Index.create(tmp_path / "other.ndx", k=K, expected_n=100):
                pass
            os.rename(tmp_path / "other.ndx", path)
    for call in (lambda: index.add([12345]), lambda: index.remove([int(stored_fingerprints()[0])]),
                 lambda: index.check_and_add(777), lambda: _in_transaction(index),
                 lambda: index.compact(), lambda: index.compact(full=True), index.vacuum):
        with pytest.raises(ReadOnlyError, match="deleted, moved or replaced since it was opened"):
            call()
    assert_intact(index)  # reads go on
    index.vacuum_into(tmp_path / "saved.ndx")
    index.close()
    assert_file_intact(str(tmp_path / "saved.ndx"))
    if how == "deleted":
        assert not os.path.exists(path)
    else:
        assert_file_intact(moved)
    if how == "replaced":
        with Index.open(path, readonly=True) as other:
            assert len(other) == 0


def _in_transaction(index):
    with index.transaction():
        index.add([9, 10])
        index.remove([int(stored_fingerprints()[1])])


def test_full_disk_for_the_lock_file_raises_capacity_error(path, monkeypatch):
    # LMDB maps its lock file; if the disk cannot back it, the first store
    # into the mapping is SIGBUS.  The store writes the file's bytes first,
    # so ENOSPC arrives as an error, here injected at that write.
    os.unlink(path + "-lock")
    real = os.pwrite

    def no_space(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(st.os, "pwrite", no_space)
    for readonly in (True, False):
        with pytest.raises(CapacityError):
            Index.open(path, readonly=readonly)
    with pytest.raises(CapacityError):
        Index.create(os.path.join(os.path.dirname(path), "new.ndx"))
    assert not os.path.exists(os.path.join(os.path.dirname(path), "new.ndx"))
    monkeypatch.setattr(st.os, "pwrite", real)
    assert_file_intact(path)


def test_a_lock_file_that_cannot_be_opened_is_named_in_the_error(path):
    os.unlink(path + "-lock")
    os.mkdir(path + "-lock")                # a directory where LMDB's lock file goes
    for readonly in (True, False):
        with pytest.raises(NdindexError, match=re.escape(f"{path}-lock: Is a directory")):
            Index.open(path, readonly=readonly)
    os.rmdir(path + "-lock")
    assert_file_intact(path)


def test_full_disk_for_a_journal_raises_capacity_error(path, monkeypatch):
    index = Index.open(path, durability="normal", background_compaction=False)
    try:
        real = jr._core.write_with_gil  # the journal's write()

        def short(fd, data):
            if fd == index._writer.journal._file.fd:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(jr._core, "write_with_gil", short)
        with pytest.raises(CapacityError):
            index.add([31337])
        monkeypatch.setattr(jr._core, "write_with_gil", real)
        # Not acknowledged, so not applied: never visible, never committed later.
        assert 31337 not in index
        index.add([4242])
    finally:
        monkeypatch.undo()
        index.close()
    with Index.open(path, readonly=True) as index:
        assert 31337 not in index and 4242 in index
    with Index.open(path, background_compaction=False) as index:
        index.remove([4242])
        assert_intact(index)



def test_a_short_journal_write_leaves_no_torn_record_before_later_ones(path, monkeypatch):
    # A short write (the disk filled during it) left half a record at the
    # journal's end; the records appended after it, acknowledged, followed
    # the torn one, where a replay after a crash stops.
    from ndindex.records import LogRecord
    index = Index.open(path, durability="normal", background_compaction=False)
    try:
        journal = index._writer.journal
        real = jr._core.write_with_gil

        def half(fd, data):
            return real(fd, data[:len(data) // 2]) if fd == journal._file.fd else real(fd, data)

        monkeypatch.setattr(jr._core, "write_with_gil", half)
        with pytest.raises(CapacityError):
            index.add([31337])
        monkeypatch.setattr(jr._core, "write_with_gil", real)
        index.add([4242])
        with open(journal.path, "rb") as f:
            records = list(jr._records(f.read(), journal.journal_id, journal.generation))
        replayed = np.concatenate([LogRecord.unpack(p, b"j").adds for _, p in records])
        assert 4242 in replayed.tolist() and 31337 not in replayed.tolist()
    finally:
        monkeypatch.undo()
        index.close()
    with Index.open(path, readonly=True) as index:
        assert 31337 not in index and 4242 in index


@pytest.mark.parametrize("call", ["add", "remove", "check_and_add_many", "transaction"])
def test_an_interrupt_inside_a_normal_durability_write_leaves_all_or_nothing(path, monkeypatch,
                                                                           call):
    # Ctrl-C (KeyboardInterrupt) lands between any two calls: here halfway
    # through applying a journaled record to the pending set.  Half the
    # record stayed pending, visible, and the next checkpoint committed that
    # half.  The journal took the whole record: the call happened, whole.
    from ndindex import overlay
    index = Index.open(path, durability="normal", background_compaction=False)
    try:
        before = index.fingerprints()
        batch = np.arange(10**12, 10**12 + 400, dtype=np.uint64) * np.uint64(7919)
        if call == "remove":
            index.add(batch)
            before = index.fingerprints()
        real_apply, real_add_array = overlay.PendingOps.apply, overlay.PendingOps.add_array
        interrupted = []

        def halfway(self, record):
            if interrupted:
                return real_apply(self, record)
            interrupted.append(True)
            self.remove(record.removes[:len(record.removes) // 2].tolist())
            real_add_array(self, record.adds[:len(record.adds) // 2])
            raise KeyboardInterrupt

        def halfway_append(self, record):  # a transaction's end: the journal write itself
            interrupted.append(True)
            real_append(self, record)
            raise KeyboardInterrupt

        if call == "transaction":
            from ndindex import writer
            real_append = writer.Writer._append_journal
            monkeypatch.setattr(writer.Writer, "_append_journal", halfway_append)
        else:
            monkeypatch.setattr(overlay.PendingOps, "apply", halfway)
        with pytest.raises(KeyboardInterrupt):
            if call == "add":
                index.add(batch)
            elif call == "remove":
                index.remove(batch)
            elif call == "check_and_add_many":
                index.check_and_add_many(batch)
            else:
                with index.transaction():
                    for fp in batch.tolist():
                        index.check_and_add(fp)
        monkeypatch.undo()
        assert interrupted
        want = np.setdiff1d(before, batch) if call == "remove" else np.union1d(before, batch)
        assert np.array_equal(index.fingerprints(), want)
        index.sync()
        assert np.array_equal(index.fingerprints(), want)
    finally:
        monkeypatch.undo()
        index.close()
    with Index.open(path, readonly=True) as index:
        assert np.array_equal(index.fingerprints(), want)

@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("call", ["add", "remove"])
def test_a_second_interrupt_while_the_pending_set_is_rebuilt_leaves_all_or_nothing(
        path, monkeypatch, call):
    # After an interrupt halfway through a record, the pending set is rebuilt
    # from the journal; a second Ctrl-C in that rebuild (the sweep's come
    # every 5-80 ms) left the half-applied set in place: an add applied in
    # part (sweep_interrupt, seed 12 run 73).  Both interrupts are real
    # SIGINTs here, the second sent from inside the rebuild.
    import signal
    from ndindex import overlay
    index = Index.open(path, durability="normal", background_compaction=False)
    try:
        batch = np.arange(10**12, 10**12 + 400, dtype=np.uint64) * np.uint64(7919)
        if call == "remove":
            index.add(batch)
        before = index.fingerprints()
        real_apply, real_add_array = overlay.PendingOps.apply, overlay.PendingOps.add_array
        calls = []

        def interrupted(self, record):
            calls.append(True)
            self.remove(record.removes[:len(record.removes) // 2].tolist())
            real_add_array(self, record.adds[:len(record.adds) // 2])
            os.kill(os.getpid(), signal.SIGINT)       # lands at the next line's bytecode
            real_apply(self, record)

        monkeypatch.setattr(overlay.PendingOps, "apply", interrupted)
        with pytest.raises(KeyboardInterrupt):
            index.add(batch) if call == "add" else index.remove(batch)
        monkeypatch.undo()
        assert len(calls) >= 2          # the call's record, then the rebuild's
        want = np.setdiff1d(before, batch) if call == "remove" else np.union1d(before, batch)
        assert np.array_equal(index.fingerprints(), want)
        index.sync()
    finally:
        monkeypatch.undo()
        index.close()
    with Index.open(path, readonly=True) as index:
        assert np.array_equal(index.fingerprints(), want)


@pytest.mark.usefixtures("sigint_raises")
def test_an_interrupt_as_a_transaction_ends_leaves_it_whole_or_undone_for_good(
        path, monkeypatch):
    # Ctrl-C between the end of a durability="normal" block and its journal
    # record left the block's additions pending and visible, in no journal:
    # the rebuild after the next interrupted call dropped them, after they
    # had been seen (sweep_interrupt seed 17, run 95: a transaction's 5,000
    # additions gone).  Both interrupts are real SIGINTs.
    from ndindex import journal, overlay, writer
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 3600.0)   # no checkpoint between
    index = Index.open(path, durability="normal", background_compaction=False)
    try:
        block = np.unique(np.random.default_rng(95).integers(0, 2**64, 300, dtype=np.uint64))
        before = index.fingerprints()
        monkeypatch.setattr(writer, "_difference", _then_ctrl_c(writer._difference))
        with pytest.raises(KeyboardInterrupt):
            with index.transaction():
                for fp in block.tolist():
                    index.check_and_add(fp)
        monkeypatch.undo()
        monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 3600.0)
        seen = index.fingerprints()
        assert np.array_equal(seen, np.union1d(before, block)) or np.array_equal(seen, before)
        # Then an add interrupted halfway through the pending set: rebuilt
        # from the journal.
        monkeypatch.setattr(overlay.PendingOps, "apply", _then_ctrl_c(overlay.PendingOps.apply))
        with pytest.raises(KeyboardInterrupt):
            index.add([5 << 50])
        monkeypatch.undo()
        want = np.union1d(seen, np.array([5 << 50], dtype=np.uint64))
        assert np.array_equal(index.fingerprints(), want)
    finally:
        monkeypatch.undo()
        index.close()
    with Index.open(path, readonly=True) as index:
        assert np.array_equal(index.fingerprints(), want)


@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("durability", ["full", "normal"])
@pytest.mark.parametrize("where", ["as the end starts", "as the first function after the block starts"])
def test_an_interrupt_as_a_transaction_ends_leaves_no_transaction_behind(
        path, monkeypatch, durability, where):
    # A real SIGINT at the start of the transaction's end, or as the first
    # Python function after the block's last line starts (before its end
    # held Ctrl-C back, when the end was a contextlib generator): the writer
    # was left with a pending set no commit would take (full durability) or
    # counting the block for ever, and every later call stayed pending,
    # acknowledged, never committed (sweep_interrupt seed 18).  The block
    # happens whole or not at all; the writer goes on.
    import signal
    import sys
    from ndindex import writer
    index = Index.open(path, durability=durability, background_compaction=False)
    try:
        before = index.fingerprints()
        block = np.unique(np.random.default_rng(18).integers(0, 2**64, 50, dtype=np.uint64))
        if where == "as the end starts":
            real_end = writer.Writer._end_transaction

            def end_after_ctrl_c(self):
                os.kill(os.getpid(), signal.SIGINT)
                return real_end(self)

            monkeypatch.setattr(writer.Writer, "_end_transaction", end_after_ctrl_c)
        hook = ctrl_c_at_call()
        with pytest.raises(KeyboardInterrupt):
            with index.transaction():
                index.add(block)
                if where != "as the end starts":
                    sys.setprofile(hook)
        sys.setprofile(None)
        monkeypatch.undo()
        assert where == "as the end starts" or hook.sent == ["_end_block"]
        assert not index._writer.in_transaction
        seen = index.fingerprints()
        assert np.array_equal(seen, np.union1d(before, block)) or np.array_equal(seen, before)
        index.add([7 << 52])
        want = np.union1d(seen, np.array([7 << 52], dtype=np.uint64))
        assert np.array_equal(index.fingerprints(), want)
    finally:
        monkeypatch.undo()
        index.close()
    with Index.open(path, readonly=True) as index:
        assert np.array_equal(index.fingerprints(), want)


_CRASH_AFTER_A_ROTATION = textwrap.dedent("""
    import os, sys
    import ndindex.journal as jr
    from ndindex.index import Index
    jr.ROTATE_BYTES = 1                   # every checkpoint rotates the journal
    index = Index.open(sys.argv[1], durability="normal", background_compaction=False)
    index.add([1 << 42])
    index.sync()                          # a checkpoint, and a rotation
    index.add([2 << 42])                  # acknowledged: in the journal
    os._exit(0)                           # a crash: no close, no checkpoint
""")


def test_operations_journaled_after_a_rotation_survive_a_crash(path):
    # A rotation rewrote the journal's header with pwrite() on its O_APPEND
    # descriptor: Linux appended it after the old header, every read took
    # the old generation, and the records appended since were unreadable:
    # a crash lost them, against what durability="normal" promises.
    done = subprocess.run([sys.executable, "-c", _CRASH_AFTER_A_ROTATION, path],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    with Index.open(path) as index:       # replays the dead writer's journal
        assert (1 << 42) in index and (2 << 42) in index


@pytest.mark.usefixtures("sigint_raises")
def test_an_interrupt_inside_a_checkpoint_loses_no_acknowledged_operation(path, monkeypatch):
    # A checkpoint commits the pending set, then moves the journal's offsets
    # (rotating a large journal).  Ctrl-C between the two left _checkpointed
    # past the rotated journal's end, and the rebuild after the next
    # interrupted call read nothing from it: the operations acknowledged
    # since were lost (sweep_interrupt, seed 14 run 44).
    from ndindex import overlay
    monkeypatch.setattr(jr, "ROTATE_BYTES", 1)
    index = Index.open(path, durability="normal", background_compaction=False)
    try:
        real_rotate = jr.Journal.rotate_if_large
        # Ctrl-C lands before the offset is set.
        monkeypatch.setattr(jr.Journal, "rotate_if_large", _then_ctrl_c(real_rotate))
        index.add([1 << 41])
        try:
            index.sync()                             # the checkpoint
        except KeyboardInterrupt:
            pass
        monkeypatch.setattr(jr.Journal, "rotate_if_large", real_rotate)
        index.add([2 << 41])                         # acknowledged after the rotation
        real_apply = overlay.PendingOps.apply

        def halfway(self, record):                   # the next call, interrupted: a rebuild
            monkeypatch.setattr(overlay.PendingOps, "apply", real_apply)
            raise KeyboardInterrupt

        monkeypatch.setattr(overlay.PendingOps, "apply", halfway)
        with pytest.raises(KeyboardInterrupt):
            index.add([3 << 41])
        monkeypatch.undo()
        got = {int(x) for x in index.fingerprints()} & {1 << 41, 2 << 41, 3 << 41}
        assert {1 << 41, 2 << 41} <= got
        index.sync()
    finally:
        monkeypatch.undo()
        index.close()
    with Index.open(path, readonly=True) as index:
        assert (1 << 41) in index and (2 << 41) in index


FILE_SIZE_LIMITED_WRITER = textwrap.dedent("""
    import os, resource, signal, sys
    import numpy as np
    from ndindex import CapacityError
    from ndindex.index import Index
    path = sys.argv[1]
    # With SIGXFSZ ignored, a write past RLIMIT_FSIZE fails (EFBIG or a short
    # write) instead of killing the process: a full disk in miniature.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = os.path.getsize(path) + (512 << 10)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    ix = Index.open(path, background_compaction=False, log_limit=30_000)
    rng = np.random.default_rng(8)
    for b in range(1000):
        try:
            ix.add(rng.integers(0, 2**64, 4000, dtype=np.uint64) | np.uint64(1))
        except CapacityError as exc:
            print("full", b, exc, flush=True)
            break
        print("ok", b, flush=True)
    for call in (ix.compact, lambda: ix.compact(full=True)):
        try:
            call()
            print("compacted", flush=True)
        except CapacityError:
            print("compact full", flush=True)
    ix.close()
""")


def test_file_size_limit_raises_capacity_error_and_keeps_committed_adds(path):
    out = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMITED_WRITER, path],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("full") for line in lines), lines[-3:]
    acked = [int(line.split()[1]) for line in lines if line.startswith("ok ")]
    assert acked, lines
    rng = np.random.default_rng(8)
    batches = [rng.integers(0, 2**64, 4000, dtype=np.uint64) | np.uint64(1) for _ in acked]
    with Index.open(path, background_compaction=False) as index:
        index.verify()
        for batch in batches:
            assert len(index.query_many(batch, k=0)) == len(np.unique(batch))
        fps = stored_fingerprints()
        assert len(index.query_many(fps, k=0)) == len(fps)
        assert index.keys(int(fps[0])) == ("t0",)
        # Without the limit the same file takes writes again.
        index.add([5, 6])
        index.compact()
        assert 5 in index
        index.verify()


TMPFS_CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from ndindex import CapacityError
    from ndindex.index import Index
    d = sys.argv[1]
    rng = np.random.default_rng(9)
    ix = Index.create(os.path.join(d, "full.ndx"), k=3, expected_n=100_000,
                      background_compaction=False)
    acked = 0
    try:
        for b in range(10_000):
            ix.add(rng.integers(0, 2**64, 5000, dtype=np.uint64))
            acked = b + 1
            if b % 10 == 9:
                ix.compact()
    except CapacityError as exc:
        print("add-full", acked, flush=True)
    try:
        ix.compact(full=True)
        print("compact-ok", flush=True)
    except CapacityError:
        print("compact-full", flush=True)
    ix.close()
    # The disk is full now: opening a reader (whose lock file must be made
    # anew) and creating an index must fail cleanly too.
    os.unlink(os.path.join(d, "full.ndx-lock"))
    filler = os.path.join(d, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 4096):
            pass
    except OSError:
        pass
    os.close(fd)
    for what, call in (("open", lambda: Index.open(os.path.join(d, "full.ndx"), readonly=True)),
                       ("create", lambda: Index.create(os.path.join(d, "new.ndx")))):
        try:
            call().close()
            print(what, "ok", flush=True)
        except CapacityError:
            print(what, "full", flush=True)
    os.unlink(filler)
    print("acked", acked, flush=True)
""")


@pytest.fixture
def tmpfs(tmp_path):
    """A 4 MiB tmpfs mounted at a fresh directory (skip if this process may not mount)."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield str(d)
    finally:
        subprocess.run(["umount", str(d)], check=False)


def test_full_tmpfs_raises_capacity_error_never_a_signal(tmpfs):
    out = subprocess.run([sys.executable, "-c", TMPFS_CHILD, tmpfs], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    lines = out.stdout.splitlines()
    assert lines[0].startswith("add-full"), lines
    assert "open full" in lines and "create full" in lines, lines
    assert not os.path.exists(os.path.join(tmpfs, "new.ndx"))
    acked = int(lines[-1].split()[1])
    rng = np.random.default_rng(9)
    batches = [rng.integers(0, 2**64, 5000, dtype=np.uint64) for _ in range(acked)]
    with Index.open(os.path.join(tmpfs, "full.ndx"), readonly=True) as index:
        index.verify()
        for batch in batches:
            assert len(index.query_many(batch, k=0)) == len(np.unique(batch))


def test_errors_are_ndindex_errors():
    for cls in (CapacityError, ClosedError, FormatError, ReadOnlyError):
        assert issubclass(cls, NdindexError)
    assert ndindex.NdindexError is NdindexError


def test_running_out_of_address_space_is_a_capacity_error(tmp_path):
    # Each open index reserves 1 TiB of address space for LMDB's map: the
    # open after the last that fits is a CapacityError that says so, and
    # the indexes already open go on working.
    from ndindex import store
    opened = []
    try:
        with pytest.raises(CapacityError, match="address space") as err:
            for i in range(store.MAX_OPEN_INDEXES + 64):
                opened.append(Index.create(tmp_path / f"{i}.ndx", k=3, expected_n=100,
                                           background_compaction=False))
                opened[-1].add([i])
        if len(opened) == store.MAX_OPEN_INDEXES + 64:
            pytest.skip("this machine has more address space (5-level paging?)")
        assert f"about {store.MAX_OPEN_INDEXES}" in str(err.value)
        assert len(opened) >= store.MAX_OPEN_INDEXES // 2
        assert opened[0].query(0, 0)[0].fingerprint == 0 and 1 in opened[1]
    finally:
        for ix in opened:
            ix.close()


def test_a_full_reader_table_frees_dead_readers_or_says_what_is_full(path, monkeypatch):
    import lmdb
    from ndindex import store
    from ndindex.errors import CapacityError
    with Index.open(path, readonly=True) as ix:
        want = ix.query(1)
        env = ix._store.env
        real_begin = env.begin
        calls = []

        class Env:   # LMDB's table full once; then, freed slots or not
            def __getattr__(self, name):
                return getattr(env, name)

            def begin(self, **kw):
                calls.append(1)
                if len(calls) == 1:
                    raise lmdb.ReadersFullError("MDB_READERS_FULL")
                return real_begin(**kw)

            def reader_check(self):
                return 1
        monkeypatch.setattr(ix._store, "_env", Env())
        ix._snap = None
        assert ix.query(1) == want and len(calls) == 2   # freed one slot, began again

        class Full(Env):
            def begin(self, **kw):
                raise lmdb.ReadersFullError("MDB_READERS_FULL")

            def reader_check(self):
                return 0
        monkeypatch.setattr(ix._store, "_env", Full())
        ix._snap = None
        with pytest.raises(CapacityError, match=f"{store.MAX_READERS} snapshots are open"):
            ix.query(1)
        monkeypatch.setattr(ix._store, "_env", env)


def test_ctrl_c_as_a_vacuum_closes_the_old_file_waits_for_the_new_one(tmp_path, monkeypatch):
    # A real SIGINT inside the close of the old file's environment: it used
    # to land before the block that reopens, leaving this Index closed
    # (sweep_interrupt.py met it in 1 run of 30).  Held back, it arrives as
    # KeyboardInterrupt once the new file is open.
    import signal
    # Python's own handler, whatever this process inherited: a shell's
    # background job (CI's) starts with SIGINT ignored.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _vacuum_under_ctrl_c(tmp_path, monkeypatch)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # put back
    finally:
        signal.signal(signal.SIGINT, inherited)


def _vacuum_under_ctrl_c(tmp_path, monkeypatch):
    path = str(tmp_path / "v.ndx")
    fps = np.unique(np.random.default_rng(22).integers(0, 2**64, 5_000, dtype=np.uint64))
    with Index.create(path, k=3, expected_n=5_000, background_compaction=False) as ix:
        ix.add(fps)
        ix.remove(fps[:2_000])
        monkeypatch.setattr(st.Store, "close", _then_ctrl_c(st.Store.close))   # as close returns
        with pytest.raises(KeyboardInterrupt):
            ix.vacuum()
        monkeypatch.undo()
        assert np.array_equal(ix.fingerprints(), fps[2_000:])
        ix.add([42])
        assert 42 in ix and ix.verify()["table_entries"] >= 0


@pytest.mark.parametrize("where", ["before the rename", "after the rename", "in the reopen"])
def test_an_interrupt_in_a_vacuum_leaves_the_index_open_and_whole(tmp_path, monkeypatch, where):
    # vacuum closes the file's environment, renames the copy over it and
    # opens it again: an exception in between (Ctrl-C) left this Index
    # closed, every later call raising ClosedError.
    from ndindex import index_maintenance
    path = str(tmp_path / "v.ndx")
    rng = np.random.default_rng(21)
    fps = np.unique(rng.integers(0, 2**64, 20_000, dtype=np.uint64))
    ix = Index.create(path, k=3, expected_n=20_000, background_compaction=False)
    try:
        ix.add(fps)
        ix.remove(fps[:10_000])
        ix.compact()  # not full=True: it gives the free pages back, leaving vacuum none
        real = os.replace

        def interrupted(src, dst):
            if where == "after the rename":
                real(src, dst)
            raise KeyboardInterrupt

        real_reopen = index_maintenance.MaintenanceMethods._reopen_store
        reopens = []

        def reopen_interrupted_once(self, path):
            reopens.append(path)
            if len(reopens) == 1:
                raise KeyboardInterrupt  # in its fsync or its open, as the sweep met it
            real_reopen(self, path)

        if where == "in the reopen":
            monkeypatch.setattr(index_maintenance.MaintenanceMethods, "_reopen_store",
                                reopen_interrupted_once)
        else:
            monkeypatch.setattr(index_maintenance.os, "replace", interrupted)
        with pytest.raises(KeyboardInterrupt):
            ix.vacuum()
        monkeypatch.undo()
        assert np.array_equal(ix.fingerprints(), fps[10_000:])
        ix.add([42])
        ix.vacuum()
        assert 42 in ix and len(ix) == len(fps) - 10_000 + 1
    finally:
        monkeypatch.undo()
        ix.close()
    assert not [n for n in os.listdir(tmp_path) if "vacuum" in n or "copying" in n]
    with Index.open(path, readonly=True) as again:
        assert len(again) == len(fps) - 10_000 + 1
        again.verify()


def test_a_second_open_in_one_process_says_the_index_is_open_already(path):
    # LMDB opens a file once per process; py-lmdb's message named the
    # environment, not what to do (re-running a notebook cell meets it).
    first = Index.open(path, readonly=True)
    try:
        stored = first.fingerprints()
        with pytest.raises(NdindexError, match="has the index open already.*close it first"):
            Index.open(path)
        assert len(stored) and np.array_equal(first.fingerprints(), stored)  # the first goes on
    finally:
        first.close()
    with Index.open(path) as again:  # once closed, it opens
        assert_intact(again)


@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("piece", ["journal", "checkpoint thread", "compactor", "exit hook"])
def test_ctrl_c_while_a_writer_opens_leaves_no_journal_lock_or_thread_behind(
        path, monkeypatch, piece):
    """A real SIGINT right after each piece a writable open makes (the
    normal-durability journal, its checkpoint thread, the compactor and its
    thread, the exit hook): the open raises KeyboardInterrupt and takes back
    what it made.  An Index that never came to be left its journal locked
    and its threads running for the life of the process: the journal was
    never deleted (orphans() skips a locked one) and the threads worked on
    a closed file."""
    import threading

    from ndindex import compaction, index as index_module, writer as writer_module
    targets = {"journal": (jr, "Journal"), "checkpoint thread": (writer_module, "start_thread"),
               "compactor": (compaction, "Compactor"), "exit hook": (index_module, "_close_at_exit")}
    module, name = targets[piece]
    monkeypatch.setattr(module, name, _then_ctrl_c(getattr(module, name)))
    with pytest.raises(KeyboardInterrupt):
        Index.open(path, durability="normal", log_limit=100)
    monkeypatch.undo()
    time_left = 10.0
    while time_left > 0 and any(t.name.startswith("ndindex-") and t.is_alive()
                                for t in threading.enumerate()):
        time.sleep(0.05)   # a stopped thread ends at its next wake-up
        time_left -= 0.05
    assert [t.name for t in threading.enumerate() if t.name.startswith("ndindex-")] == []
    assert glob.glob(glob.escape(path) + ".journal-*") == []
    with Index.open(path, durability="normal", log_limit=100) as index:
        index.add([7 << 50])
    assert glob.glob(glob.escape(path) + ".journal-*") == []
    with Index.open(path, readonly=True) as index:
        assert index.query(7 << 50, k=0)


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_as_vacuum_claims_its_build_name_leaves_the_name_free(ix, monkeypatch):
    """A real SIGINT at the first point Python can run its handler after
    vacuum claims its copy's name (an flock): vacuum read self.path (a
    property) between the claim and the try that lets it go, and the name
    stayed held, so this process's next vacuum waited for itself and failed
    ("another process is creating it")."""
    import signal
    claimed = []
    claim = st.claim_build

    def claim_and_note(*args):
        fd = claim(*args)
        claimed.append(fd)
        return fd

    def profile(frame, event, arg):
        # "call": a Python function starts; "c_return": a C call returned.
        if claimed and event in ("call", "c_return") and frame.f_code is not code:
            sys.setprofile(None)
            os.kill(os.getpid(), signal.SIGINT)

    code = claim_and_note.__code__
    monkeypatch.setattr(st, "claim_build", claim_and_note)
    monkeypatch.setattr(st, "BUILD_WAIT_SECONDS", 1.0)
    ix.remove(stored_fingerprints()[:100])
    ix.compact(full=True)     # (it vacuums too)
    claimed.clear()
    sys.setprofile(profile)
    try:
        with pytest.raises(KeyboardInterrupt):
            ix.vacuum()
    finally:
        sys.setprofile(None)
    assert claimed
    ix.vacuum()
    assert np.array_equal(ix.fingerprints(),
                          np.setdiff1d(stored_fingerprints(), stored_fingerprints()[:100]))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("durability", ["full", "normal"])
def test_ctrl_c_as_a_file_is_opened_leaves_no_descriptor_open(path, monkeypatch, durability):
    """A real SIGINT as each os.open of an Index.open returns: the open
    raises KeyboardInterrupt, and no descriptor stays open (one left open
    held its lock for the life of the process: the file map's, the lock
    file's, the open lock's, the journal's).  Then the file opens as ever."""
    import signal
    real_open = os.open
    calls = []

    def counting_open(*args, **kwargs):
        calls.append(args[0])
        return real_open(*args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    Index.open(path, durability=durability).close()
    monkeypatch.undo()
    assert len(calls) >= 4
    for target in range(len(calls)):
        seen = []

        def open_then_sigint(*args, **kwargs):
            fd = real_open(*args, **kwargs)
            seen.append(fd)
            if len(seen) == target + 1:
                os.kill(os.getpid(), signal.SIGINT)
            return fd

        before = _open_fds()
        monkeypatch.setattr(os, "open", open_then_sigint)
        try:
            Index.open(path, durability=durability).close()
        except KeyboardInterrupt:
            pass
        finally:
            monkeypatch.undo()
        assert _open_fds() == before, f"a descriptor left open by a Ctrl-C after os.open #{target + 1}"
    with Index.open(path, durability=durability) as index:
        assert_intact(index)


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_in_close_still_closes_the_writer(path, monkeypatch):
    """A real SIGINT as close() stops the compactor: close() closed the file
    and not the writer, whose journal stayed locked and unread for the life
    of the process (its operations invisible to the next open here) and
    whose thread ran on; a second close() did nothing."""
    import threading

    from ndindex import compaction
    index = Index.open(path, durability="normal")
    index.add([5 << 50, 6 << 50])
    monkeypatch.setattr(compaction.Compactor, "close", _then_ctrl_c(compaction.Compactor.close))
    with pytest.raises(KeyboardInterrupt):
        index.close()
    monkeypatch.undo()
    index.close()
    assert [t.name for t in threading.enumerate() if t.name.startswith("ndindex-")] == []
    assert glob.glob(glob.escape(path) + ".journal-*") == []
    with Index.open(path) as index:
        assert index.query(5 << 50, k=0) and index.query(6 << 50, k=0)


@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("second_raises", [False, True])
def test_interrupts_deferred_hands_on_one_ctrl_c_at_the_end_and_a_second_at_once(second_raises):
    # close() holds Ctrl-C back to its end, and may wait long (for another
    # thread's transaction): a second Ctrl-C breaks that wait.
    import signal

    from ndindex.errors import interrupts_deferred
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred(second_raises=second_raises):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            reached.append("after the first")
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            reached.append("after the second")
    assert reached == (["after the first"] if second_raises
                       else ["after the first", "after the second"])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("sigint_raises")
def test_a_second_ctrl_c_breaks_a_close_waiting_for_a_transaction_in_another_thread(path):
    # (With durability "normal", close() checkpoints the journal under the
    # writer's lock, which the transaction holds.)
    import signal
    import threading
    index = Index.open(path, durability="normal")
    entered, release = threading.Event(), threading.Event()

    def transaction_that_waits():
        with index.transaction():
            index.add([9 << 50])
            entered.set()
            release.wait(60)

    worker = threading.Thread(target=transaction_that_waits)
    worker.start()
    assert entered.wait(30)
    timer = [threading.Timer(t, os.kill, (os.getpid(), signal.SIGINT)) for t in (0.3, 0.6)]
    for t in timer:
        t.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            index.close()
    finally:
        for t in timer:
            t.cancel()
            t.join()
    assert 0.5 < time.monotonic() - started < 30     # not the first Ctrl-C: the second
    release.set()
    worker.join(30)
    index.close()          # the writer's part, which the interrupt cut short
    assert [t.name for t in threading.enumerate() if t.name.startswith("ndindex-")] == []
    with Index.open(path) as again:           # replays the journal kept
        assert again.query(9 << 50, k=0)
    assert glob.glob(glob.escape(path) + ".journal-*") == []


def test_ctrl_c_as_close_begins_in_a_with_block_still_closes(path, monkeypatch):
    # Ctrl-C before close() held it back (as its deferral was set up): the
    # index stayed open at the end of the with block, threads running.
    import threading

    from ndindex import index as index_module
    real, calls = index_module.interrupts_deferred, []

    def interrupted_the_first_time(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    with pytest.raises(KeyboardInterrupt):
        with Index.open(path, durability="normal") as index:
            index.add([8 << 50])
            monkeypatch.setattr(index_module, "interrupts_deferred", interrupted_the_first_time)
    monkeypatch.undo()
    assert "closed" in repr(index)
    assert [t.name for t in threading.enumerate() if t.name.startswith("ndindex-")] == []
    with Index.open(path, readonly=True) as again:
        assert again.query(8 << 50, k=0)


def test_a_with_statement_enters_an_index_with_no_point_for_ctrl_c(path):
    # Index.__enter__ is C: a Python one starts with a point where Python
    # runs a signal handler, and a Ctrl-C there left the opened index
    # unclosed, the with statement never holding it (`ndindex compact
    # --full`: sweep_interrupt_points).  sys.setprofile reports every such
    # point ("call": a Python function starts; "c_return": a C call returned).
    events = []
    index = Index.open(path)
    sys.setprofile(lambda frame, event, arg: events.append((event, frame.f_code.co_name)))
    try:
        with index as entered:
            sys.setprofile(None)
            assert entered is index
    finally:
        sys.setprofile(None)
    assert [e for e in events if e[0] in ("call", "c_return") and e[1] != "<lambda>"] == []


def test_a_with_statement_leaves_an_index_with_close_as_its_first_point(path):
    # Index.__exit__ is C too: a Python one starts with a point before its
    # first line, where a Ctrl-C left the index open.  The first point after
    # the block is close()'s start, where a Ctrl-C makes __exit__ close again.
    events = []
    index = Index.open(path)
    with index:
        sys.setprofile(lambda frame, event, arg: events.append((event, frame.f_code.co_name)))
    sys.setprofile(None)
    calls = [e for e in events if e[0] in ("call", "c_return") and e[1] != "<lambda>"]
    assert calls[0] == ("call", "close") and "closed" in repr(index)


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_as_a_compaction_step_lets_go_of_its_lease_leaves_lease_and_step_lock_free(path):
    """A real SIGINT as the lease's end begins.  As a contextlib generator,
    a Ctrl-C as its __exit__ began left the lease held (no other process
    compacted) while the interrupt's traceback kept the generator alive,
    and the step lock, then taken inside it, too: a close() in that time (a
    with block's exit, as `ndindex compact --full` has it) waited for it for
    ever (sweep_interrupt_points).  Now the end holds Ctrl-C back."""
    import threading

    from ndindex import locks
    index = Index.open(path, background_compaction=False)    # its log: work to do
    hook = ctrl_c_at_call("_let_go_lease")
    closer = threading.Thread(target=index.close, daemon=True)
    try:
        sys.setprofile(hook)
        with pytest.raises(KeyboardInterrupt) as raised:
            index.compact()
        sys.setprofile(None)
        assert hook.sent
        other = os.open(path, os.O_RDWR)
        try:
            assert not locks.held_elsewhere(other, locks.LEASE_BYTE)
        finally:
            os.close(other)
        closer.start()
        closer.join(30)
        assert not closer.is_alive(), "close() waited for the compaction step's lock"
        del raised
    finally:
        sys.setprofile(None)
        index.close()
    with Index.open(path, readonly=True) as again:
        assert_intact(again)
