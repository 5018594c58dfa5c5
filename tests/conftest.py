"""Shared fixtures and hypothesis profiles."""

import os
import signal
import time

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def level0_flush_target(man, space, level, *args, **kwargs):
    """levels.flush_target of a writer whose every flush is a run of its
    own (level 0: merged up in steps, as when the level-1 run is busy or
    full), never merged into level 1 in its commit: for tests of the merges
    that follow a flush, and of states with several runs."""
    return level, None


@pytest.fixture
def level0_flushes(monkeypatch):
    """Every flush a level-0 run (level0_flush_target)."""
    from ndindex import levels
    monkeypatch.setattr(levels, "flush_target", level0_flush_target)


def wait_for(condition, seconds=30.0):
    """Wait until condition() holds (a background thread's work), at most seconds."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt during the test (Python's default),
    whatever the runner inherited: a background job of a shell starts with
    SIGINT ignored, and a test that sends itself a real SIGINT saw nothing.
    (A child process inherits the disposition too: child scripts set it.)"""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if inherited is None else inherited)
