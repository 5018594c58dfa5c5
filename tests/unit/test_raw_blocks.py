"""Raw blocks, plain and packed (FORMAT.md 5.3, [B10], [B15], [B16]).

The kernel's encoder and decoder (ndindex/_core/rawblock.c) against the
reference decoder written from the spec, on values of every spacing; the
damage either rejects; and the files: a version-4 index writes packed
blocks into its small levels and answers exactly, a version-3 index keeps
writing plain ones until `ndindex upgrade`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ndindex import chunks as ch, codec_reference as ref, runs as rn
from ndindex.errors import CorruptionError
from ndindex.index import Index
from ndindex.records import KIND_RAW
from ndindex.upgrade import upgrade
from ndindex.writer import put_header
from tests.oracle import brute_force

BLOCK = ch.BLOCK_BYTES


@st.composite
def sorted_values(draw):
    """Strictly increasing u64 values whose gaps come from a few bit lengths,
    so that blocks of every width (and spans past 56 bits) appear."""
    n = draw(st.integers(1, 3000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    bits = rng.choice(draw(st.lists(st.integers(0, 62), min_size=1, max_size=3)), n)
    gaps = np.maximum(1, rng.integers(0, 2**62, n, dtype=np.uint64) >> (62 - bits).astype(np.uint64))
    start = np.uint64(draw(st.integers(0, 2**64 - 1)))
    values = np.cumsum(gaps, dtype=np.uint64) + start   # wraps: keep the increasing prefix
    wrap = np.flatnonzero(values[1:] <= values[:-1])
    return values[:wrap[0] + 1] if len(wrap) else values


def blocks_of(enc) -> list[bytes]:
    data = enc.blocks.tobytes()
    return [data[i:i + BLOCK] for i in range(0, len(data), BLOCK)]


@settings(max_examples=150, deadline=None)
@given(sorted_values())
def test_both_forms_round_trip_and_the_reference_agrees(values):
    plain, packed = ch.encode_raw(values, False), ch.encode_raw(values, True)
    for enc, form in ((plain, "plain"), (packed, "packed")):
        assert ch.decode_raw(enc.blocks).tolist() == values.tolist()
        parts = blocks_of(enc)
        assert [x for p in parts for x in ref.decode_raw_block(p)] == values.tolist()
        assert enc.keys.tolist() == [ref.decode_raw_block(p)[-1] for p in parts]
    assert all(p[6] == 0 for p in blocks_of(plain))                     # versions 2 and 3
    assert packed.n_blocks <= plain.n_blocks                            # [B16]
    parts = blocks_of(packed)
    for p, after in zip(parts, parts[1:] + [None]):
        vals = ref.decode_raw_block(p)
        if p[6]:   # the span's bit length, and the most values that fit ([B15], [B16])
            assert p[6] == (vals[-1] - vals[0]).bit_length() <= 56
            if after is not None:
                width = (ref.decode_raw_block(after)[0] - vals[0]).bit_length()
                assert len(vals) == 1024 or width > 56 or len(vals) * width > 8008


def test_dense_values_pack_many_to_a_block():
    values = np.arange(10**6, 10**6 + 5000, dtype=np.uint64) * np.uint64(3)
    enc = ch.encode_raw(values, True)
    parts = blocks_of(enc)
    # 683 values span 3 * 682 = 2046 (11 bits, 682 * 11 <= 8008); a 684th
    # needs 12 bits, and 683 offsets of 12 bits do not fit.
    assert [int.from_bytes(p[4:6], "little") for p in parts[:2]] == [683, 683]
    assert {p[6] for p in parts[:-1]} == {11}
    assert enc.n_blocks == 8 and ch.encode_raw(values, False).n_blocks == 40


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.data())
def test_damage_to_a_packed_block_is_rejected_or_read_alike_by_both_decoders(seed, data):
    rng = np.random.default_rng(seed)
    values = np.unique(rng.integers(0, 2**64 // 2**22 * 300, 300, dtype=np.uint64))
    block = bytearray(blocks_of(ch.encode_raw(values, True))[0])
    assert block[6]
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(4, BLOCK - 1))
        block[at] ^= 1 << data.draw(st.integers(0, 7))
    block[0:4] = ref.crc32c(bytes(block[4:])).to_bytes(4, "little")   # the damage, not the checksum
    try:
        want = ref.decode_raw_block(bytes(block))
    except CorruptionError:
        with pytest.raises(CorruptionError):
            ch.decode_raw(bytes(block))
    else:
        assert ch.decode_raw(bytes(block)).tolist() == want


def raw_blocks_in(ix) -> list[bytes]:
    """Every raw block of the tables' runs."""
    snap = ix._snapshot()
    out = []
    for run in snap.manifest.runs:
        if run.kind == KIND_RAW:
            for c in rn.fp_chunks(snap.view, run):
                out += [bytes(c.blocks[i:i + BLOCK]) for i in range(0, len(c.blocks), BLOCK)]
    return out


