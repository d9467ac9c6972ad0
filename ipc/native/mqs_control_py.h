/* The Python doors of the control block's helpers for the supervisor, the flusher and
 * the committer (mqs_control_py.c): publish, the sync acknowledgements' futexes
 * (mqs_futex.c), the flusher's round (mqs_round.c), the reservation fence and the
 * liveness bytes (mqs_live.c), the atomic bit changes of a shared word. Arguments checked here; waits run without the GIL. */
#ifndef MQS_CONTROL_PY_H
#define MQS_CONTROL_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* METH_O: the control block. */
PyObject *mqs_py_init_control(PyObject *m, PyObject *arg);
PyObject *mqs_py_publish(PyObject *m, PyObject *arg);
PyObject *mqs_py_flushed_wake_all(PyObject *m, PyObject *arg);
PyObject *mqs_py_flusher_wake(PyObject *m, PyObject *arg);
PyObject *mqs_py_idle_wake(PyObject *m, PyObject *arg);
PyObject *mqs_py_sync_request(PyObject *m, PyObject *arg);
PyObject *mqs_py_fence(PyObject *m, PyObject *arg);
PyObject *mqs_py_fence_seq(PyObject *m, PyObject *arg);
/* METH_FASTCALL. */
PyObject *mqs_py_flushed_wake(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_wake_mask(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_wait_bits(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_sync_round(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_flush_step(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_flusher_sleep(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_flusher_gather(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_idle_sleep(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_wait_flushed_past(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_reserve_fence(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_live_hold(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_live_check(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_claim(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_fill_done(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_fetch_or(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *mqs_py_fetch_and_not(PyObject *m, PyObject *const *args, Py_ssize_t n);

/* The table entries: a METH_O door and a METH_FASTCALL door named `name`. */
#define MQS_ONE(name, doc) {#name, mqs_py_##name, METH_O, doc}
#define MQS_FAST(name, doc) {#name, (PyCFunction)(void (*)(void))mqs_py_##name, METH_FASTCALL, doc}

#define MQS_CONTROL_METHODS                                                                      \
    MQS_ONE(init_control, "init_control(ctl): supervisor, once: the robust "                     \
        "process-shared reservation mutex."),                                                    \
    MQS_ONE(publish, "publish(ctl) -> int: advance published_pos over "                          \
        "contiguous DONE slots (lock-free)."),                                                   \
    MQS_ONE(flushed_wake_all, "flushed_wake_all(ctl): flusher, after moving "                    \
        "flushed_pos: wake every sync waiter."),                                                 \
    MQS_FAST(flushed_wake, "flushed_wake(ctl, from_pos): flusher, after moving "                 \
        "flushed_pos from from_pos: wake the sync waiters it "                                   \
        "covered (wake_mask(from_pos, flushed_pos))."),                                          \
    MQS_FAST(wake_mask, "wake_mask(from_pos, to_pos) -> int: the futex bits of "                 \
        "waiters for ends in (from_pos, to_pos]."),                                              \
    MQS_FAST(wait_bits, "wait_bits(end) -> int: the futex bit a waiter for "                     \
        "`end` sleeps with."),                                                                   \
    MQS_FAST(sync_round, "sync_round(ctl, pool, seg_index, seg_fds, lock_fd, "                   \
        "offset_fd, want_seq, gather_ns[, io_hook]) -> (code, op, errno, "                       \
        "t_gathered, t_committed, t_forced, t_waked, "                                           \
        "fsync_ns, fd): the flusher's SYNC_FLUSH round, GIL "                                    \
        "released (ipc/native/mqs_round.h)."),                                                   \
    MQS_FAST(flush_step, "flush_step(ctl, seg_index, seg_fds, offset_fd, least_pages"            \
        "[, io_hook]) -> (code, op, errno, t_forced, t_waked, fsync_ns, fd): the "               \
        "flusher's timed flush, GIL released (ipc/native/mqs_round.h)."),                        \
    MQS_ONE(flusher_wake, "flusher_wake(ctl): wake the flusher if it sleeps."),                  \
    MQS_ONE(sync_request, "sync_request(ctl) -> int: the furthest end a sync "                   \
        "producer waits for."),                                                                  \
    MQS_FAST(flusher_sleep, "flusher_sleep(ctl, timeout_ns) -> bool: flusher: "                  \
        "sleep until a sync request is pending (True) or "                                       \
        "the timeout passes."),                                                                  \
    MQS_FAST(flusher_gather, "flusher_gather(ctl, want_seq, timeout_ns) -> "                     \
        "bool: flusher: sleep until published_seq reaches "                                      \
        "want_seq (True) or the timeout passes."),                                               \
    MQS_FAST(idle_sleep, "idle_sleep(ctl, pos, timeout_ns) -> bool: an idle "                   \
        "worker: sleep until published_pos passes pos (True) or the timeout passes."),          \
    MQS_ONE(idle_wake, "idle_wake(ctl): end the idle workers' sleeps (a publish does it)."),     \
    MQS_FAST(wait_flushed_past, "wait_flushed_past(ctl, pos, timeout_ns) -> bool: "             \
        "sleep until flushed_pos passes pos (True) or the timeout passes; asks no flush."),     \
    MQS_FAST(reserve_fence, "reserve_fence(ctl, timeout_ns) -> int: take and "                   \
        "release the reservation lock (0), so that no "                                          \
        "producer is inside the section; or a code (< 0)."),                                     \
    MQS_FAST(live_hold, "live_hold(fd, pid): hold the liveness byte of `pid` "                   \
        "through descriptor fd."),                                                               \
    MQS_FAST(live_check, "live_check(fd, pid) -> bool: whether a live producer "                 \
        "holds the byte of `pid`."),                                                             \
    MQS_ONE(fence, "fence(ctl) -> int: end the block's generation (FENCED, writes "              \
        "refused) and return the fence's seq (mqs_append.h: mqs_fence)."),                       \
    MQS_ONE(fence_seq, "fence_seq(ctl) -> int: the fence's seq, or -1 when not fenced."),        \
    MQS_FAST(claim, "claim(ctl, seq) -> int: the filler's claim of the reservation at "         \
        "seq: slots claimed, 0 when it completed first, -1 when seq is not reserved."),          \
    MQS_FAST(fill_done, "fill_done(ctl, seq, n): the filler's claimed slots DONE, the "          \
        "head last."),                                                                          \
    MQS_FAST(fetch_or, "fetch_or(buf, offset, bits) -> int: set `bits` in the int64 word at "    \
        "offset, atomically; the word before."),                                                \
    MQS_FAST(fetch_and_not, "fetch_and_not(buf, offset, bits) -> int: clear `bits` in the "     \
        "int64 word at offset, atomically; the word before."),

#endif
