#define _GNU_SOURCE
#include "mqs_append.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "mqs_crashpoint.h"
#include "mqs_futex.h"
#include "mqs_layout.h"

static pthread_mutex_t *mutex_of(uint8_t *ctl)
{
    return (pthread_mutex_t *)(void *)(ctl + MQS_OFF_RESERVE_MUTEX);
}

static int64_t load(uint8_t *ctl, int64_t off)
{
    return __atomic_load_n(mqs_i64(ctl, off), __ATOMIC_ACQUIRE);
}

static void store(uint8_t *ctl, int64_t off, int64_t v)
{
    __atomic_store_n(mqs_i64(ctl, off), v, __ATOMIC_RELEASE);
}

int mqs_mutex_init(uint8_t *ctl)
{
    _Static_assert(sizeof(pthread_mutex_t) <= MQS_OFF_FLUSH_SEQ - MQS_OFF_RESERVE_MUTEX,
                   "the mutex must fit its 64 bytes");
    pthread_mutexattr_t at;
    int rc = pthread_mutexattr_init(&at);
    if (rc == 0)
        rc = pthread_mutexattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    if (rc == 0)
        rc = pthread_mutexattr_setrobust(&at, PTHREAD_MUTEX_ROBUST);
    if (rc == 0)
        rc = pthread_mutex_init(mutex_of(ctl), &at);
    pthread_mutexattr_destroy(&at);
    return rc;
}

/* The holder died inside the section. Its intent record (cs_pid, cs_seq) says which
 * slots it may have reserved: those below `seq` are committed (the commit point is the
 * store of reserved/seq) and keep their queue offsets, so the queue rows' next offsets
 * are moved past them (the holder may have died before writing them back). Slots at or
 * after `seq` were never committed and are overwritten by the next reservation. Their
 * RESERVED slots are filled by the publisher once it sees the pid dead. Values out of
 * range (a block written by someone else) are skipped, never followed: `ctl_len` bounds
 * every row. */
static void repair(uint8_t *ctl, int64_t ctl_len)
{
    int64_t cs_pid = load(ctl, MQS_OFF_CS_PID);
    if (cs_pid != 0) {
        int64_t slot_count = load(ctl, MQS_OFF_SLOT_COUNT), qcap = load(ctl, MQS_OFF_QCAP);
        int64_t seq = load(ctl, MQS_OFF_SEQ), from = load(ctl, MQS_OFF_CS_SEQ);
        int sane = slot_count > 0 && qcap > 0 && slot_count <= (ctl_len - MQS_SLOTS_OFF) / MQS_SLOT_ROW &&
                   qcap <= (ctl_len - MQS_SLOTS_OFF - slot_count * MQS_SLOT_ROW) / MQS_QROW &&
                   from >= 0 && from <= seq && seq - from <= slot_count;
        int64_t qtable_off = MQS_SLOTS_OFF + (sane ? slot_count : 0) * MQS_SLOT_ROW;
        for (int64_t s = from; sane && s < seq; s++) {
            int64_t row = MQS_SLOTS_OFF + (s % slot_count) * MQS_SLOT_ROW;
            int32_t qslot = *mqs_i32(ctl, row + MQS_SLOT_QSLOT);
            int64_t qo = *mqs_i64(ctl, row + MQS_SLOT_QO);
            if (qslot >= 0 && qslot < qcap) {
                int64_t *next = mqs_i64(ctl, qtable_off + qslot * MQS_QROW + MQS_QROW_NEXT);
                if (*next < qo + 1)
                    store(ctl, (uint8_t *)next - ctl, qo + 1);
            }
        }
        store(ctl, MQS_OFF_CS_PID, 0);
    }
}

/* `rc`: the mutex call's; `now`: CLOCK_MONOTONIC ns read just before it, when it did not
 * wait (the put's own clock read, reused for the holder's stamp), else 0. */
static int locked(uint8_t *ctl, int64_t ctl_len, int rc, int64_t now)
{
    if (rc == 0) {
        if (load(ctl, MQS_OFF_CS_PID) != 0) { /* an intent left without EOWNERDEAD (scribbled) */
            repair(ctl, ctl_len);
            now = 0;
        }
        store(ctl, MQS_OFF_LOCK_SINCE, now ? now : mqs_mono_ns());
        return MQS_OK;
    }
    if (rc == EOWNERDEAD) {
        repair(ctl, ctl_len);
        __atomic_add_fetch(mqs_i64(ctl, MQS_OFF_OWNER_DEAD), 1, __ATOMIC_RELAXED);
        if (pthread_mutex_consistent(mutex_of(ctl)) == 0) {
            store(ctl, MQS_OFF_LOCK_SINCE, mqs_mono_ns());
            return MQS_OK;
        }
        rc = ENOTRECOVERABLE;
    }
    if (rc == ENOTRECOVERABLE) {
        __atomic_store_n(mqs_u32(ctl, MQS_OFF_LOCK_BROKEN), 1, __ATOMIC_RELEASE);
        return MQS_LOCK_BROKEN;
    }
    return rc == ETIMEDOUT || rc == EBUSY ? MQS_LOCK_TIMEOUT : MQS_LOCK_BROKEN;
}

