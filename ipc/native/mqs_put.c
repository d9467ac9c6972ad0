/* The common-case put in one C call; its Python reference is ipc/client.py's general
 * path (`StoreClient._put_general`: `_prepare`, `_reserve`, `_copy`, `_record`), and
 * tests/native/test_put_message.py compares the two record by record.
 *
 * The fast path accepts exactly what the general path would accept without a doubt:
 * exact str / bytes / int types, no properties mapping, a topic and tags the client
 * already validated (its lanes, below), keys that need no check beyond the separators.
 * For everything else it returns None before touching anything, and the general path
 * answers with its own statuses and messages (ipc.accepts).
 *
 * A lane (ipc/client.py: `_Lane`) is a list the client builds per topic:
 *   [topic bytes, queue count, round-robin modulus, round-robin counter,
 *    queue-table row per queue id (-1 unknown), {tags or None: properties bytes}] */
#include "mqs_put.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#include "mqs_args.h"
#include "mqs_layout.h"

enum { L_TOPIC, L_QUEUES, L_RR_N, L_RR, L_QSLOTS, L_HEADS, LANE_FIELDS };
#define MQS_CLIENTS_OFF 4096 /* ipc/control.py: client statistics rows */
#define STATS_EVERY 256 /* fast puts between two copies of the row into the control block */

static unsigned fork_gen; /* bumped in a forked child: its appenders are its parent's */

static void after_fork_in_child(void)
{
    fork_gen++;
}

/* ---- PutLock: the client's thread lock -------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    int locked;
} PutLock;

static int putlock_init(PutLock *self, PyObject *args, PyObject *kw)
{
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "PutLock() takes no arguments");
        return -1;
    }
    if (self->lock == NULL && (self->lock = PyThread_allocate_lock()) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void putlock_dealloc(PutLock *self)
{
    if (self->lock) {
        if (self->locked)
            PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int putlock_try(PutLock *self)
{
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK))
        return 0;
    self->locked = 1;
    return 1;
}

static void putlock_release_held(PutLock *self)
{
    self->locked = 0;
    PyThread_release_lock(self->lock);
}

static PyObject *putlock_acquire(PutLock *self, PyObject *Py_UNUSED(a))
{
    if (self->lock == NULL) {
        PyErr_SetString(PyExc_ValueError, "PutLock is not initialised");
        return NULL;
    }
    while (!putlock_try(self)) {
        PyLockStatus r;
        Py_BEGIN_ALLOW_THREADS r = PyThread_acquire_lock_timed(self->lock, -1, 1);
        Py_END_ALLOW_THREADS
        if (r == PY_LOCK_ACQUIRED) {
            self->locked = 1;
            break;
        }
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *putlock_release(PutLock *self, PyObject *Py_UNUSED(a))
{
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    putlock_release_held(self);
    Py_RETURN_NONE;
}

static PyObject *putlock_exit(PutLock *self, PyObject *Py_UNUSED(args))
{
    PyObject *r = putlock_release(self, NULL);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *putlock_locked(PutLock *self, PyObject *Py_UNUSED(a))
{
    return PyBool_FromLong(self->locked);
}

static PyMethodDef putlock_methods[] = {
    {"acquire", (PyCFunction)putlock_acquire, METH_NOARGS, "Wait for the lock (GIL released)."},
    {"release", (PyCFunction)putlock_release, METH_NOARGS, "Release it."},
    {"locked", (PyCFunction)putlock_locked, METH_NOARGS, "Whether a thread holds it."},
    {"__enter__", (PyCFunction)putlock_acquire, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)putlock_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PutLockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mqstore._native.PutLock",
    .tp_basicsize = sizeof(PutLock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PutLock(): a client's thread lock (threading.Lock's acquire, release and "
              "with), which the C put also takes, without a call into Python.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)putlock_init,
    .tp_dealloc = (destructor)putlock_dealloc,
    .tp_methods = putlock_methods,
};

/* The field names of a batch's dicts, interned once. */
static PyObject *field_names[6];

