/* CRC-32 (IEEE 802.3, zlib's polynomial 0xEDB88320, reflected), as zlib.crc32 computes
 * it: mqs_crc32(0, buf, len) == zlib.crc32(buf). RocketMQ's body CRC is this value with
 * the sign bit cleared (engine/record.py: body_crc). */
#ifndef MQS_CRC32_H
#define MQS_CRC32_H

#include <stddef.h>
#include <stdint.h>

uint32_t mqs_crc32(uint32_t crc, const uint8_t *buf, size_t len);

/* The portable slicing-by-8 path alone (tests compare it with the dispatching one). */
uint32_t mqs_crc32_slice8(uint32_t crc, const uint8_t *buf, size_t len);

#endif
