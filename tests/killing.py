"""Run an operation in a child process that dies (``os._exit(9)``) at a chosen call.

The kill tests of create, vacuum, recover and the dedup job's first build
replace ``os.<call>`` in the child before ndindex is imported, so that the
child stops exactly there, as a SIGKILL at that moment would leave it.
"""

from __future__ import annotations

import subprocess
import sys


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
