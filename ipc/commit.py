"""Publish, commit and flush over the control block: the steps the workers run.

`LogFiles` is one process's view of the commit-log files (a `Segment` per file it
touched, opened lazily). Three steps, each with one owner of the position it moves:

* `publish()`: advance `published_pos` over contiguous DONE reservation slots (the
  producers do it themselves as they finish: this is the backstop). A slot
  RESERVED by a process that is gone (its liveness byte is free: `ipc.reservation`)
  gets a filler (`engine.filler`) and counts as DONE, so a producer killed mid-put never
  stalls the log. Called inside `commit()`.
* `commit(least_pages)`: under the commit lock, publish, then copy the pool buffers'
  `[committed, published)` into the files with pwrite (pool on) or just move
  `committed` (pool off: producers wrote into the files' mappings). Never past
  `published`. Run by the committer, and by the flusher on demand under SYNC_FLUSH.
* `flush(least_pages)`: force `[flushed, committed)` with fdatasync, then move
  `flushed_pos` and rewrite `<store>/flushed_offset`. Flusher only (supervisor at drain).
  Raises StoreIOError, after which the caller marks the store read-only.

Least-pages rules are RocketMQ's: whole 4 KiB pages between the two positions, or a
segment boundary crossed, or `least_pages <= 0` for anything new.
"""

from __future__ import annotations

import os
import time
from typing import Final

from mqstore import _native
from mqstore.engine import fileio, storedir
from mqstore.engine.filler import INTERNAL_TOPIC, write_filler
from mqstore.engine.segment import OS_PAGE_SIZE, Segment, segment_file_name
from mqstore.ipc import control as c
from mqstore.ipc.locks import COMMIT_LOCK, FileLock
from mqstore.ipc.reservation import LiveTable

DEAD_CHECK_AFTER_S: Final = 0.02  # a slot must be stuck this long before its pid is checked


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
        self.store_host = store_host
        self.size = cb.segment_size
        self.pool = cb.pool_buffers > 0
        self._segs: dict[int, Segment] = {}
        self._commit_lock = FileLock(os.path.join(store_dir, COMMIT_LOCK))
        self._stuck: tuple[int, float] = (-1, 0.0)
        self._flushed_fd = -1
        self._live = LiveTable(store_dir)

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
        lock-free step), filling the slot that stops it when its producer is gone;
        return the slots this call advanced. Caller holds the commit lock (fills are
        the committer's alone). `force` (supervisor's last drain, writes refused,
        producers given time) fills every RESERVED slot: none of them was acknowledged."""
        cb = self.cb
        advanced = _native.publish(cb.buf)
        while True:
            ps = cb.get(c.OFF_PUBLISHED_SEQ)
            if ps >= cb.get(c.OFF_SEQ):
                return advanced
            off, qo, sts, size, pid, qslot, state = cb.slot(ps)
            if state != c.STATE_DONE:
                abandoned = state == c.STATE_ABANDONED
                if not (
                    abandoned or (state == c.STATE_RESERVED and (force or self._dead(ps, pid)))
                ):
                    return advanced
                self._fill(off, size, qslot, qo, sts)
                cb.set_slot_state(ps, c.STATE_DONE)
                cb.add(c.OFF_FILLERS, 1)
            advanced += _native.publish(cb.buf)

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
        cb = self.cb
        self.publish()
        pub = cb.get(c.OFF_PUBLISHED)
        com = cb.get(c.OFF_COMMITTED)
        if pub <= com:
            return 0
        size = self.size
        if (
            least_pages > 0
            and _pages_between(com, pub) < least_pages
            and pub // size == com // size
        ):
            return 0
        ts = cb.get(c.OFF_PUBLISHED_TS)
        pseq = cb.get(c.OFF_PUBLISHED_SEQ)
        start = com
        if self.pool:
            while com < pub:
                index = com // size
                end = min(pub, (index + 1) * size)
                view = cb.pool_view(index)
                try:
                    self.segment(index).commit_range(view, com - index * size, end - index * size)
                finally:
                    view.release()
                com = end
                cb.set(c.OFF_COMMITTED, com)
        else:
            com = pub
            cb.set(c.OFF_COMMITTED, com)
        cb.set(c.OFF_COMMITTED_TS, ts)
        cb.set(c.OFF_COMMITTED_SEQ, pseq)
        return com - start

    # --- flush --------------------------------------------------------------------------

    def flush(self, least_pages: int = 0) -> int:
        """Force `[flushed, committed)`; return bytes flushed. Raises StoreIOError."""
        cb = self.cb
        ts = cb.get(c.OFF_COMMITTED_TS)
        cseq = cb.get(c.OFF_COMMITTED_SEQ)
        com = cb.get(c.OFF_COMMITTED)
        fl = cb.get(c.OFF_FLUSHED)
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
        cb.add(c.OFF_FSYNC_NS, time.perf_counter_ns() - t0)
        cb.add(c.OFF_FSYNC_COUNT, 1)
        cb.add(c.OFF_FSYNC_MSGS, max(cseq - cb.get(c.OFF_FLUSHED_SEQ), 0))
        cb.set(c.OFF_FLUSHED_SEQ, cseq)
        cb.set(c.OFF_FLUSHED_TS, ts)
        cb.set(c.OFF_FLUSHED, com)
        self.write_flushed_offset(com)
        return com - fl

    def write_flushed_offset(self, offset: int) -> None:
        """Rewrite `<store>/flushed_offset` in place (the Spark reader's limit)."""
        path = os.path.join(self.store_dir, storedir.FLUSHED_OFFSET_FILE)
        if self._flushed_fd < 0:
            self._flushed_fd = fileio.open_file(path, create=True, mode=0o600)
        storedir.write_flushed_offset(self._flushed_fd, offset, path)
