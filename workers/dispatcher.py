"""The dispatcher process: RocketMQ's ReputMessageService and FlushConsumeQueueService.

It follows the commit log through a read-only view and feeds `engine.dispatch`: every
record below the limit gets its consume-queue unit and its index keys. The limit is the
flushed position under SYNC_FLUSH, so that nothing a crash can take back is ever
consumed (DESIGN §3); under ASYNC_FLUSH it is what is in the files: committed with the
write pool on, published (complete records written straight into the mapping) with it
off. Its position goes to the control block (`Positions.dispatched`), where readers,
`mqstore status` and the cleaner's "never delete what is not dispatched" rule read it.

Loop, as every worker (`workers.service`): beat, wait, then dispatch what is there (in
bounded rounds, so the heartbeat stays fresh under load); no wait while records keep
coming, 1 ms once a round reached the limit (RocketMQ's reput sleeps 1 ms; not a round
that finds nothing first; 4 ms under SYNC_FLUSH after a round of 8 records or more:
`SYNC_BATCH_PAUSE_S`), then asleep on a futex until the limit can move (a flush
under SYNC_FLUSH, a publish under ASYNC_FLUSH; at most `IDLE_SLEEP_S`); records
published but not yet committed are polled for, backing off to `IDLE_WAIT_S`. Any other
I/O error (EIO anywhere, a failed sync, ENOSPC where no new space is needed) fails the
store closed, as in every worker.

Consume-queue flush (RocketMQ's FlushConsumeQueueService), in the flush thread
(`workers.cq_flusher`), never in the dispatch loop: every
`flush_consume_queue_interval_ms` the loop plans a job of the queue files with at least
`flush_consume_queue_least_pages` new pages (0 pages, every file with anything new, once
`flush_consume_queue_thorough_interval_ms` has passed) and hands it over; a thorough job
also forces the current index file and then writes the checkpoint with the logics time
dispatched when it was planned (never past what it forced) and the physic time the
flusher published (`Positions.flushed_ts`). A full index file (a roll) goes to the thread at
once; the checkpoint's index time moves to its end only after it was forced. The loop
collects a finished job at its next tick (the positions it forced) and never waits for
one: a job due while another is out waits for the next tick. A failed sync in the thread
fails the store closed from the loop (woken at once), as any I/O error of the dispatcher.
While the store runs, the flush thread is the checkpoint's only writer; the supervisor
writes it again at shutdown, after the workers have stopped.

A full disk (ENOSPC or EDQUOT creating a consume-queue or index file) is waited out, not
failed closed: the round is retried from the same offset every `NO_SPACE_WAIT_S`, said
once when it starts and once when space is back (docs/durability.md, "A full disk").

Drain on stop: dispatch up to the limit, stop the flush thread (its job finishes), then
force every queue and index file and write the checkpoint in the loop's own thread.
"""

from __future__ import annotations

import contextlib
import time
from typing import Final

from mqstore import _native
from mqstore.conf.settings import FlushDiskType, parse_delay_levels
from mqstore.engine import topics
from mqstore.engine.checkpoint import CheckpointFields, StoreCheckpoint
from mqstore.engine.dispatch import Dispatcher, DispatchStop
from mqstore.engine.fileio import StoreIOError, is_no_space
from mqstore.engine.reader import Geometry
from mqstore.ipc.control_views import DispatchStats, Histograms, Positions
from mqstore.workers.base import Condition, ExitCode, WorkerContext
from mqstore.workers.cq_flusher import FlushThread, plan_job, run_job
from mqstore.workers.service import Service, run
from mqstore.workers.topic_delete import TopicDeletions

