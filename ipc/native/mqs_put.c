/* The put, every shape, in one C call: `put`'s arguments or a batch of dicts and
 * Messages are read and checked (mqs_fields.c), their queue rows found (a new row
 * through the client's `find_row`, under the reservation lock), space reserved
 * (mqs_append.c: a roll with its BLANK included; waits for the next file, a pool buffer
 * or slots sleep here without the GIL, up to osPageCacheBusyTimeOutMills), each record
 * encoded straight into the pool buffer or the segment's mapping, published, waited for
 * under SYNC_FLUSH, counted, and answered as a PutResult. The Python reference is
 * tests/native/put_reference.py; tests/native/test_put_message.py compares the two
 * byte for byte, status for status.
 *
 * The call answers None, with nothing done, only when the client must act first: it
 * is closed, forked or due to check its supervisor (ipc.session), another of its
 * threads puts (the client waits on its lock), or an argument has a type the C put
 * does not read (the client raises the TypeError, or passes plain types). */
#include "mqs_put.h"

#include <pthread.h>
#include <semaphore.h>
#include <string.h>
#include <time.h>

#include "mqs_args.h"
#include "mqs_be.h"
#include "mqs_fields.h"
#include "mqs_layout.h"
#include "mqs_uniq.h"

#define STATS_EVERY 256 /* puts between two copies of the row into the control block */
#define MIN_PAUSE_NS 50000
#define MAX_PAUSE_NS 2000000
#define ERR MQS_FIELDS_ERROR /* an exception is set */

static unsigned fork_gen; /* bumped in a forked child: its appenders are its parent's */

static void after_fork_in_child(void)
{
    fork_gen++;
}

/* ---- PutLock: the client's thread lock -------------------------------------------- */

typedef struct {
    PyObject_HEAD
    sem_t sem; /* 1 free, 0 held: what PyThread's lock is here, without its wrapper */
    int ready, locked;
} PutLock;

static int putlock_init(PutLock *self, PyObject *args, PyObject *kw)
{
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "PutLock() takes no arguments");
        return -1;
    }
    if (!self->ready && sem_init(&self->sem, 0, 1) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->ready = 1;
    return 0;
}