int mqs_put_ready(void)
{
    static const char *names[6] = {"topic", "body", "tags", "keys", "properties", "queue_id"};
    for (int i = 0; i < 6; i++)
        if (field_names[i] == NULL && (field_names[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return -1;
    static int registered;
    if (!registered && pthread_atfork(NULL, NULL, after_fork_in_child) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
        return -1;
    }
    registered = 1;
    return PyType_Ready(&PutLockType);
}

int mqs_put_add(PyObject *m)
{
    return PyModule_AddObjectRef(m, "PutLock", (PyObject *)&PutLockType);
}

/* ---- configuration ------------------------------------------------------------------ */

void mqs_put_clear(Appender *self)
{
    struct mqs_client *c = &self->c;
    if (c->configured)
        PyBuffer_Release(&c->stats);
    Py_CLEAR(c->lock);
    Py_CLEAR(c->lanes);
    Py_CLEAR(c->result_type);
    for (int i = 0; i < 3; i++)
        Py_CLEAR(c->outcomes[i]);
    Py_CLEAR(c->msg_id_prefix);
    Py_CLEAR(c->target);
    c->configured = 0;
}

static int outcome_ok(PyObject *o)
{
    return PyTuple_CheckExact(o) && PyTuple_GET_SIZE(o) == 3 && PyLong_CheckExact(PyTuple_GET_ITEM(o, 1)) &&
           PyLong_AsLong(PyTuple_GET_ITEM(o, 1)) >= 0 &&
           PyLong_AsLong(PyTuple_GET_ITEM(o, 1)) < MQS_CF_HIST - MQS_CF_STATUS &&
           PyUnicode_CheckExact(PyTuple_GET_ITEM(o, 2));
}

PyObject *mqs_put_configure(Appender *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"lock", "lanes", "stats", "stats_off", "result_type", "outcomes",
                             "msg_id_prefix", "sync", "sync_timeout_ns", "busy_ns", "max_body",
                             "store_addr", "store_port", NULL};
    PyObject *lock, *lanes, *stats, *rtype, *outcomes, *prefix, *store_addr, *store_port;
    int64_t stats_off, sync_timeout_ns, busy_ns, max_body;
    int sync;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!OLO!O!UpLLLOO:configure", kwlist,
                                     &PutLockType, &lock, &PyDict_Type, &lanes, &stats,
                                     &stats_off, &PyType_Type, &rtype, &PyTuple_Type, &outcomes,
                                     &prefix, &sync, &sync_timeout_ns, &busy_ns, &max_body,
                                     &store_addr, &store_port))
        return NULL;
    if (!self->open) {
        PyErr_SetString(PyExc_ValueError, "the appender is closed");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)rtype, &PyTuple_Type) || !PyUnicode_IS_ASCII(prefix) ||
        PyTuple_GET_SIZE(outcomes) != 3 || !outcome_ok(PyTuple_GET_ITEM(outcomes, 0)) ||
        !outcome_ok(PyTuple_GET_ITEM(outcomes, 1)) || !outcome_ok(PyTuple_GET_ITEM(outcomes, 2))) {
        PyErr_SetString(PyExc_ValueError, "result_type must be a tuple type, msg_id_prefix "
                                          "ASCII, outcomes three (status, index, reason)");
        return NULL;
    }
    if (stats_off < MQS_CLIENTS_OFF || stats_off + MQS_CLIENT_FIELDS * 8 > MQS_SLOTS_OFF) {
        PyErr_SetString(PyExc_ValueError, "stats_off is not a client row of the control block");
        return NULL;
    }
    struct mqs_host store;
    const uint8_t *addr;
    size_t len;
    if (mqs_arg_bytes(store_addr, "store_addr", &addr, &len) < 0)
        return NULL;
    if (len != 4 && len != 16) {
        PyErr_SetString(PyExc_ValueError, "store_addr must be 4 or 16 bytes");
        return NULL;
    }
    if (mqs_arg_i32(store_port, "store_port", &store.port) < 0)
        return NULL;
    Py_buffer view;
    if (mqs_arg_wbuffer(stats, "stats", &view) < 0)
        return NULL;
    if (view.len != MQS_CLIENT_FIELDS * 8 || ((uintptr_t)view.buf & 7)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "stats must be an array('q') of CLIENT_FIELDS");
        return NULL;
    }
    mqs_put_clear(self);
    struct mqs_client *c = &self->c;
    c->stats = view;
    c->lock = Py_NewRef(lock);
    c->lanes = Py_NewRef(lanes);
    c->result_type = Py_NewRef(rtype);
    for (int i = 0; i < 3; i++)
        c->outcomes[i] = Py_NewRef(PyTuple_GET_ITEM(outcomes, i));
    c->msg_id_prefix = Py_NewRef(prefix);
    memcpy(c->store_addr, addr, len);
    c->store.addr = c->store_addr;
    c->store.addr_len = (int)len;
    c->store.port = store.port;
    c->stats_off = stats_off;
    c->sync = sync;
    c->sync_timeout_ns = sync_timeout_ns;
    c->busy_ns = busy_ns;
    c->max_body = max_body;
    c->target_index = -2;
    c->stale_at_ns = 0;
    c->since_stats = 0;
    c->fork_gen = fork_gen;
    c->configured = 1;
    Py_RETURN_NONE;
}

