"""ndindex.threadpool: ThreadPool's results, errors, shutdown, and threads a
Ctrl-C left unrecorded; start_thread against Ctrl-C."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import pytest

from ndindex import threadpool
from ndindex.threadpool import ThreadPool


def test_jobs_return_their_values_and_raise_their_errors():
    pool = ThreadPool(2, "t")
    try:
        jobs = [pool.submit(pow, i, 2) for i in range(20)]
        assert [j.result() for j in jobs] == [i * i for i in range(20)]
        bad = pool.submit(int, "x")
        with pytest.raises(ValueError):
            bad.result()
        with pytest.raises(ValueError):
            bad.result()  # the same outcome again
    finally:
        pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(pow, 2, 2)


def test_no_thread_before_the_first_job_and_jobs_submitted_finish_before_shutdown_ends():
    pool = ThreadPool(2, "t")
    assert pool._threads == []
    done = []
    jobs = [pool.submit(lambda i=i: (time.sleep(0.01), done.append(i))) for i in range(10)]
    pool.shutdown()
    assert sorted(done) == list(range(10)) and all(j.result() for j in jobs)
    assert not any(t.is_alive() for t in pool._threads)


def test_shutdown_ends_its_threads_though_unrecorded_workers_take_stops(monkeypatch):
    # A Ctrl-C inside Thread.start() leaves a worker running that the pool did
    # not record; it takes a stop meant for a recorded one, which then waited
    # forever in close() (tools/sweep_interrupt.py).
    monkeypatch.setattr(threadpool, "STOP_RETRY_SECONDS", 0.05)
    for _ in range(20):
        pool = ThreadPool(2, "t")
        pool.submit(pow, 2, 2).result()
        for _ in range(3):
            threading.Thread(target=threadpool._work, args=(pool._jobs,), daemon=True).start()
        closer = threading.Thread(target=pool.shutdown, daemon=True)
        closer.start()
        closer.join(10)
        assert not closer.is_alive()
        assert not any(t.is_alive() for t in pool._threads)


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_as_a_thread_starts_leaves_it_running(monkeypatch):
    # Thread.start() waits on an Event; a real SIGINT just after its
    # Condition took the lock, as the race has it, left the lock held and
    # the new thread waiting for it in its first step, for ever (and a
    # close() that joins it with it).  start_thread holds the SIGINT back.
    main = threading.get_ident()

    def taken_then_sigint(self):
        self._lock.acquire()
        if threading.get_ident() == main:
            os.kill(os.getpid(), signal.SIGINT)
        return self

    ran = queue.SimpleQueue()
    monkeypatch.setattr(threading.Condition, "__enter__", taken_then_sigint)
    with pytest.raises(KeyboardInterrupt):
        threadpool.start_thread(ran.put, "t", "ran")
        time.sleep(1)       # (not reached: the held-back SIGINT is raised)
    monkeypatch.undo()
    assert ran.get(timeout=10) == "ran"


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_as_a_pool_starts_its_workers_leaves_none_unstopped(monkeypatch):
    # A real SIGINT as the second worker starts: start_thread hands it on as
    # it returns, and the pool, which recorded its workers from the return
    # values, recorded neither, so shutdown() stopped neither and they ran
    # for the life of the process (an interrupted compact's merge workers,
    # tools/sweep_interrupt_points.py).
    start = threading.Thread.start

    def start_then_sigint(self):
        start(self)
        if self.name == "test-pool_1":
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(threading.Thread, "start", start_then_sigint)
    pool = threadpool.ThreadPool(2, "test-pool")
    with pytest.raises(KeyboardInterrupt):
        pool.submit(abs, -1)
    monkeypatch.undo()
    assert pool.submit(abs, -2).result() == 2     # the recorded workers run it
    pool.shutdown(wait=True)
    assert [t.name for t in threading.enumerate() if t.name.startswith("test-pool")] == []