static void putlock_dealloc(PutLock *self)
{
    if (self->ready)
        sem_destroy(&self->sem);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int putlock_try(PutLock *self)
{
    if (sem_trywait(&self->sem) != 0)
        return 0;
    self->locked = 1;
    return 1;
}

static void putlock_release_held(PutLock *self)
{
    self->locked = 0;
    sem_post(&self->sem);
}

static PyObject *putlock_acquire(PutLock *self, PyObject *Py_UNUSED(a))
{
    if (!self->ready) {
        PyErr_SetString(PyExc_ValueError, "PutLock is not initialised");
        return NULL;
    }
    while (!putlock_try(self)) { /* a signal ends the wait (EINTR): its handler runs */
        int rc;
        Py_BEGIN_ALLOW_THREADS rc = sem_wait(&self->sem);
        Py_END_ALLOW_THREADS
        if (rc == 0) {
            self->locked = 1;
            break;
        }
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *putlock_release(PutLock *self, PyObject *Py_UNUSED(a))
{
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    putlock_release_held(self);
    Py_RETURN_NONE;
}

static PyObject *putlock_exit(PutLock *self, PyObject *Py_UNUSED(args))
{
    PyObject *r = putlock_release(self, NULL);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *putlock_locked(PutLock *self, PyObject *Py_UNUSED(a))
{
    return PyBool_FromLong(self->locked);
}

static PyMethodDef putlock_methods[] = {
    {"acquire", (PyCFunction)putlock_acquire, METH_NOARGS, "Wait for the lock (GIL released)."},
    {"release", (PyCFunction)putlock_release, METH_NOARGS, "Release it."},
    {"locked", (PyCFunction)putlock_locked, METH_NOARGS, "Whether a thread holds it."},
    {"__enter__", (PyCFunction)putlock_acquire, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)putlock_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PutLockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mqstore._native.PutLock",
    .tp_basicsize = sizeof(PutLock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PutLock(): a client's thread lock (threading.Lock's acquire, release and "
              "with), which the C put also takes, without a call into Python.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)putlock_init,
    .tp_dealloc = (destructor)putlock_dealloc,
    .tp_methods = putlock_methods,
};

int mqs_put_ready(void)
{
    static int registered;
    if (!registered && pthread_atfork(NULL, NULL, after_fork_in_child) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
        return -1;
    }
    registered = 1;
    if (mqs_fields_ready() < 0)
        return -1;
    return PyType_Ready(&PutLockType);
}

int mqs_put_add(PyObject *m)
{
    return PyModule_AddObjectRef(m, "PutLock", (PyObject *)&PutLockType);
}

/* ---- configuration ------------------------------------------------------------------ */

static void drop_target(struct mqs_target *t)
{
    if (t->obj) {
        PyBuffer_Release(&t->view);
        Py_CLEAR(t->obj);
    }
    t->index = -1;
}

void mqs_put_clear(Appender *self)
{
    struct mqs_client *c = &self->c;
    if (c->configured)
        PyBuffer_Release(&c->stats);
    PyObject **refs[] = {&c->lock, &c->lanes, &c->new_lane, &c->find_row, &c->map_segment,
                         &c->message_type, &c->message_fields, &c->result_type, &c->statuses,
                         &c->flush_reasons[0], &c->flush_reasons[1], &c->flush_reasons[2],
                         &c->msg_id_prefix, &c->ts, &c->size};
    for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++)
        Py_CLEAR(*refs[i]);
    drop_target(&c->targets[0]);
    drop_target(&c->targets[1]);
    mqs_uniq_clear(&c->uniq);
    mqs_compress_clear(&c->z);
    c->configured = 0;
}

PyObject *mqs_put_configure(Appender *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"lock", "lanes", "new_lane", "find_row", "map_segment",
                             "message_type", "message_fields", "stats", "stats_off",
                             "result_type", "statuses", "flush_reasons", "msg_id_prefix",
                             "sync", "sync_timeout_ns", "busy_ns", "fast_fail", "max_body",
                             "store_addr", "store_port", "max_delay_level", "backlog_bytes",
                             "backlog_grace_ns", NULL};
    PyObject *lock, *lanes, *new_lane, *find_row, *map_segment, *mtype, *mfields, *stats,
        *rtype, *statuses, *reasons, *prefix, *store_addr, *store_port;
    int64_t stats_off, sync_timeout_ns, busy_ns, max_body, backlog = 0, grace = 0;
    int sync, fast_fail, max_delay = 18;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "O!O!OOOO!OOLO!O!O!UpLLpLOO|iLL:configure", kwlist, &PutLockType, &lock,
            &PyDict_Type, &lanes, &new_lane, &find_row, &map_segment, &PyType_Type, &mtype,
            &mfields, &stats, &stats_off, &PyType_Type, &rtype, &PyTuple_Type, &statuses,
            &PyTuple_Type, &reasons, &prefix, &sync, &sync_timeout_ns, &busy_ns, &fast_fail,
            &max_body, &store_addr, &store_port, &max_delay, &backlog, &grace))
        return NULL;
    if (!self->open) {
        PyErr_SetString(PyExc_ValueError, "the appender is closed");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)rtype, &PyTuple_Type) || !PyUnicode_IS_ASCII(prefix) ||
        PyTuple_GET_SIZE(statuses) != MQS_STATUSES || PyTuple_GET_SIZE(reasons) != 2 ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(reasons, 0)) ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(reasons, 1)) || !PyCallable_Check(new_lane) ||
        !PyCallable_Check(find_row) || !PyCallable_Check(mfields) ||
        (self->has_pool ? map_segment != Py_None : !PyCallable_Check(map_segment))) {
        PyErr_SetString(PyExc_ValueError,
                        "result_type must be a tuple type, msg_id_prefix ASCII, statuses "
                        "PutMessageStatus's members, flush_reasons two str, the hooks "
                        "callables (map_segment None with a pool)");
        return NULL;
    }
    if (backlog < 0 || grace < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "backlog_bytes (0: no bound) and backlog_grace_ns must be >= 0");
        return NULL;
    }
    if (stats_off < MQS_CLIENTS_OFF || stats_off + MQS_CLIENT_FIELDS * 8 > MQS_SLOTS_OFF) {
        PyErr_SetString(PyExc_ValueError, "stats_off is not a client row of the control block");
        return NULL;
    }
    struct mqs_host store;
    if (mqs_arg_host(store_addr, store_port, "store_addr", &store) < 0)
        return NULL;
    Py_buffer view;
    if (mqs_arg_wbuffer(stats, "stats", &view) < 0)
        return NULL;
    if (view.len != MQS_CLIENT_FIELDS * 8 || ((uintptr_t)view.buf & 7)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "stats must be an array('q') of CLIENT_FIELDS");
        return NULL;
    }
    mqs_put_clear(self);
    struct mqs_client *c = &self->c;
    c->stats = view;
    c->lock = Py_NewRef(lock);
    c->lanes = Py_NewRef(lanes);
    c->new_lane = Py_NewRef(new_lane);
    c->find_row = Py_NewRef(find_row);
    c->map_segment = Py_NewRef(map_segment);
    c->message_type = Py_NewRef(mtype);
    c->message_fields = Py_NewRef(mfields);
    c->result_type = Py_NewRef(rtype);
    c->statuses = Py_NewRef(statuses);
    c->flush_reasons[0] = PyUnicode_FromString("");
    c->flush_reasons[1] = Py_NewRef(PyTuple_GET_ITEM(reasons, 0));
    c->flush_reasons[2] = Py_NewRef(PyTuple_GET_ITEM(reasons, 1));
    c->msg_id_prefix = Py_NewRef(prefix);
    memcpy(c->store_addr, store.addr, (size_t)store.addr_len);
    c->store = store;
    c->store.addr = c->store_addr;
    c->stats_off = stats_off;
    c->sync = sync;
    c->fast_fail = fast_fail;
    c->sync_timeout_ns = sync_timeout_ns;
    c->busy_ns = busy_ns;
    c->max_body = max_body;
    c->max_delay = max_delay;
    self->a.backlog_max = self->has_pool ? backlog : 0; /* pool off: nothing to commit */
    self->a.backlog_grace_ns = grace;
    self->a.backlog_since = 0;
    c->stale_at_ns = 0;
    c->since_stats = 0;
    c->fork_gen = fork_gen;
    c->targets[0].index = c->targets[1].index = -1;
    c->configured = c->flush_reasons[0] != NULL;
    if (!c->configured)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *mqs_put_checked(Appender *self, PyObject *arg)
{
    int64_t ns;
    if (mqs_arg_i64(arg, "stale_after_ns", &ns) < 0)
        return NULL;
    self->c.stale_at_ns = mqs_mono_ns() + ns;
    Py_RETURN_NONE;
}

/* ---- results ------------------------------------------------------------------------ */

/* The offset message id: the store host's hex (the client's prefix) and the offset as
 * 16 upper-case hex digits, as `f"{prefix}{offset:016X}"`. */
static PyObject *msg_id(PyObject *prefix, int64_t off)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(prefix);
    PyObject *s = PyUnicode_New(n + 16, 127);
    if (s == NULL)
        return NULL;
    uint8_t be[8];
    mqs_wr64(be, (uint64_t)off);
    memcpy(PyUnicode_1BYTE_DATA(s), PyUnicode_1BYTE_DATA(prefix), (size_t)n);
    mqs_hex(be, 8, (char *)PyUnicode_1BYTE_DATA(s) + n);
    return s;
}

/* PutResult(status, reason, msg_id, physical_offset, size, queue_id, queue_offset,
 * store_timestamp, uniq_key) as tuple.__new__ makes it; `size` and `ts` borrowed (a batch
 * shares them). `start` < 0: a put that wrote nothing (msg_id "", positions 0). `it`:
 * the message (its UNIQ_KEY), NULL none. */