MAX_RECORDS_PER_ROUND: Final = 4096
BUSY_WAIT_S: Final = 0.001
# Under SYNC_FLUSH the limit moves every flusher round, a few records at a time, and
# a round's fixed cost (the Python glue around the C scan and grouping, and the
# wake-up: `bench/results/dispatch_round_profile.md`) was 10-15 µs of CPU per put at 16
# sync producers. After a round of at least
# SYNC_BATCH_RECORDS records (a stream of 8k+ puts a second) the pause is
# SYNC_BATCH_PAUSE_S: rounds up to four times the size, for records pullable up to 4 ms
# after their flush instead of 1 ms; a slower stream keeps the 1 ms pause.
# `python -m bench.profile_sync_check --producers 16`, alternated, load 25-43: the
# dispatcher ran 0.07-0.15 times a put against 0.12-0.26, 10.2-22.2 µs of CPU a put
# against 15.7-32.0 with the 1 ms pause (a fixed 4 ms pause: 6.5-7.8 against 13.2-13.9).
SYNC_BATCH_RECORDS: Final = 8
SYNC_BATCH_PAUSE_S: Final = 0.004
IDLE_WAIT_S: Final = 0.008
DRAIN_STEP_S: Final = 0.1
NO_SPACE_WAIT_S: Final = 0.5  # between tries while a full disk holds dispatch up
# Between periodic jobs, the queues written since the last look and the index are checked
# this often for a next file to make ahead (`plan_job(queues=...)`): a file is wanted once
# the current one is half written, and at full rate half an index file (2M keys, two per
# message since every put carries a UNIQ_KEY) lasts about 0.9 s, less than the 1 s
# between periodic jobs, so the roll often came first and made the file in the loop
# (an allocation, 2 MiB of zeros and two fsyncs behind the commit log's writeback).
PREPARE_CHECK_S: Final = 0.05
# A dispatcher that has caught up with its limit sleeps until the limit can move, at most
# this long, instead of polling (1, 2, 4, 8 ms: 125 wake-ups a second on an idle store, and
# under sync puts a third of its ticks found nothing): on the flusher's futex under
# SYNC_FLUSH (`_native.wait_flushed_past`, woken by every flush), on the idle futex
# under ASYNC_FLUSH once every published record is dispatched (`_native.idle_sleep`,
# woken by the next publish). Published but not yet committed (the pool's commit is on its
# way) still polls with the back-off.
IDLE_SLEEP_S: Final = 0.1


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
        except StoreIOError as e:
            if not is_no_space(e):
                raise  # fails the store closed, as any worker's I/O error
            print(f"mqstore dispatcher: cannot register topics: {e}", flush=True)
            return  # no room for topics.json: retried when the queues grow again
        except ValueError as e:
            print(f"mqstore dispatcher: cannot register topics: {e}", flush=True)
            return  # retried when the queues grow again
        self._seen_queues = len(disp.queues)

    def forget(self, topic: str) -> None:
        """`topic` was deleted: register it again when its queues come back."""
        self._known.discard(topic)
        self._seen_queues = -1


def main(ctx: WorkerContext) -> int:
    """The worker: `WorkerSpec("dispatcher", "mqstore.workers.dispatcher:main")`."""
    s = ctx.settings
    cp = StoreCheckpoint.open_in(ctx.store_dir)
    # What was dispatched, in memory: the flush thread writes the file, with the logics
    # time of a thorough flush's plan (never past what it forced).
    dispatched = CheckpointFields.from_bytes(cp.to_bytes())
    try:
        disp = Dispatcher.open(
            ctx.store_dir,
            Geometry.of(ctx.store_dir, s),
            checkpoint=dispatched,
            index_enabled=s.message_index_enable,
            max_msgs_num_batch=s.max_msgs_num_batch,
            defer_index_roll_flush=True,
            delay_ms=parse_delay_levels(s.message_delay_level),
        )
    except StoreIOError:
        cp.close()
        raise  # fails the store closed (`worker_main`), as any worker's I/O error
    except (OSError, ValueError) as e:
        print(f"mqstore dispatcher: cannot open the consume queues or index: {e}", flush=True)
        cp.close()
        return ExitCode.BOOT_ERROR
    return run(ctx, DispatchService(ctx, disp, cp))


