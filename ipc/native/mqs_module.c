/* mqstore._native: the per-message hot path of a put, in C (issue 12).
 *
 * This file is the Python door: argument checks (the parameter's name in every error)
 * and the GIL. The work is in mqs_crc32.c (CRC), mqs_record.c (the V1 record) and, for
 * the put itself, mqs_append.c (the reservation protocol over the control block whose
 * layout is mqs_layout.h, mirrored by ipc/control.py). The typed stub is
 * mqstore/_native.pyi. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>

#include "mqs_append.h"
#include "mqs_appender.h"
#include "mqs_args.h"
#include "mqs_control_py.h"
#include "mqs_crashpoint.h"
#include "mqs_cq.h"
#include "mqs_crc32.h"
#include "mqs_futex.h"
#include "mqs_index.h"
#include "mqs_layout.h"
#include "mqs_pull_py.h"
#include "mqs_put.h"
#include "mqs_record.h"
#include "mqs_round.h"
#include "mqs_scan_py.h"
#include "mqs_verify_py.h"


static PyObject *py_crc32(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0) takes 1 or 2 arguments");
        return NULL;
    }
    int64_t start = 0;
    if (nargs == 2 && mqs_arg_i64(args[1], "value", &start) < 0)
        return NULL;
    Py_buffer v;
    if (mqs_arg_buffer(args[0], "data", &v) < 0)
        return NULL;
    uint32_t c;
    if (v.len >= MQS_NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS c = mqs_crc32((uint32_t)start, v.buf, (size_t)v.len);
        Py_END_ALLOW_THREADS
    } else {
        c = mqs_crc32((uint32_t)start, v.buf, (size_t)v.len);
    }
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_crc32_slice8(PyObject *Py_UNUSED(m), PyObject *arg)
{
    Py_buffer v;
    if (mqs_arg_buffer(arg, "data", &v) < 0)
        return NULL;
    uint32_t c = mqs_crc32_slice8(0, v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_crc32_uses_pclmul(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a))
{
    return PyBool_FromLong(mqs_crc32_uses_pclmul());
}

/* Fill `m` from encode()'s keyword arguments. The body view is left for the caller to
 * release. */
static const char *encode_kw[] = {
    "topic", "body", "properties", "queue_id", "flag", "sys_flag", "born_timestamp",
    "born_addr", "born_port", "store_addr", "store_port", "reconsume_times",
    "prepared_offset", "queue_offset", "physical_offset", "store_timestamp", "keys", NULL,
};

static PyObject *py_encode(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw)
{
    PyObject *o[17] = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|$OOOOOOOOOOOOOO:encode", (char **)encode_kw,
                                     &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                                     &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14],
                                     &o[15], &o[16]))
        return NULL;
    static const uint8_t loopback[4] = {127, 0, 0, 1};
    struct mqs_message msg = {0};
    int64_t qo = 0, po = 0, sts = 0;
    msg.born.addr = msg.store.addr = loopback;
    msg.born.addr_len = msg.store.addr_len = 4;
    msg.store.port = 10911;
    if (mqs_arg_bytes(o[0], "topic", &msg.topic, &msg.topic_len) < 0 ||
        mqs_arg_bytes(o[2], "properties", &msg.props, &msg.props_len) < 0 ||
        (o[16] && mqs_arg_bytes(o[16], "keys", &msg.keys, &msg.keys_len) < 0))
        return NULL;
    if (msg.topic_len < 1 || msg.topic_len > 127) {
        PyErr_Format(PyExc_ValueError, "topic must be 1 to 127 bytes, not %zu", msg.topic_len);
        return NULL;
    }
    if (mqs_props_len(&msg) > 32767) {
        PyErr_Format(PyExc_ValueError, "properties must be at most 32767 bytes, not %zu",
                     mqs_props_len(&msg));
        return NULL;
    }
    if ((o[3] && mqs_arg_i32(o[3], "queue_id", &msg.queue_id) < 0) ||
        (o[4] && mqs_arg_i32(o[4], "flag", &msg.flag) < 0) ||
        (o[5] && mqs_arg_i32(o[5], "sys_flag", &msg.sys_flag) < 0) ||
        (o[6] && mqs_arg_i64(o[6], "born_timestamp", &msg.born_timestamp) < 0) ||
        (o[11] && mqs_arg_i32(o[11], "reconsume_times", &msg.reconsume_times) < 0) ||
        (o[12] && mqs_arg_i64(o[12], "prepared_offset", &msg.prepared_offset) < 0) ||
        (o[13] && mqs_arg_i64(o[13], "queue_offset", &qo) < 0) ||
        (o[14] && mqs_arg_i64(o[14], "physical_offset", &po) < 0) ||
        (o[15] && mqs_arg_i64(o[15], "store_timestamp", &sts) < 0))
        return NULL;
    if ((o[7] || o[8]) &&
        (!o[7] || !o[8] || mqs_arg_host(o[7], o[8], "born_addr", &msg.born) < 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "born_addr and born_port go together");
        return NULL;
    }
    if ((o[9] || o[10]) &&
        (!o[9] || !o[10] || mqs_arg_host(o[9], o[10], "store_addr", &msg.store) < 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "store_addr and store_port go together");
        return NULL;
    }
    Py_buffer body;
    if (mqs_arg_buffer(o[1], "body", &body) < 0)
        return NULL;
    msg.body = body.buf;
    msg.body_len = (size_t)body.len;
    msg.body_crc = mqs_body_crc(msg.body, msg.body_len);
    size_t total = mqs_record_length(&msg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out != NULL)
        mqs_record_write((uint8_t *)PyBytes_AS_STRING(out), &msg, qo, po, sts);
    PyBuffer_Release(&body);
    return out;
}


