/* A scanned batch's consume-queue units, grouped per (topic bytes, queue id) in order of
 * first appearance and packed as RocketMQ's 20-byte big-endian units (the layout table
 * is in engine/consumequeue_files.py): the twin of engine.consumequeue_files.group_units.
 *
 * Per group: the topic's bytes, the queue id, the first record's queue offset, whether
 * the group is dense (queue offsets first, first + 1, ... and commit-log ends rising),
 * the records ('i' indices into the columns) and the units (phys = base + pos). */
#include "mqs_cq.h"

#include <stdint.h>
#include <string.h>

#include "mqs_args.h"
#include "mqs_be.h"


struct cols {
    const uint8_t *buf;
    Py_ssize_t buf_len;
    const int64_t *topic_pos, *queue_offset, *pos, *tags;
    const int32_t *topic_len, *queue_id, *size;
    int64_t base;
};

struct group {
    int64_t first;       /* the first record of the group */
    int64_t count, fill; /* records; filled so far */
    int64_t last_end;    /* commit-log end of the last unit filled */
    int dense;
    PyObject *records, *units;
};

static uint64_t key_hash(const struct cols *c, int64_t r)
{
    return mqs_queue_key_hash(c->queue_id[r], c->buf + c->topic_pos[r], c->topic_len[r]);
}

static int same_key(const struct cols *c, int64_t a, int64_t b)
{
    return mqs_same_queue_key(c->queue_id[a], c->buf + c->topic_pos[a], c->topic_len[a],
                              c->queue_id[b], c->buf + c->topic_pos[b], c->topic_len[b]);
}

/* Group ids per record (first pass); returns the number of groups or -1 (MemoryError). */
static int64_t assign(const struct cols *c, int64_t n, int64_t *gid, struct group **out)
{
    int64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    int64_t *table = PyMem_Malloc((size_t)cap * sizeof *table);
    struct group *groups = PyMem_Calloc((size_t)(n ? n : 1), sizeof *groups);
    if (table == NULL || groups == NULL) {
        PyMem_Free(table);
        PyMem_Free(groups);
        PyErr_NoMemory();
        return -1;
    }
    for (int64_t i = 0; i < cap; i++)
        table[i] = -1;
    int64_t ng = 0;
    for (int64_t r = 0; r < n; r++) {
        uint64_t slot = key_hash(c, r) & (uint64_t)(cap - 1);
        while (table[slot] >= 0 && !same_key(c, groups[table[slot]].first, r))
            slot = (slot + 1) & (uint64_t)(cap - 1);
        if (table[slot] < 0) {
            table[slot] = ng;
            groups[ng].first = r;
            groups[ng].dense = 1;
            ng++;
        }
        gid[r] = table[slot];
        groups[gid[r]].count++;
    }
    PyMem_Free(table);
    *out = groups;
    return ng;
}

/* Fill each group's records and units (second pass). */
static void fill(const struct cols *c, int64_t n, const int64_t *gid, struct group *groups)
{
    for (int64_t r = 0; r < n; r++) {
        struct group *g = &groups[gid[r]];
        int64_t k = g->fill++;
        int64_t phys = c->base + c->pos[r];
        int64_t end = phys + c->size[r];
        if ((__int128)c->queue_offset[r] != (__int128)c->queue_offset[g->first] + k ||
            (k > 0 && end <= g->last_end))
            g->dense = 0;
        g->last_end = end;
        ((int32_t *)PyBytes_AS_STRING(g->records))[k] = (int32_t)r;
        uint8_t *u = (uint8_t *)PyBytes_AS_STRING(g->units) + k * MQS_CQ_UNIT;
        mqs_wr64(u, (uint64_t)phys);
        mqs_wr32(u + 8, (uint32_t)c->size[r]);
        mqs_wr64(u + 12, (uint64_t)c->tags[r]);
    }
}

static PyObject *build(const struct cols *c, int64_t n)
{
    int64_t *gid = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *gid);
    if (gid == NULL)
        return PyErr_NoMemory();
    struct group *groups = NULL;
    int64_t ng = assign(c, n, gid, &groups);
    PyObject *out = NULL;
    if (ng < 0)
        goto done;
    for (int64_t g = 0; g < ng; g++) {
        groups[g].records = PyBytes_FromStringAndSize(NULL, groups[g].count * 4);
        groups[g].units = PyBytes_FromStringAndSize(NULL, groups[g].count * MQS_CQ_UNIT);
        if (groups[g].records == NULL || groups[g].units == NULL)
            goto done;
    }
    fill(c, n, gid, groups);
    out = PyList_New(ng);
    for (int64_t g = 0; out != NULL && g < ng; g++) {
        struct group *gr = &groups[g];
        PyObject *t = Py_BuildValue(
            "(y#iLOOO)", (const char *)c->buf + c->topic_pos[gr->first],
            (Py_ssize_t)c->topic_len[gr->first], c->queue_id[gr->first],
            (long long)c->queue_offset[gr->first], gr->dense ? Py_True : Py_False, gr->records,
            gr->units);
        if (t == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, g, t);
    }
done:
    for (int64_t g = 0; groups != NULL && g < ng; g++) {
        Py_XDECREF(groups[g].records);
        Py_XDECREF(groups[g].units);
    }
    PyMem_Free(groups);
    PyMem_Free(gid);
    return out;
}

