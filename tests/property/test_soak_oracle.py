"""tools/soak_oracle.py: a bounded run agrees with brute force, and the
soak notices an index that answers wrongly (a tool that cannot fail would
prove nothing)."""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import soak_oracle  # noqa: E402
from ndindex.index import Index  # noqa: E402
from tests.oracle import popcount64  # noqa: E402


def test_a_bounded_soak_agrees_with_brute_force(tmp_path, capsys):
    # A small log limit: flushes and merges run between and during checks.
    rc = soak_oracle.main(["--n", "30000", "--cycles", "12", "--log-limit", "2000",
                           "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "all 12 cycles agreed with brute force" in out


def test_a_bounded_soak_with_normal_durability(tmp_path, capsys):
    rc = soak_oracle.main(["--n", "20000", "--cycles", "6", "--log-limit", "2000",
                           "--durability", "normal", "--seed", "3", "--dir", str(tmp_path)])
    assert rc == 0, capsys.readouterr().out


def test_the_soak_reports_an_answer_that_lost_a_match(tmp_path, capsys, monkeypatch):
    real = Index.query

    def loses_the_first(self, *a, **kw):
        return real(self, *a, **kw)[1:]

    monkeypatch.setattr(Index, "query", loses_the_first)
    rc = soak_oracle.main(["--n", "5000", "--cycles", "3", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "MISMATCH at cycle 1 (verify)" in out and "missing" in out
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("soak-failed-seed1-")]
    assert len(kept) == 1 and (kept[0] / "soak.ndx").exists()
    assert (kept[0] / "oracle-live.npy").exists()


def test_flip_changes_at_most_the_bits_asked_for():
    rng = np.random.default_rng(0)
    fps = rng.integers(0, 2**64, 2000, dtype=np.uint64)
    d = popcount64(soak_oracle.flip(rng, fps, 3) ^ fps)
    assert d.max() == 3 and d.min() == 0


def test_writer_processes_each_agree_and_the_index_holds_their_union(tmp_path, capfd):
    # Two processes write one file, each its own part, background
    # compaction on in both (one holds the lease at a time), and a reader
    # process querying every writer's anchors all along.
    rc = soak_oracle.main(["--writers", "2", "--readers", "1", "--n", "20000", "--cycles", "6",
                           "--log-limit", "2000", "--dir", str(tmp_path)])
    out = capfd.readouterr().out
    assert rc == 0, out
    assert "writer 0: cycle    6" in out and "writer 1: cycle    6" in out
    assert "reader 0: " in out and "checks of 50 anchors agreed" in out
    assert "all 6 cycles of 2 writers agreed" in out


def test_a_writer_part_is_a_residue_class_that_make_moves_values_into():
    rng = np.random.default_rng(1)
    values = rng.integers(0, 2**64, 4000, dtype=np.uint64)
    parts = [soak_oracle.Part(i, 4) for i in range(4)]
    owned = [p.own(values) for p in parts]
    assert sum(len(o) for o in owned) == len(values)
    assert all(len(o) > 800 for o in owned)
    for p in parts:
        moved = p.make(values)
        assert np.array_equal(p.own(moved), moved)
        assert popcount64(moved ^ values).max() <= 2  # only the two low bits change
    assert soak_oracle.Part().own(values) is values


def test_a_reader_process_reports_an_anchor_the_index_lacks(tmp_path, capsys, monkeypatch):
    # The reader's check can fail: anchors that were never stored.
    path = str(tmp_path / "soak.ndx")
    Index.create(path, k=3, expected_n=1000).close()
    np.save(tmp_path / "anchors0.npy", np.arange(1, 11, dtype=np.uint64) << np.uint64(40))
    with open(os.devnull) as nothing:
        monkeypatch.setattr(sys, "stdin", nothing)
        rc = soak_oracle.main(["--reader", "0", "--writers", "1", "--path", path])
    out = capsys.readouterr().out
    assert rc == 1
    assert "reader 0: MISMATCH after 0 checks: 50 of 50 anchors missing" in out


def test_a_bounded_soak_of_an_index_of_many_tables(tmp_path, capsys):
    # k = 6: seven tables at this size (the planner's choice for 8,000), more
    # than the four of k = 3 that the kernel probes at a time.
    rc = soak_oracle.main(["--k", "6", "--n", "8000", "--cycles", "4", "--log-limit", "1000",
                           "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "all 4 cycles agreed with brute force" in out
