"""Unit tests for ndindex.plan: designs, permutations, the plan record, X, the planner.

Statements [Pn] refer to format-spec/FORMAT.md section 6.
"""

import math

import numpy as np
import pytest

from ndindex.errors import FormatError
from ndindex.plan import (BLOCK_ENTRIES, MAX_PLANNER_K, PLAN_FLAG_PROBABILISTIC,
                          PSM_ENTRIES_PER_HEADER, Plan, TableDesign, block_design,
                          candidate_designs, choose_plan, example_3_1, flip_set_count,
                          psm_header_bits, psm_max_probes, psm_plan, x_tables)

RNG = np.random.default_rng(20070508)


def random_fps(count):
    return RNG.integers(0, 2**64, size=count, dtype=np.uint64, endpoint=False)


def naive_apply(perm, x):
    """[P8] bit by bit: output bit 63 - i is input bit perm[i]."""
    out = 0
    for i, src in enumerate(perm):
        out |= ((x >> src) & 1) << (63 - i)
    return out


def all_example_tables():
    return [(n, i, t) for n in (20, 16, 10, 4) for i, t in enumerate(example_3_1(n).tables)]


# --- Example 3.1 -------------------------------------------------------------

@pytest.mark.parametrize("num_tables, prefixes, worst_entries_at_2_34", [
    (20, {31, 32, 33}, 2**3),
    (16, {28}, 2**6),
    (10, {25, 26}, 2**9),
    (4, {16}, 2**18),
])
def test_example_3_1_tables_and_prefixes(num_tables, prefixes, worst_entries_at_2_34):
    plan = example_3_1(num_tables)
    assert plan.k == 3 and plan.f == 64
    assert len(plan.tables) == num_tables
    assert {t.prefix_bits for t in plan.tables} == prefixes
    assert plan.expected_probe_entries(2**34) == worst_entries_at_2_34
    for table in plan.tables:
        assert 2.0 ** (34 - table.prefix_bits) == 2**34 / 2**table.prefix_bits


def test_example_3_1_prefix_counts_per_table():
    # 20 tables: choose 3 of blocks (11,11,11,11,10,10). p=33: three 11s, C(4,3)=4;
    # p=32: two 11s + one 10, C(4,2)*2 = 12; p=31: one 11 + both 10s, 4.
    counts = lambda n: sorted(t.prefix_bits for t in example_3_1(n).tables)
    assert counts(20) == [31] * 4 + [32] * 12 + [33] * 4
    # 10 tables: choose 2 of (13,13,13,13,12): p=26 C(4,2)=6, p=25 with the 12-bit block 4.
    assert counts(10) == [25] * 4 + [26] * 6
    assert counts(16) == [28] * 16
    assert counts(4) == [16] * 4


def test_example_3_1_blocks_are_cut_from_the_msb_and_keep_order():
    # [P12] the 20-table design's table 0 leads with blocks 0,1,2 = bits 63..31,
    # then the remaining bits 30..0 in order: that is the identity.
    assert example_3_1(20).tables[0].permutation == tuple(range(63, -1, -1))
    # its last table (blocks 3,4,5 = bits 30..0) leads with 30..0, then 63..31.
    last = example_3_1(20).tables[-1]
    assert last.permutation == tuple(range(30, -1, -1)) + tuple(range(63, 30, -1))
    assert last.prefix_bits == 31
    # 16 tables: table 5 = first-level block 1 (47..32), then second-level block 1 of the
    # remaining 48 bits (63..48, 31..0 -> blocks 63..52, 51..48+31..24, 23..12, 11..0).
    t5 = example_3_1(16).tables[5]
    assert t5.permutation[:28] == (tuple(range(47, 31, -1)) + (51, 50, 49, 48)
                                   + tuple(range(31, 23, -1)))
    assert t5.permutation[28:] == tuple(range(63, 51, -1)) + tuple(range(23, -1, -1))


