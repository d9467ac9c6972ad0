/* Index entries in C: RocketMQ's IndexFile.putKey over a batch of key hashes, for the
 * dispatcher (engine.indexfile.put_hashes is the Python twin; tests/native/test_index_diff.py
 * compares the files they write byte for byte). */
#ifndef MQS_INDEX_H
#define MQS_INDEX_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *mqs_py_index_put(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

#define MQS_INDEX_METHODS                                                                     \
    {"index_put", (PyCFunction)(void (*)(void))mqs_py_index_put, METH_FASTCALL,               \
     "index_put(buf, hash_slot_num, index_num, key_first, key_hash, pos, store_timestamp, "  \
     "base, rec_from, rec_to, key_from) -> int: put index keys into a mapped index file "    \
     "until it is full (engine.indexfile.put_hashes); the next key not put."},

#endif
