#include "mqs_round.h"

#include <errno.h>
#include <sys/file.h>
#include <unistd.h>

#include "mqs_append.h"
#include "mqs_futex.h"
#include "mqs_layout.h"

static int64_t get(uint8_t *ctl, int64_t off)
{
    return __atomic_load_n(mqs_i64(ctl, off), __ATOMIC_SEQ_CST);
}

static void put(uint8_t *ctl, int64_t off, int64_t v)
{
    __atomic_store_n(mqs_i64(ctl, off), v, __ATOMIC_SEQ_CST);
}

int64_t mqs_hist_bucket(int64_t value, int shift, int64_t buckets)
{
    if (value <= ((int64_t)1 << shift))
        return 0;
    int64_t b = 64 - __builtin_clzll((uint64_t)(value - 1)) - shift;
    return b < buckets - 1 ? b : buckets - 1;
}

static int fail(struct mqs_round_out *out, int op, int err)
{
    out->op = op;
    out->err = err ? err : EIO;
    return MQS_ROUND_FAILED;
}

static ssize_t direct_pwrite(const struct mqs_io *io, int fd, const void *p, size_t n, off_t at)
{
    (void)io;
    return pwrite(fd, p, n, at);
}

static int direct_fdatasync(const struct mqs_io *io, int fd)
{
    (void)io;
    return fdatasync(fd);
}

static int direct_flock(const struct mqs_io *io, int fd, int how)
{
    (void)io;
    return flock(fd, how);
}

const struct mqs_io mqs_io_direct = {direct_pwrite, direct_fdatasync, direct_flock, NULL};

/* All of [p, p + n) at file offset `at` (short writes looped, EINTR retried). */
static int pwrite_all(const struct mqs_io *io, int fd, const uint8_t *p, int64_t n, int64_t at)
{
    while (n > 0) {
        ssize_t w = io->pwrite(io, fd, p, (size_t)n, at);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? errno : EIO;
        p += w;
        n -= w;
        at += w;
    }
    return 0;
}

static int flock_retry(const struct mqs_io *io, int fd, int how)
{
    while (io->flock(io, fd, how) < 0)
        if (errno != EINTR)
            return errno;
    return 0;
}

/* LogFiles.commit(0) when nothing needs Python: publish (the producers' lock-free
 * step), then under the commit lock the pool's [committed, published) into the file.
 * COMMITTED_SEQ is read before the position: every seq below it is committed. */
static int commit(const struct mqs_round_in *in, struct mqs_round_out *out, int64_t seg_start,
                  int64_t seg_end)
{
    uint8_t *ctl = in->ctl;
    int64_t size = seg_end - seg_start;
    mqs_publish(ctl, get(ctl, MQS_OFF_SLOT_COUNT));
    int err = flock_retry(in->io, in->lock_fd, LOCK_EX);
    if (err)
        return fail(out, MQS_OP_FLOCK, err);
    int rc = MQS_ROUND_FORCED;
    int64_t pseq = get(ctl, MQS_OFF_PUBLISHED_SEQ), ts = get(ctl, MQS_OFF_PUBLISHED_TS);
    int64_t pub = get(ctl, MQS_OFF_PUBLISHED), com = get(ctl, MQS_OFF_COMMITTED);
    if (pub > com) {
        if (com < seg_start || pub > seg_end || pub > get(ctl, MQS_OFF_RESERVED)) {
            rc = MQS_ROUND_FALLBACK;
        } else {
            if (in->pool) {
                int64_t k = in->seg_index % get(ctl, MQS_OFF_POOL_BUFFERS);
                err = pwrite_all(in->io, in->seg_fd, in->pool + k * size + (com - seg_start),
                                 pub - com, com - seg_start);
            }
            if (err) {
                rc = fail(out, MQS_OP_PWRITE, err);
            } else {
                put(ctl, MQS_OFF_COMMITTED, pub);
                put(ctl, MQS_OFF_COMMITTED_TS, ts);
                put(ctl, MQS_OFF_COMMITTED_SEQ, pseq);
            }
        }
    }
    flock_retry(in->io, in->lock_fd, LOCK_UN); /* closing the file would release it too */
    return rc;
}