static PyObject *make_result(struct mqs_client *c, int status, PyObject *reason, int64_t start,
                             PyObject *size, int64_t qid, int64_t qo, PyObject *ts,
                             const struct mqs_item *it)
{
    PyTypeObject *t = (PyTypeObject *)c->result_type;
    PyObject *r = t->tp_alloc(t, 9);
    if (r == NULL)
        return NULL;
    PyObject *v[9] = {Py_NewRef(PyTuple_GET_ITEM(c->statuses, status)),
                      Py_NewRef(reason),
                      start < 0 ? PyUnicode_FromString("") : msg_id(c->msg_id_prefix, start),
                      PyLong_FromLongLong(start < 0 ? 0 : start),
                      Py_NewRef(size),
                      PyLong_FromLongLong(qid),
                      PyLong_FromLongLong(qo),
                      Py_NewRef(ts),
                      mqs_uniq_str(it)};
    memcpy(((PyTupleObject *)r)->ob_item, v, sizeof v);
    if (!v[2] || !v[3] || !v[5] || !v[6] || !v[8]) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

/* A new reference to an int of value v, the one of the call before while v repeats (a
 * put's store time, a record's size): `*obj` holds it, `*was` its value. */
static PyObject *cached_int(PyObject **obj, int64_t *was, int64_t v)
{
    if (*obj == NULL || *was != v) {
        PyObject *o = PyLong_FromLongLong(v);
        if (o == NULL)
            return NULL;
        Py_XSETREF(*obj, o);
        *was = v;
    }
    return Py_NewRef(*obj);
}

/* log2-µs bucket: bit_length(ns / 1000), capped at `top`. */
static int64_t bucket(int64_t ns, int64_t top)
{
    uint64_t us = ns > 0 ? (uint64_t)ns / 1000 : 0;
    int64_t b = us ? 64 - __builtin_clzll(us) : 0;
    return b < top ? b : top;
}

static void count_phase(int64_t *st, int phase, int64_t ns)
{
    int64_t *p = st + MQS_CF_PHASES + phase * (MQS_PHASE_BUCKETS + 1);
    p[MQS_PHASE_BUCKETS] += ns;
    p[bucket(ns, MQS_PHASE_BUCKETS - 1)] += 1;
}

/* Count one call into the statistics row; a copy into the control block every
 * STATS_EVERY calls. v = n, nbytes, status, ok, sync, latency, lock wait (< 0: never
 * reserved), append, flush (ns). */
static void count(Appender *self, const int64_t v[9])
{
    struct mqs_client *c = &self->c;
    int64_t *st = c->stats.buf, n = v[0], status = v[2], sync = v[4], lat = v[5];
    if (v[6] >= 0) {
        count_phase(st, 0, v[6]);
        count_phase(st, 1, v[7]);
        if (sync)
            count_phase(st, 2, v[8]);
    }
    if (v[3]) { /* ok */
        st[MQS_CF_PUTS] += n;
        st[MQS_CF_BYTES] += v[1];
    } else {
        st[MQS_CF_ERRORS] += n;
    }
    st[MQS_CF_STATUS + status] += n;
    if (lat > st[MQS_CF_LAT_MAX_NS])
        st[MQS_CF_LAT_MAX_NS] = lat;
    st[MQS_CF_LAT_SUM_NS] += lat;
    if (sync)
        st[MQS_CF_SYNC_PUTS] += n;
    st[MQS_CF_HIST + bucket(lat, MQS_HIST_BUCKETS - 1)] += 1;
    if (++c->since_stats >= STATS_EVERY) {
        c->since_stats = 0;
        memcpy(self->a.ctl + c->stats_off, c->stats.buf, MQS_CLIENT_FIELDS * 8);
    }
}

/* A call that wrote nothing: one PutResult(status, reason) (a list of n for a batch).
 * Takes why->reason. */
static PyObject *refused(Appender *self, struct mqs_refusal *why, int n, int batch, int64_t t0)
{
    int64_t v[9] = {n, 0, why->status, 0, 0, mqs_mono_ns() - t0, -1, 0, 0};
    count(self, v);
    PyObject *zero = PyLong_FromLong(0), *one = NULL, *out = NULL;
    if (zero)
        one = make_result(&self->c, why->status, why->reason, -1, zero, 0, 0, zero, NULL);
    if (one && batch && (out = PyList_New(n)) != NULL)
        for (int i = 0; i < n; i++)
            PyList_SET_ITEM(out, i, Py_NewRef(one));
    if (!batch)
        out = Py_XNewRef(one);
    Py_XDECREF(one);
    Py_XDECREF(zero);
    Py_CLEAR(why->reason);
    return out;
}

/* ---- reservation -------------------------------------------------------------------- */

/* How long a put waits for the lock in all: the sync flush timeout (the time a sync put
 * is given anyway), or the busy timeout if that is longer. */
static int64_t lock_cap_ns(const Appender *self)
{
    return self->c.sync_timeout_ns > self->c.busy_ns ? self->c.sync_timeout_ns : self->c.busy_ns;
}

/* The lock, without the GIL when it has to wait: busy once one holder has held it, and
 * this put has waited, longer than osPageCacheBusyTimeOutMills (RocketMQ's rule); holders
 * that each hold it briefly are waited out, up to lock_cap_ns. `now`: the put's clock read
 * (0: none), the holder's stamp when the lock is free; `*waited_from`, if 0, becomes the
 * clock when the lock was found held. */
static int take_lock(Appender *self, int64_t now, int64_t *waited_from)
{
    int rc = mqs_lock(self->a.ctl, self->ctl.len, 0, now);
    if (rc == MQS_LOCK_TIMEOUT && self->c.busy_ns > 0) {
        if (*waited_from == 0)
            *waited_from = mqs_mono_ns();
        int64_t cap = lock_cap_ns(self);
        Py_BEGIN_ALLOW_THREADS rc = mqs_lock_held(self->a.ctl, self->ctl.len, self->c.busy_ns, cap);
        Py_END_ALLOW_THREADS
    }
    return rc;
}

/* Queue rows not known yet (a topic's or queue's first put), under the reservation lock:
 * the client's `find_row` adds them to the control block's table. */
static int find_rows(Appender *self, struct mqs_fields *m, struct mqs_item *items, int n,
                     struct mqs_refusal *why)
{
    for (int i = 0; i < n; i++) {
        if (items[i].qslot >= 0 || !items[i].takes_offset)
            continue;
        PyObject **lane = &PyList_GET_ITEM(m[i].lane, 0), *qslots = lane[MQS_LANE_QSLOTS];
        Py_ssize_t qid = items[i].msg.queue_id;
        long row = qid < PyList_GET_SIZE(qslots) ? PyLong_AsLong(PyList_GET_ITEM(qslots, qid)) : -1;
        if (row < 0) {
            PyObject *got = PyObject_CallFunction(self->c.find_row, "On", lane[MQS_LANE_TOPIC], qid);
            if (got == NULL)
                return ERR;
            row = PyLong_AsLong(got);
            if (row >= 0 && qid < PyList_GET_SIZE(qslots))
                PyList_SetItem(qslots, qid, got);
            else
                Py_DECREF(got);
            if (PyErr_Occurred())
                return ERR;
            if (row < 0)
                return mqs_fields_refuse(why, MQS_ST_SERVICE_NOT_AVAILABLE,
                              PyUnicode_FromString("the queue table of the control block is full"));
        }
        if (row > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "a queue row out of range");
            return ERR;
        }
        items[i].qslot = (int32_t)row;
    }
    return MQS_OK;
}

