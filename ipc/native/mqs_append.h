/* The reservation protocol's producer side, in C: the serialising step (a robust,
 * process-shared mutex in the control block, with a deadline), its repair after a
 * holder died, the reservation of space, slots and queue offsets, the copy and the
 * done-mark. The protocol as a whole (who does reserve, complete, abandon, publish,
 * fill and repair) is documented in ipc/reservation.py. No Python object here. */
#ifndef MQS_APPEND_H
#define MQS_APPEND_H

#include <stddef.h>
#include <stdint.h>

#include "mqs_record.h"

enum {
    MQS_OK = 0,
    MQS_LOCK_TIMEOUT = -2, /* the reservation lock was not free within the timeout */
    MQS_LOCK_BROKEN = -3,  /* the lock is ENOTRECOVERABLE: the store must restart */
    /* mqs_reserve: nothing reserved, because ... */
    MQS_REFUSED = -4,    /* the store's flags refuse writes (read-only, stopping) */
    MQS_DISK_FULL = -5,  /* the cleaner's disk word says DISK_FULL */
    MQS_WAIT_FILE = -6,  /* the allocator has not made the segment file yet */
    MQS_WAIT_POOL = -7,  /* the pool buffer is not committed yet */
    MQS_WAIT_SLOTS = -8, /* the slot ring is full (or a holder's intent is pending) */
    MQS_BAD_POSITIONS = -9, /* reserved or seq is not a position (a scribbled block) */
    /* mqs_complete: the put is not in the log (the filler claimed it, or past the fence) */
    MQS_FENCED = -10,
    MQS_LOCK_QUEUED = -11, /* mqs_lock_held: no holder too long, but the wait hit its cap */
    MQS_WAIT_BACKLOG = -12, /* mqs_reserve: the commit backlog is at its bound (backlog_max) */
};

struct mqs_appender {
    uint8_t *ctl;
    uint8_t *pool; /* NULL: pool off, records go into the segment's mapping */
    int64_t seg_size, pool_n, slot_count, qtable_off;
    /* Pool on, flow control (mqs_backlog_full): backlog_max bytes (0: no bound), its grace
     * and this producer's note of since when the backlog has been at the bound. */
    int64_t backlog_max, backlog_grace_ns, backlog_since;
    int32_t pid;
};

/* The commit backlog's rule, for one producer (`*since`: its state, 0 at first): 1 when
 * the reservation must wait. A backlog (reserved - committed) at or over `drain` (> 0:
 * the bytes the committer commits in commit_backlog_drain_ms at its recent pace, which
 * it publishes at MQS_OFF_COMMIT_DRAIN; 0: not known) waits at once, grace or not, so a
 * committer that slows down throttles producers instead of building a tail readers wait
 * out. Otherwise a backlog at or over `bound` has to have been seen there for
 * `grace_ns` (a burst the pool absorbs is not held back), and a producer that once
 * waited keeps waiting at the bound until the backlog has fallen under half of it (then
 * `*since` is 0 again). `now`: CLOCK_MONOTONIC ns, read by the caller only when
 * backlog >= bound. No bound (0): never waits. Twin: tests/native/put_reference.py's
 * `backlog_reference`. */
int mqs_backlog_full(int64_t *since, int64_t backlog, int64_t bound, int64_t grace_ns,
                     int64_t drain, int64_t now);

/* Supervisor, once, on a zeroed control block: make the mutex robust and shared. */
int mqs_mutex_init(uint8_t *ctl);

/* Take the reservation lock (of a block `ctl_len` bytes long): at once if free (0), else
 * MQS_LOCK_TIMEOUT when `wait_ns` is 0. With `wait_ns` > 0, wait up to that long (call
 * without the GIL). A holder that died is repaired first. `now`: CLOCK_MONOTONIC ns the
 * caller read just before (0: read here); a lock taken without waiting is stamped with it
 * as its holder's start (lock_since). Returns MQS_OK, MQS_LOCK_TIMEOUT or MQS_LOCK_BROKEN. */
int mqs_lock(uint8_t *ctl, int64_t ctl_len, int64_t wait_ns, int64_t now);
/* The put's wait for the lock (call without the GIL), after RocketMQ's isOSPageCacheBusy:
 * busy (MQS_LOCK_TIMEOUT) once one holder has held it longer than `hold_ns`
 * (osPageCacheBusyTimeOutMills) and the waiter itself has waited `hold_ns`; a queue of
 * holders that each hold it briefly is waited out, up to `cap_ns` in all (then
 * MQS_LOCK_QUEUED). The holder's start is the block's lock_since, stamped by whoever
 * takes the lock. */
int mqs_lock_held(uint8_t *ctl, int64_t ctl_len, int64_t hold_ns, int64_t cap_ns);
void mqs_unlock(uint8_t *ctl);

