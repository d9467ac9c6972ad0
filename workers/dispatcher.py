"""The dispatcher process: RocketMQ's ReputMessageService and FlushConsumeQueueService.

It follows the commit log through a read-only view and feeds `engine.dispatch`: every
record below the limit gets its consume-queue unit and its index keys. The limit is the
flushed position under SYNC_FLUSH, so that nothing a crash can take back is ever
consumed (DESIGN §3); under ASYNC_FLUSH it is what is in the files: committed with the
write pool on, published (complete records written straight into the mapping) with it
off. Its position goes to the control block (`OFF_DISPATCHED`), where readers,
`mqstore status` and the cleaner's "never delete what is not dispatched" rule read it.

Loop, as every worker: beat, dispatch what is there (in bounded rounds, so the heartbeat
stays fresh under load), then wait: 1 ms while records keep coming (RocketMQ's reput
sleeps 1 ms), backing off to `IDLE_WAIT_S` when the log is quiet.

Consume-queue flush: every `flush_consume_queue_interval_ms` with
`flush_consume_queue_least_pages`, or thoroughly (0 pages) once
`flush_consume_queue_thorough_interval_ms` has passed; after a thorough flush the
checkpoint is written with the logics time of what those queues hold and the physic time
the flusher published (`OFF_FLUSHED_TS`), as RocketMQ's FlushConsumeQueueService does.
While the store runs, the dispatcher is the checkpoint's only writer; the supervisor
writes it again at shutdown, after the workers have stopped.

A full disk (ENOSPC or EDQUOT creating a consume-queue or index file) is waited out, not
failed closed: the round is retried from the same offset every `NO_SPACE_WAIT_S`, said
once when it starts and once when space is back (docs/durability.md, "A full disk").

Drain on stop: dispatch up to the limit, flush every queue and the index, write the
checkpoint.
"""

from __future__ import annotations

import time
from typing import Final

from mqstore.conf.settings import FlushDiskType
from mqstore.engine import topics
from mqstore.engine.checkpoint import StoreCheckpoint
from mqstore.engine.dispatch import Dispatcher, DispatchStop
from mqstore.engine.fileio import StoreIOError, is_no_space
from mqstore.engine.reader import Geometry
from mqstore.ipc import control as c
from mqstore.workers.base import Condition, ExitCode, WorkerContext

MAX_RECORDS_PER_ROUND: Final = 4096
BUSY_WAIT_S: Final = 0.001
IDLE_WAIT_S: Final = 0.008
DRAIN_S: Final = 2.0
NO_SPACE_WAIT_S: Final = 0.5  # between tries while a full disk holds dispatch up


class _Checkpoint:
    """The checkpoint as the dispatcher keeps it: in memory, flushed after thorough
    consume-queue flushes and at the end."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self.file = StoreCheckpoint.open_in(ctx.store_dir)

    def on_index_roll(self, end_timestamp: int) -> None:
        self.file.index_msg_timestamp = end_timestamp
        self.flush()

    def flush(self) -> None:
        physic = self._ctx.cb.get(c.OFF_FLUSHED_TS)
        if physic > self.file.physic_msg_timestamp:
            self.file.physic_msg_timestamp = physic
        self.file.flush()


def _limit(ctx: WorkerContext) -> int:
    return ctx.cb.readable_end(ctx.settings.flush_disk_type is FlushDiskType.SYNC_FLUSH)


class _TopicRegistry:
    """Topics are created on first put: each topic the consume queues gain is written
    to `config/topics.json` (`engine.topics.ensure_topic`) with the default queue count.
    The client refuses a queue id outside the topic's queues (`ipc.accepts`); a higher
    one found in an older store widens the new topic to cover it (up to
    `topics.MAX_QUEUE_NUMS`; past that the topic stays unregistered and this says so).
    Checked only when the queue count grew."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._seen_queues = -1
        self._known: set[str] = set()

    def update(self, disp: Dispatcher) -> None:
        if len(disp.queues) == self._seen_queues:
            return
        wanted: dict[str, int] = {}
        for cq in disp.queues:
            topic, queue_id = cq.key
            wanted[topic] = max(wanted.get(topic, 0), queue_id + 1)
        default = self._ctx.settings.default_topic_queue_nums
        try:
            for topic, n in wanted.items():
                if topic not in self._known:
                    topics.ensure_topic(self._ctx.store_dir, topic, max(default, n))
                    self._known.add(topic)
        except (StoreIOError, ValueError) as e:
            print(f"mqstore dispatcher: cannot register topics: {e}", flush=True)
            return  # retried when the queues grow again
        self._seen_queues = len(disp.queues)


