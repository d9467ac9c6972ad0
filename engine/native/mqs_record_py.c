/* The record encoder's Python doors (mqs_record.c): `encode`, one record as
 * engine.record.encode lays it out (its differential test's door), and `write_record`,
 * engine.commitlog's single-process appender. The client's put writes records through
 * mqs_record.c directly (ipc/native/mqs_put.c), not through these. */
#include "mqs_record_py.h"

#include "mqs_args.h"
#include "mqs_be.h"
#include "mqs_crc32.h"
#include "mqs_record.h"

/* Fill `m` from encode()'s keyword arguments. The body view is left for the caller to
 * release. */
static const char *encode_kw[] = {
    "topic", "body", "properties", "queue_id", "flag", "sys_flag", "born_timestamp",
    "born_addr", "born_port", "store_addr", "store_port", "reconsume_times",
    "prepared_offset", "queue_offset", "physical_offset", "store_timestamp", NULL,
};

PyObject *mqs_py_encode(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw)
{
    PyObject *o[16] = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|$OOOOOOOOOOOOO:encode", (char **)encode_kw,
                                     &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                                     &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14],
                                     &o[15]))
        return NULL;
    static const uint8_t loopback[4] = {127, 0, 0, 1};
    struct mqs_message msg = {0};
    int64_t qo = 0, po = 0, sts = 0;
    msg.born.addr = msg.store.addr = loopback;
    msg.born.addr_len = msg.store.addr_len = 4;
    msg.store.port = 10911;
    if (mqs_arg_bytes(o[0], "topic", &msg.topic, &msg.topic_len) < 0 ||
        mqs_arg_bytes(o[2], "properties", &msg.props, &msg.props_len) < 0)
        return NULL;
    if (msg.topic_len < 1 || msg.topic_len > 127) {
        PyErr_Format(PyExc_ValueError, "topic must be 1 to 127 bytes, not %zu", msg.topic_len);
        return NULL;
    }
    if (msg.props_len > 32767) {
        PyErr_Format(PyExc_ValueError, "properties must be at most 32767 bytes, not %zu",
                     msg.props_len);
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


/* A validated message, as engine.commitlog prepares it (`_native.Prep`):
 * (size, queue_id, flag, sys_flag, born_ts, body, topic, properties, takes_offset,
 *  reconsume_times, prepared_offset, born_addr, born_port, store_addr, store_port) */
#define PREP_FIELDS 15

static int parse_prep(PyObject *t, struct mqs_message *m, int64_t *size_out)
{
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != PREP_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "prep must be a tuple of 15 fields (_native.Prep)");
        return -1;
    }
    PyObject **f = &PyTuple_GET_ITEM(t, 0);
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
    *size_out = (int64_t)mqs_record_length(m);
    if (*size_out != size) {
        PyErr_Format(PyExc_ValueError, "prep says %lld bytes, the record is %lld",
                     (long long)size, (long long)*size_out);
        return -1;
    }
    return 0;
}

/* write_record(target, pos, prep, queue_offset, physical_offset, store_timestamp): one
 * record into any writable buffer (engine.commitlog's single-process appender). */
PyObject *mqs_py_write_record(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    if (n != 6) {
        PyErr_SetString(PyExc_TypeError, "write_record(target, pos, prep, queue_offset, "
                                         "physical_offset, store_timestamp) takes 6 arguments");
        return NULL;
    }
    int64_t pos, qo, po, sts;
    struct mqs_message msg = {0};
    int64_t size;
    if (mqs_arg_i64(args[1], "pos", &pos) < 0 || parse_prep(args[2], &msg, &size) < 0 ||
        mqs_arg_i64(args[3], "queue_offset", &qo) < 0 ||
        mqs_arg_i64(args[4], "physical_offset", &po) < 0 ||
        mqs_arg_i64(args[5], "store_timestamp", &sts) < 0)
        return NULL;
    Py_buffer t;
    if (mqs_arg_wbuffer(args[0], "target", &t) < 0)
        return NULL;
    if (pos < 0 || pos + size > t.len) {
        PyBuffer_Release(&t);
        PyErr_SetString(PyExc_ValueError, "the record does not fit the target at pos");
        return NULL;
    }
    msg.body_crc = mqs_body_crc(msg.body, msg.body_len);
    MQS_NOGIL_IF_BIG(msg.body_len, mqs_record_write((uint8_t *)t.buf + pos, &msg, qo, po, sts));
    PyBuffer_Release(&t);
    Py_RETURN_NONE;
}