/* Why a put that waited at the commit backlog gave up. The bound it waited at is the fixed
 * one, or the committer's drain bytes when it has published them (mqs_backlog_full). */
static PyObject *backlog_reason(Appender *self, int after_wait, long long ms, long long cap_ms)
{
    int64_t drain = __atomic_load_n(mqs_i64(self->a.ctl, MQS_OFF_COMMIT_DRAIN), __ATOMIC_ACQUIRE);
    long long fixed = (long long)self->a.backlog_max;
    PyObject *bound =
        drain > 0 ? PyUnicode_FromFormat("commit_backlog_max_bytes, %lld bytes, or "
                                         "commit_backlog_drain_ms of the committer's recent "
                                         "pace, %lld bytes",
                                         fixed, (long long)drain)
                  : PyUnicode_FromFormat("commit_backlog_max_bytes, %lld bytes", fixed);
    if (bound == NULL)
        return NULL;
    PyObject *text =
        after_wait == 2
            ? PyUnicode_FromFormat("the commit backlog did not come under its bound (%U) within "
                                   "%lld ms (the longer of syncFlushTimeout and "
                                   "osPageCacheBusyTimeOutMills), though the committer moved",
                                   bound, cap_ms)
            : PyUnicode_FromFormat("the commit backlog stayed at its bound (%U) and the "
                                   "committer did not move for %lld ms",
                                   bound, ms);
    Py_DECREF(bound);
    return text;
}

/* Why a reservation that could not be made is refused (`rc`: mqs_reserve's or the
 * lock's code; `after_wait`: it waited the busy timeout for room, 2: a backlog wait that
 * reached lock_cap_ns while the committer moved). */
static int reserve_refusal(Appender *self, int rc, int after_wait, struct mqs_refusal *why)
{
    long long ms = (long long)(self->c.busy_ns / 1000000);
    long long cap_ms = (long long)(lock_cap_ns(self) / 1000000);
    int status = MQS_ST_SERVICE_NOT_AVAILABLE;
    PyObject *reason;
    if (rc == MQS_LOCK_BROKEN) {
        reason = PyUnicode_FromString("the reservation lock is unrecoverable (a producer died "
                                      "while repairing it); restart the store");
    } else if (rc == MQS_REFUSED) {
        int64_t flags = __atomic_load_n(mqs_i64(self->a.ctl, MQS_OFF_FLAGS), __ATOMIC_ACQUIRE);
        reason = PyUnicode_FromString(flags & MQS_FLAG_READ_ONLY
                                          ? "the store is read-only after a failed fsync"
                                          : "the store is stopping or not running; writes are "
                                            "refused");
    } else if (rc == MQS_IDEM_INFLIGHT) {
        reason = PyUnicode_FromString("a put with this UNIQ_KEY is still in progress (its "
                                      "producer has not completed it); put it again");
    } else if (rc == MQS_BAD_POSITIONS) {
        reason = PyUnicode_FromString("the control block's positions are out of range");
    } else if (rc == MQS_DISK_FULL) {
        int64_t word = __atomic_load_n(mqs_i64(self->a.ctl, MQS_OFF_DISK_STATE), __ATOMIC_ACQUIRE);
        char used[32];
        snprintf(used, sizeof used, "%.1f%%", (double)(word >> 16) / 10.0);
        reason = PyUnicode_FromFormat("the disk is full (%s used); writes resume by themselves "
                                      "once the cleaner has freed space",
                                      used);
    } else if (rc == MQS_WAIT_FILE) {
        status = MQS_ST_CREATE_MAPPED_FILE_FAILED;
        reason = PyUnicode_FromFormat("the allocator did not have the next segment file ready "
                                      "in %lld ms",
                                      ms);
    } else {
        status = MQS_ST_OS_PAGECACHE_BUSY; /* the lock or the room, not there in time */
        if (rc == MQS_LOCK_TIMEOUT)
            reason = PyUnicode_FromFormat("the reservation lock was held by one producer "
                                          "longer than osPageCacheBusyTimeOutMills (%lld ms)",
                                          ms);
        else if (rc == MQS_LOCK_QUEUED)
            reason = PyUnicode_FromFormat("the reservation lock was not free within %lld ms "
                                          "(the longer of syncFlushTimeout and "
                                          "osPageCacheBusyTimeOutMills), though no producer "
                                          "held it longer than osPageCacheBusyTimeOutMills "
                                          "(%lld ms)",
                                          cap_ms, ms);
        else if (rc == MQS_WAIT_BACKLOG)
            reason = backlog_reason(self, after_wait, ms, cap_ms);
        else if (rc == MQS_WAIT_POOL && !after_wait)
            reason = PyUnicode_FromString("no free write-pool buffer");
        else
            reason = PyUnicode_FromFormat("no free %s within %lld ms",
                                          rc == MQS_WAIT_POOL ? "write-pool buffer"
                                                              : "reservation slot",
                                          ms);
    }
    return mqs_fields_refuse(why, status, reason);
}

