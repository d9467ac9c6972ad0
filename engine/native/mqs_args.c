#include "mqs_args.h"

int mqs_arg_i64(PyObject *o, const char *name, int64_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", name, Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s is out of the signed 64-bit range", name);
        return -1;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

int mqs_arg_i32(PyObject *o, const char *name, int32_t *out)
{
    int64_t v;
    if (mqs_arg_i64(o, name, &v) < 0)
        return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s is out of the signed 32-bit range", name);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

int mqs_arg_bytes(PyObject *o, const char *name, const uint8_t **p, size_t *len)
{
    if (!PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes, not %.100s", name,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    *p = (const uint8_t *)PyBytes_AS_STRING(o);
    *len = (size_t)PyBytes_GET_SIZE(o);
    return 0;
}

int mqs_arg_host(PyObject *addr, PyObject *port, const char *name, struct mqs_host *out)
{
    size_t len;
    if (mqs_arg_bytes(addr, name, &out->addr, &len) < 0)
        return -1;
    if (len != 4 && len != 16) {
        PyErr_Format(PyExc_ValueError, "%s must be 4 (IPv4) or 16 (IPv6) bytes, not %zu", name,
                     len);
        return -1;
    }
    out->addr_len = (int)len;
    return mqs_arg_i32(port, name, &out->port);
}

static int get_buffer(PyObject *o, const char *name, Py_buffer *view, int flags)
{
    if (PyObject_GetBuffer(o, view, flags) == 0)
        return 0;
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s must be a %sbytes-like object, not %.100s", name,
                 flags & PyBUF_WRITABLE ? "writable " : "", Py_TYPE(o)->tp_name);
    return -1;
}

int mqs_arg_buffer(PyObject *o, const char *name, Py_buffer *view)
{
    return get_buffer(o, name, view, PyBUF_SIMPLE);
}

int mqs_arg_wbuffer(PyObject *o, const char *name, Py_buffer *view)
{
    return get_buffer(o, name, view, PyBUF_WRITABLE);
}
