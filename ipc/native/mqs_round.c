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

static int fail(struct mqs_round_out *out, int op, int err, int fd)
{
    out->op = op;
    out->fd = fd;
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

/* The file of segment `index` among the caller's, or -1: not given, or not there yet. */
static int seg_fd(const struct mqs_round_in *in, int64_t index)
{
    int64_t i = index - in->seg_index;
    return i >= 0 && i < in->nsegs ? in->seg_fds[i] : -1;
}

/* LogFiles.commit(0) without the fills: publish (the producers' lock-free step), then
 * under the commit lock the pool's [committed, published) into the files, segment by
 * segment, `committed` moved after each. It stops at the first segment whose file it
 * was not given (MQS_ROUND_MORE, out->missing): `committed` then ends at a segment's
 * end, a record boundary, and COMMITTED_TS/SEQ stay as they were (they are stamped
 * only when the commit reaches `published`, as the Python commit does). COMMITTED_SEQ
 * is read before the position: every seq below it is committed. */
static int commit(const struct mqs_round_in *in, struct mqs_round_out *out, int64_t size)
{
    uint8_t *ctl = in->ctl;
    mqs_publish(ctl, get(ctl, MQS_OFF_SLOT_COUNT));
    int err = flock_retry(in->io, in->lock_fd, LOCK_EX);
    if (err)
        return fail(out, MQS_OP_FLOCK, err, in->lock_fd);
    int rc = MQS_ROUND_FORCED;
    int64_t pseq = get(ctl, MQS_OFF_PUBLISHED_SEQ), ts = get(ctl, MQS_OFF_PUBLISHED_TS);
    int64_t pub = get(ctl, MQS_OFF_PUBLISHED), com = get(ctl, MQS_OFF_COMMITTED);
    if (pub > com && pub > get(ctl, MQS_OFF_RESERVED)) {
        rc = fail(out, MQS_OP_CHECK, EUCLEAN, -1); /* a scribbled block: never commit it */
    } else if (pub > com) {
        int64_t buffers = get(ctl, MQS_OFF_POOL_BUFFERS);
        while (in->pool && com < pub) {
            int64_t index = com / size, base = index * size;
            int64_t end = pub < base + size ? pub : base + size;
            int fd = seg_fd(in, index);
            if (fd < 0) {
                out->missing = index - in->seg_index;
                rc = MQS_ROUND_MORE;
                break;
            }
            err = pwrite_all(in->io, fd, in->pool + (index % buffers) * size + (com - base),
                             end - com, com - base);
            if (err) {
                rc = fail(out, MQS_OP_PWRITE, err, fd);
                break;
            }
            com = end;
            put(ctl, MQS_OFF_COMMITTED, com);
        }
        if (!in->pool) /* the producers wrote the mappings: nothing to copy */
            put(ctl, MQS_OFF_COMMITTED, com = pub);
        if (com == pub) {
            put(ctl, MQS_OFF_COMMITTED_TS, ts);
            put(ctl, MQS_OFF_COMMITTED_SEQ, pseq);
        }
    }
    flock_retry(in->io, in->lock_fd, LOCK_UN); /* closing the file would release it too */
    return rc;
}

/* LogFiles.flush(least_pages) and the flusher's bookkeeping after it (flush_and_wake):
 * fdatasync each file of [flushed, committed) in order, then the fsync statistics,
 * flushed_pos/seq/ts, the flushed_offset file, the wake of the waiters it covered and
 * the histograms. flushed_pos moves once, after the last fdatasync returned: it never
 * claims a byte that is not on disk. When the range runs past the files given (more
 * than MQS_ROUND_SEGS, or one not open), only the files given are forced and
 * flushed_pos ends at the last one's end (a segment's end, a record boundary, as
 * RocketMQ's flush of one file leaves flushedWhere); FLUSHED_SEQ/TS then stay as they
 * were (the slots up to there are not known here: a lower bound stays true) and the
 * force counts no messages; MQS_ROUND_MORE says to call again. No file for flushed_pos
 * itself: MQS_ROUND_NO_FILE, nothing done. */
static int force(const struct mqs_round_in *in, struct mqs_round_out *out, int64_t size)
{
    uint8_t *ctl = in->ctl;
    int64_t ts = get(ctl, MQS_OFF_COMMITTED_TS), cseq = get(ctl, MQS_OFF_COMMITTED_SEQ);
    int64_t com = get(ctl, MQS_OFF_COMMITTED), fl = get(ctl, MQS_OFF_FLUSHED);
    out->t_committed = mqs_mono_ns();
    out->t_forced = out->t_waked = out->t_committed;
    if (com <= fl)
        return MQS_ROUND_IDLE;
    if (in->least_pages > 0 && com / size == fl / size &&
        com / MQS_OS_PAGE - fl / MQS_OS_PAGE < in->least_pages)
        return MQS_ROUND_IDLE;
    int64_t t0 = mqs_mono_ns(), at = fl, upto = com;
    while (at < upto) {
        int64_t index = at / size, end = (index + 1) * size;
        int fd = seg_fd(in, index);
        if (fd < 0) {
            out->missing = index - in->seg_index;
            upto = at;
            break;
        }
        if (in->io->fdatasync(in->io, fd) < 0)
            return fail(out, MQS_OP_FDATASYNC, errno, fd);
        at = end < upto ? end : upto;
    }
    if (upto == fl)
        return MQS_ROUND_NO_FILE; /* not even the first file: nothing forced */
    int whole = upto == com;
    int64_t ns = mqs_mono_ns() - t0, fseq = get(ctl, MQS_OFF_FLUSHED_SEQ);
    int64_t msgs = whole && cseq > fseq ? cseq - fseq : 0;
    put(ctl, MQS_OFF_FSYNC_NS, get(ctl, MQS_OFF_FSYNC_NS) + ns);
    put(ctl, MQS_OFF_FSYNC_COUNT, get(ctl, MQS_OFF_FSYNC_COUNT) + 1);
    put(ctl, MQS_OFF_FSYNC_MSGS, get(ctl, MQS_OFF_FSYNC_MSGS) + msgs);
    if (whole) {
        put(ctl, MQS_OFF_FLUSHED_SEQ, cseq);
        put(ctl, MQS_OFF_FLUSHED_TS, ts);
    }
    put(ctl, MQS_OFF_FLUSHED, upto);
    /* storedir.write_flushed_offset: b"MQFLUSH1" and the offset, big-endian. */
    uint8_t rec[16] = {'M', 'Q', 'F', 'L', 'U', 'S', 'H', '1'};
    for (int i = 0; i < 8; i++)
        rec[8 + i] = (uint8_t)((uint64_t)upto >> (56 - 8 * i));
    int err = pwrite_all(in->io, in->offset_fd, rec, 16, 0);
    if (err)
        return fail(out, MQS_OP_OFFSET_PWRITE, err, in->offset_fd);
    out->t_forced = mqs_mono_ns();
    mqs_flushed_wake(ctl, mqs_wake_mask(fl, upto));
    out->t_waked = mqs_mono_ns();
    out->fsync_ns = ns;
    out->forced = 1;
    int64_t b = MQS_OFF_FSYNC_HIST +
                8 * mqs_hist_bucket(ns / 1000, MQS_FSYNC_HIST_SHIFT, MQS_FSYNC_HIST_BUCKETS);
    put(ctl, b, get(ctl, b) + 1);
    b = MQS_OFF_GROUP_HIST + 8 * mqs_hist_bucket(msgs, 0, MQS_GROUP_HIST_BUCKETS);
    put(ctl, b, get(ctl, b) + 1);
    return whole ? MQS_ROUND_FORCED : MQS_ROUND_MORE;
}

static const struct mqs_round_in *with_io(const struct mqs_round_in *given,
                                          struct mqs_round_in *copy)
{
    *copy = *given;
    if (!copy->io)
        copy->io = &mqs_io_direct;
    return copy;
}

int mqs_sync_round(const struct mqs_round_in *given, struct mqs_round_out *out)
{
    struct mqs_round_in copy;
    const struct mqs_round_in *in = with_io(given, &copy);
    copy.least_pages = 0;
    uint8_t *ctl = in->ctl;
    *out = (struct mqs_round_out){0};
    if (in->want_seq > 0 && get(ctl, MQS_OFF_PUBLISHED_SEQ) < in->want_seq)
        mqs_flusher_gather(ctl, in->want_seq, in->gather_ns > 0 ? in->gather_ns : 1);
    out->t_gathered = mqs_mono_ns();
    int64_t size = get(ctl, MQS_OFF_SEGMENT_SIZE);
    int more = 0;
    if (get(ctl, MQS_OFF_COMMITTED) < get(ctl, MQS_OFF_SYNC_REQUEST)) {
        int rc = commit(in, out, size);
        if (rc == MQS_ROUND_FAILED)
            return rc;
        more = rc == MQS_ROUND_MORE;
    }
    int rc = force(in, out, size);
    if (rc == MQS_ROUND_FAILED || rc == MQS_ROUND_NO_FILE || !more)
        return rc;
    /* the commit stopped before a file it was not given: again, if this forced */
    return out->forced ? MQS_ROUND_MORE : MQS_ROUND_NO_FILE;
}

int mqs_flush(const struct mqs_round_in *given, struct mqs_round_out *out)
{
    struct mqs_round_in copy;
    const struct mqs_round_in *in = with_io(given, &copy);
    *out = (struct mqs_round_out){0};
    out->t_gathered = mqs_mono_ns();
    return force(in, out, get(in->ctl, MQS_OFF_SEGMENT_SIZE));
}
