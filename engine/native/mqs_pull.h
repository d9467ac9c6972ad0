/* A pull's walk over consume-queue units (issue 13): RocketMQ's getMessage rules per unit
 * (engine.reader: pre-blanks passed, an unwritten unit ends the walk, the batch full at max_count or
 * max_bytes, the tag-code filter) and the record check of each wanted unit, with the
 * record scanner's check (mqs_scan.h). The reference is engine/pull.py's pull_units_py;
 * tests/native/test_pull_diff.py compares the two message by message. Pure C: no Python
 * object is touched; the door (mqs_pull_py.c) builds the messages. */
#ifndef MQS_PULL_H
#define MQS_PULL_H

#include <stdint.h>

#include "mqs_be.h"
#include "mqs_scan.h"

#define MQS_MAX_EXT_ADDR (-2147483649LL)    /* ConsumeQueueExt addresses are <= this */

/* What mqs_pull_next stopped at. */
enum mqs_pull_step {
    MQS_PULL_END = 0,      /* every unit was taken */
    MQS_PULL_FULL = 1,     /* unit `i` is real and the batch is full: the pull ends before it */
    MQS_PULL_NEED_LOG = 2, /* unit `i` wants a record below the limit outside `log` */
    MQS_PULL_RECORD = 3,   /* unit i - 1 has a record at log[rec_pos], layout `lay` */
    MQS_PULL_UNWRITTEN = 4, /* unit `i` is not written yet: the queue ends there for now */
};

struct mqs_pull {
    const uint8_t *units; /* 20-byte consume-queue units, big endian */
    int64_t nunits;
    const uint8_t *log; /* the commit log's bytes [log_base, log_base + log_len) */
    int64_t log_len, log_base;
    int64_t limit;         /* a record must end at or below this commit-log offset */
    const int64_t *codes;  /* the tag codes kept; NULL: no filter */
    int64_t ncodes;
    int64_t max_count, max_bytes;
    /* state, carried from step to step (and call to call) */
    int64_t i;         /* the next unit */
    int64_t count;     /* messages taken so far */
    int64_t got_bytes; /* their sizes added */
    int removing;      /* a wanted unit had no record (RocketMQ's MESSAGE_WAS_REMOVING) */
    /* MQS_PULL_RECORD */
    int64_t rec_pos;
    struct mqs_layout lay;
};

/* Walk units from p->i to the next step (see mqs_pull_step). After MQS_PULL_RECORD the
 * caller decides on the record (the TAGS filter) and, when it takes it, adds 1 to
 * p->count and lay.total to p->got_bytes. */
int mqs_pull_next(struct mqs_pull *p);

#endif
