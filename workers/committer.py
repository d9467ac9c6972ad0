"""The committer process: RocketMQ's CommitRealTimeService over the shared pool.

Each tick (every POLL_S while puts arrive, backing off to IDLE_POLL_S, IDLE_POLL_SYNC_S
under SYNC_FLUSH, while none do, then asleep on the idle futex until the next publish, at
most IDLE_SLEEP_S): publish the finished reservations, then commit. When puts
arrived since the last tick (RocketMQ's put path wakes CommitRealTimeService after every
put) with `commit_least_pages`; at the first tick without new puts, whatever is left
(the stream paused: nothing is coming to batch it with); with 0 once
`commit_thorough_interval_ms` has passed since the last thorough commit, or when
producers are about to run out of pool buffers. So the files, and with them the
dispatcher (which reads what is committed under ASYNC_FLUSH), trail the puts by a tick,
not by `commit_interval_ms`: at 400k puts/s a 200 ms interval left 80 MB to commit, then
to dispatch, after the last put (`../shared/perf/dispatch_lag.py`: 0.6-1.9 s).
After a commit that moved data it wakes the flusher if it sleeps (a futex word in the
control block, `mqstore._native.flusher_wake`), at most once per `commit_interval_ms`:
the flusher's fsyncs keep the pace they had when the committer ran at that interval
(an ASYNC_FLUSH flusher flushes when woken). Each pool commit step is timed
(`ipc.commit_pace`): the committer publishes the bytes it commits in
`commit_backlog_drain_ms` at its recent pace, and producers wait at a backlog that large,
so readers trail a slowed committer by about that long. A pool buffer is free again as
soon as its segment is fully committed (producers check that).
Drain on stop: fence the generation if the supervisor did not (it died: `ipc.fence`, so
no put completes after this drain unseen), then commit everything below the fence,
bounded in time; orphaned, fill what is left unfinished below the fence and commit the
rest. A failed pwrite fails the store closed (`workers.service`).
"""

from __future__ import annotations

import os
import time
from typing import Final

from mqstore import _native
from mqstore.conf.settings import FlushDiskType
from mqstore.ipc.commit import LogFiles
from mqstore.ipc.commit_pace import CommitPace
from mqstore.ipc.control_views import Positions
from mqstore.ipc.fence import fence
from mqstore.workers.base import WorkerContext
from mqstore.workers.service import Service, run

POLL_S: Final = 0.002
# A tick that found nothing to publish or commit doubles the wait up to these (back to
# POLL_S at the next arrival): an idle store's committer woke 500 times a second. Under
# ASYNC_FLUSH the readers' limit follows the commit, so the first put after a pause is
# readable at most IDLE_POLL_S later (the dispatcher's own idle wait is as long); under
# SYNC_FLUSH a sync put's round commits it in the flusher, so the committer only bounds
# what the flush interval also bounds.
IDLE_POLL_S: Final = 0.008
IDLE_POLL_SYNC_S: Final = 0.05
# Once the back-off has reached its longest wait with nothing new, the committer sleeps
# on the control block's idle futex until the next publish wakes it (`_native.idle_sleep`;
# the first publish after it said it sleeps does, so a busy log pays no wake-up per put),
# at most IDLE_SLEEP_S: an idle store's committer woke 125 times a second polling.
IDLE_SLEEP_S: Final = 0.1


class Committer(Service):
    name = "committer"

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.files = LogFiles(ctx.store_dir, ctx.cb, ctx.settings.store_host)
        self.pos = Positions(ctx.cb)
        self.pace = self.files.pace = CommitPace(self.pos, ctx.settings.commit_backlog_drain_ms)
        self.last_thorough = self.last_wake = time.monotonic()
        self.seen = self.pos.committed  # the published position the last tick found
        self.fence_seq = -1
        self.idle_wait = POLL_S
        self.sleep_idle = False  # the next wait sleeps until a publish (or its timeout)

    def _pressure(self) -> bool:
        """Producers are about to run out of pool buffers: commit now, whole pages or not."""
        cb = self.ctx.cb
        size = cb.segment_size
        return cb.pool_buffers > 0 and (
            self.pos.reserved // size - self.pos.committed // size >= cb.pool_buffers - 1
        )

    def wait(self, seconds: float) -> None:
        if self.sleep_idle:
            self.sleep_idle = False
            _native.idle_sleep(self.ctx.cb.buf, self.seen, int(seconds * 1e9))
            return
        self.ctx.wait(seconds)

    def tick(self) -> float:
        s = self.ctx.settings
        self.pace.set_drain_ms(s.commit_backlog_drain_ms)
        now = time.monotonic()
        pressure = self._pressure()
        pub = self.pos.published
        arrived, self.seen = pub > self.seen, pub
        # (a thorough commit of nothing is no tick's reason: an idle committer sleeps on)
        quiet = not (arrived or pressure or pub > self.pos.committed)
        if not quiet and now - self.last_thorough >= s.commit_thorough_interval_ms / 1000:
            least = 0
            self.last_thorough = now
        elif arrived and not pressure:
            least = s.commit_least_pages
        elif pressure or pub > self.pos.committed:
            least = 0  # a quiet tick: the rest
        else:
            self.files.publish_locked()
            wait, sync = self.idle_wait, s.flush_disk_type is FlushDiskType.SYNC_FLUSH
            longest = IDLE_POLL_SYNC_S if sync else IDLE_POLL_S
            if wait >= longest:
                self.sleep_idle = True  # quiet for a while: sleep until the log grows
                return IDLE_SLEEP_S
            self.idle_wait = min(wait * 2, longest)
            return wait
        self.idle_wait = POLL_S
        if self.files.commit(least) and now - self.last_wake >= s.commit_interval_ms / 1000:
            self.last_wake = now
            _native.flusher_wake(self.ctx.cb.buf)
        return POLL_S

    def finish(self) -> None:
        """Orphaned (the supervisor died, nobody drains after us): fill what producers
        left unfinished below the fence (none of it acknowledged; their puts fail) and
        commit the complete puts behind it, which were acknowledged under ASYNC_FLUSH."""
        if os.getppid() != self.ctx.parent_pid and self.pos.published_seq < self.fence_seq:
            self.files.publish_locked(force=True)
            self.files.commit(0)

    def drain_step(self) -> bool:
        if self.fence_seq < 0:  # the stopping supervisor fenced already: its seq
            self.fence_seq = fence(self.ctx.cb)
        self.files.commit(0)
        return self.pos.published_seq >= self.fence_seq

    def close(self) -> None:
        self.files.close()


def main(ctx: WorkerContext) -> int:
    return run(ctx, Committer(ctx))
