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
#: [B3]: the first entry, then at most one per bit of the bitstream.
MAX_COUNT = 1 + PAYLOAD_BITS
#: "Huffman code record": the codings.
XOR, DELTA, RESTARTS = 0, 1, 2
#: 5.4: three restart records, each a 13-bit end and a w-bit value.
RESTART_RECORDS = 3
RESTART_END_BITS = 13

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

    "Huffman code record": u8 coding (0 xor, 1 delta, 2 delta with restart
    tables), u8 max bits (12), 64 code lengths.  "Canonical code": codewords
    are assigned in order of (length, h), consecutive within a length,
    shifted left by one between lengths.
    """
    if len(record) != 66:
        raise FormatError(f"code record is {len(record)} bytes, expected 66")
    coding, max_bits, lengths = record[0], record[1], list(record[2:])
    if coding not in (XOR, DELTA, RESTARTS) or max_bits != MAX_BITS:
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


def restart_table_bytes(w: int) -> int:
    """T of 5.4: the restart table's bytes, w included, for values of w bits."""
    return 1 + -(-RESTART_RECORDS * (RESTART_END_BITS + w) // 8)


def restart_entry(r: int, count: int) -> int:
    """e_r of 5.4: the index of the fingerprint restart record r (1..3) names."""
    return r * count // (RESTART_RECORDS + 1)


def _restart_records(block: bytes) -> tuple[int, list[tuple[int, int]]]:
    """Read a coding-2 block's restart table (5.4): (bitstream bits, [(end, value)] x 3).

    Rejects w above 64 [B11] and nonzero bits after the third record [B12].
    """
    w = block[BLOCK_BYTES - 1]
    if w > 64:
        raise CorruptionError(f"restart table width {w} is above 64", database="block",
                              offset=BLOCK_BYTES - 1)
    size = restart_table_bytes(w)
    nbits = 8 * (size - 1)
    table = int.from_bytes(block[BLOCK_BYTES - size:BLOCK_BYTES - 1], "big")
    records = []
    for r in range(RESTART_RECORDS):
        rec = (table >> (nbits - (r + 1) * (RESTART_END_BITS + w))) & ((1 << (RESTART_END_BITS + w)) - 1)
        records.append((rec >> w, rec & ((1 << w) - 1)))
    if table & ((1 << (nbits - RESTART_RECORDS * (RESTART_END_BITS + w))) - 1):
        raise CorruptionError("nonzero bits after the third restart record", database="block",
                              offset=BLOCK_BYTES - size)
    return PAYLOAD_BITS - 8 * size, records


def restart_points(block: bytes, code_record: bytes) -> list[tuple[int, int, int]]:
    """Return the (e_r, fingerprint e_r, bit where entry e_r + 1 begins) of
    each restart record of a coding-2 block, r = 1..3 ([B13]).

    The records are read, not checked against the entries (only a whole
    decode can do that, [B12]); a record whose value passes 2^64 or whose
    end passes the bitstream is rejected here.  Decode from a point with
    ``iter_block(block, code_record, start=point)``.
    """
    block = bytes(block)
    if parse_code(code_record)[0] != RESTARTS:
        raise ValueError("only blocks of coding 2 have restart tables")
    _check_header(block, True)
    stream_bits, records = _restart_records(block)
    count = int.from_bytes(block[4:6], "little")
    first = int.from_bytes(block[6:14], "little")
    points = []
    for r, (end, value) in enumerate(records, 1):
        if first + value >= 1 << 64 or end > stream_bits:
            raise CorruptionError(f"restart record {r} lies past the block's values or bitstream",
                                  database="block")
        points.append((restart_entry(r, count), first + value, end))
    return points


def _check_header(block: bytes, check_checksum: bool) -> int:
    """Check a block's size, checksum [B2] and count [B3]; return the count."""
    if len(block) != BLOCK_BYTES:
        raise CorruptionError(f"block is {len(block)} bytes, expected {BLOCK_BYTES}", database="block")
    stored = int.from_bytes(block[0:4], "little")
    if check_checksum and crc32c(block[4:]) != stored:
        raise CorruptionError("checksum mismatch", database="block", offset=0)
    count = int.from_bytes(block[4:6], "little")
    if not 1 <= count <= MAX_COUNT:
        raise CorruptionError(f"impossible entry count {count}", database="block", offset=4)
    return count


def decode_block(block: bytes, code_record: bytes) -> list[int]:
    """Decode one block ("Blocks") to its list of fingerprints.

    Raises CorruptionError for every violation the spec names: checksum
    [B2], count [B3], overrun [B6], order [B7], padding [B8]; with coding
    2, the restart table's width [B11] and records [B12].
    """
    return list(iter_block(block, code_record))


def iter_block(block: bytes, code_record: bytes, *, check_checksum: bool = True,
               start: tuple[int, int, int] | None = None):
    """Yield a block's fingerprints one at a time, checking each as it goes.

    As decode_block, but lazy: an entry is decoded, and its damage raised,
    only when asked for, and the padding [B8] is checked only after the
    last entry was taken.  A probe that stops early takes fewer.  With
    check_checksum False the checksum [B2] is not checked (a block checked
    before).  Coding 2: the restart table's width and the bits after its
    records are checked before the first value, each record once its
    entry is decoded [B12].  start, a point of restart_points, decodes
    from that record on ([B13]): fingerprints start[0].. are yielded, and
    only the records from there on are checked.
    """
    block = bytes(block)
    coding, table = parse_code(code_record)
    count = _check_header(block, check_checksum)
    first = int.from_bytes(block[6:14], "little")
    stream_bits, records = PAYLOAD_BITS, []
    if coding == RESTARTS:
        stream_bits, records = _restart_records(block)
    # Each record r says where entry e_r ends and its value less first.
    check_at = {}
    for r, (end, delta) in enumerate(records, 1):
        check_at.setdefault(restart_entry(r, count), []).append((r, end, delta))
    index, value, pos = 0, first, 0
    if start is not None:
        if coding != RESTARTS:
            raise ValueError("only blocks of coding 2 have restart points")
        index, value, pos = start
        if not 0 <= index < count or pos > stream_bits:
            raise ValueError(f"start {start} is not a restart point of this block")
    # The bitstream, most significant bit of each byte first: 8 * 1010 bits,
    # or with coding 2 the 8 * (1010 - T) bits before the restart table [B11].
    stream = int.from_bytes(block[HEADER_BYTES:HEADER_BYTES + stream_bits // 8], "big")

    def bits(at: int, n: int) -> int:
        return (stream >> (stream_bits - at - n)) & ((1 << n) - 1)

    def check_restarts():
        for r, end, delta in check_at.get(index, ()):
            if pos != end or value - first != delta:
                raise CorruptionError(
                    f"restart record {r} (end {end}, value {delta}) disagrees with entry {index}"
                    f" (ends at bit {pos}, value {value - first})", database="block")

    check_restarts()
    yield value
    while index < count - 1:
        length, codeword, h = 0, 0, None
        while h is None:
            length += 1
            if length > MAX_BITS or pos + length > stream_bits:
                raise CorruptionError("bitstream runs past the end of the block", database="block")
            codeword = bits(pos, length)
            h = table.get((length, codeword))
        pos += length
        if pos + h > stream_bits:
            raise CorruptionError("bitstream runs past the end of the block", database="block")
        low = bits(pos, h)
        pos += h
        if coding != XOR:  # delta: b = a + (2^h + low)
            nxt = value + (1 << h) + low
            if nxt >= 1 << 64:
                raise CorruptionError("decoded values do not increase", database="block")
        else:  # xor: bits of a above h kept, bit h set (must be clear in a), low below
            if (value >> h) & 1:
                raise CorruptionError("decoded values do not increase", database="block")
            nxt = ((value >> h) | 1) << h | low
        value = nxt
        index += 1
        check_restarts()
        yield value
    if pos < stream_bits and bits(pos, stream_bits - pos) != 0:
        raise CorruptionError("nonzero padding bits after the last entry", database="block")


# "Raw blocks" (5.3): plain (width 0) and packed.
RAW_PLAIN_MAX = 127
RAW_PACKED_MAX = 1024
RAW_PACKED_MAX_WIDTH = 56
RAW_OFFSETS_AT = 16
RAW_PACKED_BITS = (BLOCK_BYTES - RAW_OFFSETS_AT - 7) * 8


def decode_raw_block(block: bytes) -> list[int]:
    """Decode one raw block ("Raw blocks") to its list of fingerprints.

    Raises CorruptionError for every violation [B10] and [B15] name:
    checksum, count, width, reserved byte, order, the packed width not the
    bit length of the block's span, nonzero padding.
    """
    if len(block) != BLOCK_BYTES:
        raise CorruptionError(f"block is {len(block)} bytes, expected {BLOCK_BYTES}", database="block")
    if crc32c(block[4:]) != int.from_bytes(block[0:4], "little"):
        raise CorruptionError("checksum mismatch", database="block", offset=0)
    count = int.from_bytes(block[4:6], "little")
    width, reserved = block[6], block[7]
    if reserved:
        raise CorruptionError("nonzero reserved byte", database="block", offset=7)
    if width == 0:  # plain: the values whole
        if not 1 <= count <= RAW_PLAIN_MAX:
            raise CorruptionError(f"impossible count {count}", database="block", offset=4)
        values = [int.from_bytes(block[8 + 8 * i:16 + 8 * i], "little") for i in range(count)]
        end_bit = (8 + 8 * count) * 8
    else:  # packed: the first value, then offsets from it, `width` bits each, LSB-first
        if width > RAW_PACKED_MAX_WIDTH or not 2 <= count <= RAW_PACKED_MAX or \
                (count - 1) * width > RAW_PACKED_BITS:
            raise CorruptionError(f"impossible count {count} or width {width}", database="block",
                                  offset=4)
        first = int.from_bytes(block[8:16], "little")
        stream = int.from_bytes(block[RAW_OFFSETS_AT:], "little")
        values = [first] + [first + (stream >> ((i - 1) * width) & ((1 << width) - 1))
                            for i in range(1, count)]
        if values[-1] >= 1 << 64:
            raise CorruptionError("a value past 2^64", database="block", offset=RAW_OFFSETS_AT)
        if (values[-1] - first).bit_length() != width:
            raise CorruptionError(f"width {width} is not the bit length of the block's span",
                                  database="block", offset=6)
        end_bit = RAW_OFFSETS_AT * 8 + (count - 1) * width
    if any(b <= a for a, b in zip(values, values[1:])):
        raise CorruptionError("values do not increase", database="block")
    rest = int.from_bytes(block, "little") >> end_bit
    if rest:
        raise CorruptionError("nonzero padding", database="block")
    return values
