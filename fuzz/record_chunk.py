"""Fuzz target: arbitrary bytes -> record chunk readers give records or CorruptionError.

Contract: for any LMDB key and value, the readers of record chunks
(FORMAT.md 7.9: ``_core.record_chunk`` with and without a group, each
sub-block through ``chunks.raw_block`` and ``chunks.find_records``, and
``RecordChunk.all_records``) either return or raise ``CorruptionError``;
never another exception, a crash, a hang or a read outside the value (it
sits against a PROT_NONE guard page, see ``harness.GuardedBuffer``).  A
chunk that passes every check yields records in increasing key order
inside its fences, as the writer made them.

Input layout (``harness.ByteReader``; missing bytes read as zero):

    u8      flags: bit 0 recompute the header checksum, bit 1 recompute
            each sub-block's checksum (so mutations get past them)
    u8      key length (5..64 after clamping)
    ...     the key, then a u8 group length and the group
    rest    the value

Run: ``python fuzz/run.py --targets record_chunk`` (see fuzz/README.md).
"""

from __future__ import annotations

import struct

import instrumented

with instrumented.imports(__name__):  # coverage only when fuzzing
    import harness
    from ndindex import _core, chunks
    from ndindex.errors import CorruptionError

#: Largest value one input makes: a chunk of a few sub-blocks.
MAX_VALUE_BYTES = 8 * 4096
_GUARD = harness.GuardedBuffer(data_pages=MAX_VALUE_BYTES // harness.PAGE_BYTES + 1)


def make_input(key: bytes, value: bytes, group: bytes, flags: int = 0) -> bytes:
    """The input that check() reads back as (flags, key, group, value)."""
    return bytes([flags, len(key)]) + key + bytes([len(group)]) + group + value


def _fix_checksums(key: bytes, value: bytearray, flags: int) -> None:
    head = chunks.RECORD_CHUNK_HEAD.size
    if len(value) < head:
        return
    _, kind, _, n_blocks, _, _, dir_bytes, fence_len, filter_bytes = \
        chunks.RECORD_CHUNK_HEAD.unpack_from(value)
    head_end = head + fence_len + dir_bytes + filter_bytes
    if flags & 2:  # each sub-block's checksum, from the directory as it stands
        pos = head + fence_len
        for _ in range(n_blocks):
            if pos + chunks.DIR_ENTRY.size > len(value):
                break
            off, clen, _, _, first_len = chunks.DIR_ENTRY.unpack_from(value, pos)
            if off + clen <= len(value):
                struct.pack_into("<I", value, pos + 12, _core.crc32c(bytes(value[off:off + clen])))
            pos += chunks.DIR_ENTRY.size + first_len
    if flags & 1 and head_end <= len(value):
        crc = _core.crc32c(key + bytes(value[4:head_end]))
        struct.pack_into("<I", value, 0, crc)


def check(data: bytes) -> None:
    """Run one input; raise AssertionError (or crash) on a contract breach."""
    reader = harness.ByteReader(data)
    flags = reader.u8()
    key = reader.take(max(5, min(64, reader.u8())))
    group = reader.take(reader.u8())
    value = bytearray(reader.rest()[:MAX_VALUE_BYTES])
    _fix_checksums(key, value, flags)
    guarded = _GUARD.at_end(bytes(value))
    try:
        _core.record_chunk(key, guarded, group)
        chunk = chunks.unpack_record_chunk(key, guarded)
    except CorruptionError:
        return
    for entry in chunk.blocks:
        try:
            chunks.find_records(key, guarded, entry, group)
        except CorruptionError:
            pass
    try:
        records = chunk.all_records()
    except CorruptionError:
        return
    keys = [r[0] for r in records]
    assert keys == sorted(set(keys)), "records out of order passed the checks"


if __name__ == "__main__":
    harness.fuzz(lambda data: check(bytes(data)))
