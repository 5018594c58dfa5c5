/* Raw blocks (FORMAT.md 5.3): the blocks of the small, often rewritten
 * levels, cheap to merge and binary-searchable where they lie.
 *
 * Two forms share the 8-byte header (u32 checksum of bytes 4..1023, u16
 * count, u8 width, u8 reserved):
 *
 * - plain (width 0): up to 127 values stored whole, u64 LE from byte 8;
 * - packed (width w in 1..56, format 4): the first value at byte 8, then
 *   each later value's offset from it in w bits, LSB-first, from byte 16.
 *   w is the bit length of (last - first).  A run of n random fingerprints
 *   has neighbours about 2^64 / n apart, so a block of m values spans about
 *   m * 2^64 / n: at n = 4M a table (level 2 at 10M), 160 values in 50
 *   bits, 6.4 bytes a value against 8.06 plain.  Every value is still
 *   one load, a shift and a mask away, so a probe binary-searches a packed
 *   block as it does a plain one.
 *
 * Offsets are read with one unaligned 8-byte load at byte bit/8: w <= 56
 * keeps an offset inside it, and the last RAW_PACKED_SLACK bytes stay free
 * so that the load never leaves the block. */
#ifndef NDINDEX_RAWBLOCK_H
#define NDINDEX_RAWBLOCK_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codec.h"
#include "crc32c.h"

#define RAW_BLOCK_HEADER_BYTES 8
#define RAW_PLAIN_MAX_VALUES ((BLOCK_BYTES - RAW_BLOCK_HEADER_BYTES) / 8)
#define RAW_PACKED_OFFSETS_AT 16
#define RAW_PACKED_SLACK 7
#define RAW_PACKED_BITS ((BLOCK_BYTES - RAW_PACKED_OFFSETS_AT - RAW_PACKED_SLACK) * 8)
#define RAW_PACKED_MAX_WIDTH 56
#define RAW_PACKED_MAX_VALUES 1024
/* The most values a raw block of either form holds (output buffers). */
#define RAW_BLOCK_MAX_VALUES RAW_PACKED_MAX_VALUES

/* A little-endian u64 at p (unaligned). */
static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline unsigned rb_bit_length(uint64_t x) {
    return x ? 64u - (unsigned)__builtin_clzll(x) : 0u;
}

/* A checked raw block, ready to read value i of. */
typedef struct {
    const uint8_t *block;
    uint64_t first, mask;
    unsigned n, width;
} raw_view;

/* Value i; packed is v->width != 0, a constant where the caller knows the
 * form (raw_probe_form), so that the plain form compiles to one load. */
static inline uint64_t raw_at_form(const raw_view *v, unsigned i, const int packed) {
    if (!packed)
        return load_le64(v->block + RAW_BLOCK_HEADER_BYTES + 8 * (size_t)i);
    if (!i)
        return v->first;
    size_t bit = (size_t)(i - 1) * v->width;
    return v->first +
           ((load_le64(v->block + RAW_PACKED_OFFSETS_AT + (bit >> 3)) >> (bit & 7)) & v->mask);
}

static inline uint64_t raw_at(const raw_view *v, unsigned i) {
    return raw_at_form(v, i, v->width != 0);
}

/* The header's count and width, checked (not the checksum): the count, or
 * CODEC_BAD_COUNT / CODEC_BAD_WIDTH. */
static inline long raw_count(const uint8_t *block) {
    unsigned n = (unsigned)block[4] | ((unsigned)block[5] << 8), w = block[6];
    if (block[7])
        return CODEC_BAD_COUNT;
    if (!w)
        return n >= 1 && n <= RAW_PLAIN_MAX_VALUES ? (long)n : CODEC_BAD_COUNT;
    if (w > RAW_PACKED_MAX_WIDTH)
        return CODEC_BAD_WIDTH;
    if (n < 2 || n > RAW_PACKED_MAX_VALUES ||
        (size_t)(n - 1) * w > RAW_PACKED_BITS)
        return CODEC_BAD_COUNT;
    return n;
}

/* The view of a block whose header raw_count accepted (n its count). */
static inline raw_view raw_view_of(const uint8_t *block, unsigned n) {
    raw_view v = {block, load_le64(block + RAW_BLOCK_HEADER_BYTES), 0, n, block[6]};
    v.mask = v.width ? (~0ull >> (64 - v.width)) : 0;
    return v;
}

