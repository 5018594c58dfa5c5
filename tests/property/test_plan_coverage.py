"""Coverage of table designs: any <= k flipped bits leave some table's prefix intact.

This is [P10] of format-spec/FORMAT.md section 6, checked through apply()/prefix() (what
the index does on a probe), not only through Plan.covers().
"""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ndindex.plan import MAX_PLANNER_K, candidate_designs, choose_plan, example_3_1

DESIGNS = {k: candidate_designs(k) for k in range(MAX_PLANNER_K + 1)}
SIZES = [1, 1000, 10**6, 10**7, 10**8, 10**9, 8 * 10**9, 2**40, 10**13]


def prefixes_kept(plan, fp, flipped):
    """Per table: does the prefix of the permuted fingerprint survive the flips?"""
    mask = 0
    for bit in flipped:
        mask |= 1 << bit
    pair = np.array([fp, fp ^ mask], dtype=np.uint64)
    kept = []
    for table in plan.tables:
        before, after = table.prefix(pair)
        kept.append(before == after)
    return kept


@st.composite
def design_fingerprint_flips(draw, plans_for_k):
    k = draw(st.integers(0, MAX_PLANNER_K))
    plan = draw(st.sampled_from(plans_for_k(k)))
    fp = draw(st.integers(0, 2**64 - 1))
    flipped = draw(st.sets(st.integers(0, 63), max_size=k))
    return plan, fp, flipped


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(design_fingerprint_flips(lambda k: DESIGNS[k]))
def test_every_candidate_design_keeps_some_prefix(case):
    plan, fp, flipped = case
    kept = prefixes_kept(plan, fp, flipped)
    assert any(kept), f"{plan.scheme}: flips {sorted(flipped)} touch every prefix"
    assert plan.covers(flipped)
    # the two views agree table by table: a prefix survives iff it avoids the flips
    for table, survived in zip(plan.tables, kept):
        assert survived == set(flipped).isdisjoint(table.permutation[:table.prefix_bits])


@settings(max_examples=200, deadline=None)
@given(k=st.integers(0, MAX_PLANNER_K), n=st.sampled_from(SIZES) | st.integers(1, 10**13),
       fp=st.integers(0, 2**64 - 1), data=st.data())
def test_chosen_design_keeps_some_prefix(k, n, fp, data):
    plan = choose_plan(n, k)
    assert plan in DESIGNS[k]
    flipped = data.draw(st.sets(st.integers(0, 63), max_size=k))
    assert any(prefixes_kept(plan, fp, flipped))


@settings(max_examples=100, deadline=None)
@given(k=st.integers(1, 7), fp=st.integers(0, 2**64 - 1), data=st.data())
def test_one_flip_per_block_still_covered(k, fp, data):
    # Random flip sets rarely hit every block; aim one flip at a distinct block
    # (a table's leading run) on purpose, the case pigeonhole is about.
    plan = data.draw(st.sampled_from(DESIGNS[k]))
    heads = sorted({t.permutation[0] for t in plan.tables})
    flipped = set(data.draw(st.lists(st.sampled_from(heads), max_size=k, unique=True)))
    assert any(prefixes_kept(plan, fp, flipped))


def exhaustive_flip_masks(max_flips):
    masks = [0]
    for size in range(1, max_flips + 1):
        for combo in itertools.combinations(range(64), size):
            masks.append(sum(1 << b for b in combo))
    return np.array(masks, dtype=np.uint64)


def assert_all_flip_sets_covered(plan, max_flips, fp):
    masks = exhaustive_flip_masks(max_flips)
    queries = np.uint64(fp) ^ masks
    covered = np.zeros(len(masks), dtype=bool)
    for table in plan.tables:
        covered |= table.prefix(queries) == table.prefix(fp)
    missed = np.flatnonzero(~covered)
    assert missed.size == 0, f"{plan.scheme}: flip mask {int(masks[missed[0]]):#x} uncovered"


@pytest.mark.parametrize("num_tables", [20, 16, 10, 4])
def test_example_3_1_covers_all_flip_sets_up_to_3(num_tables):
    # all C(64,0..3) = 43745 flip sets, through prefix() on a numpy array
    assert_all_flip_sets_covered(example_3_1(num_tables), 3, 0x0123456789ABCDEF)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_all_candidates_cover_all_flip_sets_for_small_k(k):
    for plan in DESIGNS[k]:
        assert_all_flip_sets_covered(plan, k, 0xFEDCBA9876543210)


def test_four_flips_defeat_the_four_table_design():
    # the check above can fail: one flip in each of the four 16-bit blocks.
    plan = example_3_1(4)
    assert not any(prefixes_kept(plan, 0, {63, 47, 31, 15}))
    assert not plan.covers({63, 47, 31, 15})
