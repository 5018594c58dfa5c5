#include "codec.h"

#include <string.h>

#include "crc32c.h"

static inline uint16_t load_le16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline void store_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void store_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* The next 64 bits of the bitstream from bit position pos (MSB first); bits
 * past the end of the stream read as zero.  The top 57 bits are always
 * valid, because at most 7 bits of the first byte are skipped. */
static inline uint64_t peek64(const uint8_t *s, size_t nbytes, size_t pos) {
    size_t byte = pos >> 3;
    uint64_t w = 0;
    if (byte + 8 <= nbytes) {
        memcpy(&w, s + byte, 8);
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        w = __builtin_bswap64(w);
#endif
    } else {
        for (size_t i = 0; i < 8; i++)
            w = (w << 8) | (byte + i < nbytes ? s[byte + i] : 0);
    }
    return w << (pos & 7);
}

/* n bits (0..64) at pos, as an integer. */
static inline uint64_t read_bits(const uint8_t *s, size_t nbytes, size_t pos, unsigned n) {
    if (n == 0)
        return 0;
    if (n <= 57)
        return peek64(s, nbytes, pos) >> (64 - n);
    uint64_t hi = peek64(s, nbytes, pos) >> (64 - 32);
    uint64_t lo = peek64(s, nbytes, pos + 32) >> (64 - (n - 32));
    return (hi << (n - 32)) | lo;
}

/* The batch decoder's table (see codec_probe_lanes): for the next
 * CODE_FAST_BITS bits, the codeword's length (bits 0-7), 63 - h (8-15), its
 * whole advance len + h (16-23), and FAST_IRREGULAR when the codeword is
 * longer than CODE_FAST_BITS or its h bits may lie past the 57 bits one
 * load guarantees. */
static void fast_table_build(codec_code *c) {
    for (uint32_t i = 0; i < (1u << CODE_FAST_BITS); i++) {
        unsigned len = c->lut[i << (CODE_MAX_BITS - CODE_FAST_BITS)].len;
        unsigned h = c->lut[i << (CODE_MAX_BITS - CODE_FAST_BITS)].h;
        if (len == 0 || len > CODE_FAST_BITS || len + h > 57)
            c->fast[i] = FAST_IRREGULAR;
        else
            c->fast[i] = len | ((63 - h) << 8) | ((len + h) << 16);
    }
}

int codec_compile(const uint8_t *lengths, int coding, codec_code *out) {
    if (coding != CODING_XOR && coding != CODING_DELTA && coding != CODING_RESTARTS)
        return CODEC_BAD_CODE;
    memset(out, 0, sizeof *out);
    out->coding = (uint8_t)coding;
    /* Kraft sum, in units of 2^-CODE_MAX_BITS. */
    uint32_t kraft = 0;
    for (int s = 0; s < CODE_SYMBOLS; s++) {
        if (lengths[s] < 1 || lengths[s] > CODE_MAX_BITS)
            return CODEC_BAD_CODE;
        kraft += 1u << (CODE_MAX_BITS - lengths[s]);
    }
    if (kraft != (1u << CODE_MAX_BITS))
        return CODEC_BAD_CODE;
    /* Canonical assignment (as DEFLATE): by length, then by symbol. */
    uint32_t code = 0;
    for (int len = 1; len <= CODE_MAX_BITS; len++) {
        for (int s = 0; s < CODE_SYMBOLS; s++) {
            if (lengths[s] != len)
                continue;
            out->lengths[s] = (uint8_t)len;
            out->codes[s] = (uint16_t)code;
            uint32_t first = code << (CODE_MAX_BITS - len);
            uint32_t span = 1u << (CODE_MAX_BITS - len);
            for (uint32_t i = 0; i < span; i++) {
                out->lut[first + i].len = (uint8_t)len;
                out->lut[first + i].h = (uint8_t)s;
            }
            code++;
        }
        code <<= 1;
    }
    fast_table_build(out);
    return CODEC_OK;
}

/* ---- encoder ---------------------------------------------------------- */

