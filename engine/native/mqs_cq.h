/* Consume-queue units in C: a scanned batch grouped per (topic, queue id) and packed, for
 * the dispatcher (engine.consumequeue_files.group_units is the Python twin;
 * tests/native/test_cq_diff.py compares their answers); and recovery's walks over a
 * mapped file, a consume queue's valid units and a file's zero tail
 * (engine.consumequeue_files.valid_units_py and zero_tail_py are the twins;
 * tests/native/test_cq_recover_diff.py compares them). */
#ifndef MQS_CQ_H
#define MQS_CQ_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

PyObject *mqs_py_group_units(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqs_py_valid_units(PyObject *m, PyObject *units);
PyObject *mqs_py_zero_tail(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

/* Units [0, n) of `units` (20 bytes each, big endian: int64 physical offset, int32 size,
 * int64 tags code): how many lead that are valid (physical offset >= 0 and size > 0; the
 * first invalid one ends them), and in *last_real the index of the last of those that is
 * not a pre-blank (size 2147483647), -1 if none. Pure C, no GIL needed. */
int64_t mqs_cq_valid_units(const uint8_t *units, int64_t n, int64_t *last_real);

/* Where the trailing zero bytes of buf[start, len) begin: one past its last non-zero
 * byte, `start` when all are zero. Pure C, no GIL needed. */
int64_t mqs_zero_tail(const uint8_t *buf, int64_t start, int64_t len);

/* A (topic, queue id) key as a grouping of records per queue hashes and compares it (the
 * dispatcher's units here, its plain round in mqs_dispatch_round.c): FNV-1a over the
 * topic's bytes, seeded with the queue id. */
static inline uint64_t mqs_queue_key_hash(int32_t queue_id, const uint8_t *topic, int32_t len)
{
    uint64_t h = 1469598103934665603ULL ^ (uint32_t)queue_id;
    for (int32_t i = 0; i < len; i++)
        h = (h ^ topic[i]) * 1099511628211ULL;
    return h;
}

static inline int mqs_same_queue_key(int32_t qa, const uint8_t *ta, int32_t la, int32_t qb,
                                     const uint8_t *tb, int32_t lb)
{
    return qa == qb && la == lb && memcmp(ta, tb, (size_t)la) == 0;
}

#define MQS_CQ_METHODS                                                                        \
    {"group_units", (PyCFunction)(void (*)(void))mqs_py_group_units, METH_FASTCALL,           \
     "group_units(buf, topic_pos, topic_len, queue_id, queue_offset, pos, size, tags_code, "  \
     "base) -> list of (topic, queue_id, first_queue_offset, dense, records, units): "        \
     "engine.consumequeue_files.group_units."},                                               \
    {"valid_units", (PyCFunction)mqs_py_valid_units, METH_O,                                  \
     "valid_units(units) -> (count, last_real): the leading valid consume-queue units and "  \
     "the index of the last that is not a pre-blank (-1: none), without the GIL: "           \
     "engine.consumequeue_files.valid_units_py."},                                            \
    {"zero_tail", (PyCFunction)(void (*)(void))mqs_py_zero_tail, METH_FASTCALL,              \
     "zero_tail(buf, start) -> int: where the trailing zero bytes of buf[start:] begin, "    \
     "without the GIL: engine.consumequeue_files.zero_tail_py."},

#endif
