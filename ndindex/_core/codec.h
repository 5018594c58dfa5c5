/* Huffman-delta blocks (format-spec/FORMAT.md, "Blocks").
 *
 * A block is BLOCK_BYTES bytes:
 *   0  u32 LE  crc32c of bytes 4..BLOCK_BYTES-1
 *   4  u16 LE  count of fingerprints, >= 1
 *   6  u64 LE  first fingerprint
 *  14  bitstream, MSB first: per next fingerprint, the canonical Huffman code
 *      of h, then the h bits below the leading 1-bit of its delta
 * Unused tail bits are zero.  The delta is b - a (CODING_DELTA) or b XOR a
 * (CODING_XOR, Manku et al. 3.2); both leave the h low bits of b to store.
 *
 * CODING_RESTARTS is CODING_DELTA with a restart table at the block's end
 * (FORMAT.md 5.4): its last byte is w, and the bytes before it hold
 * RESTARTS records of RESTART_POS_BITS + w bits, MSB first.  Record r says
 * where entry restart_entry(r, count) ends in the bitstream and its value
 * less first, so that a probe may start decoding there instead of at the
 * block's start: a quarter of a block at most, instead of half on average,
 * before the entries it looks for. */
#ifndef NDINDEX_CODEC_H
#define NDINDEX_CODEC_H
#include <stddef.h>
#include <stdint.h>

#define BLOCK_BYTES 1024
#define BLOCK_HEADER_BYTES 14
#define BLOCK_PAYLOAD_BITS ((BLOCK_BYTES - BLOCK_HEADER_BYTES) * 8)
#define CODE_SYMBOLS 64
#define CODE_MAX_BITS 12
/* Codewords of at most this many bits decode in the batch decoder's table
 * (4 KB a code); longer ones, rare in any table, through the checked one. */
#define CODE_FAST_BITS 10
#define FAST_IRREGULAR (1u << 31)
#define CODING_XOR 0
#define CODING_DELTA 1
#define CODING_RESTARTS 2
#define RESTARTS 3
#define RESTART_POS_BITS 13
/* The restart table's bytes, w included, for values of w bits (0..64). */
static inline unsigned restart_table_bytes(unsigned w) {
    return 1 + (RESTARTS * (RESTART_POS_BITS + w) + 7) / 8;
}
/* The bitstream's length in bits before a restart table of w-bit values. */
static inline size_t restart_stream_bits(unsigned w) {
    return BLOCK_PAYLOAD_BITS - 8 * (size_t)restart_table_bytes(w);
}
#define RESTART_TABLE_MAX_BYTES (1 + (RESTARTS * (RESTART_POS_BITS + 64) + 7) / 8)
/* The entry restart r (1..RESTARTS) of a block of count entries is at. */
static inline unsigned restart_entry(unsigned r, unsigned count) {
    return r * count / (RESTARTS + 1);
}
/* Each entry after the first costs at most CODE_MAX_BITS + 63 bits, so a
 * block holds at least this many entries (with the largest restart table);
 * sizes output buffers. */
#define BLOCK_MIN_ENTRIES                                                                          \
    (1 + (BLOCK_PAYLOAD_BITS - 8 * RESTART_TABLE_MAX_BYTES) / (CODE_MAX_BITS + 63))

enum codec_status {
    CODEC_OK = 0,
    CODEC_BAD_CHECKSUM = -1,
    CODEC_BAD_COUNT = -2,
    CODEC_OVERRUN = -3,    /* bitstream runs past the block */
    CODEC_NOT_SORTED = -4, /* a decoded value does not increase */
    CODEC_BAD_CODE = -5,   /* invalid code table */
    CODEC_BAD_PADDING = -6,
    CODEC_UNSORTED_INPUT = -7, /* encode: input not strictly increasing */
    CODEC_BAD_BLOCK_SIZE = -8,
    CODEC_OUT_FULL = -9, /* codec_probe_lanes: more matches than the lane's cap */
    CODEC_BAD_RESTART = -10, /* a restart record disagrees with the entries */
    CODEC_BAD_WIDTH = -11,   /* a packed raw block's width: above 56, or not its span's */
};

