/* mqstore._native.verify_units: the consume-queue check's entry point (mqs_verify.h). */
#ifndef MQS_VERIFY_PY_H
#define MQS_VERIFY_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "mqs_args.h"

/* verify_units(units, first_queue_offset, queue_id, prev_end, log_min, log_end,
 * headers_from, segments, segments_base, segment_size) -> (bad_queue_offset or -1,
 * prev_end): engine.verify.verify_units is its door, verify_units_py its reference. */
PyObject *mqs_py_verify_units(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* queue_last_ends(buf, start, pos, size, queue_id, topic_pos, topic_len) -> {(topic bytes,
 * queue id): pos + size of the queue's last record}, over records [start, n) of the
 * scanner's columns: engine.verify.queue_last_ends is its door. */
PyObject *mqs_py_queue_last_ends(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#define MQS_VERIFY_METHODS                                                                     \
    MQS_FASTCALL("verify_units", mqs_py_verify_units,                                          \
         "verify_units(units, first_queue_offset, queue_id, prev_end, log_min, log_end, "      \
         "headers_from, segments, segments_base, segment_size) -> (bad_queue_offset, prev_end): " \
         "recovery's consume-queue check (engine/native/mqs_verify.c; engine.verify is its door)."), \
    MQS_FASTCALL("queue_last_ends", mqs_py_queue_last_ends,                                    \
         "queue_last_ends(buf, start, pos, size, queue_id, topic_pos, topic_len) -> dict: each " \
         "queue's last scanned record's end (engine.verify.queue_last_ends is its door)."),

#endif
