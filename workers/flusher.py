"""The flusher process: group commit under SYNC_FLUSH, RocketMQ's flush rules under ASYNC.

**SYNC_FLUSH** (RocketMQ's GroupCommitService, with the pool on too), over the control
block, without sockets (`ipc/native/mqs_futex.c`): a sync producer records the end it waits
for in `sync_request` (the furthest one wins) and wakes the flusher if it sleeps; the
flusher commits on demand (publish + pwrite of the pool, under the commit lock), forces
once, publishes the new `flushed_pos`, and wakes the waiters that flush may cover with
one FUTEX_WAKE_BITSET (a waiter sleeps on the bit of its end's 4 KiB bucket of log;
`ipc.commit.wake_mask`). Each waiter decides from `flushed_pos` alone: nothing another process sends
can acknowledge a put. The whole round (gather, commit, force, publish, statistics,
wake) is one C call without the GIL, `LogFiles.sync_round` (`ipc/native/mqs_round.c`),
a segment boundary included (a fill for a dead producer is the committer's); a fault or
sync watch set reaches its I/O calls too (`fileio.native_seam`).
Whoever arrives during an fsync is served by the next one (group commit). A request not
yet covered after a flush (another producer is still copying before it) keeps the
flusher polling: first yielding the CPU to it
(POLL_NS), then backing off from SPIN_S to SPIN_MAX_S while nothing moves. Waiters
enforce `syncFlushTimeout` themselves (FLUSH_DISK_TIMEOUT).

Three measured choices keep the rounds full (`bench/results/profile_sync.txt`):

* **Gather.** The waiters one round wakes come back with their next puts within
  microseconds of each other, not at once. Forcing as soon as the first is back covers
  it alone and leaves the rest to the next fsync, so two half groups alternate. Before
  forcing, the flusher waits until as many messages are published and not yet flushed
  as the last round covered, at most GATHER_FRACTION of a recent fsync (and
  GATHER_MAX_NS): the round's first step (`mqs_flusher_gather`), woken only by the
  producer whose publish completes the group. A put is never answered sooner than
  before: it only waits for its round's start up to that bound.
* **Poll before sleeping.** After a round, the flusher yields the CPU for up to POLL_NS
  looking for the next request before it sleeps on its futex: a lone sync producer is
  back within tens of microseconds, and finding its request saves the futex wake-up
  and the flusher's trip through the run queue.
* **Yield to a producer still copying** rather than sleep at once (above).

**Real-time, on request** (`flusher_rt_priority`, off by default): SCHED_FIFO, so a woken
round never waits for a CPU behind producers (as SCHED_OTHER it did in 40-52 % of a
16-producer run, nice -10 and a 100 µs slice notwithstanding). A real-time task's yield
gives no CPU to them, so it then skips both polls and sleeps (`bench/results/sync16_cpu.md`).

**What a round costs** (16 producers in the sync checks' shape, `perf record -g` of this
process, `bench/results/profile_sync_flusher.txt`): about 90-140 µs of CPU, of which the
fdatasync's own kernel work is ~40% (ext4 write-back, two virtio kicks that exit to the
host, two sleeps), the wake of the waiters ~15-25% (~2 µs each), the pool's pwrite ~10%,
the gather's futex sleep ~5%, the yields of the polls ~2%, and the Python around the C
round 12-22%. A plain append + fdatasync costs 40-105 µs of CPU here (`bench.sync_bound`),
so the round is amortized only by its group: at ~8 messages a round, 12-17 µs per put.
The Python of a served round stays small on purpose: tick's first branch, control words
read by `control_views`' plain readers rather than the views' descriptors (2.4 -> 1.0 µs
a round, hot).

**ASYNC_FLUSH** (FlushRealTimeService): every `flush_interval_ms` (sleep when
`flush_timed`, else also woken by the committer), flush with `flush_least_pages`, or 0
once `flush_thorough_interval_ms` has passed. That timed flush (and the SYNC_FLUSH
flusher's) is C too, `LogFiles.flush_and_wake` (`_native.flush_step`): no Python code
forces the log in production.

**A failed fsync** (or the commit it does under SYNC_FLUSH) fails the store closed
(`workers.service`): READ_ONLY in the control block, every waiter woken (they answer
FLUSH_DISK_FAILED), producers refused from then on, and the flusher exits FLUSH_FAILED,
which the supervisor does not restart: an fsync retried after a failure may succeed
over pages the kernel already dropped. A flusher that starts on a store already
read-only never fsyncs.

**Tracing** (`bench/profile_sync.py`): with `MQSTORE_FLUSH_TRACE=<path>` in the
supervisor's environment, the flusher keeps one row of CLOCK_MONOTONIC timestamps per
sync round (slept, woken, served, gathered, committed, forced, waiters woken; messages
and bytes covered, polls before it; the fdatasync's own ns), at most TRACE_MAX_ROWS,
and writes them to `<path>` as JSON lines when it closes. Off by default.
"""

