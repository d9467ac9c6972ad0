/* The dispatcher's plain round in one call (issue 23): scan a segment's records, and when
 * every one of them is a message (or a filler without keys) that continues a queue the
 * caller has handed over (a "cursor") and the index does not hold its first record yet,
 * write the consume-queue units (a pre-blank for a filler) and index entries of a prefix
 * of them, the same bytes engine.dispatch's Python path writes
 * (tests/native/test_dispatch_round_diff.py compares the two, store directory against
 * store directory). The prefix is every record, or ends before the first record whose
 * queue's last file is full, or with the record whose keys fill the index's last file:
 * the call then says which (the cursor, or the keys that did not fit) and the caller
 * makes the next file and calls again from the next record. Anything else -- a PREPARED /
 * ROLLBACK part, a negative queue id, a filler with keys, a queue without a cursor (new,
 * bad or deleted topic), units that do not continue their queue exactly, a first record
 * indexed already, a scan fix-up -- is declined before any byte is written: the call
 * answers None and the caller dispatches the batch its own way.
 *
 * `cursors` maps (topic bytes, queue id) to the ConsumeQueue the caller lets this call
 * write (a good, live topic's queue). Per queue the call reads seg = cq.queue.last(),
 * seg.wrote_position, seg.size_bytes, seg.start_offset, seg.target and
 * cq.max_physical_offset, and after writing sets seg.wrote_position and
 * cq.max_physical_offset as Segment.append_bytes and ConsumeQueue.append_units do. */
#include "mqs_dispatch_round.h"

#include <stdint.h>
#include <string.h>

#include "mqs_args.h"
#include "mqs_be.h"
#include "mqs_cq.h"
#include "mqs_index.h"
#include "mqs_scan.h"

#define MAX_BUCKETS 64
#define INDEX_HEADER 40

static PyObject *s_wrote, *s_size, *s_start, *s_target, *s_maxphys, *s_queue, *s_last;

static int intern_names(void)
{
    if (s_wrote != NULL)
        return 0;
    s_wrote = PyUnicode_InternFromString("wrote_position");
    s_size = PyUnicode_InternFromString("size_bytes");
    s_start = PyUnicode_InternFromString("start_offset");
    s_target = PyUnicode_InternFromString("target");
    s_maxphys = PyUnicode_InternFromString("max_physical_offset");
    s_queue = PyUnicode_InternFromString("queue");
    s_last = PyUnicode_InternFromString("last");
    if (!s_wrote || !s_size || !s_start || !s_target || !s_maxphys || !s_queue || !s_last) {
        Py_CLEAR(s_wrote);
        return -1;
    }
    return 0;
}

/* A queue of the batch: its records in log order and its cursor's state. */
struct rq {
    int64_t first;     /* the first record of the queue in the batch */
    int64_t count, last;
    PyObject *cq;  /* from the cursors, owned */
    PyObject *seg; /* cq.queue.last(), owned */
    Py_buffer target;
    int held;
    int64_t wrote, size_bytes, start, maxphys;
    int64_t room;    /* units its last file still takes */
    int64_t written; /* units of the batch written */
};

static int64_t attr_i64(PyObject *o, PyObject *name, int *err)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) {
        *err = 1;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        *err = 1;
    return (int64_t)x;
}

static int set_i64(PyObject *o, PyObject *name, int64_t x)
{
    PyObject *v = PyLong_FromLongLong((long long)x);
    if (v == NULL)
        return -1;
    int rc = PyObject_SetAttr(o, name, v);
    Py_DECREF(v);
    return rc;
}

struct batch {
    const uint8_t *buf;
    const int64_t *pos, *qo, *tpos, *tags, *ts;
    const int32_t *size, *qid, *tlen;
    int64_t base, n;
    const uint8_t *bits;
    const int32_t *key_first;
};

static uint64_t rec_hash(const struct batch *b, int64_t r)
{
    return mqs_queue_key_hash(b->qid[r], b->buf + b->tpos[r], b->tlen[r]);
}

static int same_queue(const struct batch *b, int64_t x, int64_t y)
{
    return mqs_same_queue_key(b->qid[x], b->buf + b->tpos[x], b->tlen[x], b->qid[y],
                              b->buf + b->tpos[y], b->tlen[y]);
}

