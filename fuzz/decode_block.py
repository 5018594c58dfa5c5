"""Fuzz target: arbitrary bytes -> block decoder gives values or CorruptionError.

Contract (``decode_*``): for any 1..3 blocks and any valid code,
``ndindex.codec.decode`` and ``ndindex.codec.probe`` either return or raise
``CorruptionError`` (and ``probe_blocks``, the blocks side by side as a
query decodes them, gives what each gave alone); never another exception, a crash, a hang or a read
outside the blocks (the blocks sit against PROT_NONE guard pages, see
``harness.GuardedBuffer``).  Differential: the C decoder and the plain-Python
``ndindex.codec_reference.decode_block`` agree on the values, or on the first
bad block and the kind of damage (with coding 2, a restart table that is
too wide or disagrees with the entries is its own kind).

Input layout (``harness.ByteReader``; missing bytes read as zero):

    u8      flags: bit 0 recompute each block's CRC so mutations get past
            the checksum; bits 1-2 number of blocks - 1 (capped at 3)
    u8 ...  the code (``harness.code_from``): a fixed code, or 64 raw
            lengths repaired into a complete code; either of coding 0
            (xor), 1 (delta) or 2 (delta with restart tables, FORMAT.md 5.4)
    u64     probe: q = (block's first value) XOR this
    u8, u8  probe: p = byte % 65, k = byte % 65
    rest    the blocks, zero-padded or truncated to 1024 bytes each

Run: ``python fuzz/run.py --targets decode_block`` (see fuzz/README.md).
"""

from __future__ import annotations

import numpy as np  # imported before instrumentation: not ours to cover

import instrumented

with instrumented.imports(__name__):  # coverage only when fuzzing
    import harness
    from ndindex import codec, codec_reference
    from ndindex.errors import CorruptionError

#: Largest count a block can hold: 1 + one bit per further entry.
MAX_COUNT = 1 + (codec.BLOCK_BYTES - codec.BLOCK_HEADER_BYTES) * 8


def damage_kind(err: CorruptionError) -> str:
    """Classify a CorruptionError message from either decoder."""
    msg = str(err)
    for needle, kind in (("checksum", "checksum"), ("entry count", "count"),
                         ("runs past", "overrun"), ("do not increase", "order"),
                         ("padding", "padding"), ("restart", "restart")):
        if needle in msg:
            return kind
    raise AssertionError(f"unclassified CorruptionError: {msg}")


def reference_decode(blocks: bytes, code: codec.HuffmanCode) -> list:
    """Decode each block with the reference; a list of value lists or damage kinds."""
    record = code.to_bytes()
    results = []
    for i in range(0, len(blocks), codec.BLOCK_BYTES):
        try:
            results.append(codec_reference.decode_block(blocks[i:i + codec.BLOCK_BYTES], record))
        except CorruptionError as err:
            results.append(damage_kind(err))
    return results


def c_decode(view, code: codec.HuffmanCode):
    """Decode with the C kernel; return (values, bad block index, kind)."""
    try:
        return [int(v) for v in codec.decode(view, code)], None, None
    except CorruptionError as err:
        assert err.database == "block" and err.offset % codec.BLOCK_BYTES == 0, err
        return None, err.offset // codec.BLOCK_BYTES, damage_kind(err)


def expected_probe(values, q: int, p: int, k: int) -> list[int]:
    """Return what probe must find among a block's decoded values."""
    shift = 64 - p
    return [v for v in values if (p == 0 or (v ^ q) >> shift == 0) and bin(v ^ q).count("1") <= k]


def check_probe(block, code, values, header_ok: bool, q: int, p: int, k: int):
    """Probe one block, check the result against its reference decode, return it."""
    try:
        got = codec.probe(block, code, q, p, k)
    except CorruptionError as err:
        damage_kind(err)
        assert values is None, f"probe raised {err} on a block the reference decodes"
        return err
    # A probe may stop before the damage, but never past a bad header.
    assert header_ok, "probe returned on a block with a bad checksum or count"
    if values is not None:
        want = expected_probe(values, q, p, k)
        assert got == want, f"probe(q={q:#x}, p={p}, k={k}) gave {got[:5]}..., expected {want[:5]}..."
    return got


def check(data: bytes) -> None:
    """Run one input; raise AssertionError (or crash) on a contract breach."""
    reader = harness.ByteReader(data)
    flags = reader.u8()
    n_blocks = min(1 + ((flags >> 1) & 3), harness.MAX_BLOCKS)
    code = harness.code_from(reader)
    q_mask, p, k = reader.u64(), reader.u8() % 65, reader.u8() % 65
    blocks = bytearray(reader.rest()[:n_blocks * codec.BLOCK_BYTES].ljust(n_blocks * codec.BLOCK_BYTES, b"\0"))
    if flags & 1:
        harness.fix_crc(blocks)
    blocks = bytes(blocks)

    ref = reference_decode(blocks, code)
    ref_bad = next((i for i, r in enumerate(ref) if isinstance(r, str)), None)
    ref_kind = None if ref_bad is None else ref[ref_bad]
    got = c_decode(harness.GUARD.at_end(blocks), code)
    assert c_decode(harness.GUARD.at_start(blocks), code) == got, "decode depends on buffer placement"
    values, bad, kind = got
    if ref_bad is None:
        assert bad is None, f"C decoder: block {bad} {kind}; reference decodes it"
        assert values == [v for b in ref for v in b], "C and reference values differ"
    else:
        assert bad is not None, f"C decoder accepted block {ref_bad}; reference says {ref_kind}"
        assert bad == ref_bad, f"C decoder failed block {bad} ({kind}), reference block {ref_bad} ({ref_kind})"
        assert kind == ref_kind, f"block {bad}: C says {kind}, reference says {ref_kind}"

    singles, qs = [], []
    for i in range(n_blocks):
        block = blocks[i * codec.BLOCK_BYTES:(i + 1) * codec.BLOCK_BYTES]
        block_values = None if isinstance(ref[i], str) else ref[i]
        count = int.from_bytes(block[4:6], "little")
        crc_ok = harness.crc32c(block[4:]) == int.from_bytes(block[0:4], "little")
        header_ok = crc_ok and 1 <= count <= MAX_COUNT
        q = int.from_bytes(block[6:14], "little") ^ q_mask
        qs.append(q)
        singles.append(check_probe(harness.GUARD.at_end(block), code, block_values, header_ok,
                                   q, p, k))
    # The blocks side by side, as a query decodes them: what each alone gave.
    together = codec.probe_blocks(harness.GUARD.at_end(blocks), [code] * n_blocks, qs,
                                  [p] * n_blocks, [k] * n_blocks)
    for i, (alone, side) in enumerate(zip(singles, together)):
        if isinstance(alone, CorruptionError):
            assert isinstance(side, CorruptionError) and \
                damage_kind(side) == damage_kind(alone), f"block {i}: {side!r} beside others, {alone!r} alone"
        else:
            assert side == alone, f"block {i}: {side[:3]}... beside others, {alone[:3]}... alone"


if __name__ == "__main__":
    harness.fuzz(check)