typedef struct {
    uint8_t *buf;          /* where the bitstream's next whole 64-bit word goes */
    unsigned __int128 acc; /* pending bits, left-aligned */
    unsigned nacc;         /* fewer than 64 between calls */
    size_t pos;            /* bits written so far */
} bitwriter;

/* Append 1 <= n <= 64 bits (bits < 2^n), most significant first; whole
 * 64-bit words go out big-endian in one store.  An entry of a 10M table
 * takes about 44 bits (its code and a 40-bit remainder): one call, where
 * a 32-bit accumulator took three and wrote byte by byte (encoding then
 * ran at 95M values/s, a fifth of a merge into the main level). */
static inline void bw_put_fast(bitwriter *w, uint64_t bits, unsigned n) {
    w->acc |= (unsigned __int128)bits << (128 - w->nacc - n);
    w->nacc += n;
    w->pos += n;
    if (w->nacc >= 64) {
        uint64_t word = __builtin_bswap64((uint64_t)(w->acc >> 64));
        memcpy(w->buf, &word, 8);
        w->buf += 8;
        w->acc <<= 64;
        w->nacc -= 64;
    }
}

/* Append the low n <= 64 bits of bits, most significant first. */
static inline void bw_put(bitwriter *w, uint64_t bits, unsigned n) {
    if (n)
        bw_put_fast(w, n < 64 ? bits & ((1ull << n) - 1) : bits, n);
}

static inline void bw_flush(bitwriter *w) {
    while (w->nacc > 0) {
        *w->buf++ = (uint8_t)(w->acc >> 120);
        w->acc <<= 8;
        w->nacc = w->nacc > 8 ? w->nacc - 8 : 0;
    }
    w->acc = 0;
    w->nacc = 0;
}

static inline unsigned delta_h(int coding, uint64_t a, uint64_t b, uint64_t *low) {
    uint64_t d = coding != CODING_XOR ? b - a : b ^ a;
    unsigned h = 63 - (unsigned)__builtin_clzll(d);
    *low = h ? (coding != CODING_XOR ? d : b) & ((1ull << h) - 1) : 0;
    return h;
}

/* How many of values[i..n) a block whose first is values[i] holds, filled
 * greedily into a bitstream of cap bits ([B9]); ends[j] is the bit where
 * the block's entry j ends (ends[0] = 0). */
static unsigned block_fill(const codec_code *c, const uint64_t *values, size_t n, size_t i,
                           size_t cap, uint32_t *ends) {
    size_t used = 0, j = i + 1;
    ends[0] = 0;
    for (; j < n; j++) {
        uint64_t low;
        unsigned h = delta_h(c->coding, values[j - 1], values[j], &low);
        if (used + c->lengths[h] + h > cap)
            break;
        used += c->lengths[h] + h;
        ends[j - i] = (uint32_t)used;
    }
    return (unsigned)(j - i);
}

/* A coding-2 block's restart records: where entry restart_entry(r + 1,
 * count) ends in the bitstream, and its value less first. */
typedef struct {
    unsigned w;         /* bits of each value */
    size_t stream_bits; /* the bitstream's length: up to the table */
    uint32_t pos[RESTARTS];
    uint64_t delta[RESTARTS];
} restart_table;

static void finish_block(uint8_t *block, bitwriter *w, uint64_t first, unsigned count,
                         const codec_code *c, const restart_table *rt) {
    bw_flush(w);
    uint8_t *end = block + BLOCK_BYTES;
    memset(w->buf, 0, (size_t)(end - w->buf));
    if (c->coding == CODING_RESTARTS) {
        unsigned nbytes = restart_table_bytes(rt->w);
        bitwriter tw = {end - nbytes, 0, 0, 0};
        for (int r = 0; r < RESTARTS; r++) {
            bw_put(&tw, rt->pos[r], RESTART_POS_BITS);
            bw_put(&tw, rt->delta[r], rt->w);
        }
        bw_flush(&tw);
        end[-1] = (uint8_t)rt->w;
    }
    block[4] = (uint8_t)count;
    block[5] = (uint8_t)(count >> 8);
    store_le64(block + 6, first);
    store_le32(block, crc32c(block + 4, BLOCK_BYTES - 4));
}

