/* The Python door of the record scanner: arguments checked here, the walk without the
 * GIL over a buffer held for its whole length, the columns copied out as bytes. */
#include "mqs_scan_py.h"

#include "mqs_args.h"
#include "mqs_be.h"
#include "mqs_scan.h"

#include <string.h>

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
    static char *kwlist[] = {"buf",         "pos",      "limit", "check_crc",
                             "max_records", "delay_ms", NULL};
    PyObject *obj, *delay_obj = Py_None;
    long long pos, limit, max_records = -1;
    int check_crc = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OLL|$pLO:scan_records", kwlist, &obj, &pos,
                                     &limit, &check_crc, &max_records, &delay_obj))
        return NULL;
    if (pos < 0) {
        PyErr_Format(PyExc_ValueError, "scan position %lld is negative", pos);
        return NULL;
    }
    /* the delay table: None (RocketMQ's default) or 1..64 native int64 values, copied */
    int64_t delays[64];
    int32_t ndelay = 0;
    if (delay_obj != Py_None) {
        Py_buffer d;
        if (mqs_arg_buffer(delay_obj, "delay_ms", &d) < 0)
            return NULL;
        if (d.len % (Py_ssize_t)sizeof(int64_t) != 0 || d.len < (Py_ssize_t)sizeof(int64_t) ||
            d.len > (Py_ssize_t)sizeof(delays)) {
            PyBuffer_Release(&d);
            PyErr_SetString(PyExc_ValueError, "delay_ms must hold 1 to 64 int64 values");
            return NULL;
        }
        memcpy(delays, d.buf, (size_t)d.len);
        ndelay = (int32_t)(d.len / (Py_ssize_t)sizeof(int64_t));
        PyBuffer_Release(&d);
    }
    Py_buffer v;
    if (mqs_arg_buffer(obj, "buf", &v) < 0)
        return NULL;
    int64_t end = limit < 0 || limit > v.len ? (int64_t)v.len : (int64_t)limit;
    struct mqs_scan s = {0};
    if (ndelay > 0) {
        s.delay_ms = delays;
        s.ndelay = ndelay;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = mqs_scan_run(&s, v.buf, pos, end, check_crc, max_records);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    PyObject *out = rc < 0 ? PyErr_NoMemory() : result(&s);
    mqs_scan_free(&s);
    return out;
}

/* The dispatcher's pass over a batch's columns, checked here: each must be a buffer of
 * exactly n items of its width (n: store_timestamp's), as engine.scan.scan_summary_py
 * says. The walk copies each item out (a buffer need not be aligned). */
static int summary_column(PyObject *o, const char *name, Py_ssize_t width, Py_ssize_t n,
                          Py_buffer *v)
{
    if (mqs_arg_buffer(o, name, v) < 0)
        return -1;
    if (v->len != n * width) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd items of %zd bytes", name, n, width);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

#define MQS_SUMMARY_MAX_BUCKETS 64

static PyObject *summary_result(const struct mqs_summary *sm, const int64_t *hist, int nbuckets)
{
    PyObject *sum = PyLong_FromUnsignedLongLong(sm->sum_lo);
    if (sum != NULL && sm->sum_hi != 0) {
        PyObject *hi = PyLong_FromUnsignedLongLong(sm->sum_hi), *shift = PyLong_FromLong(64);
        PyObject *high = hi && shift ? PyNumber_Lshift(hi, shift) : NULL;
        Py_XDECREF(hi);
        Py_XDECREF(shift);
        PyObject *total = high ? PyNumber_Or(high, sum) : NULL;
        Py_XDECREF(high);
        Py_SETREF(sum, total);
    }
    PyObject *counts = PyTuple_New(nbuckets);
    for (int b = 0; counts != NULL && b < nbuckets; b++) {
        PyObject *c = PyLong_FromLongLong((long long)hist[b]);
        if (c == NULL)
            Py_CLEAR(counts);
        else
            PyTuple_SET_ITEM(counts, b, c);
    }
    if (sum == NULL || counts == NULL) {
        Py_XDECREF(sum);
        Py_XDECREF(counts);
        return NULL;
    }
    return Py_BuildValue("iNN", sm->flags, sum, counts);
}

PyObject *mqs_py_scan_summary(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    static const char *names[] = {"store_timestamp", "bits", "sys_flag", "queue_id"};
    static const Py_ssize_t width[] = {8, 1, 4, 4};
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "scan_summary takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    int64_t now_ms, buckets;
    if (mqs_arg_i64(args[4], "now_ms", &now_ms) < 0 ||
        mqs_arg_i64(args[5], "buckets", &buckets) < 0)
        return NULL;
    if (buckets < 0 || buckets > MQS_SUMMARY_MAX_BUCKETS) {
        PyErr_Format(PyExc_ValueError, "buckets must be from 0 to %d", MQS_SUMMARY_MAX_BUCKETS);
        return NULL;
    }
    Py_buffer v[4];
    if (mqs_arg_buffer(args[0], names[0], &v[0]) < 0)
        return NULL;
    Py_ssize_t n = v[0].len / 8;
    PyBuffer_Release(&v[0]);
    int held = 0;
    PyObject *out = NULL;
    for (; held < 4; held++)
        if (summary_column(args[held], names[held], width[held], n, &v[held]) < 0)
            goto done;
    int64_t hist[MQS_SUMMARY_MAX_BUCKETS] = {0};
    struct mqs_summary sm;
    Py_BEGIN_ALLOW_THREADS mqs_scan_summary(v[0].buf, v[1].buf, v[2].buf, v[3].buf, n, now_ms,
                                            hist, (int)buckets, &sm);
    Py_END_ALLOW_THREADS
    out = summary_result(&sm, hist, (int)buckets);
done:
    while (held-- > 0)
        PyBuffer_Release(&v[held]);
    return out;
}

/* engine.scan.record_step_py in C: from the record boundary `pos`, follow each record's
 * TOTALSIZE (big-endian, its first 4 bytes) to the first boundary at or past `want`; stop
 * at the last boundary reached when a size is not positive or the record runs past
 * `limit`. O(records), a load each: the committer's step end (ipc.commit). */
static int64_t record_step(const uint8_t *buf, int64_t pos, int64_t limit, int64_t want)
{
    while (pos < want && limit - pos >= 4) {
        int64_t size = (int32_t)mqs_rd32(buf + pos);
        if (size <= 0 || size > limit - pos)
            break;
        pos += size;
    }
    return pos;
}

PyObject *mqs_py_record_step(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "record_step(buf, pos, limit, want) takes 4 arguments");
        return NULL;
    }
    int64_t pos, limit, want;
    if (mqs_arg_i64(args[1], "pos", &pos) < 0 || mqs_arg_i64(args[2], "limit", &limit) < 0 ||
        mqs_arg_i64(args[3], "want", &want) < 0)
        return NULL;
    Py_buffer v;
    if (mqs_arg_buffer(args[0], "buf", &v) < 0)
        return NULL;
    if (pos < 0 || pos > limit || limit > v.len) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "record_step: need 0 <= pos <= limit <= len(buf)");
        return NULL;
    }
    int64_t end = record_step(v.buf, pos, limit, want);
    PyBuffer_Release(&v);
    return PyLong_FromLongLong(end);
}
