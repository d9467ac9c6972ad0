/* The control block as C sees it. The one table of every field is ipc/control.py's
 * module docstring (layout version 4); these offsets mirror it and
 * tests/runtime/test_control.py checks that both sides agree (`_native.LAYOUT`).
 * All fields are little-endian and naturally aligned. */
#ifndef MQS_LAYOUT_H
#define MQS_LAYOUT_H

#include <stdint.h>

#define MQS_MAGIC_VERSION 0x4D5143544C000004LL /* "MQCTL", layout version 4 */

/* Header (int64 each). */
#define MQS_OFF_RESERVED 8
#define MQS_OFF_SEQ 16
#define MQS_OFF_PUBLISHED 24
#define MQS_OFF_PUBLISHED_SEQ 32
#define MQS_OFF_COMMITTED 40
#define MQS_OFF_FLUSHED 48
#define MQS_OFF_FLAGS 56
#define MQS_OFF_GENERATION 64
#define MQS_OFF_ALLOCATED 80
#define MQS_OFF_CS_PID 88 /* the reservation's intent record: holder's pid ... */
#define MQS_OFF_CS_SEQ 96 /* ... and `seq` when its section began */
#define MQS_OFF_SEGMENT_SIZE 104
#define MQS_OFF_POOL_BUFFERS 112
#define MQS_OFF_SLOT_COUNT 120
#define MQS_OFF_QCAP 128
#define MQS_OFF_FSYNC_COUNT 136
#define MQS_OFF_FSYNC_MSGS 144
#define MQS_OFF_PUBLISHED_TS 152
#define MQS_OFF_COMMITTED_TS 160
#define MQS_OFF_FLUSHED_TS 168
#define MQS_OFF_BUSY 176 /* reservations that waited for room (a statistic) */
#define MQS_OFF_FLUSHED_SEQ 208
#define MQS_OFF_FSYNC_NS 216
#define MQS_OFF_COMMITTED_SEQ 232
#define MQS_OFF_DISK_STATE 240
#define MQS_OFF_FSYNC_HIST 248 /* the flusher's histograms: fsync µs, messages per fsync */
#define MQS_FSYNC_HIST_BUCKETS 13
#define MQS_FSYNC_HIST_SHIFT 6
#define MQS_OFF_GROUP_HIST 352
#define MQS_GROUP_HIST_BUCKETS 12

#define MQS_FLAG_RUNNING 1
#define MQS_FLAG_REFUSE_WRITES 2
#define MQS_FLAG_READ_ONLY 4
#define MQS_FLAG_STOPPED 8
#define MQS_FLAG_FENCED 16 /* this generation is over: see mqs_fence (mqs_append.h) */
#define MQS_DISK_FULL_BIT 1

/* The native area (layout version 4). */
#define MQS_OFF_RESERVE_MUTEX 2048 /* pthread_mutex_t, robust, process-shared: 64 B */
#define MQS_OFF_FLUSH_SEQ 2112     /* u32 futex: flusher bumps after moving flushed_pos */
#define MQS_OFF_FLUSHER_WAKE 2116  /* u32 futex: producers bump to wake the flusher */
#define MQS_OFF_FLUSHER_SLEEPS 2120 /* u32: 1 while the flusher waits on FLUSHER_WAKE */
#define MQS_OFF_LOCK_BROKEN 2124   /* u32: 1 once the mutex is ENOTRECOVERABLE */
#define MQS_OFF_SYNC_REQUEST 2128  /* i64: the furthest end a sync producer waits for */
#define MQS_OFF_LOCK_TIMEOUTS 2136 /* i64: reservation-lock waits that timed out */
#define MQS_OFF_OWNER_DEAD 2144    /* i64: repairs after a holder died in the section */
#define MQS_OFF_GATHER_WANT 2152   /* i64: published_seq a gathering flusher waits for */
#define MQS_OFF_FENCE_SEQ 2160     /* i64: 1 + `seq` when the block was fenced (0: not yet) */
#define MQS_OFF_IDLE_WAKE 2168     /* u32 futex: a publish bumps it when IDLE_SLEEPS was set */
#define MQS_OFF_IDLE_SLEEPS 2172   /* u32: 1 once an idle worker sleeps on IDLE_WAKE */
#define MQS_OFF_LOCK_SINCE 2176    /* i64: CLOCK_MONOTONIC ns the lock's holder took it (0: free) */
#define MQS_OFF_LOCK_QUEUED 2184   /* i64: put lock waits refused at their cap, no holder too long */
#define MQS_OFF_ROOM_TIMEOUTS 2192 /* i64: puts refused after the busy timeout waiting for room */
#define MQS_OFF_COMMIT_DRAIN 2200  /* i64: bytes the committer commits in commit_backlog_drain_ms */
#define MQS_NATIVE_END 2304

/* Reservation slots: row `seq % slot_count`. */
#define MQS_SLOTS_OFF 262144
#define MQS_SLOT_ROW 40
#define MQS_SLOT_OFFSET 0   /* i64 physical offset */
#define MQS_SLOT_QO 8       /* i64 queue offset */
#define MQS_SLOT_TS 16      /* i64 store timestamp */
#define MQS_SLOT_SIZE 24    /* i32 */
#define MQS_SLOT_PID 28     /* i32 */
#define MQS_SLOT_QSLOT 32   /* i32: queue row, -1 a BLANK, -2 no queue offset */
#define MQS_SLOT_STATE 36   /* i32: a state, with MQS_STATE_JOINED */
#define MQS_STATE_RESERVED 1
#define MQS_STATE_DONE 2
#define MQS_STATE_ABANDONED 3
#define MQS_STATE_FILLING 4       /* claimed by the filler: its producer's put failed */
#define MQS_STATE_MASK 0xFF
#define MQS_STATE_JOINED 0x100    /* bit: of the same reservation as the slot before it */

/* Queue table rows after the slots: hash i64, next_offset i64, queue_id i32, ... */
#define MQS_QROW 160
#define MQS_QROW_NEXT 8

/* A client's statistics row (ipc/control.py: CF_*), counted by the C put (mqs_put.c: count);
 * the rows start at MQS_CLIENTS_OFF. */
#define MQS_CLIENTS_OFF 4096
#define MQS_CF_PUTS 1
#define MQS_CF_ERRORS 2
#define MQS_CF_BYTES 3
#define MQS_CF_LAT_MAX_NS 4
#define MQS_CF_SYNC_PUTS 5
#define MQS_CF_LAT_SUM_NS 6
#define MQS_CF_STATUS 7
#define MQS_CF_HIST 18
#define MQS_HIST_BUCKETS 32
#define MQS_CF_PHASES 50
#define MQS_PHASE_BUCKETS 24
#define MQS_CLIENT_FIELDS (MQS_CF_PHASES + 3 * (MQS_PHASE_BUCKETS + 1))

static inline int64_t *mqs_i64(uint8_t *ctl, int64_t off)
{
    return (int64_t *)(void *)(ctl + off);
}

static inline int32_t *mqs_i32(uint8_t *ctl, int64_t off)
{
    return (int32_t *)(void *)(ctl + off);
}

static inline uint32_t *mqs_u32(uint8_t *ctl, int64_t off)
{
    return (uint32_t *)(void *)(ctl + off);
}

#endif
