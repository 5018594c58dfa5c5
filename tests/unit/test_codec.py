"""Unit tests of ndindex.codec and its C kernel (FORMAT.md "Blocks", "Huffman codes")."""

import numpy as np
import pytest

from ndindex import _core, codec, codec_reference
from ndindex.codec import CODING_DELTA, CODING_RESTARTS, CODING_XOR, HuffmanCode
from ndindex.errors import CorruptionError, FormatError

U64_MAX = 2**64 - 1


def random_table(n, seed=0):
    rng = np.random.default_rng(seed)
    return np.unique(rng.integers(0, 2**64, size=n, dtype=np.uint64))


@pytest.fixture(params=[CODING_DELTA, CODING_XOR, CODING_RESTARTS], ids=["delta", "xor", "restarts"])
def coding(request):
    return request.param


def test_crc32c_check_value():
    # [C1] CRC-32C check value from the Castagnoli parameters.
    assert _core.crc32c(b"123456789") == 0xE3069283
    assert codec_reference.crc32c(b"123456789") == 0xE3069283
    assert _core.crc32c(b"") == 0


def test_crc32c_matches_reference_on_odd_lengths():
    # Lengths on both sides of the three-stream segments (3 x 336 bytes).
    data = np.random.default_rng(5).bytes(70000)
    for n in (0, 1, 7, 8, 9, 63, 64, 65, 1007, 1008, 1009, 1020, 1280, 2016, 2023, 3025, 65536,
              70000):
        assert _core.crc32c(data[:n]) == codec_reference.crc32c(data[:n])


def test_delta_histogram_is_exact_at_powers_of_two():
    # Deltas 2^h and 2^(h+1)-1 both have their leading 1-bit at h, for every h.
    for h in range(64):
        for d in (1 << h, (1 << (h + 1)) - 1):
            values = np.array([0, d], dtype=np.uint64)
            for coding in (codec.CODING_DELTA, codec.CODING_XOR):
                hist = _core.delta_histogram(values, coding)
                assert hist[h] == 1 and sum(hist) == 1


def test_limited_code_lengths_complete_and_bounded():
    freqs = [2**i for i in range(64)]  # would need 63-bit codes unlimited
    lengths = codec.limited_code_lengths(freqs)
    assert max(lengths) <= codec.CODE_MAX_BITS and min(lengths) >= 1
    assert sum(2.0 ** -n for n in lengths) == 1.0


def test_limited_code_lengths_gives_zero_frequency_symbols_a_code():
    freqs = [0] * 64
    freqs[40] = 1000
    lengths = codec.limited_code_lengths(freqs)
    assert all(1 <= n <= 12 for n in lengths)
    assert lengths[40] == 1


def test_round_trip_random(coding):
    x = random_table(20000, seed=1)
    code = HuffmanCode.from_values(x, coding)
    enc = codec.encode(x, code)
    assert enc.blocks.size == enc.n_blocks * codec.BLOCK_BYTES
    np.testing.assert_array_equal(codec.decode(enc, code), x)


def test_keys_are_last_value_of_each_block(coding):
    x = random_table(5000, seed=2)
    code = HuffmanCode.from_values(x, coding)
    enc = codec.encode(x, code)
    counts = codec.block_counts(enc.blocks).astype(np.int64)
    ends = np.cumsum(counts) - 1
    np.testing.assert_array_equal(enc.keys, x[ends])
    assert counts.sum() == len(x)


def test_extremes_and_single_element(coding):
    for values in ([0], [U64_MAX], [0, U64_MAX], [0, 1, 2, 2**63, U64_MAX - 1, U64_MAX]):
        x = np.array(values, dtype=np.uint64)
        code = HuffmanCode.for_density(1000, coding)
        enc = codec.encode(x, code)
        assert enc.n_blocks == 1
        np.testing.assert_array_equal(codec.decode(enc, code), x)
        assert codec_reference.decode_block(bytes(enc.block(0)), code.to_bytes()) == values


