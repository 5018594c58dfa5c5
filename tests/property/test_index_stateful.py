"""Hypothesis state machine: the index against an in-memory model.

Operations: add (with and without keys), remove by fingerprint and by key,
single compaction steps (so queries meet half-done merges), compact
(incremental and full), transactions that commit or roll back (with
queries inside, and removals of what they added), reopen, query (one and
many), with durability "full" or "normal", and pending additions indexed
after 0, 2 or the default overlay.PENDING_SCAN_MAX of them; batches of
hundreds of values spread over the whole range, and removals of the
largest values of one table's order.  Chunks and
merge steps are shrunk so that tiny indexes pass through every state the
layout has.  After every step queries equal brute force over the model,
and verify() passes after compactions.  Values come from a few tight clusters, so near-duplicates,
repeated adds and removals of present values are common.
"""

import shutil
import tempfile

import numpy as np
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ndindex import chunks, compaction, overlay
from ndindex.index import Index
from tests.oracle import brute_force

CENTRES = [0x0123456789ABCDEF, 0xFEDCBA9876543210, 0x8000000000000001, 0x0, 0xFFFFFFFFFFFFFFFF]
fingerprint = st.builds(lambda c, flips: CENTRES[c] ^ sum(1 << b for b in flips),
                        st.integers(0, len(CENTRES) - 1),
                        st.sets(st.integers(0, 63), max_size=4))
doc_key = st.sampled_from(["a", "b", "c", b"d", "e"])