/* ---- the put ------------------------------------------------------------------------ */

/* A prepared message, as ipc/client.py's _prepare builds it:
 * (size, queue_id, flag, sys_flag, born_ts, body, topic, properties, takes_offset,
 *  reconsume_times, prepared_offset, born_addr, born_port, store_addr, store_port) */
#define PREP_FIELDS 15

static int parse_prep(PyObject *t, struct mqs_item *it)
{
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != PREP_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "prep must be a tuple of 15 fields (ipc.client._Prep)");
        return -1;
    }
    PyObject **f = &PyTuple_GET_ITEM(t, 0);
    struct mqs_message *m = &it->msg;
    int64_t size;
    if (mqs_arg_i64(f[0], "size", &size) < 0 || mqs_arg_i32(f[1], "queue_id", &m->queue_id) < 0 ||
        mqs_arg_i32(f[2], "flag", &m->flag) < 0 || mqs_arg_i32(f[3], "sys_flag", &m->sys_flag) < 0 ||
        mqs_arg_i64(f[4], "born_timestamp", &m->born_timestamp) < 0 ||
        mqs_arg_bytes(f[5], "body", &m->body, &m->body_len) < 0 ||
        mqs_arg_bytes(f[6], "topic", &m->topic, &m->topic_len) < 0 ||
        mqs_arg_bytes(f[7], "properties", &m->props, &m->props_len) < 0 ||
        mqs_arg_i32(f[9], "reconsume_times", &m->reconsume_times) < 0 ||
        mqs_arg_i64(f[10], "prepared_offset", &m->prepared_offset) < 0 ||
        mqs_arg_host(f[11], f[12], "born_addr", &m->born) < 0 ||
        mqs_arg_host(f[13], f[14], "store_addr", &m->store) < 0)
        return -1;
    if (m->topic_len < 1 || m->topic_len > 127 || m->props_len > 32767) {
        PyErr_SetString(PyExc_ValueError, "topic or properties out of range (validate first)");
        return -1;
    }
    m->keys = NULL;
    m->keys_len = 0;
    it->takes_offset = PyObject_IsTrue(f[8]);
    it->size = (int64_t)mqs_record_length(m);
    if (it->size != size) {
        PyErr_Format(PyExc_ValueError, "prep says %lld bytes, the record is %lld",
                     (long long)size, (long long)it->size);
        return -1;
    }
    return 0;
}

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

/* The lock, without the GIL when it has to wait (`waited`: how long; 0 when free). */
static int take_lock(Appender *self, int64_t timeout_ns, int64_t *waited)
{
    int rc = mqs_lock(self->a.ctl, self->ctl.len, 0);
    *waited = 0;
    if (rc == MQS_LOCK_TIMEOUT && timeout_ns > 0) {
        int64_t t0 = mqs_mono_ns();
        Py_BEGIN_ALLOW_THREADS rc = mqs_lock(self->a.ctl, self->ctl.len, timeout_ns);
        Py_END_ALLOW_THREADS
        *waited = mqs_mono_ns() - t0;
    }
    return rc;
}

/* Where a record at physical offset `off` is written: the pool buffer, or the caller's
 * mapping of segment `off / seg_size` (checked to hold `size` bytes there). */
