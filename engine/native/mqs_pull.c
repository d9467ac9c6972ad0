/* A pull's walk over consume-queue units: the twin of engine/pull.py's pull_units_py, whose
 * comments name the same steps. */
#include "mqs_pull.h"

static uint32_t rd32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static int64_t rd64(const uint8_t *p)
{
    return (int64_t)(((uint64_t)rd32(p) << 32) | rd32(p + 4));
}

/* Where the record of the real unit at u ends; 0 for a pre-blank or no unit. */
static int64_t real_end(const uint8_t *u)
{
    int64_t off = rd64(u);
    int32_t size = (int32_t)rd32(u + 8);
    return size == MQS_PRE_BLANK_SIZE || off < 0 || size <= 0 ? 0 : off + size;
}

/* The tag-code filter: a ConsumeQueueExt address is no tag code (the TAGS decide). */
static int code_may_match(const struct mqs_pull *p, int64_t code)
{
    if (p->codes == NULL || code <= MQS_MAX_EXT_ADDR)
        return 1;
    for (int64_t k = 0; k < p->ncodes; k++)
        if (p->codes[k] == code)
            return 1;
    return 0;
}

int mqs_pull_next(struct mqs_pull *p)
{
    for (; p->i < p->nunits; p->i++) {
        const uint8_t *u = p->units + p->i * MQS_CQ_UNIT;
        int64_t off = rd64(u);
        int32_t size = (int32_t)rd32(u + 8);
        if (size == MQS_PRE_BLANK_SIZE)
            continue; /* a pre-blank: passed */
        if (off < 0 || size <= 0 || (p->i > 0 && off < real_end(u - MQS_CQ_UNIT)))
            return MQS_PULL_UNWRITTEN; /* no unit, or one before its predecessor's end */
        if (p->count > 0 && (p->count >= p->max_count || p->got_bytes + size > p->max_bytes))
            return MQS_PULL_FULL;
        if (!code_may_match(p, rd64(u + 12)))
            continue;
        if (off >= p->limit) { /* not readable yet: no record */
            p->removing |= p->count == 0;
            continue;
        }
        if (off < p->log_base || off - p->log_base >= p->log_len)
            return MQS_PULL_NEED_LOG;
        int64_t pos = off - p->log_base;
        int64_t end = p->log_len;
        if (p->limit - p->log_base < end)
            end = p->limit - p->log_base;
        struct mqs_layout l;
        if (mqs_scan_check(p->log, pos, end, 1, &l) != MQS_CHECK_OK || l.total != size) {
            p->removing |= p->count == 0;
            continue;
        }
        if (mqs_scan_is_filler(p->log + pos, &l))
            continue;
        p->rec_pos = pos;
        p->lay = l;
        p->i++;
        return MQS_PULL_RECORD;
    }
    return MQS_PULL_END;
}
