"""File descriptors that Ctrl-C cannot leave open.

``fd = os.open(...)`` followed by ``try: ... finally: os.close(fd)`` has a
gap: Python runs a signal handler as a C call returns, so a
KeyboardInterrupt can come after os.open has opened the file and before
the number is bound or the try entered.  The descriptor then stays open
for the life of the process, with any lock taken on it
(tools/sweep_interrupt_points.py: Ctrl-C at each of 400 points of an
Index.open left one at 13, in the file map and the lock-file checks).

A Descriptor owns the number from the moment it exists: the file is opened
with Ctrl-C held back and the number handed at once to an io.FileIO,
which closes it when the Descriptor is closed, at the end of its with
block, or when it is dropped.  The closing on drop is FileIO's own, in
C: a ``__del__`` in Python is code a signal handler can cut short, and the
interrupt raised there is ignored, the descriptor left open.  Dropping is
the backstop for the gap before a try: an exception's traceback keeps its
frames' locals, and so their Descriptors, as long as it lives (a REPL
keeps the last one), so a lock held on one is let go by an explicit
close() on the way out.  Keep the Descriptor, not its number, for as long
as the descriptor is needed.  Regular files only (FileIO refuses a
directory).
"""

from __future__ import annotations

import io
import os

from ndindex import _core
from ndindex.errors import interrupts_deferred

CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class Descriptor:
    """os.open(path, flags | O_CLOEXEC, mode) as .fd, closed with this object."""

    __slots__ = ("fd", "_file")

    def __init__(self, path, flags: int, mode: int = 0o644):
        self.fd, self._file = -1, None
        with interrupts_deferred():
            fd = os.open(path, flags | CLOEXEC, mode)
            try:
                self._file = io.FileIO(fd, "r", closefd=True)
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd

    def close(self) -> None:
        self.fd = -1
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> int:
        return self.fd

    #: close(), in C (again after a KeyboardInterrupt): a Python __exit__
    #: starts with a point where a Ctrl-C lands, and its traceback then kept
    #: the descriptor, and a lock on it, open (see Index.__exit__).
    __exit__ = _core.exit_closing