struct mqs_item {
    struct mqs_message msg;
    int64_t size;  /* mqs_record_length(&msg) */
    int32_t qslot; /* queue-table row */
    int takes_offset;
    /* its UNIQ_KEY (mqs_uniq.h): the value at msg.props + uniq_off, uniq_len bytes;
     * the 16 bytes when it is 32 hex digits; a duplicate's first position */
    int uniq_kind;
    int32_t uniq_off, uniq_len;
    uint8_t uniq[16];
    int64_t dup_off, dup_ts, dup_size, dup_qo;
    int32_t dup_qid;
    int64_t idem_at; /* its idempotence entry's offset in the control block, 0: none */
};

/* `blank` > 0: the reservation rolled to a new segment; slot `seq` is the BLANK of
 * `blank` bytes that ends the previous one (at start - blank), the records' slots follow. */
struct mqs_reservation {
    int64_t seq, start, store_ts, blank;
};

/* Under the lock: reserve `n` records (queue rows known) at the current end, rolling to
 * the next segment with a BLANK when they do not fit this one. Writes the RESERVED slots
 * and queue offsets (qoffs); every slot after the first JOINED (one reservation, completed
 * all or nothing: `mqs_complete`). Else a code (MQS_REFUSED .. MQS_BAD_POSITIONS,
 * MQS_WAIT_BACKLOG), nothing written: the caller waits and tries again, or refuses the put.
 * The backlog bound is checked against the reservation's start, not its end, so a call
 * larger than the bound still goes through once the committer has caught up. */
int mqs_reserve(struct mqs_appender *a, const struct mqs_item *items, int n, int64_t *qoffs,
                struct mqs_reservation *r);

/* Hand the slots [seq, seq + n) still RESERVED by this process to the committer's filler
 * (a put that raised between reserve and done), keeping their JOINED bits. */
void mqs_abandon(uint8_t *ctl, int64_t slot_count, int64_t seq, int64_t n);

/* Where the record at physical offset `off` goes with the pool on. */
uint8_t *mqs_pool_at(struct mqs_appender *a, int64_t off);

/* Write one record at dst (crash points copy-half and before-done inside). */
void mqs_copy(uint8_t *dst, const struct mqs_message *m, int64_t queue_offset,
              int64_t physical_offset, int64_t store_ts);

/* Complete the reservation of `n` slots from `seq` once every record is written: the
 * joined slots DONE from the last one back, then the first one (the head) by a
 * compare-and-swap from RESERVED, so a publisher (which stops at the first slot not
 * DONE) sees the whole reservation or none of it. MQS_OK, or MQS_FENCED when the
 * filler claimed a slot first (it fills them all: nothing of the put is read) or the
 * block was fenced before this reservation was seen (`mqs_fence`): the put failed. */
int mqs_complete(uint8_t *ctl, int64_t slot_count, int64_t seq, int64_t n);

/* The filler's claim of the reservation whose first slot not yet published is `seq`
 * (RESERVED, ABANDONED or already FILLING): that slot and every JOINED one after it
 * become FILLING, so their producer's `mqs_complete` fails. Returns the slots claimed,
 * 0 when the slot turned DONE first (its producer completed: publish it), -1 when
 * `seq` is not below `seq`'s current value. */
int64_t mqs_claim(uint8_t *ctl, int64_t slot_count, int64_t seq);

/* The filler, after writing the filler records of a claim: its slots DONE (the joined
 * ones first, the head last), so they are published together. */
void mqs_fill_done(uint8_t *ctl, int64_t slot_count, int64_t seq, int64_t n);

/* End this control block's generation (the stopping supervisor after the reservation
 * fence; the next supervisor over a crashed run's block; workers whose supervisor
 * died): FENCED and REFUSE_WRITES (no reservation from now on), then FENCE_SEQ =
 * 1 + seq. Reservations below that seq are drained (completed, or claimed and
 * filled); one committed later (a producer stopped inside the section) is never
 * published and its `mqs_complete` fails. Returns the fence's seq (the first fenced
 * one; an earlier fence's when the block was fenced already). */
int64_t mqs_fence(uint8_t *ctl);

/* The fence's seq, or -1 while the block is not fenced. */
int64_t mqs_fence_seq(uint8_t *ctl);

/* Publish: advance published_seq over contiguous DONE slots, raising published_pos (and
 * published_ts) to each one's end first. Lock-free (a compare-and-swap per slot), so the
 * producer that completes the oldest pending slot publishes it and every DONE slot after
 * it; the committer runs it too, after its fills. Returns the slots this call advanced.
 * A caller that dies inside leaves published_pos at most one slot ahead of
 * published_seq: the next publisher moves published_seq on. */
int64_t mqs_publish(uint8_t *ctl, int64_t slot_count);

#endif