static uint8_t *dest(Appender *self, Py_buffer *target, int64_t off, int64_t size)
{
    if (self->has_pool)
        return mqs_pool_at(&self->a, off);
    int64_t pos = off % self->a.seg_size;
    if (target->buf == NULL || pos + size > target->len)
        return NULL;
    return (uint8_t *)target->buf + pos;
}

/* Copy every record, then complete the reservation (all or nothing) and publish:
 * MQS_OK, or MQS_FENCED (nothing of it is read). */
static int copy_all(Appender *self, uint8_t *const *dst, const struct mqs_item *items, int n,
                    const int64_t *qoffs, const struct mqs_reservation *r)
{
    int64_t at = r->start;
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
    int rc = mqs_complete(self->a.ctl, self->a.slot_count, r->seq, n);
    if (rc == MQS_OK)
        mqs_publish(self->a.ctl, self->a.slot_count);
    return rc;
}

int mqs_append_items(Appender *self, PyObject *target_obj, int64_t target_index,
                     struct mqs_item *items, int n, int64_t timeout_ns, int64_t *qoffs,
                     struct mqs_reservation *r, int64_t *waited)
{
    Py_buffer target = {0};
    if (!self->has_pool && target_obj != Py_None &&
        mqs_arg_wbuffer(target_obj, "target", &target) < 0)
        return -100;
    int64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        bytes += (int64_t)items[i].msg.body_len;
        items[i].msg.body_crc = 0;
    }
    if (bytes >= MQS_NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS for (int i = 0; i < n; i++) items[i].msg.body_crc =
            mqs_body_crc(items[i].msg.body, items[i].msg.body_len);
        Py_END_ALLOW_THREADS
    } else {
        for (int i = 0; i < n; i++)
            items[i].msg.body_crc = mqs_body_crc(items[i].msg.body, items[i].msg.body_len);
    }
    int rc = take_lock(self, timeout_ns, waited);
    if (rc != MQS_OK) {
        if (target.obj)
            PyBuffer_Release(&target);
        return rc;
    }
    if (!self->has_pool && target.buf == NULL)
        target_index = -2; /* no mapping yet: the general path maps it */
    rc = mqs_reserve(&self->a, items, n, target_index, target.len, qoffs, r);
    mqs_unlock(self->a.ctl);
    if (rc != MQS_OK) {
        if (target.obj)
            PyBuffer_Release(&target);
        return rc;
    }
    uint8_t *one[1];
    uint8_t **dst = n == 1 ? one : PyMem_Malloc(sizeof(uint8_t *) * (size_t)n);
    int64_t at = r->start;
    for (int i = 0; i < n; i++) {
        dst[i] = dest(self, &target, at, items[i].size);
        at += items[i].size;
    }
    self->busy++;
    if (bytes >= MQS_NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS rc = copy_all(self, dst, items, n, qoffs, r);
        Py_END_ALLOW_THREADS
    } else {
        rc = copy_all(self, dst, items, n, qoffs, r);
    }
    self->busy--;
    if (dst != one)
        PyMem_Free(dst);
    if (target.obj)
        PyBuffer_Release(&target);
    return rc;
}

static PyObject *appender_put(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "put(target, target_index, qslot, prep, timeout_ns) takes 5 arguments");
        return NULL;
    }
    if (appender_ready(self) < 0)
        return NULL;
    struct mqs_item it;
    int64_t timeout_ns, qo, waited = 0;
    struct mqs_reservation r;
    if (mqs_arg_i32(args[2], "qslot", &it.qslot) < 0 || parse_prep(args[3], &it) < 0 ||
        mqs_arg_i64(args[4], "timeout_ns", &timeout_ns) < 0)
        return NULL;
    int64_t index;
    if (mqs_arg_i64(args[1], "target_index", &index) < 0)
        return NULL;
    int rc = mqs_append_items(self, args[0], index, &it, 1, timeout_ns, &qo, &r, &waited);
    if (rc == -100)
        return NULL;
    if (rc != MQS_OK)
        return PyLong_FromLong(rc);
    return Py_BuildValue("(LLLLL)", (long long)r.seq, (long long)r.start,
                         (long long)r.store_ts, (long long)qo, (long long)waited);
}