def test_example_3_1_rejects_other_counts():
    with pytest.raises(ValueError, match="20, 16, 10 or 4"):
        example_3_1(12)


# --- permutations ------------------------------------------------------------

@pytest.mark.parametrize("num_tables, index, table", all_example_tables())
def test_apply_matches_naive_bitwise_permutation(num_tables, index, table):
    fps = random_fps(64)
    got = table.apply(fps)
    want = np.array([naive_apply(table.permutation, int(x)) for x in fps], dtype=np.uint64)
    assert np.array_equal(got, want)


def test_runs_match_naive_for_random_permutations():
    rng = np.random.default_rng(7)
    for _ in range(50):
        perm = tuple(int(b) for b in rng.permutation(64))
        table = TableDesign(perm, int(rng.integers(0, 65)))
        # runs are maximal, disjoint, and cover all 64 output bits
        runs = table.runs()
        assert sum(length for _, _, length in runs) == 64
        for (s1, d1, n1), (s2, d2, n2) in zip(runs, runs[1:]):
            assert d1 == d2 + n2                      # listed from the top down, adjacent
            assert s1 != s2 + n2                      # else the two runs would merge
        for x in (0, 2**64 - 1, 0x0123456789ABCDEF, *map(int, random_fps(8))):
            assert table.apply(x) == naive_apply(perm, x)
            assert table.invert(table.apply(x)) == x


def test_apply_invert_round_trip_on_arrays():
    fps = random_fps(1000).reshape(10, 100)
    for plan in (example_3_1(20), example_3_1(16)):
        for table in plan.tables:
            permuted = table.apply(fps)
            assert permuted.shape == fps.shape and permuted.dtype == np.uint64
            assert np.array_equal(table.invert(permuted), fps)
            # a permutation preserves popcount [P9] (np.bitwise_count needs numpy 2; we allow 1.23)
            popcounts = lambda a: [bin(int(x)).count("1") for x in a.ravel()[:50]]
            assert popcounts(permuted) == popcounts(fps)


def test_apply_accepts_python_int_and_returns_int():
    table = example_3_1(4).tables[1]
    out = table.apply(0x0123456789ABCDEF)
    assert type(out) is int and out == 0x4567012389ABCDEF
    assert table.invert(out) == 0x0123456789ABCDEF


def test_apply_rejects_bad_inputs():
    table = example_3_1(4).tables[1]
    with pytest.raises(TypeError, match="uint64"):
        table.apply(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="0..2\\^64-1"):
        table.apply(2**64)
    with pytest.raises(ValueError):
        table.apply(-1)


def test_prefix_is_top_bits_and_zero_for_p0():
    perm = example_3_1(4).tables[2].permutation
    x = 0x0123456789ABCDEF
    for p in (0, 1, 16, 63, 64):
        table = TableDesign(perm, p)
        expected = naive_apply(perm, x) >> (64 - p) if p else 0
        assert table.prefix(x) == expected
        assert table.prefix(np.array([x], dtype=np.uint64))[0] == expected


def test_worked_example_in_spec():
    # format-spec/FORMAT.md section 6, "Worked example": F through the 4-table design, then a probe.
    plan = example_3_1(4)
    f = 0x0123456789ABCDEF
    assert [hex(t.apply(f)) for t in plan.tables] == [
        "0x123456789abcdef", "0x4567012389abcdef", "0x89ab01234567cdef", "0xcdef0123456789ab"]
    assert [t.prefix(f) for t in plan.tables] == [0x0123, 0x4567, 0x89AB, 0xCDEF]
    assert [t.runs() for t in plan.tables] == [
        ((0, 0, 64),), ((32, 48, 16), (48, 32, 16), (0, 0, 32)),
        ((16, 48, 16), (32, 16, 32), (0, 0, 16)), ((0, 48, 16), (16, 0, 48))]
    q = f ^ (1 << 60 | 1 << 40 | 1 << 5)
    assert q == 0x1123446789ABCDCF
    same = [t.prefix(q) == t.prefix(f) for t in plan.tables]
    assert same == [False, False, True, False]
    t2 = plan.tables[2]
    assert t2.apply(f) ^ t2.apply(q) == 0x0000100001000020
    assert bin(t2.apply(f) ^ t2.apply(q)).count("1") == 3


