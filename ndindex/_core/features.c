/* Feature kernels of the fingerprint layer; see ndx_features.h for the contract
 * and format-spec/fingerprinter.md for the normative definitions. */
#include "ndx_features.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- XXH64 */
/* XXH64 as specified by Yann Collet (xxhash.com, "xxHash fast digest
 * algorithm", XXH64).  Reads are little-endian whatever the host's order, so
 * a feature hashes to the same value on every platform. */

#define P64_1 UINT64_C(0x9E3779B185EBCA87)
#define P64_2 UINT64_C(0xC2B2AE3D27D4EB4F)
#define P64_3 UINT64_C(0x165667B19E3779F9)
#define P64_4 UINT64_C(0x85EBCA77C2B2AE63)
#define P64_5 UINT64_C(0x27D4EB2F165667C5)

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const uint8_t *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

static inline uint32_t read32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t xxh_round(uint64_t acc, uint64_t input) {
    acc += input * P64_2;
    acc = rotl64(acc, 31);
    return acc * P64_1;
}

static inline uint64_t xxh_merge(uint64_t acc, uint64_t val) {
    acc ^= xxh_round(0, val);
    return acc * P64_1 + P64_4;
}

uint64_t fp_xxh64(const void *data, size_t len, uint64_t seed) {
    const uint8_t *p = data;
    const uint8_t *end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = seed + P64_1 + P64_2, v2 = seed + P64_2, v3 = seed, v4 = seed - P64_1;
        const uint8_t *limit = end - 32;
        do {
            v1 = xxh_round(v1, read64(p));
            v2 = xxh_round(v2, read64(p + 8));
            v3 = xxh_round(v3, read64(p + 16));
            v4 = xxh_round(v4, read64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xxh_merge(h, v1);
        h = xxh_merge(h, v2);
        h = xxh_merge(h, v3);
        h = xxh_merge(h, v4);
    } else {
        h = seed + P64_5;
    }
    h += (uint64_t)len;
    while (p + 8 <= end) {
        h ^= xxh_round(0, read64(p));
        h = rotl64(h, 27) * P64_1 + P64_4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)read32(p) * P64_1;
        h = rotl64(h, 23) * P64_2 + P64_3;
        p += 4;
    }
    while (p < end) {
        h ^= (*p) * P64_5;
        h = rotl64(h, 11) * P64_1;
        p++;
    }
    h ^= h >> 33;
    h *= P64_2;
    h ^= h >> 29;
    h *= P64_3;
    h ^= h >> 32;
    return h;
}

void fp_xxh64_rows(const uint8_t *data, size_t n_rows, size_t row_bytes, uint64_t seed,
                   uint64_t *out) {
    for (size_t i = 0; i < n_rows; i++)
        out[i] = fp_xxh64(data + i * row_bytes, row_bytes, seed);
}

/* ---------------------------------------------------------------- Rabin */
/* Polynomials over GF(2) of degree < 64 live in a uint64 (bit i = x^i); the
 * modulus is x^64 + FP_RABIN_POLY, irreducible (checked by Rabin's test:
 * x^(2^64) = x mod P and gcd(x^(2^32) - x, P) = 1). */

/* shift_table[t] = t(x) * x^64 mod P for the top byte t shifted out. */
static uint64_t shift_table[256];
static int shift_table_ready;

static void rabin_init(void) {
    if (shift_table_ready)
        return;
    uint64_t xpow[8]; /* x^(64+i) mod P */
    xpow[0] = FP_RABIN_POLY;
    for (int i = 1; i < 8; i++)
        xpow[i] = (xpow[i - 1] << 1) ^ ((xpow[i - 1] >> 63) ? FP_RABIN_POLY : 0);
    for (int t = 0; t < 256; t++) {
        uint64_t r = 0;
        for (int i = 0; i < 8; i++)
            if ((t >> i) & 1)
                r ^= xpow[i];
        shift_table[t] = r;
    }
    shift_table_ready = 1; /* idempotent: a racing second init writes the same values */
}

/* f * x^8 + byte, mod P. */
static inline uint64_t rabin_push(uint64_t f, uint8_t byte) {
    return ((f << 8) ^ shift_table[f >> 56]) ^ byte;
}

uint64_t fp_rabin(const uint8_t *data, size_t len) {
    rabin_init();
    uint64_t f = 0;
    for (size_t i = 0; i < len; i++)
        f = rabin_push(f, data[i]);
    return f;
}

