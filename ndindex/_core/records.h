/* Records of the record spaces (FORMAT.md 7.9): raw sub-blocks, merges, filters.
 *
 * A raw sub-block is records back to back, each: u16 key length (LE), u8
 * flag (0 put, 1 delete), u32 value length (LE), key, value; keys strictly
 * increasing (memcmp order, a prefix before its extensions).  Nothing here
 * trusts a length before checking it against the buffer.
 */
#ifndef NDINDEX_RECORDS_H
#define NDINDEX_RECORDS_H
#include <stddef.h>
#include <stdint.h>

#define REC_HEAD_BYTES 7
#define REC_FILTER_PROBES 7

typedef struct {
    const uint8_t *key;
    size_t klen;
    uint8_t flag;
    const uint8_t *val;
    size_t vlen;
} rec_view;

typedef struct {
    uint8_t *data;
    size_t len, cap;
} rec_buf;

/* memcmp order, a prefix first. */
int rec_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn);
/* The record at buf[*pos..n): 0 and *pos advanced, or -1 if it does not fit or
 * its flag is not 0/1. */
int rec_next(const uint8_t *buf, size_t n, size_t *pos, rec_view *r);
/* Check a whole raw sub-block; the number of records, or -1 (malformed) / -2
 * (keys not strictly increasing), with *bad_at the offending offset. */
long rec_check(const uint8_t *buf, size_t n, size_t *bad_at);
/* Append a record; -1 if out of memory. */
int rec_buf_put(rec_buf *b, const uint8_t *key, size_t klen, uint8_t flag, const uint8_t *val,
                size_t vlen);
void rec_buf_free(rec_buf *b);

/* Merge k raw record streams, newest first (the first holding a key decides
 * it), keeping keys > above (when given) and <= upto (when given), dropping
 * deletions when drop_deletes.  Records written, or -1 (input `*bad` is
 * malformed or out of order), -2 (out of memory). */
long rec_merge(const uint8_t *const *in, const size_t *in_len, int k, const uint8_t *above,
               size_t above_len, int has_above, const uint8_t *upto, size_t upto_len,
               int has_upto, int drop_deletes, rec_buf *out, int *bad);

/* The group of a record key (what a lookup names): mode 0 its first 8 bytes
 * (the whole key if shorter), mode 1 all but its last 8 bytes. */
void rec_group(const uint8_t *key, size_t klen, int mode, const uint8_t **g, size_t *glen);
uint64_t rec_group_hash(const uint8_t *g, size_t glen);
void rec_filter_add(uint8_t *filter, size_t nbytes, uint64_t h);
int rec_filter_has(const uint8_t *filter, size_t nbytes, uint64_t h);

#endif
