/* The consume-queue check of recovery (issue 13): walk a run of 20-byte consume-queue
 * units and find the first that cannot be right against the commit log. The reference is
 * engine/verify.py (`verify_units_py`); tests/native/test_verify_diff.py compares the
 * two. Pure C: no Python object is touched, so the caller runs it without the GIL. */
#ifndef MQS_VERIFY_H
#define MQS_VERIFY_H

#include <stdint.h>
#include <stddef.h>

enum mqs_seg_state { MQS_SEG_UNKNOWN = 0, MQS_SEG_HELD = 1, MQS_SEG_ABSENT = 2 };

/* One commit-log segment as the check sees it: its bytes up to its read position. */
struct mqs_seg_view {
    const uint8_t *buf;
    int64_t len;
    int state; /* enum mqs_seg_state; UNKNOWN: the caller has not been asked yet */
};

enum mqs_verify_status { MQS_VERIFY_DONE = 0, MQS_VERIFY_BAD = 1, MQS_VERIFY_NEED_SEGMENT = 2 };

/* One run's inputs and state. Unit i (big endian: int64 physical offset, int32 size,
 * int64 tags code) has queue offset first_qo + i. Segment k holds commit-log offsets
 * [seg_base + k * seg_size, + seg_size). */
struct mqs_verify {
    const uint8_t *units;
    int64_t nunits, next; /* next: the unit to check next (0 at the start) */
    int64_t first_qo, queue_id;
    int64_t prev_end, log_min, log_end, headers_from;
    int64_t seg_base, seg_size, nseg;
    struct mqs_seg_view *seg;
    int64_t bad_qo; /* set on MQS_VERIFY_BAD */
    int64_t need;   /* set on MQS_VERIFY_NEED_SEGMENT: the segment the caller must fill */
};

/* Check units from v->next on, as engine.verify.verify_units_py does. Returns DONE (every
 * unit right; prev_end is past the last), BAD (bad_qo is the first wrong unit, prev_end
 * the end of the last right one) or NEED_SEGMENT: the caller sets seg[need] to HELD or
 * ABSENT and calls again, which resumes at the same unit. */
int mqs_verify_run(struct mqs_verify *v);

/* The queues of scanned records: the last record of each distinct (topic bytes, queue
 * id) among records [start, n) of the scanner's columns, as record indices in the order
 * the queues first appear (engine.verify.queue_last_ends_py). Writes at most n - start
 * indices to `last`; returns how many, or -1 when memory ran out. The topic spans lie in
 * `buf` (the caller checked). */
int64_t mqs_queue_lasts(const uint8_t *buf, const int64_t *topic_pos, const int32_t *topic_len,
                        const int32_t *queue_id, int64_t start, int64_t n, int64_t *last);

#endif
