"""Nested transaction() blocks: each inner block is a savepoint.

An exception in an inner block undoes that block's operations only; the
enclosing block, if it catches it, goes on and commits its own.  Checked
against a model of what each block did, in the Index that ran them and
after a reopen, under both durabilities.
"""

from __future__ import annotations

import numpy as np
import pytest

from ndindex.fingerprint import Fingerprinter
from ndindex.index import Index
from tests.interrupts import ctrl_c_at_call
from tests.oracle import check_queries
from tests.unit.test_index import put_in_state


class Boom(Exception):
    pass


def content(ix) -> dict:
    """Every stored fingerprint with its keys."""
    return {fp: ix.keys(fp) for fp in ix.fingerprints().tolist()}


@pytest.mark.parametrize("durability", ["full", "normal"])
@pytest.mark.parametrize("state", ["log", "main"])
def test_an_exception_in_an_inner_block_undoes_that_block_alone(tmp_path, durability, state):
    rng = np.random.default_rng(5)
    stored = np.unique(rng.integers(0, 2**64, 2000, dtype=np.uint64))
    outer, inner, later = (np.unique(rng.integers(0, 2**64, 50, dtype=np.uint64))
                           for _ in range(3))
    path = str(tmp_path / "t.ndx")
    with Index.create(path, k=3, background_compaction=False, durability=durability) as ix:
        put_in_state(ix, stored, state)
        with ix.transaction():
            ix.add(outer, keys=[f"o{i}" for i in range(len(outer))])
            ix.remove(stored[:10])
            before = content(ix)
            with pytest.raises(Boom):
                with ix.transaction():
                    ix.add(inner, keys=[f"i{i}" for i in range(len(inner))])
                    ix.add(outer[:5], keys=["extra"] * 5)     # a second key on outer ones
                    ix.remove(stored[10:20])
                    ix.remove(keys=["o7"])
                    assert ix.check_and_add(int(later[0])) == []
                    assert len(ix.query(int(inner[3]), k=0)) == 1
                    raise Boom
            assert content(ix) == before
            assert ix.query(int(inner[3]), k=0) == [] and ix.query(int(later[0]), k=0) == []
            # The undone check_and_add leaves nothing behind: it adds again.
            assert ix.check_and_add(int(later[0])) == []
            ix.add(later[1:])
        live = np.union1d(np.union1d(stored[10:], outer), later)
        want = {fp: () for fp in live.tolist()}
        want.update({fp: (f"o{i}",) for i, fp in enumerate(outer.tolist())})
        assert content(ix) == want
        queries = np.concatenate([inner ^ np.uint64(1), stored[:20] ^ np.uint64(6),
                                  outer ^ np.uint64(1)])
        check_queries(ix, live, queries, 3)
    with Index.open(path) as ix:
        ix.verify()
        assert content(ix) == want


def test_blocks_three_deep_undo_only_what_the_failing_block_and_those_inside_it_did(tmp_path):
    path = str(tmp_path / "t.ndx")
    with Index.create(path, k=3) as ix:
        with ix.transaction():
            ix.add([1 << 20])
            with ix.transaction():
                ix.add([2 << 20])
                try:
                    with ix.transaction():
                        ix.add([3 << 20])
                        with ix.transaction():       # ends normally: joins its parent
                            ix.add([4 << 20])
                        raise Boom
                except Boom:
                    pass
                ix.add([5 << 20])
            try:
                with ix.transaction():
                    ix.add([6 << 20])
                    raise Boom
            except Boom:
                pass
        assert ix.fingerprints().tolist() == [1 << 20, 2 << 20, 5 << 20]
        with pytest.raises(Boom):
            with ix.transaction():
                ix.add([7 << 20])
                with ix.transaction():
                    ix.add([8 << 20])
                raise Boom                           # the outermost: everything goes
        assert ix.fingerprints().tolist() == [1 << 20, 2 << 20, 5 << 20]


def documents(ix) -> list:
    return sorted((key, data) for key, _, data in ix.documents())


