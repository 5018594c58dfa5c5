"""Documents stored in an index agree with the in-memory pipeline, in every state.

The oracle is ``ndindex.documents.near_duplicate_pairs`` on the same
texts: the index stores the same sketches and lookup keys, so its pairs,
clusters and similar() answers must be exactly the pipeline's, whatever
runs, merges and log the records sit in.
"""

import numpy as np
import pytest

from ndindex import chunks, compaction, levels
from ndindex.documents import near_duplicate_pairs
from ndindex.errors import NdindexError
from ndindex.fingerprint import Fingerprinter
from ndindex.fingerprint.normalize import BinaryDataError
from ndindex.index import Index
from ndindex.records import SPACE_DOCS, SPACE_LOOKUP

VOCAB = [f"w{i}" for i in range(3000)]


def make_texts(n, seed=0):
    """Random texts, a third of them edited copies of earlier ones (near-duplicates)."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(n):
        if i > 5 and rng.random() < 0.35:
            words = texts[int(rng.integers(0, i))].split()
            for _ in range(int(rng.integers(0, 4))):
                words[int(rng.integers(0, len(words)))] = VOCAB[int(rng.integers(0, len(VOCAB)))]
            if rng.random() < 0.3:
                words = words[: max(3, len(words) - int(rng.integers(0, 5)))]
        else:
            words = [VOCAB[int(x)] for x in rng.zipf(1.3, int(rng.integers(4, 120))) % len(VOCAB)]
        texts.append(" ".join(words))
    return texts


def oracle_pairs(texts, keys, threshold=0.8):
    got = near_duplicate_pairs(texts, threshold, workers=1).pairs
    return {(keys[a], keys[b]): j for a, b, j in zip(got["a"].tolist(), got["b"].tolist(),
                                                     got["jaccard"].tolist())}


def index_pairs(ix, threshold=None):
    return {tuple(sorted((a, b))): j for a, b, j in ix.near_duplicate_pairs(threshold)}


def check_similar(ix, texts, keys, want, sample):
    for i in sample:
        got = {m.key: m.similarity for m in ix.similar(texts[i])}
        expect = {b if a == keys[i] else a: j for (a, b), j in want.items() if keys[i] in (a, b)}
        expect[keys[i]] = 1.0
        assert got.keys() == expect.keys(), keys[i]
        for key, sim in expect.items():
            assert got[key] == pytest.approx(sim)
        by_key = {m.key for m in ix.similar(key=keys[i])}
        assert by_key == set(expect) - {keys[i]}


@pytest.fixture
def small_steps(monkeypatch):
    monkeypatch.setattr(compaction, "STEP_CHUNKS", 1)
    monkeypatch.setattr(chunks, "CHUNK_MAX_BLOCKS", 1)
    monkeypatch.setattr(chunks, "RECORD_CHUNK_BLOCKS", 1)
    monkeypatch.setattr(chunks, "RECORD_BLOCK_BYTES", 1024)


@pytest.fixture
def texts():
    return make_texts(400)


def sorted_pairs(d):
    return {tuple(sorted(k)): v for k, v in d.items()}


@pytest.mark.parametrize("state", ["log", "runs", "mid-merge", "main"])
def test_pairs_and_similar_equal_the_in_memory_pipeline(tmp_path, texts, small_steps, state,
                                                        monkeypatch):
    keys = [f"t{i:04d}" for i in range(len(texts))]
    want = sorted_pairs(oracle_pairs(texts, keys))
    assert len(want) > 50
    # log_limit=4 and level 1 of eight flushes: it holds 32 entries, so each
    # flush of 50 is a level-0 run merged up in steps (a smaller one merges
    # into level 1 in its commit).
    monkeypatch.setattr(levels, "SMALL_LEVEL_RATIO", levels.LEVEL_RATIO)
    ix = Index.create(tmp_path / "d.ndx", k=3, fingerprinter=Fingerprinter(),
                      background_compaction=False, log_limit=4)
    with ix:
        merging = False
        for a in range(0, len(texts), 50):
            ix.add_documents(texts[a:a + 50], keys[a:a + 50])
            if state != "log":
                ix._compactor.step(force_flush=True)
            if state == "mid-merge":
                # Stop in the middle of a merge of every kind of space.
                for _ in range(3):
                    ix._compactor.step()
                spaces = {r.space for r in ix._snapshot().manifest.runs if r.merge_into}
                merging |= {0, SPACE_DOCS, SPACE_LOOKUP} <= spaces
        assert merging or state != "mid-merge"
        if state == "main":
            ix.compact(full=True)
        got = index_pairs(ix)
        assert got.keys() == want.keys()
        for pair, j in want.items():
            assert got[pair] == pytest.approx(j)
        check_similar(ix, texts, keys, want, range(0, len(texts), 7))
        clusters = ix.clusters()
        joined = {frozenset(c) for c in clusters}
        for a, b in want:
            assert any(a in c and b in c for c in joined)
        ix.verify()


def test_replacing_and_removing_documents(tmp_path, texts):
    keys = [f"t{i}" for i in range(len(texts))]
    with Index.create(tmp_path / "d.ndx", k=3, fingerprinter=Fingerprinter(),
                      background_compaction=False) as ix:
        ix.add_documents(texts, keys)
        ix.compact()
        # Replace half the texts under the same keys, remove a quarter.
        new_texts = list(texts)
        rng = np.random.default_rng(5)
        changed = rng.choice(len(texts), 200, replace=False)
        fresh = make_texts(200, seed=9)
        for i, t in zip(changed.tolist(), fresh):
            new_texts[i] = t
        ix.add_documents([new_texts[i] for i in changed.tolist()],
                         [keys[i] for i in changed.tolist()])
        gone = rng.choice(len(texts), 100, replace=False).tolist()
        ix.remove(keys=[keys[i] for i in gone])
        live = [i for i in range(len(texts)) if i not in set(gone)]
        want = sorted_pairs(oracle_pairs([new_texts[i] for i in live], [keys[i] for i in live]))
        for step in ("log", "flushed", "full"):
            got = index_pairs(ix)
            assert got.keys() == want.keys(), step
            check_similar(ix, [new_texts[i] for i in live], [keys[i] for i in live], want,
                          range(0, len(live), 11))
            # Exactly the live documents' records remain: no lookup key of a
            # removed or replaced text survives.
            snap = ix._snapshot()
            docs = dict(snap.space_records(SPACE_DOCS))
            assert len(docs) == len(live)
            lookups = {k for k, _ in snap.space_records(SPACE_LOOKUP)}
            from ndindex.docstore import unpack_document
            expect = set()
            for key, value in docs.items():
                for lk in unpack_document(value).lookup_keys.tolist():
                    expect.add(lk.to_bytes(8, "big") + key[:8])
            assert lookups == expect, step
            if step == "log":
                ix.compact()
            else:
                ix.compact(full=True)
        ix.verify()


def test_removing_a_fingerprint_removes_its_documents_and_keeps_others(tmp_path):
    text = "the same words in the same order make the same simhash every time"
    with Index.create(tmp_path / "d.ndx", k=3, fingerprinter=Fingerprinter(),
                      background_compaction=False) as ix:
        ix.add_documents([text, text, text + " again"], ["a", "b", "c"])
        fp = ix.similar(key="a")[0].fingerprint
        assert {m.key for m in ix.similar(key="a")} == {"b", "c"}
        ix.remove(keys=["b"])
        assert {m.key for m in ix.similar(text)} == {"a", "c"}
        ix.remove(fingerprints=[fp])
        assert {m.key for m in ix.similar(text)} == {"c"}
        assert fp not in ix


def test_transactions_and_durability_cover_documents(tmp_path):
    texts = make_texts(60, seed=3)
    keys = [f"k{i}" for i in range(60)]
    path = tmp_path / "d.ndx"
    with Index.create(path, k=3, fingerprinter=Fingerprinter(), durability="normal") as ix:
        ix.add_documents(texts[:30], keys[:30])
        with pytest.raises(RuntimeError):
            with ix.transaction():
                ix.add_documents(texts[30:], keys[30:])
                assert ix.similar(texts[40])[0].key == "k40"  # visible inside
                raise RuntimeError("roll back")
        assert all(m.key in keys[:30] for m in ix.similar(texts[40]))
        with ix.transaction():
            ix.add_documents(texts[30:], keys[30:], data=[b"x%d" % i for i in range(30)])
    with Index.open(path, readonly=True) as ix:
        assert ix.similar(texts[40])[0].key == "k40"
        assert ix.document_data("k45") == b"x15"
        assert ix.document_data("k5") == b""
        assert index_pairs(ix) == sorted_pairs(oracle_pairs(texts, keys))


def test_document_errors(tmp_path):
    with Index.create(tmp_path / "plain.ndx", k=3) as ix:
        with pytest.raises(NdindexError, match="without a fingerprinter"):
            ix.add_documents(["some text here"], ["a"])
        with pytest.raises(NdindexError, match="without a fingerprinter"):
            ix.similar("some text here")
    with Index.create(tmp_path / "d.ndx", k=3, fingerprinter=Fingerprinter()) as ix:
        with pytest.raises(ValueError, match="no words"):
            ix.add_documents(["ok words are here", "   "], ["a", "b"])
        assert len(ix) == 0  # nothing written
        assert ix.add_documents(["ok words are here", ""], ["a", "b"], skip_empty=True) == 1
        with pytest.raises(ValueError, match="twice"):
            ix.add_documents(["one two three", "four five six"], ["x", "x"])
        with pytest.raises(ValueError, match="2 texts but 1 keys"):
            ix.add_documents(["one two three", "four five six"], ["x"])
        with pytest.raises(TypeError):
            ix.add_documents([1234], ["x"])
        with pytest.raises(BinaryDataError):
            ix.add_documents([b"\x00\x01\x02binary\x00" * 20], ["bin"])
        # In a batch, the error names the document (it named none) and the
        # way to take binary input (add_documents has no binary= of its own).
        with pytest.raises(BinaryDataError, match=r"document 'bin2' looks binary \(2 such .*"
                                                  r"Fingerprinter\(binary='text'\)"):
            ix.add_documents(["some words of text", b"\x00\x01" * 9, b"\x00zz"],
                             ["fine", "bin2", "bin3"])
        with pytest.raises(ValueError, match="below"):
            ix.similar("ok words are here", threshold=0.5)
        with pytest.raises(TypeError):
            ix.similar("ok", key="a")
        with pytest.raises(KeyError):
            ix.similar(key="missing")
        with pytest.raises(ValueError, match="at most"):
            ix.add_documents(["one two three four"], ["d"], data=[b"x" * 2000])
        # Data is bytes (or None): bytes(5) would store five zero bytes.
        for bad in ([5], ["text"], [1.5], b"flat bytes for two texts", 7):
            with pytest.raises(TypeError, match="data"):
                ix.add_documents(["one two three four", "five six seven eight"], ["d", "e"],
                                 data=bad)
        with pytest.raises(TypeError, match="data of one text is bytes"):
            ix.add_documents("one two three four", "d", data="text")
        assert ix.add_documents(["one two three four", "five six seven eight"], ["d", "e"],
                                data=[None, bytearray(b"2")]) == 2
        assert ix.document_data("d") == b"" and ix.document_data("e") == b"2"
        assert [m.key for m in ix.similar("ok words are here", threshold=0.9)] == ["a"]
        # One text and one key also work, bytes keys too.
        assert ix.add_documents("one more text", b"raw") == 1
        assert ix.similar(key=b"raw") == []
        # One text with a list of keys names the mix-up, not the key's type.
        with pytest.raises(TypeError, match="one text takes one key, got a list of keys"):
            ix.add_documents("one more text", ["k"])

        with pytest.raises(TypeError, match="iterables"):
            ix.add_documents(1234, ["k"])
        with pytest.raises(TypeError, match="a Fingerprinter or its bytes.*Fingerprinter\\(\\)"):
            Index.create(tmp_path / "named.ndx", fingerprinter="default")


def test_add_documents_takes_iterables_as_lists(tmp_path):
    """Generators of texts, keys and data add what the same lists add (as
    add() takes any iterable of fingerprints)."""
    texts = ["the first text of this test, with several words",
             "a second text that shares nothing with the first one",
             "and a third, different again from both of the others"]
    keys, data = ["a", "b", "c"], [b"1", b"2", b"3"]
    with Index.create(tmp_path / "lists.ndx", fingerprinter=Fingerprinter()) as ix:
        assert ix.add_documents(texts, keys, data=data) == 3
        expected = sorted(ix.documents())
    with Index.create(tmp_path / "gens.ndx", fingerprinter=Fingerprinter()) as ix:
        assert ix.add_documents((t for t in texts), iter(keys), data=(d for d in data)) == 3
        assert sorted(ix.documents()) == expected
        assert ix.document_data("b") == b"2"


def test_data_of_one_text_is_bytes(tmp_path):
    with Index.create(tmp_path / "d.ndx", fingerprinter=Fingerprinter()) as ix:
        with pytest.raises(TypeError, match="data of one text is bytes"):
            ix.add_documents("a text of several words to store", "k", data=[b"x"])
        ix.add_documents("a text of several words to store", "k", data=b"x")
        assert ix.document_data("k") == b"x"