def test_empty_input_gives_no_blocks():
    code = HuffmanCode.for_density(10)
    enc = codec.encode(np.array([], dtype=np.uint64), code)
    assert enc.n_blocks == 0
    assert len(codec.decode(enc.blocks, code)) == 0


@pytest.mark.parametrize("values", [[5, 5], [1, 3, 2], [7, 7, 8]])
def test_duplicates_and_unsorted_rejected(values):
    code = HuffmanCode.for_density(1000)
    with pytest.raises(ValueError, match="strictly increasing"):
        codec.encode(np.array(values, dtype=np.uint64), code)


def test_encode_rejects_float_input():
    with pytest.raises(TypeError, match="uint64"):
        codec.encode(np.array([1.5, 2.5]), HuffmanCode.for_density(10))


def test_size_near_entropy_bound_delta():
    # The delta coding sits within 2% of the bound, headers and tails included.
    x = random_table(200_000, seed=3)
    code = HuffmanCode.from_values(x, CODING_DELTA)
    bits = codec.encode(x, code).blocks.size * 8 / len(x)
    assert bits / codec.entropy_bound_bits(len(x)) < 1.02


def test_restart_tables_cost_under_3_percent():
    # 5.4: the table takes 1 + ceil(3 (13 + w) / 8) bytes of a block.
    x = random_table(200_000, seed=3)
    sizes = {c: codec.encode(x, HuffmanCode.from_values(x, c)).blocks.size
             for c in (CODING_DELTA, CODING_RESTARTS)}
    assert 1.01 < sizes[CODING_RESTARTS] / sizes[CODING_DELTA] < 1.03


def restart_block(n=4000, seed=8):
    """A block of a 2^23-dense table (about 190 entries) coded with restarts,
    its code and values, and where its three restart records point."""
    x = table_at_density(n, 2**23, seed)
    code = HuffmanCode.from_values(x, CODING_RESTARTS)
    enc = codec.encode(x, code)
    count = int(codec.block_counts(enc.blocks)[0])
    return bytes(enc.block(0)), code, x[:count], [r * count // 4 for r in (1, 2, 3)]


def test_a_probe_starts_at_the_last_restart_below_its_prefix():
    # [B13]: damage before the last restart (CRC made good again) is not
    # decoded by a probe beyond it, while coding 1 and a whole decode meet it.
    block, code, vals, at = restart_block()
    assert len(vals) > 150
    bad = garbled(block)
    with pytest.raises(CorruptionError):
        codec.decode(bad, code)
    beyond = int(vals[at[2] + 3])
    assert codec.probe(bad, code, beyond, 64, 0) == [beyond]
    assert codec.probe(bad, code, beyond ^ 1, 40, 1) == [beyond]
    # Before the first restart the probe starts at first and meets the damage.
    assert probe_outcome(bad, code, int(vals[at[0] - 1])) != [int(vals[at[0] - 1])]
    delta = HuffmanCode.from_lengths(code.lengths, CODING_DELTA)
    plain = codec.encode(vals, delta)
    assert plain.n_blocks == 1
    assert probe_outcome(garbled(bytes(plain.block(0))), delta, beyond) != [beyond]


def garbled(block: bytes) -> bytes:
    """block with its first entries' bits all ones, its checksum made good."""
    b = bytearray(block)
    b[14:30] = b"\xff" * 16
    return corrupt(bytes(b), 4, 0)


def probe_outcome(block, code, q):
    try:
        return codec.probe(block, code, q, 64, 0)
    except CorruptionError as err:
        return err


@pytest.mark.parametrize("where", ["w", "end", "value", "after"])
def test_a_restart_table_that_disagrees_fails_decode_and_probes(where):
    # [B11], [B12]: a whole decode checks every record; a probe that starts
    # at a record it cannot trust (past the bitstream, a value that wraps)
    # reports the damage.
    block, code, vals, at = restart_block()
    w = block[1023]
    nbytes = 1 + (3 * (13 + w) + 7) // 8
    table = int.from_bytes(block[1024 - nbytes:1023], "big")
    bits = 8 * (nbytes - 1)
    record = 13 + w
    if where == "w":
        bad = corrupt(block, 1023, block[1023] ^ 0xC0)  # w above 64
    else:
        shift = {"end": bits - 13, "value": bits - record, "after": 0}[where]
        table ^= 1 << shift
        b = bytearray(block)
        b[1024 - nbytes:1023] = table.to_bytes(nbytes - 1, "big")
        bad = corrupt(bytes(b), 1023, 0)  # redo the checksum
    with pytest.raises(CorruptionError, match="restart"):
        codec.decode(bad, code)
    if where == "w":
        with pytest.raises(CorruptionError, match="restart"):
            codec.probe(bad, code, int(vals[-1]), 64, 0)


def test_xor_costs_more_than_delta_on_random_data():
    x = random_table(100_000, seed=4)
    sizes = {c: codec.encode(x, HuffmanCode.from_values(x, c)).blocks.size for c in (0, 1)}
    assert sizes[CODING_XOR] > sizes[CODING_DELTA] * 1.02


def test_code_record_round_trip(coding):
    code = HuffmanCode.for_density(10**6, coding)
    data = code.to_bytes()
    assert len(data) == codec.CODE_RECORD_BYTES
    assert HuffmanCode.from_bytes(data) == code


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b[:10], "66"),
    (lambda b: bytes([7]) + b[1:], "coding 7"),
    (lambda b: b[:1] + bytes([11]) + b[2:], "max bits 11"),
    (lambda b: b[:2] + bytes([0]) + b[3:], "h=0"),
    (lambda b: b[:2] + bytes([13]) + b[3:], "h=0"),
    (lambda b: b[:2] + bytes([b[2] + 1 if b[2] < 12 else b[2] - 1]) + b[3:], "not complete"),
])
def test_code_record_rejections(mutate, message):
    good = HuffmanCode.for_density(10**6).to_bytes()
    with pytest.raises(FormatError, match=message):
        HuffmanCode.from_bytes(mutate(good))


