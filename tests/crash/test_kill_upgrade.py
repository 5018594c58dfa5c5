"""Kill an in-place upgrade with SIGKILL anywhere; INDEX always opens with all its data.

crash_upgrader.py runs ``ndindex.upgrade.upgrade`` in a subprocess and kills
itself before its Nth file operation (link, rename, replace, unlink, fsync,
ftruncate), for every N the upgrade reaches; other rounds kill it at random
moments.  After each kill the file at INDEX must be the untouched format-1
original or a complete format-2 index holding the fixture's data, a
``.v1`` backup must be the original, and a second upgrade must finish and
clear whatever the first left behind.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ndindex.upgrade import file_format, upgrade
from tests.unit.test_upgrade import FIXTURE, assert_holds_fixture_data, files, sha

UPGRADER = os.path.join(os.path.dirname(__file__), "crash_upgrader.py")
RANDOM_KILLS = 8


def run_upgrader(path: str, crash_at: int, backup: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, UPGRADER, path, str(crash_at),
                             "backup" if backup else "no-backup"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def check_after_crash(path: str) -> str:
    """Assert INDEX is whole and a rerun finishes; return the format found after the crash."""
    original = sha(FIXTURE)
    directory = os.path.dirname(path)
    if os.path.exists(path + ".v1"):
        assert sha(path + ".v1") == original
    found = file_format(path)
    if found == 1:
        assert sha(path) == original                      # never written to
        upgrade(path)
        assert files(directory) == ["v1.ndx", "v1.ndx.v1"]   # temporaries cleared
    assert_holds_fixture_data(path)
    return f"format {found}"


@pytest.mark.slow
def test_kill_before_every_file_operation_leaves_a_whole_index(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    shutil.copyfile(FIXTURE, probe / "v1.ndx")
    out, err = run_upgrader(str(probe / "v1.ndx"), 0).communicate(timeout=120)
    assert out.startswith("calls "), err
    total = int(out.split()[1])
    assert total >= 4                    # at least: fsync, link, replace, unlink of the backup
    outcomes = {}
    for crash_at in range(1, total + 1):
        round_dir = tmp_path / f"at{crash_at}"
        round_dir.mkdir()
        path = str(round_dir / "v1.ndx")
        shutil.copyfile(FIXTURE, path)
        proc = run_upgrader(path, crash_at)
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL
        outcome = check_after_crash(path)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # Early kills leave the original, the last ones the new file: both were reached.
    assert set(outcomes) == {"format 1", "format 2"}, outcomes


@pytest.mark.slow
def test_kill_at_random_moments_leaves_a_whole_index(tmp_path):
    timing = tmp_path / "timing"
    timing.mkdir()
    shutil.copyfile(FIXTURE, timing / "v1.ndx")
    t0 = time.monotonic()
    out, err = run_upgrader(str(timing / "v1.ndx"), 0, backup=True).communicate(timeout=120)
    assert out.startswith("calls "), err
    duration = time.monotonic() - t0
    rng = random.Random(11)
    for n in range(RANDOM_KILLS):
        round_dir = tmp_path / f"round{n}"
        round_dir.mkdir()
        path = str(round_dir / "v1.ndx")
        shutil.copyfile(FIXTURE, path)
        proc = run_upgrader(path, 0, backup=bool(n % 2))
        time.sleep(rng.uniform(0, duration))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=120)
        check_after_crash(path)
