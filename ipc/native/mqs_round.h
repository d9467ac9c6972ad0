/* The flusher's SYNC_FLUSH round in one call, without the GIL (issue 12): gather, commit
 * (pool -> file under the commit lock), fdatasync, publish flushed_pos/seq/ts and the
 * flushed_offset file, the fsync statistics, and the wake of the waiters it covered.
 * Its Python twin is ipc/commit.py's `LogFiles.sync_round_py` (tests/native/
 * test_sync_round_diff.py compares the two byte for byte). It handles the common case
 * only: every byte of the round in the one segment the caller opened (`seg_index`,
 * `seg_fd`), forced with fdatasync; anything else (a segment boundary in the range, the
 * committer ahead into the next segment) returns MQS_ROUND_FALLBACK, having done at
 * most the commit, and the twin does the rest. */
#ifndef MQS_ROUND_H
#define MQS_ROUND_H

#include <stdint.h>
#include <sys/types.h>

enum {
    MQS_ROUND_FORCED = 0,   /* forced, flushed_pos moved, waiters woken */
    MQS_ROUND_IDLE = 1,     /* nothing committed beyond flushed_pos: nothing forced */
    MQS_ROUND_FALLBACK = 2, /* outside the segment: the caller's Python round finishes */
    MQS_ROUND_FAILED = 3,   /* an I/O call failed (out.op, out.err): fail the store */
};

/* Which call failed. */
enum { MQS_OP_NONE = 0, MQS_OP_FLOCK, MQS_OP_PWRITE, MQS_OP_FDATASYNC, MQS_OP_OFFSET_PWRITE };

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
    int seg_fd;        /* its file, open for writing */
    int lock_fd;       /* the commit lock's file (flock) */
    int offset_fd;     /* <store>/flushed_offset, open for writing */
    int64_t want_seq;  /* gather: published_seq to wait for (<= 0: none) */
    int64_t gather_ns; /* at most this long */
    const struct mqs_io *io; /* the I/O calls (NULL: mqs_io_direct) */
};

struct mqs_round_out {
    int64_t t_gathered, t_committed, t_forced, t_waked, fsync_ns; /* CLOCK_MONOTONIC ns */
    int op, err;
};

int mqs_sync_round(const struct mqs_round_in *in, struct mqs_round_out *out);

/* `bucket_of` of ipc/control.py: bucket i holds values up to 2^(i+shift). */
int64_t mqs_hist_bucket(int64_t value, int shift, int64_t buckets);

#endif
