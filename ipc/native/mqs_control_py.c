/* The control block's helpers as Python sees them (mqstore._native): each door checks
 * its arguments, then calls the C of mqs_append.c, mqs_futex.c, mqs_round.c or
 * mqs_live.c; the waits and the flusher's round run without the GIL. */
#include "mqs_control_py.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>

#include "mqs_append.h"
#include "mqs_args.h"
#include "mqs_futex.h"
#include "mqs_layout.h"
#include "mqs_live.h"
#include "mqs_round.h"

static int ctl_of(PyObject *o, Py_buffer *v)
{
    if (mqs_arg_wbuffer(o, "ctl", v) < 0)
        return -1;
    if (v->len < MQS_SLOTS_OFF) {
        PyBuffer_Release(v);
        PyErr_SetString(PyExc_ValueError, "ctl is shorter than a control block");
        return -1;
    }
    return 0;
}

/* The arguments of `usage`: the control block, then one int64 per name of `names`
 * (NULL-terminated); -1 with an exception set. Release `v` after. */
static int ctl_args(PyObject *const *args, Py_ssize_t n, const char *usage,
                    const char *const *names, Py_buffer *v, int64_t *out)
{
    Py_ssize_t k = 0;
    while (names[k])
        k++;
    if (n != k + 1) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, k + 1);
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++)
        if (mqs_arg_i64(args[i + 1], names[i], &out[i]) < 0)
            return -1;
    return ctl_of(args[0], v);
}

/* A one-argument helper: `expr` over the control block `v.buf`, its result returned. */
#define CTL_HELPER(fn, expr)                                                                   \
    PyObject *fn(PyObject *Py_UNUSED(m), PyObject *arg)                                 \
    {                                                                                          \
        Py_buffer v;                                                                           \
        if (ctl_of(arg, &v) < 0)                                                               \
            return NULL;                                                                       \
        PyObject *r = (expr);                                                                  \
        PyBuffer_Release(&v);                                                                  \
        return r;                                                                              \
    }

static PyObject *none_after(int Py_UNUSED(ignored))
{
    Py_RETURN_NONE;
}

