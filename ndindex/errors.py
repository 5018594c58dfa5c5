"""The exception tree of ndindex.

Callers catch ``NdindexError`` for anything the library raises on purpose;
the subclasses are the conditions a caller can act on.  Misuse (a wrong type,
an out-of-range argument, a missing key) raises the built-in ``TypeError``,
``ValueError`` or ``KeyError`` instead, as the standard library does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading


class NdindexError(Exception):
    """Base class of every error ndindex raises on purpose."""


class FormatError(NdindexError):
    """Not an ndindex file, or a format version this library cannot read."""


class CorruptionError(NdindexError):
    """A checksum failed or a stored value is impossible.

    Attributes name where: ``database`` (the LMDB sub-database or "block"),
    ``key`` (the record's key, or None) and ``offset`` (byte offset inside the
    record, or None).
    """

    def __init__(self, message: str, *, database: str | None = None,
                 key: bytes | None = None, offset: int | None = None):
        where = []
        if database is not None:
            where.append(f"database={database}")
        if key is not None:
            where.append(f"key={key.hex()}")
        if offset is not None:
            where.append(f"offset={offset}")
        super().__init__(message + (f" ({', '.join(where)})" if where else ""))
        self.database = database
        self.key = key
        self.offset = offset


class ClosedError(NdindexError):
    """The index (or its store) was used after close()."""


class CapacityError(NdindexError):
    """The disk is full or the store cannot grow; nothing stored was lost."""


class BusyError(NdindexError, TimeoutError):
    """Another process held the index file exclusively (a vacuum, or an
    in-place upgrade) for longer than the open's ``timeout``; nothing was
    opened or changed.  Try again once it is done."""


class ReadOnlyError(NdindexError):
    """A write was attempted on an index opened read-only."""


@contextlib.contextmanager
def interrupt_kept():
    """Let a KeyboardInterrupt out as itself from a wait on a pool's results.

    Ctrl-C that lands while threading.Condition.wait takes its lock back
    leaves the lock unheld, and the with statement around the wait (a
    Future's result(), an executor's map()) then raises RuntimeError
    "cannot release un-acquired lock" in its place: an error of no ndindex
    type where the caller expects KeyboardInterrupt, and the operation it
    interrupted is undone as for one (tools/sweep_interrupt.py met it).
    """
    try:
        yield
    except RuntimeError as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):
            raise exc.__context__ from None
        raise


def result_of(future):
    """future.result(), a KeyboardInterrupt let out as itself (interrupt_kept):
    for Dask's futures (batch joins); the process pools' own calls go
    through procs.PoolTask."""
    with interrupt_kept():
        return future.result()


@contextlib.contextmanager
def interrupts_deferred(second_raises: bool = False):
    """Hold Ctrl-C (SIGINT) back while the block runs, then hand it to the
    handler that was in place: for the few lines that must not be cut in
    two (vacuum's close of the old file and open of the new).  Signals
    reach the main thread alone; elsewhere the block runs as it is.
    second_raises: a second Ctrl-C is handed on at once, for a block that
    may wait long (close() waits for a transaction in another thread): the
    first lets it finish, the second breaks a wait that would not end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    frames, handler = [], []

    def held(signum, frame):
        frames.append(frame)
        if second_raises and len(frames) == 2 and handler and callable(handler[0]):
            frames.clear()
            handler[0](signum, frame)

    try:
        previous = signal.signal(signal.SIGINT, held)
    except ValueError:              # not the main interpreter
        yield
        return
    handler.append(previous)
    try:
        yield
    finally:
        # None: a handler set outside Python, which cannot be put back.
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        if frames:
            if callable(previous):
                previous(signal.SIGINT, frames[0])
            elif previous != signal.SIG_IGN:       # the default action: end the process
                os.kill(os.getpid(), signal.SIGINT)