long codec_encode(const codec_code *c, const uint64_t *values, size_t n, uint8_t *out,
                  size_t out_blocks, uint64_t *keys) {
    if (n == 0)
        return 0;
    for (size_t i = 1; i < n; i++)
        if (values[i] <= values[i - 1])
            return CODEC_UNSORTED_INPUT;
    size_t nb = 0;
    size_t i = 0;
    while (i < n) {
        if (nb >= out_blocks)
            return CODEC_OVERRUN;
        uint8_t *block = out + nb * BLOCK_BYTES;
        bitwriter w = {block + BLOCK_HEADER_BYTES, 0, 0, 0};
        uint64_t first = values[i], prev = first;
        restart_table rt = {0};
        uint32_t ends[1 + BLOCK_PAYLOAD_BITS];
        const int restarts = c->coding == CODING_RESTARTS;
        unsigned count = block_fill(
            c, values, n, i, restarts ? restart_stream_bits(0) : BLOCK_PAYLOAD_BITS, ends);
        if (restarts) {
            /* [B14]: w is that of the last restart's value in the block the
             * smallest table allows; the block the table of that w allows
             * holds no more entries, so its restarts' values are no larger. */
            uint64_t span = values[i + restart_entry(RESTARTS, count)] - first;
            rt.w = span ? 64 - (unsigned)__builtin_clzll(span) : 0;
            size_t cap = restart_stream_bits(rt.w);
            while (ends[count - 1] > cap)
                count--;
            for (unsigned r = 0; r < RESTARTS; r++) {
                unsigned at = restart_entry(r + 1, count);
                rt.pos[r] = ends[at];
                rt.delta[r] = values[i + at] - first;
            }
        }
        for (unsigned j = 1; j < count; j++) {
            uint64_t low;
            unsigned h = delta_h(c->coding, prev, values[i + j], &low);
            unsigned need = c->lengths[h] + h;
            if (need <= 64)
                bw_put_fast(&w, ((uint64_t)c->codes[h] << h) | low, need);
            else {
                bw_put(&w, c->codes[h], c->lengths[h]);
                bw_put(&w, low, h);
            }
            prev = values[i + j];
        }
        i += count;
        finish_block(block, &w, first, count, c, &rt);
        keys[nb++] = prev;
    }
    return (long)nb;
}

/* ---- decoder ---------------------------------------------------------- */

static int check_header(const uint8_t *block, unsigned *count) {
    uint32_t stored = (uint32_t)block[0] | ((uint32_t)block[1] << 8) |
                      ((uint32_t)block[2] << 16) | ((uint32_t)block[3] << 24);
    if (crc32c(block + 4, BLOCK_BYTES - 4) != stored)
        return CODEC_BAD_CHECKSUM;
    *count = load_le16(block + 4);
    /* Each entry after the first takes at least one bit. */
    if (*count < 1 || *count > 1 + BLOCK_PAYLOAD_BITS)
        return CODEC_BAD_COUNT;
    return CODEC_OK;
}

long codec_block_count(const uint8_t *block) {
    unsigned count;
    int rc = check_header(block, &count);
    return rc < 0 ? rc : (long)count;
}

/* A coding-2 block's w (byte 1023): CODEC_BAD_RESTART above 64 ([B11]). */
static inline int restart_width(const uint8_t *block, unsigned *w) {
    *w = block[BLOCK_BYTES - 1];
    return *w > 64 ? CODEC_BAD_RESTART : CODEC_OK;
}

/* Read a coding-2 block's restart table: CODEC_OK, or CODEC_BAD_RESTART
 * for a width above 64 or nonzero bits after the records. */
static int restart_table_read(const uint8_t *block, restart_table *rt) {
    unsigned w;
    if (restart_width(block, &w) < 0)
        return CODEC_BAD_RESTART;
    unsigned nbytes = restart_table_bytes(w);
    const uint8_t *t = block + BLOCK_BYTES - nbytes;
    size_t bit = 0;
    for (int r = 0; r < RESTARTS; r++) {
        rt->pos[r] = (uint32_t)read_bits(t, nbytes - 1, bit, RESTART_POS_BITS);
        rt->delta[r] = read_bits(t, nbytes - 1, bit + RESTART_POS_BITS, w);
        bit += RESTART_POS_BITS + w;
    }
    /* The table's unused low bits (fewer than 8) are zero. */
    if (read_bits(t, nbytes - 1, bit, (unsigned)(8 * (nbytes - 1) - bit)) != 0)
        return CODEC_BAD_RESTART;
    rt->w = w;
    rt->stream_bits = restart_stream_bits(w);
    return CODEC_OK;
}