PyObject *mqs_put_set_target(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t index;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_target(mapping, index) takes 2 arguments");
        return NULL;
    }
    if (mqs_arg_i64(args[1], "index", &index) < 0)
        return NULL;
    Py_XSETREF(self->c.target, args[0] == Py_None ? NULL : Py_NewRef(args[0]));
    self->c.target_index = self->c.target ? index : -2;
    Py_RETURN_NONE;
}

PyObject *mqs_put_checked(Appender *self, PyObject *arg)
{
    int64_t ns;
    if (mqs_arg_i64(arg, "stale_after_ns", &ns) < 0)
        return NULL;
    self->c.stale_at_ns = mqs_mono_ns() + ns;
    Py_RETURN_NONE;
}

/* ---- the put ------------------------------------------------------------------------ */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The offset message id: the store host's hex (the client's prefix) and the offset as
 * 16 upper-case hex digits, as `f"{prefix}{offset:016X}"`. */
static PyObject *msg_id(PyObject *prefix, int64_t off)
{
    static const char hex[] = "0123456789ABCDEF";
    Py_ssize_t n = PyUnicode_GET_LENGTH(prefix);
    PyObject *s = PyUnicode_New(n + 16, 127);
    if (s == NULL)
        return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(s);
    memcpy(d, PyUnicode_1BYTE_DATA(prefix), (size_t)n);
    for (int i = 15; i >= 0; i--, off = (int64_t)((uint64_t)off >> 4))
        d[n + i] = (Py_UCS1)hex[off & 15];
    return s;
}

/* PutResult(status, reason, msg_id, physical_offset, size, queue_id, queue_offset,
 * store_timestamp), made as tuple.__new__(PutResult, ...) makes it; `size` and `ts` are
 * borrowed (a batch shares them between its results). */