static int column(PyObject *o, const char *name, Py_ssize_t itemsize, Py_ssize_t n,
                  Py_buffer *v)
{
    if (mqs_arg_buffer(o, name, v) < 0)
        return -1;
    if (v->itemsize != itemsize || v->len / itemsize != n) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd items of %zd bytes", name, n,
                     itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

PyObject *mqs_py_group_units(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    static const char *names[] = {"topic_pos", "topic_len", "queue_id", "queue_offset",
                                  "pos",       "size",      "tags_code"};
    static const Py_ssize_t sizes[] = {8, 4, 4, 8, 8, 4, 8};
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "group_units(buf, topic_pos, topic_len, queue_id, "
                                         "queue_offset, pos, size, tags_code, base) takes 9 "
                                         "arguments");
        return NULL;
    }
    int64_t base;
    if (mqs_arg_i64(args[8], "base", &base) < 0)
        return NULL;
    if (base < 0) {
        PyErr_SetString(PyExc_ValueError, "base must not be negative");
        return NULL;
    }
    Py_buffer buf, v[7];
    if (mqs_arg_buffer(args[0], "buf", &buf) < 0)
        return NULL;
    Py_buffer first;
    if (mqs_arg_buffer(args[1], "topic_pos", &first) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_ssize_t n = first.itemsize == 8 ? first.len / 8 : -1;
    PyBuffer_Release(&first);
    int got = 0;
    PyObject *res = NULL;
    for (; got < 7; got++)
        if (column(args[1 + got], names[got], sizes[got], n < 0 ? 0 : n, &v[got]) < 0)
            goto out;
    struct cols c = {buf.buf, buf.len, v[0].buf, v[3].buf, v[4].buf, v[6].buf,
                     v[1].buf, v[2].buf, v[5].buf, base};
    for (Py_ssize_t r = 0; r < n; r++) {
        if (c.topic_pos[r] < 0 || c.topic_len[r] < 0 ||
            c.topic_pos[r] > buf.len - c.topic_len[r] || c.pos[r] < 0 ||
            base > INT64_MAX - c.pos[r] - INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "a topic span or position is out of range");
            goto out;
        }
    }
    res = build(&c, n);
out:
    while (got-- > 0)
        PyBuffer_Release(&v[got]);
    PyBuffer_Release(&buf);
    return res;
}

/* --- recovery's walks (engine.consumequeue_files.valid_units_py, zero_tail_py) ------- */


int64_t mqs_cq_valid_units(const uint8_t *units, int64_t n, int64_t *last_real)
{
    int64_t last = -1, i = 0;
    for (; i < n; i++) {
        struct mqs_unit u = mqs_unit_at(units, i);
        if (u.phys < 0 || u.size <= 0)
            break;
        if (u.size != MQS_PRE_BLANK_SIZE)
            last = i;
    }
    *last_real = last;
    return i;
}

int64_t mqs_zero_tail(const uint8_t *buf, int64_t start, int64_t len)
{
    int64_t end = len;
    /* bytes down to an 8-byte boundary, then 64-byte blocks, then words, then bytes */
    while (end > start && ((uintptr_t)(buf + end) & 7u) != 0) {
        if (buf[end - 1] != 0)
            return end;
        end--;
    }
    while (end - start >= 64) {
        uint64_t w[8], any = 0;
        memcpy(w, buf + end - 64, sizeof w);
        for (int k = 0; k < 8; k++)
            any |= w[k];
        if (any != 0)
            break;
        end -= 64;
    }
    while (end - start >= 8) {
        uint64_t w;
        memcpy(&w, buf + end - 8, sizeof w);
        if (w != 0)
            break;
        end -= 8;
    }
    while (end > start && buf[end - 1] == 0)
        end--;
    return end;
}

PyObject *mqs_py_valid_units(PyObject *Py_UNUSED(m), PyObject *arg)
{
    Py_buffer units;
    if (mqs_arg_buffer(arg, "units", &units) < 0)
        return NULL;
    if (units.len % MQS_CQ_UNIT != 0) {
        PyErr_Format(PyExc_ValueError, "units holds %zd bytes, not whole 20-byte units",
                     units.len);
        PyBuffer_Release(&units);
        return NULL;
    }
    int64_t count, last;
    Py_BEGIN_ALLOW_THREADS count = mqs_cq_valid_units(units.buf, (int64_t)units.len / MQS_CQ_UNIT, &last);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&units);
    return Py_BuildValue("LL", (long long)count, (long long)last);
}

PyObject *mqs_py_zero_tail(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "zero_tail takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    int64_t start;
    if (mqs_arg_i64(args[1], "start", &start) < 0)
        return NULL;
    Py_buffer buf;
    if (mqs_arg_buffer(args[0], "buf", &buf) < 0)
        return NULL;
    if (start < 0 || start > (int64_t)buf.len) {
        PyErr_Format(PyExc_ValueError, "start %lld is outside the buffer of %zd bytes",
                     (long long)start, buf.len);
        PyBuffer_Release(&buf);
        return NULL;
    }
    int64_t end;
    Py_BEGIN_ALLOW_THREADS end = mqs_zero_tail(buf.buf, start, (int64_t)buf.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromLongLong((long long)end);
}
