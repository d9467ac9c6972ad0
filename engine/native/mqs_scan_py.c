/* The Python door of the record scanner: arguments checked here, the walk without the
 * GIL over a buffer held for its whole length, the columns copied out as bytes. */
#include "mqs_scan_py.h"

#include "mqs_args.h"
#include "mqs_scan.h"

static PyObject *bytes_of(const void *p, int64_t n, size_t width)
{
    return PyBytes_FromStringAndSize(n ? p : "", (Py_ssize_t)((size_t)n * width));
}

static PyObject *result(const struct mqs_scan *s)
{
    PyObject *cols = PyTuple_New(MQS_NCOLS + 2);
    if (cols == NULL)
        return NULL;
    for (int c = 0; c < MQS_NCOLS; c++)
        PyTuple_SET_ITEM(cols, c, bytes_of(s->col[c], s->count, MQS_SCAN_WIDTH[c]));
    PyTuple_SET_ITEM(cols, MQS_NCOLS, bytes_of(s->key_first, s->count + 1, sizeof(int32_t)));
    PyTuple_SET_ITEM(cols, MQS_NCOLS + 1, bytes_of(s->key_hash, s->nkeys, sizeof(int32_t)));
    for (int c = 0; c < MQS_NCOLS + 2; c++) {
        if (PyTuple_GET_ITEM(cols, c) == NULL) {
            Py_DECREF(cols);
            return NULL;
        }
    }
    PyObject *fixups = bytes_of(s->fixup, s->nfixup, sizeof(int64_t));
    if (fixups == NULL) {
        Py_DECREF(cols);
        return NULL;
    }
    return Py_BuildValue("LiLiNN", (long long)s->count, s->stop, (long long)s->stop_pos,
                         (int)s->blank_size, cols, fixups);
}

PyObject *mqs_py_scan_records(PyObject *Py_UNUSED(module), PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "pos", "limit", "check_crc", "max_records", NULL};
    PyObject *obj;
    long long pos, limit, max_records = -1;
    int check_crc = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OLL|$pL:scan_records", kwlist, &obj, &pos,
                                     &limit, &check_crc, &max_records))
        return NULL;
    if (pos < 0) {
        PyErr_Format(PyExc_ValueError, "scan position %lld is negative", pos);
        return NULL;
    }
    Py_buffer v;
    if (mqs_arg_buffer(obj, "buf", &v) < 0)
        return NULL;
    int64_t end = limit < 0 || limit > v.len ? (int64_t)v.len : (int64_t)limit;
    struct mqs_scan s = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = mqs_scan_run(&s, v.buf, pos, end, check_crc, max_records);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    PyObject *out = rc < 0 ? PyErr_NoMemory() : result(&s);
    mqs_scan_free(&s);
    return out;
}
