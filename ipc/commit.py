"""Publish, commit and flush over the control block: the steps the workers run.

`LogFiles` is one process's view of the commit-log files (a `Segment` per file it
touched, opened lazily). Three steps, each with one owner of the position it moves:

* `publish()`: advance `published_pos` over contiguous DONE reservation slots (the
  producers do it themselves as they finish: this is the backstop). A slot
  RESERVED by a process that is gone (its liveness byte is free: `ipc.reservation`)
  gets a filler (`engine.filler`) and counts as DONE, so a producer killed mid-put never
  stalls the log. Called inside `commit()`.
* `commit(least_pages)`: under the commit lock, publish, then copy the pool buffers'
  `[committed, published)` into the files with pwrite (pool on; in `COMMIT_STEP`
  steps, `committed` moved after each, the seq/time stamp once at the end) or just
  move `committed` (pool off: producers wrote into the files' mappings). Never past
  `published`. Run by the committer, and by the flusher on demand under SYNC_FLUSH.
* `flush(least_pages)`: force `[flushed, committed)` with fdatasync, then move
  `flushed_pos` and rewrite `<store>/flushed_offset`. Flusher only (supervisor at drain).
  Raises StoreIOError, after which the caller marks the store read-only.
  `flush_and_wake` also wakes the sync waiters the flush covered (`wake_mask`) and
  counts it in the control block's fsync histograms.

The flush step is C, without the GIL (`ipc/native/mqs_round.c`), and only C in
production: `flush`/`flush_and_wake` (ASYNC_FLUSH's interval flush, the SYNC_FLUSH
flusher's timed flush, the supervisor's drain) are `_native.flush_step`, and the
flusher's SYNC_FLUSH round (gather, commit, flush, wake) is `_native.sync_round`. Either
call is given the files of the segment holding `flushed_pos` and the ones after it
(opened once here and kept, up to ROUND_SEGS): a range across segment boundaries is
forced file by file, in order, and `flushed_pos` moves once, after the last fdatasync
returned; a range past the files given (more than ROUND_SEGS) takes another call. While a
fault or a sync watch is set their I/O calls go through `engine.fileio`'s seams
(`fileio.native_seam`), so the fault and power-loss suites test the step that runs.
`flush_py`, `flush_and_wake_py` and `sync_round_py` are their Python references, run by
the differential tests only (`tests/native/test_sync_round_diff.py`). What stays Python
is the commit step of the committer (`commit()`, with its fills of dead producers'
reservations, `publish()`): the C round commits what is published and leaves the fills
to it.

Least-pages rules are RocketMQ's: whole 4 KiB pages between the two positions, or a
segment boundary crossed, or `least_pages <= 0` for anything new.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Final

from mqstore import _native
from mqstore.engine import fileio, storedir
from mqstore.engine.filler import INTERNAL_TOPIC, write_filler
from mqstore.engine.segment import OS_PAGE_SIZE, Segment, segment_file_name
from mqstore.ipc import control as c
from mqstore.ipc.commit_pace import CommitPace
from mqstore.ipc.control_views import (
    FlushStats,
    Histograms,
    Positions,
    Reservation,
    flushed_pos,
)
from mqstore.ipc.locks import COMMIT_LOCK, FileLock
from mqstore.ipc.reservation import LiveTable

# The pool's bytes go to the files in steps of about this many bytes, the committed
# position moving after each: readers (the dispatcher follows `committed`) and the
# producers' backlog bound (busy once `committed` stands still for the busy timeout) see
# the copy progress every step, not once per segment's range (up to 64 MiB, ~120 ms at
# 550 MB/s). A step ends on a record boundary, the first at or past COMMIT_STEP bytes
# (`_native.record_step` follows the published records' TOTALSIZEs, a load per record):
# everything that reads up to `committed` (the dispatcher's scan, the flushed position
# and `flushed_offset` after it) needs it to lie between records. A step's loop turn and
# control-block store cost nothing measurable; the walk, a dependent load per record,
# ~20 ns per 1 KiB record (+8 % on the copy's 0.25 ms/MB CPU): so a range of up to twice
# the step (a busy committer's tick, the steady state) goes in one step without a walk.
COMMIT_STEP: Final = 1 << 20
DEAD_CHECK_AFTER_S: Final = 0.02  # a slot must be stuck this long before its pid is checked
ROUND_FORCED: Final = 0  # _native.sync_round's and flush_step's codes (mqs_round.h)
ROUND_MORE: Final = 2  # forced up to the end of the files given: again, with the next ones
ROUND_FAILED: Final = 3
ROUND_NO_FILE: Final = 4  # nothing forced: a segment to write or force had no file given
ROUND_OPS: Final = ("", "flock", "pwrite", "fdatasync", "pwrite")  # by the op it returns
ROUND_OP_CHECK: Final = 5  # published past reserved (EUCLEAN): the commit's own check
ROUND_SEGS: Final = 8  # segment files one C call takes (MQS_ROUND_SEGS)
WAKE_ANY: Final = 0xFFFF_FFFF
WAKE_SHIFT: Final = 12  # futex wake buckets of 4 KiB of log (ipc/native/mqs_futex.h)

# (t_gathered, t_committed, t_forced, t_waked) of a sync round, CLOCK_MONOTONIC ns
RoundTimes = tuple[int, int, int, int]


def wait_bits(end: int) -> int:
    """The futex bit a sync waiter for flushed_pos >= `end` sleeps with (`mqs_wait_bits`'
    twin): the bit of end's 2^WAKE_SHIFT-byte bucket, modulo 32."""
    return WAKE_ANY if end <= 0 else 1 << ((end >> WAKE_SHIFT) & 31)


