"""The flusher process: group commit under SYNC_FLUSH, RocketMQ's flush rules under ASYNC.

**SYNC_FLUSH** (RocketMQ's GroupCommitService, with the pool on too), over the control
block, without sockets (`ipc/native/mqs_futex.c`): a sync producer records the end it waits
for in `sync_request` (the furthest one wins) and wakes the flusher if it sleeps; the
flusher commits on demand (publish + pwrite of the pool, under the commit lock), forces
once, publishes the new `flushed_pos`, and wakes every waiter with one FUTEX_WAKE. Each
waiter decides from `flushed_pos` alone: nothing another process sends can acknowledge a
put. Whoever arrives during an fsync is served by the next one (group commit). A
request not yet covered after a flush (another producer is still copying before it)
keeps the flusher polling, backing off from SPIN_S to SPIN_MAX_S while nothing moves.
Waiters enforce `syncFlushTimeout` themselves (FLUSH_DISK_TIMEOUT).

**ASYNC_FLUSH** (FlushRealTimeService): every `flush_interval_ms` (sleep when
`flush_timed`, else also woken by the committer), flush with `flush_least_pages`, or 0
once `flush_thorough_interval_ms` has passed.

**A failed fsync** (or the commit it does under SYNC_FLUSH) fails the store closed
(`workers.service`): READ_ONLY in the control block, every waiter woken (they answer
FLUSH_DISK_FAILED), producers refused from then on, and the flusher exits FLUSH_FAILED,
which the supervisor does not restart: an fsync retried after a failure may succeed
over pages the kernel already dropped. A flusher that starts on a store already
read-only never fsyncs.
"""

from __future__ import annotations

import time
from typing import Final

from mqstore import _native
from mqstore.conf.settings import FlushDiskType
from mqstore.engine.fileio import StoreIOError
from mqstore.ipc import control as c
from mqstore.ipc.commit import LogFiles
from mqstore.workers.base import ExitCode, WorkerContext
from mqstore.workers.service import Service, run

SPIN_S: Final = 0.0001
SPIN_MAX_S: Final = 0.005
IDLE_SYNC_S: Final = 0.05


class Flusher(Service):
    name = "flusher"
    failed_exit = ExitCode.FLUSH_FAILED

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.files = LogFiles(ctx.store_dir, ctx.cb, ctx.settings.store_host)
        self.idle = bool(ctx.cb.flags & c.FLAG_READ_ONLY)
        self.last_flush = self.last_thorough = time.monotonic()
        self.spin = SPIN_S
        self.spinning = False  # the next wait is a poll for a producer still copying
        self.woken = False  # the last wait ended early: the committer moved something

    @property
    def sync(self) -> bool:
        return self.ctx.settings.flush_disk_type is FlushDiskType.SYNC_FLUSH

    def requested(self) -> bool:
        return _native.sync_request(self.ctx.cb.buf) > self.ctx.cb.get(c.OFF_FLUSHED)

    def wait(self, seconds: float) -> None:
        """Sleep on the flusher's futex (woken by the committer or a sync producer); a
        request already waiting, or a spin between polls, skips it."""
        if self.idle or self.spinning:
            self.ctx.wait(seconds)
            return
        if self.sync and self.requested():
            self.woken = True
            return
        t0 = time.monotonic()
        woken = _native.flusher_sleep(self.ctx.cb.buf, int(seconds * 1e9))
        self.woken = woken or time.monotonic() - t0 < seconds * 0.9  # the committer

    def tick(self) -> float:
        s = self.ctx.settings
        woken, self.woken, self.spinning = self.woken, False, False
        if self.idle:
            return IDLE_SYNC_S
        timeout = s.flush_interval_ms / 1000
        if self.sync:
            timeout = min(IDLE_SYNC_S, timeout)
        now = time.monotonic()
        if self.sync and self.requested():
            return self._serve_sync_request(now)
        interval_due = now - self.last_flush >= s.flush_interval_ms / 1000
        if not (interval_due or (woken and not s.flush_timed)):
            return timeout
        self.last_flush = now
        least = s.flush_least_pages
        if now - self.last_thorough >= s.flush_thorough_interval_ms / 1000:
            least = 0
            self.last_thorough = now
        if self.sync:
            self.files.commit(0)
            least = 0
        self.flush(least)
        return timeout

    def _serve_sync_request(self, now: float) -> float:
        """Commit and force up to the furthest request; the wait before the next tick
        (0 when served, a growing spin while a producer ahead is still copying)."""
        cb = self.ctx.cb
        before = cb.get(c.OFF_FLUSHED)
        if cb.get(c.OFF_COMMITTED) < _native.sync_request(cb.buf):
            self.files.commit(0)
        self.flush(0)
        self.last_flush = now
        if cb.get(c.OFF_FLUSHED) == before and self.requested():
            # Not published yet (a producer ahead is still copying): poll, backing off
            # while nothing moves.
            spin, self.spinning = self.spin, True
            self.spin = min(spin * 2, SPIN_MAX_S)
            return spin
        self.spin = SPIN_S
        return 0.0

    def flush(self, least: int) -> None:
        """`files.flush`, then wake every sync waiter; when it fsynced, its duration and
        the slots it covered into the control block's histograms (the metrics' fsync
        latency and group commits)."""
        cb = self.ctx.cb
        n0, ns0, m0 = cb.get(c.OFF_FSYNC_COUNT), cb.get(c.OFF_FSYNC_NS), cb.get(c.OFF_FSYNC_MSGS)
        self.files.flush(least)
        if cb.get(c.OFF_FSYNC_COUNT) == n0:
            return
        _native.flushed_wake_all(cb.buf)
        us = (cb.get(c.OFF_FSYNC_NS) - ns0) // 1000
        b = c.bucket_of(us, c.FSYNC_HIST_SHIFT, c.FSYNC_HIST_BUCKETS)
        cb.add(c.OFF_FSYNC_HIST + 8 * b, 1)
        b = c.bucket_of(cb.get(c.OFF_FSYNC_MSGS) - m0, 0, c.GROUP_HIST_BUCKETS)
        cb.add(c.OFF_GROUP_HIST + 8 * b, 1)

    def drain_step(self) -> bool:
        """Everything committed goes to disk, every waiter gets its answer (the rest
        were not published in time: they time out)."""
        if not self.idle:
            self.files.commit(0)
            self.flush(0)
        _native.flushed_wake_all(self.ctx.cb.buf)
        return True

    def on_io_error(self, e: StoreIOError) -> None:
        cb = self.ctx.cb
        cb.set_flag(c.FLAG_READ_ONLY)  # before the wake: every waiter sees it
        cb.add(c.OFF_FLUSH_FAILURES, 1)
        _native.flushed_wake_all(cb.buf)

    def close(self) -> None:
        self.files.close()


def main(ctx: WorkerContext) -> int:
    return run(ctx, Flusher(ctx))
