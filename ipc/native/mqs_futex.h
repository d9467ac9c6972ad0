/* Sync acknowledgements over the control block, no sockets: a sync producer waits on
 * FLUSH_SEQ until FLUSHED covers its end; the flusher bumps FLUSH_SEQ and wakes the
 * waiters its flush may have covered; producers wake a sleeping flusher through
 * FLUSHER_WAKE. A wake-up is a hint: only the shared flushed position, which the flusher
 * alone writes (owner-only shared memory), makes a put PUT_OK.
 *
 * Who is woken (FUTEX_WAIT_BITSET / FUTEX_WAKE_BITSET): the log is cut into buckets of
 * 2^MQS_WAKE_SHIFT bytes, and a waiter for `end` sleeps with the bit of end's bucket
 * modulo 32 (`mqs_wait_bits`). A flush that moved flushed_pos from f to t covers exactly
 * the ends in (f, t]: it wakes the bits of their buckets (`mqs_wake_mask`; every bit
 * when they are 32 or more). So a waiter a round does not cover sleeps on instead of
 * waking to find nothing, but for those in t's own bucket and those 32 buckets ahead.
 * Positions, not seqs: the flushed position is the truth the waiter decides from, and
 * no waiter it covers is missed (ipc/commit.py: `wait_bits`, `wake_mask` are twins). */
#ifndef MQS_FUTEX_H
#define MQS_FUTEX_H

#include <stdint.h>
#include <time.h>

enum { MQS_FLUSHED = 0, MQS_WAIT_AGAIN = 1, MQS_FLUSH_FAILED = 2, MQS_WAIT_FENCED = 3 };
#define MQS_WAKE_ANY 0xFFFFFFFFu
#define MQS_WAKE_SHIFT 12 /* 4 KiB buckets: 32 of them hold a round of 64 1 KiB puts */

/* CLOCK_MONOTONIC in ns (time.monotonic_ns, time.perf_counter_ns on Linux). */
int64_t mqs_mono_ns(void);

/* CLOCK_REALTIME in ms (Java's System.currentTimeMillis): born and store timestamps. */
static inline int64_t mqs_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The bit a waiter for flushed_pos >= `end` sleeps with. */
uint32_t mqs_wait_bits(int64_t end);

/* The bits of the ends in (from_pos, to_pos]: every bit for 32 buckets or more, or for
 * an empty range. */
uint32_t mqs_wake_mask(int64_t from_pos, int64_t to_pos);

/* One tick of a sync producer's wait (call without the GIL): record the request, wake
 * the flusher if it sleeps, wait on FLUSH_SEQ with end's bit at most `tick_ns`. Returns
 * MQS_FLUSHED once flushed_pos >= end, MQS_FLUSH_FAILED once the store is read-only,
 * MQS_WAIT_FENCED once the generation ended (FENCED and STOPPED: its last flush is done
 * and did not cover `end`), else MQS_WAIT_AGAIN (the caller checks its deadline and signals, then calls again). */
int mqs_wait_flushed_tick(uint8_t *ctl, int64_t end, int64_t tick_ns);

/* Flusher: after moving flushed_pos, wake the waiters sleeping with a bit of `mask`. */
void mqs_flushed_wake(uint8_t *ctl, uint32_t mask);

/* Flusher: after moving flushed_pos from `from_pos`: wake the waiters it covered. */
void mqs_flushed_wake_from(uint8_t *ctl, int64_t from_pos);

/* After setting READ_ONLY, at drain: wake every waiter. */
void mqs_flushed_wake_all(uint8_t *ctl);

/* Flusher: sleep until a producer asks for a flush beyond flushed_pos, or `timeout_ns`
 * passes. Returns 1 when a request is pending. */
int mqs_flusher_sleep(uint8_t *ctl, int64_t timeout_ns);

/* Flusher, before forcing: sleep until published_seq reaches `want_seq` (the producer
 * whose publish completes it wakes the flusher; earlier arrivals do not) or `timeout_ns`
 * passes. Returns 1 when it was reached. */
int mqs_flusher_gather(uint8_t *ctl, int64_t want_seq, int64_t timeout_ns);

/* The furthest end a sync producer asked for (flusher). */
int64_t mqs_sync_request(uint8_t *ctl);

/* Any process: wake a sleeping flusher (the committer after a commit). */
void mqs_flusher_wake(uint8_t *ctl);

/* Idle workers (the committer, the dispatcher under ASYNC_FLUSH) sleep until the log
 * grows instead of polling: sleep on IDLE_WAKE while published_pos <= `seen_pos`, at most
 * `timeout_ns`. IDLE_SLEEPS says someone sleeps; the first publish that finds it set
 * takes it (exchange to 0), bumps IDLE_WAKE and wakes every sleeper, so a busy log pays
 * one load per publish and one wake per sleep, never one per put. Returns 1 when
 * published_pos > seen_pos (the shared word decides, never the wake-up). */
int mqs_idle_sleep(uint8_t *ctl, int64_t seen_pos, int64_t timeout_ns);

/* After a publish that moved published_pos (mqs_publish), or to end every idle sleep at
 * once: wake the idle sleepers if any said they sleep. */
void mqs_idle_wake(uint8_t *ctl);

/* The dispatcher under SYNC_FLUSH, whose limit is flushed_pos: sleep on FLUSH_SEQ (every
 * bit: any flush wakes it) while flushed_pos <= `pos`, at most `timeout_ns`. Records no
 * request and wakes nobody: it waits for the flushes sync producers ask for. Returns 1
 * when flushed_pos > pos. */
int mqs_wait_flushed_past(uint8_t *ctl, int64_t pos, int64_t timeout_ns);

#endif
