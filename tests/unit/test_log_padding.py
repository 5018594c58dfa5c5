"""Padded log records (format 5, FORMAT.md [F19]).

A log record of half a page or more is padded with zero bytes so that its
LMDB value fills a power of two of pages up to 16, or a multiple of 16:
the log's values then take and free runs that tile the 16-page runs a
fingerprint chunk needs.  Files of format 4 get no padding.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ndindex import Index, records as rec
from ndindex.errors import CorruptionError
from ndindex.writer import put_header

PSIZE = 4096


def overflow_pages(payload_bytes: int) -> float:
    return (payload_bytes + rec.log_padding(payload_bytes, PSIZE) + 4 +
            rec.OVERFLOW_HEADER_BYTES) / PSIZE


@pytest.mark.parametrize("payload, pages", [
    (2_044, 1), (4_000, 1), (4_077, 2), (8_000, 2), (8_200, 4), (30_000, 8), (60_000, 16),
    (65_516, 16), (65_517, 32), (80_020, 32), (200_000, 64)])
def test_padding_fills_a_power_of_two_of_pages_or_a_multiple_of_16(payload, pages):
    assert overflow_pages(payload) == pages


def test_a_record_stored_in_a_leaf_page_is_not_padded():
    assert rec.log_padding(100, PSIZE) == rec.log_padding(2_043, PSIZE) == 0


def log_values(ix) -> list:
    txn, view = ix._store.snapshot()
    try:
        return [(bytes(k), bytes(v)) for k, v in view.scan(rec.DB_LOG, b"")]
    finally:
        txn.abort()


@pytest.mark.parametrize("version", [5, 4])
def test_a_writer_pads_only_files_of_format_5(tmp_path, version):
    path = str(tmp_path / "p.ndx")
    fps = np.unique(np.random.default_rng(1).integers(0, 2**64, 10_000, dtype=np.uint64))
    with Index.create(path, k=3, expected_n=100_000, background_compaction=False,
                      log_limit=1 << 30) as ix:
        ix._header = dataclasses.replace(ix._header, read_version=version, write_version=version)
        ix._store.write(lambda wt: put_header(wt, ix._header), sync=True)
        ix.add(fps)
        ix.add(fps[:3] ^ np.uint64(1))  # a small record: no padding
    with Index.open(path, background_compaction=False, log_limit=1 << 30) as ix:
        (k1, big), (k2, small) = log_values(ix)
        payload = rec.unframe(big, rec.DB_LOG, k1)
        content = rec.LOG_HEAD.size + 8 * len(fps)
        if version == 5:
            assert (len(big) + rec.OVERFLOW_HEADER_BYTES) == 32 * PSIZE
            assert len(payload) > content and not any(payload[content:])
        else:
            assert len(payload) == content
        assert len(rec.unframe(small, rec.DB_LOG, k2)) == rec.LOG_HEAD.size + 24
        assert len(ix) == len(fps) + 3 and int(fps[7]) in ix
        ix.verify()


def test_a_log_record_with_a_non_zero_byte_after_its_entries_is_damage():
    record = rec.LogRecord(np.array([5, 9], np.uint64), np.array([7], np.uint64), [], [])
    payload = record.pack()
    key = rec.U64_BE.pack(3)
    assert rec.LogRecord.unpack(payload + bytes(100), key).adds.tolist() == [5, 9]
    with pytest.raises(CorruptionError, match="trailing bytes"):
        rec.LogRecord.unpack(payload + bytes(99) + b"\1", key)