static PyObject *appender_put_batch(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "put_batch(target, target_index, qslots, preps, timeout_ns) takes 5 "
                        "arguments");
        return NULL;
    }
    if (appender_ready(self) < 0)
        return NULL;
    if (!PyList_CheckExact(args[2]) || !PyList_CheckExact(args[3]) ||
        PyList_GET_SIZE(args[2]) != PyList_GET_SIZE(args[3]) || PyList_GET_SIZE(args[2]) < 1 ||
        PyList_GET_SIZE(args[2]) > self->a.slot_count) {
        PyErr_SetString(PyExc_TypeError,
                        "qslots and preps must be lists of one length, 1 to slot_count");
        return NULL;
    }
    int n = (int)PyList_GET_SIZE(args[2]);
    int64_t timeout_ns, waited = 0;
    if (mqs_arg_i64(args[4], "timeout_ns", &timeout_ns) < 0)
        return NULL;
    struct mqs_item *items = PyMem_Calloc((size_t)n, sizeof *items);
    int64_t *qoffs = PyMem_Calloc((size_t)n, sizeof *qoffs);
    PyObject *out = NULL;
    if (items == NULL || qoffs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (mqs_arg_i32(PyList_GET_ITEM(args[2], i), "qslots[i]", &items[i].qslot) < 0 ||
            parse_prep(PyList_GET_ITEM(args[3], i), &items[i]) < 0)
            goto done;
    struct mqs_reservation r;
    int64_t index;
    if (mqs_arg_i64(args[1], "target_index", &index) < 0)
        goto done;
    int rc = mqs_append_items(self, args[0], index, items, n, timeout_ns, qoffs, &r, &waited);
    if (rc == -100)
        goto done;
    if (rc != MQS_OK) {
        out = PyLong_FromLong(rc);
        goto done;
    }
    PyObject *q = PyList_New(n);
    if (q == NULL)
        goto done;
    for (int i = 0; i < n; i++)
        PyList_SET_ITEM(q, i, PyLong_FromLongLong(qoffs[i]));
    out = Py_BuildValue("(LLLNL)", (long long)r.seq, (long long)r.start, (long long)r.store_ts,
                        q, (long long)waited);
done:
    PyMem_Free(items);
    PyMem_Free(qoffs);
    return out;
}

/* The general path's copy: one record (or the BLANK, prep None) at `pos` of `target`,
 * then its slot DONE. */
static PyObject *appender_write(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "write(target, pos, seq, prep, queue_offset, "
                                         "physical_offset, store_timestamp) takes 7 arguments");
        return NULL;
    }
    if (appender_ready(self) < 0)
        return NULL;
    int64_t pos, seq, qo, po, sts;
    if (mqs_arg_i64(args[1], "pos", &pos) < 0 || mqs_arg_i64(args[2], "seq", &seq) < 0 ||
        mqs_arg_i64(args[4], "queue_offset", &qo) < 0 ||
        mqs_arg_i64(args[5], "physical_offset", &po) < 0 ||
        mqs_arg_i64(args[6], "store_timestamp", &sts) < 0)
        return NULL;
    struct mqs_item it;
    int blank = args[3] == Py_None;
    if (!blank && parse_prep(args[3], &it) < 0)
        return NULL;
    int64_t size = blank ? sts : it.size; /* a BLANK's size comes in store_timestamp */
    Py_buffer t;
    if (mqs_arg_wbuffer(args[0], "target", &t) < 0)
        return NULL;
    if (pos < 0 || pos + (blank ? MQS_END_FILE_MIN_BLANK : size) > t.len) {
        PyBuffer_Release(&t);
        PyErr_SetString(PyExc_ValueError, "the record does not fit the target at pos");
        return NULL;
    }
    (void)seq; /* its slot is completed with the rest of the reservation (`complete`) */
    uint8_t *dst = (uint8_t *)t.buf + pos;
    if (blank) {
        mqs_blank_write(dst, (int32_t)size);
    } else {
        it.msg.body_crc = mqs_body_crc(it.msg.body, it.msg.body_len);
        mqs_copy(dst, &it.msg, qo, po, sts);
    }
    PyBuffer_Release(&t);
    Py_RETURN_NONE;
}

/* complete(first, n) -> 0 | FENCED: the general path's reservation of `n` slots from
 * `first`, every record written, completed all or nothing and published. */
static PyObject *appender_complete(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t first, n;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "complete(first, n) takes 2 arguments");
        return NULL;
    }
    if (appender_ready(self) < 0 || mqs_arg_i64(args[0], "first", &first) < 0 ||
        mqs_arg_i64(args[1], "n", &n) < 0)
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

static PyObject *appender_lock(Appender *self, PyObject *arg)
{
    int64_t timeout_ns, waited;
    if (appender_ready(self) < 0 || mqs_arg_i64(arg, "timeout_ns", &timeout_ns) < 0)
        return NULL;
    return PyLong_FromLong(take_lock(self, timeout_ns, &waited));
}