def test_table_design_rejects_non_permutations():
    with pytest.raises(ValueError, match="each of 0..63 once"):
        TableDesign(tuple(range(63)) + (0,), 10)
    with pytest.raises(ValueError, match="prefix_bits"):
        TableDesign(tuple(range(64)), 65)


# --- the plan record -----------------------------------------------------------

SPEC_4_TABLE_HEAD = bytes.fromhex("40030400" "10" "3f3e3d3c")   # [P1]-[P8] worked example


def test_to_bytes_layout_matches_spec_example():
    data = example_3_1(4).to_bytes()
    assert len(data) == 4 + 65 * 4 == 264                          # [P1]
    assert data.startswith(SPEC_4_TABLE_HEAD)
    assert data[4 + 65: 4 + 65 + 3] == bytes([16, 47, 46])         # table 1: p=16, 47, 46
    assert data[-3:] == bytes([18, 17, 16])


@pytest.mark.parametrize("plan", [example_3_1(n) for n in (20, 16, 10, 4)]
                         + [choose_plan(10**7, k) for k in range(MAX_PLANNER_K + 1)]
                         + [psm_plan(10**7, k) for k in (0, 3, 10)])
def test_to_bytes_from_bytes_round_trip(plan):
    back = Plan.from_bytes(plan.to_bytes())
    assert back == plan
    assert back.to_bytes() == plan.to_bytes()


def good_record():
    return bytearray(example_3_1(4).to_bytes())


def test_from_bytes_rejects_short_and_wrong_length():                    # [P1]
    with pytest.raises(FormatError, match="2 bytes, expected at least 4"):
        Plan.from_bytes(b"\x40\x03")
    data = good_record()
    with pytest.raises(FormatError, match="263 bytes, expected 264 for t=4"):
        Plan.from_bytes(bytes(data[:-1]))
    with pytest.raises(FormatError, match="265 bytes, expected 264"):
        Plan.from_bytes(bytes(data) + b"\0")


def test_from_bytes_rejects_f_not_64():                                  # [P2]
    data = good_record()
    data[0] = 32
    with pytest.raises(FormatError, match="f is 32, expected 64"):
        Plan.from_bytes(bytes(data))


def test_from_bytes_rejects_k_64_and_accepts_k_63():                     # [P3]
    data = good_record()
    data[1] = 64
    with pytest.raises(FormatError, match="k is 64, expected 0..63"):
        Plan.from_bytes(bytes(data))
    data[1] = 63
    assert Plan.from_bytes(bytes(data)).k == 63


def test_from_bytes_rejects_zero_tables():                               # [P4]
    with pytest.raises(FormatError, match="t is 0"):
        Plan.from_bytes(bytes([64, 3, 0, 0]))


@pytest.mark.parametrize("flags, reserved", [(0x02, 0x02), (0x80, 0x80), (0xFF, 0xFE),
                                              (0x03, 0x02)])
def test_from_bytes_rejects_reserved_flag_bits(flags, reserved):          # [P5]
    data = bytearray(psm_plan(1000, 3).to_bytes())
    data[3] = flags
    with pytest.raises(FormatError, match=f"flags byte 3 is {flags:#04x}: reserved bits "
                                          f"{reserved:#04x} are set, expected 0"):
        Plan.from_bytes(bytes(data))


