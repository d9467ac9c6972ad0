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

**A failed fsync** sets READ_ONLY in the control block and wakes every waiter: they
answer FLUSH_DISK_FAILED, and producers are refused from then on. The flusher never
fsyncs again, and exits FLUSH_FAILED when stopped. A restarted flusher sees READ_ONLY and
stays failed: restarting cannot make lost pages durable.
"""

from __future__ import annotations

import time
from typing import Final

from mqstore import _native
from mqstore.conf.settings import FlushDiskType
from mqstore.engine.fileio import StoreIOError
from mqstore.ipc import control as c
from mqstore.ipc.commit import LogFiles
from mqstore.workers.base import ExitCode, WorkerContext, say

SPIN_S: Final = 0.0001
SPIN_MAX_S: Final = 0.005
IDLE_SYNC_S: Final = 0.05


def main(ctx: WorkerContext) -> int:
    cb = ctx.cb
    ctl = cb.buf
    files = LogFiles(ctx.store_dir, cb, ctx.settings.store_host)
    failed = bool(cb.flags & c.FLAG_READ_ONLY)
    last_flush = last_thorough = time.monotonic()
    spin = SPIN_S

    def fail(e: StoreIOError) -> None:
        nonlocal failed
        failed = True
        cb.set_flag(c.FLAG_READ_ONLY)
        cb.add(c.OFF_FLUSH_FAILURES, 1)
        _native.flushed_wake_all(ctl)  # every waiter sees READ_ONLY: FLUSH_DISK_FAILED
        say("flusher", f"fsync failed, store is now read-only: {e}", "ERROR")

    def flush(least: int) -> None:
        """`files.flush`, then wake every sync waiter; when it fsynced, its duration and
        the slots it covered into the control block's histograms (the metrics' fsync
        latency and group commits)."""
        n0, ns0, m0 = cb.get(c.OFF_FSYNC_COUNT), cb.get(c.OFF_FSYNC_NS), cb.get(c.OFF_FSYNC_MSGS)
        files.flush(least)
        if cb.get(c.OFF_FSYNC_COUNT) == n0:
            return
        _native.flushed_wake_all(ctl)
        us = (cb.get(c.OFF_FSYNC_NS) - ns0) // 1000
        b = c.bucket_of(us, c.FSYNC_HIST_SHIFT, c.FSYNC_HIST_BUCKETS)
        cb.add(c.OFF_FSYNC_HIST + 8 * b, 1)
        b = c.bucket_of(cb.get(c.OFF_FSYNC_MSGS) - m0, 0, c.GROUP_HIST_BUCKETS)
        cb.add(c.OFF_GROUP_HIST + 8 * b, 1)

    def requested() -> bool:
        return _native.sync_request(ctl) > cb.get(c.OFF_FLUSHED)

    try:
        while not ctx.stopping:
            ctx.beat()
            s = ctx.settings
            sync = s.flush_disk_type is FlushDiskType.SYNC_FLUSH
            if failed:
                ctx.wait(IDLE_SYNC_S)
                continue
            if sync and requested():
                woken = True
            else:
                timeout = s.flush_interval_ms / 1000
                if sync:
                    timeout = min(IDLE_SYNC_S, timeout)
                t0 = time.monotonic()
                woken = _native.flusher_sleep(ctl, int(timeout * 1e9))
                woken = woken or time.monotonic() - t0 < timeout * 0.9  # the committer
            now = time.monotonic()
            try:
                if sync and requested():
                    before = cb.get(c.OFF_FLUSHED)
                    if cb.get(c.OFF_COMMITTED) < _native.sync_request(ctl):
                        files.commit(0)
                    flush(0)
                    last_flush = now
                    if cb.get(c.OFF_FLUSHED) == before and requested():
                        # Not published yet (a producer ahead is still copying): poll,
                        # backing off while nothing moves.
                        ctx.wait(spin)
                        spin = min(spin * 2, SPIN_MAX_S)
                    else:
                        spin = SPIN_S
                    continue
                interval_due = now - last_flush >= s.flush_interval_ms / 1000
                if not (interval_due or (woken and not s.flush_timed)):
                    continue
                last_flush = now
                least = s.flush_least_pages
                if now - last_thorough >= s.flush_thorough_interval_ms / 1000:
                    least = 0
                    last_thorough = now
                if sync:
                    files.commit(0)
                    least = 0
                flush(least)
            except StoreIOError as e:
                fail(e)
        # Drain: everything committed goes to disk, every waiter gets its answer.
        if not failed:
            for _ in range(3):
                try:
                    files.commit(0)
                    flush(0)
                    break
                except StoreIOError as e:
                    fail(e)
        _native.flushed_wake_all(ctl)  # the rest were not published in time: they time out
        return ExitCode.FLUSH_FAILED if failed else ExitCode.OK
    finally:
        files.close()
