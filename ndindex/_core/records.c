/* Record kernels: parsing, checking and merging raw sub-blocks; group filters. */
#include "records.h"

#include <stdlib.h>
#include <string.h>

#include "ndx_features.h"

int rec_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
    size_t n = an < bn ? an : bn;
    int c = n ? memcmp(a, b, n) : 0;
    if (c) return c;
    return an < bn ? -1 : an > bn ? 1 : 0;
}

int rec_next(const uint8_t *buf, size_t n, size_t *pos, rec_view *r) {
    size_t p = *pos;
    if (p > n || n - p < REC_HEAD_BYTES) return -1;
    size_t klen = (size_t)buf[p] | ((size_t)buf[p + 1] << 8);
    uint8_t flag = buf[p + 2];
    size_t vlen = (size_t)buf[p + 3] | ((size_t)buf[p + 4] << 8) | ((size_t)buf[p + 5] << 16) |
                  ((size_t)buf[p + 6] << 24);
    p += REC_HEAD_BYTES;
    if (flag > 1 || klen > n - p || vlen > n - p - klen) return -1;
    r->key = buf + p;
    r->klen = klen;
    r->flag = flag;
    r->val = buf + p + klen;
    r->vlen = vlen;
    *pos = p + klen + vlen;
    return 0;
}

long rec_check(const uint8_t *buf, size_t n, size_t *bad_at) {
    size_t pos = 0;
    long count = 0;
    rec_view prev = {0}, r;
    while (pos < n) {
        size_t at = pos;
        if (rec_next(buf, n, &pos, &r) < 0) {
            *bad_at = at;
            return -1;
        }
        if (count && rec_cmp(prev.key, prev.klen, r.key, r.klen) >= 0) {
            *bad_at = at;
            return -2;
        }
        prev = r;
        count++;
    }
    return count;
}

int rec_buf_put(rec_buf *b, const uint8_t *key, size_t klen, uint8_t flag, const uint8_t *val,
                size_t vlen) {
    size_t need = REC_HEAD_BYTES + klen + vlen;
    if (b->cap - b->len < need) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len < need) cap *= 2;
        uint8_t *grown = realloc(b->data, cap);
        if (!grown) return -1;
        b->data = grown;
        b->cap = cap;
    }
    uint8_t *o = b->data + b->len;
    o[0] = (uint8_t)klen;
    o[1] = (uint8_t)(klen >> 8);
    o[2] = flag;
    o[3] = (uint8_t)vlen;
    o[4] = (uint8_t)(vlen >> 8);
    o[5] = (uint8_t)(vlen >> 16);
    o[6] = (uint8_t)(vlen >> 24);
    if (klen) memcpy(o + REC_HEAD_BYTES, key, klen);
    if (vlen) memcpy(o + REC_HEAD_BYTES + klen, val, vlen);
    b->len += need;
    return 0;
}

void rec_buf_free(rec_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* A merge input: its buffer, read position and current record. */
typedef struct {
    const uint8_t *buf;
    size_t n, pos;
    rec_view cur;
    int live;
} rec_cursor;

static int cursor_advance(rec_cursor *c) {
    if (c->pos >= c->n) {
        c->live = 0;
        return 0;
    }
    rec_view prev = c->cur;
    int had = c->live;
    if (rec_next(c->buf, c->n, &c->pos, &c->cur) < 0) return -1;
    if (had && rec_cmp(prev.key, prev.klen, c->cur.key, c->cur.klen) >= 0) return -1;
    c->live = 1;
    return 0;
}

long rec_merge(const uint8_t *const *in, const size_t *in_len, int k, const uint8_t *above,
               size_t above_len, int has_above, const uint8_t *upto, size_t upto_len,
               int has_upto, int drop_deletes, rec_buf *out, int *bad) {
    rec_cursor *cs = calloc(k > 0 ? (size_t)k : 1, sizeof *cs);
    if (!cs) return -2;
    long written = 0;
    for (int i = 0; i < k; i++) {
        cs[i].buf = in[i];
        cs[i].n = in_len[i];
        if (cursor_advance(&cs[i]) < 0) {
            *bad = i;
            written = -1;
            goto done;
        }
    }
    for (;;) {
        int best = -1;
        for (int i = 0; i < k; i++) {
            if (!cs[i].live) continue;
            if (best < 0 || rec_cmp(cs[i].cur.key, cs[i].cur.klen, cs[best].cur.key,
                                    cs[best].cur.klen) < 0)
                best = i;  /* ties keep the lower index: the newer input */
        }
        if (best < 0) break;
        rec_view r = cs[best].cur;
        if (has_upto && rec_cmp(r.key, r.klen, upto, upto_len) > 0) break;
        int keep = !(has_above && rec_cmp(r.key, r.klen, above, above_len) <= 0) &&
                   !(drop_deletes && r.flag == 1);
        if (keep) {
            if (rec_buf_put(out, r.key, r.klen, r.flag, r.val, r.vlen) < 0) {
                written = -2;
                goto done;
            }
            written++;
        }
        /* Every input holding this key moves past it (older ones lose). */
        for (int i = 0; i < k; i++) {
            if (cs[i].live && rec_cmp(cs[i].cur.key, cs[i].cur.klen, r.key, r.klen) == 0 &&
                cursor_advance(&cs[i]) < 0) {
                *bad = i;
                written = -1;
                goto done;
            }
        }
    }
done:
    free(cs);
    return written;
}

void rec_group(const uint8_t *key, size_t klen, int mode, const uint8_t **g, size_t *glen) {
    *g = key;
    if (mode == 1)
        *glen = klen > 8 ? klen - 8 : 0;
    else
        *glen = klen < 8 ? klen : 8;
}

uint64_t rec_group_hash(const uint8_t *g, size_t glen) { return fp_xxh64(g, glen, 0); }

/* Double hashing (Kirsch and Mitzenmacher): probe i is h1 + i h2 mod m. */
void rec_filter_add(uint8_t *filter, size_t nbytes, uint64_t h) {
    uint64_t m = (uint64_t)nbytes * 8, h1 = h & 0xFFFFFFFFu, h2 = (h >> 32) | 1;
    for (int i = 0; i < REC_FILTER_PROBES; i++) {
        uint64_t bit = (h1 + (uint64_t)i * h2) % m;
        filter[bit >> 3] |= (uint8_t)(1u << (bit & 7));
    }
}

int rec_filter_has(const uint8_t *filter, size_t nbytes, uint64_t h) {
    uint64_t m = (uint64_t)nbytes * 8, h1 = h & 0xFFFFFFFFu, h2 = (h >> 32) | 1;
    for (int i = 0; i < REC_FILTER_PROBES; i++) {
        uint64_t bit = (h1 + (uint64_t)i * h2) % m;
        if (!(filter[bit >> 3] & (1u << (bit & 7)))) return 0;
    }
    return 1;
}