static PyObject *appender_unlock(Appender *self, PyObject *Py_UNUSED(a))
{
    if (appender_ready(self) < 0)
        return NULL;
    mqs_unlock(self->a.ctl);
    Py_RETURN_NONE;
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
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait_flushed(end, timeout_ns) takes 2 arguments");
        return NULL;
    }
    if (appender_ready(self) < 0 || mqs_arg_i64(args[0], "end", &end) < 0 ||
        mqs_arg_i64(args[1], "timeout_ns", &timeout_ns) < 0)
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

/* count(stats, n, nbytes, status_index, ok, sync, lat_ns, lock_ns, append_ns, flush_ns):
 * one put call into this client's statistics row (an array('q') of CLIENT_FIELDS), as
 * ipc/control.py lays it out; lock_ns < 0: a call that never reserved (no phases). */
static PyObject *appender_count(Appender *Py_UNUSED(self), PyObject *const *args,
                                Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "count() takes 10 arguments");
        return NULL;
    }
    int64_t v[9];
    static const char *names[9] = {"n", "nbytes", "status_index", "ok", "sync",
                                   "lat_ns", "lock_ns", "append_ns", "flush_ns"};
    for (int i = 0; i < 9; i++)
        if (mqs_arg_i64(args[i + 1], names[i], &v[i]) < 0)
            return NULL;
    int64_t status = v[2];
    if (status < 0 || MQS_CF_STATUS + status >= MQS_CF_HIST) {
        PyErr_SetString(PyExc_ValueError, "status_index out of range");
        return NULL;
    }
    Py_buffer b;
    if (mqs_arg_wbuffer(args[0], "stats", &b) < 0)
        return NULL;
    if (b.len != MQS_CLIENT_FIELDS * 8 || ((uintptr_t)b.buf & 7)) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "stats must be an array('q') of CLIENT_FIELDS");
        return NULL;
    }
    mqs_count(b.buf, v);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* A METH_FASTCALL entry of a method table. */
#define FAST(name, fn, doc) {name, (PyCFunction)(void (*)(void))(fn), METH_FASTCALL, doc}

