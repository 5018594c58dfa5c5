"""LogOverlay.apply_all (one sort over every record) against apply (one record at a time)."""

import numpy as np
from hypothesis import given, settings, strategies as st

from ndindex.overlay import LogOverlay
from ndindex.records import LogRecord


@st.composite
def records(draw):
    """Records over a small value space, so values recur: each record's adds
    and removes disjoint, as LogRecord promises."""
    out = []
    for _ in range(draw(st.integers(0, 8))):
        ops = draw(st.dictionaries(st.integers(0, 40), st.booleans(), max_size=25))
        adds = np.array(sorted(v for v, add in ops.items() if add), dtype=np.uint64)
        removes = np.array(sorted(v for v, add in ops.items() if not add), dtype=np.uint64)
        if draw(st.booleans()):
            removes = removes[:0]  # add-only logs take the one-sort fast path
        out.append(LogRecord(adds, removes, [], []))
    return out


@settings(max_examples=300, deadline=None)
@given(before=records(), after=records())
def test_apply_all_equals_applying_one_by_one(before, after):
    one, all_at_once = LogOverlay(), LogOverlay()
    for r in before + after:
        one.apply(r)
    for r in before:      # a state to extend, as a snapshot extends its predecessor's log
        all_at_once.apply(r)
    all_at_once.apply_all(after)
    assert one.adds.tolist() == all_at_once.adds.tolist()
    assert one.removes.tolist() == all_at_once.removes.tolist()
    assert one.records == all_at_once.records
    assert all_at_once.adds.dtype == np.uint64 and all_at_once.removes.dtype == np.uint64


@settings(max_examples=300, deadline=None)
@given(logs=st.lists(records(), max_size=6), recent_min=st.sampled_from([0, 2, 4096]))
def test_the_net_effect_is_each_values_last_operation(logs, recent_min):
    # Against a model: a value is added or removed as its last operation
    # says.  Records arrive a few at a time, as snapshots extend each other's
    # logs; a small RECENT_MIN folds the recent additions often.
    from ndindex import arrays
    saved, arrays.RECENT_MIN = arrays.RECENT_MIN, recent_min
    try:
        log, last = LogOverlay(), {}
        for batch in logs:
            log = log.copy()
            had = log.adds.tolist()
            fresh = log.apply_all(batch)
            # Records that only add report what they added that was not there.
            if any(len(r.removes) for r in batch):
                assert fresh is None
            else:
                assert fresh.tolist() == sorted(set(log.adds.tolist()) - set(had))
            for r in batch:
                last.update((v, False) for v in r.removes.tolist())
                last.update((v, True) for v in r.adds.tolist())
            assert log.n_adds() == sum(last.values())
            probe = np.arange(0, 41, dtype=np.uint64)
            assert log.added(probe).tolist() == [last.get(v, False) for v in range(41)]
        assert log.adds.tolist() == sorted(v for v, add in last.items() if add)
        assert log.removes.tolist() == sorted(v for v, add in last.items() if not add)
    finally:
        arrays.RECENT_MIN = saved


def test_additions_leave_the_older_part_alone_until_a_fold():
    # A record of additions costs O(its size + recent): the older array is
    # the same object until recent outgrows its share.
    log = LogOverlay()
    log.apply(LogRecord(np.arange(0, 200_000, 2, dtype=np.uint64), np.zeros(0, np.uint64), [], []))
    older = log._adds[0]
    for i in range(10):
        log = log.copy()
        log.apply(LogRecord(np.arange(1 + 200 * i, 200 * (i + 1), 2, dtype=np.uint64),
                            np.zeros(0, np.uint64), [], []))
        assert log._adds[0] is older
    assert log.n_adds() == 100_000 + 1000 and len(log.adds) == 101_000
