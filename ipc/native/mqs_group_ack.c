/* A group consumer's ack in one C call (issue 25's keep-up goal): what Consumer.ack does
 * under its lock, done here without it when nobody holds it.
 *
 * Why that is safe: with the GIL held, this function runs no Python code (attribute
 * reads and writes of plain instances and slots, a deque's popleft, int compares, no
 * allocation of a GC-tracked object: no collection can run a finaliser), so no other
 * thread runs while it does. A thread inside one of the consumer's critical sections
 * holds its lock; when the lock is free, none is in one, and none can enter before this
 * returns. When the lock is held, or the message's queue is not active, or its lease
 * ran out, nothing is changed and -1 says so: the caller takes the lock and acks as
 * before (ipc/consumer.py: the slow path also drops a queue whose lease ran out).
 * A free-threaded Python would need the lock here: the module is built for GIL builds.
 *
 * The ack itself (ipc.consumer.group_ack_py is the reference): mark the message done;
 * pop the done messages at the left of the queue's inflight deque; the commit point is
 * the first message left there, else the first one buffered (buffer[pos]), else
 * next_fetch; store `word | point` into the slot (one aligned 8-byte store) when the
 * point fits a slot's 40 bits. */
#include "mqs_group_ack.h"

#include <stdint.h>
#include <time.h>

#define OFFSET_MASK ((1LL << 40) - 1)

enum { N_DONE, N_Q, N_TAG, N_QTAG, N_STATE, N_DEADLINE, N_INFLIGHT, N_BUFFER, N_POS,
       N_NEXT_FETCH, N_SLOT, N_WORD, N_QUEUE_OFFSET, N_LOCKED, N_POPLEFT, NNAMES };
static const char *const NAMES[NNAMES] = {
    "done", "_q", "_tag", "tag", "state", "deadline", "inflight", "buffer", "pos",
    "next_fetch", "slot", "word", "queue_offset", "locked", "popleft",
};
static PyObject *names[NNAMES];

static int ready(void)
{
    for (int k = 0; k < NNAMES; k++)
        if (names[k] == NULL && (names[k] = PyUnicode_InternFromString(NAMES[k])) == NULL)
            return -1;
    return 0;
}

/* Int attribute `name` of `o` (a new reference), or NULL with an exception set
   (TypeError if not an int). */
static PyObject *attr_int(PyObject *o, int name)
{
    PyObject *x = PyObject_GetAttr(o, names[name]);
    if (x != NULL && !PyLong_Check(x)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", NAMES[name]);
        Py_CLEAR(x);
    }
    return x;
}

