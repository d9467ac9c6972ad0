/* The Appender object (mqs_ipc_py.c) as the put entry points in mqs_put.c see it: one
 * producer's view of the control block, and what its put needs from the client
 * (ipc/producer.py hands it over with `configure`). */
#ifndef MQS_APPENDER_H
#define MQS_APPENDER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "mqs_append.h"
#include "mqs_args.h"
#include "mqs_compress.h"
#include "mqs_futex.h"

/* A segment's mapping the put writes into (pool off). */
struct mqs_target {
    PyObject *obj; /* owned; NULL: none */
    Py_buffer view;
    int64_t index;
};

/* A client's message ids and idempotence (mqs_uniq.h). */
struct mqs_uniq_client {
    PyObject *ids; /* UniqIds, owned; NULL: no ids are made (the bare put's tests) */
    int idempotent;
    int64_t row; /* the producer's row last found in the table, -1 none */
};

/* The client's side of the put (mqs_put.c), handed over by ipc/producer.py with
 * `configure`; all references owned. */
struct mqs_client {
    PyObject *lock;           /* the client's PutLock: one put of its threads at a time */
    PyObject *lanes;          /* dict: topic -> lane (mqs_fields.c) */
    PyObject *new_lane;       /* new_lane(topic) -> lane, on a topic's first put */
    PyObject *find_row;       /* find_row(topic bytes, queue id) -> queue-table row or -1 */
    PyObject *map_segment;    /* map_segment(index) -> writable mapping (pool off) */
    PyObject *message_type;   /* engine.record.Message */
    PyObject *message_fields; /* message_fields(i, message) -> tuple | reason */
    Py_buffer stats;          /* array('q') of CLIENT_FIELDS: this client's counters */
    PyObject *result_type;    /* ipc.results.PutResult */
    PyObject *statuses;       /* tuple(PutMessageStatus) */
    PyObject *flush_reasons[3]; /* "", timed out, failed */
    PyObject *msg_id_prefix;
    PyObject *ts, *size;   /* the last results' store time and size (mqs_put.c: cached_int) */
    int64_t ts_v, size_v;
    struct mqs_target targets[2];
    struct mqs_uniq_client uniq;
    struct mqs_compress z; /* body compression (mqs_compress.c) */
    int64_t stats_off, sync_timeout_ns, busy_ns, max_body, stale_at_ns;
    uint8_t store_addr[16];
    struct mqs_host store;
    unsigned fork_gen;
    int sync, fast_fail, since_stats, configured;
    int max_delay; /* messageDelayLevel's count: the highest delay level */
};

typedef struct {
    PyObject_HEAD
    struct mqs_appender a;
    Py_buffer ctl, pool;
    int open, has_pool, busy;
    struct mqs_client c;
} Appender;

/* A sync put's wait, GIL released: 0 flushed, 1 timed out, 2 the store is read-only
 * (fsync failed), 3 the generation ended without flushing it (fenced), -1 a signal
 * handler raised. */
int mqs_wait_flushed(Appender *self, int64_t end, int64_t timeout_ns);

#endif
