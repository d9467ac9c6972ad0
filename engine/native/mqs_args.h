/* Argument checks at the door of every entry point: the parameter's name is in the
 * TypeError / ValueError, as CPython's own modules do it. */
#ifndef MQS_ARGS_H
#define MQS_ARGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "mqs_record.h"

/* A METH_FASTCALL entry of a method table. */
#define MQS_FASTCALL(name, fn, doc) {name, (PyCFunction)(void (*)(void))(fn), METH_FASTCALL, doc}

/* Copies and CRCs of at least this many bytes run with the GIL released: `stmt`, on
 * `bytes` bytes, runs under MQS_NOGIL_IF_BIG. */
#define MQS_NOGIL_BYTES (64 * 1024)
#define MQS_NOGIL_IF_BIG(bytes, stmt)                                                        \
    do { if ((bytes) >= MQS_NOGIL_BYTES) { Py_BEGIN_ALLOW_THREADS stmt; Py_END_ALLOW_THREADS } \
         else { stmt; } } while (0)

/* 0 on success; -1 with an exception set. */
int mqs_arg_i64(PyObject *o, const char *name, int64_t *out);
int mqs_arg_i32(PyObject *o, const char *name, int32_t *out);
/* A bytes object of exactly 4 or 16 bytes (an IPv4 or IPv6 address), and a port. */
int mqs_arg_host(PyObject *addr, PyObject *port, const char *name, struct mqs_host *out);
/* A read-only contiguous buffer; release with PyBuffer_Release. */
int mqs_arg_buffer(PyObject *o, const char *name, Py_buffer *view);
/* A writable contiguous buffer; release with PyBuffer_Release. */
int mqs_arg_wbuffer(PyObject *o, const char *name, Py_buffer *view);
/* A bytes object's data and length (borrowed: keep the object alive). */
int mqs_arg_bytes(PyObject *o, const char *name, const uint8_t **p, size_t *len);

/* A record's topic or property text as a str: engine.recordcodes.decode_utf8 (Java's
 * `new String(bytes, UTF_8)`, which differs from Python's "replace" only at an encoded
 * surrogate). New reference, or NULL with an exception set. */
PyObject *mqs_str_utf8(const uint8_t *p, size_t n);

#endif