static struct timespec mono_ts(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    return ts;
}

int mqs_lock(uint8_t *ctl, int64_t ctl_len, int64_t wait_ns, int64_t now)
{
    if (wait_ns <= 0)
        return locked(ctl, ctl_len, pthread_mutex_trylock(mutex_of(ctl)), now);
    struct timespec ts = mono_ts((now ? now : mqs_mono_ns()) + wait_ns);
    int rc = locked(ctl, ctl_len, pthread_mutex_clocklock(mutex_of(ctl), CLOCK_MONOTONIC, &ts), 0);
    if (rc == MQS_LOCK_TIMEOUT)
        __atomic_add_fetch(mqs_i64(ctl, MQS_OFF_LOCK_TIMEOUTS), 1, __ATOMIC_RELAXED);
    return rc;
}

int mqs_lock_held(uint8_t *ctl, int64_t ctl_len, int64_t hold_ns, int64_t cap_ns)
{
    /* The deadline is the current holder's: the time it took the lock plus `hold_ns`, but
     * never before the waiter's own `hold_ns` (a holder found already held that long is
     * waited for too: it may be about to let go). A new holder (its stamp changed) starts
     * a new one; an unknown stamp (0: between a release and the next holder's stamp)
     * counts from now. */
    int64_t start = mqs_mono_ns(), cap = start + cap_ns, seen = -1, deadline = 0;
    for (;;) {
        int64_t since = load(ctl, MQS_OFF_LOCK_SINCE), now = mqs_mono_ns();
        if (since != seen) {
            seen = since;
            deadline = (since > start && since <= now ? since : since > 0 ? start : now) + hold_ns;
        }
        struct timespec ts = mono_ts(deadline < cap ? deadline : cap); /* past: one try */
        int rc = pthread_mutex_clocklock(mutex_of(ctl), CLOCK_MONOTONIC, &ts);
        if (rc != ETIMEDOUT)
            return locked(ctl, ctl_len, rc, 0);
        now = mqs_mono_ns();
        if (load(ctl, MQS_OFF_LOCK_SINCE) == seen && now >= deadline) {
            __atomic_add_fetch(mqs_i64(ctl, MQS_OFF_LOCK_TIMEOUTS), 1, __ATOMIC_RELAXED);
            return MQS_LOCK_TIMEOUT; /* one holder held it longer than `hold_ns` */
        }
        if (now >= cap) {
            __atomic_add_fetch(mqs_i64(ctl, MQS_OFF_LOCK_QUEUED), 1, __ATOMIC_RELAXED);
            return MQS_LOCK_QUEUED;
        }
    }
}

void mqs_unlock(uint8_t *ctl)
{
    store(ctl, MQS_OFF_LOCK_SINCE, 0);
    pthread_mutex_unlock(mutex_of(ctl));
}

int mqs_backlog_full(int64_t *since, int64_t backlog, int64_t bound, int64_t grace_ns,
                     int64_t drain, int64_t now)
{
    if (bound <= 0)
        return 0;
    int over_drain = drain > 0 && backlog >= drain; /* waits whatever the grace */
    if (backlog < bound - bound / 2) { /* caught up (half the bound): a new burst may come */
        *since = 0;
        return over_drain;
    }
    if (backlog < bound)
        return over_drain;
    if (*since == 0)
        *since = now > 0 ? now : 1;
    return now - *since >= grace_ns || over_drain;
}

