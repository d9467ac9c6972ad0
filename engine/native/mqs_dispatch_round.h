/* The dispatcher's plain round in one C call (engine/native/mqs_dispatch_round.c): scan,
 * consume-queue units and index entries of a batch of messages, or None when the batch
 * holds what the round does not take (engine.dispatch dispatches it then).
 * engine.dispatch's Python path is the reference; tests/native/test_dispatch_round_diff.py
 * compares their stores. */
#ifndef MQS_DISPATCH_ROUND_H
#define MQS_DISPATCH_ROUND_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *mqs_py_plain_round(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

#define MQS_DISPATCH_ROUND_METHODS                                                            \
    {"plain_round", (PyCFunction)(void (*)(void))mqs_py_plain_round, METH_FASTCALL,           \
     "plain_round(buf, base, pos, limit, max_records, delay_ms, cursors, index, now_ms, "     \
     "buckets, touched) -> (count, stop, stop_pos, index_keys, last_store_timestamp, "       \
     "lag_sum_ms, lag_counts, more, fillers) or None: a batch's scan, units and keys in one " \
     "call, up to a file roll (engine.dispatch.Dispatcher's Python path is the reference)."},

#endif
