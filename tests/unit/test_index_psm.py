"""Probabilistic simhash matching on an index file, against a brute-force oracle.

A PSM query probes table 0 only, at the prefix of pi_0(q) XOR each of the
first max_probes flip sets of at most k prefix bits (VOSH order of the
query's flip probabilities), and must report exactly the stored values
within k of q whose prefix is probed: with every flip set probed, exactly
brute force.  Checked in every state the file can be in (the states of
test_index.py), with the log, several runs, a merge stopped half way, and
uncommitted operations of a transaction.
"""

import itertools
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from ndindex import _core, plan as plans, vosh
from ndindex.errors import CorruptionError
from ndindex.fingerprint import DEFAULT_FLIP_MODEL, Fingerprinter, FlipModel
from ndindex.index import Index
from ndindex.index_queries import MAX_PROBES, UNIFORM_FLIP_PROBABILITY
from tests.oracle import brute_force, clustered, near
from tests.unit.test_index import STATES, put_in_state, small_steps  # noqa: F401 - a fixture

K = 3


@pytest.fixture
def path(tmp_path):
    return tmp_path / "psm.ndx"


def reference_prefixes(design, q, probs, k, cap):
    """The prefixes a PSM query probes, from the Python VOSH (the C kernel's oracle).

    Flip sets of at most k of the table's prefix bits in VOSH order of the
    probabilities of the bits that land there (prefix bit i is input bit
    permutation[i]), applied to the prefix of pi(q).
    """
    p = design.prefix_bits
    positions = [design.permutation[i] for i in range(p)][::-1]  # prefix LSB first
    sets = vosh.flip_sets_upto(np.asarray(probs)[positions], min(k, p))
    prefix = design.prefix(q)
    return [prefix ^ sum(1 << b for b in s) for s in itertools.islice(sets, cap)]


def oracle(design, stored, q, k, prefixes):
    """brute_force restricted to the stored values whose prefix is one of prefixes."""
    allowed = set(prefixes)
    return [(f, d) for f, d in brute_force(stored, q, k) if design.prefix(f) in allowed]


def as_pairs(matches):
    return [(m.fingerprint, m.distance) for m in matches]


def rows_of(many, i):
    rows = many[many["query"] == i]
    return list(zip(rows["fingerprint"].tolist(), rows["distance"].tolist()))


def check_psm(ix, stored, queries, probs, k, max_probes):
    """query() and query_many() with probabilities equal the oracle over the probed prefixes."""
    design = ix.plan.tables[0]
    stored = np.unique(stored)
    many = ix.query_many(queries, k, probabilities=probs, max_probes=max_probes)
    for i, q in enumerate(queries.tolist()):
        want = oracle(design, stored, q, k, reference_prefixes(design, q, probs[i], k, max_probes))
        got = as_pairs(ix.query(q, k, keys=False, probabilities=probs[i], max_probes=max_probes))
        assert got == want, f"query {q:#x}, max_probes {max_probes}"
        assert rows_of(many, i) == want


def workload(seed, data="clustered"):
    rng = np.random.default_rng(seed)
    fps = clustered(rng, 300, 40, 4) if data == "clustered" else \
        rng.integers(0, 2**64, size=12000, dtype=np.uint64)
    queries = np.concatenate([near(rng, fps, 60, K), rng.integers(0, 2**64, 10, dtype=np.uint64)])
    probs = rng.random((len(queries), 64)) ** 3   # a few volatile bits per query
    return fps, queries, probs