def test_flags_bit_0_marks_a_probabilistic_plan():                        # [P5], [P13]
    plan = psm_plan(10**7, 3)
    data = plan.to_bytes()
    assert data[3] == PLAN_FLAG_PROBABILISTIC == 1 and len(data) == 4 + 65
    back = Plan.from_bytes(data)
    assert back.probabilistic and back == plan
    assert example_3_1(4).to_bytes()[3] == 0 and not Plan.from_bytes(good_record()).probabilistic
    # The flag is part of the plan's identity: same table, other meaning.
    assert Plan(k=3, tables=plan.tables) != plan


def test_a_probabilistic_plan_has_one_table():                            # [P13]
    data = good_record()
    data[3] = PLAN_FLAG_PROBABILISTIC
    with pytest.raises(FormatError, match=r"probabilistic \(flags bit 0\) with t=4, expected t=1"):
        Plan.from_bytes(bytes(data))
    with pytest.raises(ValueError, match="one table, found 4"):
        Plan(k=3, tables=example_3_1(4).tables, probabilistic=True)


def test_psm_plan_is_one_identity_table_of_psm_header_bits():
    for n in (1, 1000, 10**6, 10**7, 10**12):
        plan = psm_plan(n, 3)
        assert plan.probabilistic and plan.k == 3 and len(plan.tables) == 1
        assert plan.tables[0].permutation == tuple(range(63, -1, -1))
        assert plan.tables[0].prefix_bits == psm_header_bits(n)
        assert "probabilistic" in plan.describe().splitlines()[0]
    assert psm_plan(10**7, 10, header_bits=17).tables[0].prefix_bits == 17
    with pytest.raises(ValueError, match="header_bits must be 1..40"):
        psm_plan(1000, 3, header_bits=0)
    with pytest.raises(ValueError, match="header_bits must be 1..40"):
        psm_plan(1000, 3, header_bits=41)
    with pytest.raises(ValueError, match=r"k must be in 0\.\.12, got 13"):
        psm_plan(1000, MAX_PLANNER_K + 1)
    with pytest.raises(TypeError, match="k must be an int, got float"):
        choose_plan(1000, 3.0)


def test_psm_header_bits_expects_psm_entries_per_header():
    for n in (10**4, 10**6, 10**7, 10**9):
        p = psm_header_bits(n)
        assert p == round(math.log2(n / PSM_ENTRIES_PER_HEADER))
        assert abs(math.log2(n / 2**p / PSM_ENTRIES_PER_HEADER)) <= 0.5
    assert psm_header_bits(1) == 1 and psm_header_bits(2**60) == 40
    for n in (0, 2**64):
        with pytest.raises(ValueError, match=r"expected_n must be in 1\.\.2\^64-1"):
            psm_header_bits(n)


def test_psm_max_probes_grows_with_k():
    assert [psm_max_probes(k) for k in (3, 6, 10)] == [64, 128, 256]
    assert all(psm_max_probes(k) <= psm_max_probes(k + 1) for k in range(63 - 1))
    with pytest.raises(ValueError, match="0..63"):
        psm_max_probes(64)


def test_flip_set_count():
    assert flip_set_count(23, 3) == 1 + 23 + 253 + 1771
    assert flip_set_count(16, 0) == 1 and flip_set_count(2, 5) == 4


def test_from_bytes_rejects_prefix_over_64():                            # [P6]
    data = good_record()
    data[4 + 65 * 2] = 65
    with pytest.raises(FormatError, match="table 2: prefix_bits is 65, expected 0..64"):
        Plan.from_bytes(bytes(data))
    data[4 + 65 * 2] = 64
    assert Plan.from_bytes(bytes(data)).tables[2].prefix_bits == 64


def test_from_bytes_rejects_non_permutations():                          # [P7]
    data = good_record()
    entry = 4 + 65 * 3 + 1
    data[entry + 5] = 64
    with pytest.raises(FormatError, match="table 3: permutation byte 5 is 64, expected 0..63"):
        Plan.from_bytes(bytes(data))
    data = good_record()
    data[entry + 0] = 17          # table 3 starts 15, 14, ...; 17 appears later too
    with pytest.raises(FormatError, match="table 3: permutation repeats bit 17"):
        Plan.from_bytes(bytes(data))


