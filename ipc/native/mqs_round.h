/* The flusher's flush step in C, without the GIL (issue 12; "one path"): the SYNC_FLUSH
 * round (`mqs_sync_round`: gather, commit (pool -> files under the commit lock),
 * fdatasync, publish flushed_pos/seq/ts and the flushed_offset file, the fsync
 * statistics and histograms, the wake of the waiters it covered) and the timed flush
 * (`mqs_flush`: the same force and bookkeeping under RocketMQ's least-pages rule). Their
 * Python references are ipc/commit.py's `LogFiles.sync_round_py` and `flush_py` /
 * `flush_and_wake_py` (tests/native/test_sync_round_diff.py compares them byte for
 * byte); production runs only these. A range may cross segment boundaries: the caller
 * gives the files of `seg_index` (the segment holding flushed_pos) and the ones after
 * it, up to MQS_ROUND_SEGS; a range that runs past them returns MQS_ROUND_MORE having
 * done what the files given allow, and the caller opens the next ones and calls again.
 * Dead producers' reservations are filled by the committer's (Python) commit only. */
#ifndef MQS_ROUND_H
#define MQS_ROUND_H

#include <stdint.h>
#include <sys/types.h>

enum {
    MQS_ROUND_FORCED = 0,   /* forced, flushed_pos moved, waiters woken */
    MQS_ROUND_IDLE = 1,     /* nothing committed beyond flushed_pos: nothing forced */
    MQS_ROUND_MORE = 2,     /* forced up to the files' end: call again with the next ones */
    MQS_ROUND_FAILED = 3,   /* an I/O call failed (out.op, out.err): fail the store */
    MQS_ROUND_NO_FILE = 4,  /* nothing forced: no file given for segment seg_index +
                             * out.missing, which holds bytes to commit or force */
};

/* Which call failed. */
enum {
    MQS_OP_NONE = 0,
    MQS_OP_FLOCK,
    MQS_OP_PWRITE,
    MQS_OP_FDATASYNC,
    MQS_OP_OFFSET_PWRITE,
    MQS_OP_CHECK, /* EUCLEAN: published is past reserved, the control block was overwritten */
};

#define MQS_ROUND_SEGS 8 /* segment files one call takes */
#define MQS_OS_PAGE 4096 /* the least-pages rule's page (engine.segment.OS_PAGE_SIZE) */

/* The round's I/O calls (issue 24): `mqs_io_direct` is the system calls themselves, what
 * production runs; the tests' seam (engine/fileio.py's faults and sync watch, through
 * mqs_control_py.c) swaps in a table whose calls first ask a Python hook, which may fail
 * the call with an errno or record what a sync is about to make durable. Each call
 * returns what the system call does (-1 with errno set on failure). */
struct mqs_io {
    ssize_t (*pwrite)(const struct mqs_io *io, int fd, const void *p, size_t n, off_t at);
    int (*fdatasync)(const struct mqs_io *io, int fd);
    int (*flock)(const struct mqs_io *io, int fd, int how);
    void *hook; /* the seam's own (its Python callable); NULL in mqs_io_direct */
};

extern const struct mqs_io mqs_io_direct;

struct mqs_round_in {
    uint8_t *ctl;
    uint8_t *pool;     /* the write pool, or NULL (pool off: producers wrote the mapping) */
    int64_t seg_index; /* the segment holding flushed_pos */
    int nsegs;         /* files given, 0..MQS_ROUND_SEGS */
    int seg_fds[MQS_ROUND_SEGS]; /* segment seg_index + i's file open for writing, -1: none */
    int lock_fd;       /* the commit lock's file (flock) */
    int offset_fd;     /* <store>/flushed_offset, open for writing */
    int64_t want_seq;  /* gather: published_seq to wait for (<= 0: none) */
    int64_t gather_ns; /* at most this long */
    int64_t least_pages; /* mqs_flush: force only this many whole pages or a boundary */
    const struct mqs_io *io; /* the I/O calls (NULL: mqs_io_direct) */
};

struct mqs_round_out {
    int64_t t_gathered, t_committed, t_forced, t_waked, fsync_ns; /* CLOCK_MONOTONIC ns */
    int op, err, fd; /* the call that failed, its errno and descriptor */
    int missing;     /* MQS_ROUND_NO_FILE: the segment (from seg_index) with no file */
    int forced;      /* this call forced (flushed_pos moved) */
};

/* The SYNC_FLUSH round: gather, commit when the sync request is beyond committed, force
 * with no least pages (`least_pages` is not read). */
int mqs_sync_round(const struct mqs_round_in *in, struct mqs_round_out *out);

/* The timed flush: force with `least_pages` (want_seq, gather_ns, pool, lock_fd are not
 * read); out.t_gathered and t_committed are its start. */
int mqs_flush(const struct mqs_round_in *in, struct mqs_round_out *out);

/* `bucket_of` of ipc/control.py: bucket i holds values up to 2^(i+shift). */
int64_t mqs_hist_bucket(int64_t value, int shift, int64_t buckets);

#endif
