/* The Python door of the consume-queue check: arguments checked here, the units walked
 * without the GIL, and a segment's buffer taken (with the GIL) only when a unit points
 * into it, held until the call returns. */
#include "mqs_verify_py.h"

#include "mqs_args.h"
#include "mqs_verify.h"

#define NARGS 10

/* Fill v->seg[v->need] from the sequence's item: None is ABSENT, else a buffer. */
static int take_segment(struct mqs_verify *v, PyObject *segments, Py_buffer *held)
{
    PyObject *item = PySequence_GetItem(segments, (Py_ssize_t)v->need);
    if (item == NULL)
        return -1;
    struct mqs_seg_view *s = &v->seg[v->need];
    s->state = MQS_SEG_ABSENT;
    int rc = 0;
    if (item != Py_None) {
        rc = mqs_arg_buffer(item, "segments[i]", &held[v->need]);
        if (rc == 0) {
            s->buf = held[v->need].buf;
            s->len = (int64_t)held[v->need].len;
            s->state = MQS_SEG_HELD;
        }
    }
    Py_DECREF(item);
    return rc;
}

static int run(struct mqs_verify *v, PyObject *segments, Py_buffer *held)
{
    for (;;) {
        int rc;
        Py_BEGIN_ALLOW_THREADS rc = mqs_verify_run(v);
        Py_END_ALLOW_THREADS
        if (rc != MQS_VERIFY_NEED_SEGMENT)
            return 0;
        if (take_segment(v, segments, held) < 0)
            return -1;
    }
}

static int parse(PyObject *const *args, struct mqs_verify *v)
{
    static const char *names[] = {"first_queue_offset", "queue_id", "prev_end", "log_min",
                                  "log_end", "headers_from"};
    int64_t *fields[] = {&v->first_qo, &v->queue_id,  &v->prev_end,
                         &v->log_min,  &v->log_end,   &v->headers_from};
    for (int i = 0; i < 6; i++)
        if (mqs_arg_i64(args[1 + i], names[i], fields[i]) < 0)
            return -1;
    if (mqs_arg_i64(args[8], "segments_base", &v->seg_base) < 0 ||
        mqs_arg_i64(args[9], "segment_size", &v->seg_size) < 0)
        return -1;
    if (v->seg_size <= 0) {
        PyErr_Format(PyExc_ValueError, "segment_size %lld is not positive", (long long)v->seg_size);
        return -1;
    }
    if (v->log_end < 0) {
        PyErr_Format(PyExc_ValueError, "log_end %lld is negative", (long long)v->log_end);
        return -1;
    }
    if (!PySequence_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "segments must be a sequence of buffers or None");
        return -1;
    }
    Py_ssize_t nseg = PySequence_Size(args[7]);
    if (nseg < 0)
        return -1;
    v->nseg = nseg;
    return 0;
}

PyObject *mqs_py_verify_units(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != NARGS) {
        PyErr_Format(PyExc_TypeError, "verify_units takes %d arguments (%zd given)", NARGS, nargs);
        return NULL;
    }
    struct mqs_verify v = {0};
    if (parse(args, &v) < 0)
        return NULL;
    Py_buffer units;
    if (mqs_arg_buffer(args[0], "units", &units) < 0)
        return NULL;
    if (units.len % 20) {
        PyErr_Format(PyExc_ValueError, "units holds %zd bytes, not whole 20-byte units", units.len);
        PyBuffer_Release(&units);
        return NULL;
    }
    v.units = units.buf;
    v.nunits = (int64_t)units.len / 20;
    v.bad_qo = -1;
    v.seg = PyMem_Calloc((size_t)v.nseg + 1, sizeof(*v.seg));
    Py_buffer *held = PyMem_Calloc((size_t)v.nseg + 1, sizeof(*held));
    PyObject *out = NULL;
    if (v.seg == NULL || held == NULL)
        PyErr_NoMemory();
    else if (run(&v, args[7], held) == 0)
        out = Py_BuildValue("LL", (long long)v.bad_qo, (long long)v.prev_end);
    for (int64_t k = 0; v.seg != NULL && k < v.nseg; k++)
        if (v.seg[k].state == MQS_SEG_HELD)
            PyBuffer_Release(&held[k]);
    PyMem_Free(held);
    PyMem_Free(v.seg);
    PyBuffer_Release(&units);
    return out;
}