def streamed(ix, fps, parts=3):
    for part in np.array_split(fps, parts):
        ix.add(part)
        ix._compactor.flush_log()


def assert_exact(ix, fps, rng):
    queries = np.concatenate([fps[::997] ^ np.uint64(5), rng.integers(0, 2**64, 20, dtype=np.uint64)])
    for q in queries.tolist():
        assert [(m.fingerprint, m.distance) for m in ix.query(q, 3, keys=False)] == \
            brute_force(fps, q, 3)


def test_a_new_index_packs_its_small_levels_and_answers_exactly(tmp_path):
    rng = np.random.default_rng(5)
    fps = np.unique(rng.integers(0, 2**64, 150_000, dtype=np.uint64))
    with Index.create(tmp_path / "p.ndx", k=3, expected_n=len(fps),
                      background_compaction=False, log_limit=1 << 30) as ix:
        assert ix._packs_raw and ix.stats()["format"] == 5
        streamed(ix, fps)
        blocks = raw_blocks_in(ix)
        assert blocks and all(b[6] for b in blocks)   # 50,000 a flush: spans of 54-55 bits
        assert_exact(ix, fps, rng)
        ix.verify()
        ix.compact(full=True)
        assert_exact(ix, fps, rng)


def test_a_version_3_file_keeps_plain_blocks_until_upgraded(tmp_path):
    path = str(tmp_path / "v3.ndx")
    rng = np.random.default_rng(6)
    fps = np.unique(rng.integers(0, 2**64, 150_000, dtype=np.uint64))
    with Index.create(path, k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        # What a version-3 writer made: the header says 3 before anything is added.
        header = dataclasses.replace(ix._header, read_version=3, write_version=3)
        ix._store.write(lambda wt: put_header(wt, header), sync=True)
    with Index.open(path, background_compaction=False, log_limit=1 << 30) as ix:
        assert not ix._packs_raw and ix.stats()["format"] == 3
        streamed(ix, fps[:100_000], parts=2)
        assert raw_blocks_in(ix) and not any(b[6] for b in raw_blocks_in(ix))
        assert_exact(ix, fps[:100_000], rng)
    report = upgrade(path)
    assert report["upgraded"] and report["format"] == 5
    with Index.open(path, background_compaction=False, log_limit=1 << 30) as ix:
        assert ix._packs_raw and ix._header.write_version == 5
        streamed(ix, fps[100_000:], parts=1)
        assert raw_blocks_in(ix) and all(b[6] for b in raw_blocks_in(ix))
        assert_exact(ix, fps, rng)
        ix.verify()
    assert upgrade(path)["upgraded"] is False


def test_verify_rejects_a_packed_block_in_a_version_3_file(tmp_path):
    # [B15]: readers of format 3 know plain blocks only.
    path = str(tmp_path / "p.ndx")
    fps = np.unique(np.random.default_rng(7).integers(0, 2**64, 100_000, dtype=np.uint64))
    with Index.create(path, k=3, expected_n=len(fps), background_compaction=False,
                      log_limit=1 << 30) as ix:
        streamed(ix, fps, parts=1)
        assert all(b[6] for b in raw_blocks_in(ix))
        ix.verify()
        header = dataclasses.replace(ix._header, read_version=3, write_version=3)
        ix._store.write(lambda wt: put_header(wt, header), sync=True)
    with Index.open(path, readonly=True) as ix:
        with pytest.raises(CorruptionError, match="packed raw block in a file of format 3"):
            ix.verify()