/* Decode the entry after prev at bit *pos, of a bitstream of limit bits.
 * Returns CODEC_OK or a status.  Written once and used by both decode and
 * probe so they cannot disagree. */
static inline int next_value(const codec_code *c, const uint8_t *s, size_t *pos, uint64_t prev,
                             uint64_t *out, size_t limit) {
    const size_t nbytes = BLOCK_BYTES - BLOCK_HEADER_BYTES;
    uint64_t w = peek64(s, nbytes, *pos);
    unsigned len = c->lut[w >> (64 - CODE_MAX_BITS)].len;
    unsigned h = c->lut[w >> (64 - CODE_MAX_BITS)].h;
    if (len == 0)
        return CODEC_BAD_CODE;
    size_t p = *pos + len;
    if (p + h > limit)
        return CODEC_OVERRUN;
    uint64_t low;
    if (h == 0)
        low = 0;
    else if (h + len <= 57)
        low = (w << len) >> (64 - h);
    else
        low = read_bits(s, nbytes, p, h);
    *pos = p + h;
    uint64_t top = 1ull << h;
    uint64_t v;
    if (c->coding != CODING_XOR) {
        v = prev + (top | low);
        if (v <= prev)
            return CODEC_NOT_SORTED; /* wrapped past 2^64 */
    } else {
        if ((prev >> h) & 1)
            return CODEC_NOT_SORTED;
        v = (((prev >> h) | 1) << h) | low;
    }
    *out = v;
    return CODEC_OK;
}

long codec_decode(const codec_code *c, const uint8_t *block, uint64_t *out, size_t cap) {
    unsigned count;
    int rc = check_header(block, &count);
    if (rc < 0)
        return rc;
    if (count > cap)
        return CODEC_BAD_COUNT;
    const uint8_t *s = block + BLOCK_HEADER_BYTES;
    uint64_t v = load_le64(block + 6);
    out[0] = v;
    size_t pos = 0, limit = BLOCK_PAYLOAD_BITS;
    restart_table rt;
    int nr = 0;
    if (c->coding == CODING_RESTARTS) {
        if ((rc = restart_table_read(block, &rt)) < 0)
            return rc;
        limit = rt.stream_bits;
        nr = RESTARTS;
    }
    unsigned i = 1;
    for (int r = 0; r <= nr; r++) {
        unsigned end = r < nr ? restart_entry(r + 1, count) : count - 1;
        for (; i <= end; i++) {
            rc = next_value(c, s, &pos, v, &v, limit);
            if (rc < 0)
                return rc;
            out[i] = v;
        }
        /* Restart r: where its entry ends, and its value less first. */
        if (r < nr && (pos != rt.pos[r] || out[end] - out[0] != rt.delta[r]))
            return CODEC_BAD_RESTART;
    }
    /* The rest of the bitstream is padding and must be zero. */
    while (pos < limit) {
        unsigned n = limit - pos > 57 ? 57 : (unsigned)(limit - pos);
        if (read_bits(s, BLOCK_BYTES - BLOCK_HEADER_BYTES, pos, n) != 0)
            return CODEC_BAD_PADDING;
        pos += n;
    }
    return (long)count;
}

HOT_KERNEL long codec_probe(const codec_code *c, const uint8_t *block, uint64_t q, int p, int k,
                            uint64_t *out, size_t cap) {
    return codec_probe_verified(c, block, q, p, k, out, cap, 0);
}

/* One probe is the one-lane case of codec_probe_lanes. */
long codec_probe_verified(const codec_code *c, const uint8_t *block, uint64_t q, int p, int k,
                          uint64_t *out, size_t cap, int verified) {
    codec_lane lane = {.code = c, .block = block, .q = q, .p = p, .k = k, .verified = verified,
                       .out = out, .cap = cap};
    codec_probe_lanes(&lane, 1);
    return lane.n == CODEC_OUT_FULL ? CODEC_OVERRUN : lane.n;
}

