#include "mqs_args.h"

#include <string.h>

#include "mqs_scan.h"

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

/* Where the next encoded surrogate (ED A0..BF) starts in p[0, n), or n. */
static size_t next_surrogate(const uint8_t *p, size_t n)
{
    for (const uint8_t *q = p; (q = memchr(q, 0xED, n - (size_t)(q - p))) != NULL; q++) {
        if (mqs_java_surrogate_len(p, (size_t)(q - p), n))
            return (size_t)(q - p);
    }
    return n;
}

PyObject *mqs_str_utf8(const uint8_t *p, size_t n)
{
    size_t at = next_surrogate(p, n);
    if (at == n) /* no encoded surrogate: Python's "replace" is Java's decoding */
        return PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)n, "replace");
    /* Decoded around each encoded surrogate: 0xED is never a continuation byte, so a part
     * decodes alone as it does within the whole; each surrogate is one U+FFFD. */
    PyObject *parts = PyList_New(0);
    if (parts == NULL)
        return NULL;
    size_t from = 0;
    while (from < n) {
        PyObject *part = PyUnicode_DecodeUTF8((const char *)p + from, (Py_ssize_t)(at - from),
                                              "replace");
        int rc = part == NULL ? -1 : PyList_Append(parts, part);
        Py_XDECREF(part);
        if (rc == 0 && at < n) {
            part = PyUnicode_FromOrdinal(0xFFFD);
            rc = part == NULL ? -1 : PyList_Append(parts, part);
            Py_XDECREF(part);
            at += mqs_java_surrogate_len(p, at, n);
        }
        if (rc < 0) {
            Py_DECREF(parts);
            return NULL;
        }
        from = at;
        at = from + next_surrogate(p + from, n - from);
    }
    PyObject *sep = PyUnicode_New(0, 127);
    PyObject *s = sep == NULL ? NULL : PyUnicode_Join(sep, parts);
    Py_XDECREF(sep);
    Py_DECREF(parts);
    return s;
}
