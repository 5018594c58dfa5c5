"""Shared fixtures and hypothesis profiles."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def level0_flushes(monkeypatch):
    """Every flush is a level-0 run merged up in steps (as when the level-1
    run is busy or full), never merged into level 1 in its own commit: for
    tests of the merges that follow a flush, on a few thousand values."""
    from ndindex import compaction
    monkeypatch.setattr(compaction, "_flush_target",
                        lambda man, space, level, *args, **kwargs: (level, None))
