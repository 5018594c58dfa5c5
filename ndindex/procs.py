"""ndindex's worker processes (the pools of documents, batch joins and dedup):
their start method, and calls on them that Ctrl-C cannot wedge.

Never fork: the caller may hold threads and LMDB environments that a forked
child must not inherit.  A fork server where the platform has one (its
children start from a clean process, in milliseconds), else spawn.  In a
child of fork(), spawn: the parent's fork server is not this process's
child, and multiprocessing failed to reach it ("No child processes").

ProcessPoolExecutor takes Python-level locks on the caller's thread and
starts its workers there (``submit``), and ``Future.result()`` waits on a
Condition: Ctrl-C could cut each in two, as threadpool's module doc says of
the thread pools.  ``ndindex dedup --jobs 2`` interrupted at random moments
hung at exit 2 times in 40: a worker process started by an interrupted
submit, never recorded by the executor, so never sent a stop, and joined
for ever.  PoolTask and shutdown hold Ctrl-C back for the calls that do not
wait, and wait where an interrupt leaves nothing held.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import queue

from ndindex.errors import interrupts_deferred

_forked = False


def _after_fork() -> None:
    global _forked
    _forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def forked() -> bool:
    """Whether this process is a child of fork() of a process that imported ndindex."""
    return _forked


def context():
    """The multiprocessing context for a new pool of worker processes."""
    server = "forkserver" in multiprocessing.get_all_start_methods() and not _forked
    return multiprocessing.get_context("forkserver" if server else "spawn")


class WorkersDied(RuntimeError):
    """The pool's worker processes died (BrokenProcessPool), said with the usual cause."""

    @classmethod
    def of(cls, exc: BaseException) -> "WorkersDied":
        # BrokenProcessPool's own words ("terminated abruptly") name no cause:
        # a script without the guard below starts its work again in each
        # worker, which imports it, and multiprocessing ends that worker.
        return cls(f"ndindex's worker processes died ({exc}): a script that starts parallel "
                   "work (workers or jobs above 1) must start it under `if __name__ == "
                   "\"__main__\":` (each worker imports the main module), or pass workers=1; "
                   "else a worker was killed (out of memory?)")


class PoolTask:
    """fn(*args) submitted to a concurrent.futures pool, Ctrl-C held back
    while it is (a few milliseconds at most: submit may start a worker).
    result() waits on a SimpleQueue the future's done-callback fills (one C
    call: an interrupt leaves no lock held and the task runs on), then
    returns the value or raises the error; ask it once."""

    __slots__ = ("future", "_done")

    def __init__(self, pool, fn, *args):
        self._done = queue.SimpleQueue()
        with interrupts_deferred():
            try:
                self.future = pool.submit(fn, *args)
            except concurrent.futures.process.BrokenProcessPool as exc:
                raise WorkersDied.of(exc) from exc
            self.future.add_done_callback(self._done.put)

    def result(self):
        self._done.get()
        with interrupts_deferred():     # done: takes the future's lock, never waits
            try:
                return self.future.result()
            except concurrent.futures.process.BrokenProcessPool as exc:
                raise WorkersDied.of(exc) from exc

    def cancel(self) -> None:
        with interrupts_deferred():
            self.future.cancel()


def shutdown(pool) -> None:
    """pool.shutdown(wait=True, cancel_futures=True), the cancelling (which
    takes queue.Queue's Condition locks) with Ctrl-C held back; the wait
    for the tasks already running stays interruptible."""
    with interrupts_deferred():
        pool.shutdown(wait=False, cancel_futures=True)
    pool.shutdown(wait=True)
