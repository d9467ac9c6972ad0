/* mqstore._native.group_ack: a group consumer's ack of one message, without its lock
 * when nobody holds it (ipc/consumer.py's Consumer.ack; the reference is
 * ipc.consumer.group_ack_py). */
#ifndef MQS_GROUP_ACK_H
#define MQS_GROUP_ACK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* group_ack(msg, lock, words) -> 1 acked | 0 acked before | -1 not here (the caller
 * acks under the lock). */
PyObject *mqs_py_group_ack(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#define MQS_GROUP_ACK_METHODS                                                                 \
    {"group_ack", (PyCFunction)(void (*)(void))mqs_py_group_ack, METH_FASTCALL,               \
     "group_ack(msg, lock, words) -> 1 | 0 | -1: a consumer's ack of msg when its lock is "   \
     "free and its queue active and leased (-1: the caller acks under the lock)."},

#endif
