"""The query kernel's prefix probe (_core.query_prefixes) against brute force.

Any list of prefixes (repeats, any order, none) over a table of any
permutation and prefix length, with the stored set spread over a run, the
log and a transaction's pending additions and removals: the kernel reports
exactly the live values within k of q whose permuted prefix is listed.
"""

import numpy as np
from hypothesis import given, settings, strategies as st

from ndindex import _core, plan as plans
from ndindex.index import Index
from tests.oracle import brute_force, clustered, near


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 20), st.integers(0, 6), st.booleans(),
       st.data())
def test_prefix_probe_equals_brute_force_under_the_listed_prefixes(tmp_path_factory, seed, p, k,
                                                                    permuted, draw):
    rng = np.random.default_rng(seed)
    fps = np.concatenate([clustered(rng, 30, 8, 3), rng.integers(0, 2**64, 100, dtype=np.uint64)])
    rng.shuffle(fps)
    perm = tuple(int(b) for b in rng.permutation(64)) if permuted else tuple(range(63, -1, -1))
    design = plans.TableDesign(perm, p)
    plan = plans.Plan(k=6, tables=(design,), probabilistic=True)
    path = tmp_path_factory.mktemp("ix") / "p.ndx"
    with Index.create(path, k=6, plan=plan, background_compaction=False) as ix:
        ix.add(fps[:200])
        ix.compact()                     # a run
        ix.add(fps[200:260])             # the log
        ix.remove(fingerprints=fps[:20])
        with ix.transaction():           # pending: additions and removals
            ix.add(fps[260:])
            ix.remove(fingerprints=fps[200:210])
            live = np.setdiff1d(np.unique(fps), np.concatenate([fps[:20], fps[200:210]]))
            live = np.union1d(live, np.setdiff1d(fps[260:], fps[200:210]))
            snap = ix._snapshot()
            pend = ix._writer.visible_pending()
            for q in near(rng, fps, 4, k).tolist():
                own = design.prefix(q)
                listed = draw.draw(st.lists(st.one_of(
                    st.integers(0, (1 << p) - 1),
                    st.sampled_from([own ^ (1 << b) for b in range(p)] or [0])), max_size=30))
                prefixes = np.array(listed + ([own] if draw.draw(st.booleans()) else []),
                                    dtype=np.uint64)
                allowed = set(prefixes.tolist())
                want = [(f, d) for f, d in brute_force(live, q, k) if design.prefix(f) in allowed]
                got = _core.query_prefixes(snap.kernel, 0, q, k, prefixes, pend.adds(),
                                           pend.removes())
                assert got == want
