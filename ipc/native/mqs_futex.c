#include "mqs_futex.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mqs_layout.h"

int64_t mqs_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Shared futexes (no FUTEX_PRIVATE_FLAG): waiters and wakers are different processes. */
static void futex_wait(uint32_t *word, uint32_t seen, int64_t timeout_ns)
{
    struct timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
    syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0); /* EAGAIN/EINTR/ETIMEDOUT: fine */
}

/* FUTEX_WAIT_BITSET: woken only by a wake whose mask shares a bit with `bits`; its
 * timeout is absolute (CLOCK_MONOTONIC). */
static void futex_wait_bits(uint32_t *word, uint32_t seen, int64_t timeout_ns, uint32_t bits)
{
    int64_t at = mqs_mono_ns() + timeout_ns;
    struct timespec ts = {at / 1000000000, at % 1000000000};
    syscall(SYS_futex, word, FUTEX_WAIT_BITSET, seen, &ts, NULL, bits);
}

static void futex_wake(uint32_t *word, int n)
{
    syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
}

uint32_t mqs_wait_bits(int64_t end)
{
    return end <= 0 ? MQS_WAKE_ANY : 1u << ((end >> MQS_WAKE_SHIFT) & 31);
}

uint32_t mqs_wake_mask(int64_t from_pos, int64_t to_pos)
{
    int64_t first = (from_pos + 1) >> MQS_WAKE_SHIFT, last = to_pos >> MQS_WAKE_SHIFT;
    if (to_pos <= from_pos || from_pos < 0 || last - first >= 31)
        return MQS_WAKE_ANY; /* nothing moved: everyone, never fewer than needed */
    uint32_t mask = 0;
    for (int64_t b = first; b <= last; b++)
        mask |= 1u << (b & 31);
    return mask;
}

static int64_t load(uint8_t *ctl, int64_t off)
{
    return __atomic_load_n(mqs_i64(ctl, off), __ATOMIC_SEQ_CST);
}

void mqs_flusher_wake(uint8_t *ctl)
{
    if (__atomic_load_n(mqs_u32(ctl, MQS_OFF_FLUSHER_SLEEPS), __ATOMIC_SEQ_CST)) {
        /* A gathering flusher wants no wake-up per arrival: only from the one whose
         * message completes the group it waits for (its timeout covers the rest). */
        int64_t want = load(ctl, MQS_OFF_GATHER_WANT);
        if (want > 0 && load(ctl, MQS_OFF_PUBLISHED_SEQ) < want)
            return;
        __atomic_add_fetch(mqs_u32(ctl, MQS_OFF_FLUSHER_WAKE), 1, __ATOMIC_SEQ_CST);
        futex_wake(mqs_u32(ctl, MQS_OFF_FLUSHER_WAKE), 1);
    }
}

/* Why a waiter whose end is not flushed stops waiting, or MQS_WAIT_AGAIN. */
static int not_flushed(uint8_t *ctl)
{
    int64_t flags = load(ctl, MQS_OFF_FLAGS);
    if (flags & MQS_FLAG_READ_ONLY)
        return MQS_FLUSH_FAILED;
    if ((flags & (MQS_FLAG_FENCED | MQS_FLAG_STOPPED)) == (MQS_FLAG_FENCED | MQS_FLAG_STOPPED))
        return MQS_WAIT_FENCED;
    return MQS_WAIT_AGAIN;
}

