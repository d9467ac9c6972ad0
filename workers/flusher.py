"""The flusher process: group commit under SYNC_FLUSH, RocketMQ's flush rules under ASYNC.

**SYNC_FLUSH** (RocketMQ's GroupCommitService, with the pool on too): requests arrive as
datagrams "answer when flushed up to X" (`ipc.channel`). Every wake-up takes all pending
requests as one batch, commits on demand (publish + pwrite of the pool, under the
commit lock), forces once, and answers every waiter whose offset is now flushed. A
waiter whose record is not yet published (another producer is still copying before it)
stays pending and the loop polls quickly. While fewer requests wait than the last batch
answered, the flusher gathers for up to GATHER_S (300 µs) before it forces: the producers
it just answered are re-sending, and one fsync can serve them all. Waiters enforce
`syncFlushTimeout` themselves (FLUSH_DISK_TIMEOUT); the flusher drops requests older
than that.

**ASYNC_FLUSH** (FlushRealTimeService): every `flush_interval_ms` (sleep when
`flush_timed`, else also woken by the committer), flush with `flush_least_pages`, or 0
once `flush_thorough_interval_ms` has passed.

**A failed fsync** sets READ_ONLY in the control block (producers are refused from then
on), answers every waiter FLUSH_DISK_FAILED, and the flusher never fsyncs again: it
keeps answering FLUSH_DISK_FAILED until stopped, then exits FLUSH_FAILED. A restarted
flusher sees READ_ONLY and stays failed: restarting cannot make lost pages durable.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Final

from mqstore.conf.settings import FlushDiskType
from mqstore.engine.fileio import StoreIOError
from mqstore.ipc import channel
from mqstore.ipc import control as c
from mqstore.ipc.commit import LogFiles
from mqstore.workers.base import ExitCode, WorkerContext, say

SPIN_S: Final = 0.0001
GATHER_S: Final = 0.0003  # at most this long, while fewer wait than the last batch held
IDLE_SYNC_S: Final = 0.05

Waiter = tuple[int, int, float, str]  # request id, end offset, arrival, reply address


def _answer(sock: socket.socket, waiters: list[Waiter], flushed: int, status: int) -> None:
    for rid, _end, _t, addr in waiters:
        with contextlib.suppress(OSError):  # the waiter is gone
            sock.sendto(channel.FLUSH_REP.pack(rid, flushed, status), addr)


def main(ctx: WorkerContext) -> int:
    cb = ctx.cb
    files = LogFiles(ctx.store_dir, cb, ctx.settings.store_host)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(channel.flusher_address(ctx.store_dir, cb.generation))
    except OSError as e:
        say("flusher", f"cannot bind its socket: {e}", "ERROR")
        files.close()
        return ExitCode.BOOT_ERROR
    sock.setblocking(False)
    fd = sock.fileno()
    failed = bool(cb.flags & c.FLAG_READ_ONLY)
    pending: list[Waiter] = []
    last_batch = 0
    last_flush = last_thorough = time.monotonic()

    def fail(e: StoreIOError) -> None:
        nonlocal failed
        failed = True
        cb.set_flag(c.FLAG_READ_ONLY)
        cb.add(c.OFF_FLUSH_FAILURES, 1)
        say("flusher", f"fsync failed, store is now read-only: {e}", "ERROR")

    def flush(least: int) -> None:
        """`files.flush`, and when it fsynced, its duration and the slots it covered into
        the control block's histograms (the metrics' fsync latency and group commits)."""
        n0, ns0, m0 = cb.get(c.OFF_FSYNC_COUNT), cb.get(c.OFF_FSYNC_NS), cb.get(c.OFF_FSYNC_MSGS)
        files.flush(least)
        if cb.get(c.OFF_FSYNC_COUNT) == n0:
            return
        us = (cb.get(c.OFF_FSYNC_NS) - ns0) // 1000
        b = c.bucket_of(us, c.FSYNC_HIST_SHIFT, c.FSYNC_HIST_BUCKETS)
        cb.add(c.OFF_FSYNC_HIST + 8 * b, 1)
        b = c.bucket_of(cb.get(c.OFF_FSYNC_MSGS) - m0, 0, c.GROUP_HIST_BUCKETS)
        cb.add(c.OFF_GROUP_HIST + 8 * b, 1)

    try:
        while not ctx.stopping:
            ctx.beat()
            s = ctx.settings
            sync = s.flush_disk_type is FlushDiskType.SYNC_FLUSH
            if pending and not failed:
                timeout = SPIN_S
            elif sync:
                timeout = min(IDLE_SYNC_S, s.flush_interval_ms / 1000)
            else:
                timeout = s.flush_interval_ms / 1000
            ready = ctx.wait(timeout, [fd])
            woken = False
            if ready:
                while True:
                    try:
                        data, addr = sock.recvfrom(64)
                    except BlockingIOError:
                        break
                    if len(data) != channel.FLUSH_REQ.size:
                        continue  # not a request of ours: ignored, never fatal
                    rid, end = channel.FLUSH_REQ.unpack_from(data)
                    if rid < 0:
                        woken = True
                    elif addr:
                        pending.append((rid, end, time.monotonic(), addr))
            now = time.monotonic()
            if failed:
                if pending:
                    _answer(sock, pending, cb.get(c.OFF_FLUSHED), channel.REPLY_FAILED)
                    pending.clear()
                continue
            try:
                if pending and len(pending) < last_batch and now - pending[0][2] < GATHER_S:
                    # The producers answered last time are probably re-sending right now:
                    # a moment's wait lets one fsync serve them all (group commit).
                    continue
                if pending:
                    target = max(w[1] for w in pending)
                    if cb.get(c.OFF_COMMITTED) < target:
                        files.commit(0)
                    flush(0)
                    last_flush = now
                    flushed = cb.get(c.OFF_FLUSHED)
                    done = [w for w in pending if w[1] <= flushed]
                    last_batch = len(done) if done else last_batch
                    if done:
                        _answer(sock, done, flushed, channel.REPLY_OK)
                        limit = now - s.sync_flush_timeout_ms / 1000
                        pending = [w for w in pending if w[1] > flushed and w[2] >= limit]
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
                _answer(sock, pending, cb.get(c.OFF_FLUSHED), channel.REPLY_FAILED)
                pending.clear()
        # Drain: everything committed goes to disk, every waiter gets its answer.
        if not failed:
            for _ in range(3):
                try:
                    files.commit(0)
                    flush(0)
                    break
                except StoreIOError as e:
                    fail(e)
        flushed = cb.get(c.OFF_FLUSHED)
        if failed:
            _answer(sock, pending, flushed, channel.REPLY_FAILED)
        else:  # the rest were not published in time: they time out, never succeed
            _answer(sock, [w for w in pending if w[1] <= flushed], flushed, channel.REPLY_OK)
        return ExitCode.FLUSH_FAILED if failed else ExitCode.OK
    finally:
        sock.close()
        files.close()
