/* The V1 record encoder; one function per step of engine/record.py's `encode`. */
#include "mqs_record.h"

#include <string.h>

#include "mqs_be.h"
#include "mqs_crc32.h"

static uint8_t *be32(uint8_t *p, uint32_t v)
{
    mqs_wr32(p, v);
    return p + 4;
}

static uint8_t *be64(uint8_t *p, uint64_t v)
{
    mqs_wr64(p, v);
    return p + 8;
}

static uint8_t *host(uint8_t *p, const struct mqs_host *h)
{
    memcpy(p, h->addr, (size_t)h->addr_len);
    return be32(p + h->addr_len, (uint32_t)h->port);
}

size_t mqs_record_length(const struct mqs_message *m)
{
    return 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + ((size_t)m->born.addr_len + 4) + 8 +
           ((size_t)m->store.addr_len + 4) + 4 + 8 + 4 + m->body_len + 1 + m->topic_len + 2 +
           m->props_len;
}

uint32_t mqs_body_crc(const uint8_t *body, size_t len)
{
    if (len == 0)
        return 0;
    return mqs_crc32(0, body, len) & 0x7FFFFFFFu;
}

size_t mqs_record_write_head(uint8_t *dst, const struct mqs_message *m, int64_t queue_offset,
                             int64_t physical_offset, int64_t store_timestamp)
{
    int32_t sys_flag = m->sys_flag & ~(MQS_BORN_V6 | MQS_STORE_V6);
    if (m->born.addr_len == 16)
        sys_flag |= MQS_BORN_V6;
    if (m->store.addr_len == 16)
        sys_flag |= MQS_STORE_V6;
    uint8_t *p = dst;
    p = be32(p, (uint32_t)mqs_record_length(m));
    p = be32(p, MQS_MESSAGE_MAGIC);
    p = be32(p, m->body_crc);
    p = be32(p, (uint32_t)m->queue_id);
    p = be32(p, (uint32_t)m->flag);
    p = be64(p, (uint64_t)queue_offset);
    p = be64(p, (uint64_t)physical_offset);
    p = be32(p, (uint32_t)sys_flag);
    p = be64(p, (uint64_t)m->born_timestamp);
    p = host(p, &m->born);
    p = be64(p, (uint64_t)store_timestamp);
    p = host(p, &m->store);
    p = be32(p, (uint32_t)m->reconsume_times);
    p = be64(p, (uint64_t)m->prepared_offset);
    p = be32(p, (uint32_t)m->body_len);
    return (size_t)(p - dst);
}

void mqs_record_write_tail(uint8_t *dst, const struct mqs_message *m)
{
    dst[0] = (uint8_t)m->topic_len;
    memcpy(dst + 1, m->topic, m->topic_len);
    uint8_t *p = dst + 1 + m->topic_len;
    p[0] = (uint8_t)(m->props_len >> 8);
    p[1] = (uint8_t)m->props_len;
    if (m->props_len)
        memcpy(p + 2, m->props, m->props_len);
}

void mqs_record_write(uint8_t *dst, const struct mqs_message *m, int64_t queue_offset,
                      int64_t physical_offset, int64_t store_timestamp)
{
    size_t h = mqs_record_write_head(dst, m, queue_offset, physical_offset, store_timestamp);
    if (m->body_len)
        memcpy(dst + h, m->body, m->body_len);
    mqs_record_write_tail(dst + h + m->body_len, m);
}

void mqs_blank_write(uint8_t *dst, int32_t size)
{
    be32(be32(dst, (uint32_t)size), MQS_BLANK_MAGIC);
}
