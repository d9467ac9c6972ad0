/* mqstore._native.scan_records: the record scanner's entry point (mqs_scan.h), with
 * scan_summary and the committer's record_step. */
#ifndef MQS_SCAN_PY_H
#define MQS_SCAN_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "mqs_args.h"

/* scan_records(buf, pos, limit, *, check_crc=True, max_records=-1, delay_ms=None) ->
 * (count, stop, stop_pos, blank_size, columns, fixups): `columns` are bytes in
 * engine.scan.COLUMNS' order, then key_first and key_hash; `fixups` ('q') the records
 * whose tags code the caller takes from the reference. `delay_ms`: the store's delay
 * table (1..64 native int64 ms), None for RocketMQ's default. engine.scan.scan_records
 * builds the RecordScan. */
PyObject *mqs_py_scan_records(PyObject *module, PyObject *args, PyObject *kwargs);

/* scan_summary(store_timestamp, bits, sys_flag, queue_id, now_ms, buckets) -> (flags,
 * lag_sum_ms, counts): mqs_scan_summary over a batch's columns ('q', 'B', 'i', 'i' of one
 * length), without the GIL; engine.scan.scan_summary is its door. */
PyObject *mqs_py_scan_summary(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* record_step(buf, pos, limit, want) -> int: engine.scan.record_step_py in C. */
PyObject *mqs_py_record_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#define MQS_SCAN_METHODS                                                                       \
    MQS_FASTCALL("record_step", mqs_py_record_step,                                            \
         "record_step(buf, pos, limit, want) -> int: the first record boundary at or past "    \
         "want from pos, or the last one reached (engine.scan.record_step_py is its twin)."),  \
    {"scan_records", (PyCFunction)(void (*)(void))mqs_py_scan_records,                         \
     METH_VARARGS | METH_KEYWORDS,                                                             \
     "scan_records(buf, pos, limit, *, check_crc=True, max_records=-1, delay_ms=None) -> "     \
     "(count, stop, "                                                                          \
     "stop_pos, blank_size, columns, fixups): the record scanner (engine/native/mqs_scan.c; "  \
     "engine.scan.scan_records is its door)."},                                                \
    MQS_FASTCALL("scan_summary", mqs_py_scan_summary,                                          \
         "scan_summary(store_timestamp, bits, sys_flag, queue_id, now_ms, buckets) -> (flags, " \
         "lag_sum_ms, counts): engine.scan.scan_summary_py, in C."),

#endif
