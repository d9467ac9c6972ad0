/* Client message ids and idempotent puts (issue 26), kept apart from the put itself
 * (mqs_put.c calls the hooks below):
 *
 * - `UniqIds`, one per client (it survives re-attaches): RocketMQ's
 *   MessageClientIDSetter ids, 16 bytes as 32 upper-case hex digits: IPv4 (4), pid as a
 *   short (2), a per-client random hash (4, RocketMQ: the class loader's hashCode), ms
 *   since the local month began (4), a counter (2). The first 10 bytes are the
 *   *producer id*, the last 6 its *sequence*: unique within a month (the time never
 *   goes back, and a counter that would wrap inside one ms moves the time on).
 * - the stamp: a put without a UNIQ_KEY property gets one, appended to its properties
 *   ("UNIQ_KEY\x01<32 hex>\x02"); one the caller gave is kept, and is a retry key when
 *   it is one of this client's (32 hex digits, its producer id first).
 * - the idempotence table after the queue table in the control block: MQS_IDEM_PRODUCERS
 *   producer rows, each a ring of its last MQS_IDEM_WINDOW puts (sequence, position,
 *   state). Read and written only under the reservation lock; rebuilt from the log by
 *   the supervisor at every start (`_native.idem_note`). The Python reference is
 *   tests/native/uniq_reference.py. */
#ifndef MQS_UNIQ_H
#define MQS_UNIQ_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "mqs_append.h"
#include "mqs_fields.h"

#define MQS_UNIQ_BYTES 16
#define MQS_UNIQ_HEX 32
#define MQS_UNIQ_PROP_LEN (8 + 1 + MQS_UNIQ_HEX + 1) /* UNIQ_KEY \1 hex \2 */

#define MQS_IDEM_PRODUCERS 128
#define MQS_IDEM_WINDOW 128
#define MQS_IDEM_HEAD 64
#define MQS_IDEM_ROW_HEAD 32
#define MQS_IDEM_ENTRY 56
#define MQS_IDEM_ROW (MQS_IDEM_ROW_HEAD + MQS_IDEM_WINDOW * MQS_IDEM_ENTRY)
#define MQS_IDEM_SIZE (MQS_IDEM_HEAD + MQS_IDEM_PRODUCERS * MQS_IDEM_ROW)
#define MQS_IDEM_PROBE 8

/* An entry's state. */
#define MQS_IDEM_PENDING 1 /* reserved; stored once its reservation completes */
#define MQS_IDEM_DONE 2    /* completed (or found in the log at the start) */

/* mqs_item.uniq_kind */
#define MQS_UNIQ_GENERATED 1 /* made by this put */
#define MQS_UNIQ_GIVEN 2     /* the caller's, 32 hex digits with this client's producer id */
#define MQS_UNIQ_OTHER 3     /* the caller's, any other: kept, not a retry key */

/* Codes of the reservation step besides mqs_append.h's. */
#define MQS_IDEM_DUP (-20)      /* every message of the call is stored already */
#define MQS_IDEM_INFLIGHT (-21) /* a put with one of its keys is still in progress */

/* Module init: the UniqIds type and the functions. */
int mqs_uniq_add(PyObject *m);

/* After mqs_fields_check of item `it` (its properties the last in `arena`, from
 * m->props_off): find its UNIQ_KEY or add one, made at `now` (ms, the put's clock). MQS_FIELDS_OK, MQS_FIELDS_REFUSED with
 * `why` (properties or record now too long), MQS_FIELDS_ERROR. */
int mqs_uniq_stamp(struct mqs_uniq_client *u, struct mqs_fields *m, struct mqs_item *it,
                   struct mqs_arena *arena, struct mqs_refusal *why, int64_t seg_size,
                   int64_t now);

/* The id of a put's result: its UNIQ_KEY (a new str), "" when it has none. */
PyObject *mqs_uniq_str(const struct mqs_item *it);

/* The n bytes at b as 2n upper-case hex digits at out. */
void mqs_hex(const uint8_t *b, int n, char *out);

/* Under the reservation lock, before reserving: MQS_OK (reserve them), MQS_IDEM_DUP
 * (every message's key is stored: its position copied into the item's dup_* fields,
 * queue id and queue offset into msg.queue_id and qoffs) or MQS_IDEM_INFLIGHT. */
int mqs_idem_check(struct mqs_uniq_client *u, struct mqs_appender *a, int64_t ctl_len,
                   struct mqs_item *items, int n, int64_t *qoffs);

/* Under the lock, after mqs_reserve: note each message PENDING at its position. */
void mqs_idem_note(struct mqs_uniq_client *u, struct mqs_appender *a, int64_t ctl_len,
                   const struct mqs_item *items, int n, const int64_t *qoffs,
                   const struct mqs_reservation *r);

/* After the reservation completed (mqs_complete MQS_OK): its entries DONE. */
void mqs_idem_done(struct mqs_uniq_client *u, struct mqs_appender *a, int64_t ctl_len,
                   const struct mqs_item *items, int n, const struct mqs_reservation *r);

void mqs_uniq_clear(struct mqs_uniq_client *u);

/* Appender.use_ids(ids, idempotent): the client's UniqIds (None: no ids made) and whether
 * its retries are recognised. */
PyObject *mqs_uniq_use(Appender *self, PyObject *args, PyObject *kw);

#define MQS_UNIQ_METHODS                                                                       \
    {"use_ids", (PyCFunction)(void (*)(void))mqs_uniq_use, METH_VARARGS | METH_KEYWORDS,       \
     "use_ids(ids, idempotent): the client's UniqIds (a put without a UNIQ_KEY gets the "     \
     "next id; None: none) and whether a put whose UNIQ_KEY is stored already answers the "   \
     "first put's result instead of storing it again."},

#endif
