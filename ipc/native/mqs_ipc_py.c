/* ipc's C, as Python sees it (`mqstore._native`, typed in mqstore/_native.pyi): the
 * Appender (one producer's put path over a control block: the put itself is mqs_put.c,
 * its argument reading mqs_fields.c, the reservation protocol mqs_append.c over the
 * layout of mqs_layout.h, mirrored by ipc/control.py), the control block's functions
 * (mqs_control_py.c) and the layout's offsets for the tests. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>

#include "mqs_append.h"
#include "mqs_appender.h"
#include "mqs_args.h"
#include "mqs_control_py.h"
#include "mqs_crashpoint.h"
#include "mqs_futex.h"
#include "mqs_group_ack.h"
#include "mqs_ipc_py.h"
#include "mqs_layout.h"
#include "mqs_put.h"
#include "mqs_round.h"
#include "mqs_uniq.h"


/* ---- the put ------------------------------------------------------------------------ */

static int appender_ready(Appender *self)
{
    if (!self->open) {
        PyErr_SetString(PyExc_ValueError, "the appender is closed");
        return -1;
    }
    return 0;
}

static int appender_init(Appender *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ctl", "pool", "pid", NULL};
    PyObject *ctl, *pool, *pid;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:Appender", kwlist, &ctl, &pool, &pid))
        return -1;
    if (self->open) {
        PyErr_SetString(PyExc_TypeError, "Appender is initialised once");
        return -1;
    }
    if (mqs_arg_i32(pid, "pid", &self->a.pid) < 0)
        return -1;
    if (mqs_arg_wbuffer(ctl, "ctl", &self->ctl) < 0)
        return -1;
    uint8_t *c = self->ctl.buf;
    if (self->ctl.len < MQS_SLOTS_OFF || *mqs_i64(c, 0) != MQS_MAGIC_VERSION) {
        PyBuffer_Release(&self->ctl);
        PyErr_SetString(PyExc_ValueError, "ctl is not a control block of layout version 4");
        return -1;
    }
    self->a.ctl = c;
    self->a.seg_size = *mqs_i64(c, MQS_OFF_SEGMENT_SIZE);
    self->a.pool_n = *mqs_i64(c, MQS_OFF_POOL_BUFFERS);
    self->a.slot_count = *mqs_i64(c, MQS_OFF_SLOT_COUNT);
    self->a.qtable_off = MQS_SLOTS_OFF + self->a.slot_count * MQS_SLOT_ROW;
    self->a.backlog_max = 0; /* configure sets it */
    int64_t need = self->a.qtable_off + *mqs_i64(c, MQS_OFF_QCAP) * MQS_QROW;
    if (self->ctl.len < need || self->a.seg_size <= 0 || self->a.slot_count <= 0) {
        PyBuffer_Release(&self->ctl);
        PyErr_SetString(PyExc_ValueError, "ctl is shorter than its geometry says");
        return -1;
    }
    self->a.pool = NULL;
    if (pool != Py_None) {
        if (mqs_arg_wbuffer(pool, "pool", &self->pool) < 0) {
            PyBuffer_Release(&self->ctl);
            return -1;
        }
        if (self->a.pool_n <= 0 || self->pool.len < self->a.pool_n * self->a.seg_size) {
            PyBuffer_Release(&self->ctl);
            PyBuffer_Release(&self->pool);
            PyErr_SetString(PyExc_ValueError, "pool is shorter than pool_buffers segments");
            return -1;
        }
        self->a.pool = self->pool.buf;
        self->has_pool = 1;
    } else if (self->a.pool_n != 0) {
        PyBuffer_Release(&self->ctl);
        PyErr_SetString(PyExc_ValueError, "the control block has a pool: pass it");
        return -1;
    }
    self->open = 1;
    return 0;
}

static PyObject *appender_close(Appender *self, PyObject *Py_UNUSED(a))
{
    if (self->busy) {
        PyErr_SetString(PyExc_BufferError, "the appender is in use by another thread");
        return NULL;
    }
    if (self->open) {
        mqs_put_clear(self);
        PyBuffer_Release(&self->ctl);
        if (self->has_pool)
            PyBuffer_Release(&self->pool);
        self->open = self->has_pool = 0;
    }
    Py_RETURN_NONE;
}