def test_compile_code_rejects_incomplete_code():
    with pytest.raises(ValueError):
        _core.compile_code(bytes([6] * 63 + [7]), 1)  # Kraft sum < 1
    with pytest.raises(TypeError):
        _core.decode(b"not a capsule", bytes(1024), np.empty(10, np.uint64))


def corrupt(block: bytes, offset: int, xor: int = 0x01, fix_crc: bool = True) -> bytes:
    b = bytearray(block)
    b[offset] ^= xor
    if fix_crc:
        b[0:4] = _core.crc32c(bytes(b[4:])).to_bytes(4, "little")
    return bytes(b)


def one_block(coding=CODING_DELTA, n=100, seed=5):
    x = random_table(n, seed)
    code = HuffmanCode.from_values(x, coding)
    enc = codec.encode(x, code)
    return bytes(enc.block(0)), code, x


def test_bad_checksum_raises_corruption_naming_block():
    block, code, _ = one_block()
    bad = corrupt(block, 500, fix_crc=False)
    with pytest.raises(CorruptionError, match="checksum") as err:
        codec.decode(block + bad, code)
    assert err.value.offset == 1024 and err.value.database == "block"


def test_zero_count_raises():
    block, code, _ = one_block()
    b = bytearray(block)
    b[4:6] = b"\0\0"
    b[0:4] = _core.crc32c(bytes(b[4:])).to_bytes(4, "little")
    with pytest.raises(CorruptionError, match="count"):
        codec.decode(bytes(b), code)