/* A block's checksum and header checked, its view in *v: the count, or
 * the CODEC_ status of what failed. */
static inline long raw_open(const uint8_t *block, raw_view *v) {
    uint32_t stored;
    memcpy(&stored, block, 4);
    if (crc32c(block + 4, BLOCK_BYTES - 4) != stored)
        return CODEC_BAD_CHECKSUM;
    long n = raw_count(block);
    if (n >= 0)
        *v = raw_view_of(block, (unsigned)n);
    return n;
}

/* The check of a raw block's first visit: its checksum, header, that its
 * last value is block_key (the directory's key for it) and, packed, that
 * its width is the bit length of its span.  The count, or the CODEC_
 * status of what failed. */
static inline long raw_block_check(const uint8_t *block, uint64_t block_key) {
    raw_view v;
    long n = raw_open(block, &v);
    if (n < 0)
        return n;
    uint64_t last = raw_at(&v, (unsigned)n - 1);
    if (last != block_key || (v.width && last <= v.first))
        return CODEC_NOT_SORTED;
    if (v.width && rb_bit_length(last - v.first) != v.width)
        return CODEC_BAD_WIDTH;
    return n;
}

/* Where the first value >= lo likely sits among a raw block's n values,
 * which run from about first to key: fingerprints spread evenly. */
static inline unsigned raw_guess(uint64_t first, uint64_t key, uint64_t lo, unsigned n) {
    if (lo <= first || n < 2)
        return 0;
    if (lo >= key)
        return n - 1;
    return (unsigned)((double)(lo - first) / (double)(key - first) * (n - 1));
}

/* Prefetch the lines holding bytes [from, to] of a block, each once: a
 * block lies at any offset in its page, so its 1024 bytes span 17 lines. */
static inline void prefetch_span(const uint8_t *block, unsigned from, unsigned to) {
    uintptr_t line = (uintptr_t)(block + from) & ~(uintptr_t)63, last = (uintptr_t)(block + to);
    for (; line <= last; line += 64)
        __builtin_prefetch((const void *)line);
}

static inline void prefetch_block(const uint8_t *block) {
    prefetch_span(block, 0, BLOCK_BYTES - 1);
}

/* The 8-byte steps (of steps in all) a probe for [lo, hi] likely reads in
 * a block whose values run from about lower to key: from slack steps
 * before lo's guessed place (raw_guess) to slack steps past hi's.  Both
 * kinds of block fill their bytes about evenly, so a value's place in the
 * block's span is about its place in the bytes.  (Reckoned in bytes
 * instead, with raw_guess over 1016 places, GCC 12 at -O3 compiled every
 * prefetch of raw_prefetch away: busy-moment queries took 1.3-1.5x as
 * long.) */
static inline void guess_steps(uint64_t lower, uint64_t key, uint64_t lo, uint64_t hi,
                               unsigned steps, unsigned slack, unsigned *from, unsigned *to) {
    unsigned a = raw_guess(lower, key, lo, steps), b = raw_guess(lower, key, hi, steps);
    *from = a > slack ? a - slack : 0;
    *to = b + slack < steps ? b + slack : steps - 1;
}

/* Prefetch the lines of a raw block a probe for [lo, hi] reads, before its
 * header is known: the header and the values from a little before lo's
 * guessed place through hi's (16 steps: three standard deviations of lo's
 * place).  A run below the main level holds a few values a prefix, and a
 * query at a busy moment reads a dozen such blocks: fetching all of each
 * kept the core's miss buffers full, and the prefetches themselves
 * stalled.  Without lower (has_lower 0; lower is the previous block's
 * key) the whole block. */
static inline void raw_prefetch(const uint8_t *block, int has_lower, uint64_t lower, uint64_t key,
                                uint64_t lo, uint64_t hi) {
    if (!has_lower) {
        prefetch_block(block);
        return;
    }
    unsigned from, to;
    guess_steps(lower, key, lo, hi, RAW_PLAIN_MAX_VALUES, 8, &from, &to);
    prefetch_span(block, 0, RAW_BLOCK_HEADER_BYTES - 1);
    prefetch_span(block, RAW_BLOCK_HEADER_BYTES + 8 * from, RAW_BLOCK_HEADER_BYTES + 8 * to + 7);
}