def test_an_inner_block_of_documents_is_undone_with_its_texts(tmp_path):
    path = str(tmp_path / "d.ndx")
    with Index.create(path, k=3, fingerprinter=Fingerprinter()) as ix:
        with ix.transaction():
            ix.add_documents(["the first document, kept whole"], keys=["kept"], data=[b"1"])
            try:
                with ix.transaction():
                    ix.add_documents(["a second text that the block undoes"], keys=["gone"],
                                     data=[b"2"])
                    ix.add_documents(["the first document, given new data"], keys=["kept"],
                                     data=[b"3"])
                    assert ix.document_data("gone") == b"2"
                    raise Boom
            except Boom:
                pass
            assert documents(ix) == [("kept", b"1")]
        assert documents(ix) == [("kept", b"1")]
        assert [m.key for m in ix.similar("a second text that the block undoes")] in ([], ["kept"])
    with Index.open(path) as ix:
        assert documents(ix) == [("kept", b"1")]


@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("durability", ["full", "normal"])
def test_ctrl_c_as_a_failed_inner_block_ends_undoes_both_blocks_and_the_writer_goes_on(
        tmp_path, durability):
    # A real SIGINT as the first Python function after an inner block's
    # exception starts.  The end of a contextlib block began with such
    # points, and one cut it short: the block counted for ever, every later
    # call pending, never committed (sweep_interrupt_points, savepoint-normal,
    # 1 point in 400).  Now that function is the end itself, Ctrl-C held back.
    import sys
    path = str(tmp_path / "t.ndx")
    hook = ctrl_c_at_call()

    with Index.create(path, k=3, durability=durability, background_compaction=False) as ix:
        ix.add([1 << 40])
        with pytest.raises(KeyboardInterrupt):
            with ix.transaction():
                ix.add([2 << 40])
                try:
                    with ix.transaction():
                        ix.add([3 << 40])
                        sys.setprofile(hook)
                        raise Boom
                except Boom:
                    pass
        sys.setprofile(None)
        assert hook.sent == ["_end_block"] and not ix._writer.in_transaction
        # Held back to the end of the inner block's end, the interrupt lands
        # in the outer block (undone) or as its end returns (committed).
        seen = ix.fingerprints().tolist()
        assert seen in ([1 << 40], [1 << 40, 2 << 40])
        ix.add([4 << 40])
        assert ix.fingerprints().tolist() == seen + [4 << 40]
    with Index.open(path) as ix:
        assert ix.fingerprints().tolist() == seen + [4 << 40]


@pytest.mark.parametrize("durability", ["full", "normal"])
@pytest.mark.parametrize("nested", [False, True])
def test_close_inside_a_block_rolls_it_back_and_its_end_raises_closed_error(
        tmp_path, durability, nested):
    # Under durability "normal", close() checkpointed the half-done block
    # into the file, and its end then failed with an IndexError (nested)
    # or counted the writer's blocks below zero.
    from ndindex.errors import ClosedError
    path = str(tmp_path / "t.ndx")
    ix = Index.create(path, k=3, durability=durability, background_compaction=False)
    ix.add([1 << 30])
    ix.add([2 << 30])        # under "normal": journaled, pending, acknowledged
    with pytest.raises(ClosedError):
        with ix.transaction():
            ix.add([3 << 30])
            if nested:
                with ix.transaction():
                    ix.add([4 << 30])
                    ix.close()
            else:
                ix.close()
    assert ix._writer._txn_depth == 0 and not ix._writer.lock._is_owned()
    with Index.open(path) as ix:
        assert ix.fingerprints().tolist() == [1 << 30, 2 << 30]


def test_a_transaction_decorates_a_function_each_call_one_commit(tmp_path):
    path = str(tmp_path / "t.ndx")
    with Index.create(path, k=3) as ix:
        @ix.transaction()
        def add_two(a, b, fail=False):
            ix.add([a])
            ix.add([b])
            if fail:
                raise Boom
            return len(ix)

        assert add_two(1 << 20, 2 << 20) == 2
        with pytest.raises(Boom):
            add_two(3 << 20, 4 << 20, fail=True)
        assert add_two(5 << 20, 6 << 20) == 4
        assert ix.fingerprints().tolist() == [1 << 20, 2 << 20, 5 << 20, 6 << 20]
