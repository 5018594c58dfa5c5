#include "rawblock.h"

static inline void put_le64(uint8_t *p, uint64_t v) {
    memcpy(p, &v, 8);
}

/* How many of values[0..avail) one packed block takes (0: none fits, the
 * span of two already needs more than RAW_PACKED_MAX_WIDTH bits) and its
 * width.  The most m with (m - 1) * bit_length(values[m-1] - values[0])
 * within RAW_PACKED_BITS: both factors grow with m. */
static size_t packed_fit(const uint64_t *values, size_t avail, unsigned *width) {
    size_t lim = avail < RAW_PACKED_MAX_VALUES ? avail : RAW_PACKED_MAX_VALUES, m = 0;
    unsigned w = 0;
    for (size_t i = 1; i < lim; i++) {
        unsigned wi = rb_bit_length(values[i] - values[0]);
        if (wi > RAW_PACKED_MAX_WIDTH || i * (size_t)wi > RAW_PACKED_BITS)
            break;
        m = i + 1;
        w = wi;
    }
    *width = w;
    return m;
}

static void put_plain(uint8_t *blk, const uint64_t *values, size_t count) {
    blk[4] = (uint8_t)count;
    blk[5] = (uint8_t)(count >> 8);
    for (size_t i = 0; i < count; i++)
        put_le64(blk + RAW_BLOCK_HEADER_BYTES + 8 * i, values[i]);
}

/* The offsets go through a 64-bit accumulator, stored a word at a time: an
 * or into memory at each value's byte read back the bytes the previous
 * store had just written, at another offset, which the CPU cannot forward
 * (two thirds of raw_encode's time, and raw_encode an eighth of a
 * stream's).  w <= RAW_PACKED_MAX_WIDTH < 64. */
static void put_packed(uint8_t *blk, const uint64_t *values, size_t count, unsigned w) {
    blk[4] = (uint8_t)count;
    blk[5] = (uint8_t)(count >> 8);
    blk[6] = (uint8_t)w;
    put_le64(blk + RAW_BLOCK_HEADER_BYTES, values[0]);
    uint8_t *p = blk + RAW_PACKED_OFFSETS_AT;
    uint64_t acc = 0;
    unsigned held = 0; /* bits in acc, < 64 */
    for (size_t i = 1; i < count; i++) {
        uint64_t d = values[i] - values[0];
        acc |= d << held;
        held += w;
        if (held >= 64) {
            put_le64(p, acc);
            p += 8;
            held -= 64;
            acc = held ? d >> (w - held) : 0;
        }
    }
    memcpy(p, &acc, (held + 7) / 8);
}

long raw_encode(const uint64_t *values, size_t n, int packed, uint8_t *out, size_t cap,
                uint64_t *keys) {
    for (size_t i = 1; i < n; i++)
        if (values[i] <= values[i - 1])
            return CODEC_UNSORTED_INPUT;
    size_t b = 0;
    for (size_t at = 0; at < n; b++) {
        if (b >= cap)
            return CODEC_OVERRUN;
        uint8_t *blk = out + b * BLOCK_BYTES;
        memset(blk, 0, BLOCK_BYTES);
        size_t count = n - at < RAW_PLAIN_MAX_VALUES ? n - at : RAW_PLAIN_MAX_VALUES;
        unsigned w = 0;
        size_t m = packed ? packed_fit(values + at, n - at, &w) : 0;
        if (m > count || (m == count && m > 1)) {
            count = m;
            put_packed(blk, values + at, count, w);
        } else {
            put_plain(blk, values + at, count);
        }
        uint32_t crc = crc32c(blk + 4, BLOCK_BYTES - 4);
        memcpy(blk, &crc, 4);
        keys[b] = values[at + count - 1];
        at += count;
    }
    return (long)b;
}

long raw_decode(const uint8_t *block, uint64_t *out) {
    raw_view v;
    long n = raw_open(block, &v);
    if (n < 0)
        return n;
    for (unsigned i = 0; i < (unsigned)n; i++) {
        out[i] = raw_at(&v, i);
        if (i && out[i] <= out[i - 1])
            return CODEC_NOT_SORTED;
    }
    size_t end;
    if (v.width) {
        if (rb_bit_length(out[n - 1] - out[0]) != v.width)
            return CODEC_BAD_WIDTH;
        size_t bits = (size_t)(n - 1) * v.width;
        end = RAW_PACKED_OFFSETS_AT + bits / 8;
        if (bits % 8 && block[end++] >> (bits % 8))
            return CODEC_BAD_PADDING;
    } else {
        end = RAW_BLOCK_HEADER_BYTES + 8 * (size_t)n;
    }
    for (size_t i = end; i < BLOCK_BYTES; i++)
        if (block[i])
            return CODEC_BAD_PADDING;
    return n;
}
