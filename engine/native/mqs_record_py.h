/* mqstore._native.encode and write_record: the record encoder's doors (mqs_record_py.c). */
#ifndef MQS_RECORD_PY_H
#define MQS_RECORD_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "mqs_args.h"

PyObject *mqs_py_encode(PyObject *module, PyObject *args, PyObject *kw);
PyObject *mqs_py_write_record(PyObject *module, PyObject *const *args, Py_ssize_t n);

#define MQS_RECORD_METHODS                                                                  \
    {"encode", (PyCFunction)(void (*)(void))mqs_py_encode, METH_VARARGS | METH_KEYWORDS,    \
     "encode(topic, body, properties, *, ...) -> bytes: one V1 record, as "                 \
     "engine.record.encode lays it out (the inputs already validated)."},                   \
    MQS_FASTCALL("write_record", mqs_py_write_record,                                       \
         "write_record(target, pos, prep, queue_offset, physical_offset, store_timestamp): " \
         "one record into a writable buffer (engine.commitlog)."),

#endif
