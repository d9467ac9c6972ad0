/* Index entries in C: RocketMQ's IndexFile.putKey over a batch of key hashes, for the
 * dispatcher (engine.indexfile.put_hashes is the Python twin; tests/native/test_index_diff.py
 * compares the files they write byte for byte). */
#ifndef MQS_INDEX_H
#define MQS_INDEX_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A batch of keys over a mapped index file (the scanner's columns, native endian). */
struct mqs_index_batch {
    uint8_t *file;
    int64_t slots, entries;
    const int32_t *key_first, *key_hash;
    const int64_t *pos, *ts;
    int64_t base;
};

/* Keys [key_from, key_first[rec_to]) of records [rec_from, rec_to), RocketMQ's putKey
 * each, until the file is full; key_first must rise and key_first[rec_from] <= key_from
 * (the caller checks). Returns the next key not put, or -1 with *err set (bad input: a
 * negative hash or header field). Pure C. */
int64_t mqs_index_put_keys(const struct mqs_index_batch *b, int64_t rec_from, int64_t rec_to,
                           int64_t key_from, const char **err);

PyObject *mqs_py_index_put(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

#define MQS_INDEX_METHODS                                                                     \
    {"index_put", (PyCFunction)(void (*)(void))mqs_py_index_put, METH_FASTCALL,               \
     "index_put(buf, hash_slot_num, index_num, key_first, key_hash, pos, store_timestamp, "  \
     "base, rec_from, rec_to, key_from) -> int: put index keys into a mapped index file "    \
     "until it is full (engine.indexfile.put_hashes); the next key not put."},

#endif
