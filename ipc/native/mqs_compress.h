/* Body compression in the put (issue 26): a body of at least compressMsgBodyOverHowmuch
 * bytes is compressed with the store's codec, through the codec's own C function (one
 * call per body, `engine.compression.compressor`), and its record's sysFlag marked as
 * RocketMQ 5.x's producer marks it. The Python reference is
 * `engine.compression.compress_reference`; tests/native/test_put_compress.py compares
 * the two byte for byte through the C put. */
#ifndef MQS_COMPRESS_H
#define MQS_COMPRESS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "mqs_append.h"

#define MQS_COMPRESSED_FLAG 0x1
#define MQS_COMPRESSION_TYPE_MASK 0x700

/* A client's compression: `fn` NULL is off. */
struct mqs_compress {
    PyObject *fn;  /* fn(memoryview) -> bytes: the codec's compress at the store's level */
    int64_t over;  /* compressMsgBodyOverHowmuch */
    int32_t flag;  /* COMPRESSED_FLAG | the codec's type bits */
};

/* Compress `it`'s body when the rule says so: the message points at the compressed
 * bytes, kept alive in the list *keep (made on first use; the caller drops it once the
 * records are written), its sysFlag and size follow. 0, or -1 with an exception set. */
int mqs_compress_item(const struct mqs_compress *z, struct mqs_item *it, PyObject **keep);

/* Appender.configure_compression(fn, over, flag) and the clearing of it. */
PyObject *mqs_compress_configure(struct mqs_compress *z, PyObject *const *args, Py_ssize_t nargs);
void mqs_compress_clear(struct mqs_compress *z);

#endif