def test_create_psm_stores_a_probabilistic_one_table_plan(path):
    with Index.create(path, k=K, expected_n=100_000, plan="psm") as ix:
        assert ix.plan == plans.psm_plan(100_000, K)
        assert ix.plan.probabilistic and len(ix.plan.tables) == 1
        table = ix.plan.tables[0]
        assert table.permutation == tuple(range(63, -1, -1))
        assert table.prefix_bits == plans.psm_header_bits(100_000)
        stats = ix.stats()
        assert stats["probabilistic"] is True and "probabilistic" in stats["plan"]
    with Index.open(path, readonly=True) as ix:           # the flag is in the file
        assert ix.plan == plans.psm_plan(100_000, K)
        assert "probabilistic" in ix.plan.describe().splitlines()[0]
    with Index.create(path.with_name("t.ndx"), k=K, expected_n=100_000) as ix:
        assert not ix.plan.probabilistic and ix.stats()["probabilistic"] is False


def test_create_rejects_an_unknown_plan_name(path):
    with pytest.raises(ValueError, match="psm"):
        Index.create(path, k=K, plan="fast")
    assert not os.path.exists(path)


@pytest.mark.parametrize("data", ["random", "clustered"])
@pytest.mark.parametrize("state", STATES)
def test_psm_queries_match_the_oracle_in_every_state(path, data, state, small_steps):
    fps, queries, probs = workload(3, data)
    with Index.create(path, k=K, expected_n=len(fps), plan="psm",
                      background_compaction=False) as ix:
        put_in_state(ix, fps, state)
        every = plans.flip_set_count(ix.plan.tables[0].prefix_bits, K)
        for max_probes in (1, 7, 60):
            check_psm(ix, fps, queries[:30], probs[:30], K, max_probes)
        check_psm(ix, fps, queries[:20], probs[:20], 1, 5)
        # Every flip set probed: brute force, whatever the probabilities.
        stored = np.unique(fps)
        many = ix.query_many(queries, K, probabilities=probs, max_probes=every)
        for i, q in enumerate(queries.tolist()):
            assert rows_of(many, i) == brute_force(stored, q, K)
        ix.verify()
    with Index.open(path, readonly=True) as ix:
        check_psm(ix, fps, queries[:20], probs[:20], K, 7)


def test_psm_index_queries_without_probabilities_probe_by_size(path, small_steps):
    fps, queries, _ = workload(4)
    with Index.create(path, k=K, expected_n=len(fps), plan="psm",
                      background_compaction=False) as ix:
        put_in_state(ix, fps, "several-runs")
        design, stored = ix.plan.tables[0], np.unique(fps)
        uniform = np.full(64, UNIFORM_FLIP_PROBABILITY)
        many = ix.query_many(queries, K)
        for i, q in enumerate(queries.tolist()):
            prefixes = reference_prefixes(design, q, uniform, K, plans.psm_max_probes(K))
            # by size: the exact prefix, then every one-bit flip, ...
            assert [bin(x ^ prefixes[0]).count("1") for x in prefixes] == \
                sorted(bin(x ^ prefixes[0]).count("1") for x in prefixes)
            want = oracle(design, stored, q, K, prefixes)
            assert as_pairs(ix.query(q, keys=False)) == want
            assert rows_of(many, i) == want


@pytest.mark.parametrize("state", ["several-runs", "mid-merge", "main"])
def test_probabilities_on_permuted_tables_probe_table_0(path, state, small_steps):
    fps, queries, probs = workload(5)
    with Index.create(path, k=K, expected_n=len(fps), background_compaction=False) as ix:
        assert len(ix.plan.tables) > 1
        assert ix.plan.tables[1].permutation != tuple(range(63, -1, -1))
        put_in_state(ix, fps, state)
        check_psm(ix, fps, queries[:30], probs[:30], K, 9)
        # Without probabilities the tables answer exactly, as ever.
        stored = np.unique(fps)
        for q in queries[:20].tolist():
            assert as_pairs(ix.query(q, keys=False)) == brute_force(stored, q, K)


