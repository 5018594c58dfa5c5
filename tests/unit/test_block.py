"""_core.Block: a with statement over a lock and two calls, in C, with Ctrl-C held back."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from ndindex import _core
from tests.interrupts import ctrl_c_at_call


class Calls:
    def __init__(self, enter_raises=None, exit_raises=None, ctrl_c_in=None):
        self.lock = threading.RLock()
        self.log = []
        self.enter_raises, self.exit_raises, self.ctrl_c_in = enter_raises, exit_raises, ctrl_c_in

    def enter(self):
        self.log.append(("enter", self.lock._is_owned()))
        if self.ctrl_c_in == "enter":
            os.kill(os.getpid(), signal.SIGINT)
            self.log.append("enter went on")
        if self.enter_raises:
            raise self.enter_raises
        return "bound"

    def exit(self, exc_type, exc, tb):
        self.log.append(("exit", exc_type, self.lock._is_owned()))
        if self.ctrl_c_in == "exit":
            os.kill(os.getpid(), signal.SIGINT)
            self.log.append("exit went on")
        if self.exit_raises:
            raise self.exit_raises
        return exc_type is LookupError      # swallows a LookupError

    def block(self):
        return _core.Block(self.lock, self.enter, self.exit)


def test_enter_binds_exit_sees_the_exception_and_the_lock_is_held_between():
    c = Calls()
    with c.block() as bound:
        assert bound == "bound" and c.lock._is_owned()
    assert not c.lock._is_owned()
    with c.block():
        raise LookupError("swallowed: exit returned true")
    with pytest.raises(ValueError):
        with c.block():
            raise ValueError
    assert c.log == [("enter", True), ("exit", None, True), ("enter", True),
                     ("exit", LookupError, True), ("enter", True), ("exit", ValueError, True)]
    assert not c.lock._is_owned()


def test_the_lock_is_let_go_when_enter_or_exit_raises():
    c = Calls(enter_raises=KeyError("in enter"))
    with pytest.raises(KeyError):
        with c.block():
            raise AssertionError("the block does not run")
    assert not c.lock._is_owned()
    c = Calls(exit_raises=KeyError("in exit"))
    with pytest.raises(KeyError):
        with c.block():
            pass
    assert not c.lock._is_owned()


@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("where", ["enter", "exit"])
def test_ctrl_c_in_enter_or_exit_waits_for_its_end(where):
    # The Python calls run whole; the interrupt comes as the with
    # statement's call returns (a Ctrl-C during enter: at the block's first
    # call, which the block's exit then sees).
    c = Calls(ctrl_c_in=where)
    body = []
    with pytest.raises(KeyboardInterrupt):
        with c.block():
            body.append("started")
            str(1)
            body.append("went on")
    assert f"{where} went on" in c.log and not c.lock._is_owned()
    if where == "enter":
        assert body == ["started"] and c.log[-1] == ("exit", KeyboardInterrupt, True)
    else:
        assert body == ["started", "went on"] and c.log[-1] == "exit went on"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_the_main_thread_it_runs_without_holding_anything_back():
    c, errors = Calls(), []

    def run():
        try:
            with c.block() as bound:
                assert bound == "bound" and c.lock._is_owned()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert errors == [] and [e[0] for e in c.log] == ["enter", "exit"]


def test_a_block_made_without_its_arguments_refuses_to_enter():
    with pytest.raises(TypeError):
        _core.Block()
    with pytest.raises(RuntimeError, match="not initialised"):
        _core.Block.__new__(_core.Block).__enter__()


def _first_calls_after_the_block(make):
    import sys
    events = []
    with make():
        sys.setprofile(lambda frame, event, arg: events.append((event, frame.f_code.co_name)))
    sys.setprofile(None)
    return [e for e in events if e[0] in ("call", "c_return") and e[1] != "<lambda>"][:1]


@pytest.mark.usefixtures("sigint_raises")
def test_with_statements_over_descriptors_and_readers_reach_close_with_no_point_before(tmp_path):
    # Their __exit__ is _core.exit_closing: a Python __exit__ starts with a
    # point where a Ctrl-C lands, and the traceback then kept a descriptor
    # (and the lock on it) open.  A Ctrl-C as close() starts closes again.
    import sys

    from ndindex import descriptors, fpfile
    fpfile.write_fingerprints(tmp_path / "f.ndfp", [1, 2, 3])
    made = []

    def descriptor():
        made.append(descriptors.Descriptor(str(tmp_path / "d"), os.O_RDWR | os.O_CREAT))
        return made[-1]

    for make in (descriptor, lambda: fpfile.FingerprintReader(tmp_path / "f.ndfp")):
        assert _first_calls_after_the_block(make) == [("call", "close")]
    assert made[0].fd == -1
    # A real SIGINT as close() begins: the interrupt comes out, the
    # descriptor is closed all the same.
    hook = ctrl_c_at_call("close")
    d = descriptor()
    with pytest.raises(KeyboardInterrupt):
        with d:
            sys.setprofile(hook)
    sys.setprofile(None)
    assert hook.sent and d.fd == -1 and d._file.closed


@pytest.mark.usefixtures("sigint_raises")
def test_another_signals_exception_pending_as_the_hold_ends_is_raised_as_itself():
    # A signal that arrives while enter() runs C code alone (sum() over a
    # range: no point where Python runs a handler) stays pending until the
    # hold's end, where signal.signal runs its handler first: its exception
    # (SystemExit here) ends the entered block through exit() and comes out
    # as itself, not as a KeyboardInterrupt, and no SIGINT is left held.
    import functools

    def raises_system_exit(signum, frame):
        raise SystemExit(7)

    log = []

    def exits(*exc):
        log.append(exc[0])
        return False

    lock = threading.RLock()
    previous = signal.signal(signal.SIGALRM, raises_system_exit)
    try:
        block = _core.Block(lock, functools.partial(sum, range(60_000_000)), exits)
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        with pytest.raises(SystemExit) as raised:
            with block:
                log.append("block ran")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert raised.value.code == 7 and log == [SystemExit] and not lock._is_owned()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_as_an_index_build_ends_leaves_its_name_free(tmp_path):
    # As a contextlib generator, a Ctrl-C as index_build's __exit__ began
    # left the build name's flock held while the traceback lived: a retry in
    # the same process waited for itself, then "another process is creating it".
    import sys

    from ndindex import store
    path = str(tmp_path / "built.ndx")
    hook = ctrl_c_at_call("end")
    with pytest.raises(KeyboardInterrupt) as raised:
        with store.index_build(path, "import") as tmp:
            assert tmp.endswith(".ndx")
            sys.setprofile(hook)
    sys.setprofile(None)
    assert hook.sent
    with store.index_build(path, "import"):    # at once: the name is free
        pass
    del raised


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_ends_an_index_builds_wait_for_another_builders_name(tmp_path):
    # The wait (up to store.BUILD_WAIT_SECONDS) runs inside the Block's
    # hold; it looks for a Ctrl-C held back and ends with it.
    import fcntl
    import time

    from ndindex import store
    path = str(tmp_path / "built.ndx")
    held_name = store.index_build_files(path, "import")[0]
    other = os.open(held_name, os.O_RDWR | os.O_CREAT)   # another builder's name
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            with store.index_build(path, "import"):
                raise AssertionError("the name is another builder's")
        assert time.monotonic() - t < store.BUILD_WAIT_SECONDS / 2
        timer.join()
    finally:
        os.close(other)
    with store.index_build(path, "import"):
        pass