def test_plan_constructor_rejects_misuse():
    table = example_3_1(4).tables[0]
    with pytest.raises(ValueError, match="f must be 64"):
        Plan(k=3, tables=(table,), f=32)
    with pytest.raises(ValueError, match="1..255 tables"):
        Plan(k=3, tables=())
    with pytest.raises(ValueError, match="1..255 tables"):
        Plan(k=3, tables=(table,) * 256)


# --- covers ----------------------------------------------------------------------

def test_covers():
    plan = example_3_1(4)
    assert plan.covers([60, 40, 5])                 # block C clean
    assert not plan.covers([60, 40, 20, 5])         # one bit in every block
    assert plan.covers([])
    with pytest.raises(ValueError, match="0..63"):
        plan.covers([64])


# --- X(f, k, d) ---------------------------------------------------------------------

def test_x_tables_hand_computed():
    # tau = 19: r = 4 gains 16 bits, d' = 18 < 19, so C(4,3) * 1 = 4; no r > 3 has C(r,3) < 4.
    assert x_tables(64, 3, 34, 19) == 4
    # tau = 10: r = 4 leaves d' = 18 >= 10, and on the 48 bits left r = 5 (10,10,10,9,9) gains
    # 18..20 so C(5,3) = 10, r = 4 gains 12 -> d' = 6 < 10 so 4: X(48,3,18) = 4, total 16.
    # r = 5 at the top: gains 25 or 26, d' = 9 or 8 < 10, so C(5,3) = 10 < 16.  X = 10.
    assert x_tables(64, 3, 34, 10) == 10
    # tau = 7: r = 4, then r = 4 on 48 bits gains 12 -> d' = 6 < 7: 4 * 4 = 16.
    # r = 5: d' = 8 or 9 >= 7, and X(38 or 39, 3, 9 or 8) = 4 (r = 4 gains >= 9), so 40.
    # r = 6: gains 31..33, d' <= 3: 20.  X = 16 (Example 3.1's 16-table design).
    assert x_tables(64, 3, 34, 7) == 16
    # tau = 4: r = 6 gives d' <= 3 < 4: 20.  r = 4: X(48,3,18,4) = 10 (r = 5 gains >= 18),
    # total 40; r = 5: X(38..39,3,8..9,4) = 4, total 40.  X = 20 (the 20-table design).
    assert x_tables(64, 3, 34, 4) == 20
    # d < tau: a single table.
    assert x_tables(64, 3, 10, 11) == 1
    # k = 0: one table holds the whole fingerprint as prefix, gaining 64 bits.
    assert x_tables(64, 0, 34, 0) == 1


def test_x_tables_matches_paper_formula_when_blocks_divide_evenly():
    # f = 64, r = 4 divides: C(4,3) * X(16*3, 3, d - 16); check the r = 4 branch is what wins.
    assert x_tables(48, 3, 18, 7) == 4 == math.comb(4, 3) * x_tables(12, 3, 6, 7)


def test_x_tables_unreachable_raises():
    # at most f - k = 61 bits of prefix can be gained: d = 70, tau = 5 is unreachable.
    with pytest.raises(ValueError, match="at most 61 prefix bits"):
        x_tables(64, 3, 70, 5)
    with pytest.raises(ValueError):
        x_tables(0, 3, 10, 5)


# --- candidates and the planner ---------------------------------------------------------

def test_k0_is_one_identity_table():
    (plan,) = candidate_designs(0)
    assert len(plan.tables) == 1
    assert plan.tables[0].prefix_bits == 64
    assert plan.tables[0].permutation == tuple(range(63, -1, -1))
    assert choose_plan(10**6, 0) == plan