def test_count_too_large_overruns():
    block, code, x = one_block()
    b = bytearray(block)
    b[4:6] = (len(x) + 50).to_bytes(2, "little")
    b[0:4] = _core.crc32c(bytes(b[4:])).to_bytes(4, "little")
    with pytest.raises(CorruptionError):
        codec.decode(bytes(b), code)
    with pytest.raises(CorruptionError):
        codec_reference.decode_block(bytes(b), code.to_bytes())


def test_nonzero_padding_raises():
    block, code, _ = one_block(n=20)
    bad = corrupt(block, 1023, 0x01)
    with pytest.raises(CorruptionError, match="padding"):
        codec.decode(bad, code)
    with pytest.raises(CorruptionError, match="padding"):
        codec_reference.decode_block(bad, code.to_bytes())


def test_decode_rejects_partial_block_buffer():
    with pytest.raises(ValueError, match="multiple of 1024"):
        codec.decode(bytes(1000), HuffmanCode.for_density(10))


def test_probe_matches_brute_force(coding):
    x = random_table(3000, seed=6)
    code = HuffmanCode.from_values(x, coding)
    enc = codec.encode(x, code)
    rng = np.random.default_rng(7)
    counts = codec.block_counts(enc.blocks).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for _ in range(200):
        b = int(rng.integers(enc.n_blocks))
        vals = x[starts[b]:starts[b] + counts[b]]
        q = int(vals[rng.integers(len(vals))]) ^ int(rng.integers(0, 16))
        p, k = int(rng.integers(0, 65)), int(rng.integers(0, 8))
        mask = 0 if p == 0 else ((1 << 64) - 1) ^ ((1 << (64 - p)) - 1)
        want = [int(v) for v in vals if int(v) & mask == q & mask and bin(int(v) ^ q).count("1") <= k]
        assert codec.probe(enc.block(b), code, q, p, k) == want


# --- many blocks side by side (the query kernel's decoder) -------------------


def table_at_density(m, n_equiv, seed, top=False):
    """m sorted distinct values with the gaps of n_equiv random fingerprints
    (top: ending just below 2^64)."""
    rng = np.random.default_rng(seed)
    span = min(2**64 - 1, int(2**64 * m / n_equiv))
    base = 0 if span >= 2**64 - 1 else \
        2**64 - 1 - span if top else int(rng.integers(0, 2**64 - span, dtype=np.uint64))
    offsets = np.unique((rng.random(m) * span).astype(np.uint64))
    return np.unique(offsets + np.uint64(base))


def reference_probe(block, code, q, p, k, cap, check_checksum=True):
    """What probing block must give: its matches, "full" past cap matches,
    or the CorruptionError of the first damaged entry it decodes."""
    mask = 0 if p == 0 else U64_MAX ^ ((1 << (64 - p)) - 1)
    lo, hi = q & mask, (q & mask) | (U64_MAX ^ mask)
    count = int.from_bytes(block[4:6], "little")
    found = []
    try:
        entries = codec_reference.iter_block(block, code.to_bytes(), check_checksum=check_checksum)
        for taken, v in enumerate(entries, 1):
            if (taken == 1 and v & mask > lo) or v > hi:
                break
            if v >= lo and bin(v ^ q).count("1") <= k:
                if len(found) == cap:
                    return "full"
                found.append(v)
            if taken == count:
                break
    except CorruptionError as err:
        return err
    return found


def same_outcome(got, want):
    if isinstance(want, CorruptionError):
        return isinstance(got, CorruptionError) and \
            str(want).split(":")[-1].split()[0] in str(got)  # e.g. "bitstream", "decoded"
    if want == "full":
        return isinstance(got, CorruptionError) and "more than cap" in str(got)
    return got == want


