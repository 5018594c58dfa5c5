"""Fuzz target: arbitrary bytes -> raw-block decoder gives values or CorruptionError.

Contract (``decode_*``): for any 1..3 raw blocks (FORMAT.md 5.3, plain or
packed), ``ndindex.chunks.decode_raw`` either returns or raises
``CorruptionError``; never another exception, a crash, a hang or a read
outside the blocks (they sit against PROT_NONE guard pages, see
``harness.GuardedBuffer``: a packed block's offsets are read with 8-byte
loads, which must stay inside the block).  Differential: the C decoder and
the plain-Python ``ndindex.codec_reference.decode_raw_block`` agree on the
values, or both reject.  Valid blocks re-encode: values the C decoder
gives back are encoded again, plain and packed, and decode to themselves.

Input layout (``harness.ByteReader``; missing bytes read as zero):

    u8      flags: bit 0 recompute each block's CRC so mutations get past
            the checksum; bits 1-2 number of blocks - 1 (capped at 3)
    rest    the blocks, zero-padded or truncated to 1024 bytes each

Run: ``python fuzz/run.py --targets decode_raw_block`` (see fuzz/README.md).
"""

from __future__ import annotations

import numpy as np  # imported before instrumentation: not ours to cover

import instrumented

with instrumented.imports(__name__):  # coverage only when fuzzing
    import harness
    from ndindex import chunks, codec_reference
    from ndindex.errors import CorruptionError

BLOCK = chunks.BLOCK_BYTES


def reference_decode(blocks: bytes):
    """The reference's values of every block, or None if one is rejected (or
    the values do not increase across blocks, as decode_raw requires)."""
    out = []
    for i in range(0, len(blocks), BLOCK):
        try:
            values = codec_reference.decode_raw_block(blocks[i:i + BLOCK])
        except CorruptionError:
            return None
        if out and values[0] <= out[-1]:
            return None
        out += values
    return out


def c_decode(view):
    try:
        return [int(v) for v in chunks.decode_raw(view)]
    except CorruptionError:
        return None


def check(data: bytes) -> None:
    """Run one input; raise AssertionError (or crash) on a contract breach."""
    reader = harness.ByteReader(data)
    flags = reader.u8()
    n_blocks = min(1 + ((flags >> 1) & 3), harness.MAX_BLOCKS)
    blocks = bytearray(reader.rest()[:n_blocks * BLOCK].ljust(n_blocks * BLOCK, b"\0"))
    if flags & 1:
        harness.fix_crc(blocks)
    blocks = bytes(blocks)
    want = reference_decode(blocks)
    got = c_decode(harness.GUARD.at_end(blocks))
    assert c_decode(harness.GUARD.at_start(blocks)) == got, "decode depends on buffer placement"
    assert got == want, f"C decoder {'rejects' if got is None else got[:3]}, " \
                        f"reference {'rejects' if want is None else want[:3]}"
    if got:
        values = np.array(got, dtype=np.uint64)
        for packed in (False, True):
            enc = chunks.encode_raw(values, packed)
            assert chunks.decode_raw(enc.blocks).tolist() == got, "re-encoded blocks differ"


if __name__ == "__main__":
    harness.fuzz(check)