static inline uint64_t rabin_push_cp(uint64_t f, uint32_t cp) {
    f = rabin_push(f, (uint8_t)(cp >> 24));
    f = rabin_push(f, (uint8_t)(cp >> 16));
    f = rabin_push(f, (uint8_t)(cp >> 8));
    return rabin_push(f, (uint8_t)cp);
}

/* pop[k][b] = (b << 8k) * x^(32 n) mod P: the contribution of the oldest code
 * point of a window of n code points, byte k (0 = lowest) of its UTF-32BE. */
static void rabin_pop_tables(uint32_t n, uint64_t pop[4][256]) {
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 256; b++) {
            uint64_t f = (uint64_t)b << (8 * k);
            for (uint32_t i = 0; i < 4 * n; i++)
                f = (f << 8) ^ shift_table[f >> 56];
            pop[k][b] = f;
        }
}

/* ---------------------------------------------------------------- tokens */

/* ASCII word characters: [0-9A-Za-z_], as Python's str.isalnum() or '_'. */
static int ascii_word(uint32_t c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           c == '_';
}

/* ASCII white space as str.isspace(): \t \n \v \f \r, 0x1c-0x1f and space. */
static int ascii_space(uint32_t c) { return (c >= 9 && c <= 13) || (c >= 28 && c <= 32); }

/* Decode one code point at p (< end); returns its byte length.  An invalid or
 * truncated sequence decodes as one byte with cp = 0xFFFD. */
static size_t utf8_next(const uint8_t *p, const uint8_t *end, uint32_t *cp) {
    uint8_t c = p[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t n;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) {
        n = 2; v = c & 0x1F; min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3; v = c & 0x0F; min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4; v = c & 0x07; min = 0x10000;
    } else {
        *cp = 0xFFFD;
        return 1;
    }
    if ((size_t)(end - p) < n) {
        *cp = 0xFFFD;
        return 1;
    }
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        v = (v << 6) | (p[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = 0xFFFD;
        return 1;
    }
    *cp = v;
    return n;
}

static int is_word(const fp_params *p, uint32_t cp) {
    return cp < 0x80 ? ascii_word(cp) : (p->is_word ? p->is_word(cp) : 0);
}

static int is_space(const fp_params *p, uint32_t cp) {
    return cp < 0x80 ? ascii_space(cp) : (p->is_space ? p->is_space(cp) : 0);
}

static int is_stop(const fp_params *p, uint64_t h) {
    size_t lo = 0, hi = p->n_stop;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->stop[mid] < h)
            lo = mid + 1;
        else if (p->stop[mid] > h)
            hi = mid;
        else
            return 1;
    }
    return 0;
}

/* The compact form of a piece: kept tokens laid end to end.  Words and lines
 * are joined by one separator byte (space, newline), so a run of n tokens is
 * one contiguous span and an n-gram feature hashes that span directly; chars
 * keeps the whitespace-collapsed text, one token per code point. */
typedef struct {
    uint8_t *buf;
    size_t len;
    size_t *start; /* byte offset of each token; start[n] = end of the last + 1 */
    size_t n;
} compact;

static int compact_alloc(compact *c, size_t bytes, size_t tokens) {
    c->buf = malloc(bytes + 1);
    c->start = malloc((tokens + 2) * sizeof(size_t));
    c->len = c->n = 0;
    if (!c->buf || !c->start) {
        free(c->buf);
        free(c->start);
        return FP_NOMEM;
    }
    return FP_OK;
}

/* Append one separated token (words, lines). */
static void compact_token(compact *c, const uint8_t *tok, size_t len, uint8_t sep) {
    if (c->n > 0)
        c->buf[c->len++] = sep;
    c->start[c->n++] = c->len;
    memcpy(c->buf + c->len, tok, len);
    c->len += len;
}