/* ---- probing many blocks at once ----------------------------------------
 *
 * One block's decode is a chain of dependent loads: each codeword's position
 * comes from the previous one's length, about 10 cycles an entry.  The
 * blocks a query probes are independent, so PROBE_SLOTS of them decode side
 * by side, FAST_BATCH entries at a time, in straight-line code the CPU
 * overlaps (a loop over per-lane states, tried first, overlapped almost
 * nothing: 4.4 ns an entry against 1.2 for four interleaved chains).
 *
 * The batch step does no checks: it reads 8 bytes at each position, looks
 * the codeword up in the code's fast table, and adds the delta.  After the
 * batch, one test says whether every entry was ordinary -- a code of at
 * most CODE_FAST_BITS bits, a delta whose bits lie in the 57 a load
 * guarantees, the bitstream not overrun, values increasing -- and if not,
 * the batch is decoded again from its start by next_value, the checked
 * decoder, one entry at a time.  So every result and every error is the
 * checked decoder's own.  Near the end of a block a slot reads from a
 * zero-padded copy of the block's last bytes, so a batch never reads past
 * the block (bits past the stream read as zero, as peek64 reads them). */

#define PROBE_SLOTS 4
#define FAST_BATCH 8
/* The most bits one batch step advances: an ordinary entry's codeword and
 * h bits lie in the 57 bits a load guarantees; an irregular one's table
 * entry advances nothing. */
#define FAST_ADVANCE_MAX 57
/* In place, a batch starting at or below this bit reads inside the stream. */
#define FAST_MAX_POS (BLOCK_PAYLOAD_BITS - 64 - FAST_BATCH * FAST_ADVANCE_MAX)
#define STREAM_BYTES (BLOCK_BYTES - BLOCK_HEADER_BYTES)
/* The tail copy: the stream's bytes from FAST_MAX_POS on, what batches
 * starting inside them read past the stream's end, and a load's 8 bytes. */
#define TAIL_BYTES 192
_Static_assert(TAIL_BYTES >= STREAM_BYTES - FAST_MAX_POS / 8 + FAST_BATCH * FAST_ADVANCE_MAX / 8 + 16,
               "the tail copy must hold every byte a batch in it reads");
/* The helpers are inlined into each clone of codec_probe_lanes, so that
 * their popcounts compile to the instruction where the clone may use it. */
#define KERNEL_INLINE static inline __attribute__((always_inline))

typedef struct {
    codec_lane *lane;
    const codec_code *c;
    const uint8_t *s; /* where batches read: the block's bitstream, or tail */
    size_t pos;       /* bit position in s */
    size_t base;      /* bit position of s[0] in the bitstream */
    size_t limit;     /* the bitstream's length in bits */
    uint64_t v;       /* entry i, not yet checked */
    uint64_t q, lo, hi;
    size_t found;
    unsigned i, count;
    int k;
    uint8_t tail[TAIL_BYTES];
} probe_slot;

/* Move slot S to the last restart at or below its prefix: every entry
 * before it is smaller, so none of them can match (a block that starts
 * inside the prefix has no such restart and skips this).  0 with l->n set
 * if the records cannot be trusted, else 1. */
KERNEL_INLINE int slot_restart(probe_slot *S, codec_lane *l, uint64_t first) {
    restart_table rt;
    int rc = restart_table_read(l->block, &rt);
    if (rc < 0) {
        l->n = rc;
        return 0;
    }
    for (int r = RESTARTS - 1; r >= 0; r--) {
        uint64_t v = first + rt.delta[r];
        if (rt.pos[r] > rt.stream_bits || v < first) {
            l->n = CODEC_BAD_RESTART;
            return 0;
        }
        unsigned at = restart_entry((unsigned)r + 1, S->count);
        if (at > 0 && v <= S->lo) {
            S->v = v;
            S->i = at;
            S->pos = rt.pos[r];
            break;
        }
    }
    return 1;
}