static PyObject *make_result(struct mqs_client *c, PyObject *outcome, int64_t start,
                             PyObject *size, int64_t qid, int64_t qo, PyObject *ts)
{
    PyTypeObject *t = (PyTypeObject *)c->result_type;
    PyObject *r = t->tp_alloc(t, 8);
    if (r == NULL)
        return NULL;
    PyObject *v[8] = {Py_NewRef(PyTuple_GET_ITEM(outcome, 0)),
                      Py_NewRef(PyTuple_GET_ITEM(outcome, 2)),
                      msg_id(c->msg_id_prefix, start),
                      PyLong_FromLongLong(start),
                      Py_NewRef(size),
                      PyLong_FromLongLong(qid),
                      PyLong_FromLongLong(qo),
                      Py_NewRef(ts)};
    int bad = 0;
    for (int i = 0; i < 8; i++) {
        bad |= v[i] == NULL;
        PyTuple_SET_ITEM(r, i, v[i]);
    }
    if (bad) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

static PyObject *result(struct mqs_client *c, PyObject *outcome, int64_t start, int64_t size,
                        int64_t qid, int64_t qo, int64_t ts)
{
    PyObject *size_o = PyLong_FromLongLong(size), *ts_o = PyLong_FromLongLong(ts), *r = NULL;
    if (size_o && ts_o)
        r = make_result(c, outcome, start, size_o, qid, qo, ts_o);
    Py_XDECREF(size_o);
    Py_XDECREF(ts_o);
    return r;
}

/* Count the put and copy the row into the control block every STATS_EVERY puts. */
static void count(Appender *self, const int64_t v[9])
{
    struct mqs_client *c = &self->c;
    mqs_count(c->stats.buf, v);
    if (++c->since_stats >= STATS_EVERY) {
        c->since_stats = 0;
        memcpy(self->a.ctl + c->stats_off, c->stats.buf, MQS_CLIENT_FIELDS * 8);
    }
}

/* A put's fields: topic, body, tags, keys, properties, queue_id (put's arguments). */
enum { F_TOPIC, F_BODY, F_TAGS, F_KEYS, F_PROPS, F_QID, FIELDS };

/* Whether the fields have the plain types the C put takes (else: the general path). */
static int plain(PyObject *const *f)
{
    return f[F_PROPS] == Py_None && PyUnicode_CheckExact(f[F_TOPIC]) &&
           PyBytes_CheckExact(f[F_BODY]) &&
           (f[F_TAGS] == Py_None || PyUnicode_CheckExact(f[F_TAGS])) &&
           (f[F_KEYS] == Py_None || PyUnicode_CheckExact(f[F_KEYS])) &&
           (f[F_QID] == Py_None || PyLong_CheckExact(f[F_QID]));
}

/* The round-robin counters a call moved, to put back when it leaves the put to the
 * general path (which counts again). */
struct undo {
    PyObject *lane, *rr; /* owned */
};

static void undo_release(struct undo *u, int n, int restore)
{
    for (int i = n - 1; i >= 0; i--) {
        if (restore)
            PyList_SetItem(u[i].lane, L_RR, Py_NewRef(u[i].rr));
        Py_DECREF(u[i].lane);
        Py_DECREF(u[i].rr);
    }
}

/* The last topic and tags objects a batch looked up, and what they gave (borrowed: the
 * lanes only change under the client's lock, in Python, and a batch's call holds the GIL
 * throughout; exact str keys run no Python code in a lookup). A batch's messages mostly
 * share them: a pointer compare instead of two dict lookups. */
struct lane_memo {
    PyObject *topic, *lane, *tags, *props;
};

/* The message from put's fields and its topic's lane, or 0 (take the general path). The
 * rules are `_prepare`'s and `_keyed_tail`'s, in their order. A queue id taken from
 * the round robin moves the lane's counter, recorded in `u` (*nu entries). */
static int message(Appender *self, PyObject *const *f, int64_t born, struct mqs_item *it,
                   struct undo *u, int *nu, struct lane_memo *memo)
{
    PyObject *tags = f[F_TAGS], *keys = f[F_KEYS], *qid_o = f[F_QID], *lane, *props;
    if (memo->topic == f[F_TOPIC]) {
        lane = memo->lane;
    } else {
        lane = PyDict_GetItemWithError(self->c.lanes, f[F_TOPIC]);
        if (lane == NULL || !PyList_CheckExact(lane) || PyList_GET_SIZE(lane) != LANE_FIELDS)
            return 0;
        PyObject **l = &PyList_GET_ITEM(lane, 0);
        if (!PyBytes_CheckExact(l[L_TOPIC]) || !PyList_CheckExact(l[L_QSLOTS]) ||
            !PyDict_CheckExact(l[L_HEADS]))
            return 0;
        *memo = (struct lane_memo){f[F_TOPIC], lane, NULL, NULL};
    }
    PyObject **l = &PyList_GET_ITEM(lane, 0);
    if (memo->props != NULL && memo->tags == tags) {
        props = memo->props;
    } else {
        props = PyDict_GetItemWithError(l[L_HEADS], tags);
        if (props == NULL || !PyBytes_CheckExact(props))
            return 0;
        memo->tags = tags;
        memo->props = props;
    }
    struct mqs_message *m = &it->msg;
    m->topic = (const uint8_t *)PyBytes_AS_STRING(l[L_TOPIC]);
    m->topic_len = (size_t)PyBytes_GET_SIZE(l[L_TOPIC]);
    m->props = (const uint8_t *)PyBytes_AS_STRING(props);
    m->props_len = (size_t)PyBytes_GET_SIZE(props);
    if (keys != Py_None) {
        Py_ssize_t klen;
        const char *k = PyUnicode_AsUTF8AndSize(keys, &klen);
        if (k == NULL || klen == 0 || memchr(k, 1, (size_t)klen) || memchr(k, 2, (size_t)klen))
            return 0; /* a lone surrogate, empty, a separator: the general path says so */
        m->keys = (const uint8_t *)k;
        m->keys_len = (size_t)klen;
    }
    if (mqs_props_len(m) > 32767)
        return 0;
    m->body = (const uint8_t *)PyBytes_AS_STRING(f[F_BODY]);
    m->body_len = (size_t)PyBytes_GET_SIZE(f[F_BODY]);
    if ((int64_t)m->body_len > self->c.max_body)
        return 0;
    long queues = PyLong_AsLong(l[L_QUEUES]);
    long long qid;
    if (qid_o == Py_None) {
        long n = PyLong_AsLong(l[L_RR_N]);
        long long rr = PyLong_AsLongLong(l[L_RR]);
        if (rr < 0)
            return 0;
        qid = n > 0 ? rr % n : 0;
        PyObject *next = PyLong_FromLongLong(rr + 1);
        if (next == NULL)
            return 0;
        u[*nu].lane = Py_NewRef(lane);
        u[*nu].rr = Py_NewRef(l[L_RR]);
        ++*nu;
        PyList_SetItem(lane, L_RR, next);
    } else {
        int overflow;
        qid = PyLong_AsLongLongAndOverflow(qid_o, &overflow);
        if (overflow)
            return 0;
    }
    if (PyErr_Occurred() || qid < 0 || qid >= queues || qid >= PyList_GET_SIZE(l[L_QSLOTS]))
        return 0;
    long qs = PyLong_AsLong(PyList_GET_ITEM(l[L_QSLOTS], (Py_ssize_t)qid));
    if (qs < 0 || qs > INT32_MAX)
        return 0;
    static const uint8_t loopback[4] = {127, 0, 0, 1};
    m->queue_id = (int32_t)qid;
    m->born.addr = loopback;
    m->born.addr_len = 4;
    m->store = self->c.store;
    m->born_timestamp = born;
    it->qslot = (int32_t)qs;
    it->takes_offset = 1;
    it->size = (int64_t)mqs_record_length(m);
    return it->size + MQS_END_FILE_MIN_BLANK <= self->a.seg_size;
}

/* Reserve and copy `n` messages, wait (sync), count: the outcome index (0 flushed or
 * not asked, 1 timed out, 2 failed), a code < 0 from the reservation lock, or -100 with
 * an exception set. The client's lock is held. */
static int put_items(Appender *self, struct mqs_item *items, int n, int sync, int64_t t0,
                     int64_t *qoffs, struct mqs_reservation *r)
{
    struct mqs_client *c = &self->c;
    int64_t waited = 0, total = 0;
    for (int i = 0; i < n; i++)
        total += items[i].size;
    int rc = mqs_append_items(self, c->target ? c->target : Py_None, c->target_index, items, n,
                              c->busy_ns, qoffs, r, &waited);
    if (rc != MQS_OK)
        return rc;
    int64_t t_copied = mqs_mono_ns(), t_done = t_copied;
    int outcome = 0;
    if (sync) {
        outcome = mqs_wait_flushed(self, r->start + total, c->sync_timeout_ns);
        if (outcome < 0)
            return -100;
        if (outcome == 3)
            return MQS_FENCED; /* the generation ended without flushing it */
        t_done = mqs_mono_ns();
    }
    int64_t v[9] = {n, total, PyLong_AsLong(PyTuple_GET_ITEM(c->outcomes[outcome], 1)),
                    outcome == 0, sync, t_done - t0, waited, t_copied - t0 - waited,
                    t_done - t_copied};
    count(self, v);
    return outcome;
}

/* Every code but an outcome: None (general path), the lock's code, or the exception. */
static PyObject *not_done(int rc)
{
    if (rc == -100)
        return NULL;
    if (PyErr_Occurred())
        PyErr_Clear();
    if (rc == MQS_FALLBACK)
        Py_RETURN_NONE;
    return PyLong_FromLong(rc);
}

static PyObject *put_locked(Appender *self, PyObject *const *f, int sync, int64_t t0)
{
    struct mqs_item it;
    struct mqs_reservation r;
    struct undo u[1];
    int nu = 0, rc = MQS_FALLBACK;
    int64_t qo;
    memset(&it, 0, sizeof it);
    struct lane_memo memo = {NULL, NULL, NULL, NULL};
    if (message(self, f, now_ms(), &it, u, &nu, &memo))
        rc = put_items(self, &it, 1, sync, t0, &qo, &r);
    undo_release(u, nu, rc == MQS_FALLBACK);
    if (rc < 0)
        return not_done(rc);
    return result(&self->c, self->c.outcomes[rc], r.start, it.size, it.msg.queue_id, qo,
                  r.store_ts);
}

PyObject *mqs_put_message(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "put_message(topic, body, tags, keys, properties, "
                                         "queue_id, wait_store, held=False) takes 7 or 8 "
                                         "arguments");
        return NULL;
    }
    struct mqs_client *c = &self->c;
    PyObject *wait = args[6];
    if (!self->open || !c->configured || c->fork_gen != fork_gen || !plain(args) ||
        (wait != Py_True && wait != Py_False))
        Py_RETURN_NONE;
    int64_t t0 = mqs_mono_ns();
    if (t0 >= c->stale_at_ns)
        Py_RETURN_NONE; /* the client checks its supervisor first */
    int held = nargs == 8 && args[7] == Py_True;
    PutLock *lock = (PutLock *)c->lock;
    if (!held && !putlock_try(lock))
        Py_RETURN_NONE; /* another thread puts: wait on the lock in the general path */
    PyObject *out = put_locked(self, args, c->sync && wait == Py_True, t0);
    if (!held)
        putlock_release_held(lock);
    return out;
}

