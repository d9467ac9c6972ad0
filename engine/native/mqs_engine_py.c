/* engine's C, as Python sees it (`mqstore._native`, typed in mqstore/_native.pyi): the
 * CRC (mqs_crc32.c), and the tables of the V1 record encoder and writer, the scanner
 * (with the committer's record_step), the pull walk, the consume-queue and index helpers
 * and recovery's check (their *_py.c / .h files). Argument checks name the parameter (mqs_args.c). */
#include "mqs_engine_py.h"

#include "mqs_args.h"
#include "mqs_be.h"
#include "mqs_cq.h"
#include "mqs_crc32.h"
#include "mqs_dispatch_round.h"
#include "mqs_index.h"
#include "mqs_pull_py.h"
#include "mqs_record_py.h"
#include "mqs_scan_py.h"
#include "mqs_verify_py.h"

static PyObject *py_crc32(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0) takes 1 or 2 arguments");
        return NULL;
    }
    int64_t start = 0;
    if (nargs == 2 && mqs_arg_i64(args[1], "value", &start) < 0)
        return NULL;
    Py_buffer v;
    if (mqs_arg_buffer(args[0], "data", &v) < 0)
        return NULL;
    uint32_t c;
    MQS_NOGIL_IF_BIG(v.len, c = mqs_crc32((uint32_t)start, v.buf, (size_t)v.len));
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_crc32_slice8(PyObject *Py_UNUSED(m), PyObject *arg)
{
    Py_buffer v;
    if (mqs_arg_buffer(arg, "data", &v) < 0)
        return NULL;
    uint32_t c = mqs_crc32_slice8(0, v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef engine_methods[] = {
    MQS_INDEX_METHODS
    MQS_CQ_METHODS
    MQS_DISPATCH_ROUND_METHODS
    MQS_PULL_METHODS
    MQS_FASTCALL("crc32", py_crc32,
         "crc32(data, value=0) -> int: zlib.crc32, folded with PCLMULQDQ where the CPU has it."),
    {"crc32_slice8", py_crc32_slice8, METH_O,
     "crc32_slice8(data) -> int: the portable slicing-by-8 CRC alone (for tests)."},
    MQS_SCAN_METHODS
    MQS_VERIFY_METHODS
    MQS_RECORD_METHODS
    {NULL, NULL, 0, NULL},
};

int mqs_engine_add(PyObject *m)
{
    return PyModule_AddFunctions(m, engine_methods);
}
