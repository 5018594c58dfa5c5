/* decode_block for the C kernel alone: libFuzzer entry point plus a
 * standalone driver for valgrind, so memory errors show without CPython's
 * noise and with the block in a malloc of exactly BLOCK_BYTES.
 *
 *   gcc -O1 -g -Indindex/_core fuzz/c/decode_block_fuzzer.c \
 *       ndindex/_core/codec.c ndindex/_core/crc32c.c -o /tmp/decode_block_fuzzer
 *   valgrind --error-exitcode=99 /tmp/decode_block_fuzzer -random 20000 fuzz/corpus/decode_block/seed-*
 *   # with clang: add -DUSE_LIBFUZZER -fsanitize=fuzzer,address,undefined
 *
 * Input: u8 flags (bit 0 recompute the CRC, bit 1 coding), 64 code lengths
 * (used when they form a complete code, else a flat 6-bit code), u64 probe
 * q, u8 p, u8 k, then one block (zero-padded).  This is not the Python
 * target's layout; Python seeds still work as inputs, just less directly. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "crc32c.h"

#define PREFIX_BYTES (1 + CODE_SYMBOLS + 8 + 2)

static void store_crc(uint8_t *block) {
    uint32_t crc = crc32c(block + 4, BLOCK_BYTES - 4);
    for (int i = 0; i < 4; i++)
        block[i] = (uint8_t)(crc >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        crc32c_init();
        ready = 1;
    }
    uint8_t prefix[PREFIX_BYTES] = {0};
    memcpy(prefix, data, size < PREFIX_BYTES ? size : PREFIX_BYTES);
    codec_code code;
    if (codec_compile(prefix + 1, (prefix[0] >> 1) & 1, &code) != CODEC_OK) {
        uint8_t flat[CODE_SYMBOLS];
        memset(flat, 6, sizeof flat);
        codec_compile(flat, (prefix[0] >> 1) & 1, &code);
    }
    uint64_t q = 0;
    for (int i = 0; i < 8; i++)
        q |= (uint64_t)prefix[1 + CODE_SYMBOLS + i] << (8 * i);
    int p = prefix[1 + CODE_SYMBOLS + 8] % 65, k = prefix[1 + CODE_SYMBOLS + 9] % 65;

    uint8_t *block = calloc(1, BLOCK_BYTES); /* exact size: valgrind sees any over-read */
    uint64_t *out = malloc(sizeof(uint64_t) * (1 + BLOCK_PAYLOAD_BITS));
    if (!block || !out)
        abort();
    if (size > PREFIX_BYTES)
        memcpy(block, data + PREFIX_BYTES,
               size - PREFIX_BYTES < BLOCK_BYTES ? size - PREFIX_BYTES : BLOCK_BYTES);
    if (prefix[0] & 1)
        store_crc(block);
    long n = codec_decode(&code, block, out, 1 + BLOCK_PAYLOAD_BITS);
    for (long i = 1; i < n; i++)
        if (out[i] <= out[i - 1])
            abort(); /* the decoder promised increasing values */
    long m = codec_probe(&code, block, q, p, k, out, 1 + BLOCK_PAYLOAD_BITS);
    if (n >= 0 && m < 0)
        abort(); /* probe refused a block that decodes */
    free(block);
    free(out);
    return 0;
}

#ifndef USE_LIBFUZZER
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_random(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Encode a random table with a flat or skewed code, then damage it. */
static void run_random(long iterations) {
    static uint8_t input[PREFIX_BYTES + BLOCK_BYTES];
    static uint64_t values[4096];
    static uint8_t blocks[64 * BLOCK_BYTES];
    static uint64_t keys[64];
    for (long it = 0; it < iterations; it++) {
        uint8_t lengths[CODE_SYMBOLS];
        memset(lengths, 6, sizeof lengths);
        if (it & 1) { /* skewed: h = 0 or 63 gets one bit, h = 32 six, the rest seven */
            memset(lengths, 7, sizeof lengths);
            lengths[(it & 2) ? 63 : 0] = 1;
            lengths[32] = 6;
        }
        codec_code code;
        int coding = (it >> 2) & 1;
        if (codec_compile(lengths, coding, &code) != CODEC_OK)
            abort();
        size_t n = 1 + next_random() % 4000;
        unsigned shift = (unsigned)(next_random() % 64);
        values[0] = next_random() >> shift;
        size_t m = 1;
        for (size_t i = 1; i < n; i++) {
            uint64_t gap = 1 + (next_random() >> shift);
            if (values[m - 1] + gap <= values[m - 1])
                break;
            values[m] = values[m - 1] + gap;
            m++;
        }
        long nb = codec_encode(&code, values, m, blocks, 64, keys);
        if (nb <= 0)
            abort();
        memset(input, 0, sizeof input);
        input[0] = (uint8_t)((next_random() % 4 != 0) | coding << 1);
        memcpy(input + 1, lengths, CODE_SYMBOLS);
        for (int i = 0; i < 10; i++)
            input[1 + CODE_SYMBOLS + i] = (uint8_t)next_random();
        uint8_t *b = input + PREFIX_BYTES;
        memcpy(b, blocks + (next_random() % (uint64_t)nb) * BLOCK_BYTES, BLOCK_BYTES);
        switch (next_random() % 5) {
        case 0: /* bit flips */
            for (int f = 0; f < 1 + (int)(next_random() % 8); f++)
                b[4 + next_random() % (BLOCK_BYTES - 4)] ^= (uint8_t)(1u << (next_random() % 8));
            break;
        case 1: { /* count */
            uint16_t c = (uint16_t)next_random();
            b[4] = (uint8_t)c;
            b[5] = (uint8_t)(c >> 8);
            break;
        }
        case 2: /* first value */
            for (int i = 6; i < 14; i++)
                b[i] = (uint8_t)next_random();
            break;
        case 3: { /* random tail */
            size_t cut = 14 + next_random() % (BLOCK_BYTES - 14);
            for (size_t i = cut; i < BLOCK_BYTES; i++)
                b[i] = (uint8_t)next_random();
            break;
        }
        default: /* all ones after the header */
            memset(b + 14, 0xFF, BLOCK_BYTES - 14);
        }
        LLVMFuzzerTestOneInput(input, sizeof input);
    }
}

int main(int argc, char **argv) {
    long files = 0, random_runs = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-random") == 0 && i + 1 < argc) {
            random_runs = atol(argv[++i]);
            continue;
        }
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            perror(argv[i]);
            return 2;
        }
        static uint8_t buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
        files++;
    }
    crc32c_init();
    run_random(random_runs);
    printf("decode_block_fuzzer: %ld files, %ld random inputs, no errors\n", files, random_runs);
    return 0;
}
#endif