/* Tokens of words or lines mode into c (carry first, then the piece). */
static void tokenize_separated(const uint8_t *text, size_t len, const uint8_t *carry,
                               size_t carry_len, const fp_params *p, compact *c,
                               size_t *n_piece) {
    uint8_t sep = p->unit == FP_UNIT_WORDS ? ' ' : '\n';
    size_t i = 0;
    while (i < carry_len) { /* the carry is already compact: split on sep */
        size_t j = i;
        while (j < carry_len && carry[j] != sep)
            j++;
        compact_token(c, carry + i, j - i, sep);
        i = j + 1;
    }
    size_t before = c->n;
    const uint8_t *q = text, *end = text + len;
    if (p->unit == FP_UNIT_WORDS) {
        while (q < end) {
            uint32_t cp;
            size_t n = utf8_next(q, end, &cp);
            if (!is_word(p, cp)) {
                q += n;
                continue;
            }
            const uint8_t *s = q;
            q += n;
            while (q < end) {
                n = utf8_next(q, end, &cp);
                if (!is_word(p, cp))
                    break;
                q += n;
            }
            size_t tl = (size_t)(q - s);
            if (p->n_stop && is_stop(p, fp_xxh64(s, tl, p->seed)))
                continue;
            compact_token(c, s, tl, sep);
        }
    } else { /* lines: white space collapsed to one space, trimmed; empty lines dropped */
        while (q < end) {
            size_t tok_start = c->len + (c->n > 0 ? 1 : 0);
            size_t out = tok_start;
            int pending_space = 0;
            while (q < end && *q != '\n' && *q != '\r') {
                uint32_t cp;
                size_t n = utf8_next(q, end, &cp);
                if (is_space(p, cp)) {
                    pending_space = out > tok_start;
                } else {
                    if (pending_space)
                        c->buf[out++] = ' ';
                    pending_space = 0;
                    memcpy(c->buf + out, q, n);
                    out += n;
                }
                q += n;
            }
            if (q < end)
                q++; /* the line break */
            size_t tl = out - tok_start;
            if (tl == 0 || (p->n_stop && is_stop(p, fp_xxh64(c->buf + tok_start, tl, p->seed))))
                continue;
            if (c->n > 0)
                c->buf[c->len] = sep;
            c->start[c->n++] = tok_start;
            c->len = out;
        }
    }
    *n_piece = c->n - before;
}

/* Code points of chars mode into c: white space runs collapse to one space;
 * leading space is dropped at the start of the text, trailing at its end. */
static void tokenize_chars(const uint8_t *text, size_t len, const uint8_t *carry,
                           size_t carry_len, const fp_params *p, compact *c, size_t *n_piece) {
    memcpy(c->buf, carry, carry_len);
    const uint8_t *q = carry, *end = carry + carry_len;
    while (q < end) {
        uint32_t cp;
        c->start[c->n++] = (size_t)(q - carry);
        q += utf8_next(q, end, &cp);
    }
    c->len = carry_len;
    size_t before = c->n;
    int last_space = carry_len == 0 || c->buf[carry_len - 1] == ' ';
    q = text;
    end = text + len;
    while (q < end) {
        uint32_t cp;
        size_t n = utf8_next(q, end, &cp);
        if (is_space(p, cp)) {
            if (!last_space) {
                c->start[c->n++] = c->len;
                c->buf[c->len++] = ' ';
                last_space = 1;
            }
        } else {
            c->start[c->n++] = c->len;
            memcpy(c->buf + c->len, q, n);
            c->len += n;
            last_space = 0;
        }
        q += n;
    }
    if (p->final && c->n > 0 && c->buf[c->len - 1] == ' ' && c->n > before) {
        c->n--;
        c->len--;
    }
    *n_piece = c->n - before;
}

/* Hash the features of c: every run of ngram consecutive tokens, or, at the
 * end of a text that produced no feature at all, the whole run of fewer. */
static int emit_features(const compact *c, const fp_params *p, fp_result *r) {
    size_t n = c->n, g = p->ngram;
    size_t count = n >= g ? n - g + 1 : 0;
    int short_text = count == 0 && n > 0 && p->final && !p->emitted_before;
    r->features = malloc((count ? count : 1) * sizeof(uint64_t));
    if (!r->features)
        return FP_NOMEM;
    int sep = p->unit != FP_UNIT_CHARS;
    /* end of token i: the next token's start, less its separator */
    #define TOKEN_END(i) ((i) + 1 < n ? c->start[(i) + 1] - (size_t)sep : c->len)
    if (p->hash == FP_HASH_RABIN) {
        uint64_t pop[4][256];
        rabin_pop_tables((uint32_t)g, pop);
        uint64_t f = 0;
        const uint8_t *end = c->buf + c->len;
        for (size_t i = 0; i < n; i++) {
            uint32_t cp;
            utf8_next(c->buf + c->start[i], end, &cp);
            f = rabin_push_cp(f, cp);
            if (i >= g) {
                uint32_t old;
                utf8_next(c->buf + c->start[i - g], end, &old);
                f ^= pop[0][old & 0xFF] ^ pop[1][(old >> 8) & 0xFF] ^
                     pop[2][(old >> 16) & 0xFF] ^ pop[3][old >> 24];
            }
            if (i + 1 >= g)
                r->features[i + 1 - g] = f;
        }
        if (short_text)
            r->features[0] = f;
    } else {
        for (size_t i = 0; i < count; i++) {
            size_t s = c->start[i], e = TOKEN_END(i + g - 1);
            r->features[i] = fp_xxh64(c->buf + s, e - s, p->seed);
        }
        if (short_text)
            r->features[0] = fp_xxh64(c->buf, c->len, p->seed);
    }
    r->n_features = short_text ? 1 : count;
    /* carry: the last ngram-1 tokens, which can still start a feature */
    size_t keep = g - 1 < n ? g - 1 : n;
    r->carry_len = 0;
    r->carry = NULL;
    if (keep > 0) {
        size_t s = c->start[n - keep];
        r->carry_len = c->len - s;
        r->carry = malloc(r->carry_len);
        if (!r->carry) {
            free(r->features);
            r->features = NULL;
            return FP_NOMEM;
        }
        memcpy(r->carry, c->buf + s, r->carry_len);
    }
    #undef TOKEN_END
    return FP_OK;
}