/* One try under the lock: MQS_OK, a code of mqs_reserve or the lock, a refusal, ERR.
 * `now`, `waited_from`: as take_lock's. */
static int reserve_once(Appender *self, struct mqs_fields *m, struct mqs_item *items, int n,
                        int64_t *qoffs, struct mqs_reservation *r, struct mqs_refusal *why,
                        int64_t now, int64_t *waited_from)
{
    int rc = take_lock(self, now, waited_from);
    if (rc != MQS_OK)
        return rc;
    rc = find_rows(self, m, items, n, why);
    if (rc == MQS_OK)
        rc = mqs_idem_check(&self->c.uniq, &self->a, self->ctl.len, items, n, qoffs);
    if (rc == MQS_OK && (rc = mqs_reserve(&self->a, items, n, qoffs, r)) == MQS_OK)
        mqs_idem_note(&self->c.uniq, &self->a, self->ctl.len, items, n, qoffs, r);
    mqs_unlock(self->a.ctl);
    return rc;
}

/* Reserve the call's records: MQS_OK, a refusal, or ERR. Waits for room (the next file,
 * a pool buffer, slots, a commit backlog under its bound) by sleeping without the GIL and
 * the lock, 50 µs doubling to 2 ms, up to the busy timeout (a backlog wait: while the
 * committer moves, up to lock_cap_ns); a wait for a pool buffer fails at once with
 * fastFailIfNoBufferInStorePool. `took`, the statistics' lock_wait phase: from the first
 * wait (the lock found held, or no room) to the end of the step; 0 when nothing was
 * waited for, without reading the clock (43-50 ns a read on this VM; the two reads per
 * put it took: bench/results/put_procs_cpu.md). `t0`: the put's own clock read, the
 * holder's stamp of a lock taken at once. */
static int reserve(Appender *self, struct mqs_fields *m, struct mqs_item *items, int n,
                   int64_t *qoffs, struct mqs_reservation *r, int64_t *took,
                   struct mqs_refusal *why, int64_t t0)
{
    int64_t deadline = 0, cap = 0, seen = -1, pause = MIN_PAUSE_NS, waited_from = 0;
    int moved = 0; /* a backlog wait's deadline was moved on by the committer */
    /* a batch's fields and CRCs may have taken a while since t0: its stamp is read anew */
    int rc = reserve_once(self, m, items, n, qoffs, r, why, n == 1 ? t0 : 0, &waited_from);
    while (rc == MQS_WAIT_FILE || rc == MQS_WAIT_POOL || rc == MQS_WAIT_SLOTS ||
           rc == MQS_WAIT_BACKLOG) {
        int64_t now = mqs_mono_ns();
        if (waited_from == 0)
            waited_from = now;
        if (rc == MQS_WAIT_BACKLOG) {
            /* Flow control, not a fault: while the committer moves, the wait goes on (its
             * busy timeout starts again), up to lock_cap_ns in all; busy once it stood
             * still for the busy timeout (stopped, stuck). */
            int64_t com = __atomic_load_n(mqs_i64(self->a.ctl, MQS_OFF_COMMITTED), __ATOMIC_ACQUIRE);
            if (com != seen) {
                seen = com;
                if (deadline != 0) {
                    deadline = now + self->c.busy_ns < cap ? now + self->c.busy_ns : cap;
                    moved = 1;
                }
            }
        }
        if (deadline == 0) {
            if (rc == MQS_WAIT_POOL && self->c.fast_fail)
                break;
            deadline = now + self->c.busy_ns;
            cap = now + lock_cap_ns(self);
            __atomic_add_fetch(mqs_i64(self->a.ctl, MQS_OFF_BUSY), 1, __ATOMIC_RELAXED);
        } else if (now >= deadline) {
            __atomic_add_fetch(mqs_i64(self->a.ctl, MQS_OFF_ROOM_TIMEOUTS), 1, __ATOMIC_RELAXED);
            *took = mqs_mono_ns() - waited_from;
            return reserve_refusal(self, rc, rc == MQS_WAIT_BACKLOG && moved && deadline == cap ? 2 : 1, why);
        }
        struct timespec ts = {0, (long)pause};
        Py_BEGIN_ALLOW_THREADS nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
        pause = pause * 2 < MAX_PAUSE_NS ? pause * 2 : MAX_PAUSE_NS;
        if (PyErr_CheckSignals() < 0)
            return ERR;
        rc = reserve_once(self, m, items, n, qoffs, r, why, 0, &waited_from);
    }
    *took = waited_from ? mqs_mono_ns() - waited_from : 0;
    if (rc == MQS_OK || rc == ERR || rc == MQS_FIELDS_REFUSED || rc == MQS_IDEM_DUP)
        return rc;
    return reserve_refusal(self, rc, 0, why);
}

/* ---- copy ------------------------------------------------------------------------------ */

/* The mapping of segment `index` (pool off), mapped by the client on first use; the two
 * newest are kept (a roll writes the BLANK into the one and the records into the next). */
static struct mqs_target *target(Appender *self, int64_t index)
{
    struct mqs_target *t = self->c.targets;
    if (t[0].obj && t[0].index == index)
        return &t[0];
    if (t[1].obj && t[1].index == index)
        return &t[1];
    struct mqs_target *old = !t[0].obj ? &t[0] : !t[1].obj ? &t[1] : t[0].index < t[1].index ? &t[0] : &t[1];
    PyObject *obj = PyObject_CallFunction(self->c.map_segment, "L", (long long)index);
    if (obj == NULL)
        return NULL;
    drop_target(old);
    if (mqs_arg_wbuffer(obj, "map_segment()", &old->view) < 0) {
        Py_DECREF(obj);
        return NULL;
    }
    old->obj = obj;
    old->index = index;
    return old;
}

