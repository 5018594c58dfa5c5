"""VOSH (ndindex.vosh): every flip set once, in non-increasing probability
(Lemma 1), checked against brute-force enumeration; the C kernel against the
Python reference."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ndindex import vosh

# Probabilities with the awkward cases: 0, 1, 1/2 and repeats (ties).
prob = st.one_of(st.sampled_from([0.0, 1.0, 0.5, 0.25, 1e-12]),
                 st.floats(0.0, 1.0, allow_nan=False))
probs = st.lists(prob, min_size=0, max_size=9)


def brute_force(p, sizes):
    """All sets of the given sizes, sorted as the heap must pop them."""
    logits = vosh.log_odds(p)
    order = vosh.volatility_order(p)
    rank_of = {int(b): r for r, b in enumerate(order)}
    sorted_logits = logits[order].tolist()
    out = []
    for h in sizes:
        for bits in itertools.combinations(range(len(p)), h):
            ranks = tuple(sorted(rank_of[b] for b in bits))
            out.append((-vosh._key(sorted_logits, ranks), h, ranks))
    out.sort()
    return [tuple(int(order[r]) for r in ranks) for _, _, ranks in out]


def non_increasing(p, sets):
    """Whether log p(u, S) never grows along the sequence (with p clamped as
    the heap clamps it, so that p = 0 and p = 1 keep finite logarithms)."""
    q = np.clip(np.asarray(p, dtype=float), vosh.P_MIN, vosh.P_MAX)
    def log_p(s):
        inside = np.zeros(len(q), dtype=bool)
        inside[list(s)] = True
        return float(np.sum(np.where(inside, np.log(q), np.log1p(-q))))
    values = [log_p(s) for s in sets]
    return all(a >= b - 1e-9 * (1 + abs(b)) for a, b in zip(values, values[1:]))


@settings(max_examples=150, deadline=None)
@given(probs, st.data())
def test_each_size_every_set_once_in_non_increasing_probability(p, data):  # Lemma 1
    h = data.draw(st.integers(0, len(p)))
    got = list(vosh.flip_sets(p, h))
    assert len(got) == math.comb(len(p), h) and len(set(got)) == len(got)
    assert got == brute_force(p, [h])
    assert non_increasing(p, got)


@settings(max_examples=100, deadline=None)
@given(probs, st.data())
def test_merged_sizes_come_out_in_one_order(p, data):
    k = data.draw(st.integers(0, len(p)))
    got = list(vosh.flip_sets_upto(p, k))
    assert got == brute_force(p, range(k + 1))
    assert non_increasing(p, got)


@pytest.mark.parametrize("n,h", [(n, h) for n in range(0, 9) for h in range(0, n + 1)])
def test_children_form_a_tree_over_all_sets(n, h):
    """ProduceChildren gives every non-root set exactly one parent."""
    parents = {}
    for s in itertools.combinations(range(n), h):
        for child in vosh.produce_children(s, n):
            assert child not in parents, f"{child} has two parents"
            assert len(child) == h and all(0 <= r < n for r in child)
            assert list(child) == sorted(set(child))
            parents[child] = s
    assert set(parents) == set(itertools.combinations(range(n), h)) - {tuple(range(h))}


def test_left_and_right_children_follow_algorithm_2():
    assert vosh.produce_children((0, 2), 5) == [(0, 3), (1, 2)]   # gap 2 before the last run
    assert vosh.produce_children((0, 3), 5) == [(0, 4)]            # gap 3: no right child
    assert vosh.produce_children((0, 2, 3), 5) == [(0, 2, 4), (1, 2, 3)]
    assert vosh.produce_children((1, 2, 4), 5) == [(1, 3, 4)]      # last at n - 1: no left
    assert vosh.produce_children((0, 1, 2), 3) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(prob, min_size=0, max_size=12), st.data())
def test_c_kernel_gives_the_reference_sequence(p, data):
    n = len(p)
    positions = data.draw(st.permutations(range(64)))[:n]
    full = np.zeros(64)
    full[positions] = p
    k = data.draw(st.integers(0, n))
    exact = data.draw(st.booleans())
    cap = data.draw(st.one_of(st.none(), st.integers(0, 50)))
    sets = vosh.flip_sets(p, k) if exact else vosh.flip_sets_upto(p, k)
    want = [sum(1 << positions[b] for b in s) for s in sets]
    got = vosh.flip_masks(full, k, positions=positions, max_probes=cap, exact=exact)
    assert got.dtype == np.uint64
    assert got.tolist() == want[:cap]


def test_c_kernel_matches_reference_over_64_bits():
    rng = np.random.default_rng(3)
    p = rng.random(64) * 0.4
    p[10:20] = p[5]           # ties broken by bit position in both
    want = [sum(1 << b for b in s) for s in itertools.islice(vosh.flip_sets_upto(p, 3), 5000)]
    assert vosh.flip_masks(p, 3, max_probes=5000).tolist() == want


def test_most_volatile_bit_flips_first():
    p = np.full(64, 0.01)
    p[17] = 0.3
    masks = vosh.flip_masks(p, 2, max_probes=3)
    assert masks.tolist() == [0, 1 << 17, 1]   # ties: the lowest position first


@pytest.mark.parametrize("call, message", [
    (lambda: vosh.flip_masks(np.zeros(63), 1), "64 values"),
    (lambda: vosh.flip_masks(np.full(64, np.nan), 1), r"\[0, 1\]"),
    (lambda: vosh.flip_masks(np.full(64, 1.5), 1), r"\[0, 1\]"),
    (lambda: vosh.flip_masks(np.zeros(64), 3, positions=[1, 2]), "k must be in 0..2"),
    (lambda: vosh.flip_masks(np.zeros(64), 1, positions=[1, 1]), "distinct"),
    (lambda: vosh.flip_masks(np.zeros(64), 1, positions=[64]), "distinct"),
    (lambda: vosh.flip_masks(np.zeros(64), 1, max_probes=-1), "max_probes"),
    (lambda: vosh.flip_masks(np.zeros(64), 10), "give max_probes"),
    (lambda: list(vosh.flip_sets([0.1] * 65, 1)), "at most 64"),
    (lambda: list(vosh.flip_sets([0.1, 0.2], 3)), "h must be in 0..2"),
])
def test_bad_arguments_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