def test_probabilities_follow_a_table_permutation(path):
    # A one-table plan whose prefix bits are input bits 0..11: the probabilities
    # of those bits, not of the top bits, order the probes.
    perm = tuple(range(11, -1, -1)) + tuple(range(63, 11, -1))
    plan = plans.Plan(k=K, tables=(plans.TableDesign(perm, 12),), probabilistic=True)
    fps, queries, probs = workload(6)
    with Index.create(path, k=K, plan=plan, background_compaction=False) as ix:
        put_in_state(ix, fps, "one-run")
        check_psm(ix, fps, queries[:30], probs[:30], K, 5)


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_pending_operations_are_seen_under_probed_prefixes(path, durability, small_steps):
    fps, queries, probs = workload(7)
    stored, new = fps[:8000], fps[8000:]
    with Index.create(path, k=K, expected_n=len(fps), plan="psm",
                      background_compaction=False) as ix:
        put_in_state(ix, stored, "several-runs")
    with Index.open(path, durability=durability, background_compaction=False) as ix:
        gone = np.unique(stored)[::5]
        with ix.transaction():
            ix.add(new)
            ix.remove(fingerprints=gone)
            live = np.setdiff1d(np.unique(fps), gone)      # the removal came last
            for max_probes in (3, 40):
                check_psm(ix, live, queries[:30], probs[:30], K, max_probes)
            # The pending additions are indexed by now (4,000 of them, past
            # overlay.PENDING_SCAN_MAX); removing some leaves them in the
            # index, where the removals must hide them.
            assert ix._writer.pending._index[0] > 0
            also_gone = np.setdiff1d(np.unique(new), stored)[::3]
            ix.remove(fingerprints=also_gone)
            live = np.setdiff1d(live, also_gone)
            check_psm(ix, live, queries[:30], probs[:30], K, 40)
        check_psm(ix, live, queries[:30], probs[:30], K, 40)


def test_margins_are_turned_into_probabilities_by_the_stored_flip_model(path):
    # A model that calls every bit volatile: its most probable flip set has k
    # bits, so a one-probe query misses the exact match that the default
    # model (empty flip set first) finds.
    odd = FlipModel(mu=50.0, sigma=1.0)
    fpr = Fingerprinter(flip_model=odd)
    rng = np.random.default_rng(8)
    fps = rng.integers(0, 2**64, 3000, dtype=np.uint64)
    margins = rng.choice([-1.0, 1.0], size=(5, 64)) * (1 + rng.random((5, 64)))  # no bit near 0
    with Index.create(path, k=K, expected_n=3000, plan="psm", fingerprinter=fpr.to_bytes(),
                      background_compaction=False) as ix:
        ix.add(fps)
        for q, v in zip(fps[:5].tolist(), margins):
            got = ix.query(q, margins=v, max_probes=1)
            assert got == ix.query(q, probabilities=odd.probabilities(v), max_probes=1)
            assert q not in [m.fingerprint for m in got]
            assert q in [m.fingerprint for m in
                         ix.query(q, probabilities=DEFAULT_FLIP_MODEL.probabilities(v),
                                  max_probes=1)]
        many = ix.query_many(fps[:5], margins=margins, max_probes=4)
        want = ix.query_many(fps[:5], probabilities=odd.probabilities(margins), max_probes=4)
        assert many.tolist() == want.tolist()
    with Index.create(path.with_name("bare.ndx"), k=K, plan="psm") as ix:   # no fingerprinter
        ix.add(fps)
        v = margins[0]
        assert ix.query(int(fps[0]), margins=v, max_probes=1) == \
            ix.query(int(fps[0]), probabilities=DEFAULT_FLIP_MODEL.probabilities(v), max_probes=1)


TEXTS = [f"Paragraph {i} of the text tells of the {w} river and the hills around the old town "
         f"where the {w} mill stood for a hundred years before the flood of {1900 + i}."
         for i, w in enumerate(["green", "grey", "long", "quiet", "cold", "wide", "slow", "deep"])]


