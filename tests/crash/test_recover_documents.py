"""ndindex recover on a document index: every document whose record verifies comes back whole.

The fixture stores 300 texts (a third near-duplicates of others) with keys
and data via add_documents: most in one compacted run of small record
chunks (one sub-block each), a replacement and a removal after it, and a
last batch still in the log.  Recovery rebuilds the documents from their
0xF3 records (lookup-key records are derived again, never read) and must
give back the same keys, sketches, data and similar() answers; damage to
one document chunk loses exactly the documents in it, and nothing else.
verify() must catch a damaged fingerprinter record (its value or its
name) and read every document record in the runs.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil

import numpy as np
import pytest

from damage import contents, damage_value, flip, occurrences, records
from ndindex import CorruptionError
from ndindex import chunks as ch, recover, records as rec
from ndindex.fingerprint import Fingerprinter
from ndindex.index import Index

VOCAB = [f"w{i}" for i in range(2000)]


def make_texts(n: int, seed: int = 3) -> list[str]:
    """Random texts, a third of them edited copies of earlier ones (near-duplicates)."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(n):
        if i > 5 and rng.random() < 0.35:
            words = texts[int(rng.integers(0, i))].split()
            words[int(rng.integers(0, len(words)))] = VOCAB[int(rng.integers(0, len(VOCAB)))]
        else:
            words = [VOCAB[int(x)] for x in rng.zipf(1.3, int(rng.integers(8, 80))) % len(VOCAB)]
        texts.append(" ".join(words))
    return texts


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(path of the pristine document index, its texts by live key)."""
    path = str(tmp_path_factory.mktemp("recover-docs") / "pristine.ndx")
    texts = make_texts(300)
    keys = [f"t{i:03d}" for i in range(len(texts))]
    saved = ch.RECORD_CHUNK_BLOCKS, ch.RECORD_BLOCK_BYTES
    tmp = path + ".build"
    try:
        with Index.create(tmp, k=3, fingerprinter=Fingerprinter(), background_compaction=False,
                          log_limit=1 << 30) as ix:
            # Many small document chunks (one 1 KB sub-block each).
            ch.RECORD_CHUNK_BLOCKS, ch.RECORD_BLOCK_BYTES = 1, 1024
            ix.add_documents(texts[:250], keys[:250],
                             data=[f"data of {k}".encode() for k in keys[:250]])
            ix.compact(full=True)
            texts[7] = texts[8]  # a replacement, and a removal, newer than the run
            ix.add_documents([texts[7]], [keys[7]], data=[b"replaced"])
            ix.remove(keys=[keys[9]])
            ix.compact()
            ix.add_documents(texts[250:], keys[250:])  # the log
            ix.vacuum_into(path)
    finally:
        ch.RECORD_CHUNK_BLOCKS, ch.RECORD_BLOCK_BYTES = saved
        for leftover in (tmp, tmp + "-lock"):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
    live = {k: t for k, t in zip(keys, texts) if k != keys[9]}
    return path, live


@pytest.fixture
def damaged(built, tmp_path):
    src, live = built
    path = str(tmp_path / "index.ndx")
    shutil.copyfile(src, path)
    return path, live


def documents(path) -> dict:
    """{key: (fingerprint, data, sketch as a tuple)} of every stored document."""
    with Index.open(path, readonly=True) as ix:
        stored = ix._stored_documents(ix._doc_config)
        sketches = {raw: tuple(stored.docs.sketch(i).tolist()) for i, raw in enumerate(stored.keys)}
        return {key: (fp, data, sketches[rec.encode_doc_key(key)])
                for key, fp, data in ix.documents()}


def similar_answers(path, live: dict, sample) -> dict:
    with Index.open(path, readonly=True) as ix:
        out = {}
        for key in sample:
            out[key] = [(m.key, m.similarity, m.fingerprint) for m in ix.similar(live[key])]
            with contextlib.suppress(KeyError):
                out[key, "by key"] = [(m.key, m.similarity) for m in ix.similar(key=key)]
        return out


def run_recover(path, tmp_path) -> tuple[dict, str]:
    out = str(tmp_path / "recovered.ndx")
    report = recover.recover(path, out)
    assert report["output"] == out
    with Index.open(out, readonly=True) as ix:
        ix.verify()
    return report, out


def test_undamaged_document_index_round_trips_exactly(damaged, tmp_path):
    path, live = damaged
    report, out = run_recover(path, tmp_path)
    assert report["status"] == 0 and report["complete"], report["problems"]
    want = documents(path)
    assert set(want) == set(live)
    assert want["t007"][1] == b"replaced" and want["t100"][1] == b"data of t100"
    assert documents(out) == want
    assert report["documents"] == len(want)
    assert contents(out) == contents(path)
    sample = sorted(live)[::9]
    assert similar_answers(out, live, sample) == similar_answers(path, live, sample)
    with Index.open(path, readonly=True) as old, Index.open(out, readonly=True) as new:
        assert new.fingerprinter == old.fingerprinter
        assert new.near_duplicate_pairs() == old.near_duplicate_pairs()
        design = new._snapshot().view.get(rec.DB_META, rec.KEY_KEY_DESIGN)
        assert design == old._snapshot().view.get(rec.DB_META, rec.KEY_KEY_DESIGN)
        # The lookup-key records were derived again, and equal the source's.
        assert list(new._snapshot().space_records(rec.SPACE_LOOKUP, None)) == \
            list(old._snapshot().space_records(rec.SPACE_LOOKUP, None))


def test_damaged_document_chunk_loses_exactly_its_documents(damaged, tmp_path):
    path, live = damaged
    want, before = documents(path), contents(path)
    doc_chunks = [(k, v) for k, v in records(path, rec.DB_CHUNKS) if k[0] == rec.SPACE_DOCS]
    assert len(doc_chunks) > 20
    key, value = doc_chunks[len(doc_chunks) // 2]
    in_chunk = {rec.decode_doc_key(k[8:]) for k, flag, _ in
                ch.unpack_record_chunk(key, value).all_records() if flag == ch.RECORD_PUT}
    assert in_chunk and in_chunk <= set(want)
    damage_value(path, rec.DB_CHUNKS, key, at=5)  # under the header checksum
    report, out = run_recover(path, tmp_path)
    assert documents(out) == {k: d for k, d in want.items() if k not in in_chunk}
    # Their fingerprints and keys are kept; only the documents are lost, and counted.
    assert contents(out) == before
    assert report["status"] == 1 and not report["complete"]
    assert report["counts"]["documents_maybe_lost"] == len(in_chunk)
    assert report["documents"] == len(want) - len(in_chunk)
    with Index.open(out, readonly=True) as ix:
        for k in in_chunk:
            assert ix.keys(want[k][0]) and k in ix.keys(want[k][0])
            with pytest.raises(KeyError):
                ix.document_data(k)
    kept = sorted(set(live) - in_chunk)[::7]
    got = similar_answers(out, live, kept)
    for key_ in kept:
        assert all(m[0] not in in_chunk for m in got[key_])


def test_damaged_lookup_key_chunk_loses_nothing(damaged, tmp_path):
    path, live = damaged
    want = documents(path)
    key = next(k for k, _ in records(path, rec.DB_CHUNKS) if k[0] == rec.SPACE_LOOKUP)
    damage_value(path, rec.DB_CHUNKS, key, at=5)
    report, out = run_recover(path, tmp_path)
    assert report["status"] == 0, report["problems"]
    assert documents(out) == want
    sample = sorted(live)[::11]
    with Index.open(out, readonly=True) as ix:
        for k in sample:
            assert k in {m.key for m in ix.similar(live[k])}


def test_damaged_document_in_the_log_loses_its_operations(damaged, tmp_path):
    path, live = damaged
    want = documents(path)
    log = records(path, rec.DB_LOG)
    seq, payload = log[-1]  # the last batch (keys t250..t299), still in the log
    damage_value(path, rec.DB_LOG, seq, at=30)
    report, out = run_recover(path, tmp_path)
    assert report["status"] == 1
    late = {f"t{i:03d}" for i in range(250, 300)}
    assert documents(out) == {k: d for k, d in want.items() if k not in late}


def test_cli_recover_counts_documents(damaged, tmp_path, capsys):
    from ndindex import cli

    path, live = damaged
    out = str(tmp_path / "cli.ndx")
    assert cli.main(["recover", path, "-o", out]) == 0
    assert f"{len(live):,} documents" in capsys.readouterr().out
    key = next(k for k, _ in records(path, rec.DB_CHUNKS) if k[0] == rec.SPACE_DOCS)
    damage_value(path, rec.DB_CHUNKS, key, at=5)
    assert cli.main(["recover", path, "-o", str(tmp_path / "cli2.ndx")]) == 1
    printed = capsys.readouterr()
    assert "documents" in printed.out and "no readable document" in printed.err


@pytest.mark.parametrize("where", ["value", "name"])
def test_damaged_fingerprinter_record_fails_verify_and_keeps_documents_as_keys(damaged, tmp_path,
                                                                               where):
    path, live = damaged
    before = contents(path)
    if where == "value":
        damage_value(path, rec.DB_META, rec.KEY_FINGERPRINTER, at=10)
    else:  # the name in the meta leaf (the frame's checksum covers it)
        data = pathlib.Path(path).read_bytes()
        hits = occurrences(data, rec.KEY_FINGERPRINTER)
        assert hits
        for hit in hits:
            flip(path, hit + 3, 0x80)
    with Index.open(path, readonly=True) as ix:
        with pytest.raises(CorruptionError):
            ix.verify()
    report, out = run_recover(path, tmp_path)
    assert report["status"] == 1
    assert any("fingerprinter" in p for p in report["problems"])
    assert contents(out) == before
    with Index.open(out, readonly=True) as ix:
        assert ix.fingerprinter is None


def test_verify_parses_every_document_record_in_the_runs(damaged, monkeypatch):
    from ndindex import docstore

    path, live = damaged
    seen = []
    real = docstore.unpack_document

    def unpack(value, key=b""):
        seen.append(rec.decode_doc_key(bytes(key[8:])))
        if key[8:] == rec.encode_doc_key("t100"):
            raise CorruptionError("stands in for a document record that does not parse")
        return real(value, key)

    monkeypatch.setattr(docstore, "unpack_document", unpack)
    with Index.open(path, readonly=True) as ix:
        with pytest.raises(CorruptionError, match="does not parse"):
            ix.verify()
        seen.clear()
        monkeypatch.setattr(docstore, "unpack_document", lambda value, key=b"":
                            seen.append(rec.decode_doc_key(bytes(key[8:]))) or real(value, key))
        ix.verify()
    in_log = {f"t{i:03d}" for i in range(250, 300)}
    assert sorted(seen) == sorted(set(live) - in_log)