/* Group ids per record; returns the number of queues or -1 (MemoryError set). */
static int64_t group(const struct batch *b, int64_t *gid, struct rq *qs)
{
    int64_t cap = 16;
    while (cap < 2 * b->n)
        cap *= 2;
    int64_t *table = PyMem_Malloc((size_t)cap * sizeof *table);
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int64_t i = 0; i < cap; i++)
        table[i] = -1;
    int64_t ng = 0;
    for (int64_t r = 0; r < b->n; r++) {
        uint64_t slot = rec_hash(b, r) & (uint64_t)(cap - 1);
        while (table[slot] >= 0 && !same_queue(b, qs[table[slot]].first, r))
            slot = (slot + 1) & (uint64_t)(cap - 1);
        if (table[slot] < 0) {
            table[slot] = ng;
            qs[ng].first = r;
            ng++;
        }
        gid[r] = table[slot];
        qs[gid[r]].count++;
    }
    PyMem_Free(table);
    return ng;
}

/* Look up queue q's cursor and check its units fit its last file.
 * 1: they do (target held); 0: decline; -1: error set. */
static int take_cursor(const struct batch *b, PyObject *cursors, struct rq *q)
{
    int64_t f = q->first;
    PyObject *key = Py_BuildValue("(y#i)", (const char *)b->buf + b->tpos[f],
                                  (Py_ssize_t)b->tlen[f], b->qid[f]);
    if (key == NULL)
        return -1;
    PyObject *cur = PyDict_GetItemWithError(cursors, key);
    Py_DECREF(key);
    if (cur == NULL)
        return PyErr_Occurred() ? -1 : 0;
    q->cq = Py_NewRef(cur); /* the lookups below run Python code */
    PyObject *queue = PyObject_GetAttr(cur, s_queue);
    if (queue == NULL)
        return -1;
    q->seg = PyObject_CallMethodNoArgs(queue, s_last);
    Py_DECREF(queue);
    if (q->seg == NULL)
        return -1;
    if (q->seg == Py_None)
        return 0; /* no file yet: the first unit makes it (`ConsumeQueue.put`) */
    int err = 0;
    q->wrote = attr_i64(q->seg, s_wrote, &err);
    q->size_bytes = attr_i64(q->seg, s_size, &err);
    q->start = attr_i64(q->seg, s_start, &err);
    q->maxphys = attr_i64(q->cq, s_maxphys, &err);
    if (err)
        return -1;
    if (q->wrote < 0 || q->start < 0 || q->wrote > q->size_bytes ||
        (q->start + q->wrote) % MQS_CQ_UNIT)
        return 0;
    q->room = (q->size_bytes - q->wrote) / MQS_CQ_UNIT;
    PyObject *t = PyObject_GetAttr(q->seg, s_target);
    if (t == NULL)
        return -1;
    int rc = mqs_arg_wbuffer(t, "target", &q->target);
    Py_DECREF(t);
    if (rc < 0)
        return -1;
    q->held = 1;
    if (q->target.len < q->size_bytes) {
        PyErr_SetString(PyExc_ValueError, "a segment's target is smaller than its size");
        return -1;
    }
    return 1;
}

/* Whether every queue's units continue it exactly, as ConsumeQueue.put_units writes
 * them with a status OK each: the queue's next offset first, then one more each; a
 * message's commit-log end past the queue's own end (that of its last message: a filler's
 * pre-blank leaves it), a filler without keys (`put_pre_blank`; the index skips it).
 * Uses each queue's count / last as scratch. */
static int continues(const struct batch *b, const int64_t *gid, struct rq *qs, int64_t ng)
{
    int ok = 1;
    for (int64_t g = 0; g < ng; g++) {
        qs[g].count = 0; /* records seen so far */
        qs[g].last = -1; /* the last message (not filler) seen */
    }
    for (int64_t r = 0; r < b->n && ok; r++) {
        struct rq *q = &qs[gid[r]];
        int64_t next = (q->start + q->wrote) / MQS_CQ_UNIT + q->count;
        if (b->qo[r] != next)
            ok = 0;
        else if (b->bits[r] & MQS_BIT_FILLER) {
            if (b->key_first[r + 1] > b->key_first[r])
                ok = 0;
        } else {
            int64_t end = q->last >= 0 ? b->base + b->pos[q->last] + b->size[q->last] : q->maxphys;
            if (b->base + b->pos[r] + b->size[r] <= end)
                ok = 0;
            q->last = r;
        }
        q->count++;
    }
    return ok;
}