/* A compiled code: what the kernels need, built once per table. */
typedef struct {
    uint8_t coding; /* CODING_XOR or CODING_DELTA */
    uint8_t lengths[CODE_SYMBOLS];
    uint16_t codes[CODE_SYMBOLS];
    /* lut[next CODE_MAX_BITS bits] = the codeword there: its length and h */
    struct {
        uint8_t len, h;
    } lut[1 << CODE_MAX_BITS];
    /* the batch decoder's table, over the next CODE_FAST_BITS bits (codec.c) */
    uint32_t fast[1 << CODE_FAST_BITS];
} codec_code;

/* Hot kernels get a clone compiled for CPUs with POPCNT, chosen at load
 * time (GNU ifunc); elsewhere they compile once, portably. */
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define HOT_KERNEL __attribute__((target_clones("popcnt", "default")))
#else
#define HOT_KERNEL
#endif

/* The top p bits set (0 <= p <= 64): the prefix of a table's p-bit buckets. */
static inline uint64_t prefix_mask(int p) {
    return p <= 0 ? 0 : (p >= 64 ? ~0ull : ~0ull << (64 - p));
}

/* The number of 1-bits of x.  Written out rather than __builtin_popcountll:
 * GCC turns this into the popcnt instruction inside the HOT_KERNEL clones
 * that may use it, and elsewhere it is a few instructions, where the
 * builtin is a call to libgcc's __popcountdi2 (3% of a query's samples
 * when the raw-block and log scans made it). */
static inline int popcount64(uint64_t x) {
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
    return (int)((x * 0x0101010101010101ull) >> 56);
}

/* Build a canonical code from 64 code lengths.  CODEC_BAD_CODE unless every
 * length is in 1..CODE_MAX_BITS and the code is complete (Kraft sum 1). */
int codec_compile(const uint8_t *lengths, int coding, codec_code *out);

/* Encode n strictly increasing values into blocks at out (capacity
 * out_blocks blocks).  Writes each block's last value to keys and its count
 * to counts; returns the number of blocks, or a negative status. */
long codec_encode(const codec_code *c, const uint64_t *values, size_t n, uint8_t *out,
                  size_t out_blocks, uint64_t *keys);

/* Decode a block into out (capacity cap >= its count).  Returns the count or
 * a negative status.  Checks the checksum, bounds, order and padding. */
long codec_decode(const codec_code *c, const uint8_t *block, uint64_t *out, size_t cap);

/* Probe: the entries x of a block with the same top p bits as q and
 * popcount(x ^ q) <= k, in order.  Stops decoding once past q's prefix.
 * Returns the number written (at most cap) or a negative status. */
long codec_probe(const codec_code *c, const uint8_t *block, uint64_t q, int p, int k,
                 uint64_t *out, size_t cap);

/* codec_probe for a block whose checksum was already checked (verified
 * nonzero skips it; the decoder's bounds checks still run). */
long codec_probe_verified(const codec_code *c, const uint8_t *block, uint64_t q, int p, int k,
                          uint64_t *out, size_t cap, int verified);

/* Many codec_probe_verified at once: the probes of different blocks are
 * independent, and one probe's decode is a chain of dependent loads (each
 * codeword's position comes from the last one's length), so decoding
 * several side by side lets the CPU overlap the chains.  Any number of
 * lanes; each gets what codec_probe_verified would return, except that a
 * lane with more matches than its cap gets CODEC_OUT_FULL. */
typedef struct {
    const codec_code *code;
    const uint8_t *block;
    uint64_t q;
    int p, k, verified;
    uint64_t *out;
    size_t cap;
    long n; /* out: what codec_probe_verified would return, or CODEC_OUT_FULL */
} codec_lane;
void codec_probe_lanes(codec_lane *lanes, int n);

/* Count of a block without decoding (after checking its checksum). */
long codec_block_count(const uint8_t *block);

#endif
