/* Sync acknowledgements over the control block, no sockets: a sync producer waits on
 * FLUSH_SEQ until FLUSHED covers its end; the flusher bumps FLUSH_SEQ and wakes every
 * waiter after each flush; producers wake a sleeping flusher through FLUSHER_WAKE. A
 * wake-up is a hint: only the shared flushed position, which the flusher alone writes
 * (owner-only shared memory), makes a put PUT_OK. */
#ifndef MQS_FUTEX_H
#define MQS_FUTEX_H

#include <stdint.h>

enum { MQS_FLUSHED = 0, MQS_WAIT_AGAIN = 1, MQS_FLUSH_FAILED = 2 };

/* One tick of a sync producer's wait (call without the GIL): record the request, wake
 * the flusher if it sleeps, wait on FLUSH_SEQ at most `tick_ns`. Returns MQS_FLUSHED
 * once flushed_pos >= end, MQS_FLUSH_FAILED once the store is read-only, else
 * MQS_WAIT_AGAIN (the caller checks its deadline and signals, then calls again). */
int mqs_wait_flushed_tick(uint8_t *ctl, int64_t end, int64_t tick_ns);

/* Flusher: after moving flushed_pos (or setting READ_ONLY), wake every waiter. */
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

#endif
