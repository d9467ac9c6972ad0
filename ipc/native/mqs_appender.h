/* The Appender object (mqs_module.c) as the put entry points in mqs_put.c see it: one
 * producer's view of the control block, and what its common-case put needs from the
 * client (ipc/client.py hands it over with `configure`). */
#ifndef MQS_APPENDER_H
#define MQS_APPENDER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "mqs_append.h"
#include "mqs_futex.h"

/* Copies and CRCs of at least this many bytes run with the GIL released. */
#define MQS_NOGIL_BYTES (64 * 1024)

/* The client's side of the common-case put (mqs_put.c); all references owned. */
struct mqs_client {
    PyObject *lock;        /* the client's PutLock: one put of its threads at a time */
    PyObject *lanes;       /* dict: topic -> lane (ipc/client.py: _Lane) */
    Py_buffer stats;       /* array('q') of CLIENT_FIELDS: this client's counters */
    PyObject *result_type; /* ipc.results.PutResult */
    PyObject *outcomes[3]; /* (status, status index, reason): flushed, timed out, failed */
    PyObject *msg_id_prefix;
    PyObject *target; /* the newest mapped segment (pool off), or NULL */
    int64_t target_index, stats_off, sync_timeout_ns, busy_ns, max_body, stale_at_ns;
    uint8_t store_addr[16];
    struct mqs_host store;
    unsigned fork_gen;
    int sync, since_stats, configured;
};

typedef struct {
    PyObject_HEAD
    struct mqs_appender a;
    Py_buffer ctl, pool;
    int open, has_pool, busy;
    struct mqs_client c;
} Appender;

/* Reserve and copy `n` parsed items into the pool or `target_obj` (the mapping of segment
 * `target_index`): MQS_OK with r, qoffs and waited filled, a code < 0, or -100 with an
 * exception set. */
int mqs_append_items(Appender *self, PyObject *target_obj, int64_t target_index,
                     struct mqs_item *items, int n, int64_t timeout_ns, int64_t *qoffs,
                     struct mqs_reservation *r, int64_t *waited);

/* A sync put's wait, GIL released: 0 flushed, 1 timed out, 2 the store is read-only
 * (fsync failed), 3 the generation ended without flushing it (fenced), -1 a signal
 * handler raised. */
int mqs_wait_flushed(Appender *self, int64_t end, int64_t timeout_ns);

/* One put call into a statistics row: v = n, nbytes, status index, ok, sync, latency,
 * lock wait (< 0: never reserved), append, flush (ns). */
void mqs_count(int64_t *st, const int64_t v[9]);

#endif
