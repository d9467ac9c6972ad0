/* A pull's walk over consume-queue units: the twin of engine/pull.py's pull_units_py, whose
 * comments name the same steps. */
#include "mqs_pull.h"

/* Where the record of the real unit at u ends; 0 for a pre-blank or no unit. */
static int64_t real_end(struct mqs_unit u)
{
    return u.size == MQS_PRE_BLANK_SIZE || u.phys < 0 || u.size <= 0 ? 0 : u.phys + u.size;
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
        struct mqs_unit u = mqs_unit_at(p->units, p->i);
        if (u.size == MQS_PRE_BLANK_SIZE)
            continue; /* a pre-blank: passed */
        if (u.phys < 0 || u.size <= 0 ||
            (p->i > 0 && u.phys < real_end(mqs_unit_at(p->units, p->i - 1))))
            return MQS_PULL_UNWRITTEN; /* no unit, or one before its predecessor's end */
        if (p->count > 0 && (p->count >= p->max_count || p->got_bytes + u.size > p->max_bytes))
            return MQS_PULL_FULL;
        if (!code_may_match(p, u.tags))
            continue;
        if (u.phys >= p->limit) { /* not readable yet: no record */
            p->removing |= p->count == 0;
            continue;
        }
        if (u.phys < p->log_base || u.phys - p->log_base >= p->log_len)
            return MQS_PULL_NEED_LOG;
        int64_t pos = u.phys - p->log_base;
        int64_t end = p->log_len;
        if (p->limit - p->log_base < end)
            end = p->limit - p->log_base;
        struct mqs_layout l;
        if (mqs_scan_check(p->log, pos, end, 1, &l) != MQS_CHECK_OK || l.total != u.size) {
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
