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
        PyErr_SetString(PyExc_ValueError, "ctl is not a control block of layout version 4");
        goto fail;
    }
    self->a.ctl = c;
    self->a.seg_size = *mqs_i64(c, MQS_OFF_SEGMENT_SIZE);
    self->a.pool_n = *mqs_i64(c, MQS_OFF_POOL_BUFFERS);
    self->a.slot_count = *mqs_i64(c, MQS_OFF_SLOT_COUNT);
    self->a.qtable_off = MQS_SLOTS_OFF + self->a.slot_count * MQS_SLOT_ROW;
    self->a.backlog_max = 0; /* configure sets it */
    int64_t need = self->a.qtable_off + *mqs_i64(c, MQS_OFF_QCAP) * MQS_QROW;
    if (self->ctl.len < need || self->a.seg_size <= 0 || self->a.slot_count <= 0) {
        PyErr_SetString(PyExc_ValueError, "ctl is shorter than its geometry says");
        goto fail;
    }
    self->a.pool = NULL;
    if (pool != Py_None) {
        if (mqs_arg_wbuffer(pool, "pool", &self->pool) < 0)
            goto fail;
        if (self->a.pool_n <= 0 || self->pool.len < self->a.pool_n * self->a.seg_size) {
            PyBuffer_Release(&self->pool);
            PyErr_SetString(PyExc_ValueError, "pool is shorter than pool_buffers segments");
            goto fail;
        }
        self->a.pool = self->pool.buf;
        self->has_pool = 1;
    } else if (self->a.pool_n != 0) {
        PyErr_SetString(PyExc_ValueError, "the control block has a pool: pass it");
        goto fail;
    }
    self->open = 1;
    return 0;
fail:
    PyBuffer_Release(&self->ctl);
    return -1;
}

/* Drop the client's side and the shared buffers (close, dealloc). */
static void release(Appender *self)
{
    mqs_put_clear(self);
    if (self->open) {
        PyBuffer_Release(&self->ctl);
        if (self->has_pool)
            PyBuffer_Release(&self->pool);
    }
    self->open = self->has_pool = 0;
}

static PyObject *appender_close(Appender *self, PyObject *Py_UNUSED(a))
{
    if (self->busy) {
        PyErr_SetString(PyExc_BufferError, "the appender is in use by another thread");
        return NULL;
    }
    release(self);
    Py_RETURN_NONE;
}

static void appender_dealloc(Appender *self)
{
    release(self);
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

static PyObject *appender_configure_compression(Appender *self, PyObject *const *args,
                                                Py_ssize_t nargs)
{
    if (!self->open || !self->c.configured) {
        PyErr_SetString(PyExc_ValueError, "configure_compression() before configure()");
        return NULL;
    }
    return mqs_compress_configure(&self->c.z, args, nargs);
}

static PyMethodDef appender_methods[] = {
    {"lock", (PyCFunction)appender_lock, METH_O,
     "lock(timeout_ns) -> int: take the reservation lock (0) or a code (< 0)."},
    MQS_FASTCALL("lock_held", appender_lock_held,
         "lock_held(hold_ns, cap_ns) -> 0 | LOCK_TIMEOUT | LOCK_QUEUED: the put's wait."),
    {"unlock", (PyCFunction)appender_unlock, METH_NOARGS, "unlock(): release it."},
    MQS_FASTCALL("complete", appender_complete,
         "complete(first, n) -> 0 | FENCED: a reservation of n slots from first, all written: "
         "DONE all or nothing, then published."),
    MQS_FASTCALL("wait_flushed", appender_wait_flushed,
         "wait_flushed(end, timeout_ns) -> 0 flushed | 1 timed out | 2 flush failed | 3 the "
         "generation ended (fenced) without flushing it."),
    MQS_PUT_METHODS
    MQS_UNIQ_METHODS
    MQS_FASTCALL("configure_compression", appender_configure_compression,
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
#define ROW(name) {#name, (long long)MQS_##name},
static const struct {
    const char *name;
    long long value;
} layout[] = {
    ROW(MAGIC_VERSION) ROW(OFF_RESERVED) ROW(OFF_SEQ) ROW(OFF_PUBLISHED_SEQ) ROW(OFF_COMMITTED)
    ROW(OFF_FLUSHED) ROW(OFF_FLAGS) ROW(OFF_ALLOCATED) ROW(OFF_CS_PID) ROW(OFF_CS_SEQ)
    ROW(OFF_DISK_STATE) ROW(OFF_RESERVE_MUTEX) ROW(OFF_FLUSH_SEQ) ROW(OFF_FLUSHER_WAKE)
    ROW(OFF_FLUSHER_SLEEPS) ROW(CLIENT_FIELDS) ROW(CF_HIST) ROW(CF_PHASES) ROW(PHASE_BUCKETS)
    ROW(OFF_SYNC_REQUEST) ROW(OFF_LOCK_TIMEOUTS) ROW(OFF_OWNER_DEAD) ROW(OFF_GATHER_WANT)
    ROW(OFF_FENCE_SEQ) ROW(OFF_IDLE_WAKE) ROW(OFF_IDLE_SLEEPS) ROW(OFF_LOCK_SINCE)
    ROW(OFF_LOCK_QUEUED) ROW(OFF_ROOM_TIMEOUTS) ROW(OFF_COMMIT_DRAIN)
    ROW(FLAG_FENCED) ROW(STATE_FILLING)
    ROW(STATE_JOINED) ROW(SLOTS_OFF) ROW(SLOT_ROW) ROW(OFF_FSYNC_COUNT) ROW(OFF_FSYNC_MSGS)
    ROW(OFF_PUBLISHED_TS) ROW(OFF_COMMITTED_TS) ROW(OFF_FLUSHED_TS) ROW(OFF_FLUSHED_SEQ)
    ROW(OFF_FSYNC_NS) ROW(OFF_COMMITTED_SEQ) ROW(OFF_FSYNC_HIST) ROW(FSYNC_HIST_BUCKETS)
    ROW(FSYNC_HIST_SHIFT) ROW(OFF_GROUP_HIST) ROW(GROUP_HIST_BUCKETS) ROW(OFF_SEGMENT_SIZE)
    ROW(OFF_POOL_BUFFERS) ROW(OFF_SLOT_COUNT)
};
#undef ROW

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

/* crash_point(point: str) -> None: mqs_crashpoint_hit at a point the Python code reaches
 * (the dispatcher's index roll), by its name. */
static PyObject *crash_point(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "crash_point() argument 'point' must be str, not %.50s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    int p = mqs_crashpoint_lookup(name);
    if (p < 0) {
        PyErr_Format(PyExc_ValueError, "crash_point(): no crash point named %R", arg);
        return NULL;
    }
    mqs_crashpoint_hit((enum mqs_point)p);
    Py_RETURN_NONE;
}

static PyMethodDef ipc_methods[] = {
    {"crash_point", crash_point, METH_O,
     "crash_point(point): SIGKILL or SIGSTOP this process if MQSTORE_CRASHPOINT arms `point` "
     "and this is its nth hit (docs/crash-points.md); no-op otherwise."},
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