def test_query_text_takes_its_margins_from_the_stored_fingerprinter(path):
    fpr = Fingerprinter()
    simhashes = fpr.simhash_many(TEXTS)
    with Index.create(path, k=10, expected_n=1000, plan="psm", fingerprinter=fpr.to_bytes()) as ix:
        ix.add(simhashes, keys=[f"doc{i}" for i in range(len(TEXTS))])
        for text in TEXTS:
            q, v = fpr.simhash_with_weights(text)
            for max_probes in (None, 1, 5):
                assert ix.query_text(text, max_probes=max_probes) == \
                    ix.query(q, probabilities=fpr.flip_probabilities(v), max_probes=max_probes)
            assert ix.query_text(text)[0].fingerprint == q
    with Index.create(path.with_name("t.ndx"), k=10, expected_n=1000,
                      fingerprinter=fpr.to_bytes()) as ix:
        ix.add(simhashes)
        text = TEXTS[0] + " One more sentence."
        q, v = fpr.simhash_with_weights(text)
        assert ix.query_text(text) == ix.query(q)                         # exact tables
        assert ix.query_text(text, max_probes=3) == \
            ix.query(q, probabilities=fpr.flip_probabilities(v), max_probes=3)
        # No word, simhash 0: nothing matches, not what lies near 0.
        ix.add([0b101])
        assert ix.query(0) != [] and ix.query_text("") == [] and ix.query_text(" ... ") == []
    with Index.create(path.with_name("bare.ndx"), k=10, plan="psm") as ix:
        with pytest.raises(ValueError, match=r"no fingerprinter .*fingerprinter=Fingerprinter\(\)"):
            ix.query_text(TEXTS[0])


def test_membership_remove_and_check_and_add_on_a_psm_index(path):
    rng = np.random.default_rng(9)
    fps = rng.integers(0, 2**64, 5000, dtype=np.uint64)
    with Index.create(path, k=K, expected_n=5000, plan="psm", background_compaction=False) as ix:
        ix.add(fps)
        ix.compact()
        assert int(fps[10]) in ix and int(fps[10]) ^ 1 not in ix
        assert ix.remove(fingerprints=[int(fps[10])]) == 1
        assert int(fps[10]) not in ix and len(ix) == 4999
        near_one = int(fps[11]) ^ 0b101   # distance 2 below the prefix: the first probe finds it
        assert [m.fingerprint for m in ix.check_and_add(near_one)] == [int(fps[11])]
        assert near_one not in ix
        assert ix.check_and_add(int(fps[10])) == [] and int(fps[10]) in ix


def test_bad_psm_arguments_raise_and_change_nothing(path):
    rng = np.random.default_rng(10)
    fps = rng.integers(0, 2**64, 1000, dtype=np.uint64)
    probs = np.full(64, 0.1)
    with Index.create(path, k=K, expected_n=1000, plan="psm") as ix:
        ix.add(fps)
        q = int(fps[0])
        with pytest.raises(TypeError, match="not both"):
            ix.query(q, probabilities=probs, margins=np.ones(64))
        with pytest.raises(ValueError, match="shape"):
            ix.query(q, probabilities=np.full(63, 0.1))
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            ix.query(q, probabilities=np.full(64, 1.5))
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            ix.query(q, probabilities=np.full(64, np.nan))
        with pytest.raises(ValueError, match="shape"):
            ix.query_many(fps[:3], probabilities=np.full((2, 64), 0.1))
        with pytest.raises(ValueError, match="numbers"):
            ix.query(q, probabilities=["a"] * 64)
        with pytest.raises(ValueError, match=">= 1"):
            ix.query(q, probabilities=probs, max_probes=0)
        with pytest.raises(TypeError, match="int"):
            ix.query(q, probabilities=probs, max_probes=2.5)
        every = plans.flip_set_count(ix.plan.tables[0].prefix_bits, K)
        assert every < MAX_PROBES     # a larger budget is every flip set, not an error
        assert ix.query(q, probabilities=probs, max_probes=10**12) == \
            ix.query(q, probabilities=probs, max_probes=every)
        with pytest.raises(ValueError, match="outside"):
            ix.query(q, K + 1, probabilities=probs)
        assert len(ix) == 1000 and int(fps[0]) in ix
    with Index.create(path.with_name("t.ndx"), k=K, expected_n=1000) as ix:
        with pytest.raises(ValueError, match="needs probabilities"):
            ix.query(q, max_probes=5)
    wide = plans.psm_plan(1000, 12, header_bits=40)     # C(40, <= 12) flip sets: too many
    with Index.create(path.with_name("w.ndx"), k=12, plan=wide) as ix:
        ix.add(fps)
        with pytest.raises(ValueError, match="probe fewer"):
            ix.query(q, probabilities=np.full(64, 0.1), max_probes=10**12)
        assert ix.query(q, probabilities=np.full(64, 0.1))[0].fingerprint == q


