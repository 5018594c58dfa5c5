"""A real Ctrl-C at a chosen point, for the tests of what Ctrl-C leaves behind."""

from __future__ import annotations

import os
import signal
import sys


def ctrl_c_at_call(name: str | None = None):
    """A sys.setprofile function that sends this process one real SIGINT as
    the first Python function named name (any, if None) starts, and takes
    itself off first: a profile function that raises cuts the call short,
    which no Ctrl-C does.  Its list ``sent`` holds the name it fired at."""
    sent: list = []

    def hook(frame, event, arg):
        if event == "call" and not sent and name in (None, frame.f_code.co_name):
            sent.append(frame.f_code.co_name)
            sys.setprofile(None)
            os.kill(os.getpid(), signal.SIGINT)

    hook.sent = sent
    return hook
