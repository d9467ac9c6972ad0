/* mqstore._native.pull_units and pull_register: a pull's messages built in C (mqs_pull.h). */
#ifndef MQS_PULL_PY_H
#define MQS_PULL_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* pull_register(decoded, view, fields, format_host): the message classes pull_units
 * builds (engine.record.DecodedRecord and RecordView: slotted, `fields` in their order,
 * which must be engine.record.RecordFields' own) and the formatter of IPv6 hosts. */
PyObject *mqs_py_pull_register(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* pull_register_lazy(cls, names): the class a pull `into` an owner builds, and its slots
 * named for their roles (raw, body, queue_offset, owner, tag, done, cache). */
PyObject *mqs_py_pull_register_lazy(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* pull_units(units, start, log, log_base, limit, codes, wanted, max_count, max_bytes,
 * got_bytes, zero_copy, out[, into]) -> (next_unit, stop, got_bytes, removing):
 * engine.pull's pull_units is its door, pull_units_py its reference. With `into` an
 * (owner, tag) tuple, each message is a lazy one (pull_register_lazy's class). */
PyObject *mqs_py_pull_units(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#define MQS_PULL_METHODS                                                                      \
    {"pull_register", (PyCFunction)(void (*)(void))mqs_py_pull_register, METH_FASTCALL,       \
     "pull_register(decoded, view, fields, format_host): the classes pull_units builds."},    \
    {"pull_register_lazy", (PyCFunction)(void (*)(void))mqs_py_pull_register_lazy,           \
     METH_FASTCALL, "pull_register_lazy(cls, names): the class a pull into an owner builds."}, \
    {"pull_units", (PyCFunction)(void (*)(void))mqs_py_pull_units, METH_FASTCALL,             \
     "pull_units(units, start, log, log_base, limit, codes, wanted, max_count, max_bytes, "   \
     "got_bytes, zero_copy, out[, into]) -> (next_unit, stop, got_bytes, removing): a pull's walk "   \
     "over consume-queue units, its messages appended to out (engine.pull is its door)."},

#endif
