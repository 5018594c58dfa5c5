"""The portable dump (format-spec/dump.md): round trips and damaged dumps."""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pytest
import zstandard

import ndindex
from ndindex import _core
from ndindex.codec import CODING_XOR
from ndindex.dump import HEAD, MAGIC, export_index, import_index
from ndindex.errors import CorruptionError, FormatError
from ndindex.fingerprint import Fingerprinter


def dump_of(ix) -> bytes:
    out = io.BytesIO()
    export_index(ix, out)
    return out.getvalue()


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """Two chunks' worth of fingerprints (70,000 > 65,536), keys of both types."""
    rng = np.random.default_rng(5)
    fps = rng.integers(0, 2**64, 70_000, dtype=np.uint64)
    path = tmp_path_factory.mktemp("dump") / "a.ndx"
    with ndindex.Index.create(path, k=4, expected_n=50_000, coding=CODING_XOR,
                              fingerprinter=Fingerprinter().to_bytes(), log_limit=20_000) as ix:
        ix.add(fps[:20_000])
        ix.add(fps[20_000:], keys=[f"doc{i}" for i in range(50_000)])
        ix.add([0, 2**64 - 1, 7, 7], keys=[b"\xff\x00raw", "max", "seven", b"seven"])
        ix.remove(fingerprints=fps[:10])
        ix.remove(keys=["doc3"])
        yield ix


def test_export_import_export_gives_identical_bytes_and_answers(index, tmp_path):  # [D12] [D13]
    first = dump_of(index)
    counts = import_index(io.BytesIO(first), tmp_path / "b.ndx")
    assert counts == {"fingerprints": len(index), "keys": 50_000 - 1 + 4}
    with ndindex.open(tmp_path / "b.ndx") as copy:
        assert dump_of(copy) == first
        assert copy.k == 4 and copy.plan == index.plan and copy.coding == CODING_XOR
        assert copy.expected_n == 50_000 and copy.fingerprinter == index.fingerprinter
        assert np.array_equal(copy.fingerprints(), index.fingerprints())
        assert copy.keys(7) == index.keys(7) == (b"seven", "seven")
        assert copy.keys(0) == (b"\xff\x00raw",) and copy.keys(2**64 - 1) == ("max",)
        queries = index.fingerprints()[::997] ^ np.uint64(0b1011)
        for q in queries[:50].tolist():
            assert copy.query(q) == index.query(q)
        assert np.array_equal(copy.query_many(queries), index.query_many(queries))
        copy.verify()
        assert copy.stats()["log_entries"] == 0     # compacted


def test_chunks_without_keys_beside_chunks_with_keys_round_trip(tmp_path):
    # A chunk whose fingerprints hold no keys is read at once (its zero
    # counts together); the next chunk's keys, the last fingerprint's
    # included, still come through one by one.
    fps = np.arange(1, 70_001, dtype=np.uint64) * np.uint64(2**40)
    with ndindex.Index.create(tmp_path / "a.ndx", k=3, expected_n=70_000) as ix:
        ix.add(fps)
        ix.add(fps[-3:], keys=["x", b"y", "z"])
        data = dump_of(ix)
    assert import_index(io.BytesIO(data), tmp_path / "b.ndx") == {"fingerprints": 70_000,
                                                                   "keys": 3}
    with ndindex.open(tmp_path / "b.ndx") as copy:
        assert dump_of(copy) == data
        assert copy.keys(int(fps[-1])) == ("z",) and copy.keys(int(fps[-3])) == ("x",)
        assert copy.keys(int(fps[0])) == () and len(copy) == 70_000
    # A key count that is not zero, in a chunk otherwise without keys, is
    # found, however late in the chunk.
    body = bytearray(body_of(data))
    at = HEAD.size  # past the header: plan, fingerprinter, checksum
    at += 4 + struct.unpack_from("<I", body, at)[0]
    at += 4 + struct.unpack_from("<I", body, at)[0] + 4
    assert struct.unpack_from("<I", body, at)[0] == 65_536  # the first chunk
    body[at + 4 + 8 * 65_536 + 2 * 65_535] = 1  # its last fingerprint says one key ...
    with pytest.raises(CorruptionError):  # ... which is not there
        import_index(io.BytesIO(recompress(bytes(body))), tmp_path / "c.ndx")
    assert not (tmp_path / "c.ndx").exists()


