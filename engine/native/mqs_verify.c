/* The consume-queue check (mqs_verify.h); the rules are engine/verify.py's docstring. */
#include "mqs_verify.h"

#include <stdlib.h>
#include <string.h>

#include "mqs_be.h"
#include "mqs_record.h"

#define HEAD_SIZE 36 /* size, magic, crc, queue id, flag, queue offset, physical offset */

/* The record at `phy` agrees with the unit: 1 yes, 0 no, -1 its segment is UNKNOWN. */
static int header_matches(struct mqs_verify *v, int64_t phy, int32_t size, int64_t qo)
{
    if (phy < v->seg_base)
        return 0;
    int64_t k = (phy - v->seg_base) / v->seg_size;
    if (k >= v->nseg)
        return 0;
    const struct mqs_seg_view *s = &v->seg[k];
    if (s->state == MQS_SEG_UNKNOWN) {
        v->need = k;
        return -1;
    }
    int64_t pos = phy - v->seg_base - k * v->seg_size;
    if (s->state != MQS_SEG_HELD || pos + HEAD_SIZE > s->len)
        return 0;
    const uint8_t *h = s->buf + pos;
    uint32_t magic = mqs_rd32(h + 4);
    return (int32_t)mqs_rd32(h) == size &&
           (magic == MQS_MESSAGE_MAGIC || magic == MQS_MESSAGE_MAGIC_V2) &&
           (int64_t)(int32_t)mqs_rd32(h + 12) == v->queue_id && mqs_rd64(h + 20) == qo &&
           mqs_rd64(h + 28) == phy;
}

int mqs_verify_run(struct mqs_verify *v)
{
    for (; v->next < v->nunits; v->next++) {
        struct mqs_unit u = mqs_unit_at(v->units, v->next);
        if (u.size == MQS_PRE_BLANK_SIZE)
            continue;
        /* phys + size cannot overflow once phys <= log_end - size (log_end >= 0, size > 0) */
        int ok = u.phys >= 0 && u.size > 0 && u.phys >= v->prev_end &&
                 u.phys <= v->log_end - u.size;
        if (ok && u.phys < v->log_min)
            ok = v->prev_end < 0 || v->prev_end <= v->log_min; /* below the log: retention */
        if (ok && u.phys >= v->headers_from && u.phys >= v->log_min) {
            ok = header_matches(v, u.phys, u.size, v->first_qo + v->next);
            if (ok < 0)
                return MQS_VERIFY_NEED_SEGMENT;
        }
        if (!ok) {
            v->bad_qo = v->first_qo + v->next;
            return MQS_VERIFY_BAD;
        }
        v->prev_end = u.phys + u.size;
    }
    return MQS_VERIFY_DONE;
}

static uint64_t queue_hash(const uint8_t *topic, int32_t len, int32_t queue_id)
{
    uint64_t h = 1469598103934665603ull ^ (uint32_t)queue_id; /* FNV-1a */
    for (int32_t i = 0; i < len; i++)
        h = (h ^ topic[i]) * 1099511628211ull;
    return h;
}

int64_t mqs_queue_lasts(const uint8_t *buf, const int64_t *topic_pos, const int32_t *topic_len,
                        const int32_t *queue_id, int64_t start, int64_t n, int64_t *last)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)(n - start))
        cap *= 2;
    int64_t *slot = malloc(cap * sizeof(*slot)); /* an index into `last`, -1 free */
    if (slot == NULL)
        return -1;
    memset(slot, 0xff, cap * sizeof(*slot));
    int64_t nq = 0;
    for (int64_t i = start; i < n; i++) {
        const uint8_t *t = buf + topic_pos[i];
        size_t k = queue_hash(t, topic_len[i], queue_id[i]) & (cap - 1);
        for (;; k = (k + 1) & (cap - 1)) {
            if (slot[k] < 0) { /* a queue not seen before */
                slot[k] = nq;
                last[nq++] = i;
                break;
            }
            int64_t j = last[slot[k]];
            if (topic_len[j] == topic_len[i] && queue_id[j] == queue_id[i] &&
                memcmp(buf + topic_pos[j], t, (size_t)topic_len[i]) == 0) {
                last[slot[k]] = i;
                break;
            }
        }
    }
    free(slot);
    return nq;
}
