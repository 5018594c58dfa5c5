/* CRC-32C (Castagnoli), as in iSCSI and ext4: reflected polynomial 0x82F63B78,
 * initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF.  crc32c("123456789") =
 * 0xE3069283.  Uses the SSE4.2 instruction when the CPU has it. */
#ifndef NDINDEX_CRC32C_H
#define NDINDEX_CRC32C_H
#include <stddef.h>
#include <stdint.h>

void crc32c_init(void);
uint32_t crc32c(const uint8_t *data, size_t len);
/* Continue a CRC-32C: crc32c_extend(crc32c(a), b) == crc32c(a followed by b);
 * crc32c_extend(0, ...) == crc32c(...). */
uint32_t crc32c_extend(uint32_t crc, const uint8_t *data, size_t len);

#endif