/* An int attribute of `o`: 0, or -1 with an exception set (TypeError if not an int). */
static int attr_i64(PyObject *o, int name, long long *v)
{
    PyObject *x = attr_int(o, name);
    if (x == NULL)
        return -1;
    *v = PyLong_AsLongLong(x);
    Py_DECREF(x);
    return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

/* An unsigned 64-bit int attribute of `o` (a slot word's tag bits): as attr_i64. */
static int attr_u64(PyObject *o, int name, unsigned long long *v)
{
    PyObject *x = attr_int(o, name);
    if (x == NULL)
        return -1;
    *v = PyLong_AsUnsignedLongLong(x);
    Py_DECREF(x);
    return *v == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
}

/* Whether attribute `name` of `o` is True: 1, 0, or -1 with an exception set. */
static int attr_true(PyObject *o, int name)
{
    PyObject *x = PyObject_GetAttr(o, names[name]);
    if (x == NULL)
        return -1;
    int t = x == Py_True;
    Py_DECREF(x);
    return t;
}

/* Pop the done messages at the left of `inflight`; its first one left (a new
 * reference), NULL when none is left (no exception), or NULL with an exception set. */
static PyObject *first_undone(PyObject *inflight)
{
    for (;;) {
        Py_ssize_t n = PySequence_Size(inflight);
        if (n <= 0)
            return NULL;
        PyObject *head = PySequence_GetItem(inflight, 0);
        if (head == NULL)
            return NULL;
        int done = attr_true(head, N_DONE);
        if (done != 1) {
            if (done < 0)
                Py_CLEAR(head);
            return head;
        }
        PyObject *got = PyObject_CallMethodNoArgs(inflight, names[N_POPLEFT]);
        Py_DECREF(head);
        if (got == NULL)
            return NULL;
        Py_DECREF(got);
    }
}

/* The queue's commit point (after popping the done ones): 0, or -1 with an exception. */
static int commit_point(PyObject *q, long long *point)
{
    PyObject *inflight = PyObject_GetAttr(q, names[N_INFLIGHT]);
    if (inflight == NULL)
        return -1;
    PyObject *head = first_undone(inflight);
    Py_DECREF(inflight);
    if (head != NULL) {
        int rc = attr_i64(head, N_QUEUE_OFFSET, point);
        Py_DECREF(head);
        return rc;
    }
    if (PyErr_Occurred())
        return -1;
    PyObject *buffer = PyObject_GetAttr(q, names[N_BUFFER]);
    if (buffer == NULL)
        return -1;
    if (!PyList_Check(buffer)) {
        Py_DECREF(buffer);
        PyErr_SetString(PyExc_TypeError, "buffer must be a list");
        return -1;
    }
    int rc = 0;
    if (PyList_GET_SIZE(buffer) > 0) {
        long long pos;
        rc = attr_i64(q, N_POS, &pos);
        if (rc == 0 && (pos < 0 || pos >= PyList_GET_SIZE(buffer))) {
            PyErr_SetString(PyExc_IndexError, "pos is not an index of buffer");
            rc = -1;
        }
        if (rc == 0)
            rc = attr_i64(PyList_GET_ITEM(buffer, (Py_ssize_t)pos), N_QUEUE_OFFSET, point);
    } else {
        rc = attr_i64(q, N_NEXT_FETCH, point);
    }
    Py_DECREF(buffer);
    return rc;
}

/* 1: msg's queue is active, its grant msg's and its lease not over; 0: not; -1: error. */
static int leased(PyObject *msg, PyObject *q)
{
    PyObject *state = PyObject_GetAttr(q, names[N_STATE]);
    if (state == NULL)
        return -1;
    int active = PyUnicode_Check(state) && PyUnicode_CompareWithASCIIString(state, "active") == 0;
    Py_DECREF(state);
    if (!active)
        return 0;
    long long qtag, mtag;
    if (attr_i64(q, N_QTAG, &qtag) < 0 || attr_i64(msg, N_TAG, &mtag) < 0)
        return -1;
    if (qtag != mtag)
        return 0;
    PyObject *dl = PyObject_GetAttr(q, names[N_DEADLINE]);
    if (dl == NULL)
        return -1;
    double deadline = PyFloat_AsDouble(dl);
    Py_DECREF(dl);
    if (deadline == -1.0 && PyErr_Occurred())
        return -1;
    struct timespec ts; /* time.monotonic's clock */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 < deadline;
}

PyObject *mqs_py_group_ack(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "group_ack takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (ready() < 0)
        return NULL;
    PyObject *msg = args[0];
    PyObject *locked = PyObject_CallMethodNoArgs(args[1], names[N_LOCKED]);
    if (locked == NULL)
        return NULL;
    int busy = PyObject_IsTrue(locked);
    Py_DECREF(locked);
    if (busy < 0)
        return NULL;
    if (busy)
        return PyLong_FromLong(-1);
    int done = attr_true(msg, N_DONE);
    if (done < 0)
        return NULL;
    if (done)
        return PyLong_FromLong(0);
    PyObject *q = PyObject_GetAttr(msg, names[N_Q]);
    if (q == NULL)
        return NULL;
    PyObject *result = NULL;
    long long slot, point;
    unsigned long long word;
    Py_buffer words;
    int ok = leased(msg, q);
    if (ok <= 0) {
        if (ok == 0)
            result = PyLong_FromLong(-1);
        goto done;
    }
    if (attr_i64(q, N_SLOT, &slot) < 0 || attr_u64(q, N_WORD, &word) < 0)
        goto done;
    if (PyObject_GetBuffer(args[2], &words, PyBUF_WRITABLE) < 0)
        goto done;
    if (slot < 0 || (slot + 1) * 8 > (long long)words.len || ((uintptr_t)words.buf & 7)) {
        PyErr_SetString(PyExc_ValueError, "slot is not an aligned 8-byte word of words");
        PyBuffer_Release(&words);
        goto done;
    }
    if (PyObject_SetAttr(msg, names[N_DONE], Py_True) < 0 || commit_point(q, &point) < 0) {
        PyBuffer_Release(&words);
        goto done;
    }
    if (0 <= point && point <= OFFSET_MASK)
        __atomic_store_n((uint64_t *)words.buf + slot, (uint64_t)(word | (unsigned long long)point), __ATOMIC_RELEASE);
    PyBuffer_Release(&words);
    result = PyLong_FromLong(1);
done:
    Py_DECREF(q);
    return result;
}
