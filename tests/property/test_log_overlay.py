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
