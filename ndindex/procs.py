"""The start method of ndindex's worker processes (documents' and batch joins' pools).

Never fork: the caller may hold threads and LMDB environments that a forked
child must not inherit.  A fork server where the platform has one (its
children start from a clean process, in milliseconds), else spawn.  In a
child of fork(), spawn: the parent's fork server is not this process's
child, and multiprocessing failed to reach it ("No child processes").
"""

from __future__ import annotations

import multiprocessing
import os

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