/* put's fields from one dict of a batch, or 0: not a dict of plain fields only. A dict
 * whose keys are the interned field names themselves (a literal's keys are) is read in
 * one pass over its items; any other key: a lookup per field name. */
static int batch_fields(PyObject *d, PyObject **f)
{
    if (!PyDict_CheckExact(d))
        return 0;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    int known = 1;
    for (int i = 0; i < FIELDS; i++)
        f[i] = Py_None;
    while (known && PyDict_Next(d, &pos, &k, &v)) {
        int i = 0;
        while (i < FIELDS && k != field_names[i])
            i++;
        if (i == FIELDS)
            known = 0;
        else
            f[i] = v;
    }
    if (known) /* every key a field name, each once (a dict's keys are distinct) */
        return f[F_TOPIC] != Py_None && f[F_BODY] != Py_None && plain(f);
    Py_ssize_t found = 0;
    for (int i = 0; i < FIELDS; i++) {
        PyObject *v = PyDict_GetItemWithError(d, field_names[i]);
        if (v == NULL && PyErr_Occurred())
            return 0;
        found += v != NULL;
        f[i] = v ? v : Py_None;
    }
    return found == PyDict_GET_SIZE(d) && f[F_TOPIC] != Py_None && f[F_BODY] != Py_None &&
           plain(f);
}