static void appender_dealloc(Appender *self)
{
    if (self->open) {
        PyBuffer_Release(&self->ctl);
        if (self->has_pool)
            PyBuffer_Release(&self->pool);
    }
    mqs_put_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *appender_lock(Appender *self, PyObject *arg)
{
    int64_t timeout_ns;
    if (appender_ready(self) < 0 || mqs_arg_i64(arg, "timeout_ns", &timeout_ns) < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = mqs_lock(self->a.ctl, self->ctl.len, timeout_ns, 0);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* The two int arguments of method `name` (named a and b) of an open appender: 0, or -1
 * with the TypeError or ValueError set. */
static int two_i64(Appender *self, PyObject *const *args, Py_ssize_t nargs, const char *name,
                   const char *a, const char *b, int64_t *va, int64_t *vb)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(%s, %s) takes 2 arguments", name, a, b);
        return -1;
    }
    if (appender_ready(self) < 0 || mqs_arg_i64(args[0], a, va) < 0 ||
        mqs_arg_i64(args[1], b, vb) < 0)
        return -1;
    return 0;
}

/* lock_held(hold_ns, cap_ns) -> 0 | LOCK_TIMEOUT | LOCK_QUEUED | LOCK_BROKEN: the put's
 * wait for the lock (`mqs_lock_held`). */
static PyObject *appender_lock_held(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t hold_ns, cap_ns;
    if (two_i64(self, args, nargs, "lock_held", "hold_ns", "cap_ns", &hold_ns, &cap_ns) < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = mqs_lock_held(self->a.ctl, self->ctl.len, hold_ns, cap_ns);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *appender_unlock(Appender *self, PyObject *Py_UNUSED(a))
{
    if (appender_ready(self) < 0)
        return NULL;
    mqs_unlock(self->a.ctl);
    Py_RETURN_NONE;
}

/* complete(first, n) -> 0 | FENCED: the reservation of `n` slots from `first`, every
 * record written, completed all or nothing and published (the put's own step,
 * `mqs_complete`, for the tests of completion against the filler's claim). */
static PyObject *appender_complete(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t first, n;
    if (two_i64(self, args, nargs, "complete", "first", "n", &first, &n) < 0)
        return NULL;
    if (first < 0 || n < 1 || n > self->a.slot_count) {
        PyErr_SetString(PyExc_ValueError, "first must be >= 0 and n 1 to slot_count");
        return NULL;
    }
    int rc = mqs_complete(self->a.ctl, self->a.slot_count, first, n);
    if (rc == MQS_OK)
        mqs_publish(self->a.ctl, self->a.slot_count);
    return PyLong_FromLong(rc);
}

#define WAIT_TICK_NS (20 * 1000 * 1000)

int mqs_wait_flushed(Appender *self, int64_t end, int64_t timeout_ns)
{
    int64_t deadline = mqs_mono_ns() + timeout_ns;
    uint8_t *ctl = self->a.ctl;
    int out = -1;
    self->busy++;
    for (;;) {
        int64_t left = deadline - mqs_mono_ns();
        int64_t tick = left < WAIT_TICK_NS ? left : WAIT_TICK_NS;
        int rc;
        if (tick <= 0)
            tick = 1;
        Py_BEGIN_ALLOW_THREADS rc = mqs_wait_flushed_tick(ctl, end, tick);
        Py_END_ALLOW_THREADS
        if (rc == MQS_FLUSHED || rc == MQS_FLUSH_FAILED || rc == MQS_WAIT_FENCED) {
            out = rc == MQS_FLUSHED ? 0 : rc == MQS_FLUSH_FAILED ? 2 : 3;
            break;
        }
        if (PyErr_CheckSignals() < 0)
            break;
        if (mqs_mono_ns() >= deadline) {
            out = 1;
            break;
        }
    }
    self->busy--;
    return out;
}

static PyObject *appender_wait_flushed(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t end, timeout_ns;
    if (two_i64(self, args, nargs, "wait_flushed", "end", "timeout_ns", &end, &timeout_ns) < 0)
        return NULL;
    int rc = mqs_wait_flushed(self, end, timeout_ns);
    return rc < 0 ? NULL : PyLong_FromLong(rc);
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

void mqs_count(int64_t *st, const int64_t v[9])
{
    int64_t n = v[0], nbytes = v[1], status = v[2], ok = v[3], sync = v[4], lat = v[5];
    if (v[6] >= 0) {
        count_phase(st, 0, v[6]);
        count_phase(st, 1, v[7]);
        if (sync)
            count_phase(st, 2, v[8]);
    }
    if (ok) {
        st[MQS_CF_PUTS] += n;
        st[MQS_CF_BYTES] += nbytes;
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
}

static PyObject *appender_configure_compression(Appender *self, PyObject *const *args,
                                                Py_ssize_t nargs)
{
    if (!self->open || !self->c.configured) {
        PyErr_SetString(PyExc_ValueError, "configure_compression() before configure()");
        return NULL;
    }
    return mqs_compress_configure(&self->c.z, args, nargs);
}

/* A METH_FASTCALL entry of a method table. */
#define FAST(name, fn, doc) {name, (PyCFunction)(void (*)(void))(fn), METH_FASTCALL, doc}

static PyMethodDef appender_methods[] = {
    {"lock", (PyCFunction)appender_lock, METH_O,
     "lock(timeout_ns) -> int: take the reservation lock (0) or a code (< 0)."},
    FAST("lock_held", appender_lock_held,
         "lock_held(hold_ns, cap_ns) -> 0 | LOCK_TIMEOUT | LOCK_QUEUED: the put's wait."),
    {"unlock", (PyCFunction)appender_unlock, METH_NOARGS, "unlock(): release it."},
    FAST("complete", appender_complete,
         "complete(first, n) -> 0 | FENCED: a reservation of n slots from first, all written: "
         "DONE all or nothing, then published."),
    FAST("wait_flushed", appender_wait_flushed,
         "wait_flushed(end, timeout_ns) -> 0 flushed | 1 timed out | 2 flush failed | 3 the "
         "generation ended (fenced) without flushing it."),
    MQS_PUT_METHODS
    MQS_UNIQ_METHODS
    FAST("configure_compression", appender_configure_compression,
         "configure_compression(fn, over, flag): compress each body of at least `over` bytes "
         "with fn (None: off) and mark its sysFlag with `flag` (mqs_compress.c)."),
    {"close", (PyCFunction)appender_close, METH_NOARGS, "Release the shared buffers."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mqstore._native.Appender",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Appender(ctl, pool, pid): one producer's put path over a control block.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)appender_init,
    .tp_dealloc = (destructor)appender_dealloc,
    .tp_methods = appender_methods,
};

/* Every offset and size C uses, by ipc/control.py's name (tests/runtime/test_control.py
 * compares them). */
static const struct {
    const char *name;
    long long value;
} layout[] = {
    {"MAGIC_VERSION", (long long)MQS_MAGIC_VERSION},
    {"OFF_RESERVED", (long long)MQS_OFF_RESERVED},
    {"OFF_SEQ", (long long)MQS_OFF_SEQ},
    {"OFF_PUBLISHED_SEQ", (long long)MQS_OFF_PUBLISHED_SEQ},
    {"OFF_COMMITTED", (long long)MQS_OFF_COMMITTED},
    {"OFF_FLUSHED", (long long)MQS_OFF_FLUSHED},
    {"OFF_FLAGS", (long long)MQS_OFF_FLAGS},
    {"OFF_ALLOCATED", (long long)MQS_OFF_ALLOCATED},
    {"OFF_CS_PID", (long long)MQS_OFF_CS_PID},
    {"OFF_CS_SEQ", (long long)MQS_OFF_CS_SEQ},
    {"OFF_DISK_STATE", (long long)MQS_OFF_DISK_STATE},
    {"OFF_RESERVE_MUTEX", (long long)MQS_OFF_RESERVE_MUTEX},
    {"OFF_FLUSH_SEQ", (long long)MQS_OFF_FLUSH_SEQ},
    {"OFF_FLUSHER_WAKE", (long long)MQS_OFF_FLUSHER_WAKE},
    {"OFF_FLUSHER_SLEEPS", (long long)MQS_OFF_FLUSHER_SLEEPS},
    {"CLIENT_FIELDS", (long long)MQS_CLIENT_FIELDS},
    {"CF_HIST", (long long)MQS_CF_HIST},
    {"CF_PHASES", (long long)MQS_CF_PHASES},
    {"PHASE_BUCKETS", (long long)MQS_PHASE_BUCKETS},
    {"OFF_SYNC_REQUEST", (long long)MQS_OFF_SYNC_REQUEST},
    {"OFF_LOCK_TIMEOUTS", (long long)MQS_OFF_LOCK_TIMEOUTS},
    {"OFF_OWNER_DEAD", (long long)MQS_OFF_OWNER_DEAD},
    {"OFF_GATHER_WANT", (long long)MQS_OFF_GATHER_WANT},
    {"OFF_FENCE_SEQ", (long long)MQS_OFF_FENCE_SEQ},
    {"OFF_IDLE_WAKE", (long long)MQS_OFF_IDLE_WAKE},
    {"OFF_IDLE_SLEEPS", (long long)MQS_OFF_IDLE_SLEEPS},
    {"OFF_LOCK_SINCE", (long long)MQS_OFF_LOCK_SINCE},
    {"OFF_LOCK_QUEUED", (long long)MQS_OFF_LOCK_QUEUED},
    {"OFF_ROOM_TIMEOUTS", (long long)MQS_OFF_ROOM_TIMEOUTS},
    {"OFF_COMMIT_DRAIN", (long long)MQS_OFF_COMMIT_DRAIN},
    {"FLAG_FENCED", (long long)MQS_FLAG_FENCED},
    {"STATE_FILLING", (long long)MQS_STATE_FILLING},
    {"STATE_JOINED", (long long)MQS_STATE_JOINED},
    {"SLOTS_OFF", (long long)MQS_SLOTS_OFF},
    {"SLOT_ROW", (long long)MQS_SLOT_ROW},
    {"OFF_FSYNC_COUNT", (long long)MQS_OFF_FSYNC_COUNT},
    {"OFF_FSYNC_MSGS", (long long)MQS_OFF_FSYNC_MSGS},
    {"OFF_PUBLISHED_TS", (long long)MQS_OFF_PUBLISHED_TS},
    {"OFF_COMMITTED_TS", (long long)MQS_OFF_COMMITTED_TS},
    {"OFF_FLUSHED_TS", (long long)MQS_OFF_FLUSHED_TS},
    {"OFF_FLUSHED_SEQ", (long long)MQS_OFF_FLUSHED_SEQ},
    {"OFF_FSYNC_NS", (long long)MQS_OFF_FSYNC_NS},
    {"OFF_COMMITTED_SEQ", (long long)MQS_OFF_COMMITTED_SEQ},
    {"OFF_FSYNC_HIST", (long long)MQS_OFF_FSYNC_HIST},
    {"FSYNC_HIST_BUCKETS", (long long)MQS_FSYNC_HIST_BUCKETS},
    {"FSYNC_HIST_SHIFT", (long long)MQS_FSYNC_HIST_SHIFT},
    {"OFF_GROUP_HIST", (long long)MQS_OFF_GROUP_HIST},
    {"GROUP_HIST_BUCKETS", (long long)MQS_GROUP_HIST_BUCKETS},
    {"OFF_SEGMENT_SIZE", (long long)MQS_OFF_SEGMENT_SIZE},
    {"OFF_POOL_BUFFERS", (long long)MQS_OFF_POOL_BUFFERS},
    {"OFF_SLOT_COUNT", (long long)MQS_OFF_SLOT_COUNT},
};

static int add_layout(PyObject *m)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return -1;
    for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++) {
        PyObject *v = PyLong_FromLongLong(layout[i].value);
        if (v == NULL || PyDict_SetItemString(d, layout[i].name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return -1;
        }
        Py_DECREF(v);
    }
    int rc = PyModule_AddObjectRef(m, "LAYOUT", d);
    Py_DECREF(d);
    return rc;
}

/* backlog_full(since, backlog, bound, grace_ns, drain, now) -> (wait, since):
 * mqs_backlog_full for the differential test against its Python twin. */
static PyObject *backlog_full(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    static const char *names[] = {"since", "backlog", "bound", "grace_ns", "drain", "now"};
    int64_t v[6];
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "backlog_full(since, backlog, bound, grace_ns, drain, now) takes 6 "
                        "arguments");
        return NULL;
    }
    for (int i = 0; i < 6; i++)
        if (mqs_arg_i64(args[i], names[i], &v[i]) < 0)
            return NULL;
    int wait = mqs_backlog_full(&v[0], v[1], v[2], v[3], v[4], v[5]);
    return Py_BuildValue("(OL)", wait ? Py_True : Py_False, (long long)v[0]);
}

static PyMethodDef ipc_methods[] = {
    {"backlog_full", (PyCFunction)(void (*)(void))backlog_full, METH_FASTCALL,
     "backlog_full(since, backlog, bound, grace_ns, drain, now) -> (wait, since): the put's "
     "commit "
     "backlog rule (mqs_append.h: mqs_backlog_full), for tests."},
    MQS_CONTROL_METHODS
    MQS_GROUP_ACK_METHODS
    {NULL, NULL, 0, NULL},
};

int mqs_ipc_add(PyObject *m)
{
    char err[256];
    if (mqs_crashpoint_init(err, sizeof err) < 0) {
        PyErr_SetString(PyExc_ValueError, err);
        return -1;
    }
    if (PyType_Ready(&AppenderType) < 0 || mqs_put_ready() < 0 ||
        PyModule_AddFunctions(m, ipc_methods) < 0 ||
        PyModule_AddObjectRef(m, "Appender", (PyObject *)&AppenderType) < 0 || add_layout(m) < 0 ||
        mqs_put_add(m) < 0 || mqs_uniq_add(m) < 0 || PyModule_AddIntConstant(m, "LOCK_TIMEOUT", MQS_LOCK_TIMEOUT) < 0 ||
        PyModule_AddIntConstant(m, "LOCK_QUEUED", MQS_LOCK_QUEUED) < 0 ||
        PyModule_AddIntConstant(m, "LOCK_BROKEN", MQS_LOCK_BROKEN) < 0 ||
        PyModule_AddIntConstant(m, "FENCED", MQS_FENCED) < 0)
        return -1;
    return 0;
}
