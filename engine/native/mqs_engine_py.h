/* engine's functions of the extension module `mqstore._native` (mqs_engine_py.c). */
#ifndef MQS_ENGINE_PY_H
#define MQS_ENGINE_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Add engine's functions to the module; -1 with an exception set. */
int mqs_engine_add(PyObject *m);

#endif
