/* CRC-32C (Castagnoli), as in iSCSI and ext4: reflected polynomial 0x82F63B78,
 * initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF.  crc32c("123456789") =
 * 0xE3069283.  Uses the SSE4.2 instruction when the CPU has it. */
#ifndef NDINDEX_CRC32C_H
#define NDINDEX_CRC32C_H
#include <stddef.h>
#include <stdint.h>

void crc32c_init(void);
uint32_t crc32c(const uint8_t *data, size_t len);

#endif
