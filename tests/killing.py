"""Child processes for the tests: one that dies (``os._exit(9)``) at a chosen
call, and one that parks inside a read.

The kill tests of create, vacuum, recover and the dedup job's first build
replace ``os.<call>`` in the child before ndindex is imported, so that the
child stops exactly there, as a SIGKILL at that moment would leave it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys


@contextlib.contextmanager
def reader_parked(path):
    """A child process that opens path read-only and stays inside one read
    (an items() loop, one chunk taken) until the block ends; yields its Popen."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, ndindex; "
         "ix = ndindex.open(sys.argv[1], readonly=True); it = ix.items(); next(it); "
         "print('reading', flush=True); sys.stdin.read()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "reading"
        yield child
    finally:
        if child.poll() is None:
            child.communicate("", timeout=30)
        else:
            child.communicate(timeout=30)


def killed_at(call: str, code: str, *args, after: bool = False, only_to: int | None = None,
              timeout: float = 300) -> None:
    """Run code (args as sys.argv[1:]) in a child that dies at its first os.<call>.

    after: let that call happen, and die at the first os.unlink after it.
    only_to: count only calls whose second argument is sys.argv[only_to]
    (a rename or link to that name).  Asserts that the child died there.
    """
    guard = "True" if only_to is None else f"len(a) > 1 and a[1] == sys.argv[{only_to}]"
    if after:
        hook = f"    r = real(*a, **k)\n    if {guard}:\n        os.unlink = die\n    return r\n"
    else:
        hook = f"    if {guard}:\n        die()\n    return real(*a, **k)\n"
    src = ("import os, sys\n"
           "def die(*a, **k):\n    os._exit(9)\n"
           f"real = os.{call}\n"
           "def hook(*a, **k):\n" + hook +
           f"os.{call} = hook\n" + code)
    done = subprocess.run([sys.executable, "-c", src, *map(str, args)], timeout=timeout)
    assert done.returncode == 9, f"the child was not stopped at os.{call}"
