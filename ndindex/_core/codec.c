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

int codec_compile(const uint8_t *lengths, int coding, codec_code *out) {
    if (coding != CODING_XOR && coding != CODING_DELTA)
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
    return CODEC_OK;
}

/* ---- encoder ---------------------------------------------------------- */

typedef struct {
    uint8_t *buf; /* the block's bitstream */
    uint64_t acc; /* pending bits, left-aligned */
    unsigned nacc;
    size_t pos; /* bits written so far */
} bitwriter;

/* Append n <= 32 bits; whole 32-bit words go out big-endian at once, so
 * the accumulator holds fewer than 32 bits between calls. */
static inline void bw_put32(bitwriter *w, uint64_t bits, unsigned n) {
    w->acc |= bits << (64 - w->nacc - n);
    w->nacc += n;
    w->pos += n;
    if (w->nacc >= 32) {
        uint32_t word = (uint32_t)(w->acc >> 32);
        w->buf[0] = (uint8_t)(word >> 24);
        w->buf[1] = (uint8_t)(word >> 16);
        w->buf[2] = (uint8_t)(word >> 8);
        w->buf[3] = (uint8_t)word;
        w->buf += 4;
        w->acc <<= 32;
        w->nacc -= 32;
    }
}

/* Append the low n <= 64 bits of bits, most significant first. */
static inline void bw_put(bitwriter *w, uint64_t bits, unsigned n) {
    if (n > 32) {
        bw_put32(w, (bits >> 32) & ((1ull << (n - 32)) - 1), n - 32);
        bw_put32(w, bits & 0xFFFFFFFFull, 32);
    } else if (n) {
        bw_put32(w, bits & ((1ull << n) - 1), n);
    }
}

static inline void bw_flush(bitwriter *w) {
    while (w->nacc > 0) {
        *w->buf++ = (uint8_t)(w->acc >> 56);
        w->acc <<= 8;
        w->nacc = w->nacc > 8 ? w->nacc - 8 : 0;
    }
    w->acc = 0;
    w->nacc = 0;
}

static inline unsigned delta_h(int coding, uint64_t a, uint64_t b, uint64_t *low) {
    uint64_t d = coding == CODING_DELTA ? b - a : b ^ a;
    unsigned h = 63 - (unsigned)__builtin_clzll(d);
    *low = h ? (coding == CODING_DELTA ? d : b) & ((1ull << h) - 1) : 0;
    return h;
}