def wake_mask(from_pos: int, to_pos: int) -> int:
    """The futex bits of the sync waiters a flush from `from_pos` to `to_pos` covered:
    those of the ends in (from_pos, to_pos] (`mqs_wake_mask`'s twin); every bit for 32
    buckets or more, or for an empty range."""
    first, last = (from_pos + 1) >> WAKE_SHIFT, to_pos >> WAKE_SHIFT
    if to_pos <= from_pos or from_pos < 0 or last - first >= 31:
        return WAKE_ANY
    mask = 0
    for b in range(first, last + 1):
        mask |= 1 << (b & 31)
    return mask


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie. For processes this one started (the
    supervisor's workers, tests); producers are judged by `ipc.reservation.LiveTable`,
    which a reused pid cannot fool."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")
    except (OSError, ValueError):
        return True


def _pages_between(a: int, b: int) -> int:
    return b // OS_PAGE_SIZE - a // OS_PAGE_SIZE


class LogFiles:
    """One process's handles on the commit-log files, for commit and flush."""

    def __init__(self, store_dir: str, cb: c.ControlBlock, store_host: str) -> None:
        self.store_dir = store_dir
        self.log_dir = os.path.join(store_dir, "commitlog")
        self.cb = cb
        self.pos = Positions(cb)
        self.store_host = store_host
        self.size = cb.segment_size
        self.pool = cb.pool_buffers > 0
        self._segs: dict[int, Segment] = {}
        self._commit_lock = FileLock(os.path.join(store_dir, COMMIT_LOCK))
        self._stuck: tuple[int, float] = (-1, 0.0)
        self._flushed_fd = -1
        self._flushed_path = os.path.join(store_dir, storedir.FLUSHED_OFFSET_FILE)
        self._fds: dict[int, tuple[int, str]] = {}  # segment index: (fd, path), the C step's
        self._fds_at = -1  # the `first` of the last `_seg_fds`, and its answer
        self._fds_tuple: tuple[int, ...] = ()
        self._live = LiveTable(store_dir)
        # The committer's (`ipc.commit_pace`): notes each pool commit step's bytes and time.
        self.pace: CommitPace | None = None

    def segment(self, index: int) -> Segment:
        seg = self._segs.get(index)
        if seg is None:
            path = os.path.join(self.log_dir, segment_file_name(index * self.size))
            s = self.size
            seg = Segment(path, s)
            seg.adopt_positions(s, s, 0)
            self._segs[index] = seg
            for old in [i for i in self._segs if i < index - 2]:
                self._segs.pop(old).close()
        return seg

    def target(self, index: int) -> memoryview:
        """Where the bytes of segment `index` are written: its pool buffer or mapping."""
        if self.pool:
            return self.cb.pool_view(index)
        return memoryview(self.segment(index).target)

    def close(self) -> None:
        for seg in self._segs.values():
            seg.close()
        self._segs.clear()
        self._commit_lock.close()
        self._live.close()
        if self._flushed_fd >= 0:
            fileio.close(self._flushed_fd)
            self._flushed_fd = -1
        for fd, _path in self._fds.values():
            fileio.close(fd)
        self._fds.clear()
        self._fds_at, self._fds_tuple = -1, ()

    # --- publish ----------------------------------------------------------------------

    def _dead(self, seq: int, pid: int) -> bool:
        now = time.monotonic()
        if self._stuck[0] != seq:
            self._stuck = (seq, now)
            return False
        return now - self._stuck[1] >= DEAD_CHECK_AFTER_S and not self._live.alive(pid)

    def publish_locked(self, *, force: bool = False) -> int:
        """`publish()` under the commit lock."""
        self._commit_lock.acquire()
        try:
            return self.publish(force=force)
        finally:
            self._commit_lock.release()

    def publish(self, *, force: bool = False) -> int:
        """Advance `published_pos` over DONE slots (`_native.publish`, the producers' own
        lock-free step), filling the reservation that stops it when its producer is gone;
        return the slots this call advanced. Caller holds the commit lock (fills are
        the committer's alone). `force` (supervisor's last drain, the block fenced,
        producers given time) fills every reservation not DONE: none of them was
        acknowledged. Nothing at or past the fence's seq is published."""
        cb, pos = self.cb, self.pos
        advanced = _native.publish(cb.buf)
        while True:
            ps = pos.published_seq
            fence = _native.fence_seq(cb.buf)
            if ps >= (pos.seq if fence < 0 else min(pos.seq, fence)):
                return advanced
            off, _qo, _sts, _size, pid, _qslot, state = cb.slot(ps)
            st = state & c.STATE_MASK
            if st != c.STATE_DONE:
                dead = st == c.STATE_RESERVED and self._dead(ps, pid)
                if not (st in (c.STATE_ABANDONED, c.STATE_FILLING) or dead or force):
                    return advanced
                if not dead and st == c.STATE_RESERVED:  # its producer may wake and write
                    Reservation(cb).mark_stale(off)
                self._fill_claimed(ps)
            moved = _native.publish(cb.buf)
            if moved == 0:
                return advanced
            advanced += moved

    def _fill_claimed(self, seq: int) -> None:
        """Claim the reservation at `seq` with its joined slots (C `mqs_claim`: its
        producer's completion fails from now on), write a filler into each, mark them
        DONE together. Nothing when its producer completed first."""
        cb = self.cb
        n = _native.claim(cb.buf, seq)
        for s in range(seq, seq + max(n, 0)):
            off, qo, sts, size, _pid, qslot, _state = cb.slot(s)
            self._fill(off, size, qslot, qo, sts)
            Reservation(cb).count_filler()
        if n > 0:
            _native.fill_done(cb.buf, seq, n)

    def _fill(self, off: int, size: int, qslot: int, qo: int, sts: int) -> None:
        index = off // self.size
        buf = self.target(index)
        try:
            if qslot == -1:  # the BLANK that ends a segment
                write_filler(buf, off - index * self.size, size, None, 0, 0, off, sts)
            elif qslot < 0:  # a record that takes no queue offset (prepared, rollback)
                write_filler(
                    buf,
                    off - index * self.size,
                    size,
                    INTERNAL_TOPIC,
                    0,
                    0,
                    off,
                    sts,
                    self.store_host,
                )
            else:
                topic, qid, _next = self.cb.qrow(qslot)
                write_filler(
                    buf, off - index * self.size, size, topic, qid, qo, off, sts, self.store_host
                )
        finally:
            buf.release()

    # --- commit -------------------------------------------------------------------------

    def commit(self, least_pages: int = 0) -> int:
        """Publish, then commit up to `published_pos`; return bytes committed."""
        self._commit_lock.acquire()
        try:
            return self._commit_locked(least_pages)
        finally:
            self._commit_lock.release()

    def _commit_locked(self, least_pages: int) -> int:
        cb, pos = self.cb, self.pos
        self.publish()
        # In this order: the seq before the position (a publisher moves the position
        # first), so every seq below `pseq` is committed once `pub` is.
        pseq, ts = pos.published_seq, pos.published_ts
        pub, com = pos.published, pos.committed
        if pub <= com:
            return 0
        if pub > pos.reserved:  # never commit bytes nobody reserved (a scribbled block)
            raise fileio.StoreIOError(
                "commit",
                cb.ctl_name,
                OSError(
                    errno.EUCLEAN,
                    f"the control block was overwritten: published {pub} is past reserved "
                    f"{pos.reserved}",
                ),
            )
        size = self.size
        if (
            least_pages > 0
            and _pages_between(com, pub) < least_pages
            and pub // size == com // size
        ):
            return 0
        start = com
        if self.pool:
            # steps are timed only while the drain bound is on (`commit_backlog_drain_ms`)
            pace = self.pace if self.pace is not None and self.pace.drain_ms > 0 else None
            while com < pub:
                index = com // size
                base, seg_end = index * size, min(pub, (index + 1) * size)
                seg, view = self.segment(index), cb.pool_view(index)
                try:
                    while com < seg_end:  # COMMIT_STEP: why steps, and where they end
                        t0 = time.monotonic_ns() if pace is not None else 0
                        end = seg_end
                        if seg_end - com > 2 * COMMIT_STEP:
                            end = base + _native.record_step(
                                view, com - base, seg_end - base, com - base + COMMIT_STEP
                            )
                            if end <= com:  # no size to follow (never for published bytes)
                                end = seg_end
                        seg.commit_range(view, com - base, end - base)
                        if pace is not None:
                            pace.note(end - com, time.monotonic_ns() - t0)
                        com = end
                        pos.advance_committed(com)
                finally:
                    view.release()
        else:
            com = pub
            pos.advance_committed(com)
        pos.stamp_committed(ts, pseq)
        return com - start

    # --- flush: the C step (production) ------------------------------------------------

    def flush(self, least_pages: int = 0) -> int:
        """Force `[flushed, committed)` under the least-pages rule; return bytes flushed.
        Flusher only (supervisor at drain). In C without the GIL (`_native.flush_step`):
        fdatasync of each file in order, then the fsync statistics and histograms,
        `flushed_pos`, `<store>/flushed_offset` and the wake of the waiters it covered
        (`flush_and_wake`). Raises StoreIOError."""
        before = self.pos.flushed
        self.flush_and_wake(least_pages)
        return self.pos.flushed - before

    def flush_and_wake(self, least_pages: int = 0) -> tuple[int, int] | None:
        """`flush`, and its (t_forced, t_waked), or None when it forced nothing. Its
        Python reference is `flush_and_wake_py`. Raises StoreIOError."""
        buf, times, n = self.cb.buf, None, 0
        while True:
            index = flushed_pos(buf) // self.size
            fds = self._seg_fds(index, n)
            code, op, err, t_forced, t_waked, _ns, fd = _native.flush_step(
                buf, index, fds, self._offset_file()[0], least_pages, self._step_seam(fds)
            )
            if code == ROUND_FORCED:
                return t_forced, t_waked
            if code == ROUND_MORE:
                times = t_forced, t_waked
            elif code != ROUND_NO_FILE or n == ROUND_SEGS:
                self._step_ended(code, op, err, fd, index)
                return times
            n = ROUND_SEGS  # the next files, or a fresh look for a missing one

    def _step_ended(self, code: int, op: int, err: int, fd: int, index: int) -> None:
        """After a C step that forced nothing more: nothing (ROUND_IDLE), or raise its
        StoreIOError: a call failed (ROUND_FAILED: call `op` on descriptor `fd` with
        errno `err`), or segment `index + fd` holds bytes to commit or force and has no
        file, looked for just now (ROUND_NO_FILE: ENOENT, as opening it would)."""
        if code == ROUND_FAILED:
            self._step_failed(op, err, fd)
        if code == ROUND_NO_FILE:
            path = os.path.join(self.log_dir, segment_file_name((index + fd) * self.size))
            gone = OSError(errno.ENOENT, os.strerror(errno.ENOENT))
            raise fileio.StoreIOError("open", path, gone)

    def _offset_file(self) -> tuple[int, str]:
        if self._flushed_fd < 0:
            self._flushed_fd = fileio.open_file(self._flushed_path, create=True, mode=0o600)
        return self._flushed_fd, self._flushed_path

    def write_flushed_offset(self, offset: int) -> None:
        """Rewrite `<store>/flushed_offset` in place (the Spark reader's limit)."""
        fd, path = self._offset_file()
        storedir.write_flushed_offset(fd, offset, path)

    def _seg_fds(self, first: int, n: int) -> tuple[int, ...]:
        """The descriptors of segments `first`, `first + 1`, ... for the C step: as many
        as the allocator made (`allocated`, at least 2), or `n`; at most ROUND_SEGS; -1
        for a file that is not there (and every one after it). Opened once and kept
        while the flushed position has not passed them; the tuple itself is kept while
        `first` stays (n 0). Raises StoreIOError."""
        if n == 0 and first == self._fds_at:
            return self._fds_tuple
        if n == 0:
            made = (self.pos.allocated - 1) // self.size - first + 1
            n = min(max(made, 2), ROUND_SEGS)
        fds = self._fds
        for old in [i for i in fds if i < first]:
            fileio.close(fds.pop(old)[0])
        out = []
        for index in range(first, first + n):
            got = fds.get(index)
            if got is None:
                path = os.path.join(self.log_dir, segment_file_name(index * self.size))
                try:
                    got = fds[index] = (fileio.open_file(path, create=False), path)
                except fileio.StoreIOError as e:
                    if e.errno != errno.ENOENT:
                        raise
                    break
            out.append(got[0])
        self._fds_at, self._fds_tuple = first, tuple(out) + (-1,) * (n - len(out))
        return self._fds_tuple

    def _step_seam(self, fds: tuple[int, ...]) -> Callable[[int, int], int] | None:
        """The C step's I/O seam while a fault or a sync watch is set (its calls then
        see them as this module's do, `fileio.native_seam`), else None: system calls."""
        if fileio.seams_quiet("pwrite", "fdatasync"):
            return None
        offset_fd, offset_path = self._offset_file()
        paths = {fd: path for fd, path in self._fds.values() if fd in fds}
        return fileio.native_seam({**paths, offset_fd: offset_path})

    def _step_failed(self, op: int, err: int, fd: int) -> None:
        """Raise the StoreIOError of a C step whose call `op` on `fd` failed with `err`."""
        if op == ROUND_OP_CHECK:
            pos = self.pos
            raise fileio.StoreIOError(
                "commit",
                self.cb.ctl_name,
                OSError(
                    errno.EUCLEAN,
                    f"the control block was overwritten: published {pos.published} is past "
                    f"reserved {pos.reserved}",
                ),
            )
        paths = {f: path for f, path in self._fds.values()}
        paths[self._offset_file()[0]] = self._offset_file()[1]
        paths[self._commit_lock.fd] = self._commit_lock.path
        path = paths.get(fd, self.log_dir)
        raise fileio.StoreIOError(ROUND_OPS[op], path, OSError(err, os.strerror(err)))

    # --- flush: the Python reference (tests only) ---------------------------------------

    def flush_py(self, least_pages: int = 0) -> int:
        """`flush` in Python, the reference the C step is tested against (never run in
        production): force `[flushed, committed)`; return bytes flushed. Raises
        StoreIOError."""
        pos = self.pos
        ts = pos.committed_ts
        cseq = pos.committed_seq
        com = pos.committed
        fl = pos.flushed
        if com <= fl:
            return 0
        size = self.size
        if least_pages > 0 and _pages_between(fl, com) < least_pages and com // size == fl // size:
            return 0
        t0 = time.perf_counter_ns()
        at = fl
        while at < com:
            index = at // size
            end = min(com, (index + 1) * size)
            self.segment(index).flush_to(end - index * size, wrote_through_pwrite=self.pool)
            at = end
        ns = time.perf_counter_ns() - t0
        FlushStats(self.cb).record_fsync(ns, max(cseq - pos.flushed_seq, 0))
        pos.advance_flushed(com, ts, cseq)
        self.write_flushed_offset(com)
        return com - fl

    def flush_and_wake_py(self, least_pages: int = 0) -> tuple[int, int] | None:
        """`flush_and_wake` in Python (the reference): `flush_py`, then, when it forced,
        wake the sync waiters it may cover and count the fsync's duration and messages
        in the control block's histograms. (forced, waiters woken) times, or None."""
        cb, stats = self.cb, FlushStats(self.cb)
        n0, ns0 = stats.fsyncs, stats.fsync_ns
        m0, fl0 = stats.fsync_slots, self.pos.flushed
        self.flush_py(least_pages)
        if stats.fsyncs == n0:
            return None
        t_forced = time.monotonic_ns()
        _native.flushed_wake(cb.buf, fl0)
        t_waked = time.monotonic_ns()
        Histograms(cb).count_fsync((stats.fsync_ns - ns0) // 1000, stats.fsync_slots - m0)
        return t_forced, t_waked

    # --- the flusher's SYNC_FLUSH round ----------------------------------------------------

    def sync_round(self, want_seq: int, gather_ns: int) -> RoundTimes | None:
        """Gather (until published_seq reaches `want_seq`, at most `gather_ns`), commit up
        to the sync request, flush and wake: one C call without the GIL
        (`_native.sync_round`), again with more files when the range runs past the ones
        given (segment boundaries). Its times, or None when it forced nothing. Raises
        StoreIOError."""
        cb, pool = self.cb, self.cb.pool_buf if self.pool else None
        buf, times, n = cb.buf, None, 0
        while True:
            index = flushed_pos(buf) // self.size
            fds = self._seg_fds(index, n)
            code, op, err, *t = _native.sync_round(
                buf, pool, index, fds, self._commit_lock.fd, self._offset_file()[0],
                want_seq, gather_ns, self._step_seam(fds),
            )  # fmt: skip
            if times is not None:
                t[0] = times[0]  # the first call's gather
            if code == ROUND_FORCED:
                return t[0], t[1], t[2], t[3]
            if code == ROUND_MORE:
                times = t[0], t[1], t[2], t[3]
            elif code != ROUND_NO_FILE or n == ROUND_SEGS:
                self._step_ended(code, op, err, t[5], index)
                return times
            n, want_seq = ROUND_SEGS, 0  # the next files, or a fresh look for a missing one

    def sync_round_py(self, want_seq: int, gather_ns: int) -> RoundTimes | None:
        """`sync_round` in Python (`_native.sync_round`'s reference, never run in
        production): the gather, `commit(0)` when the request is beyond the committed
        position, `flush_and_wake_py(0)`."""
        cb = self.cb
        if want_seq > 0 and self.pos.published_seq < want_seq:
            _native.flusher_gather(cb.buf, want_seq, gather_ns)
        t_gathered = time.monotonic_ns()
        if self.pos.committed < _native.sync_request(cb.buf):
            self.commit(0)
        t_committed = time.monotonic_ns()
        woke = self.flush_and_wake_py(0)
        return None if woke is None else (t_gathered, t_committed, *woke)
