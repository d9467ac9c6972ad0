/* ipc's part of the extension module `mqstore._native` (mqs_ipc_py.c). */
#ifndef MQS_IPC_PY_H
#define MQS_IPC_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Add ipc's types, functions and constants to the module (the crash points read from
 * MQSTORE_CRASHPOINT first); -1 with an exception set. */
int mqs_ipc_add(PyObject *m);

#endif