static void finish_block(uint8_t *block, bitwriter *w, uint64_t first, unsigned count) {
    bw_flush(w);
    uint8_t *end = block + BLOCK_BYTES;
    memset(w->buf, 0, (size_t)(end - w->buf));
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
        unsigned count = 1;
        i++;
        while (i < n) {
            uint64_t low;
            unsigned h = delta_h(c->coding, prev, values[i], &low);
            unsigned need = c->lengths[h] + h;
            if (w.pos + need > BLOCK_PAYLOAD_BITS)
                break;
            if (need <= 32)
                bw_put32(&w, ((uint64_t)c->codes[h] << h) | low, need);
            else {
                bw_put(&w, c->codes[h], c->lengths[h]);
                bw_put(&w, low, h);
            }
            prev = values[i++];
            count++;
        }
        finish_block(block, &w, first, count);
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

/* Decode the entry after prev at bit *pos.  Returns CODEC_OK or a status.
 * Written once and used by both decode and probe so they cannot disagree. */
static inline int next_value(const codec_code *c, const uint8_t *s, size_t *pos, uint64_t prev,
                             uint64_t *out) {
    const size_t nbytes = BLOCK_BYTES - BLOCK_HEADER_BYTES;
    uint64_t w = peek64(s, nbytes, *pos);
    unsigned len = c->lut[w >> (64 - CODE_MAX_BITS)].len;
    unsigned h = c->lut[w >> (64 - CODE_MAX_BITS)].h;
    if (len == 0)
        return CODEC_BAD_CODE;
    size_t p = *pos + len;
    if (p + h > BLOCK_PAYLOAD_BITS)
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
    if (c->coding == CODING_DELTA) {
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
    size_t pos = 0;
    for (unsigned i = 1; i < count; i++) {
        rc = next_value(c, s, &pos, v, &v);
        if (rc < 0)
            return rc;
        out[i] = v;
    }
    /* The rest of the bitstream is padding and must be zero. */
    while (pos < BLOCK_PAYLOAD_BITS) {
        unsigned n = BLOCK_PAYLOAD_BITS - pos > 57 ? 57 : (unsigned)(BLOCK_PAYLOAD_BITS - pos);
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

/* One lane's decoding state in codec_probe_lanes. */
typedef struct {
    const codec_code *c;
    const uint8_t *s; /* the bitstream, read in place */
    uint64_t v, q, lo, hi;
    size_t pos, found, cap;
    unsigned i, count;
    int k;
    uint64_t *out;
} lane_state;

/* Entries a lane decodes per turn: its state stays in registers for a
 * burst, and the bursts of different lanes overlap in the CPU. */
#define LANE_BURST 2

HOT_KERNEL void codec_probe_lanes(codec_lane *lanes, int n) {
    lane_state st[CODEC_LANES];
    int live[CODEC_LANES], nlive = 0;
    for (int j = 0; j < n && j < CODEC_LANES; j++) {
        codec_lane *l = &lanes[j];
        unsigned count;
        l->n = 0;
        int rc = l->verified ? CODEC_OK : check_header(l->block, &count);
        if (rc < 0) {
            l->n = rc;
            continue;
        }
        if (l->verified) {
            count = load_le16(l->block + 4);
            if (count < 1 || count > 1 + BLOCK_PAYLOAD_BITS) {
                l->n = CODEC_BAD_COUNT;
                continue;
            }
        }
        const uint64_t mask = l->p <= 0 ? 0 : (l->p >= 64 ? ~0ull : ~0ull << (64 - l->p));
        uint64_t first = load_le64(l->block + 6);
        if ((first & mask) > (l->q & mask))
            continue;
        st[j] = (lane_state){.c = l->code, .s = l->block + BLOCK_HEADER_BYTES, .v = first,
                             .q = l->q, .lo = l->q & mask, .hi = (l->q & mask) | ~mask,
                             .cap = l->cap, .count = count, .k = l->k, .out = l->out};
        live[nlive++] = j;
    }
    /* Each turn advances a live lane by up to LANE_BURST entries.  A lane
     * stops past its prefix (v > hi), at the block's last entry, or on
     * damage; matches are the entries in [lo, hi] within k of q. */
    while (nlive) {
        for (int a = 0; a < nlive;) {
            const int j = live[a];
            lane_state *L = &st[j];
            const codec_code *c = L->c;
            const uint8_t *s = L->s;
            const uint64_t q = L->q, lo = L->lo, hi = L->hi;
            const int k = L->k;
            uint64_t v = L->v;
            size_t pos = L->pos, found = L->found;
            unsigned i = L->i;
            int go = 1;   /* the lane goes on */
            long end = 0; /* else its result */
            for (int b = 0; b < LANE_BURST; b++) {
                if (v > hi) {
                    go = 0, end = (long)found;
                    break;
                }
                if (v >= lo && __builtin_popcountll(v ^ q) <= k) {
                    if (found >= L->cap) {
                        go = 0, end = CODEC_OUT_FULL;
                        break;
                    }
                    L->out[found++] = v;
                }
                if (++i >= L->count) {
                    go = 0, end = (long)found;
                    break;
                }
                int rc = next_value(c, s, &pos, v, &v);
                if (rc < 0) {
                    go = 0, end = rc;
                    break;
                }
            }
            if (!go) {
                lanes[j].n = end;
                live[a] = live[--nlive];
                continue;
            }
            L->v = v;
            L->pos = pos;
            L->found = found;
            L->i = i;
            a++;
        }
    }
}