class IndexMachine(RuleBasedStateMachine):
    @initialize(log_limit=st.integers(3, 40), durability=st.sampled_from(["full", "normal"]),
                scan_max=st.sampled_from([0, 2, overlay.PENDING_SCAN_MAX]))
    def setup(self, log_limit, durability, scan_max):
        overlay.PENDING_SCAN_MAX = scan_max  # restored by the test case's tearDown
        self.dir = tempfile.mkdtemp()
        self.path = f"{self.dir}/m.ndx"
        self.opts = dict(log_limit=log_limit, durability=durability, background_compaction=False)
        self.ix = Index.create(self.path, k=3, expected_n=200, **self.opts)
        self.keys = {}  # fingerprint -> set of keys (None marks a keyless add)
        self.removed = set()  # fingerprints removed once: added again by readd

    def live(self):
        return np.array(sorted(self.keys), dtype=np.uint64)

    @rule(fps=st.lists(fingerprint, min_size=1, max_size=12), with_keys=st.booleans(), data=st.data())
    def add(self, fps, with_keys, data):
        keys = [data.draw(doc_key) for _ in fps] if with_keys else None
        self.ix.add(fps, keys=keys)
        for i, fp in enumerate(fps):
            self.keys.setdefault(fp, set()).add(keys[i] if keys else None)

    @rule(n=st.integers(150, 500), seed=st.integers(0, 2**32 - 1))
    def add_many(self, n, seed):
        # Spread over the whole range: runs of several chunks, merged in
        # several steps.
        fps = np.random.default_rng(seed).integers(0, 2**64, n, dtype=np.uint64)
        self.ix.add(fps)
        for fp in fps.tolist():
            self.keys.setdefault(fp, set()).add(None)

    @precondition(lambda self: len(self.keys) > 20)
    @rule(table=st.integers(0, 3), fraction=st.floats(0.05, 0.6))
    def remove_a_tables_tail(self, table, fraction):
        # The largest values of one table's order: a merge of that table may
        # then find nothing left for its final step.
        live = self.live()
        design = self.ix.plan.tables[table % len(self.ix.plan.tables)]
        order = np.argsort(design.apply(live))
        gone = live[order[len(live) - max(1, int(fraction * len(live))):]]
        assert self.ix.remove(fingerprints=gone) == len(gone)
        for fp in gone.tolist():
            del self.keys[fp]
            self.removed.add(fp)

    @precondition(lambda self: self.keys)
    @rule(data=st.data())
    def remove_fingerprint(self, data):
        fp = data.draw(st.sampled_from(sorted(self.keys)))
        assert self.ix.remove(fingerprints=[fp]) == 1
        del self.keys[fp]
        self.removed.add(fp)

    @precondition(lambda self: self.removed)
    @rule(data=st.data(), again=st.booleans())
    def readd(self, data, again):
        # Removed, added again (and maybe removed again at once): the
        # tombstone cases drawn fingerprints almost never reach.
        fp = data.draw(st.sampled_from(sorted(self.removed)))
        self.ix.add([fp])
        self.keys.setdefault(fp, set()).add(None)
        if again:
            assert self.ix.remove(fingerprints=[fp]) == 1
            del self.keys[fp]

    @rule(key=doc_key)
    def remove_key(self, key):
        expected = 0
        for fp in list(self.keys):
            if key in self.keys[fp]:
                self.keys[fp].discard(key)
                # The documented rule: a fingerprint goes with its last key,
                # even if it was also added without one.
                if not self.keys[fp] - {None}:
                    del self.keys[fp]
                    expected += 1
        assert self.ix.remove(keys=[key]) == expected

    @rule(full=st.booleans())
    def compact(self, full):
        self.ix.compact(full=full)
        self.ix.verify()

    @rule(force_flush=st.booleans())
    def compaction_step(self, force_flush):
        self.ix._compactor.step(force_flush=force_flush)

    @rule()
    def flush_log(self):
        # A flush with no merge after it: older runs stay beside the new
        # one and its tombstones (the shape a second removal once broke).
        self.ix._compactor.flush_log()

    @rule(fps=st.lists(fingerprint, min_size=1, max_size=6), commit=st.booleans())
    def transaction(self, fps, commit):
        # check_and_add inside a transaction sees the transaction's own adds;
        # an exception rolls every operation of the block back.
        model = {fp: set(keys) for fp, keys in self.keys.items()}
        try:
            with self.ix.transaction():
                for fp in fps:
                    seen = bool(brute_force(np.array(sorted(model), dtype=np.uint64), fp, 0))
                    matches = self.ix.check_and_add(fp, k=0)
                    assert bool(matches) == seen
                    if not seen:
                        model[fp] = {None}
                if not commit:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            return
        self.keys = model

    @rule(fps=st.lists(fingerprint, min_size=1, max_size=10), data=st.data(),
          commit=st.booleans())
    def transaction_with_removes(self, fps, data, commit):
        # Additions, removals of some of them and of stored values, and
        # additions again, with queries in between that must see all of it.
        model = {fp: set(keys) for fp, keys in self.keys.items()}
        try:
            with self.ix.transaction():
                self.ix.add(fps)
                for fp in fps:
                    model.setdefault(fp, set()).add(None)
                for _ in range(data.draw(st.integers(1, 4))):
                    if model and data.draw(st.booleans()):
                        gone = data.draw(st.sampled_from(sorted(model)))
                        self.ix.remove(fingerprints=[gone])
                        del model[gone]
                    else:
                        back = data.draw(st.sampled_from(fps))
                        self.ix.add([back])
                        model.setdefault(back, set()).add(None)
                    q, k = data.draw(fingerprint), data.draw(st.integers(0, 3))
                    live = np.array(sorted(model), dtype=np.uint64)
                    assert [(m.fingerprint, m.distance) for m in self.ix.query(q, k)] == \
                        brute_force(live, q, k)
                if not commit:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            return
        self.keys = model

    @rule(fps=st.lists(fingerprint, min_size=1, max_size=6), data=st.data(),
          inner_fails=st.booleans(), commit=st.booleans())
    def savepoint(self, fps, data, inner_fails, commit):
        # A block inside a block: its exception, caught by the outer block,
        # undoes its own operations (additions with keys, removals) and
        # nothing of the outer block's; queries see each state.
        def check(model):
            q, k = data.draw(fingerprint), data.draw(st.integers(0, 3))
            live = np.array(sorted(model), dtype=np.uint64)
            assert [(m.fingerprint, m.distance) for m in self.ix.query(q, k)] == \
                brute_force(live, q, k)

        model = {fp: set(keys) for fp, keys in self.keys.items()}
        try:
            with self.ix.transaction():
                self.ix.add(fps[:1], keys=["outer"])
                model.setdefault(fps[0], set()).add("outer")
                inner = {fp: set(keys) for fp, keys in model.items()}
                try:
                    with self.ix.transaction():
                        self.ix.add(fps[1:])
                        for fp in fps[1:]:
                            inner.setdefault(fp, set()).add(None)
                        if inner and data.draw(st.booleans()):
                            gone = data.draw(st.sampled_from(sorted(inner)))
                            self.ix.remove(fingerprints=[gone])
                            del inner[gone]
                        check(inner)
                        if inner_fails:
                            raise LookupError
                    model = inner
                except LookupError:
                    pass
                check(model)
                for fp in fps:
                    assert set(self.ix.keys(fp)) == set(model.get(fp, ())) - {None}
                if not commit:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            return
        self.keys = model

    @rule()
    def reopen(self):
        self.ix.close()
        self.ix = Index.open(self.path, **self.opts)

    @rule(q=fingerprint, k=st.integers(0, 3))
    def query(self, q, k):
        want = brute_force(self.live(), q, k)
        got = self.ix.query(q, k)
        assert [(m.fingerprint, m.distance) for m in got] == want
        for m in got:
            assert set(m.keys) == {key for key in self.keys[m.fingerprint] if key is not None}

    @rule(qs=st.lists(fingerprint, min_size=1, max_size=8))
    def query_many(self, qs):
        res = self.ix.query_many(qs, 3)
        live = self.live()
        for i, q in enumerate(qs):
            rows = res[res["query"] == i]
            assert list(zip(rows["fingerprint"].tolist(), rows["distance"].tolist())) == \
                brute_force(live, q, 3)

    @invariant()
    def count(self):
        if hasattr(self, "ix"):
            assert len(self.ix) == len(self.keys)

    def teardown(self):
        if hasattr(self, "ix"):
            try:
                self.ix.verify()
            finally:
                # Closed even when verify fails: shrinking a failure runs
                # hundreds of machines, and each open index holds 1 TiB of
                # address space (LMDB's map).
                self.ix.close()
                shutil.rmtree(self.dir, ignore_errors=True)


def small_steps():
    """Chunks of one block, merged one chunk per step."""
    saved = compaction.STEP_CHUNKS, chunks.CHUNK_MAX_BLOCKS
    compaction.STEP_CHUNKS, chunks.CHUNK_MAX_BLOCKS = 1, 1
    return saved


class TestIndexMachine(IndexMachine.TestCase):
    def setUp(self):
        self._saved = small_steps(), overlay.PENDING_SCAN_MAX

    def tearDown(self):
        (compaction.STEP_CHUNKS, chunks.CHUNK_MAX_BLOCKS), overlay.PENDING_SCAN_MAX = self._saved


TestIndexMachine.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
