"""Batch joins against a brute-force oracle on random and clustered data (hypothesis)."""

import numpy as np
from hypothesis import given, strategies as st

from ndindex import batch
from tests.oracle import clustered, near
from tests.unit.test_batch import as_set, brute_pairs


@st.composite
def join_inputs(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        stored = clustered(rng, draw(st.integers(1, 40)), draw(st.integers(1, 15)),
                           draw(st.integers(0, 6)))
    else:
        stored = rng.integers(0, 2**64, draw(st.integers(0, 400)), dtype=np.uint64)
    stored = np.unique(stored)
    queries = near(rng, stored, draw(st.integers(1, 60)), draw(st.integers(0, 7))) \
        if len(stored) else rng.integers(0, 2**64, 5, dtype=np.uint64)
    return queries, stored, draw(st.integers(0, 7)), draw(st.integers(1, 300))


@given(join_inputs())
def test_join_matches_brute_force(inputs):
    queries, stored, k, chunk = inputs
    assert as_set(batch.join(queries, stored, k, workers=1, chunk_size=chunk)) == \
        brute_pairs(queries, stored, k)


@given(join_inputs())
def test_self_join_matches_brute_force(inputs):
    _, stored, k, chunk = inputs
    assert as_set(batch.self_join(stored, k, workers=1, chunk_size=chunk)) == \
        brute_pairs(stored, stored, k, self_join=True)