int mqs_wait_flushed_tick(uint8_t *ctl, int64_t end, int64_t tick_ns)
{
    uint32_t *seq = mqs_u32(ctl, MQS_OFF_FLUSH_SEQ);
    uint32_t seen = __atomic_load_n(seq, __ATOMIC_SEQ_CST);
    if (load(ctl, MQS_OFF_FLUSHED) >= end)
        return MQS_FLUSHED;
    int rc = not_flushed(ctl);
    if (rc != MQS_WAIT_AGAIN)
        return rc;
    /* The request: the furthest end anyone waits for (a max, by compare-and-swap). */
    int64_t *req = mqs_i64(ctl, MQS_OFF_SYNC_REQUEST);
    int64_t cur = __atomic_load_n(req, __ATOMIC_SEQ_CST);
    while (cur < end &&
           !__atomic_compare_exchange_n(req, &cur, end, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
    mqs_flusher_wake(ctl);
    futex_wait_bits(seq, seen, tick_ns, mqs_wait_bits(end));
    if (load(ctl, MQS_OFF_FLUSHED) >= end) /* the shared word is the truth */
        return MQS_FLUSHED;
    return not_flushed(ctl);
}

void mqs_flushed_wake(uint8_t *ctl, uint32_t mask)
{
    __atomic_add_fetch(mqs_u32(ctl, MQS_OFF_FLUSH_SEQ), 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, mqs_u32(ctl, MQS_OFF_FLUSH_SEQ), FUTEX_WAKE_BITSET, INT_MAX, NULL, NULL,
            mask ? mask : MQS_WAKE_ANY);
}

void mqs_flushed_wake_all(uint8_t *ctl)
{
    mqs_flushed_wake(ctl, MQS_WAKE_ANY);
}

void mqs_flushed_wake_from(uint8_t *ctl, int64_t from_pos)
{
    mqs_flushed_wake(ctl, mqs_wake_mask(from_pos, load(ctl, MQS_OFF_FLUSHED)));
}

int64_t mqs_sync_request(uint8_t *ctl)
{
    return load(ctl, MQS_OFF_SYNC_REQUEST);
}

int mqs_flusher_sleep(uint8_t *ctl, int64_t timeout_ns)
{
    uint32_t *wake = mqs_u32(ctl, MQS_OFF_FLUSHER_WAKE);
    uint32_t *sleeps = mqs_u32(ctl, MQS_OFF_FLUSHER_SLEEPS);
    uint32_t seen = __atomic_load_n(wake, __ATOMIC_SEQ_CST);
    /* Say we sleep, then look for work: a producer that recorded its request before
     * this store sees no sleeper and does not wake us, but we see its request. */
    __atomic_store_n(sleeps, 1, __ATOMIC_SEQ_CST);
    if (load(ctl, MQS_OFF_SYNC_REQUEST) <= load(ctl, MQS_OFF_FLUSHED))
        futex_wait(wake, seen, timeout_ns);
    __atomic_store_n(sleeps, 0, __ATOMIC_SEQ_CST);
    return load(ctl, MQS_OFF_SYNC_REQUEST) > load(ctl, MQS_OFF_FLUSHED);
}

int mqs_flusher_gather(uint8_t *ctl, int64_t want_seq, int64_t timeout_ns)
{
    uint32_t *wake = mqs_u32(ctl, MQS_OFF_FLUSHER_WAKE);
    uint32_t *sleeps = mqs_u32(ctl, MQS_OFF_FLUSHER_SLEEPS);
    int64_t deadline = mqs_mono_ns() + timeout_ns;
    __atomic_store_n(mqs_i64(ctl, MQS_OFF_GATHER_WANT), want_seq, __ATOMIC_SEQ_CST);
    __atomic_store_n(sleeps, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        /* Read the word, then look: a producer that publishes after the look bumps it
         * (it sees `sleeps` and the group complete), so the wait returns at once. */
        uint32_t seen = __atomic_load_n(wake, __ATOMIC_SEQ_CST);
        if (load(ctl, MQS_OFF_PUBLISHED_SEQ) >= want_seq)
            break;
        int64_t left = deadline - mqs_mono_ns();
        if (left <= 0)
            break;
        futex_wait(wake, seen, left);
    }
    __atomic_store_n(sleeps, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(mqs_i64(ctl, MQS_OFF_GATHER_WANT), 0, __ATOMIC_SEQ_CST);
    return load(ctl, MQS_OFF_PUBLISHED_SEQ) >= want_seq;
}

int mqs_idle_sleep(uint8_t *ctl, int64_t seen_pos, int64_t timeout_ns)
{
    uint32_t *wake = mqs_u32(ctl, MQS_OFF_IDLE_WAKE);
    uint32_t seen = __atomic_load_n(wake, __ATOMIC_SEQ_CST);
    /* Say we sleep, then look (Dekker's order against the publisher, which moves the
     * position, then looks for sleepers): one of the two sees the other's store. */
    __atomic_store_n(mqs_u32(ctl, MQS_OFF_IDLE_SLEEPS), 1, __ATOMIC_SEQ_CST);
    if (load(ctl, MQS_OFF_PUBLISHED) <= seen_pos)
        futex_wait(wake, seen, timeout_ns); /* EAGAIN: a wake came in between */
    return load(ctl, MQS_OFF_PUBLISHED) > seen_pos;
}

void mqs_idle_wake(uint8_t *ctl)
{
    uint32_t *sleeps = mqs_u32(ctl, MQS_OFF_IDLE_SLEEPS);
    if (__atomic_load_n(sleeps, __ATOMIC_SEQ_CST) && __atomic_exchange_n(sleeps, 0, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(mqs_u32(ctl, MQS_OFF_IDLE_WAKE), 1, __ATOMIC_SEQ_CST);
        futex_wake(mqs_u32(ctl, MQS_OFF_IDLE_WAKE), INT_MAX);
    }
}

int mqs_wait_flushed_past(uint8_t *ctl, int64_t pos, int64_t timeout_ns)
{
    uint32_t *seq = mqs_u32(ctl, MQS_OFF_FLUSH_SEQ);
    uint32_t seen = __atomic_load_n(seq, __ATOMIC_SEQ_CST);
    if (load(ctl, MQS_OFF_FLUSHED) > pos)
        return 1;
    futex_wait_bits(seq, seen, timeout_ns, MQS_WAKE_ANY);
    return load(ctl, MQS_OFF_FLUSHED) > pos;
}