class DispatchService(Service):
    """The dispatcher's loop state: where it is in the log, the waits, the flush times."""

    name = "dispatcher"

    def __init__(self, ctx: WorkerContext, disp: Dispatcher, cp: StoreCheckpoint) -> None:
        super().__init__(ctx)
        self.disp = disp
        self.cp = cp  # the flush thread's while it runs
        self.flusher: FlushThread | None = None
        cb = ctx.cb
        self.pos, self.stats, self.hist = Positions(cb), DispatchStats(cb), Histograms(cb)
        # The supervisor seeds the dispatched position with the recovered end at boot; a
        # restarted dispatcher finds there the end of the last round it finished.
        self.offset = disp.resume_offset(self.pos.dispatched)
        # A predecessor killed inside an index roll may have left a record's keys split
        # at the full file's end; it is dispatched again from here, whole.
        disp.drop_split_keys(self.offset)
        self.segment_size = disp.log.queue.segment_size_bytes
        disp.log.queue.release_before(self.offset)
        self.pos.set_dispatched(self.offset)
        self.registry = _TopicRegistry(ctx)
        self.registry.update(disp)
        self.lag = self.hist.dispatch_lag_ms()  # never reset
        disp.lag_hist = self.lag
        disp.lag_sum_ms = self.hist.dispatch_lag_sum_ms
        self.dispatched = 0
        # the Python path's batches since boot: a restarted dispatcher goes on from them
        self.python_batches_before = self.stats.python_batches
        self.python_batches_seen = 0
        self.idle_wait = BUSY_WAIT_S
        self.round_records = 0  # records the last round dispatched
        # The next wait is a sleep until the limit can move, after a pause of this many
        # seconds (None: a plain wait)
        self.pause_then_sleep: float | None = None
        self.last_flush = self.last_thorough = self.last_prepare = time.monotonic()
        self.no_space = Condition("dispatcher")
        self.flusher = FlushThread(cp, self._physic_ms, self._wake_loop)
        self.deletions = TopicDeletions(ctx)  # `mqstore topic DIR delete T` while running

    def _physic_ms(self) -> int:
        return self.pos.flushed_ts

    def _wake_loop(self) -> None:
        """End the loop's wait at once (the flush thread failed): the select's, and a
        futex sleep's (a failure path: waking the sync waiters too costs nothing)."""
        self.ctx.wake()
        _native.idle_wake(self.ctx.cb.buf)
        if self._sync:
            _native.flushed_wake_all(self.ctx.cb.buf)

    @property
    def _sync(self) -> bool:
        return self.ctx.settings.flush_disk_type is FlushDiskType.SYNC_FLUSH

    def _limit(self) -> int:
        return self.pos.readable_end(self._sync)

    def wait(self, seconds: float) -> None:
        """A plain wait; or, once caught up (`pause_then_sleep`), the pause, then a sleep
        until the limit can move, at most `seconds`."""
        pause, self.pause_then_sleep = self.pause_then_sleep, None
        if pause is None:
            self.ctx.wait(seconds)
            return
        if pause > 0:
            self.ctx.wait(pause)
        if self.ctx.stopping or self._limit() > self.offset:
            return
        if self._sync:
            _native.wait_flushed_past(self.ctx.cb.buf, self.offset, int(seconds * 1e9))
        elif self.pos.published <= self.offset:
            _native.idle_sleep(self.ctx.cb.buf, self.offset, int(seconds * 1e9))

    def round_once(self) -> bool:
        """Dispatch one bounded round; True if it moved."""
        disp, offset = self.disp, self.offset
        limit = self._limit()
        if offset >= limit:
            return False
        res = disp.dispatch(offset, limit, max_records=MAX_RECORDS_PER_ROUND)
        if res.stop is DispatchStop.CORRUPT:
            # A record below committed that does not check out: never guess past it.
            print(f"mqstore dispatcher: stopped at {res.next_offset}: {res.reason}", flush=True)
        moved = res.next_offset > offset
        if res.next_offset // self.segment_size > offset // self.segment_size:
            # Segments wholly dispatched are not needed again: keep the mapped window small
            # so the dispatcher's memory does not grow with the log.
            disp.log.queue.release_before(res.next_offset)
        self.offset = res.next_offset
        self.round_records = res.records
        self.dispatched += res.records
        if res.last_store_timestamp:
            self.stats.set_last_dispatched_ts(res.last_store_timestamp)
        if res.records:
            self.hist.store_dispatch_lag(self.lag, disp.lag_sum_ms)
        # after the histogram: a reader that sees the records counted sees their lags
        self.stats.set_dispatched_records(self.dispatched)
        if disp.python_batches != self.python_batches_seen:  # seldom: no store a round
            self.python_batches_seen = disp.python_batches
            self.stats.set_python_batches(self.python_batches_before + disp.python_batches)
        self.pos.set_dispatched(self.offset)
        self.registry.update(disp)
        return moved

    def schedule_flush(self, now: float) -> None:
        """Hand the flush thread what is due (nothing while a job is out)."""
        flusher = self.flusher
        assert flusher is not None
        if flusher.busy:
            return
        s = self.ctx.settings
        thorough = now - self.last_thorough >= s.flush_consume_queue_thorough_interval_ms / 1000
        due = thorough or now - self.last_flush >= s.flush_consume_queue_interval_ms / 1000
        rolled = self.disp.index is not None and bool(self.disp.index.rolled)
        check = now - self.last_prepare >= PREPARE_CHECK_S
        if not (due or rolled or check):
            return
        pages = (0 if thorough else s.flush_consume_queue_least_pages) if due else None
        # A periodic job looks at every queue; between them, the queues written since.
        touched, self.disp.touched = self.disp.touched, set()
        self.last_prepare = now
        job = plan_job(
            self.disp, cq_pages=pages, thorough=thorough, queues=None if due else touched
        )
        if due:
            self.last_flush = now
            if thorough:
                self.last_thorough = now
        if job.empty:
            job.close()
        else:
            flusher.submit(job)

    def round_or_wait_for_space(self) -> bool:
        """`round_once`, but a full disk (no room for a new consume-queue or index
        file) is waited out, not failed: said once, retried every `NO_SPACE_WAIT_S`
        from the same offset (units already written come back ALREADY_BUILT)."""
        try:
            moved = self.round_once()
        except StoreIOError as e:
            if not is_no_space(e):
                raise
            self.no_space.report(
                f"{e.op} {e.path}",
                f"dispatch waits at {self.offset} for space on the disk: {e}",
            )
            return False
        if moved:
            self.no_space.clear(f"space is back: dispatching again from {self.offset}")
        return moved

    def tick(self) -> float:
        assert self.flusher is not None
        self.flusher.collect()  # raises what failed the flush thread: fails closed
        now = time.monotonic()
        served = self.deletions.check(self.disp, self.flusher.busy, now)
        if served:
            self.registry.forget(served)
        moved = self.round_or_wait_for_space()
        self.schedule_flush(time.monotonic())
        if moved:
            self.idle_wait = BUSY_WAIT_S
            # Caught up with the limit: nothing is there before the next flush (or
            # commit), so pause BUSY_WAIT_S now rather than spend a whole round finding
            # nothing first. Under sync puts the limit moves every flusher round (a few
            # messages); a round per round cost ~10 µs of CPU per put at 16 producers.
            # RocketMQ's reput also sleeps 1 ms once it has read all there is. After the
            # pause, a limit that has not moved is slept on (`wait`), not polled.
            if self.offset < self._limit():
                return 0.0
            batch = self._sync and self.round_records >= SYNC_BATCH_RECORDS
            self.pause_then_sleep = SYNC_BATCH_PAUSE_S if batch else BUSY_WAIT_S
            return IDLE_SLEEP_S
        if self.no_space.key:
            return NO_SPACE_WAIT_S
        if self.offset < self._limit() or (not self._sync and self.pos.published > self.offset):
            # Below the limit but not moving (the next segment not mapped here yet, a
            # record that does not check out), or published and its commit on its way:
            # poll, backing off; only a dispatcher caught up with everything sleeps.
            wait = self.idle_wait
            self.idle_wait = min(self.idle_wait * 2, IDLE_WAIT_S)
            return wait
        self.pause_then_sleep = 0.0
        self.idle_wait = BUSY_WAIT_S  # woken by a publish: poll for its commit from 1 ms
        return IDLE_SLEEP_S

    def drain_step(self) -> bool:
        """Dispatch up to the limit, rounds back to back for up to DRAIN_STEP_S (the
        runner bounds the whole drain by `drain_s`); True once a round finds nothing."""
        until = time.monotonic() + DRAIN_STEP_S
        while self.round_or_wait_for_space():
            if time.monotonic() >= until:
                return False
        return True

    def finish(self) -> None:
        """Stop the flush thread (raising what failed it), then force every queue and
        index file and write the checkpoint here, drained or out of time."""
        assert self.flusher is not None
        self.flusher.stop()
        job = plan_job(self.disp, cq_pages=0, thorough=True, all_index=True, prepare=False)
        run_job(job, self.cp, self._physic_ms)
        job.apply()
        queues = len(self.disp.queues)
        made = sum(cq.queue.rolls_in_place for cq in self.disp.queues)
        made_index = 0 if self.disp.index is None else self.disp.index.rolls_in_place
        if made or made_index:
            # Rolls that found no file made ahead: each stalled the loop on the disk.
            print(
                f"mqstore dispatcher: rolls made their file in the loop: {made} consume-queue "
                f"(of {queues} queues), {made_index} index",
                flush=True,
            )

    def close(self) -> None:
        try:
            if self.flusher is not None:
                with contextlib.suppress(Exception):  # finish() raised it if it mattered
                    self.flusher.stop()
        finally:
            self.disp.close()
            self.cp.close()
