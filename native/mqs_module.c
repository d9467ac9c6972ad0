/* mqstore._native: the per-message hot path of a put, in C (issue 12).
 *
 * This file is the Python door: argument checks (the parameter's name in every error)
 * and the GIL. The work is in mqs_crc32.c (CRC), mqs_record.c (the V1 record) and, for
 * the put itself, mqs_append.c (the reservation protocol over the control block whose
 * layout is mqs_layout.h, mirrored by ipc/control.py). The typed stub is
 * mqstore/_native.pyi. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "mqs_args.h"
#include "mqs_crc32.h"
#include "mqs_record.h"

/* Copies and CRCs of at least this many bytes run with the GIL released. */
#define MQS_NOGIL_BYTES (64 * 1024)

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
    "prepared_offset", "queue_offset", "physical_offset", "store_timestamp", NULL,
};

static PyObject *py_encode(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw)
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

static PyMethodDef methods[] = {
    {"crc32", (PyCFunction)(void (*)(void))py_crc32, METH_FASTCALL,
     "crc32(data, value=0) -> int: zlib.crc32, folded with PCLMULQDQ where the CPU has it."},
    {"crc32_slice8", py_crc32_slice8, METH_O,
     "crc32_slice8(data) -> int: the portable slicing-by-8 CRC alone (for tests)."},
    {"crc32_uses_pclmul", py_crc32_uses_pclmul, METH_NOARGS,
     "crc32_uses_pclmul() -> bool: whether crc32 folds with PCLMULQDQ on this CPU."},
    {"encode", (PyCFunction)(void (*)(void))py_encode, METH_VARARGS | METH_KEYWORDS,
     "encode(topic, body, properties, *, ...) -> bytes: one V1 record, as "
     "engine.record.encode lays it out (the inputs already validated)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mqstore._native",
    "The per-message hot path of a put, in C (see native/mqs_module.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
