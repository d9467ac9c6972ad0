/* mqstore._native: the C extension (typed in _native.pyi beside this file). Its two
 * layers add their own parts: engine's (the record, CRC, scanner, pull walk, consume-queue
 * and index helpers: engine/native/mqs_engine_py.c) and ipc's (the put and the control
 * block: ipc/native/mqs_ipc_py.c). engine's C includes no ipc header. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "mqs_engine_py.h"
#include "mqs_ipc_py.h"

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mqstore._native",
    "The store's C: engine's record, scans and walks, ipc's put and control block.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (mqs_engine_add(m) < 0 || mqs_ipc_add(m) < 0))
        Py_CLEAR(m);
    return m;
}
