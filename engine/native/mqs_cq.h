/* Consume-queue units in C: a scanned batch grouped per (topic, queue id) and packed, for
 * the dispatcher (engine.consumequeue.group_units is the Python twin;
 * tests/native/test_cq_diff.py compares their answers). */
#ifndef MQS_CQ_H
#define MQS_CQ_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *mqs_py_group_units(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

#define MQS_CQ_METHODS                                                                        \
    {"group_units", (PyCFunction)(void (*)(void))mqs_py_group_units, METH_FASTCALL,           \
     "group_units(buf, topic_pos, topic_len, queue_id, queue_offset, pos, size, tags_code, "  \
     "base) -> list of (topic, queue_id, first_queue_offset, dense, records, units): "        \
     "engine.consumequeue.group_units."},

#endif