static int init_control(uint8_t *ctl)
{
    int rc = mqs_mutex_init(ctl);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

/* The slot ring's rows, or 0 when the block's word is out of range for its length. */
static int64_t slot_count(const Py_buffer *v)
{
    int64_t slots = *mqs_i64(v->buf, MQS_OFF_SLOT_COUNT);
    return slots > 0 && slots <= (v->len - MQS_SLOTS_OFF) / MQS_SLOT_ROW ? slots : 0;
}

static int64_t publish(const Py_buffer *v)
{
    int64_t slots = slot_count(v);
    return slots > 0 ? mqs_publish(v->buf, slots) : 0;
}

static int wake_all(uint8_t *ctl)
{
    mqs_flushed_wake_all(ctl);
    return 0;
}

static int wake_flusher(uint8_t *ctl)
{
    mqs_flusher_wake(ctl);
    return 0;
}

static int wake_idle(uint8_t *ctl)
{
    mqs_idle_wake(ctl);
    return 0;
}

CTL_HELPER(mqs_py_init_control, init_control(v.buf) < 0 ? NULL : none_after(0))
CTL_HELPER(mqs_py_publish, PyLong_FromLongLong(publish(&v)))
CTL_HELPER(mqs_py_fence, PyLong_FromLongLong(mqs_fence(v.buf)))
CTL_HELPER(mqs_py_fence_seq, PyLong_FromLongLong(mqs_fence_seq(v.buf)))

/* claim(ctl, seq) -> int and fill_done(ctl, seq, n): the filler's steps (mqs_append.h). */
static PyObject *filler_step(PyObject *const *args, Py_ssize_t n, int done)
{
    static const char *const claim_names[] = {"seq", NULL};
    static const char *const done_names[] = {"seq", "n", NULL};
    int64_t a[2];
    Py_buffer v;
    if (ctl_args(args, n, done ? "fill_done(ctl, seq, n)" : "claim(ctl, seq)",
                 done ? done_names : claim_names, &v, a) < 0)
        return NULL;
    int64_t slots = slot_count(&v);
    PyObject *r = NULL;
    if (slots == 0 || a[0] < 0 || (done && (a[1] < 1 || a[1] > slots)))
        PyErr_SetString(PyExc_ValueError, "seq or n out of range for the control block");
    else if (done)
        r = none_after((mqs_fill_done(v.buf, slots, a[0], a[1]), 0));
    else
        r = PyLong_FromLongLong(mqs_claim(v.buf, slots, a[0]));
    PyBuffer_Release(&v);
    return r;
}

PyObject *mqs_py_claim(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return filler_step(args, n, 0);
}

PyObject *mqs_py_fill_done(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return filler_step(args, n, 1);
}
CTL_HELPER(mqs_py_flushed_wake_all, none_after(wake_all(v.buf)))
CTL_HELPER(mqs_py_flusher_wake, none_after(wake_flusher(v.buf)))
CTL_HELPER(mqs_py_idle_wake, none_after(wake_idle(v.buf)))
CTL_HELPER(mqs_py_sync_request, PyLong_FromLongLong(mqs_sync_request(v.buf)))

PyObject *mqs_py_flushed_wake(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    static const char *const names[] = {"from_pos", NULL};
    int64_t a[1];
    Py_buffer v;
    if (ctl_args(args, n, "flushed_wake(ctl, from_pos)", names, &v, a) < 0)
        return NULL;
    mqs_flushed_wake_from(v.buf, a[0]);
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

/* wake_mask(from_pos, to_pos) and wait_bits(end): the futex bits (mqs_futex.h). */
static PyObject *py_wake_bits(PyObject *const *args, Py_ssize_t n, int mask)
{
    int64_t a[2];
    static const char *const names[] = {"from_pos", "to_pos", "end"};
    if (n != 2 - !mask) {
        PyErr_SetString(PyExc_TypeError, mask ? "wake_mask(from_pos, to_pos) takes 2 arguments"
                                              : "wait_bits(end) takes 1 argument");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (mqs_arg_i64(args[i], names[mask ? i : 2], &a[i]) < 0)
            return NULL;
    return PyLong_FromUnsignedLong(mask ? mqs_wake_mask(a[0], a[1]) : mqs_wait_bits(a[0]));
}

PyObject *mqs_py_wake_mask(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return py_wake_bits(args, n, 1);
}

PyObject *mqs_py_wait_bits(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return py_wake_bits(args, n, 0);
}

/* The flusher's waits: sleep (0), gather (1), the reservation fence (2), GIL released. */
static PyObject *ctl_wait(PyObject *const *args, Py_ssize_t n, int which)
{
    static const char *const sleep_names[] = {"timeout_ns", NULL};
    static const char *const gather_names[] = {"want_seq", "timeout_ns", NULL};
    static const char *const usage[] = {"flusher_sleep(ctl, timeout_ns)",
                                        "flusher_gather(ctl, want_seq, timeout_ns)",
                                        "reserve_fence(ctl, timeout_ns)"};
    int64_t a[2];
    Py_buffer v;
    if (ctl_args(args, n, usage[which], which == 1 ? gather_names : sleep_names, &v, a) < 0)
        return NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    if (which == 0) {
        r = mqs_flusher_sleep(v.buf, a[0] > 0 ? a[0] : 1);
    } else if (which == 1) {
        r = mqs_flusher_gather(v.buf, a[0], a[1] > 0 ? a[1] : 1);
    } else {
        r = mqs_lock(v.buf, v.len, a[0], 0);
        if (r == MQS_OK)
            mqs_unlock(v.buf);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return which == 2 ? PyLong_FromLong(r) : PyBool_FromLong(r);
}

PyObject *mqs_py_flusher_sleep(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return ctl_wait(args, n, 0);
}

PyObject *mqs_py_flusher_gather(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return ctl_wait(args, n, 1);
}

PyObject *mqs_py_reserve_fence(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return ctl_wait(args, n, 2);
}

/* The idle workers' waits (mqs_futex.h), GIL released: idle_sleep (0) while
 * published_pos <= pos, wait_flushed_past (1) while flushed_pos <= pos. */
static PyObject *idle_wait(PyObject *const *args, Py_ssize_t n, int flushed)
{
    static const char *const names[] = {"pos", "timeout_ns", NULL};
    int64_t a[2];
    Py_buffer v;
    if (ctl_args(args, n, flushed ? "wait_flushed_past(ctl, pos, timeout_ns)"
                                  : "idle_sleep(ctl, pos, timeout_ns)",
                 names, &v, a) < 0)
        return NULL;
    int64_t timeout = a[1] > 0 ? a[1] : 1;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = flushed ? mqs_wait_flushed_past(v.buf, a[0], timeout) : mqs_idle_sleep(v.buf, a[0], timeout);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyBool_FromLong(r);
}

PyObject *mqs_py_idle_sleep(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return idle_wait(args, n, 0);
}

PyObject *mqs_py_wait_flushed_past(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return idle_wait(args, n, 1);
}

/* The I/O seam of the round (mqs_round.h's struct mqs_io) for the tests' faults and sync
 * watch: each call first asks the hook, `hook(op, fd) -> errno` (op: MQS_OP_FLOCK,
 * MQS_OP_PWRITE, MQS_OP_FDATASYNC), taking the GIL for it; a non-zero answer fails the
 * call with that errno, 0 lets the system call run. A hook that raises fails it with EIO
 * (the exception is reported as unraisable). Only when a fault or a watch is set: the
 * round of production runs mqs_io_direct, without the GIL. */
static int seam_ask(const struct mqs_io *io, int op, int fd)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction((PyObject *)io->hook, "ii", op, fd);
    long err = r ? PyLong_AsLong(r) : -1;
    if (err == -1 && PyErr_Occurred()) {
        PyErr_WriteUnraisable((PyObject *)io->hook);
        err = EIO;
    }
    Py_XDECREF(r);
    PyGILState_Release(gil);
    return err < 0 || err > INT_MAX ? EIO : (int)err;
}

static ssize_t seam_pwrite(const struct mqs_io *io, int fd, const void *p, size_t n, off_t at)
{
    int err = seam_ask(io, MQS_OP_PWRITE, fd);
    if (err) {
        errno = err;
        return -1;
    }
    return mqs_io_direct.pwrite(io, fd, p, n, at);
}

static int seam_fdatasync(const struct mqs_io *io, int fd)
{
    int err = seam_ask(io, MQS_OP_FDATASYNC, fd);
    if (err) {
        errno = err;
        return -1;
    }
    return mqs_io_direct.fdatasync(io, fd);
}

static int seam_flock(const struct mqs_io *io, int fd, int how)
{
    int err = seam_ask(io, MQS_OP_FLOCK, fd);
    if (err) {
        errno = err;
        return -1;
    }
    return mqs_io_direct.flock(io, fd, how);
}

/* The segment files of a flush step: a tuple of at most MQS_ROUND_SEGS descriptors, each
 * open (>= 0) or -1 (no such file yet); 0 and an exception set on bad input. */
static int seg_fds_arg(PyObject *o, struct mqs_round_in *in)
{
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) > MQS_ROUND_SEGS) {
        PyErr_Format(PyExc_TypeError, "seg_fds must be a tuple of at most %d descriptors",
                     MQS_ROUND_SEGS);
        return 0;
    }
    in->nsegs = (int)PyTuple_GET_SIZE(o);
    for (int i = 0; i < in->nsegs; i++) {
        PyObject *item = PyTuple_GET_ITEM(o, i);
        if (!PyLong_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "seg_fds must hold ints");
            return 0;
        }
        long fd = PyLong_AsLong(item);
        if (fd == -1 && PyErr_Occurred())
            return 0;
        if (fd < -1 || fd > INT_MAX) {
            PyErr_SetString(PyExc_ValueError, "seg_fds must be open descriptors or -1");
            return 0;
        }
        in->seg_fds[i] = (int)fd;
    }
    return 1;
}