/* Start lane l in slot S: 1 if it has entries to decode, else 0 with l->n
 * set (damage, or no entry with q's prefix). */
KERNEL_INLINE int slot_start(probe_slot *S, codec_lane *l) {
    unsigned count;
    l->n = 0;
    if (l->verified) {
        count = load_le16(l->block + 4);
        if (count < 1 || count > 1 + BLOCK_PAYLOAD_BITS) {
            l->n = CODEC_BAD_COUNT;
            return 0;
        }
    } else {
        int rc = check_header(l->block, &count);
        if (rc < 0) {
            l->n = rc;
            return 0;
        }
    }
    const uint64_t mask = prefix_mask(l->p);
    uint64_t first = load_le64(l->block + 6);
    if ((first & mask) > (l->q & mask))
        return 0;
    S->lane = l;
    S->c = l->code;
    S->s = l->block + BLOCK_HEADER_BYTES;
    S->pos = S->base = 0;
    S->v = first;
    S->q = l->q;
    S->lo = l->q & mask;
    S->hi = (l->q & mask) | ~mask;
    S->found = 0;
    S->i = 0;
    S->count = count;
    S->k = l->k;
    S->limit = BLOCK_PAYLOAD_BITS;
    if (S->c->coding == CODING_RESTARTS) {
        unsigned w;
        if (restart_width(l->block, &w) < 0) {
            l->n = CODEC_BAD_RESTART;
            return 0;
        }
        S->limit = restart_stream_bits(w);
        if (first < S->lo && !slot_restart(S, l, first))
            return 0;
    }
    return 1;
}

/* Go on one entry at a time with the checked decoder, at most n entries.
 * Returns 1 once the lane is finished (its n set), else 0, reading in
 * place again.  A lane stops past its prefix (v > hi), at the block's last
 * entry, or on damage; matches are the entries in [lo, hi] within k of q. */
KERNEL_INLINE int slot_checked(probe_slot *S, unsigned n) {
    const uint8_t *s = S->lane->block + BLOCK_HEADER_BYTES;
    size_t pos = S->base + S->pos;
    codec_lane *l = S->lane;
    for (unsigned b = 0; b < n; b++) {
        uint64_t v = S->v;
        if (v > S->hi) {
            l->n = (long)S->found;
            return 1;
        }
        if (v >= S->lo && popcount64(v ^ S->q) <= S->k) {
            if (S->found >= l->cap) {
                l->n = CODEC_OUT_FULL;
                return 1;
            }
            l->out[S->found++] = v;
        }
        if (++S->i >= S->count) {
            l->n = (long)S->found;
            return 1;
        }
        int rc = next_value(S->c, s, &pos, v, &S->v, S->limit);
        if (rc < 0) {
            l->n = rc;
            return 1;
        }
    }
    S->s = s;
    S->pos = pos;
    S->base = 0;
    return 0;
}

/* Make slot S ready for a batch: 1, or 0 once its lane is finished.  The
 * last entries of a block (fewer than a batch) and XOR-coded runs go
 * through the checked decoder. */
KERNEL_INLINE int slot_ready(probe_slot *S) {
    if (S->count - 1 - S->i < FAST_BATCH || S->c->coding == CODING_XOR)
        return !slot_checked(S, S->count);
    if (S->base == 0 && S->pos > FAST_MAX_POS) {
        size_t from = S->pos >> 3, n = STREAM_BYTES - from;
        memcpy(S->tail, S->s + from, n);
        memset(S->tail + n, 0, TAIL_BYTES - n);
        S->s = S->tail;
        S->base = from * 8;
        S->pos -= from * 8;
    }
    return 1;
}

/* Check a batch's values (vals[0] = entry i, ..., vals[FAST_BATCH] = entry
 * i + FAST_BATCH) and take the batch, or decode it again checked.  Returns 1
 * once the lane is finished. */
