"""The locks on an index file's bytes: the compaction lease and the open lock.

Two byte ranges of the index file itself are locked (Linux OFD locks, which
belong to the open file description, else POSIX locks):

- LEASE_BYTE, the compaction lease: held (write lock) by the one process
  whose compactor runs steps (compaction.Compactor);
- OPEN_BYTE, the open lock: every open index holds it shared
  (:func:`open_locked`); vacuum and the in-place upgrade hold it
  exclusively while they copy the file and rename the copy over it, so
  they can tell that no other process has the file open, and an open that
  comes meanwhile waits for the new file.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time

from ndindex import store as st
from ndindex.descriptors import Descriptor
from ndindex.errors import BusyError, ReadOnlyError

LEASE_BYTE = 0
OPEN_BYTE = 1

_F_SETLK = getattr(fcntl, "F_OFD_SETLK", fcntl.F_SETLK)
_F_SETLKW = getattr(fcntl, "F_OFD_SETLKW", fcntl.F_SETLKW)
_F_GETLK = getattr(fcntl, "F_OFD_GETLK", fcntl.F_GETLK)
#: struct flock: l_type, l_whence, l_start, l_len, l_pid (Linux x86-64 layout).
_FLOCK = "hhqqi4x"


def byte_lock(fd: int, byte: int, kind: int, wait: bool = False) -> bool:
    """Lock one byte of a file (fcntl F_RDLCK/F_WRLCK/F_UNLCK); False if held elsewhere."""
    lk = struct.pack(_FLOCK, kind, os.SEEK_SET, byte, 1, 0)
    try:
        fcntl.fcntl(fd, _F_SETLKW if wait else _F_SETLK, lk)
        return True
    except OSError:
        return False


def held_elsewhere(fd: int, byte: int) -> bool:
    """Whether another process (or open file description) holds a lock on
    one byte of fd's file, of any kind; True when it cannot tell."""
    try:
        answer = fcntl.fcntl(fd, _F_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, byte,
                                                       1, 0))
    except OSError:
        return True
    return struct.unpack_from("h", answer)[0] != fcntl.F_UNLCK


class NotAlone(ReadOnlyError):
    """Another process has the file open (Index._alone)."""


#: How often an open with a timeout looks whether a vacuum let the file go.
OPEN_POLL_SECONDS = 0.02


def open_locked(path: str, readonly: bool, timeout: float | None = None) -> Descriptor:
    """Open path and take the shared open lock on the file it names; return the Descriptor.

    Every open index holds this lock (OPEN_BYTE); vacuum (and the
    in-place upgrade) hold it exclusively while they copy the file and
    rename the copy over it.  It is taken before LMDB opens the file: an
    open that went ahead meanwhile would keep the replaced file, and
    whatever it then committed was lost with it.  So this waits while
    another process vacuums (at most timeout seconds, then BusyError; None:
    no limit), then makes sure the file it locked is still the one at path
    (if not, it locks the new one).  Write locks need a descriptor open for
    writing.
    """
    st.check_access(path, readonly)
    flags = os.O_RDONLY if readonly else os.O_RDWR
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            opened = Descriptor(path, flags)   # closed if dropped
        except OSError as exc:
            raise st.translate_error(exc, path) from exc
        fd = opened.fd
        try:
            if deadline is None:
                byte_lock(fd, OPEN_BYTE, fcntl.F_RDLCK, wait=True)
            else:
                # fcntl has no timed wait: look again every OPEN_POLL_SECONDS.
                while not byte_lock(fd, OPEN_BYTE, fcntl.F_RDLCK):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BusyError(f"{path}: another process is vacuuming or upgrading "
                                        f"this index; still busy after {timeout:g} s")
                    time.sleep(min(OPEN_POLL_SECONDS, left))
            if st.same_inode(fd, path):
                return opened
        except BaseException:
            opened.close()
            raise
        opened.close()  # replaced while this waited: lock the file now at path