static PyMethodDef appender_methods[] = {
    FAST("count", appender_count,
         "count(stats, n, nbytes, status_index, ok, sync, lat_ns, lock_ns, append_ns, "
         "flush_ns): one put call into the client's statistics row (lock_ns < 0: no phases)."),
    FAST("put", appender_put,
         "put(target, target_index, qslot, prep, timeout_ns) -> (seq, start, store_ts, "
         "queue_offset, lock_wait_ns) | int: the whole common-case put, or a code (< 0)."),
    FAST("put_batch", appender_put_batch,
         "put_batch(target, target_index, qslots, preps, timeout_ns) -> (first_seq, start, "
         "store_ts, queue_offsets, lock_wait_ns) | int"),
    FAST("write", appender_write,
         "write(target, pos, seq, prep, queue_offset, physical_offset, store_timestamp): the "
         "general path's copy of one reserved record (prep None: a BLANK of store_timestamp "
         "bytes); `complete` marks the reservation done."),
    FAST("complete", appender_complete,
         "complete(first, n) -> 0 | FENCED: the general path's reservation of n slots from "
         "first, all written: DONE all or nothing, then published."),
    {"lock", (PyCFunction)appender_lock, METH_O,
     "lock(timeout_ns) -> int: take the reservation lock (0) or a code (< 0)."},
    {"unlock", (PyCFunction)appender_unlock, METH_NOARGS, "unlock(): release it."},
    FAST("wait_flushed", appender_wait_flushed,
         "wait_flushed(end, timeout_ns) -> 0 flushed | 1 timed out | 2 flush failed | 3 the "
         "generation ended (fenced) without flushing it."),
    MQS_PUT_METHODS
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

/* write_record(target, pos, prep, queue_offset, physical_offset, store_timestamp): one
 * record into any writable buffer (engine.commitlog's single-process appender). */
static PyObject *py_write_record(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    if (n != 6) {
        PyErr_SetString(PyExc_TypeError, "write_record(target, pos, prep, queue_offset, "
                                         "physical_offset, store_timestamp) takes 6 arguments");
        return NULL;
    }
    int64_t pos, qo, po, sts;
    struct mqs_item it;
    if (mqs_arg_i64(args[1], "pos", &pos) < 0 || parse_prep(args[2], &it) < 0 ||
        mqs_arg_i64(args[3], "queue_offset", &qo) < 0 ||
        mqs_arg_i64(args[4], "physical_offset", &po) < 0 ||
        mqs_arg_i64(args[5], "store_timestamp", &sts) < 0)
        return NULL;
    Py_buffer t;
    if (mqs_arg_wbuffer(args[0], "target", &t) < 0)
        return NULL;
    if (pos < 0 || pos + it.size > t.len) {
        PyBuffer_Release(&t);
        PyErr_SetString(PyExc_ValueError, "the record does not fit the target at pos");
        return NULL;
    }
    it.msg.body_crc = mqs_body_crc(it.msg.body, it.msg.body_len);
    if (it.msg.body_len >= MQS_NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS mqs_record_write((uint8_t *)t.buf + pos, &it.msg, qo, po, sts);
        Py_END_ALLOW_THREADS
    } else {
        mqs_record_write((uint8_t *)t.buf + pos, &it.msg, qo, po, sts);
    }
    PyBuffer_Release(&t);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    MQS_INDEX_METHODS
    MQS_CQ_METHODS
    MQS_PULL_METHODS
    FAST("crc32", py_crc32,
         "crc32(data, value=0) -> int: zlib.crc32, folded with PCLMULQDQ where the CPU has it."),
    {"crc32_slice8", py_crc32_slice8, METH_O,
     "crc32_slice8(data) -> int: the portable slicing-by-8 CRC alone (for tests)."},
    {"crc32_uses_pclmul", py_crc32_uses_pclmul, METH_NOARGS,
     "crc32_uses_pclmul() -> bool: whether crc32 folds with PCLMULQDQ on this CPU."},
    {"scan_records", (PyCFunction)(void (*)(void))mqs_py_scan_records,
     METH_VARARGS | METH_KEYWORDS,
     "scan_records(buf, pos, limit, *, check_crc=True, max_records=-1) -> (count, stop, "
     "stop_pos, blank_size, columns, fixups): the record scanner (engine/native/mqs_scan.c; "
     "engine.scan.scan_records is its door)."},
    FAST("scan_summary", mqs_py_scan_summary,
         "scan_summary(store_timestamp, bits, sys_flag, queue_id, now_ms, buckets) -> (flags, "
         "lag_sum_ms, counts): engine.scan.scan_summary_py, in C."),
    FAST("verify_units", mqs_py_verify_units,
         "verify_units(units, first_queue_offset, queue_id, prev_end, log_min, log_end, "
         "headers_from, segments, segments_base, segment_size) -> (bad_queue_offset, prev_end): "
         "recovery's consume-queue check (engine/native/mqs_verify.c; engine.verify is its door)."),
    FAST("queue_last_ends", mqs_py_queue_last_ends,
         "queue_last_ends(buf, start, pos, size, queue_id, topic_pos, topic_len) -> dict: each "
         "queue's last scanned record's end (engine.verify.queue_last_ends is its door)."),
    {"encode", (PyCFunction)(void (*)(void))py_encode, METH_VARARGS | METH_KEYWORDS,
     "encode(topic, body, properties, *, ...) -> bytes: one V1 record, as "
     "engine.record.encode lays it out (the inputs already validated)."},
    FAST("write_record", py_write_record,
         "write_record(target, pos, prep, queue_offset, physical_offset, store_timestamp): "
         "one record into a writable buffer (engine.commitlog)."),
    MQS_CONTROL_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mqstore._native",
    "The per-message hot path of a put, in C (see ipc/native/mqs_module.c).", -1, methods,
    NULL, NULL, NULL, NULL,
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

PyMODINIT_FUNC PyInit__native(void)
{
    char err[256];
    if (mqs_crashpoint_init(err, sizeof err) < 0) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    if (PyType_Ready(&AppenderType) < 0 || mqs_put_ready() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&AppenderType);
    if (PyModule_AddObject(m, "Appender", (PyObject *)&AppenderType) < 0 || add_layout(m) < 0 ||
        mqs_put_add(m) < 0 ||
        PyModule_AddIntConstant(m, "FALLBACK", MQS_FALLBACK) < 0 ||
        PyModule_AddIntConstant(m, "LOCK_TIMEOUT", MQS_LOCK_TIMEOUT) < 0 ||
        PyModule_AddIntConstant(m, "LOCK_BROKEN", MQS_LOCK_BROKEN) < 0 ||
        PyModule_AddIntConstant(m, "FENCED", MQS_FENCED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