/* LogFiles.flush(0) and the flusher's bookkeeping after it. */
static int force(const struct mqs_round_in *in, struct mqs_round_out *out, int64_t seg_end)
{
    uint8_t *ctl = in->ctl;
    int64_t ts = get(ctl, MQS_OFF_COMMITTED_TS), cseq = get(ctl, MQS_OFF_COMMITTED_SEQ);
    int64_t com = get(ctl, MQS_OFF_COMMITTED), fl = get(ctl, MQS_OFF_FLUSHED);
    out->t_committed = mqs_mono_ns();
    if (com <= fl) {
        out->t_forced = out->t_waked = out->t_committed;
        return MQS_ROUND_IDLE;
    }
    if (com > seg_end)
        return MQS_ROUND_FALLBACK;
    int64_t t0 = mqs_mono_ns();
    if (in->io->fdatasync(in->io, in->seg_fd) < 0)
        return fail(out, MQS_OP_FDATASYNC, errno);
    int64_t ns = mqs_mono_ns() - t0, fseq = get(ctl, MQS_OFF_FLUSHED_SEQ);
    int64_t msgs = cseq > fseq ? cseq - fseq : 0;
    put(ctl, MQS_OFF_FSYNC_NS, get(ctl, MQS_OFF_FSYNC_NS) + ns);
    put(ctl, MQS_OFF_FSYNC_COUNT, get(ctl, MQS_OFF_FSYNC_COUNT) + 1);
    put(ctl, MQS_OFF_FSYNC_MSGS, get(ctl, MQS_OFF_FSYNC_MSGS) + msgs);
    put(ctl, MQS_OFF_FLUSHED_SEQ, cseq);
    put(ctl, MQS_OFF_FLUSHED_TS, ts);
    put(ctl, MQS_OFF_FLUSHED, com);
    /* storedir.write_flushed_offset: b"MQFLUSH1" and the offset, big-endian. */
    uint8_t rec[16] = {'M', 'Q', 'F', 'L', 'U', 'S', 'H', '1'};
    for (int i = 0; i < 8; i++)
        rec[8 + i] = (uint8_t)((uint64_t)com >> (56 - 8 * i));
    int err = pwrite_all(in->io, in->offset_fd, rec, 16, 0);
    if (err)
        return fail(out, MQS_OP_OFFSET_PWRITE, err);
    out->t_forced = mqs_mono_ns();
    mqs_flushed_wake(ctl, mqs_wake_mask(fl, com));
    out->t_waked = mqs_mono_ns();
    out->fsync_ns = ns;
    int64_t b = MQS_OFF_FSYNC_HIST +
                8 * mqs_hist_bucket(ns / 1000, MQS_FSYNC_HIST_SHIFT, MQS_FSYNC_HIST_BUCKETS);
    put(ctl, b, get(ctl, b) + 1);
    b = MQS_OFF_GROUP_HIST + 8 * mqs_hist_bucket(msgs, 0, MQS_GROUP_HIST_BUCKETS);
    put(ctl, b, get(ctl, b) + 1);
    return MQS_ROUND_FORCED;
}

int mqs_sync_round(const struct mqs_round_in *given, struct mqs_round_out *out)
{
    struct mqs_round_in with_io = *given;
    if (!with_io.io)
        with_io.io = &mqs_io_direct;
    const struct mqs_round_in *in = &with_io;
    uint8_t *ctl = in->ctl;
    *out = (struct mqs_round_out){0};
    if (in->want_seq > 0 && get(ctl, MQS_OFF_PUBLISHED_SEQ) < in->want_seq)
        mqs_flusher_gather(ctl, in->want_seq, in->gather_ns > 0 ? in->gather_ns : 1);
    out->t_gathered = mqs_mono_ns();
    int64_t size = get(ctl, MQS_OFF_SEGMENT_SIZE);
    int64_t seg_start = in->seg_index * size, seg_end = seg_start + size;
    int64_t fl = get(ctl, MQS_OFF_FLUSHED);
    if (fl < seg_start || fl >= seg_end)
        return MQS_ROUND_FALLBACK;
    if (get(ctl, MQS_OFF_COMMITTED) < get(ctl, MQS_OFF_SYNC_REQUEST)) {
        int rc = commit(in, out, seg_start, seg_end);
        if (rc != MQS_ROUND_FORCED)
            return rc;
    }
    return force(in, out, seg_end);
}