def test_empty_index_round_trips(tmp_path):
    with ndindex.Index.create(tmp_path / "e.ndx", k=2, expected_n=10) as ix:
        data = dump_of(ix)
    assert import_index(io.BytesIO(data), tmp_path / "f.ndx") == {"fingerprints": 0, "keys": 0}
    with ndindex.open(tmp_path / "f.ndx") as ix:
        assert len(ix) == 0 and ix.fingerprinter is None and dump_of(ix) == data


def body_of(data: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def recompress(body: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_checksum=True).compress(body)


def test_header_fields_and_trailer_counts(index):   # [D2] [D3] [D11]
    body = body_of(dump_of(index))
    magic, version, reserved, k, coding, reserved2, expected_n = struct.unpack_from("<8sHHBBHQ", body)
    assert (magic, version, reserved, k, coding, reserved2, expected_n) == \
        (MAGIC, 1, 0, 4, CODING_XOR, 0, 50_000)
    end, fps, keys, crc = struct.unpack_from("<IQQI", body, len(body) - 24)
    assert (end, fps, keys) == (0, len(index), 50_003)
    assert crc == _core.crc32c(body[-24:-4])


@pytest.mark.parametrize("cut", [0, 10, 1000, -40, -1])
def test_truncated_dump_is_corruption_and_leaves_no_file(index, tmp_path, cut):   # [D1] [D12]
    data = dump_of(index)
    with pytest.raises(CorruptionError):
        import_index(io.BytesIO(data[:cut] if cut else b""), tmp_path / "t.ndx")
    assert not (tmp_path / "t.ndx").exists()


def test_flipped_byte_inside_a_chunk_fails_its_checksum(index, tmp_path):   # [D3]
    body = bytearray(body_of(dump_of(index)))
    # A byte among the first chunk's fixed-size deltas: a flip in a key length
    # would read past the chunk and be reported as a truncation instead.
    header = struct.calcsize("<8sHHBBHQ")
    header += 4 + struct.unpack_from("<I", body, header)[0]      # plan
    header += 4 + struct.unpack_from("<I", body, header)[0] + 4  # fingerprinter, CRC
    count = struct.unpack_from("<I", body, header)[0]
    body[header + 4 + 8 * (count // 2)] ^= 0x40
    with pytest.raises(CorruptionError, match="checksum"):
        import_index(io.BytesIO(recompress(bytes(body))), tmp_path / "t.ndx")


def test_trailing_data_and_wrong_counts_are_rejected(index, tmp_path):   # [D1] [D11]
    data = dump_of(index)
    with pytest.raises(CorruptionError):
        import_index(io.BytesIO(data + b"\0"), tmp_path / "t.ndx")
    body = bytearray(body_of(data))
    trailer = struct.pack("<IQQ", 0, 1, 50_003)
    body[-24:] = trailer + struct.pack("<I", _core.crc32c(trailer))
    with pytest.raises(CorruptionError, match="trailer counts"):
        import_index(io.BytesIO(recompress(bytes(body))), tmp_path / "t.ndx")


def test_not_a_dump_and_newer_version_are_format_errors(index, tmp_path):   # [D4]
    with pytest.raises(FormatError, match="not an ndindex dump"):
        import_index(io.BytesIO(recompress(b"X" * 64)), tmp_path / "t.ndx")
    body = bytearray(body_of(dump_of(index)))
    body[8:10] = struct.pack("<H", 3)
    with pytest.raises(FormatError, match="dump version 3"):
        import_index(io.BytesIO(recompress(bytes(body))), tmp_path / "t.ndx")


_KILLED_IMPORT = """
import os, sys
from ndindex import dump
from ndindex.index import Index

real = Index.add
def add(self, *a, **k):
    real(self, *a, **k)
    os._exit(9)  # after the first chunk: a kill halfway
Index.add = add
with open(sys.argv[1], "rb") as fh:
    dump.import_index(fh, sys.argv[2])
"""


@pytest.mark.parametrize("when", ["halfway", "before the link", "after the link"])
def test_a_killed_import_leaves_nothing_or_the_whole_index_under_its_name(index, tmp_path, when):
    # import built the index under its own name: killed halfway, it left an
    # index there that opened, holding the first chunks only (1,179,648 of
    # 2,000,000 fingerprints in one trial).  Now it builds aside and links
    # the index to the name when whole; the next import (or a writer's open
    # of the name) clears what a killed one left.
    dumped = tmp_path / "a.ndxdump"
    dumped.write_bytes(dump_of(index))
    out = tmp_path / "out" / "b.ndx"
    out.parent.mkdir()
    if when == "halfway":
        import subprocess
        import sys
        child = subprocess.run([sys.executable, "-c", _KILLED_IMPORT, str(dumped), str(out)],
                               timeout=300)
        assert child.returncode == 9
    else:
        from tests.killing import killed_at
        killed_at("link", "from ndindex import dump\n"
                  "dump.import_index(open(sys.argv[1], 'rb'), sys.argv[2])\n",
                  dumped, out, after=when == "after the link", only_to=2)
    assert out.exists() == (when == "after the link")
    assert set(os.listdir(out.parent)) - {"b.ndx", "b.ndx-lock"}  # the kill's leftovers
    if out.exists():
        with ndindex.open(out) as ix:  # a writer's open clears them
            assert dump_of(ix) == dumped.read_bytes()
    else:
        with open(dumped, "rb") as fh:
            import_index(fh, out)
        with ndindex.open(out, readonly=True) as ix:
            assert dump_of(ix) == dumped.read_bytes()
    assert sorted(os.listdir(out.parent)) == ["b.ndx", "b.ndx-lock"]


TEXTS = ["the quick brown fox jumps over the lazy dog and runs far away into the woods",
         "the quick brown fox jumps over the lazy dog and runs far away into the wood",
         "a different text about storage engines, their logs, runs and compaction steps",
         "yet another text, of archives kept for years and moved between machines"]


@pytest.fixture
def documents(tmp_path):
    """An index of documents (with data, bytes and str keys, one replaced, one
    removed) beside plain keyed fingerprints."""
    path = tmp_path / "docs.ndx"
    with ndindex.Index.create(path, k=3, fingerprinter=Fingerprinter()) as ix:
        ix.add_documents(TEXTS, keys=["a", b"b\xff", "c", "d"], data=[b"one", None, b"", b"4"])
        ix.add_documents([TEXTS[3] + " again"], keys=["d"], data=[b"replaced"])
        ix.add([5, 6], keys=["plain", None])
        ix.remove(keys=["c"])
        yield ix


def test_documents_round_trip_with_their_sketches_and_data(documents, tmp_path):   # [D14] [D15]
    # Dump version 1 had no place for them: an imported index listed no
    # document, and similar() found nothing.
    first = dump_of(documents)
    assert struct.unpack_from("<H", body_of(first), 8)[0] == 2
    counts = import_index(io.BytesIO(first), tmp_path / "b.ndx")
    assert counts == {"fingerprints": 5, "keys": 4, "documents": 3}
    with ndindex.open(tmp_path / "b.ndx") as copy:
        assert dump_of(copy) == first
        assert list(copy.documents()) == list(documents.documents())
        assert copy.document_data("d") == b"replaced" and copy.document_data(b"b\xff") == b""
        for text in TEXTS:
            assert copy.similar(text) == documents.similar(text)
        assert copy.near_duplicate_pairs() == documents.near_duplicate_pairs()
        assert copy.similar(TEXTS[0])[0].key == "a" and copy.keys(5) == ("plain",)
        copy.verify()
        copy.remove(keys=["a"])                     # the records went in whole
        assert "a" not in [key for key, _, _ in copy.documents()]
    # An index without documents still makes a version 1 dump.
    with ndindex.Index.create(tmp_path / "plain.ndx", k=3, fingerprinter=Fingerprinter()) as ix:
        ix.add([1, 2], keys=["x", "y"])
        assert struct.unpack_from("<H", body_of(dump_of(ix)), 8)[0] == 1


def _documents_section(body: bytes) -> int:
    """The offset of the first document chunk in a version-2 body."""
    at = HEAD.size
    at += 4 + struct.unpack_from("<I", body, at)[0]
    at += 4 + struct.unpack_from("<I", body, at)[0] + 4
    while True:
        count = struct.unpack_from("<I", body, at)[0]
        at += 4
        if count == 0:
            return at
        at += 8 * count
        for _ in range(count):
            n = struct.unpack_from("<H", body, at)[0]
            at += 2
            for _ in range(n):
                at += 2 + struct.unpack_from("<H", body, at)[0]
        at += 4


def _rechunk(body: bytes, docs: list) -> bytes:
    """body with its document chunks replaced by one chunk of docs, trailer fixed."""
    at = _documents_section(body)
    chunk = struct.pack("<I", len(docs)) + b"".join(
        struct.pack("<QH", fp, len(raw)) + raw + struct.pack("<I", len(value)) + value
        for fp, raw, value in docs)
    fps, keys = struct.unpack_from("<QQ", body, len(body) - 28)
    trailer = struct.pack("<IQQQ", 0, fps, keys, len(docs))
    return body[:at] + chunk + struct.pack("<I", _core.crc32c(chunk)) + trailer + \
        struct.pack("<I", _core.crc32c(trailer))


def test_damaged_or_inconsistent_documents_are_corruption_and_leave_no_file(documents, tmp_path):
    body = body_of(dump_of(documents))
    at = _documents_section(body)
    count = struct.unpack_from("<I", body, at)[0]
    docs, pos = [], at + 4
    for _ in range(count):
        fp, n = struct.unpack_from("<QH", body, pos)
        raw = body[pos + 10:pos + 10 + n]
        size = struct.unpack_from("<I", body, pos + 10 + n)[0]
        docs.append((fp, raw, body[pos + 14 + n:pos + 14 + n + size]))
        pos += 14 + n + size
    assert _rechunk(body, docs) == body             # the helper rebuilds what export wrote
    bad = {
        "document chunk checksum": body[:at + 20] + bytes([body[at + 20] ^ 1]) + body[at + 21:],
        "documents out of order": _rechunk(body, docs[::-1]),
        "has a key the fingerprint does not hold":
            _rechunk(body, [(docs[0][0], b"\x01zz", docs[0][2])]),
        "bad document": _rechunk(body, [(docs[0][0], docs[0][1], b"\x07junk")]),
        "trailer counts .* and 2 documents, the dump holds 5 and 4 and 3": _rechunk(body, docs)[:-32]
            + (lambda t: t + struct.pack("<I", _core.crc32c(t)))(struct.pack("<IQQQ", 0, 5, 4, 2)),
    }
    for what, damaged in bad.items():
        with pytest.raises(CorruptionError, match=what):
            import_index(io.BytesIO(recompress(damaged)), tmp_path / "t.ndx")
        assert not (tmp_path / "t.ndx").exists(), what
    # Documents in a dump without a fingerprinter.
    with ndindex.Index.create(tmp_path / "bare.ndx", k=3) as ix:
        bare = body_of(dump_of(ix))
    head_end = HEAD.size + 4 + struct.unpack_from("<I", bare, HEAD.size)[0] + 4 + 4
    v2 = bytearray(bare[:head_end - 4])
    v2[8:10] = struct.pack("<H", 2)
    v2 += struct.pack("<I", _core.crc32c(bytes(v2)))
    trailer_0 = struct.pack("<IQQQ", 0, 1, 1, 1)
    chunk = struct.pack("<IQ", 1, 7) + struct.pack("<HH", 1, 2) + b"\x01k"
    docs_chunk = struct.pack("<I", 1) + struct.pack("<QH", 7, 2) + b"\x01k" + \
        struct.pack("<I", len(docs[0][2])) + docs[0][2]
    made = bytes(v2) + chunk + struct.pack("<I", _core.crc32c(chunk)) + struct.pack("<I", 0) + \
        docs_chunk + struct.pack("<I", _core.crc32c(docs_chunk)) + trailer_0 + \
        struct.pack("<I", _core.crc32c(trailer_0))
    with pytest.raises(CorruptionError, match="without a fingerprinter"):
        import_index(io.BytesIO(recompress(made)), tmp_path / "t.ndx")
    assert not (tmp_path / "t.ndx").exists()
