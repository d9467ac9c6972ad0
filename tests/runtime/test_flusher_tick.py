"""A sync request the flusher's tick does not see is still served at once (issue 23).

`Flusher.tick` looks for a sync request once, first. A request that lands after that
look is found by `wait` before it sleeps, or by `flusher_sleep` (C), which says it sleeps
and then looks (Dekker's order against the producer, which records its request and then
wakes a sleeper). Here the request lands after tick's look, then after wait's too: the
flusher, told to wait 30 s, must serve it without sleeping, on a real control block and real
segment files (the flusher's own C round, fdatasync included)."""

from __future__ import annotations

import time

import pytest

from mqstore.conf.settings import FlushDiskType, StoreSettings
from mqstore.ipc import control as c
from mqstore.ipc.control_views import flushed_pos
from mqstore.workers.base import WorkerContext
from mqstore.workers.flusher import Flusher
from tests.native.test_sync_round_diff import publish, store

WAIT_S = 30.0  # what the flusher is told to wait: a missed request would strand it this long


class LateRequest(Flusher):
    """A flusher whose first `misses` looks for a request see none: the request lands
    right after each of them."""

    misses = 0

    def requested(self) -> bool:
        if self.misses > 0:
            self.misses -= 1
            return False
        return super().requested()


@pytest.mark.parametrize("misses", [1, 2])  # after tick's look; after wait's too
@pytest.mark.parametrize("pool", [True, False])
def test_a_request_landing_after_ticks_look_is_served_without_a_sleep(
    misses: int, pool: bool
) -> None:
    with store(pool) as (d, cb, _files):
        settings = StoreSettings().replace(
            flush_disk_type=FlushDiskType.SYNC_FLUSH, transient_store_pool_enable=pool
        )
        ctx = WorkerContext("flusher", 2, str(d), settings, cb)
        flusher = LateRequest(ctx)
        try:
            publish(d, cb, [300, 1200, 700], fill=7)
            want = cb.get(c.OFF_SYNC_REQUEST)
            assert flushed_pos(cb.buf) < want
            flusher.misses = misses
            t0 = time.monotonic()
            wait_s = flusher.tick()  # its look misses the request
            assert wait_s > 0 and flushed_pos(cb.buf) < want
            flusher.wait(WAIT_S)
            assert flusher.tick() == 0.0  # served
            took = time.monotonic() - t0
        finally:
            flusher.close()
        assert flusher.misses == 0
        assert flushed_pos(cb.buf) >= want
        assert took < WAIT_S / 3, f"the missed request waited {took:.1f} s"
