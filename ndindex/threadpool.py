"""Worker threads that Ctrl-C in the calling thread cannot wedge.

concurrent.futures' ThreadPoolExecutor takes Condition locks in Python code
on the caller's thread: submit() its idle Semaphore's, Future.result() the
Future's.  Ctrl-C landing just after such an acquire, before the with
statement holds the lock, left it held: the worker that finished the job
then waited for it forever in set_result, and so did close() joining the
pool (tools/sweep_interrupt.py: compact() interrupted, close() hung, one
run in about 250).  Here the caller only puts to and gets from
SimpleQueues, whose put and get are single C calls: an interrupt leaves
nothing held, and a job interrupted in its wait still runs to its end.

Wakeup is threading.Event made the same way, and start_thread starts a
thread with Ctrl-C held back (Thread.start() waits on an Event).

The workers are daemon threads, started at the first job: at interpreter
exit they stop where they are, as the compactor's own thread does.
"""

from __future__ import annotations

import contextlib
import queue
import threading

from ndindex.errors import interrupts_deferred

_STOP = object()
#: How long shutdown() waits for a worker before it sends one more stop.
STOP_RETRY_SECONDS = 0.5


class Job:
    """One submitted call: result() waits for it (Ctrl-C interrupts the wait,
    not the job) and returns its value or raises its exception."""

    __slots__ = ("_done", "_outcome")

    def __init__(self):
        self._done = queue.SimpleQueue()
        self._outcome = None

    def result(self):
        if self._outcome is None:
            self._outcome = self._done.get()
        ok, value = self._outcome
        if ok:
            return value
        raise value


class ThreadPool:
    """submit(fn, *args) -> Job on `workers` threads; shutdown() ends them."""

    def __init__(self, workers: int, name: str):
        self._jobs = queue.SimpleQueue()
        self._shut = False
        self._workers, self._name = workers, name
        self._threads: list = []
        self._lock = threading.Lock()

    def submit(self, fn, *args) -> Job:
        job = Job()
        with self._lock:  # a C lock: its with statement cannot be cut in two
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if not self._threads:  # at the first job: a writer that never merges starts none
                for i in range(self._workers):
                    start_thread(_work, f"{self._name}_{i}", self._jobs, keep=self._threads.append)
            self._jobs.put((job, fn, args))
        return job

    def shutdown(self, wait: bool = True) -> None:
        """Let the jobs submitted so far finish, then end the threads."""
        with self._lock:
            self._shut = True
            threads = self._threads
        for _ in threads:
            self._jobs.put(_STOP)
        if wait:
            for t in threads:
                # A Ctrl-C that cut an earlier start() in two leaves a thread
                # running unrecorded, which may take a stop meant for these
                # (sweep_interrupt: close() joined a worker that never got one).
                t.join(STOP_RETRY_SECONDS)
                while t.is_alive():
                    self._jobs.put(_STOP)
                    t.join(STOP_RETRY_SECONDS)


def start_thread(target, name: str, *args, keep=None) -> threading.Thread:
    """A daemon thread running target(*args), started with Ctrl-C held back;
    keep(thread), if given, records it before the interrupt is handed on
    (``functools.partial(setattr, owner, "_thread")``, say).

    Thread.start() waits until the new thread runs, on an Event: a Ctrl-C
    landing just as that wait's Condition took its lock left the lock held
    (the module doc's race), and the new thread then waited for it for ever
    in its first step, its set() of that Event.  Starting a thread takes a
    fraction of a millisecond; the interrupt is handed on after it, raised
    here: a caller that records the thread from the return value never
    would, and the thread ran on unstopped (an interrupted compact's merge
    workers: sweep_interrupt_points.py), hence keep.
    """
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    with interrupts_deferred():
        thread.start()
        if keep is not None:
            keep(thread)
    return thread


def _work(jobs: queue.SimpleQueue) -> None:
    while True:
        item = jobs.get()
        if item is _STOP:
            return
        job, fn, args = item
        try:
            outcome = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's result()
            outcome = (False, exc)
        job._done.put(outcome)
        del item, job, outcome


class Wakeup:
    """threading.Event's set, clear, is_set and wait, safe against Ctrl-C in
    the thread that sets or waits (the writer's, often the main thread): the
    compactor's wake-up, progress and stop signals, the checkpoint thread's
    stop.

    An Event keeps a Condition whose lock its Python code takes, as a
    Future does (module doc): the writer's post-commit set() of the
    compactor's wake-up left it held once in about 200 interrupt-sweep
    runs, and close() hung.  A waiter that takes the token while the flag
    is set passes one on, so that every waiter wakes.
    """

    def __init__(self):
        self._flag = False
        self._tokens = queue.SimpleQueue()

    def set(self) -> None:
        self._flag = True
        self._tokens.put(None)

    def is_set(self) -> bool:
        return self._flag

    def clear(self) -> None:
        self._flag = False
        with contextlib.suppress(queue.Empty):
            while True:
                self._tokens.get_nowait()

    def wait(self, timeout: float) -> bool:
        """Whether the flag is set, waiting at most timeout seconds for a set()."""
        if self._flag:
            return True
        try:
            self._tokens.get(timeout=timeout)
        except queue.Empty:
            return self._flag
        if self._flag:
            self._tokens.put(None)
        return self._flag
