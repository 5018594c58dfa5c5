"""A kill at every step of a compaction, background and foreground, loses nothing.

A child process opens a prepared index with background compaction on and
a small log limit, so that its compaction thread flushes the log (new
runs, tombstones, key records) and merges the level-0 runs into level 1
one chunk at a time; once the thread is idle, it reopens the index and
runs compact(full=True) in the foreground: full merges into one Huffman
run per table and key space, then the rewrite that drops tombstones.

A dry run counts the compaction commits.  Then, for every commit N, the
child is run again with NDINDEX_KILL_AT_COMPACTION=before:N and after:N
(the test-only hook in ndindex/compaction.py SIGKILLs the process at that
moment); the file must open, verify, and hold exactly what the model
says, and a compaction run to the end on it must keep it so.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from damage import Model, contents
from ndindex import chunks as ch
from ndindex.index import Index

CHILD = textwrap.dedent("""
    import sys, time
    from ndindex import chunks, compaction
    from ndindex.index import Index
    # Small chunks and one input chunk per merge step: many steps.
    chunks.CHUNK_MAX_BLOCKS = 1
    compaction.STEP_CHUNKS = 1
    path = sys.argv[1]
    with Index.open(path, background_compaction=True, log_limit=100) as ix:
        # Wait until the compaction thread has flushed the log and finished
        # every merge it found due (no step for a while).
        steps, still = -1, 0
        while still < 15:
            time.sleep(0.1)
            snap = ix._snapshot()
            idle = snap.state.log_first_seq == snap.state.log_next_seq and \\
                not any(r.merge_into for r in snap.manifest.runs)
            still = still + 1 if idle and ix._compactor.steps == steps else 0
            steps = ix._compactor.steps
        background = steps
    with Index.open(path, background_compaction=False) as ix:
        ix.compact(full=True)
        foreground = ix._compactor.steps
    print(background, foreground, next(compaction._COMMITS))
""")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """An index whose log, runs and tombstones give compaction every kind of step."""
    path = str(tmp_path_factory.mktemp("kill-compaction") / "base.ndx")
    rng = np.random.default_rng(12)
    fps = np.unique(rng.integers(0, 2**64, 2000, dtype=np.uint64))[:1300]
    model = Model()
    saved = ch.CHUNK_MAX_BLOCKS
    ch.CHUNK_MAX_BLOCKS = 1
    try:
        with Index.create(path, k=3, expected_n=3000, background_compaction=False,
                          log_limit=1 << 30) as ix:
            def add(sel, keys=None):
                ix.add(sel, keys=keys)
                model.add(sel, keys)

            a, b, c = fps[:600], fps[600:1000], fps[1000:]
            add(a, [f"a{i}" if i % 2 else None for i in range(len(a))])
            ix.compact(full=True)
            add(b, [f"b{i}" for i in range(len(b))])
            ix.compact()
            ix.remove(a[:30])
            model.remove(a[:30])
            ix.remove(keys=[f"a{i}" for i in range(101, 140, 2)])
            model.remove(keys=[f"a{i}" for i in range(101, 140, 2)])
            for part in np.array_split(c, 4):
                add(part, [f"c{int(x) % 997}" for x in part])
    finally:
        ch.CHUNK_MAX_BLOCKS = saved
    return path, model.state()


def run_child(path, kill_at: str):
    env = dict(os.environ, NDINDEX_KILL_AT_COMPACTION=kill_at)
    return subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True,
                          text=True, timeout=300)


def check(path, state) -> None:
    with Index.open(path, background_compaction=False) as ix:
        ix.verify()
    assert contents(path) == state
    with Index.open(path, background_compaction=False) as ix:
        ix.compact(full=True)
        ix.verify()
    assert contents(path) == state


@pytest.mark.slow
def test_kill_before_and_after_every_compaction_commit(base, tmp_path):
    src, state = base
    dry = str(tmp_path / "dry.ndx")
    shutil.copyfile(src, dry)
    out = run_child(dry, "count")
    assert out.returncode == 0, out.stderr
    background, foreground, commits = map(int, out.stdout.split())
    # A flush, merge rounds (the removals trigger a merge into the main
    # level) and the tombstone rewrite in the background; whatever full=True
    # still finds to do in the foreground.
    assert background >= 5 and commits == background + foreground, out.stdout
    check(dry, state)

    def kill_at(point):
        n, moment = point
        path = str(tmp_path / f"{moment}-{n}.ndx")
        shutil.copyfile(src, path)
        return path, point, run_child(path, f"{moment}:{n}")

    points = [(n, moment) for n in range(commits) for moment in ("before", "after")]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the children run in parallel
        for path, (n, moment), out in pool.map(kill_at, points):
            assert out.returncode == -signal.SIGKILL, (n, moment, out.returncode, out.stderr)
            check(path, state)