/* Where the record of `size` bytes at log offset `off` goes: its pool buffer or its
 * segment's mapping. NULL with an exception set. */
static uint8_t *dest(Appender *self, int64_t off, int64_t size)
{
    int64_t index = off / self->a.seg_size, pos = off - index * self->a.seg_size;
    if (self->has_pool)
        return mqs_pool_at(&self->a, off);
    struct mqs_target *t = target(self, index);
    if (t == NULL)
        return NULL;
    if (pos + size > t->view.len) {
        PyErr_SetString(PyExc_ValueError, "the segment's mapping is shorter than the segment");
        return NULL;
    }
    return (uint8_t *)t->view.buf + pos;
}

/* Ask for the cache lines at `p`, where this client's next record likely goes (right
 * after its last one, if no other producer reserves in between), for writing, as many
 * as the last record had (at most 4 KiB, and not past the pool's mapping): the pool was
 * last written a lap ago, so its lines are in no cache, and the copy's stores missed in
 * every one; the barrier of mqs_complete's compare-and-swap then waited for them all.
 * Prefetched here, they arrive while the caller's Python runs. A prefetch never faults:
 * a line of a page not mapped yet is not fetched. (No division here: three of them, to
 * stay inside the segment's buffer, cost more than the prefetch saved.) */
static void prefetch_next(const struct mqs_appender *a, const uint8_t *p, int64_t size)
{
    int64_t left = (int64_t)(a->pool + a->pool_n * a->seg_size - p);
    if (size > left)
        size = left;
    if (size > 4096)
        size = 4096;
    for (int64_t i = 0; i < size; i += 64) {
        __builtin_prefetch(p + i, 1, 3);
        /* A loop of prefetches alone has no effect GCC must keep: with the bound above,
         * GCC 12 -O2 deleted it (no prefetch left in copy_all). An empty asm it may
         * not delete keeps the loop. */
        __asm__ volatile("");
    }
}

/* Write every record (and the BLANK), then complete the reservation, all or nothing
 * (`mqs_complete`: the joined slots DONE from the last back, the first by a
 * compare-and-swap against the filler's claim) and publish: MQS_OK, or MQS_FENCED
 * (the filler has it, or it is past the fence: nothing of it is read). */
static int copy_all(Appender *self, uint8_t *blank_dst, uint8_t *const *dst,
                    const struct mqs_item *items, int n, const int64_t *qoffs,
                    const struct mqs_reservation *r)
{
    int64_t at = r->start;
    if (blank_dst)
        mqs_blank_write(blank_dst, (int32_t)r->blank);
    for (int i = 0; i < n; i++) {
        if (self->has_pool) {
            /* Read before writing: a read fault on the (fallocated) pool maps the pages
             * around it too, writable (the kernel's fault-around), where a write fault
             * maps one 4 KiB page. */
            (void)*(volatile const uint8_t *)dst[i];
            (void)*(volatile const uint8_t *)(dst[i] + items[i].size - 1);
        }
        mqs_copy(dst[i], &items[i].msg, qoffs[i], at, r->store_ts);
        at += items[i].size;
    }
    int rc = mqs_complete(self->a.ctl, self->a.slot_count, r->seq, n + (r->blank ? 1 : 0));
    if (rc == MQS_OK) {
        mqs_idem_done(&self->c.uniq, &self->a, self->ctl.len, items, n, r);
        mqs_publish(self->a.ctl, self->a.slot_count);
    }
    if (self->has_pool)
        prefetch_next(&self->a, dst[n - 1] + items[n - 1].size, items[n - 1].size);
    return rc;
}

/* Write the reserved records (and the BLANK before them), complete them, publish.
 * MQS_OK, MQS_FENCED (the put failed: the filler has its slots), or ERR with every slot
 * abandoned to the committer's filler. */
static int copy(Appender *self, struct mqs_item *items, int n, const int64_t *qoffs,
                const struct mqs_reservation *r, int64_t bytes)
{
    uint8_t *one[1], *blank_dst = NULL;
    uint8_t **dst = n == 1 ? one : PyMem_Malloc(sizeof(uint8_t *) * (size_t)n);
    int ok = dst != NULL;
    if (!ok)
        PyErr_NoMemory();
    if (ok && r->blank)
        ok = (blank_dst = dest(self, r->start - r->blank, MQS_END_FILE_MIN_BLANK)) != NULL;
    int64_t at = r->start;
    for (int i = 0; ok && i < n; i++) {
        ok = (dst[i] = dest(self, at, items[i].size)) != NULL;
        at += items[i].size;
    }
    int rc = ERR;
    if (ok) {
        self->busy++;
        MQS_NOGIL_IF_BIG(bytes, rc = copy_all(self, blank_dst, dst, items, n, qoffs, r));
        self->busy--;
    } else {
        mqs_abandon(self->a.ctl, self->a.slot_count, r->seq, n + (r->blank ? 1 : 0));
    }
    if (dst != one)
        PyMem_Free(dst);
    return rc;
}

/* ---- the call ---------------------------------------------------------------------------- */

/* The generation's number, for a reason that names it. */
static long long generation(Appender *self)
{
    return (long long)__atomic_load_n(mqs_i64(self->a.ctl, MQS_OFF_GENERATION), __ATOMIC_RELAXED);
}

/* A put its generation's fence ended (`ipc.fence`): SERVICE_NOT_AVAILABLE naming the
 * generation, never PUT_OK. */
static PyObject *fenced(Appender *self, int n, int batch, int64_t t0)
{
    struct mqs_refusal why = {
        MQS_ST_SERVICE_NOT_AVAILABLE,
        PyUnicode_FromFormat("the store was stopped or restarted while this put was in "
                             "progress (generation %lld is over); it was not stored: put it "
                             "again",
                             generation(self))};
    return why.reason ? refused(self, &why, n, batch, t0) : NULL;
}

/* One PutResult per message (a list for a batch) with `reason` (borrowed): at the
 * reservation `r`, or (r NULL, a retry's duplicates) where the first put stored each. */
