/* Client message ids (RocketMQ's MessageClientIDSetter) and the idempotence table: see
 * mqs_uniq.h. */
#include "mqs_uniq.h"

#include <pthread.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "mqs_args.h"
#include "mqs_futex.h"
#include "mqs_layout.h"

#define IDEM_MAX_AGE_MS (24LL * 3600 * 1000) /* an entry older than this is not matched */
#define SEQ_SET (1ULL << 63)

static unsigned uniq_fork_gen; /* bumped in a forked child: its ids are its parent's */

static void uniq_after_fork(void)
{
    uniq_fork_gen++;
}

/* ---- UniqIds ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    uint8_t fix[10]; /* ip, pid (short), hash: the producer id */
    uint32_t counter, in_diff;
    int64_t diff, month_start, next_month, fixed_ms;
    unsigned fork_gen;
    int given_pid; /* pid and hash given (a test's seam): kept after a fork */
} UniqIds;

static PyTypeObject UniqIdsType;

static int64_t now_ms(const UniqIds *s)
{
    return s->fixed_ms >= 0 ? s->fixed_ms : mqs_wall_ms();
}

/* MessageClientIDSetter.setStartTime: the local month's first ms, and the next's. */
static void set_start(UniqIds *s, int64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    tm.tm_mday = 1;
    tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
    tm.tm_isdst = -1;
    struct tm next = tm;
    s->month_start = (int64_t)mktime(&tm) * 1000;
    next.tm_mon += 1;
    next.tm_isdst = -1;
    s->next_month = (int64_t)mktime(&next) * 1000;
    s->diff = -1;
    s->in_diff = 0;
}

static void set_producer(UniqIds *s, uint16_t pid, uint32_t hash)
{
    s->fix[4] = (uint8_t)(pid >> 8);
    s->fix[5] = (uint8_t)pid;
    for (int i = 0; i < 4; i++)
        s->fix[6 + i] = (uint8_t)(hash >> (24 - 8 * i));
}

static uint32_t random_hash(void)
{
    uint32_t h = 0;
    if (getrandom(&h, sizeof h, 0) != (ssize_t)sizeof h) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        h = (uint32_t)t.tv_nsec ^ (uint32_t)getpid() * 2654435761U;
    }
    return h;
}

/* The producer id (the ids' first 10 bytes); a forked child is another producer. */
static const uint8_t *producer(UniqIds *s)
{
    if (s->fork_gen != uniq_fork_gen) {
        s->fork_gen = uniq_fork_gen;
        if (!s->given_pid)
            set_producer(s, (uint16_t)getpid(), random_hash());
    }
    return s->fix;
}

/* The next id's 16 bytes: createUniqID, with the time kept from going back and from
 * holding more than 65536 ids in one ms (so no id repeats within a month). */
static void next_id(UniqIds *s, uint8_t out[MQS_UNIQ_BYTES], int64_t now)
{
    producer(s);
    if (s->fixed_ms >= 0)
        now = s->fixed_ms;
    if (now >= s->next_month)
        set_start(s, now);
    int64_t diff = now - s->month_start;
    if (diff < 0) /* the clock went back over the month's start */
        diff = 0;
    if (diff < s->diff)
        diff = s->diff;
    if (diff == s->diff && s->in_diff >= 65536)
        diff = s->diff + 1;
    if (diff != s->diff) {
        s->diff = diff;
        s->in_diff = 0;
    }
    s->in_diff++;
    memcpy(out, s->fix, 10);
    uint32_t d = (uint32_t)diff;
    uint16_t n = (uint16_t)s->counter++;
    out[10] = (uint8_t)(d >> 24);
    out[11] = (uint8_t)(d >> 16);
    out[12] = (uint8_t)(d >> 8);
    out[13] = (uint8_t)d;
    out[14] = (uint8_t)(n >> 8);
    out[15] = (uint8_t)n;
}

/* Each byte's two hex digits, made once (every put writes 16 bytes of id as hex). */
#define HD(d) (char)((d) < 10 ? '0' + (d) : 'A' - 10 + (d))
#define H2(b) HD((b) >> 4), HD((b) & 15)
#define H2x4(b) H2(b), H2((b) + 1), H2((b) + 2), H2((b) + 3)
#define H2x16(b) H2x4(b), H2x4((b) + 4), H2x4((b) + 8), H2x4((b) + 12)
#define H2x64(b) H2x16(b), H2x16((b) + 16), H2x16((b) + 32), H2x16((b) + 48)
static const char hex2[512] = {H2x64(0), H2x64(64), H2x64(128), H2x64(192)};