/* Whether the index's last file may take keys of the batch: none of its records was
 * indexed already (IndexService.build_index_batch's skip). *room: the entries it still
 * takes (the keys past them wait for the caller's roll). 1 yes (buffer held in *v),
 * 0 decline, -1 error. */
static int take_index(const struct batch *b, PyObject *index, Py_buffer *v, int64_t *slots,
                      int64_t *entries, int64_t *room)
{
    PyObject *mm;
    long long sl, en;
    if (!PyArg_ParseTuple(index, "OLL:index", &mm, &sl, &en))
        return -1;
    if (sl <= 0 || sl > INT32_MAX || en <= 0 || en > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "hash_slot_num and index_num must be in [1, 2^31)");
        return -1;
    }
    if (mqs_arg_wbuffer(mm, "index", v) < 0)
        return -1;
    if (v->len < INDEX_HEADER + sl * 4 + en * 20) {
        PyBuffer_Release(v);
        PyErr_SetString(PyExc_ValueError, "index is smaller than the index file's geometry");
        return -1;
    }
    const uint8_t *f = v->buf;
    int64_t end_ts = mqs_rd64(f + 8), end_phy = mqs_rd64(f + 24);
    int32_t count = (int32_t)mqs_rd32(f + 36);
    int64_t first = b->base + b->pos[0];
    if (count < 0 || count > en || first < end_phy || (first == end_phy && end_ts > 0)) {
        PyBuffer_Release(v);
        return 0;
    }
    *room = en - count;
    *slots = sl;
    *entries = en;
    return 1;
}

static PyObject *lag_counts(const int64_t *hist, int nbuckets)
{
    PyObject *t = PyTuple_New(nbuckets);
    for (int i = 0; t != NULL && i < nbuckets; i++) {
        PyObject *c = PyLong_FromLongLong((long long)hist[i]);
        if (c == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, c);
    }
    return t;
}

/* Write the units of the batch's first k records, record by record in log order (so that
 * a kill leaves them a prefix of the log); then the cursors' objects of the queues written.
 * -1: error set. */
static int write_units(const struct batch *b, const int64_t *gid, struct rq *qs, int64_t ng,
                       int64_t k, PyObject *touched)
{
    for (int64_t r = 0; r < k; r++) {
        struct rq *q = &qs[gid[r]];
        uint8_t *u = (uint8_t *)q->target.buf + q->wrote;
        int64_t phys = b->base + b->pos[r];
        if (b->bits[r] & MQS_BIT_FILLER) { /* a pre-blank: (0, Integer.MAX_VALUE, 0) */
            mqs_wr64(u, 0);
            mqs_wr32(u + 8, (uint32_t)MQS_PRE_BLANK_SIZE);
            mqs_wr64(u + 12, 0);
        } else {
            mqs_wr64(u, (uint64_t)phys);
            mqs_wr32(u + 8, (uint32_t)b->size[r]);
            mqs_wr64(u + 12, (uint64_t)b->tags[r]);
            q->maxphys = phys + b->size[r];
        }
        q->wrote += MQS_CQ_UNIT;
        q->written++;
    }
    for (int64_t g = 0; g < ng; g++) {
        if (!qs[g].written)
            continue;
        if (set_i64(qs[g].seg, s_wrote, qs[g].wrote) < 0 ||
            set_i64(qs[g].cq, s_maxphys, qs[g].maxphys) < 0)
            return -1;
        if (touched != Py_None && PySet_Add(touched, qs[g].cq) < 0)
            return -1;
    }
    return 0;
}

/* The first record whose unit its queue's last file has no room for (n: none). */
static int64_t first_without_room(const struct batch *b, const int64_t *gid, struct rq *qs)
{
    for (int64_t r = 0; r < b->n; r++) {
        struct rq *q = &qs[gid[r]];
        if (q->room == 0)
            return r;
        q->room--;
    }
    return b->n;
}