int fp_extract(const uint8_t *text, size_t len, const uint8_t *carry, size_t carry_len,
               const fp_params *p, fp_result *r) {
    memset(r, 0, sizeof(*r));
    if (p->ngram < 1 || p->unit < FP_UNIT_WORDS || p->unit > FP_UNIT_LINES ||
        (p->hash == FP_HASH_RABIN && p->unit != FP_UNIT_CHARS))
        return FP_BAD_ARG;
    rabin_init();
    compact c;
    /* bytes: the text and carry plus a separator per token; tokens: at most
     * one per byte (chars) or per two bytes (words, lines) plus the carry's */
    if (compact_alloc(&c, len + 2 * carry_len + 2, len + carry_len + 2) != FP_OK)
        return FP_NOMEM;
    size_t n_piece;
    if (p->unit == FP_UNIT_CHARS)
        tokenize_chars(text, len, carry, carry_len, p, &c, &n_piece);
    else
        tokenize_separated(text, len, carry, carry_len, p, &c, &n_piece);
    int rc = emit_features(&c, p, r);
    r->n_tokens = n_piece;
    free(c.buf);
    free(c.start);
    return rc;
}

/* ---------------------------------------------------------------- simhash */
/* Charikar's accumulation adds +w or -w to 64 counters per feature.  Instead
 * each feature adds w to one bucket per byte of its hash (8 adds, not 64),
 * and finish() expands the 8 x 256 buckets into the 64 counters once per
 * document: V_j = 2 * S_j - W with S_j the weight of features whose bit j is
 * set.  Integer (fixed-point) weights keep the sums exact. */
void fp_simhash_accumulate(const uint64_t *features, const int64_t *weights, size_t n,
                           int64_t buckets[8][256]) {
    for (size_t i = 0; i < n; i++) {
        uint64_t h = features[i];
        int64_t w = weights ? weights[i] : ((int64_t)1 << FP_WEIGHT_SHIFT);
        for (int b = 0; b < 8; b++)
            buckets[b][(h >> (8 * b)) & 0xFF] += w;
    }
}

void fp_simhash_finish(const int64_t buckets[8][256], int64_t v[64]) {
    int64_t total = 0;
    for (int x = 0; x < 256; x++)
        total += buckets[0][x];
    for (int b = 0; b < 8; b++)
        for (int j = 0; j < 8; j++) {
            int64_t s = 0;
            for (int x = 0; x < 256; x++)
                if ((x >> j) & 1)
                    s += buckets[b][x];
            v[8 * b + j] = 2 * s - total;
        }
}

/* ---------------------------------------------------------------- MinHash */
/* Dietzfelbinger's multiply-add-shift, h(x) = (a x + b) mod 2^64 div 2^32 on
 * 32-bit keys, is strongly universal; the 64-bit feature hash is folded to 32
 * bits first.  Functions outer, features inner: the loop over features keeps
 * a and b in registers and the compiler vectorises it. */
void fp_minhash_update(const uint64_t *features, size_t n, const uint64_t *a, const uint64_t *b,
                       size_t p, uint32_t *mins) {
    enum { CHUNK = 1024 };
    uint32_t folded[CHUNK];
    for (size_t base = 0; base < n; base += CHUNK) {
        size_t m = n - base < CHUNK ? n - base : CHUNK;
        for (size_t j = 0; j < m; j++) {
            uint64_t x = features[base + j];
            folded[j] = (uint32_t)(x ^ (x >> 32));
        }
        for (size_t i = 0; i < p; i++) {
            uint64_t ai = a[i], bi = b[i];
            uint32_t lo = mins[i];
            for (size_t j = 0; j < m; j++) {
                uint32_t h = (uint32_t)((ai * folded[j] + bi) >> 32);
                lo = h < lo ? h : lo;
            }
            mins[i] = lo;
        }
    }
}