void mqs_hex(const uint8_t *b, int n, char *out)
{
    int i = 0;
#ifdef __SSE2__
    const __m128i low = _mm_set1_epi8(0x0F), nine = _mm_set1_epi8(9);
    for (; i + 8 <= n; i += 8) { /* 8 bytes: their nibbles interleaved, high first, to digits */
        __m128i v = _mm_loadl_epi64((const __m128i *)(const void *)(b + i));
        __m128i d = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
        d = _mm_add_epi8(d, _mm_add_epi8(_mm_set1_epi8('0'),
                                         _mm_and_si128(_mm_cmpgt_epi8(d, nine), _mm_set1_epi8(7))));
        _mm_storeu_si128((__m128i *)(void *)(out + 2 * i), d);
    }
#endif
    for (; i < n; i++)
        memcpy(out + 2 * i, hex2 + 2 * b[i], 2);
}

static int hex_val(uint8_t ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/* 32 hex digits into 16 bytes: 1, else 0. */
static int parse_key(const uint8_t *p, size_t len, uint8_t out[MQS_UNIQ_BYTES])
{
    if (len != MQS_UNIQ_HEX)
        return 0;
    for (int i = 0; i < MQS_UNIQ_BYTES; i++) {
        int hi = hex_val(p[2 * i]), lo = hex_val(p[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return 0;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 1;
}

static int uniqids_init(UniqIds *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ip", "pid", "hash", "clock_ms", NULL};
    PyObject *ip, *pid_o = Py_None, *hash_o = Py_None, *clock_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOO:UniqIds", kwlist, &ip, &pid_o, &hash_o,
                                     &clock_o))
        return -1;
    const uint8_t *p;
    size_t n;
    if (mqs_arg_bytes(ip, "ip", &p, &n) < 0)
        return -1;
    if (n != 4) {
        PyErr_SetString(PyExc_ValueError, "UniqIds() ip must be 4 bytes (an IPv4 address)");
        return -1;
    }
    if ((pid_o == Py_None) != (hash_o == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "UniqIds() takes pid and hash together, or neither");
        return -1;
    }
    int64_t pid = getpid(), hash = 0, clock = -1;
    self->given_pid = pid_o != Py_None;
    if (self->given_pid &&
        (mqs_arg_i64(pid_o, "pid", &pid) < 0 || mqs_arg_i64(hash_o, "hash", &hash) < 0))
        return -1;
    if (clock_o != Py_None && mqs_arg_i64(clock_o, "clock_ms", &clock) < 0)
        return -1;
    if (pid < 0 || pid > 0xFFFFFFFFLL || hash < 0 || hash > 0xFFFFFFFFLL || (clock < 0 && clock_o != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "UniqIds() pid and hash are u32, clock_ms >= 0");
        return -1;
    }
    memcpy(self->fix, p, 4);
    set_producer(self, (uint16_t)pid, self->given_pid ? (uint32_t)hash : random_hash());
    self->counter = 0;
    self->fixed_ms = clock;
    self->fork_gen = uniq_fork_gen;
    set_start(self, now_ms(self));
    return 0;
}

static PyObject *uniqids_next(UniqIds *self, PyObject *Py_UNUSED(a))
{
    uint8_t b[MQS_UNIQ_BYTES];
    next_id(self, b, now_ms(self));
    PyObject *s = PyUnicode_New(MQS_UNIQ_HEX, 127);
    if (s)
        mqs_hex(b, MQS_UNIQ_BYTES, (char *)PyUnicode_1BYTE_DATA(s));
    return s;
}

static PyObject *uniqids_producer(UniqIds *self, void *Py_UNUSED(c))
{
    uint8_t b[MQS_UNIQ_BYTES];
    memcpy(b, producer(self), 10);
    PyObject *s = PyUnicode_New(20, 127);
    if (s)
        mqs_hex(b, 10, (char *)PyUnicode_1BYTE_DATA(s));
    return s;
}

static PyObject *uniqids_set_clock(UniqIds *self, PyObject *arg)
{
    int64_t ms = -1;
    if (arg != Py_None && (mqs_arg_i64(arg, "clock_ms", &ms) < 0))
        return NULL;
    if (arg != Py_None && ms < 0) {
        PyErr_SetString(PyExc_ValueError, "clock_ms must be >= 0");
        return NULL;
    }
    self->fixed_ms = ms;
    Py_RETURN_NONE;
}

static PyMethodDef uniqids_methods[] = {
    {"next", (PyCFunction)uniqids_next, METH_NOARGS,
     "next() -> str: a new UNIQ_KEY (32 hex digits), as a put without one gets."},
    {"set_clock", (PyCFunction)uniqids_set_clock, METH_O,
     "set_clock(ms | None): the time ids are made at (a test's seam; None: the real clock)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef uniqids_getset[] = {
    {"producer_id", (getter)uniqids_producer, NULL,
     "the producer id: the ids' first 10 bytes (IPv4, pid, hash) as 20 hex digits", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject UniqIdsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mqstore._native.UniqIds",
    .tp_basicsize = sizeof(UniqIds),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "UniqIds(ip, pid=None, hash=None, clock_ms=None): one client's RocketMQ "
              "message ids (MessageClientIDSetter); pid and hash default to the process's "
              "and a random one, the clock to the real one.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)uniqids_init,
    .tp_methods = uniqids_methods,
    .tp_getset = uniqids_getset,
};

/* ---- the stamp ----------------------------------------------------------------------- */

int mqs_uniq_stamp(struct mqs_uniq_client *u, struct mqs_fields *m, struct mqs_item *it,
                   struct mqs_arena *arena, struct mqs_refusal *why, int64_t seg_size,
                   int64_t now)
{
    const uint8_t *p = arena->buf + m->props_off;
    size_t len = it->msg.props_len, pos = 0;
    PyObject *given = m->f[MQS_F_PROPS];
    if (given == NULL || given == Py_None || m->no_uniq) /* no UNIQ_KEY to find */
        pos = len;
    while (pos < len) { /* name \1 value \2, as mqs_fields.c encodes them */
        const uint8_t *one = memchr(p + pos, 1, len - pos);
        if (one == NULL)
            break;
        const uint8_t *two = memchr(one + 1, 2, (size_t)(p + len - one - 1));
        size_t end = two ? (size_t)(two - p) : len;
        if (one - (p + pos) == 8 && memcmp(p + pos, "UNIQ_KEY", 8) == 0) {
            it->uniq_off = (int32_t)(one + 1 - p);
            it->uniq_len = (int32_t)(end - (size_t)it->uniq_off);
            /* a retry key: 32 hex digits this client made (its producer id), so that a
             * message re-put by another client with its properties (a delayed or
             * consumer-retried message keeps its UNIQ_KEY) is stored, not answered */
            it->uniq_kind = parse_key(one + 1, (size_t)it->uniq_len, it->uniq) && u->ids &&
                                    memcmp(it->uniq, producer((UniqIds *)u->ids), 10) == 0
                                ? MQS_UNIQ_GIVEN
                                : MQS_UNIQ_OTHER;
            return MQS_FIELDS_OK;
        }
        pos = end + 1;
    }
    if (u->ids == NULL)
        return MQS_FIELDS_OK;
    if (len + MQS_UNIQ_PROP_LEN > 32767)
        return mqs_fields_refuse(why, MQS_ST_PROPERTIES_SIZE_EXCEEDED,
                       PyUnicode_FromFormat("properties are %zu UTF-8 bytes with the UNIQ_KEY "
                                            "the put adds (%d); at most 32767 are allowed",
                                            len + MQS_UNIQ_PROP_LEN, MQS_UNIQ_PROP_LEN));
    if (mqs_arena_room(arena, MQS_UNIQ_PROP_LEN) < 0)
        return MQS_FIELDS_ERROR;
    uint8_t *d = arena->buf + arena->len;
    next_id((UniqIds *)u->ids, it->uniq, now);
    memcpy(d, "UNIQ_KEY\1", 9);
    mqs_hex(it->uniq, MQS_UNIQ_BYTES, (char *)d + 9);
    d[MQS_UNIQ_PROP_LEN - 1] = 2;
    arena->len += MQS_UNIQ_PROP_LEN;
    it->uniq_off = (int32_t)(len + 9);
    it->uniq_len = MQS_UNIQ_HEX;
    it->uniq_kind = MQS_UNIQ_GENERATED;
    it->msg.props_len = len + MQS_UNIQ_PROP_LEN;
    it->size = (int64_t)mqs_record_length(&it->msg);
    if (it->size + MQS_END_FILE_MIN_BLANK > seg_size)
        return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL,
                       PyUnicode_FromFormat("record of %lld bytes does not fit a %lld-byte "
                                            "segment",
                                            (long long)it->size, (long long)seg_size));
    return MQS_FIELDS_OK;
}

PyObject *mqs_uniq_str(const struct mqs_item *it)
{
    if (it == NULL || it->uniq_kind == 0)
        return PyUnicode_New(0, 127);
    const uint8_t *v = it->msg.props + it->uniq_off;
    if (it->uniq_kind != MQS_UNIQ_OTHER) {
        PyObject *s = PyUnicode_New(MQS_UNIQ_HEX, 127);
        if (s)
            memcpy(PyUnicode_1BYTE_DATA(s), v, MQS_UNIQ_HEX);
        return s;
    }
    return PyUnicode_DecodeUTF8((const char *)v, it->uniq_len, "replace");
}

/* ---- the idempotence table ----------------------------------------------------------- */

/* Row head: id_a u64, id_b u64 (| SEQ_SET: in use), last_used i64 (the newest store
 * time noted), next i64 (puts noted).
 * Entry: seq u64 (| SEQ_SET), offset, queue offset, store ts, slot seq (i64), size,
 * queue id, state (i32). */
enum { R_IDA = 0, R_IDB = 8, R_USED = 16, R_NEXT = 24 };
enum { E_SEQ = 0, E_OFF = 8, E_QO = 16, E_TS = 24, E_SLOT = 32, E_SIZE = 40, E_QID = 44, E_STATE = 48 };

static uint8_t *table_of(uint8_t *ctl, int64_t qtable_off, int64_t ctl_len)
{
    int64_t off = qtable_off + *mqs_i64(ctl, MQS_OFF_QCAP) * MQS_QROW;
    if (off <= 0 || off + MQS_IDEM_SIZE > ctl_len)
        return NULL;
    return ctl + off;
}

static uint64_t u64_of(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

struct key {
    uint64_t ida, idb, seq;
};

static struct key split(const uint8_t k[MQS_UNIQ_BYTES])
{
    struct key s;
    s.ida = u64_of(k);
    s.idb = (uint64_t)k[8] | (uint64_t)k[9] << 8 | SEQ_SET;
    s.seq = SEQ_SET;
    for (int i = 10; i < 16; i++)
        s.seq |= (uint64_t)k[i] << (8 * (15 - i));
    return s;
}

static uint8_t *row_at(uint8_t *t, int64_t i)
{
    return t + MQS_IDEM_HEAD + i * MQS_IDEM_ROW;
}

static int row_is(uint8_t *row, const struct key *k)
{
    return *(uint64_t *)(void *)(row + R_IDA) == k->ida && *(uint64_t *)(void *)(row + R_IDB) == k->idb;
}

/* The producer's row (`make`: made, taking an empty or the least recently used one of
 * its probe run), or NULL. */
static uint8_t *find_row(struct mqs_uniq_client *u, uint8_t *t, const struct key *k, int make)
{
    if (u && u->row >= 0 && u->row < MQS_IDEM_PRODUCERS && row_is(row_at(t, u->row), k))
        return row_at(t, u->row);
    uint64_t h = (k->ida ^ (k->idb * 0x9E3779B97F4A7C15ULL)) * 0xBF58476D1CE4E5B9ULL;
    int64_t start = (int64_t)((h >> 32) % MQS_IDEM_PRODUCERS), pick = -1;
    int64_t oldest = INT64_MAX;
    for (int64_t j = 0; j < MQS_IDEM_PROBE; j++) {
        int64_t i = (start + j) % MQS_IDEM_PRODUCERS;
        uint8_t *row = row_at(t, i);
        if (row_is(row, k)) {
            if (u)
                u->row = i;
            return row;
        }
        int64_t used = *mqs_i64(row, R_USED);
        if (*(uint64_t *)(void *)(row + R_IDB) == 0)
            used = -1; /* empty: taken first */
        if (used < oldest) {
            oldest = used;
            pick = i;
        }
    }
    if (!make)
        return NULL;
    uint8_t *row = row_at(t, pick);
    memset(row, 0, MQS_IDEM_ROW);
    *(uint64_t *)(void *)(row + R_IDA) = k->ida;
    *(uint64_t *)(void *)(row + R_IDB) = k->idb;
    if (u)
        u->row = pick;
    return row;
}

static uint8_t *entry_at(uint8_t *row, int64_t i)
{
    return row + MQS_IDEM_ROW_HEAD + i * MQS_IDEM_ENTRY;
}

static uint8_t *find_entry(uint8_t *row, uint64_t seq)
{
    for (int64_t i = 0; i < MQS_IDEM_WINDOW; i++) {
        uint8_t *e = entry_at(row, i);
        if (*(uint64_t *)(void *)(e + E_SEQ) == seq)
            return e;
    }
    return NULL;
}

/* The stored entry of a retry key: DONE (a duplicate), PENDING still in flight, or
 * NULL (never stored, forgotten, too old, or its reservation was filled). */
static uint8_t *stored(struct mqs_uniq_client *u, uint8_t *t, const uint8_t k16[16], int64_t now,
                       int64_t published_seq, int *inflight)
{
    struct key k = split(k16);
    uint8_t *row = find_row(u, t, &k, 0), *e = row ? find_entry(row, k.seq) : NULL;
    *inflight = 0;
    if (e == NULL || *mqs_i64(e, E_TS) < now - IDEM_MAX_AGE_MS)
        return NULL;
    int32_t state = __atomic_load_n(mqs_i32(e, E_STATE), __ATOMIC_ACQUIRE);
    if (state == MQS_IDEM_DONE)
        return e;
    if (state == MQS_IDEM_PENDING && *mqs_i64(e, E_SLOT) >= published_seq)
        *inflight = 1;
    return NULL;
}

int mqs_idem_check(struct mqs_uniq_client *u, struct mqs_appender *a, int64_t ctl_len,
                   struct mqs_item *items, int n, int64_t *qoffs)
{
    if (!u->idempotent)
        return MQS_OK;
    int given = 0;
    for (int i = 0; i < n; i++)
        given += items[i].uniq_kind == MQS_UNIQ_GIVEN;
    uint8_t *t = given ? table_of(a->ctl, a->qtable_off, ctl_len) : NULL;
    if (t == NULL)
        return MQS_OK;
    int64_t now = mqs_wall_ms();
    int64_t published = __atomic_load_n(mqs_i64(a->ctl, MQS_OFF_PUBLISHED_SEQ), __ATOMIC_ACQUIRE);
    int dups = 0, inflight;
    for (int i = 0; i < n; i++) {
        struct mqs_item *it = &items[i];
        if (it->uniq_kind != MQS_UNIQ_GIVEN)
            continue;
        uint8_t *e = stored(u, t, it->uniq, now, published, &inflight);
        if (inflight)
            return MQS_IDEM_INFLIGHT;
        if (e == NULL)
            continue;
        dups++;
        it->dup_off = *mqs_i64(e, E_OFF);
        it->dup_qo = *mqs_i64(e, E_QO);
        it->dup_ts = *mqs_i64(e, E_TS);
        it->dup_size = *mqs_i32(e, E_SIZE);
        it->dup_qid = *mqs_i32(e, E_QID);
    }
    if (dups < n) /* a call is recognised whole or not at all */
        return MQS_OK;
    for (int i = 0; i < n; i++) {
        items[i].msg.queue_id = items[i].dup_qid;
        qoffs[i] = items[i].dup_qo;
    }
    return MQS_IDEM_DUP;
}

/* Note one put's key at its position, in `state`; the entry's offset in the block. */
static int64_t note(struct mqs_uniq_client *u, uint8_t *ctl, uint8_t *t, const uint8_t k16[16],
                    int fresh, int64_t off, int64_t size, int32_t qid, int64_t qo, int64_t ts,
                    int64_t slot, int32_t state)
{
    struct key k = split(k16);
    uint8_t *row = find_row(u, t, &k, 1), *e = fresh ? NULL : find_entry(row, k.seq);
    int64_t *next = mqs_i64(row, R_NEXT);
    if (e == NULL)
        e = entry_at(row, (*next)++ % MQS_IDEM_WINDOW);
    int64_t *used = mqs_i64(row, R_USED);
    if (*used < ts) /* the last use, by store time: no word all producers write */
        *used = ts;
    __atomic_store_n(mqs_i32(e, E_STATE), 0, __ATOMIC_RELEASE);
    *(uint64_t *)(void *)(e + E_SEQ) = k.seq;
    *mqs_i64(e, E_OFF) = off;
    *mqs_i64(e, E_QO) = qo;
    *mqs_i64(e, E_TS) = ts;
    *mqs_i64(e, E_SLOT) = slot;
    *mqs_i32(e, E_SIZE) = (int32_t)size;
    *mqs_i32(e, E_QID) = qid;
    __atomic_store_n(mqs_i32(e, E_STATE), state, __ATOMIC_RELEASE);
    return e - ctl;
}

void mqs_idem_note(struct mqs_uniq_client *u, struct mqs_appender *a, int64_t ctl_len,
                   const struct mqs_item *items, int n, const int64_t *qoffs,
                   const struct mqs_reservation *r)
{
    uint8_t *t = u->idempotent ? table_of(a->ctl, a->qtable_off, ctl_len) : NULL;
    if (t == NULL)
        return;
    int64_t at = r->start, slot = r->seq + (r->blank ? 1 : 0);
    for (int i = 0; i < n; i++) {
        struct mqs_item *it = (struct mqs_item *)&items[i];
        if (it->uniq_kind == MQS_UNIQ_GENERATED || it->uniq_kind == MQS_UNIQ_GIVEN)
            it->idem_at = note(u, a->ctl, t, it->uniq, it->uniq_kind == MQS_UNIQ_GENERATED, at,
                               it->size, it->msg.queue_id, qoffs[i], r->store_ts, slot + i,
                               MQS_IDEM_PENDING);
        at += it->size;
    }
}

void mqs_idem_done(struct mqs_uniq_client *u, struct mqs_appender *a, int64_t ctl_len,
                   const struct mqs_item *items, int n, const struct mqs_reservation *r)
{
    if (!u->idempotent)
        return;
    int64_t slot = r->seq + (r->blank ? 1 : 0);
    for (int i = 0; i < n; i++) {
        int64_t at = items[i].idem_at;
        if (at <= 0 || at + MQS_IDEM_ENTRY > ctl_len)
            continue;
        uint8_t *e = a->ctl + at;
        if (*mqs_i64(e, E_SLOT) == slot + i && *(uint64_t *)(void *)(e + E_SEQ) == split(items[i].uniq).seq)
            __atomic_store_n(mqs_i32(e, E_STATE), MQS_IDEM_DONE, __ATOMIC_RELEASE);
    }
}

void mqs_uniq_clear(struct mqs_uniq_client *u)
{
    Py_CLEAR(u->ids);
    u->idempotent = 0;
    u->row = -1;
}

/* ---- Python entry points --------------------------------------------------------------- */

/* The table of a control block buffer, or NULL with ValueError. */
static uint8_t *table_of_buffer(Py_buffer *v)
{
    uint8_t *ctl = v->buf;
    if (v->len < MQS_SLOTS_OFF || *mqs_i64(ctl, 0) != MQS_MAGIC_VERSION) {
        PyErr_SetString(PyExc_ValueError, "ctl is not a control block of layout version 4");
        return NULL;
    }
    int64_t slots = *mqs_i64(ctl, MQS_OFF_SLOT_COUNT);
    uint8_t *t = slots > 0 && slots <= (1 << 24)
                     ? table_of(ctl, MQS_SLOTS_OFF + slots * MQS_SLOT_ROW, v->len)
                     : NULL;
    if (t == NULL)
        PyErr_SetString(PyExc_ValueError, "the control block has no idempotence table");
    return t;
}

static int key_arg(PyObject *o, uint8_t k[16])
{
    if (!PyUnicode_Check(o) || !PyUnicode_IS_ASCII(o) ||
        !parse_key(PyUnicode_1BYTE_DATA(o), (size_t)PyUnicode_GET_LENGTH(o), k)) {
        PyErr_SetString(PyExc_ValueError, "uniq_key must be 32 hex digits");
        return -1;
    }
    return 0;
}

/* idem_note(ctl, uniq_key, offset, size, queue_id, queue_offset, store_ts): a stored put
 * DONE in the table (the supervisor, from the log, before the block serves). */
static PyObject *idem_note(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "idem_note(ctl, uniq_key, offset, size, queue_id, "
                                         "queue_offset, store_ts) takes 7 arguments");
        return NULL;
    }
    int64_t v[5];
    const char *names[] = {"offset", "size", "queue_id", "queue_offset", "store_ts"};
    uint8_t k[16];
    for (int i = 0; i < 5; i++)
        if (mqs_arg_i64(args[2 + i], names[i], &v[i]) < 0)
            return NULL;
    if (key_arg(args[1], k) < 0)
        return NULL;
    Py_buffer view;
    if (mqs_arg_wbuffer(args[0], "ctl", &view) < 0)
        return NULL;
    uint8_t *t = table_of_buffer(&view);
    if (t)
        note(NULL, view.buf, t, k, 0, v[0], v[1], (int32_t)v[2], v[3], v[4], -1, MQS_IDEM_DONE);
    PyBuffer_Release(&view);
    if (t == NULL)
        return NULL;
    Py_RETURN_NONE;
}

/* idem_find(ctl, uniq_key) -> (state, offset, size, queue_id, queue_offset, store_ts) |
 * None: what the table holds for a key (tests, `mqstore status`). */
static PyObject *idem_find(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "idem_find(ctl, uniq_key) takes 2 arguments");
        return NULL;
    }
    uint8_t k[16];
    if (key_arg(args[1], k) < 0)
        return NULL;
    Py_buffer view;
    if (mqs_arg_buffer(args[0], "ctl", &view) < 0)
        return NULL;
    uint8_t *t = table_of_buffer(&view);
    PyObject *out = NULL;
    if (t) {
        struct key ks = split(k);
        uint8_t *row = find_row(NULL, t, &ks, 0), *e = row ? find_entry(row, ks.seq) : NULL;
        out = e == NULL ? Py_NewRef(Py_None)
                        : Py_BuildValue("iLiiLL", *mqs_i32(e, E_STATE), (long long)*mqs_i64(e, E_OFF),
                                        *mqs_i32(e, E_SIZE), *mqs_i32(e, E_QID),
                                        (long long)*mqs_i64(e, E_QO), (long long)*mqs_i64(e, E_TS));
    }
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef uniq_functions[] = {
    {"idem_note", (PyCFunction)(void (*)(void))idem_note, METH_FASTCALL,
     "idem_note(ctl, uniq_key, offset, size, queue_id, queue_offset, store_ts): note a stored "
     "put in the control block's idempotence table (the supervisor, from the log)."},
    {"idem_find", (PyCFunction)(void (*)(void))idem_find, METH_FASTCALL,
     "idem_find(ctl, uniq_key) -> (state, offset, size, queue_id, queue_offset, store_ts) | "
     "None: the table's entry for a key (1 pending, 2 stored)."},
    {NULL, NULL, 0, NULL},
};

PyObject *mqs_uniq_use(Appender *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ids", "idempotent", NULL};
    PyObject *ids;
    int idem;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Op:use_ids", kwlist, &ids, &idem))
        return NULL;
    if (ids != Py_None && !PyObject_TypeCheck(ids, &UniqIdsType)) {
        PyErr_SetString(PyExc_TypeError, "use_ids() ids must be a UniqIds or None");
        return NULL;
    }
    mqs_uniq_clear(&self->c.uniq);
    self->c.uniq.ids = ids == Py_None ? NULL : Py_NewRef(ids);
    self->c.uniq.idempotent = idem;
    Py_RETURN_NONE;
}

int mqs_uniq_add(PyObject *m)
{
    static int registered;
    if (!registered && pthread_atfork(NULL, NULL, uniq_after_fork) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
        return -1;
    }
    registered = 1;
    if (PyType_Ready(&UniqIdsType) < 0 ||
        PyModule_AddObjectRef(m, "UniqIds", (PyObject *)&UniqIdsType) < 0 ||
        PyModule_AddFunctions(m, uniq_functions) < 0 ||
        PyModule_AddIntConstant(m, "IDEM_PRODUCERS", MQS_IDEM_PRODUCERS) < 0 ||
        PyModule_AddIntConstant(m, "IDEM_WINDOW", MQS_IDEM_WINDOW) < 0 ||
        PyModule_AddIntConstant(m, "IDEM_SIZE", MQS_IDEM_SIZE) < 0)
        return -1;
    return 0;
}
