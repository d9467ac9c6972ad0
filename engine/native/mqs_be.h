/* The store's integers are big-endian (Java's ByteBuffer order): the loads and stores of
 * every walk in engine/native (records, consume-queue units, index entries), each one
 * unaligned load or store and a byte swap, and a consume-queue unit read whole. */
#ifndef MQS_BE_H
#define MQS_BE_H

#include <stdint.h>
#include <string.h>

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define MQS_BSWAP16(v) __builtin_bswap16(v)
#define MQS_BSWAP32(v) __builtin_bswap32(v)
#define MQS_BSWAP64(v) __builtin_bswap64(v)
#else
#define MQS_BSWAP16(v) (v)
#define MQS_BSWAP32(v) (v)
#define MQS_BSWAP64(v) (v)
#endif

static inline int16_t mqs_rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return (int16_t)MQS_BSWAP16(v);
}

static inline uint32_t mqs_rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return MQS_BSWAP32(v);
}

static inline int64_t mqs_rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return (int64_t)MQS_BSWAP64(v);
}

static inline void mqs_wr32(uint8_t *p, uint32_t v)
{
    v = MQS_BSWAP32(v);
    memcpy(p, &v, sizeof v);
}

static inline void mqs_wr64(uint8_t *p, uint64_t v)
{
    v = MQS_BSWAP64(v);
    memcpy(p, &v, sizeof v);
}

/* A store of a field another process may be loading meanwhile (an index file's slot head
 * and header fields): one store of the whole byte-swapped value, released, so that the
 * stores before it (the entry a slot head points at) are seen first. mqs_wr32's memcpy is
 * one store at -O2 on x86-64, but nothing promises it: split, a reader could load a mix
 * of old and new bytes (a head pointing into garbage), and the compiler may move plain
 * stores after it. `p` must be aligned to the field's size (a mapping is page-aligned). */
static inline void mqs_publish32(uint8_t *p, uint32_t v)
{
    __atomic_store_n((uint32_t *)(void *)p, MQS_BSWAP32(v), __ATOMIC_RELEASE);
}

static inline void mqs_publish64(uint8_t *p, uint64_t v)
{
    __atomic_store_n((uint64_t *)(void *)p, MQS_BSWAP64(v), __ATOMIC_RELEASE);
}

/* A consume-queue unit (spec §4): commit-log offset, size, tags code. A pre-blank has
 * size MQS_PRE_BLANK_SIZE; no unit (zeros, damage) has a negative offset or size <= 0. */
#define MQS_CQ_UNIT 20
#define MQS_PRE_BLANK_SIZE 2147483647 /* Integer.MAX_VALUE */

struct mqs_unit {
    int64_t phys;
    int32_t size;
    int64_t tags;
};

/* Unit i of `units` (i * 20 bytes in). */
static inline struct mqs_unit mqs_unit_at(const uint8_t *units, int64_t i)
{
    const uint8_t *u = units + i * MQS_CQ_UNIT;
    struct mqs_unit out = {mqs_rd64(u), (int32_t)mqs_rd32(u + 8), mqs_rd64(u + 12)};
    return out;
}

#endif