def test_a_damaged_block_is_reported_by_a_psm_query(path):
    rng = np.random.default_rng(11)
    fps = rng.integers(0, 2**64, 20000, dtype=np.uint64)
    with Index.create(path, k=K, expected_n=len(fps), plan="psm",
                      background_compaction=False) as ix:
        ix.add(fps)
        ix.compact(full=True)
        ix._directories.warm = True  # list the run (cold, only one-chunk runs are)
        snap = ix._snapshot()
        run = snap.table_runs[0][0]
        last, offset = _core.run_directory_blocks(snap._directory(run))[5]
        victim = int(ix.plan.tables[0].invert(last))   # the block's last value
    with open(path, "r+b") as fh:
        fh.seek(offset + 300)
        byte = fh.read(1)
        fh.seek(offset + 300)
        fh.write(bytes([byte[0] ^ 0x40]))
    with Index.open(path, readonly=True) as ix:
        with pytest.raises(CorruptionError, match="table 0"):
            ix.query(victim, probabilities=np.full(64, 0.1), max_probes=1)
        with pytest.raises(CorruptionError):
            ix.query_many(np.array([victim], np.uint64), probabilities=np.full((1, 64), 0.1))


def test_the_docs_example_of_psm_on_an_index_runs(tmp_path):
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "psm.md").read_text()
    section = text[text.index("## PSM on an index file"):text.index("## Evaluation method")]
    code = "\n\n".join(re.findall(r"^```python\n(.*?)^```", section, re.S | re.M))
    assert "plan=\"psm\"" in code
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("plan: f=64 k=10 t=1 p=14..14 probabilistic")


def test_export_and_import_keep_the_plan_probabilistic(path, tmp_path):
    import io

    from ndindex import dump
    rng = np.random.default_rng(12)
    fps = rng.integers(0, 2**64, 2000, dtype=np.uint64)
    buf = io.BytesIO()
    with Index.create(path, k=K, expected_n=2000, plan="psm") as ix:
        ix.add(fps)
        dump.export_index(ix, buf)
        want = ix.query_many(fps[:50], probabilities=np.full((50, 64), 0.1), max_probes=5)
    buf.seek(0)
    dump.import_index(buf, tmp_path / "copy.ndx")
    with Index.open(tmp_path / "copy.ndx", readonly=True) as ix:
        assert ix.plan == plans.psm_plan(2000, K)
        got = ix.query_many(fps[:50], probabilities=np.full((50, 64), 0.1), max_probes=5)
        assert got.tolist() == want.tolist()


def test_the_inspector_shows_the_plan_flag(path):
    with Index.create(path, k=K, expected_n=5000, plan="psm", background_compaction=False) as ix:
        ix.add(np.arange(1, 5001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        ix.compact(full=True)
    tool = pathlib.Path(__file__).resolve().parents[2] / "tools" / "inspect_index.py"
    out = subprocess.run([sys.executable, str(tool), str(path)], capture_output=True, text=True,
                         check=True).stdout
    assert "tables 1 flags 0x01 (probabilistic)" in out
