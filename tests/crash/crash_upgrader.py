"""An in-place upgrade for the crash tests, optionally killed before its Nth file operation.

Usage: python crash_upgrader.py PATH CRASH_AT backup|no-backup

Runs ``ndindex.upgrade.upgrade(PATH)``.  Every call to os.link, rename,
replace, unlink, fsync and ftruncate in this process (the upgrade's own and
those of the index it builds) is counted; the process SIGKILLs itself just
before call number CRASH_AT.  CRASH_AT 0 never crashes: the process prints
``calls <n>`` after the upgrade, so the test knows how many points to try.
"""

from __future__ import annotations

import os
import signal
import sys

OPERATIONS = ("link", "rename", "replace", "unlink", "fsync", "ftruncate")


def main(argv: list[str]) -> None:
    path, crash_at, keep = argv[0], int(argv[1]), argv[2] == "backup"
    calls = 0

    def counted(operation):
        def call(*args, **kwargs):
            nonlocal calls
            calls += 1
            if calls == crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return operation(*args, **kwargs)
        return call

    from ndindex.upgrade import upgrade
    for name in OPERATIONS:
        setattr(os, name, counted(getattr(os, name)))
    upgrade(path, backup=keep)
    print(f"calls {calls}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