PyObject *mqs_py_plain_round(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError,
                        "plain_round(buf, base, pos, limit, max_records, delay_ms, cursors, "
                        "index, now_ms, buckets, touched) takes 11 arguments");
        return NULL;
    }
    if (intern_names() < 0)
        return NULL;
    int64_t base, pos, limit, max_records, now_ms, buckets;
    if (mqs_arg_i64(args[1], "base", &base) < 0 || mqs_arg_i64(args[2], "pos", &pos) < 0 ||
        mqs_arg_i64(args[3], "limit", &limit) < 0 ||
        mqs_arg_i64(args[4], "max_records", &max_records) < 0 ||
        mqs_arg_i64(args[8], "now_ms", &now_ms) < 0 ||
        mqs_arg_i64(args[9], "buckets", &buckets) < 0)
        return NULL;
    PyObject *cursors = args[6], *index = args[7], *touched = args[10];
    if (!PyDict_Check(cursors)) {
        PyErr_SetString(PyExc_TypeError, "cursors must be a dict");
        return NULL;
    }
    if (index != Py_None && !PyTuple_Check(index)) {
        PyErr_SetString(PyExc_TypeError,
                        "index must be None, () or (buffer, slots, entries)");
        return NULL;
    }
    if (touched != Py_None && !PySet_Check(touched)) {
        PyErr_SetString(PyExc_TypeError, "touched must be a set or None");
        return NULL;
    }
    if (pos < 0 || base < 0 || base > INT64_MAX / 2) {
        /* (a log offset; half the range leaves base + pos + size no way to overflow) */
        PyErr_SetString(PyExc_ValueError, "pos must not be negative, base must be in [0, 2^62]");
        return NULL;
    }
    if (buckets < 0 || buckets > MAX_BUCKETS) {
        PyErr_Format(PyExc_ValueError, "buckets must be from 0 to %d", MAX_BUCKETS);
        return NULL;
    }
    int64_t delays[64];
    int32_t ndelay = 0;
    if (args[5] != Py_None) {
        Py_buffer d;
        if (mqs_arg_buffer(args[5], "delay_ms", &d) < 0)
            return NULL;
        if (d.len % 8 != 0 || d.len < 8 || d.len > (Py_ssize_t)sizeof(delays)) {
            PyBuffer_Release(&d);
            PyErr_SetString(PyExc_ValueError, "delay_ms must hold 1 to 64 int64 values");
            return NULL;
        }
        memcpy(delays, d.buf, (size_t)d.len);
        ndelay = (int32_t)(d.len / 8);
        PyBuffer_Release(&d);
    }
    Py_buffer v;
    if (mqs_arg_buffer(args[0], "buf", &v) < 0)
        return NULL;
    int64_t end = limit < 0 || limit > v.len ? (int64_t)v.len : limit;
    struct mqs_scan s = {0};
    if (ndelay > 0) {
        s.delay_ms = delays;
        s.ndelay = ndelay;
    }
    PyObject *out = NULL;
    int64_t *gid = NULL;
    struct rq *qs = NULL;
    int64_t ng = 0;
    PyObject *more = NULL; /* what the caller does before the next call (owned) */
    Py_buffer iv;
    int index_held = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = mqs_scan_run(&s, v.buf, pos, end, 0, max_records);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t n = s.count;
    int64_t hist[MAX_BUCKETS] = {0};
    struct mqs_summary sm = {0};
    if (n > 0)
        mqs_scan_summary(s.col[MQS_COL_STORE_TIMESTAMP], s.col[MQS_COL_BITS],
                         s.col[MQS_COL_SYS_FLAG], s.col[MQS_COL_QUEUE_ID], n, now_ms, hist,
                         (int)buckets, &sm);
    if (s.nfixup > 0 || (sm.flags & ~MQS_SUMMARY_FILLER) || sm.sum_hi) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    struct batch b = {
        v.buf, s.col[MQS_COL_POS], s.col[MQS_COL_QUEUE_OFFSET], s.col[MQS_COL_TOPIC_POS],
        s.col[MQS_COL_TAGS_CODE], s.col[MQS_COL_STORE_TIMESTAMP], s.col[MQS_COL_SIZE],
        s.col[MQS_COL_QUEUE_ID], s.col[MQS_COL_TOPIC_LEN], base, n, s.col[MQS_COL_BITS],
        s.key_first,
    };
    int64_t nkeys = n > 0 ? s.key_first[n] : 0;
    int64_t slots = 0, entries = 0, key_room = 0;
    int64_t k = n;              /* records taken: a prefix of the batch */
    int64_t key_next = nkeys;   /* the first key not put (k's record's keys wait past it) */
    if (n > 0) {
        gid = PyMem_Malloc((size_t)n * sizeof *gid);
        qs = PyMem_Calloc((size_t)n, sizeof *qs);
        if (gid == NULL || qs == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        ng = group(&b, gid, qs);
        if (ng < 0)
            goto done;
        for (int64_t g = 0; g < ng; g++) {
            int got = take_cursor(&b, cursors, &qs[g]);
            if (got < 0)
                goto done;
            if (got == 0) {
                out = Py_NewRef(Py_None);
                goto done;
            }
        }
        if (!continues(&b, gid, qs, ng)) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        /* (): the index has no file yet; the first key makes it (the caller) */
        int no_file = index != Py_None && PyTuple_GET_SIZE(index) == 0;
        if (index != Py_None && !no_file && nkeys > 0) {
            int got = take_index(&b, index, &iv, &slots, &entries, &key_room);
            if (got < 0)
                goto done;
            if (got == 0) {
                out = Py_NewRef(Py_None);
                goto done;
            }
            index_held = 1;
        }
        /* The prefix to take: up to the first record whose unit needs the next file of
         * its queue (taken by the next call, after the caller's roll), or through the
         * first record whose keys fill the index file (the caller rolls it and puts the
         * keys that did not fit), or, with no index file yet, up to the first record
         * with keys (the caller makes the file). Whichever comes first. */
        int64_t kq = first_without_room(&b, gid, qs);
        int64_t ki = n, kf = n;
        if (index_held)
            for (ki = 0; ki < n && s.key_first[ki + 1] <= key_room; ki++)
                ;
        if (no_file)
            for (kf = 0; kf < n && s.key_first[kf + 1] == 0; kf++)
                ;
        k = kq <= ki ? kq : ki + 1;
        if (kf < k) {
            k = kf;
            more = Py_NewRef(Py_True);
        }
        if (write_units(&b, gid, qs, ng, k, touched) < 0)
            goto done;
        if (index_held && k > 0) {
            struct mqs_index_batch ib = {iv.buf, slots, entries, s.key_first, s.key_hash,
                                         b.pos, b.ts, base};
            const char *err = NULL;
            key_next = mqs_index_put_keys(&ib, 0, k, 0, &err);
            if (key_next < 0) {
                PyErr_SetString(PyExc_ValueError, err);
                goto done;
            }
        }
        if (more != NULL) { /* the first index file */
        } else if (kq <= ki) {
            if (kq < n)
                more = Py_NewRef(qs[gid[kq]].cq);
            key_next = s.key_first[k];
        } else if (key_next < s.key_first[k]) {
            int64_t r = k - 1;
            more = Py_BuildValue("(y#LL)", (const char *)(s.key_hash + key_next),
                                 (Py_ssize_t)((s.key_first[k] - key_next) * 4),
                                 (long long)(base + b.pos[r]), (long long)b.ts[r]);
            if (more == NULL)
                goto done;
        }
        if (k < n) { /* the lag of the records taken only (no overflow: ages are >= 0) */
            memset(hist, 0, sizeof hist);
            mqs_scan_summary(s.col[MQS_COL_STORE_TIMESTAMP], s.col[MQS_COL_BITS],
                             s.col[MQS_COL_SYS_FLAG], s.col[MQS_COL_QUEUE_ID], k, now_ms, hist,
                             (int)buckets, &sm);
        }
    }
    PyObject *counts = lag_counts(hist, (int)buckets);
    if (counts == NULL)
        goto done;
    int64_t last = k - 1, fillers = 0; /* the last message taken (not a filler) */
    for (int64_t r = 0; r < k; r++)
        fillers += (b.bits[r] & MQS_BIT_FILLER) != 0;
    while (last >= 0 && (b.bits[last] & MQS_BIT_FILLER))
        last--;
    int stop = k == n ? s.stop : -1;
    int64_t stop_pos = k == n ? s.stop_pos : b.pos[k];
    out = Py_BuildValue("(LiLLLKNOL)", (long long)k, stop, (long long)stop_pos,
                        (long long)(index == Py_None || n == 0 ? 0 : s.key_first[k]),
                        (long long)(last >= 0 ? b.ts[last] : -1), (unsigned long long)sm.sum_lo,
                        counts, more ? more : Py_None, (long long)fillers);
done:
    Py_XDECREF(more);
    if (index_held)
        PyBuffer_Release(&iv);
    for (int64_t g = 0; qs != NULL && g < ng; g++)
        if (qs[g].held)
            PyBuffer_Release(&qs[g].target);
    for (int64_t g = 0; qs != NULL && g < ng; g++) {
        Py_XDECREF(qs[g].seg);
        Py_XDECREF(qs[g].cq);
    }
    PyMem_Free(qs);
    PyMem_Free(gid);
    mqs_scan_free(&s);
    PyBuffer_Release(&v);
    return out;
}