static PyObject *results(struct mqs_client *c, int status, PyObject *reason,
                         const struct mqs_item *items, int n, int batch, const int64_t *qoffs,
                         const struct mqs_reservation *r)
{
    PyObject *out = batch ? PyList_New(n) : NULL, *one = NULL;
    int64_t at = r ? r->start : 0;
    for (int i = 0; i < n && (out || !batch); i++) {
        const struct mqs_item *it = &items[i];
        PyObject *size = cached_int(&c->size, &c->size_v, r ? it->size : it->dup_size);
        PyObject *ts = cached_int(&c->ts, &c->ts_v, r ? r->store_ts : it->dup_ts);
        one = size && ts ? make_result(c, status, reason, r ? at : it->dup_off, size,
                                       it->msg.queue_id, qoffs[i], ts, it)
                         : NULL;
        Py_XDECREF(size);
        Py_XDECREF(ts);
        if (one == NULL) {
            Py_XDECREF(out);
            return NULL;
        }
        if (batch)
            PyList_SET_ITEM(out, i, one);
        at += it->size;
    }
    return batch ? out : one;
}

/* A sync put's wait until the flush covers `end`: its status and reason (a new
 * reference, into *reason), or -1 (an error). */
static int flushed(Appender *self, int64_t end, PyObject **reason)
{
    int outcome = mqs_wait_flushed(self, end, self->c.sync_timeout_ns);
    if (outcome == 3) { /* published, but its generation ended before flushing it */
        *reason = PyUnicode_FromFormat("the store was stopped or restarted (generation %lld "
                                       "is over) before the record was known flushed",
                                       generation(self));
        return *reason ? MQS_ST_FLUSH_DISK_TIMEOUT : -1;
    }
    if (outcome < 0)
        return -1;
    *reason = Py_NewRef(self->c.flush_reasons[outcome]);
    return outcome == 1 ? MQS_ST_FLUSH_DISK_TIMEOUT
           : outcome == 2 ? MQS_ST_FLUSH_DISK_FAILED
                          : MQS_ST_PUT_OK;
}

/* A call whose every message is stored already (the put's retry: mqs_idem_check): the
 * first put's positions, waited for under SYNC_FLUSH as a put is; nothing stored. */
static PyObject *duplicates(Appender *self, struct mqs_item *items, int n, int batch, int sync,
                            const int64_t *qoffs, int64_t t0, int64_t took)
{
    int64_t end = 0;
    for (int i = 0; i < n; i++)
        if (items[i].dup_off + items[i].dup_size > end)
            end = items[i].dup_off + items[i].dup_size;
    PyObject *reason = NULL, *out = NULL;
    int status = sync ? flushed(self, end, &reason) : MQS_ST_PUT_OK;
    if (status < 0)
        return NULL;
    int64_t v[9] = {n, 0, status, status == MQS_ST_PUT_OK, sync, mqs_mono_ns() - t0, took, 0, 0};
    count(self, v);
    if (status == MQS_ST_PUT_OK) {
        Py_XDECREF(reason);
        reason = PyUnicode_FromString("duplicate: a put with this UNIQ_KEY is stored already; "
                                      "this is its result");
    }
    if (reason)
        out = results(&self->c, status, reason, items, n, batch, qoffs, NULL);
    Py_XDECREF(reason);
    return out;
}

static void body_crcs(struct mqs_item *items, int n)
{
    for (int i = 0; i < n; i++)
        items[i].msg.body_crc = mqs_body_crc(items[i].msg.body, items[i].msg.body_len);
}

/* Reserve, copy, wait (sync), count and answer the checked messages. */
static PyObject *append(Appender *self, struct mqs_fields *m, struct mqs_item *items, int n,
                        int batch, int sync, int64_t t0)
{
    struct mqs_client *c = &self->c;
    struct mqs_refusal why = {0, NULL};
    struct mqs_reservation r;
    int64_t one_qo, took = 0, total = 0, bytes = 0;
    int64_t *qoffs = n == 1 ? &one_qo : PyMem_Calloc((size_t)n, sizeof *qoffs);
    if (qoffs == NULL)
        return PyErr_NoMemory();
    PyObject *out = NULL;
    for (int i = 0; i < n; i++) {
        total += items[i].size;
        bytes += (int64_t)items[i].msg.body_len;
    }
    MQS_NOGIL_IF_BIG(bytes, body_crcs(items, n));
    int rc = reserve(self, m, items, n, qoffs, &r, &took, &why, t0);
    if (rc == MQS_IDEM_DUP) {
        out = duplicates(self, items, n, batch, sync, qoffs, t0, took);
    } else if (rc == MQS_FIELDS_REFUSED) {
        out = refused(self, &why, n, batch, t0);
    } else if (rc == MQS_OK && (rc = copy(self, items, n, qoffs, &r, bytes)) == MQS_FENCED) {
        out = fenced(self, n, batch, t0);
    } else if (rc == MQS_OK) {
        int64_t t_copied = mqs_mono_ns();
        PyObject *reason = NULL;
        int status = sync ? flushed(self, r.start + total, &reason) : MQS_ST_PUT_OK;
        int64_t t_done = sync ? mqs_mono_ns() : t_copied;
        if (status >= 0) {
            int64_t v[9] = {n,    total,       status, status == MQS_ST_PUT_OK,
                            sync, t_done - t0, took,   t_copied - t0 - took,
                            t_done - t_copied};
            count(self, v);
            out = results(c, status, reason ? reason : c->flush_reasons[0], items, n, batch,
                          qoffs, &r);
            Py_XDECREF(reason);
        }
    }
    if (qoffs != &one_qo)
        PyMem_Free(qoffs);
    return out;
}

/* A put call under the client's lock: `list` a batch's messages, else `args` put's
 * fields. `redelivered`: the messages are stored ones put again with their properties
 * (send_back, the scheduler's re-put): a UNIQ_KEY of this client's own is then kept but
 * is no retry key, so the idempotence table neither answers nor notes them (else a
 * client's send_back of its own message would be answered "stored" and dropped). */
