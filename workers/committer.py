"""The committer process: RocketMQ's CommitRealTimeService over the shared pool.

Each tick (every `commit_interval_ms`, or at once when producers are about to run out
of pool buffers): publish the finished reservations, then commit with
`commit_least_pages`, or with 0 once `commit_thorough_interval_ms` has passed since the
last thorough commit. After a commit that moved data it wakes the flusher if it sleeps
(a futex word in the control block, `mqstore._native.flusher_wake`). A pool buffer
is free again as soon as its segment is fully committed (producers check that).
Drain on stop: commit everything published, bounded in time.
"""

from __future__ import annotations

import time
from typing import Final

from mqstore import _native
from mqstore.ipc import control as c
from mqstore.ipc.commit import LogFiles
from mqstore.workers.base import ExitCode, WorkerContext

POLL_S: Final = 0.002
DRAIN_S: Final = 2.0


def main(ctx: WorkerContext) -> int:
    cb = ctx.cb
    files = LogFiles(ctx.store_dir, cb, ctx.settings.store_host)
    size = cb.segment_size
    last = last_thorough = time.monotonic()
    try:
        while not ctx.stopping:
            ctx.beat()
            ctx.wait(POLL_S)
            s = ctx.settings
            now = time.monotonic()
            pressure = cb.pool_buffers > 0 and (
                cb.get(c.OFF_RESERVED) // size - cb.get(c.OFF_COMMITTED) // size
                >= cb.pool_buffers - 1
            )
            if now - last_thorough >= s.commit_thorough_interval_ms / 1000:
                least = 0
                last_thorough = now
            elif pressure or now - last >= s.commit_interval_ms / 1000:
                least = s.commit_least_pages
            else:
                files.publish_locked()
                continue
            last = now
            if files.commit(0 if pressure else least):
                _native.flusher_wake(cb.buf)
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            files.commit(0)
            if cb.get(c.OFF_PUBLISHED) >= cb.get(c.OFF_RESERVED):
                break
            time.sleep(0.005)
        return ExitCode.OK
    finally:
        files.close()
