/* Body compression in the put: see mqs_compress.h. */
#include "mqs_compress.h"

#include "mqs_record.h"

int mqs_compress_item(const struct mqs_compress *z, struct mqs_item *it, PyObject **keep)
{
    struct mqs_message *msg = &it->msg;
    if (z->fn == NULL || (msg->sys_flag & MQS_COMPRESSED_FLAG) || (int64_t)msg->body_len < z->over)
        return 0;
    PyObject *view = PyMemoryView_FromMemory((char *)msg->body, (Py_ssize_t)msg->body_len,
                                             PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *packed = PyObject_CallOneArg(z->fn, view);
    Py_DECREF(view);
    if (packed == NULL)
        return -1;
    if (!PyBytes_CheckExact(packed)) {
        PyErr_Format(PyExc_TypeError, "the compressor returned %.100s, not bytes",
                     Py_TYPE(packed)->tp_name);
        Py_DECREF(packed);
        return -1;
    }
    if ((size_t)PyBytes_GET_SIZE(packed) >= msg->body_len) { /* not smaller: as given */
        Py_DECREF(packed);
        return 0;
    }
    if (*keep == NULL && (*keep = PyList_New(0)) == NULL) {
        Py_DECREF(packed);
        return -1;
    }
    int rc = PyList_Append(*keep, packed);
    Py_DECREF(packed); /* the list holds it */
    if (rc < 0)
        return -1;
    msg->body = (const uint8_t *)PyBytes_AS_STRING(packed);
    msg->body_len = (size_t)PyBytes_GET_SIZE(packed);
    msg->sys_flag = (msg->sys_flag & ~MQS_COMPRESSION_TYPE_MASK) | z->flag;
    it->size = (int64_t)mqs_record_length(msg);
    return 0;
}

void mqs_compress_clear(struct mqs_compress *z)
{
    Py_CLEAR(z->fn);
    z->over = 0;
    z->flag = 0;
}

PyObject *mqs_compress_configure(struct mqs_compress *z, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "configure_compression(fn, over, flag) takes 3 arguments");
        return NULL;
    }
    PyObject *fn = args[0];
    long long over = PyLong_AsLongLong(args[1]);
    if (over == -1 && PyErr_Occurred())
        return NULL;
    long flag = PyLong_AsLong(args[2]);
    if (flag == -1 && PyErr_Occurred())
        return NULL;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "configure_compression(): fn must be callable or None");
        return NULL;
    }
    if (fn != Py_None && (over < 0 || !(flag & MQS_COMPRESSED_FLAG) ||
                          (flag & ~(MQS_COMPRESSED_FLAG | MQS_COMPRESSION_TYPE_MASK)) ||
                          !(flag & MQS_COMPRESSION_TYPE_MASK))) {
        PyErr_SetString(PyExc_ValueError, "configure_compression(): over must be >= 0 and flag "
                                          "COMPRESSED_FLAG with a codec's type bits");
        return NULL;
    }
    mqs_compress_clear(z);
    if (fn != Py_None) {
        z->fn = Py_NewRef(fn);
        z->over = over;
        z->flag = (int32_t)flag;
    }
    Py_RETURN_NONE;
}