/* Write slot `seq`'s row, then its state RESERVED (with `joined`) last. */
static inline void reserve_slot(const struct mqs_appender *a, int64_t seq, int64_t off,
                                int64_t qo, int64_t ts, int64_t size, int32_t qslot,
                                int32_t joined)
{
    uint8_t *row = a->ctl + MQS_SLOTS_OFF + (seq % a->slot_count) * MQS_SLOT_ROW;
    *mqs_i64(row, MQS_SLOT_OFFSET) = off;
    *mqs_i64(row, MQS_SLOT_QO) = qo;
    *mqs_i64(row, MQS_SLOT_TS) = ts;
    *mqs_i32(row, MQS_SLOT_SIZE) = (int32_t)size;
    *mqs_i32(row, MQS_SLOT_PID) = a->pid;
    *mqs_i32(row, MQS_SLOT_QSLOT) = qslot;
    __atomic_store_n(mqs_i32(row, MQS_SLOT_STATE), MQS_STATE_RESERVED | joined, __ATOMIC_RELEASE);
}

int mqs_reserve(struct mqs_appender *a, const struct mqs_item *items, int n, int64_t *qoffs,
                struct mqs_reservation *r)
{
    uint8_t *ctl = a->ctl;
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += items[i].size;
    if (load(ctl, MQS_OFF_FLAGS) != MQS_FLAG_RUNNING)
        return MQS_REFUSED;
    if (load(ctl, MQS_OFF_DISK_STATE) & MQS_DISK_FULL_BIT)
        return MQS_DISK_FULL;
    if (load(ctl, MQS_OFF_CS_PID) != 0)
        return MQS_WAIT_SLOTS;
    int64_t reserved = load(ctl, MQS_OFF_RESERVED);
    int64_t seq = load(ctl, MQS_OFF_SEQ);
    if (reserved < 0 || seq < 0 || reserved > INT64_MAX / 2 || seq > INT64_MAX / 2)
        return MQS_BAD_POSITIONS; /* never reserve there */
    int64_t index = reserved / a->seg_size;
    int64_t start = reserved, blank = 0;
    if (reserved + total + MQS_END_FILE_MIN_BLANK > (index + 1) * a->seg_size) {
        index++; /* a roll: a BLANK ends this segment, the records open the next */
        start = index * a->seg_size;
        blank = start - reserved;
    }
    int b = blank ? 1 : 0; /* the BLANK's slot */
    int64_t end = start + total;
    if (end > load(ctl, MQS_OFF_ALLOCATED))
        return MQS_WAIT_FILE;
    if (a->pool_n) {
        int64_t committed = load(ctl, MQS_OFF_COMMITTED);
        if (committed < (index - a->pool_n + 1) * a->seg_size)
            return MQS_WAIT_POOL;
        /* Flow control: the committer's copy is what readers wait for, so producers that
         * outrun it wait here (outside the lock) rather than leave readers a pool behind. */
        int64_t backlog = reserved - committed;
        if (a->backlog_max > 0 &&
            mqs_backlog_full(&a->backlog_since, backlog, a->backlog_max, a->backlog_grace_ns,
                             load(ctl, MQS_OFF_COMMIT_DRAIN),
                             backlog >= a->backlog_max ? mqs_mono_ns() : 0))
            return MQS_WAIT_BACKLOG;
    }
    if (seq + n + b - load(ctl, MQS_OFF_PUBLISHED_SEQ) > a->slot_count)
        return MQS_WAIT_SLOTS;
    /* The intent record first: a holder that dies from here on is repaired. */
    store(ctl, MQS_OFF_CS_SEQ, seq);
    store(ctl, MQS_OFF_CS_PID, a->pid);
    int64_t ts = mqs_wall_ms();
    if (blank)
        reserve_slot(a, seq, reserved, 0, ts, blank, -1, 0);
    int64_t at = start;
    for (int i = 0; i < n; i++) {
        int64_t qo = 0;
        if (items[i].takes_offset) {
            /* After the latest earlier message of this batch in the same queue (its offset
             * is the highest of them: they only grow), else the queue row's next. A scan
             * back stops within a queue count's steps under round robin; the full scan of
             * every earlier message was a quarter of a 128-message batch's CPU. */
            int j = i - 1;
            while (j >= 0 && !(items[j].takes_offset && items[j].qslot == items[i].qslot))
                j--;
            qo = j >= 0 ? qoffs[j] + 1
                        : load(ctl, a->qtable_off + items[i].qslot * MQS_QROW + MQS_QROW_NEXT);
        }
        qoffs[i] = qo;
        reserve_slot(a, seq + b + i, at, qo, ts, items[i].size,
                     items[i].takes_offset ? items[i].qslot : -2, i || b ? MQS_STATE_JOINED : 0);
        at += items[i].size;
    }
    /* The commit point: the space and the slots are this producer's. */
    store(ctl, MQS_OFF_RESERVED, end);
    store(ctl, MQS_OFF_SEQ, seq + n + b);
    mqs_crashpoint_hit(MQS_CP_RESERVE_LOCKED);
    for (int i = 0; i < n; i++)
        if (items[i].takes_offset)
            store(ctl, a->qtable_off + items[i].qslot * MQS_QROW + MQS_QROW_NEXT, qoffs[i] + 1);
    store(ctl, MQS_OFF_CS_PID, 0);
    r->seq = seq;
    r->start = start;
    r->store_ts = ts;
    r->blank = blank;
    return MQS_OK;
}