def main(ctx: WorkerContext) -> int:
    """The worker: `WorkerSpec("dispatcher", "mqstore.workers.dispatcher:main")`."""
    cb = ctx.cb
    s = ctx.settings
    cp = _Checkpoint(ctx)
    try:
        disp = Dispatcher.open(
            ctx.store_dir,
            Geometry.of(ctx.store_dir, s),
            checkpoint=cp.file,
            index_enabled=s.message_index_enable,
            max_msgs_num_batch=s.max_msgs_num_batch,
            on_index_roll=cp.on_index_roll,
        )
    except (OSError, ValueError) as e:
        print(f"mqstore dispatcher: cannot open the consume queues or index: {e}", flush=True)
        cp.file.close()
        return ExitCode.BOOT_ERROR
    offset = max(disp.resume_offset(), 0)
    segment_size = disp.log.queue.segment_size_bytes
    disp.log.queue.release_before(offset)
    cb.set(c.OFF_DISPATCHED, offset)
    registry = _TopicRegistry(ctx)
    registry.update(disp)
    lag = cb.histogram(c.OFF_DISPATCH_LAG_HIST, c.DISPATCH_LAG_BUCKETS)  # never reset
    disp.lag_hist = lag
    disp.lag_sum_ms = cb.get(c.OFF_DISPATCH_LAG_SUM_MS)
    dispatched = 0
    wait = BUSY_WAIT_S
    last_flush = last_thorough = time.monotonic()

    def round_once() -> bool:
        """Dispatch one bounded round; True if it moved."""
        nonlocal offset, dispatched
        limit = _limit(ctx)
        if offset >= limit:
            return False
        res = disp.dispatch(offset, limit, max_records=MAX_RECORDS_PER_ROUND)
        if res.stop is DispatchStop.CORRUPT:
            # A record below committed that does not check out: never guess past it.
            print(f"mqstore dispatcher: stopped at {res.next_offset}: {res.reason}", flush=True)
        moved = res.next_offset > offset
        if res.next_offset // segment_size > offset // segment_size:
            # Segments wholly dispatched are not needed again: keep the mapped window small
            # so the dispatcher's memory does not grow with the log.
            disp.log.queue.release_before(res.next_offset)
        offset = res.next_offset
        dispatched += res.records
        if res.last_store_timestamp:
            cb.set(c.OFF_DISPATCHED_TS, res.last_store_timestamp)
        cb.set(c.OFF_DISPATCHED_RECORDS, dispatched)
        if res.records:
            for i, n in enumerate(lag):
                cb.set(c.OFF_DISPATCH_LAG_HIST + 8 * i, n)
            cb.set(c.OFF_DISPATCH_LAG_SUM_MS, disp.lag_sum_ms)
        cb.set(c.OFF_DISPATCHED, offset)
        registry.update(disp)
        return moved

    def flush_queues(thorough: bool) -> None:
        logics = cp.file.logics_msg_timestamp
        if thorough:
            disp.queues.flush_all()
            if disp.index is not None:
                disp.index.flush()
            cp.file.logics_msg_timestamp = logics
            cp.flush()
        else:
            disp.queues.flush(s.flush_consume_queue_least_pages)

    no_space = Condition("dispatcher")

    def round_or_wait_for_space() -> bool:
        """`round_once`, but a full disk (no room for a new consume-queue or index
        file) is waited out, not failed: said once, retried every `NO_SPACE_WAIT_S`
        from the same offset (units already written come back ALREADY_BUILT)."""
        try:
            moved = round_once()
        except StoreIOError as e:
            if not is_no_space(e):
                raise
            no_space.report(
                f"{e.op} {e.path}",
                f"dispatch waits at {offset} for space on the disk: {e}",
            )
            return False
        if moved:
            no_space.clear(f"space is back: dispatching again from {offset}")
        return moved

    try:
        while not ctx.stopping:
            ctx.beat()
            moved = round_or_wait_for_space()
            now = time.monotonic()
            s = ctx.settings
            if now - last_thorough >= s.flush_consume_queue_thorough_interval_ms / 1000:
                flush_queues(thorough=True)
                last_thorough = last_flush = now
            elif now - last_flush >= s.flush_consume_queue_interval_ms / 1000:
                flush_queues(thorough=False)
                last_flush = now
            if moved:
                wait = BUSY_WAIT_S
                continue
            ctx.wait(NO_SPACE_WAIT_S if no_space.key else wait)
            wait = min(wait * 2, IDLE_WAIT_S)
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and round_or_wait_for_space():
            pass
        flush_queues(thorough=True)
        return ExitCode.OK
    finally:
        disp.close()
        cp.file.close()
