/* The put of every message shape in one C call (issue 22): see mqs_put.c. Also
 * `PutLock`, the client's thread lock, which the C put takes without the GIL's help. */
#ifndef MQS_PUT_H
#define MQS_PUT_H

#include "mqs_appender.h"

PyObject *mqs_put_message(Appender *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqs_put_batch_messages(Appender *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqs_put_configure(Appender *self, PyObject *args, PyObject *kw);
PyObject *mqs_put_checked(Appender *self, PyObject *arg);

/* Drop the client's side (close, dealloc). */
void mqs_put_clear(Appender *self);

/* Module init: PutLock ready, the fork handler registered; then PutLock added. */
int mqs_put_ready(void);
int mqs_put_add(PyObject *m);

#define MQS_PUT_METHODS                                                                        \
    {"put_message", (PyCFunction)(void (*)(void))mqs_put_message, METH_FASTCALL,               \
     "put_message(topic, body, tags, keys, properties, queue_id, wait_store, held=False, "    \
     "delay_level=None) -> PutResult | None: the whole put; None: nothing done, the client "  \
     "acts first (re-attach, its lock, a type to refuse or make plain)."},                    \
        {"put_batch_messages", (PyCFunction)(void (*)(void))mqs_put_batch_messages,            \
         METH_FASTCALL,                                                                        \
         "put_batch_messages(messages, wait_store, held=False, redelivered=False) -> "        \
         "list[PutResult] | None: a batch of put's dicts and Messages in one call, as "        \
         "put_message; redelivered: stored messages put again, kept out of the idempotence "  \
         "table."},                                                                            \
        {"configure", (PyCFunction)(void (*)(void))mqs_put_configure,                          \
         METH_VARARGS | METH_KEYWORDS,                                                         \
         "configure(lock, lanes, new_lane, find_row, map_segment, message_type, "              \
         "message_fields, stats, stats_off, result_type, statuses, flush_reasons, "            \
         "msg_id_prefix, sync, sync_timeout_ns, busy_ns, fast_fail, max_body, store_addr, "    \
         "store_port, max_delay_level=18, backlog_bytes=0, backlog_grace_ns=0): what "        \
         "put_message needs from the client."},                                                \
        {"checked", (PyCFunction)mqs_put_checked, METH_O,                                      \
         "checked(stale_after_ns): the client checked its supervisor; put_message answers "    \
         "None once this long has passed, so that it checks again."},

#endif