/* Prefetch the lines of a Huffman block (coding 2) a probe for [lo, hi]
 * reads, before its header is known: the header, the restart table at the
 * block's end, and the bitstream from the restart at or below lo's
 * guessed place (restarts sit at quarters of the entries, so about at
 * quarters of the stream) through hi's.  A query's first block of a run
 * is decoded from a restart to hi, about half of it; fetching every line
 * of every block filled the core's miss buffers as it did for raw
 * blocks. */
static inline void coded_prefetch(const uint8_t *block, int has_lower, uint64_t lower,
                                  uint64_t key, uint64_t lo, uint64_t hi) {
    if (!has_lower) {
        prefetch_block(block);
        return;
    }
    enum { STEPS = (BLOCK_BYTES - BLOCK_HEADER_BYTES) / 8, QUARTER = STEPS / 4 };
    unsigned from, to;
    guess_steps(lower, key, lo, hi, STEPS, 14, &from, &to);
    from = from / QUARTER * QUARTER;
    from = from ? from - 1 : 0;
    prefetch_span(block, 0, BLOCK_HEADER_BYTES - 1);
    prefetch_span(block, BLOCK_HEADER_BYTES + 8 * from, BLOCK_HEADER_BYTES + 8 * to + 7);
    prefetch_span(block, BLOCK_BYTES - RESTART_TABLE_MAX_BYTES, BLOCK_BYTES - 1);
}

/* raw_probe of one form (packed: a constant after inlining). */
static inline __attribute__((always_inline)) long
raw_probe_form(const raw_view *v, uint64_t block_key, uint64_t lo, uint64_t hi, uint64_t qp, int k,
               uint64_t *out, size_t cap, const int packed) {
    unsigned n = v->n;
    /* First value >= lo: [a, e) holds it (e = n: none), found by galloping
     * from the guess, then halving. */
    unsigned g = raw_guess(raw_at_form(v, 0, packed), block_key, lo, n), a, e;
    if (raw_at_form(v, g, packed) < lo) {
        unsigned step = 1;
        a = g + 1;
        while (a + step - 1 < n && raw_at_form(v, a + step - 1, packed) < lo) {
            a += step;
            step *= 2;
        }
        e = a + step - 1 < n ? a + step - 1 : n;
    } else {
        unsigned step = 1;
        e = g;
        while (e >= step && raw_at_form(v, e - step, packed) >= lo) {
            e -= step;
            step *= 2;
        }
        a = e >= step ? e - step + 1 : 0;
    }
    while (a < e) {
        unsigned mid = a + (e - a) / 2;
        if (raw_at_form(v, mid, packed) < lo)
            a = mid + 1;
        else
            e = mid;
    }
    long m = 0;
    uint64_t prev = a ? raw_at_form(v, a - 1, packed) : 0;
    for (unsigned i = a; i < n; i++) {
        uint64_t x = raw_at_form(v, i, packed);
        if (i && x <= prev)
            return CODEC_NOT_SORTED;
        prev = x;
        if (x > hi)
            break;
        if (popcount64(x ^ qp) <= k && (size_t)m < cap)
            out[m++] = x;
    }
    return m;
}

/* Entries x of a checked raw block (raw_block_check, or raw_count once
 * verified; n its count) with lo <= x <= hi and popcount(x ^ qp) <= k.
 * The search for lo starts at its guessed position (raw_guess) and gallops
 * from there, so it reads the lines raw_prefetch fetched. */
static inline __attribute__((always_inline)) long
raw_probe(const uint8_t *block, unsigned n, uint64_t block_key, uint64_t lo, uint64_t hi,
          uint64_t qp, int k, uint64_t *out, size_t cap) {
    raw_view v = raw_view_of(block, n);
    return v.width ? raw_probe_form(&v, block_key, lo, hi, qp, k, out, cap, 1)
                   : raw_probe_form(&v, block_key, lo, hi, qp, k, out, cap, 0);
}

/* Encode n strictly increasing values into raw blocks at out (capacity cap
 * blocks), each block's last value into keys; packed: in the packed form
 * wherever it holds more values than a plain block would (format 4 files),
 * else plain only.  Returns the number of blocks (never more than plain
 * blocks would take) or a negative codec status. */
long raw_encode(const uint64_t *values, size_t n, int packed, uint8_t *out, size_t cap,
                uint64_t *keys);

/* Decode one raw block into out (capacity >= RAW_BLOCK_MAX_VALUES); returns
 * the count or a negative codec status (checksum, header, order, width,
 * padding). */
long raw_decode(const uint8_t *block, uint64_t *out);

#endif