/* Take the scanner's column `o` of n elements of `width` bytes. */
static int column(PyObject *o, const char *name, size_t width, Py_ssize_t n, Py_buffer *v)
{
    if (mqs_arg_buffer(o, name, v) < 0)
        return -1;
    if (v->len != n * (Py_ssize_t)width) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, not %zd", name, v->len,
                     n * (Py_ssize_t)width);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* {(topic bytes, queue id): pos + size of its last record} from the indices found. */
static PyObject *last_ends(const Py_buffer *c, const int64_t *last, int64_t nq)
{
    const int64_t *pos = c[1].buf, *topic_pos = c[4].buf;
    const int32_t *size = c[2].buf, *queue_id = c[3].buf, *topic_len = c[5].buf;
    PyObject *out = PyDict_New();
    for (int64_t j = 0; out != NULL && j < nq; j++) {
        int64_t i = last[j];
        PyObject *key = Py_BuildValue("(y#i)", (const char *)c[0].buf + topic_pos[i],
                                      (Py_ssize_t)topic_len[i], (int)queue_id[i]);
        PyObject *end = PyLong_FromLongLong((long long)(pos[i] + size[i]));
        if (key == NULL || end == NULL || PyDict_SetItem(out, key, end) < 0)
            Py_CLEAR(out);
        Py_XDECREF(key);
        Py_XDECREF(end);
    }
    return out;
}

/* Every topic span lies inside buf: the columns may come from anywhere. */
static int spans_inside(const Py_buffer *c, Py_ssize_t n)
{
    const int64_t *topic_pos = c[4].buf;
    const int32_t *topic_len = c[5].buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (topic_pos[i] < 0 || topic_len[i] < 0 || topic_pos[i] > c[0].len - topic_len[i]) {
            PyErr_Format(PyExc_ValueError, "record %zd's topic is not inside buf", i);
            return -1;
        }
    }
    return 0;
}

PyObject *mqs_py_queue_last_ends(PyObject *Py_UNUSED(module), PyObject *const *args,
                                 Py_ssize_t nargs)
{
    static const char *names[] = {"buf", "pos", "size", "queue_id", "topic_pos", "topic_len"};
    static const size_t width[] = {1, 8, 4, 4, 8, 4};
    int64_t start;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "queue_last_ends takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    if (mqs_arg_i64(args[1], "start", &start) < 0)
        return NULL;
    Py_buffer c[6];
    int held = 0;
    PyObject *out = NULL;
    Py_ssize_t n = 0;
    if (mqs_arg_buffer(args[0], "buf", &c[held]) < 0)
        return NULL;
    if (mqs_arg_buffer(args[2], "pos", &c[++held]) < 0)
        goto done;
    held++;
    n = c[1].len / 8;
    if (c[1].len % 8) {
        PyErr_SetString(PyExc_ValueError, "pos holds a partial 8-byte element");
        goto done;
    }
    for (; held < 6; held++)
        if (column(args[held + 1], names[held], width[held], n, &c[held]) < 0)
            goto done;
    if (spans_inside(c, n) < 0)
        goto done;
    start = start < 0 ? 0 : start > n ? n : start;
    int64_t *last = PyMem_Malloc(((size_t)(n - start) + 1) * sizeof(*last));
    if (last == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t nq;
    Py_BEGIN_ALLOW_THREADS nq = mqs_queue_lasts(c[0].buf, c[4].buf, c[5].buf, c[3].buf, start, n, last);
    Py_END_ALLOW_THREADS
    out = nq < 0 ? PyErr_NoMemory() : last_ends(c, last, nq);
    PyMem_Free(last);
done:
    while (held-- > 0)
        PyBuffer_Release(&c[held]);
    return out;
}