static PyObject *call(Appender *self, PyObject *list, PyObject *const *args, PyObject *delay,
                      int sync, int redelivered, int64_t t0)
{
    struct mqs_client *c = &self->c;
    int n = list ? (int)PyList_GET_SIZE(list) : 1, batch = list != NULL, i, rc = MQS_FIELDS_OK;
    struct mqs_fields one_m;
    struct mqs_item one_it;
    struct mqs_fields *m = n == 1 ? &one_m : PyMem_Calloc((size_t)n, sizeof *m);
    /* not zeroed: mqs_fields_check fills each item before anything reads it */
    struct mqs_item *items = n == 1 ? &one_it : PyMem_Malloc((size_t)n * sizeof *items);
    struct mqs_arena arena;
    struct mqs_refusal why = {0, NULL};
    PyObject *out = NULL, *zkeep = NULL; /* zkeep: compressed bodies (mqs_compress.c) */
    MQS_ARENA_INIT(arena);
    if (m == NULL || items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (m == &one_m) /* more than one: PyMem_Calloc zeroed them */
        memset(m, 0, sizeof *m);
    for (i = 0; i < n && rc == MQS_FIELDS_OK; i++)
        rc = batch ? mqs_fields_of_item(&m[i], PyList_GET_ITEM(list, i), i, c->message_type,
                                        c->message_fields)
                   : mqs_fields_of_args(&m[0], args, delay, &arena);
    if (rc == MQS_FIELDS_TYPES) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    if (rc == MQS_FIELDS_ERROR)
        goto done;
    if (batch && n > self->a.slot_count / 2) {
        rc = mqs_fields_refuse(&why, MQS_ST_MESSAGE_ILLEGAL,
                    PyUnicode_FromFormat("batch of %d messages; at most %lld per batch", n,
                                         (long long)(self->a.slot_count / 2)));
    } else {
        int64_t born = mqs_wall_ms(), total = 0;
        for (i = 0; i < n && rc == MQS_FIELDS_OK; i++) {
            rc = mqs_fields_check(&m[i], &items[i], &arena, &why, c, self->a.seg_size, born);
            if (rc == MQS_FIELDS_OK)
                rc = mqs_uniq_stamp(&c->uniq, &m[i], &items[i], &arena, &why, self->a.seg_size,
                                    born);
            if (redelivered && items[i].uniq_kind == MQS_UNIQ_GIVEN)
                items[i].uniq_kind = MQS_UNIQ_OTHER;
            if (rc == MQS_FIELDS_OK && mqs_compress_item(&c->z, &items[i], &zkeep) < 0)
                rc = MQS_FIELDS_ERROR;
            total += items[i].size;
        }
        if (rc == MQS_FIELDS_REFUSED && batch) {
            PyObject *reason = PyUnicode_FromFormat("message %d of the batch: %U", i - 1, why.reason);
            Py_DECREF(why.reason);
            rc = mqs_fields_refuse(&why, why.status, reason);
        } else if (rc == MQS_FIELDS_OK && batch && total + MQS_END_FILE_MIN_BLANK > self->a.seg_size) {
            rc = mqs_fields_refuse(&why, MQS_ST_MESSAGE_ILLEGAL,
                        PyUnicode_FromFormat("batch of %lld bytes does not fit a %lld-byte segment",
                                             (long long)total, (long long)self->a.seg_size));
        }
    }
    if (rc == MQS_FIELDS_REFUSED) {
        out = refused(self, &why, n, batch, t0);
    } else if (rc == MQS_FIELDS_OK) {
        for (i = 0; i < n; i++)
            items[i].msg.props = arena.buf + m[i].props_off;
        out = append(self, m, items, n, batch, sync, t0);
    }
done:
    for (i = 0; m && i < n; i++) {
        if (out == NULL || out == Py_None)
            mqs_fields_undo(&m[i]);
        mqs_fields_release(&m[i]);
    }
    mqs_arena_free(&arena);
    Py_XDECREF(zkeep);
    if (m != &one_m)
        PyMem_Free(m);
    if (items != &one_it)
        PyMem_Free(items);
    return out;
}

/* `call` under the client's lock (`held`: the client holds it already), or None when it
 * cannot run now (closed, forked, not a bool `wait`, due for the supervisor check, the
 * lock taken): the client acts first. */
static inline __attribute__((always_inline)) PyObject *
locked_call(Appender *self, PyObject *list, PyObject *const *args, PyObject *delay,
            PyObject *wait, int held, int redelivered, int64_t t0)
{
    struct mqs_client *c = &self->c;
    if (!self->open || !c->configured || c->fork_gen != fork_gen ||
        (wait != Py_True && wait != Py_False) ||
        (!held && (t0 >= c->stale_at_ns || !putlock_try((PutLock *)c->lock))))
        Py_RETURN_NONE;
    PyObject *out = call(self, list, args, delay, c->sync && wait == Py_True, redelivered, t0);
    if (!held)
        putlock_release_held((PutLock *)c->lock);
    return out;
}

PyObject *mqs_put_message(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 7 || nargs > 9) {
        PyErr_SetString(PyExc_TypeError, "put_message(topic, body, tags, keys, properties, "
                                         "queue_id, wait_store, held=False, delay_level=None) "
                                         "takes 7 to 9 arguments");
        return NULL;
    }
    int64_t t0 = mqs_mono_ns();
    return locked_call(self, NULL, args, nargs == 9 ? args[8] : NULL, args[6],
                       nargs >= 8 && args[7] == Py_True, 0, t0);
}

PyObject *mqs_put_batch_messages(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError,
                        "put_batch_messages(messages, wait_store, held=False, "
                        "redelivered=False) takes 2 to 4 arguments");
        return NULL;
    }
    int64_t t0 = mqs_mono_ns();
    if (!PyList_CheckExact(args[0]) || PyList_GET_SIZE(args[0]) > INT32_MAX)
        Py_RETURN_NONE;
    if (PyList_GET_SIZE(args[0]) == 0)
        return PyList_New(0);
    return locked_call(self, args[0], NULL, NULL, args[1], nargs >= 3 && args[2] == Py_True,
                       nargs == 4 && args[3] == Py_True, t0);
}
