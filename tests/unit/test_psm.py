"""ndindex.psm: the one-table probabilistic matcher, edge cases and misuse."""

import numpy as np
import pytest

from ndindex import _core, psm
from ndindex.fpfile import PAIR_DTYPE
from ndindex.index_queries import MATCH_DTYPE

P = np.full(64, 0.05)


def test_empty_table_finds_nothing():
    table = psm.PsmTable([])
    assert len(table) == 0 and table.header_bits == 1
    assert table.query(5, P, 3) == ([], 2)
    matches, probes = table.query_many(np.array([1, 2], dtype=np.uint64), np.tile(P, (2, 1)), 2)
    assert matches.dtype == MATCH_DTYPE and len(matches) == 0 and probes.tolist() == [2, 2]


def test_zero_header_bits_scan_the_whole_table():
    fps = np.array([0, 1, 3, 7, 2**63], dtype=np.uint64)
    table = psm.PsmTable(fps, 0)
    assert table.query(0, P, 2) == ([(0, 0), (1, 1), (2**63, 1), (3, 2)], 1)


def test_max_probes_zero_probes_nothing_and_one_probes_the_own_header():
    table = psm.PsmTable([2**63, 2**63 + 1, 1], 1)
    assert table.query(2**63, P, 1, max_probes=0) == ([], 0)
    assert table.query(2**63, P, 1, max_probes=1) == ([(2**63, 0), (2**63 + 1, 1)], 1)
    assert table.query(2**63, P, 1) == ([(2**63, 0), (2**63 + 1, 1)], 2)


def test_volatile_header_bit_is_probed_before_stable_ones():
    p = np.full(64, 1e-6)
    p[61] = 0.4                                     # a volatile header bit
    stored = 1 << 61
    table = psm.PsmTable([stored, 1 << 63], 4)
    matches, probes = table.query(0, p, 1, max_probes=2)
    assert matches == [(stored, 1)] and probes == 2
    assert table.headers(0, p, 1, 2).tolist() == [0, 0b0010]


def test_headers_above_the_header_range_match_nothing():
    table = psm.PsmTable([1, 2], 2)
    assert table.probe(1, np.array([7, 0], dtype=np.uint64), 1) == [(1, 0)]


def test_default_header_bits_and_exhaustive_probe_count():
    assert psm.default_header_bits(1) == 1 and psm.default_header_bits(10_000_000) == 23
    assert psm.flip_set_count(23, 3) == 1 + 23 + 253 + 1771
    assert psm.flip_set_count(2, 5) == 4


def test_collection_flushes_at_batch_size_and_merges():
    col = psm.PsmCollection(np.array([8], dtype=np.uint64), k=1, batch_size=2)
    assert len(col.add([9], P[None, :])) == 0 and col.pending == 1
    pairs = col.add([10, 11], np.tile(P, (2, 1)))      # 9, 10 complete the batch
    assert pairs.dtype == PAIR_DTYPE
    assert pairs.tolist() == [(9, 8, 1), (10, 8, 1)]      # 9 and 10 are 2 apart
    assert col.values.tolist() == [8, 9, 10] and col.pending == 1
    assert col.flush().tolist() == [(11, 9, 1), (11, 10, 1)]
    assert col.values.tolist() == [8, 9, 10, 11] and len(col.flush()) == 0


@pytest.mark.parametrize("call, error, message", [
    (lambda t: t.query(1, np.zeros(63), 1), ValueError, r"shape \(64,\)"),
    (lambda t: t.query(1, np.full(64, np.nan), 1), ValueError, r"\[0, 1\]"),
    (lambda t: t.query(1, P, -1), ValueError, "k must be"),
    (lambda t: t.query(1, P, 1, max_probes=-1), ValueError, "max_probes"),
    (lambda t: t.query(-1, P, 1), ValueError, "outside"),
    (lambda t: t.query("1", P, 1), TypeError, "must be an int"),
    (lambda t: t.query_many([1, 2], np.zeros((1, 64)), 1), ValueError, r"shape \(2, 64\)"),
    (lambda t: t.probe(1, [1], 65), ValueError, "k must be"),
])
def test_misuse_raises_builtin_errors(call, error, message):
    with pytest.raises(error, match=message):
        call(psm.PsmTable([1, 2, 3], 2))


def test_bad_tables_and_batches_raise():
    with pytest.raises(ValueError, match="header_bits"):
        psm.PsmTable([1], 41)
    with pytest.raises(ValueError, match="directory_bits"):
        psm.PsmTable([1], 4, directory_bits=5)
    with pytest.raises(ValueError, match="give max_probes"):
        psm.PsmTable([1], 40).query(1, P, 20)
    with pytest.raises(ValueError, match="sorted"):
        _core.psm_table(np.array([2, 1], dtype=np.uint64), 1, 1)
    with pytest.raises(ValueError, match="sorted"):
        _core.psm_join(np.array([1, 0], dtype=np.uint64), np.zeros(2, dtype=np.uint64),
                       np.zeros(1, dtype=np.uint64), 1, 1, False)
    with pytest.raises(ValueError, match="shape"):     # at the call, not at the first chunk
        psm.join([1, 2], np.zeros((3, 64)), [np.arange(4, dtype=np.uint64)], 1, header_bits=2)
    with pytest.raises(ValueError, match="batch_size"):
        psm.PsmCollection(k=1, batch_size=0)
    col = psm.PsmCollection(k=1, batch_size=4)
    with pytest.raises(ValueError, match="shape"):
        col.add([1, 2], np.zeros((3, 64)))
    assert col.pending == 0                               # bad input adds nothing


def test_unsorted_chunks_are_sorted_before_the_merge():
    fps = np.array([40, 3, 2**63, 1], dtype=np.uint64)
    pairs = list(psm.join([0, 2**63 + 1], np.tile(P, (2, 1)), [fps], 2, header_bits=2))
    assert [r.tolist() for r in pairs] == [[(0, 1, 1), (0, 3, 2), (0, 40, 2), (0, 2**63, 1),
                                            (2**63 + 1, 1, 1), (2**63 + 1, 3, 2),
                                            (2**63 + 1, 2**63, 1)]]


def test_candidate_pairs_pairs_documents_not_values():
    fps = np.array([5, 5, 4, 2**63], dtype=np.uint64)
    left, right = psm.candidate_pairs(fps, np.tile(P, (4, 1)), 1)
    assert list(zip(left.tolist(), right.tolist())) == [(0, 1), (0, 2), (1, 2)]