/* A tuple of `n` ints: built directly, a third of what Py_BuildValue's format costs, once
 * a round (callgrind: ~1,500 instructions of the round's ~3,700 in this door). */
static PyObject *int_tuple(const int64_t *v, Py_ssize_t n)
{
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

/* The flush step's door: sync_round (round 1) or flush_step (round 0), their arguments
 * checked, the step run without the GIL through the system calls or the seam. */
static PyObject *flush_step(PyObject *const *args, Py_ssize_t n, int round)
{
    static const char *const round_names[] = {"seg_index", "lock_fd", "offset_fd",
                                              "want_seq", "gather_ns", NULL};
    static const char *const flush_names[] = {"seg_index", "offset_fd", "least_pages", NULL};
    const char *usage = round ? "sync_round(ctl, pool, seg_index, seg_fds, lock_fd, offset_fd, "
                                "want_seq, gather_ns[, io_hook])"
                              : "flush_step(ctl, seg_index, seg_fds, offset_fd, least_pages"
                                "[, io_hook])";
    Py_ssize_t k = round ? 8 : 5; /* without the hook */
    if (n != k && n != k + 1) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd or %zd arguments", usage, k, k + 1);
        return NULL;
    }
    PyObject *hook = n == k + 1 && args[k] != Py_None ? args[k] : NULL;
    if (hook && !PyCallable_Check(hook)) {
        PyErr_SetString(PyExc_TypeError, "io_hook must be None or callable(op, fd) -> errno");
        return NULL;
    }
    struct mqs_round_in in = {0};
    int64_t a[5] = {0};
    Py_buffer v, pool = {0};
    int fds_at = round ? 3 : 2;
    if (round) {
        PyObject *const rest[6] = {args[0], args[2], args[4], args[5], args[6], args[7]};
        if (ctl_args(rest, 6, usage, round_names, &v, a) < 0)
            return NULL;
    } else {
        PyObject *const rest[4] = {args[0], args[1], args[3], args[4]};
        if (ctl_args(rest, 4, usage, flush_names, &v, a) < 0)
            return NULL;
    }
    if (!seg_fds_arg(args[fds_at], &in)) {
        PyBuffer_Release(&v);
        return NULL;
    }
    int64_t size = *mqs_i64(v.buf, MQS_OFF_SEGMENT_SIZE);
    int64_t pool_n = *mqs_i64(v.buf, MQS_OFF_POOL_BUFFERS);
    int has_pool = round && args[1] != Py_None;
    if (has_pool && mqs_arg_wbuffer(args[1], "pool", &pool) < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    int64_t lock_fd = round ? a[1] : 0, offset_fd = round ? a[2] : a[1];
    const char *bad = NULL;
    if (size <= 0 || a[0] < 0)
        bad = "seg_index must be >= 0 of a control block with a segment size";
    else if (round && (has_pool != (pool_n > 0) || (has_pool && pool.len < pool_n * size)))
        bad = "pool must be the control block's pool (None when it has none)";
    else if (lock_fd < 0 || lock_fd > INT_MAX || offset_fd < 0 || offset_fd > INT_MAX)
        bad = round ? "lock_fd and offset_fd must be open descriptors"
                    : "offset_fd must be an open descriptor";
    if (bad) {
        if (has_pool)
            PyBuffer_Release(&pool);
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    struct mqs_io seam = {seam_pwrite, seam_fdatasync, seam_flock, hook};
    in.ctl = v.buf;
    in.pool = has_pool ? pool.buf : NULL;
    in.seg_index = a[0];
    in.lock_fd = (int)lock_fd;
    in.offset_fd = (int)offset_fd;
    in.want_seq = round ? a[3] : 0;
    in.gather_ns = round ? a[4] : 0;
    in.least_pages = round ? 0 : a[2];
    in.io = hook ? &seam : &mqs_io_direct;
    struct mqs_round_out out;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = round ? mqs_sync_round(&in, &out) : mqs_flush(&in, &out);
    Py_END_ALLOW_THREADS
    if (has_pool)
        PyBuffer_Release(&pool);
    PyBuffer_Release(&v);
    if (rc == MQS_ROUND_NO_FILE)
        out.fd = out.missing; /* the last item: the failed call's fd, or this */
    int64_t all[9] = {rc, out.op, out.err, out.t_gathered, out.t_committed, out.t_forced,
                      out.t_waked, out.fsync_ns, out.fd};
    int64_t timed[7] = {rc, out.op, out.err, out.t_forced, out.t_waked, out.fsync_ns, out.fd};
    return int_tuple(round ? all : timed, round ? 9 : 7);
}

/* sync_round(ctl, pool, seg_index, seg_fds, lock_fd, offset_fd, want_seq, gather_ns
 * [, io_hook]) -> (code, op, errno, t_gathered, t_committed, t_forced, t_waked, fsync_ns,
 * fd of the failed call).
 * io_hook: None (the system calls) or the seam's hook (seam_ask). */
PyObject *mqs_py_sync_round(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return flush_step(args, n, 1);
}

/* flush_step(ctl, seg_index, seg_fds, offset_fd, least_pages[, io_hook])
 * -> (code, op, errno, t_forced, t_waked, fsync_ns, fd of the failed call): the timed
 * flush (mqs_flush). */
PyObject *mqs_py_flush_step(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return flush_step(args, n, 0);
}

/* live_hold(fd, pid) (check 0) and live_check(fd, pid) (check 1): mqs_live.c. */
static PyObject *live(PyObject *const *args, Py_ssize_t n, int check)
{
    int32_t fd;
    int64_t pid;
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, check ? "live_check(fd, pid) takes 2 arguments"
                                               : "live_hold(fd, pid) takes 2 arguments");
        return NULL;
    }
    if (mqs_arg_i32(args[0], "fd", &fd) < 0 || mqs_arg_i64(args[1], "pid", &pid) < 0)
        return NULL;
    /* hold: 0 or an errno; check: 1 held, 0 free, or -errno */
    int rc = check ? mqs_live_check(fd, pid) : -mqs_live_hold(fd, pid);
    if (rc < 0) {
        errno = -rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return check ? PyBool_FromLong(rc) : Py_NewRef(Py_None);
}

PyObject *mqs_py_live_hold(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return live(args, n, 0);
}

PyObject *mqs_py_live_check(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return live(args, n, 1);
}

/* fetch_or(buf, offset, bits) and fetch_and_not(buf, offset, bits): one atomic
 * read-modify-write of the int64 word at `offset` of `buf`, the word before it returned.
 * The store's flags word is changed by several processes at once (the fence's
 * fetch_or in mqs_append.c, the supervisor, any worker marking READ_ONLY): a Python
 * load then store lost a bit another process set in between. SEQ_CST, as the fence's
 * fetch_or: every change of the word falls in one total order with the fence and the
 * put's SEQ_CST load of it (mqs_append.c), and it is a full barrier, so nothing this
 * process loads after it (the supervisor's look at the reservation after REFUSE_WRITES)
 * can be read before it. On x86-64 ACQ_REL would be the same lock-prefixed
 * instruction: the stronger order costs nothing. */
static PyObject *word_bits(PyObject *const *args, Py_ssize_t n, int on)
{
    const char *usage = on ? "fetch_or(buf, offset, bits)" : "fetch_and_not(buf, offset, bits)";
    int64_t off, bits;
    if (n != 3) {
        PyErr_Format(PyExc_TypeError, "%s takes 3 arguments", usage);
        return NULL;
    }
    if (mqs_arg_i64(args[1], "offset", &off) < 0 || mqs_arg_i64(args[2], "bits", &bits) < 0)
        return NULL;
    Py_buffer v;
    if (mqs_arg_wbuffer(args[0], "buf", &v) < 0)
        return NULL;
    if (off < 0 || off > (int64_t)v.len - 8) {
        PyErr_Format(PyExc_ValueError,
                     "%s: the 8 bytes at offset %lld are not inside buf (%zd bytes)", usage,
                     (long long)off, v.len);
        PyBuffer_Release(&v);
        return NULL;
    }
    if (((uintptr_t)v.buf + (uintptr_t)off) % 8 != 0) {
        PyErr_Format(PyExc_ValueError, "%s: buf + offset %lld is not 8-byte aligned", usage,
                     (long long)off);
        PyBuffer_Release(&v);
        return NULL;
    }
    int64_t *word = (int64_t *)(void *)((uint8_t *)v.buf + off);
    int64_t was = on ? __atomic_fetch_or(word, bits, __ATOMIC_SEQ_CST)
                     : __atomic_fetch_and(word, ~bits, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&v);
    return PyLong_FromLongLong(was);
}

PyObject *mqs_py_fetch_or(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return word_bits(args, n, 1);
}

PyObject *mqs_py_fetch_and_not(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    return word_bits(args, n, 0);
}