def test_candidates_for_k3_include_example_3_1():
    shapes = {(len(p.tables), tuple(sorted(t.prefix_bits for t in p.tables)))
              for p in candidate_designs(3)}
    for n in (20, 16, 10, 4):
        plan = example_3_1(n)
        assert (n, tuple(sorted(t.prefix_bits for t in plan.tables))) in shapes


def test_k7_needs_at_least_8_blocks():
    plans = candidate_designs(7)
    assert min(len(p.tables) for p in plans) == 8      # 8 blocks of 8, choose 1
    assert all(len(p.tables) <= 255 for p in plans)


def test_choose_plan_10m_k3_picks_four_tables():
    # 10M / 2^16 = 153 entries < BLOCK_ENTRIES: a probe already fits one block.
    plan = choose_plan(10_000_000, 3)
    assert len(plan.tables) == 4
    assert {t.prefix_bits for t in plan.tables} == {16}
    assert plan.expected_probe_entries(10_000_000) < BLOCK_ENTRIES


def test_choose_plan_8b_k3_picks_more_tables():
    # 4 tables would expect 8e9 / 2^16 = 122,070 entries (679 blocks) per probe.
    plan = choose_plan(8_000_000_000, 3)
    assert len(plan.tables) == 10
    assert plan.estimated_query_cost(8e9) < example_3_1(4).estimated_query_cost(8e9) / 100


def test_choose_plan_budgets():
    assert len(choose_plan(8_000_000_000, 3, max_tables=4).tables) == 4
    assert len(choose_plan(8_000_000_000, 3, max_tables=9).tables) == 4
    plan = choose_plan(2**34, 3, max_probe_entries=64)
    assert len(plan.tables) == 16          # the 10-table design expects 512
    plan = choose_plan(2**34, 3, max_probe_entries=8)
    assert len(plan.tables) == 20


@pytest.mark.parametrize("kwargs, message", [
    (dict(expected_n=10, k=-1), r"k must be in 0\.\.12, got -1"),
    (dict(expected_n=10, k=13), r"k must be in 0\.\.12, got 13"),
    (dict(expected_n=0, k=3), r"expected_n must be in 1\.\.2\^64-1"),
    (dict(expected_n=2**64, k=3), r"expected_n must be in 1\.\.2\^64-1"),
    (dict(expected_n=10, k=3, max_tables=3), "too few for k=3"),
    (dict(expected_n=2**34, k=3, max_probe_entries=1e-6), "expects at most 1e-06"),
    (dict(expected_n=10, k=3, max_probe_entries=0), "must be > 0"),
])
def test_choose_plan_errors(kwargs, message):
    # Twice: the planner's cache keeps answers, never errors.
    for _ in range(2):
        with pytest.raises(ValueError, match=message):
            choose_plan(**kwargs)


def test_choose_plan_answers_repeated_arguments_from_its_cache():
    # check_and_add_many plans a self-join per call; the answer is the same
    # immutable Plan each time, and arguments that differ get their own.
    assert choose_plan(1000, 3) is choose_plan(1000, 3)
    assert choose_plan(1000, 3) == choose_plan(1000.0, 3)
    assert choose_plan(8_000_000_000, 3) is not choose_plan(1000, 3)
    assert choose_plan(8_000_000_000, 3, max_tables=4) != choose_plan(8_000_000_000, 3)


def test_block_design_rejects_impossible_splits():
    with pytest.raises(ValueError, match="need 3 < r"):
        block_design(3, (3,))
    with pytest.raises(ValueError, match="more than 255"):
        block_design(3, (12, 4))


def test_describe_lists_every_table():
    text = example_3_1(16).describe()
    lines = text.splitlines()
    assert "k=3" in lines[0] and "t=16" in lines[0] and "p=28..28" in lines[0]
    assert len(lines) == 17
    assert "in[47:32]->out[63:48]" in lines[5]