def lanes_case(rng, tables, damage):
    """Draw one call: blocks from several tables (codes), a probe per block."""
    blocks, codes, qs, ps, ks = bytearray(), [], [], [], []
    for _ in range(int(rng.integers(1, 40))):
        code, enc, values = tables[int(rng.integers(len(tables)))]
        b = int(rng.integers(enc.n_blocks))
        block = bytearray(enc.block(b))
        if damage:
            for _ in range(int(rng.integers(1, 4))):
                at = int(rng.integers(6, codec.BLOCK_BYTES))
                block[at] ^= 1 << int(rng.integers(8))
            if rng.random() < 0.3:  # a high bit of the first value: later deltas may wrap
                bit = int(rng.integers(40, 64))
                block[6 + bit // 8] ^= 1 << (bit % 8)
        first = int.from_bytes(block[6:14], "little")
        near = int(values[int(rng.integers(len(values)))]) if rng.random() < 0.8 else first
        q = near ^ int(rng.integers(0, 2**64, dtype=np.uint64)) if rng.random() < 0.1 else \
            near ^ (1 << int(rng.integers(64))) ^ (1 << int(rng.integers(64)))
        blocks += block
        codes.append(code)
        qs.append(q)
        ps.append(int(rng.choice([0, 0, 3, 8, 16, 20, 28, 40, 64, int(rng.integers(65))])))
        ks.append(int(rng.choice([0, 1, 2, 3, 4, 6, 64])))
    return bytes(blocks), codes, qs, ps, ks


@pytest.mark.parametrize("damage", [False, True], ids=["clean", "damaged"])
def test_probe_blocks_side_by_side_match_reference(damage):
    # Densities from sparse (long deltas: the batch decoder's irregular
    # entries) to 2^26 fingerprints; codes built for the data, and codes for
    # another density (long codewords for common deltas); every coding.
    rng = np.random.default_rng(11 + damage)
    tables = []
    for n_equiv, code_n, coding, top in [
            (300, None, CODING_DELTA, False), (20_000, None, CODING_DELTA, False),
            (2**26, None, CODING_DELTA, False), (2**26, 2**12, CODING_DELTA, False),
            (2**20, 2**34, CODING_DELTA, False), (2**22, None, CODING_XOR, False),
            (2**20, None, CODING_DELTA, True), (300, None, CODING_RESTARTS, False),
            (2**23, None, CODING_RESTARTS, False), (2**26, 2**12, CODING_RESTARTS, False),
            (2**20, None, CODING_RESTARTS, True)]:
        values = table_at_density(4000, n_equiv, seed=n_equiv + coding, top=top)
        code = HuffmanCode.from_values(values, coding) if code_n is None else \
            HuffmanCode.for_density(code_n, coding)
        tables.append((code, codec.encode(values, code), values))
    for _ in range(60):
        blocks, codes, qs, ps, ks = lanes_case(rng, tables, damage)
        cap = int(rng.choice([0, 1, 3, 8081]))
        got = codec.probe_blocks(blocks, codes, qs, ps, ks, verified=damage, cap=cap)
        for i, g in enumerate(got):
            if damage and codes[i].coding == CODING_RESTARTS:
                # A probe starts at a restart record (5.4 [B13]) and so
                # meets less of the damage than a decode from first: it
                # gives some outcome, and never crashes.
                assert isinstance(g, (list, CorruptionError))
                continue
            block = blocks[i * codec.BLOCK_BYTES:(i + 1) * codec.BLOCK_BYTES]
            want = reference_probe(block, codes[i], qs[i], ps[i], ks[i], cap,
                                   check_checksum=not damage)
            assert same_outcome(g, want), (i, ps[i], ks[i], g, want)


def test_probe_blocks_checks_checksums_unless_verified():
    values = random_table(2000, seed=3)
    code = HuffmanCode.from_values(values)
    enc = codec.encode(values, code)
    block = bytearray(enc.block(0))
    block[500] ^= 0x10
    q = int(values[0])
    got = codec.probe_blocks(bytes(block) + bytes(enc.block(1)), [code, code], [q, q], [0, 0],
                             [64, 64])
    assert isinstance(got[0], CorruptionError) and "checksum" in str(got[0])
    assert got[1] == [int(v) for v in codec.decode(enc.block(1), code)]
