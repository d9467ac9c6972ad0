/* The common-case put in one C call (issue 12, item 1): argument types, validation
 * against the client's caches, the KEYS property, the reservation and copy, the sync
 * wait, the statistics and the PutResult. Anything else (a first put of a topic, a
 * type or value the client refuses, a roll, a wait) answers None and the client's
 * Python path, the reference, does the put. Also `PutLock`, the client's thread lock,
 * which the C put takes without the GIL's help. */
#ifndef MQS_PUT_H
#define MQS_PUT_H

#include "mqs_appender.h"

PyObject *mqs_put_message(Appender *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqs_put_batch_messages(Appender *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqs_put_configure(Appender *self, PyObject *args, PyObject *kw);
PyObject *mqs_put_set_target(Appender *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqs_put_checked(Appender *self, PyObject *arg);

/* Drop the client's side (close, dealloc). */
void mqs_put_clear(Appender *self);

/* Module init: PutLock ready, the fork handler registered; then PutLock added. */
int mqs_put_ready(void);
int mqs_put_add(PyObject *m);

#define MQS_PUT_METHODS                                                                        \
    {"put_message", (PyCFunction)(void (*)(void))mqs_put_message, METH_FASTCALL,                \
     "put_message(topic, body, tags, keys, properties, queue_id, wait_store, held=False) -> "   \
     "PutResult | int | None: the whole common-case put; a code (< 0) when the reservation "   \
     "lock failed; None: nothing done, take the general path."},                               \
        {"put_batch_messages", (PyCFunction)(void (*)(void))mqs_put_batch_messages,            \
         METH_FASTCALL,                                                                        \
         "put_batch_messages(messages, wait_store, held=False) -> list[PutResult] | int | "    \
         "None: a batch of put's dicts in one call, as put_message."},                         \
        {"configure", (PyCFunction)(void (*)(void))mqs_put_configure,                          \
         METH_VARARGS | METH_KEYWORDS,                                                         \
         "configure(lock, lanes, stats, stats_off, result_type, outcomes, msg_id_prefix, "     \
         "sync, sync_timeout_ns, busy_ns, max_body, store_addr, store_port): what put_message " \
         "needs from the client."},                                                            \
        {"set_target", (PyCFunction)(void (*)(void))mqs_put_set_target, METH_FASTCALL,         \
         "set_target(mapping, index): the newest mapped segment (pool off)."},                 \
        {"checked", (PyCFunction)mqs_put_checked, METH_O,                                      \
         "checked(stale_after_ns): the client checked its supervisor; put_message answers "    \
         "None once this long has passed, so that it checks again."},

#endif