/* One PutResult per message, from `start` on: one store timestamp object for all, and
 * one size object per run of equal sizes (a batch's messages are often alike). */
static PyObject *batch_results(struct mqs_client *c, PyObject *outcome, struct mqs_item *items,
                               int n, const int64_t *qoffs, const struct mqs_reservation *r)
{
    PyObject *out = PyList_New(n), *ts = PyLong_FromLongLong(r->store_ts), *size = NULL;
    int64_t at = r->start, last = -1;
    if (ts == NULL)
        Py_CLEAR(out);
    for (int i = 0; out && i < n; i++) {
        if (items[i].size != last) {
            Py_XDECREF(size);
            if ((size = PyLong_FromLongLong(items[i].size)) == NULL) {
                Py_CLEAR(out);
                break;
            }
            last = items[i].size;
        }
        PyObject *one = make_result(c, outcome, at, size, items[i].msg.queue_id, qoffs[i], ts);
        if (one == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, one);
        at += items[i].size;
    }
    Py_XDECREF(size);
    Py_XDECREF(ts);
    return out;
}

/* The batch under the client's lock: its bodies and keys held (a copy may run without the
 * GIL), all or nothing, as `StoreClient._put_batch`. */
static PyObject *batch_locked(Appender *self, PyObject *msgs, int n, int sync, int64_t t0)
{
    struct mqs_item *items = PyMem_Calloc((size_t)n, sizeof *items);
    int64_t *qoffs = PyMem_Calloc((size_t)n, sizeof *qoffs);
    struct undo *u = PyMem_Calloc((size_t)n, sizeof *u);
    PyObject **keep = PyMem_Calloc((size_t)n * 2, sizeof *keep);
    if (!items || !qoffs || !u || !keep) {
        PyMem_Free(items);
        PyMem_Free(qoffs);
        PyMem_Free(u);
        PyMem_Free(keep);
        return PyErr_NoMemory();
    }
    int nu = 0, rc = MQS_FALLBACK, i;
    int64_t total = 0, born = now_ms(); /* the batch's messages are born together */
    struct lane_memo memo = {NULL, NULL, NULL, NULL};
    for (i = 0; i < n; i++) {
        PyObject *f[FIELDS];
        if (!batch_fields(PyList_GET_ITEM(msgs, i), f) ||
            !message(self, f, born, &items[i], u, &nu, &memo))
            break;
        keep[2 * i] = Py_NewRef(f[F_BODY]);
        keep[2 * i + 1] = Py_NewRef(f[F_KEYS]);
        total += items[i].size;
    }
    struct mqs_reservation r;
    if (i == n && total + MQS_END_FILE_MIN_BLANK <= self->a.seg_size)
        rc = put_items(self, items, n, sync, t0, qoffs, &r);
    undo_release(u, nu, rc == MQS_FALLBACK);
    PyObject *out = rc < 0 ? not_done(rc)
                           : batch_results(&self->c, self->c.outcomes[rc], items, n, qoffs, &r);
    for (int k = 0; k < 2 * n; k++)
        Py_XDECREF(keep[k]);
    PyMem_Free(items);
    PyMem_Free(qoffs);
    PyMem_Free(u);
    PyMem_Free(keep);
    return out;
}

PyObject *mqs_put_batch_messages(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "put_batch_messages(messages, wait_store, held=False) takes 2 or 3 "
                        "arguments");
        return NULL;
    }
    struct mqs_client *c = &self->c;
    PyObject *msgs = args[0], *wait = args[1];
    if (!self->open || !c->configured || c->fork_gen != fork_gen || !PyList_CheckExact(msgs) ||
        PyList_GET_SIZE(msgs) < 1 || PyList_GET_SIZE(msgs) > self->a.slot_count / 2 ||
        (wait != Py_True && wait != Py_False))
        Py_RETURN_NONE;
    int64_t t0 = mqs_mono_ns();
    if (t0 >= c->stale_at_ns)
        Py_RETURN_NONE;
    int held = nargs == 3 && args[2] == Py_True;
    PutLock *lock = (PutLock *)c->lock;
    if (!held && !putlock_try(lock))
        Py_RETURN_NONE;
    PyObject *out = batch_locked(self, msgs, (int)PyList_GET_SIZE(msgs), c->sync && wait == Py_True,
                                 t0);
    if (!held)
        putlock_release_held(lock);
    return out;
}
