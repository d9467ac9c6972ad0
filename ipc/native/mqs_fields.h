/* A put's arguments, read and checked in C: `put`'s fields, a batch's dicts and
 * `engine.record.Message`s become validated messages whose properties (the caller's,
 * then TAGS, then KEYS) are encoded into one arena, or a refusal with RocketMQ's status
 * and the reason. The Python reference is `engine.record.encode` (properties_problem,
 * encode_properties), `engine.names.topic_problem` and `queue_id_problem` (in
 * tests/native/put_reference.py); tests/native/test_put_message.py compares them shape
 * by shape.
 *
 * Two steps per message, in the client's order: the types of every message of a call
 * first (MQS_FIELDS_TYPES: a type the C put does not read, and the client's Python
 * door, `ipc.accepts`, raises the TypeError or hands the call over in plain types),
 * then each message's content. */
#ifndef MQS_FIELDS_H
#define MQS_FIELDS_H

#include "mqs_appender.h"

/* ipc.results.PutMessageStatus, in its order (the client hands the members over). */
enum mqs_status {
    MQS_ST_PUT_OK,
    MQS_ST_FLUSH_DISK_TIMEOUT,
    MQS_ST_FLUSH_SLAVE_TIMEOUT,
    MQS_ST_SLAVE_NOT_AVAILABLE,
    MQS_ST_SERVICE_NOT_AVAILABLE,
    MQS_ST_CREATE_MAPPED_FILE_FAILED,
    MQS_ST_MESSAGE_ILLEGAL,
    MQS_ST_PROPERTIES_SIZE_EXCEEDED,
    MQS_ST_OS_PAGECACHE_BUSY,
    MQS_ST_UNKNOWN_ERROR,
    MQS_ST_FLUSH_DISK_FAILED,
    MQS_STATUSES
};

enum { MQS_FIELDS_OK = 1, MQS_FIELDS_REFUSED = 2, MQS_FIELDS_ERROR = -1, MQS_FIELDS_TYPES = -2 };

/* A put refused before anything was reserved: its status and reason (owned). */
struct mqs_refusal {
    int status;
    PyObject *reason;
};

/* The properties of a call's messages, one after the other: in `local` while they fit
 * (a put's do), else PyMem. Start with MQS_ARENA_INIT(arena). */
struct mqs_arena {
    uint8_t *buf;
    size_t len, cap;
    uint8_t local[512];
};
#define MQS_ARENA_INIT(a) ((a).buf = (a).local, (a).len = 0, (a).cap = sizeof(a).local)

/* A lane (ipc.producer: `Lanes.new`): [topic bytes, queue count, round-robin modulus,
 * round-robin counter, queue-table row per queue id (-1: not known yet)]. */
enum { MQS_LANE_TOPIC, MQS_LANE_QUEUES, MQS_LANE_RR_N, MQS_LANE_RR, MQS_LANE_QSLOTS,
       MQS_LANE_FIELDS };

enum { MQS_F_TOPIC, MQS_F_BODY, MQS_F_TAGS, MQS_F_KEYS, MQS_F_PROPS, MQS_F_QID, MQS_F_DELAY,
       MQS_FIELDS };

/* One message of a call while it is read (all references owned). */
struct mqs_fields {
    PyObject *f[MQS_FIELDS]; /* NULL: absent (None for a put's argument) */
    PyObject *lane;          /* its topic's lane (ipc.producer: Lanes) */
    PyObject *rr_before;     /* the lane's round-robin counter before this message took it */
    PyObject *message;       /* a Message's (born addr, port, sys flag, flag, reconsume
                              * times, prepared offset, born time), from the client */
    Py_buffer body;          /* .obj: a body held as a buffer (not a bytes object) */
    size_t props_off;
    PyObject *unknown; /* a batch dict with keys besides put's fields */
    int missing; /* a batch dict without topic (1) or body (2) */
    int no_uniq; /* 1: the properties were encoded knowing none is named UNIQ_KEY */
    /* A put's `properties`, encoded in step 1 (its pass over the dict both checks the
     * types and writes them, mqs_fields_of_args): 0 not yet, else 1 + props_ascii's
     * answer (ASCII and fine, or the checked pass is to run), and whether a name was
     * UNIQ_KEY. */
    int props_done, uniq_named;
    /* A delayed message (delay_level > 0, delay_rewrite in mqs_fields.c): its real topic's lane,
     * whose round robin it took, once `lane` is the schedule topic's. */
    PyObject *real_lane;
};

/* Module init: the interned names. */
int mqs_fields_ready(void);

/* Step 1 for put's arguments `args` (topic, body, tags, keys, properties, queue_id) and
 * its delay level (NULL: none). `arena` (empty: the call's only message) receives the
 * properties when they are ASCII and fine, written in the pass that checks their types. */
int mqs_fields_of_args(struct mqs_fields *m, PyObject *const *args, PyObject *delay,
                       struct mqs_arena *arena);

/* Step 1 for messages[i] of a batch: a dict of put's fields or a Message (`message_type`;
 * `message_fields(i, m)` checks its other fields' types and answers the tuple above or
 * the reason it is refused). */
int mqs_fields_of_item(struct mqs_fields *m, PyObject *item, Py_ssize_t i,
                       PyObject *message_type, PyObject *message_fields);

/* Step 2: the content. Fills `it` (its properties at m->props_off in the arena, to be
 * pointed at once the arena stops growing) or says why not in `why`. `born`: now (ms);
 * `c`: the client's lanes and their maker, maxMessageSize, store host, highest delay. */
int mqs_fields_check(struct mqs_fields *m, struct mqs_item *it, struct mqs_arena *arena,
                     struct mqs_refusal *why, const struct mqs_client *c, int64_t seg_size,
                     int64_t born);

/* Put the lane's round-robin counter back (a call that did nothing), and drop m's refs. */
void mqs_fields_undo(struct mqs_fields *m);
void mqs_fields_release(struct mqs_fields *m);

/* Room for `n` more bytes at a->buf + a->len (0), or -1 with MemoryError. Inline: a put
 * asks once per property and key, and the room is almost always there. */
int mqs_arena_grow(struct mqs_arena *a, size_t n);
static inline int mqs_arena_room(struct mqs_arena *a, size_t n)
{
    return a->len + n <= a->cap ? 0 : mqs_arena_grow(a, n);
}
void mqs_arena_free(struct mqs_arena *a);

/* Refuse the message: `reason` (NULL: its making failed) and `status` into `why`;
 * MQS_FIELDS_REFUSED, or MQS_FIELDS_ERROR when `reason` is NULL. */
int mqs_fields_refuse(struct mqs_refusal *why, int status, PyObject *reason);

#endif