KERNEL_INLINE int slot_settle(probe_slot *S, const uint64_t *vals, size_t pos, uint32_t flags) {
    /* Every delta of an ordinary entry lies in [1, 2^57), so the batch's
     * values increase unless their sum wrapped, which leaves the last one
     * at or below the first: one compare checks all of them. */
    if ((flags & FAST_IRREGULAR) || S->base + pos > S->limit || vals[FAST_BATCH] <= vals[0])
        return slot_checked(S, FAST_BATCH);
    codec_lane *l = S->lane;
    if (vals[0] >= S->lo && vals[FAST_BATCH - 1] <= S->hi) {
        /* Inside the prefix, the common case: matches are rare, so one
         * branch on whether any entry is within k. */
        int any = 0;
        for (int b = 0; b < FAST_BATCH; b++)
            any |= popcount64(vals[b] ^ S->q) <= S->k;
        if (!any) {
            S->v = vals[FAST_BATCH];
            S->pos = pos;
            S->i += FAST_BATCH;
            return 0;
        }
    }
    for (int b = 0; b < FAST_BATCH; b++) {
        uint64_t x = vals[b];
        if (x > S->hi) {
            l->n = (long)S->found;
            return 1;
        }
        if (popcount64(x ^ S->q) <= S->k && x >= S->lo) {
            if (S->found >= l->cap) {
                l->n = CODEC_OUT_FULL;
                return 1;
            }
            l->out[S->found++] = x;
        }
    }
    S->v = vals[FAST_BATCH];
    S->pos = pos;
    S->i += FAST_BATCH;
    return 0;
}

/* An idle slot decodes zeros with an all-zero table: it never advances. */
static const uint8_t idle_stream[16];
static const uint32_t idle_table[1 << CODE_FAST_BITS];

/* One entry of slot j's batch: no checks (see above). */
#define FAST_STEP(j)                                                                               \
    do {                                                                                           \
        uint64_t w;                                                                                \
        memcpy(&w, s##j + (pos##j >> 3), 8);                                                       \
        w = __builtin_bswap64(w) << (pos##j & 7);                                                  \
        uint32_t e = t##j[w >> (64 - CODE_FAST_BITS)];                                             \
        flags##j |= e;                                                                             \
        v##j += (((w << (e & 0xFF)) >> 1) | (1ull << 63)) >> ((e >> 8) & 0xFF);                    \
        vals[j][b + 1] = v##j;                                                                     \
        pos##j += (e >> 16) & 0xFF;                                                                \
    } while (0)

HOT_KERNEL void codec_probe_lanes(codec_lane *lanes, int n) {
    probe_slot S[PROBE_SLOTS];
    int busy[PROBE_SLOTS] = {0};
    int next = 0;
    for (;;) {
        int nbusy = 0;
        for (int j = 0; j < PROBE_SLOTS; j++) {
            while (!busy[j] || !slot_ready(&S[j])) {
                busy[j] = 0;
                while (next < n && !slot_start(&S[j], &lanes[next]))
                    next++;
                if (next >= n)
                    break;
                next++;
                busy[j] = 1;
            }
            nbusy += busy[j];
        }
        if (!nbusy)
            return;
#define SLOT_INPUT(j)                                                                              \
    const uint8_t *s##j = busy[j] ? S[j].s : idle_stream;                                          \
    const uint32_t *t##j = busy[j] ? S[j].c->fast : idle_table;                                    \
    size_t pos##j = busy[j] ? S[j].pos : 0;                                                        \
    uint64_t v##j = busy[j] ? S[j].v : 0;                                                          \
    uint32_t flags##j = 0;                                                                         \
    vals[j][0] = v##j;
        uint64_t vals[PROBE_SLOTS][FAST_BATCH + 1];
        SLOT_INPUT(0)
        SLOT_INPUT(1)
        SLOT_INPUT(2)
        SLOT_INPUT(3)
#undef SLOT_INPUT
        for (int b = 0; b < FAST_BATCH; b++) {
            FAST_STEP(0);
            FAST_STEP(1);
            FAST_STEP(2);
            FAST_STEP(3);
        }
        const size_t pos[PROBE_SLOTS] = {pos0, pos1, pos2, pos3};
        const uint32_t flags[PROBE_SLOTS] = {flags0, flags1, flags2, flags3};
        for (int j = 0; j < PROBE_SLOTS; j++)
            if (busy[j] && slot_settle(&S[j], vals[j], pos[j], flags[j]))
                busy[j] = 0;
    }
}
