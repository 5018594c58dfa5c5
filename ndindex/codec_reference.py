"""A plain-Python block decoder written from format-spec/FORMAT.md alone.

It exists for conformance and differential tests, not for speed: it shares
no code with ``ndindex.codec`` or the C kernel (not even the checksum), so
that a mistake in one shows up as a disagreement with the other.  Section
names in comments are the spec's.
"""

from __future__ import annotations

from ndindex.errors import CorruptionError, FormatError

BLOCK_BYTES = 1024
HEADER_BYTES = 14
PAYLOAD_BITS = (BLOCK_BYTES - HEADER_BYTES) * 8
MAX_BITS = 12

# "Checksums": CRC-32C, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF.
_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    """Return the CRC-32C of data."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


_P1, _P2, _P3, _P4, _P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                           0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
_M64 = (1 << 64) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of data (Yann Collet's specification), for the record filters of 7.9."""
    n, p = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M64, (seed + _P2) & _M64, seed & _M64, (seed - _P1) & _M64]
        while p + 32 <= n:
            for i in range(4):
                v[i] = _round(v[i], int.from_bytes(data[p + 8 * i:p + 8 * i + 8], "little"))
            p += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
        for x in v:
            h = ((h ^ _round(0, x)) * _P1 + _P4) & _M64
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while p + 8 <= n:
        h = (_rotl(h ^ _round(0, int.from_bytes(data[p:p + 8], "little")), 27) * _P1 + _P4) & _M64
        p += 8
    if p + 4 <= n:
        h = (_rotl(h ^ (int.from_bytes(data[p:p + 4], "little") * _P1 & _M64), 23) * _P2 + _P3) & _M64
        p += 4
    while p < n:
        h = (_rotl(h ^ (data[p] * _P5 & _M64), 11) * _P1) & _M64
        p += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    return h ^ (h >> 32)


def parse_code(record: bytes) -> tuple[int, dict[tuple[int, int], int]]:
    """Parse a Huffman code record into (coding, {(length, codeword): h}).

    "Huffman code record": u8 coding, u8 max bits (12), 64 code lengths.
    "Canonical code": codewords are assigned in order of (length, h),
    consecutive within a length, shifted left by one between lengths.
    """
    if len(record) != 66:
        raise FormatError(f"code record is {len(record)} bytes, expected 66")
    coding, max_bits, lengths = record[0], record[1], list(record[2:])
    if coding not in (0, 1) or max_bits != MAX_BITS:
        raise FormatError(f"code coding {coding} / max bits {max_bits} not supported")
    if any(not 1 <= n <= MAX_BITS for n in lengths):
        raise FormatError("code lengths must be 1..12")
    if sum(2 ** (MAX_BITS - n) for n in lengths) != 2 ** MAX_BITS:
        raise FormatError("code is not complete")
    table = {}
    code = 0
    for length in range(1, MAX_BITS + 1):
        for h in range(64):
            if lengths[h] == length:
                table[(length, code)] = h
                code += 1
        code <<= 1
    return coding, table


def decode_block(block: bytes, code_record: bytes) -> list[int]:
    """Decode one block ("Blocks") to its list of fingerprints.

    Raises CorruptionError for every violation the spec names: checksum
    [B2], count [B3], overrun [B6], order [B7], padding [B8].
    """
    return list(iter_block(block, code_record))


def iter_block(block: bytes, code_record: bytes, *, check_checksum: bool = True):
    """Yield a block's fingerprints one at a time, checking each as it goes.

    As decode_block, but lazy: an entry is decoded, and its damage raised,
    only when asked for, and the padding [B8] is checked only after the
    last entry was taken.  A probe that stops early takes fewer.  With
    check_checksum False the checksum [B2] is not checked (a block checked
    before).
    """
    block = bytes(block)
    if len(block) != BLOCK_BYTES:
        raise CorruptionError(f"block is {len(block)} bytes, expected {BLOCK_BYTES}", database="block")
    coding, table = parse_code(code_record)
    stored = int.from_bytes(block[0:4], "little")
    if check_checksum and crc32c(block[4:]) != stored:
        raise CorruptionError("checksum mismatch", database="block", offset=0)
    count = int.from_bytes(block[4:6], "little")
    if count < 1:
        raise CorruptionError("impossible entry count 0", database="block", offset=4)
    value = int.from_bytes(block[6:14], "little")
    yield value
    # The bitstream, most significant bit of each byte first.
    stream = int.from_bytes(block[HEADER_BYTES:], "big")

    def bits(pos: int, n: int) -> int:
        return (stream >> (PAYLOAD_BITS - pos - n)) & ((1 << n) - 1)

    pos = 0
    for _ in range(count - 1):
        length, codeword, h = 0, 0, None
        while h is None:
            length += 1
            if length > MAX_BITS or pos + length > PAYLOAD_BITS:
                raise CorruptionError("bitstream runs past the end of the block", database="block")
            codeword = bits(pos, length)
            h = table.get((length, codeword))
        pos += length
        if pos + h > PAYLOAD_BITS:
            raise CorruptionError("bitstream runs past the end of the block", database="block")
        low = bits(pos, h)
        pos += h
        if coding == 1:  # delta: b = a + (2^h + low)
            nxt = value + (1 << h) + low
            if nxt >= 1 << 64:
                raise CorruptionError("decoded values do not increase", database="block")
        else:  # xor: bits of a above h kept, bit h set (must be clear in a), low below
            if (value >> h) & 1:
                raise CorruptionError("decoded values do not increase", database="block")
            nxt = ((value >> h) | 1) << h | low
        value = nxt
        yield value
    if pos < PAYLOAD_BITS and bits(pos, PAYLOAD_BITS - pos) != 0:
        raise CorruptionError("nonzero padding bits after the last entry", database="block")