static int32_t *state_of(uint8_t *ctl, int64_t slot_count, int64_t seq)
{
    return mqs_i32(ctl, MQS_SLOTS_OFF + (seq % slot_count) * MQS_SLOT_ROW + MQS_SLOT_STATE);
}

void mqs_abandon(uint8_t *ctl, int64_t slot_count, int64_t seq, int64_t n)
{
    for (int64_t s = seq; s < seq + n; s++) {
        int32_t *st = state_of(ctl, slot_count, s);
        int32_t want = __atomic_load_n(st, __ATOMIC_SEQ_CST);
        if ((want & MQS_STATE_MASK) == MQS_STATE_RESERVED) /* keeps JOINED: one reservation */
            __atomic_compare_exchange_n(st, &want, MQS_STATE_ABANDONED | (want & MQS_STATE_JOINED),
                                        0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
}

uint8_t *mqs_pool_at(struct mqs_appender *a, int64_t off)
{
    int64_t index = off / a->seg_size;
    return a->pool + (index % a->pool_n) * a->seg_size + (off - index * a->seg_size);
}

void mqs_copy(uint8_t *dst, const struct mqs_message *m, int64_t queue_offset,
              int64_t physical_offset, int64_t store_ts)
{
    size_t h = mqs_record_write_head(dst, m, queue_offset, physical_offset, store_ts);
    size_t half = m->body_len / 2;
    memcpy(dst + h, m->body, half);
    mqs_crashpoint_hit(MQS_CP_COPY_HALF);
    memcpy(dst + h + half, m->body + half, m->body_len - half);
    mqs_record_write_tail(dst + h + m->body_len, m);
    mqs_crashpoint_hit(MQS_CP_BEFORE_DONE);
}

/* RESERVED -> DONE (keeping the JOINED bit), or 0 when the filler had it first. */
static int done_if_reserved(uint8_t *ctl, int64_t slot_count, int64_t seq, int32_t joined)
{
    int32_t want = MQS_STATE_RESERVED | joined;
    return __atomic_compare_exchange_n(state_of(ctl, slot_count, seq), &want,
                                       MQS_STATE_DONE | joined, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

int64_t mqs_fence_seq(uint8_t *ctl)
{
    return __atomic_load_n(mqs_i64(ctl, MQS_OFF_FENCE_SEQ), __ATOMIC_SEQ_CST) - 1;
}

int mqs_complete(uint8_t *ctl, int64_t slot_count, int64_t seq, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--)
        if (!done_if_reserved(ctl, slot_count, seq + i, MQS_STATE_JOINED))
            return MQS_FENCED;
    if (!done_if_reserved(ctl, slot_count, seq, 0))
        return MQS_FENCED;
    /* Done, and seen by the fence? Its flag is stored before it reads `seq`: if this
     * load misses the flag, the fence's read of seq covers this reservation. */
    if (!(__atomic_load_n(mqs_i64(ctl, MQS_OFF_FLAGS), __ATOMIC_SEQ_CST) & MQS_FLAG_FENCED))
        return MQS_OK;
    int64_t t0 = 0, fence;
    while ((fence = mqs_fence_seq(ctl)) < 0) { /* the fencer stores it next */
        int64_t now = mqs_mono_ns();
        if (t0 == 0)
            t0 = now;
        else if (now - t0 > 50 * 1000000) /* it died between the two: nothing drains */
            return MQS_FENCED;
    }
    return seq + n <= fence ? MQS_OK : MQS_FENCED;
}

int64_t mqs_claim(uint8_t *ctl, int64_t slot_count, int64_t seq)
{
    int64_t top = load(ctl, MQS_OFF_SEQ);
    if (seq >= top)
        return -1;
    int32_t *head = state_of(ctl, slot_count, seq);
    int32_t cur = __atomic_load_n(head, __ATOMIC_SEQ_CST);
    for (;;) {
        int32_t st = cur & MQS_STATE_MASK;
        if (st == MQS_STATE_DONE)
            return 0;
        if (st == MQS_STATE_FILLING)
            break;
        if (__atomic_compare_exchange_n(head, &cur, MQS_STATE_FILLING | (cur & MQS_STATE_JOINED),
                                        0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            break;
    }
    int64_t n = 1;
    while (seq + n < top) {
        int32_t *st = state_of(ctl, slot_count, seq + n);
        if (!(__atomic_load_n(st, __ATOMIC_SEQ_CST) & MQS_STATE_JOINED))
            break;
        __atomic_store_n(st, MQS_STATE_FILLING | MQS_STATE_JOINED, __ATOMIC_SEQ_CST);
        n++;
    }
    return n;
}

void mqs_fill_done(uint8_t *ctl, int64_t slot_count, int64_t seq, int64_t n)
{
    for (int64_t i = n - 1; i >= 0; i--)
        __atomic_store_n(state_of(ctl, slot_count, seq + i),
                         MQS_STATE_DONE | (i ? MQS_STATE_JOINED : 0), __ATOMIC_SEQ_CST);
}

int64_t mqs_fence(uint8_t *ctl)
{
    __atomic_fetch_or(mqs_i64(ctl, MQS_OFF_FLAGS), MQS_FLAG_FENCED | MQS_FLAG_REFUSE_WRITES,
                      __ATOMIC_SEQ_CST);
    int64_t want = 0, seq = load(ctl, MQS_OFF_SEQ);
    if (seq < 0)
        seq = 0;
    __atomic_compare_exchange_n(mqs_i64(ctl, MQS_OFF_FENCE_SEQ), &want, seq + 1, 0,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return mqs_fence_seq(ctl);
}

/* Raise the int64 at `off` to at least `v` (several publishers may race). */
static void store_max(uint8_t *ctl, int64_t off, int64_t v)
{
    int64_t cur = __atomic_load_n(mqs_i64(ctl, off), __ATOMIC_SEQ_CST);
    while (cur < v && !__atomic_compare_exchange_n(mqs_i64(ctl, off), &cur, v, 0,
                                                   __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
}

static int64_t publish_done(uint8_t *ctl, int64_t slot_count)
{
    int64_t advanced = 0;
    if (slot_count <= 0)
        return 0;
    /* Pairs with the other publishers: whoever marks a slot DONE and whoever advances
     * past the slot before it cannot both miss the other's store. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (;;) {
        int64_t ps = __atomic_load_n(mqs_i64(ctl, MQS_OFF_PUBLISHED_SEQ), __ATOMIC_SEQ_CST);
        int64_t fence = __atomic_load_n(mqs_i64(ctl, MQS_OFF_FENCE_SEQ), __ATOMIC_RELAXED);
        if (ps < 0 || ps >= __atomic_load_n(mqs_i64(ctl, MQS_OFF_SEQ), __ATOMIC_SEQ_CST) ||
            (fence > 0 && ps >= fence - 1))
            return advanced; /* not of this lap yet, or past the fence: never published */
        uint8_t *row = ctl + MQS_SLOTS_OFF + (ps % slot_count) * MQS_SLOT_ROW;
        if ((__atomic_load_n(mqs_i32(row, MQS_SLOT_STATE), __ATOMIC_SEQ_CST) & MQS_STATE_MASK) !=
            MQS_STATE_DONE)
            return advanced;
        int64_t end = __atomic_load_n(mqs_i64(row, MQS_SLOT_OFFSET), __ATOMIC_RELAXED) +
                      __atomic_load_n(mqs_i32(row, MQS_SLOT_SIZE), __ATOMIC_RELAXED);
        int64_t ts = __atomic_load_n(mqs_i64(row, MQS_SLOT_TS), __ATOMIC_RELAXED);
        /* A seqlock's check: once another publisher moved past `ps`, the row may already
         * hold a later lap's reservation, and what was read is not ps's. */
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(mqs_i64(ctl, MQS_OFF_PUBLISHED_SEQ), __ATOMIC_RELAXED) != ps)
            continue;
        /* Position first: the slot cannot be reused before published_seq passes it. */
        store_max(ctl, MQS_OFF_PUBLISHED, end);
        store_max(ctl, MQS_OFF_PUBLISHED_TS, ts);
        if (__atomic_compare_exchange_n(mqs_i64(ctl, MQS_OFF_PUBLISHED_SEQ), &ps, ps + 1, 0,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            advanced++;
    }
}

int64_t mqs_publish(uint8_t *ctl, int64_t slot_count)
{
    int64_t advanced = publish_done(ctl, slot_count);
    if (advanced > 0)
        mqs_idle_wake(ctl); /* one load, unless an idle committer or dispatcher sleeps */
    return advanced;
}