from __future__ import annotations

import json
import os
import time
from typing import Final

from mqstore import _native
from mqstore.conf.settings import FlushDiskType
from mqstore.engine.fileio import StoreIOError
from mqstore.ipc import control as c
from mqstore.ipc.commit import LogFiles
from mqstore.ipc.control_views import (
    Flags,
    FlushStats,
    Positions,
    flushed_and_published_seq,
    flushed_pos,
    fsync_totals,
)
from mqstore.workers import priority
from mqstore.workers.base import ExitCode, WorkerContext, say
from mqstore.workers.service import Service, run

SPIN_S: Final = 0.0001
GATHER_FRACTION: Final = 0.5  # of the recent fsync time, at most GATHER_MAX_NS
GATHER_MAX_NS: Final = 1_000_000
POLL_NS: Final = 100_000  # after a sync round: look for the next request before sleeping
SPIN_MAX_S: Final = 0.005
IDLE_SYNC_S: Final = 0.05
TRACE_ENV: Final = "MQSTORE_FLUSH_TRACE"
TRACE_MAX_ROWS: Final = 1_000_000  # a profiling run's worth; later rounds are not kept


class Flusher(Service):
    name = "flusher"
    failed_exit = ExitCode.FLUSH_FAILED

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.files = LogFiles(ctx.store_dir, ctx.cb, ctx.settings.store_host)
        self.pos, self.stats = Positions(ctx.cb), FlushStats(ctx.cb)
        self.idle = bool(Flags(ctx.cb).word & c.FLAG_READ_ONLY)
        self.last_flush = self.last_thorough = time.monotonic()
        self.spin = SPIN_S
        self.spinning = False  # the next wait is a poll for a producer still copying
        self.woken = False  # the last wait ended early: the committer moved something
        self.trace_path = os.environ.get(TRACE_ENV) or None
        self.trace: list[tuple[int, ...]] = []
        self.group = 0  # messages the last sync round covered
        self.fsync_ns = 0  # recent fdatasync time (moving average)
        self.spins = 0  # polls since the last round for a producer still copying
        self.poll_next = False  # the last tick served a sync round: poll before sleeping
        self._slept = (0, 0)  # (went to sleep, woke) of the last futex sleep, ns
        self.serving = self.sync and not self.idle  # sync rounds take tick's first path
        # Real-time (`flusher_rt_priority`): woken, it runs at once; a yield would keep
        # the CPU from the producers it polls for, so it sleeps instead.
        if self.serving:
            for line in priority.apply_rt(ctx.settings.flusher_rt_priority):
                say(ctx.name, line)
        self.rt = os.sched_getscheduler(0) in (os.SCHED_FIFO, os.SCHED_RR)

    @property
    def sync(self) -> bool:
        return self.ctx.settings.flush_disk_type is FlushDiskType.SYNC_FLUSH

    def requested(self) -> bool:
        buf = self.ctx.cb.buf
        return bool(_native.sync_request(buf) > flushed_pos(buf))

    def wait(self, seconds: float) -> None:
        """Sleep on the flusher's futex (woken by the committer or a sync producer); a
        request already waiting, or a spin between polls, skips it."""
        if self.idle or self.spinning:
            self.ctx.wait(seconds)
            return
        if self.sync and self.requested():
            self.woken = True
            return
        if self.sync and self.poll_next and not self.rt:
            # A producer just served is likely back within microseconds: see its next
            # request without a futex sleep and wake-up (two context switches).
            self.poll_next = False
            deadline = time.monotonic_ns() + POLL_NS
            while time.monotonic_ns() < deadline:
                os.sched_yield()
                if self.requested():
                    self.woken = True
                    return
        t0 = time.monotonic_ns()
        woken = _native.flusher_sleep(self.ctx.cb.buf, int(seconds * 1e9))
        t1 = time.monotonic_ns()
        if self.trace_path:
            self._slept = (t0, t1)
        self.woken = woken or t1 - t0 < seconds * 0.9e9  # the committer

    def tick(self) -> float:
        if self.serving and self.requested():
            # The sync round's own path first: it runs once per round, back to back
            # under load, and every microsecond of Python here is taken from producers.
            self.woken = self.spinning = False
            return self._serve_sync_request(time.monotonic())
        s = self.ctx.settings
        woken, self.woken, self.spinning = self.woken, False, False
        if self.idle:
            return IDLE_SYNC_S
        timeout = s.flush_interval_ms / 1000
        if self.sync:
            timeout = min(IDLE_SYNC_S, timeout)
        # A request that lands after the first look is not looked for again here:
        # `wait` looks before it sleeps, and `flusher_sleep` after it says it sleeps
        # (test_flusher_tick.py).
        now = time.monotonic()
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
        """Gather, commit and force up to the furthest request, wake its waiters: one C
        call when it can (`LogFiles.sync_round`); the wait before the next tick (0 when
        served, a growing spin while a producer ahead is still copying)."""
        t0 = time.monotonic_ns()
        buf = self.ctx.cb.buf
        before = flushed_pos(buf)
        m0, ns0 = fsync_totals(buf)
        times = self.files.sync_round(*self._gather_target())
        self.last_flush = now
        if times is None and self.requested():
            # Not published yet (a producer ahead is still copying, or preempted while
            # it copies): yield the CPU to it for a moment, then poll, backing off while
            # nothing moves.
            self.spins += 1
            if self.spin == SPIN_S and not self.rt and self._yield_until_published(before):
                return 0.0
            spin, self.spinning = self.spin, True
            self.spin = min(spin * 2, SPIN_MAX_S)
            return spin
        m1, ns1 = fsync_totals(buf)
        msgs = self.group = m1 - m0
        fsync_ns = ns1 - ns0
        self._note_fsync(fsync_ns)
        if times and self.trace_path and len(self.trace) < TRACE_MAX_ROWS:
            slept, self._slept = self._slept, (0, 0)
            flushed = flushed_pos(buf)
            row = (*slept, t0, *times, msgs, flushed - before, self.spins, fsync_ns)
            self.trace.append(row)
        self.spins = 0
        self.spin = SPIN_S
        self.poll_next = True
        return 0.0

    def _yield_until_published(self, flushed: int) -> bool:
        """Yield the CPU (to the producer still copying, if it waits for one) until the
        published position passes `flushed`, at most POLL_NS; True if it did."""
        cb = self.ctx.cb
        deadline = time.monotonic_ns() + POLL_NS
        while time.monotonic_ns() < deadline:
            os.sched_yield()
            if _native.publish(cb.buf) or self.pos.published > flushed:
                return True
        return False

    def _gather_target(self) -> tuple[int, int]:
        """Group commit's other half: the last round woke `group` waiters, who are on
        their way back with their next puts. While fewer than that are published and
        not flushed, the round sleeps until the producer whose publish completes the
        group wakes the flusher, at most GATHER_FRACTION of a recent fsync: one force
        for all of them instead of two. (published_seq to wait for, at most ns), or
        (0, 0): no gather."""
        want = self.group
        if want <= 1:
            return 0, 0
        buf = self.ctx.cb.buf
        flushed_seq, published_seq = flushed_and_published_seq(buf)
        target = flushed_seq + want
        if published_seq >= target:
            return 0, 0
        return target, min(int(self.fsync_ns * GATHER_FRACTION), GATHER_MAX_NS)

    def _note_fsync(self, ns: int) -> None:
        if ns > 0:
            self.fsync_ns = (self.fsync_ns * 7 + ns) // 8

    def flush(self, least: int) -> None:
        """`files.flush_and_wake`: force, wake the sync waiters it covered, count it."""
        ns0 = self.stats.fsync_ns
        self.files.flush_and_wake(least)
        self._note_fsync(self.stats.fsync_ns - ns0)

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
        Flags(cb).mark_read_only()  # before the wake: every waiter sees it
        self.stats.count_flush_failure()
        _native.flushed_wake_all(cb.buf)

    def close(self) -> None:
        self.files.close()
        if self.trace_path and self.trace:
            keys = (
                "slept", "woke", "served", "gathered", "committed", "forced", "waked", "msgs",
                "bytes", "spins", "fsync_ns",
            )  # fmt: skip
            with open(self.trace_path, "w") as f:
                for row in self.trace:
                    f.write(json.dumps(dict(zip(keys, row, strict=True))) + "\n")


def main(ctx: WorkerContext) -> int:
    return run(ctx, Flusher(ctx))
