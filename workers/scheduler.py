"""The scheduler process: RocketMQ's ScheduleMessageService. It re-puts each delayed
message (SCHEDULE_TOPIC_XXXX, one queue per delay level) to its real topic and queue when
due, in order, once.

Each round, per level: the next entries of the level's queue (read in this process as a
client reads, `ipc.reads.ClientReads`, over the worker's own control block), and those
due (store time +
the level's delay, `message_delay_level`; RocketMQ's `correctDeliverTimestamp`: a
delivery time further away than the level's delay is now) are re-put as
`engine.retry.timeup_message` makes them (`messageTimeup`), as one all-or-nothing batch.
A batch refused for its content (a REAL_QID beyond its topic's queues now, say) is put one
by one and each refused message is dropped with a log line, as the broker drops it; any
other refusal (the store not writable, a full disk) is tried again after a pause, never
skipped. The round sleeps until the earliest next due time, at most `TICK_S`. The puts go
through a `StoreClient` attached only while there is something to re-put (it shows in
`mqstore status` as a client), detached after `IDLE_DETACH_S` without one.

Progress is RocketMQ's `config/delayOffset.json` (`{"offsetTable": {"<level>": <next
queue offset>}}`), written only up to re-puts the flusher has made durable, at most every
`PERSIST_MIN_S` and at least every `flush_delay_offset_interval_ms` when it moved.

Exactly once across a crash: a crash between a re-put and the progress write would have
a restart deliver again what the file does not cover yet. So at start, before the first
round, `recover_progress` reads, for each level, the entries after the file's offset that
were due, and looks for their re-puts in their real queues (each queue's records stored
since the earliest due time of any level's entry bound for it, less `RECHECK_SLACK_MS`,
matched on what a re-put keeps: born time and host, body, properties, flag, reconsume
count). A level's re-puts are
ordered and its batches all or nothing, so what was delivered is a prefix of its
entries: the progress moves past the prefix that is found, and delivery goes on after.
"""

from __future__ import annotations

import collections
import contextlib
import os
import time
from collections import Counter, deque
from collections.abc import Hashable
from typing import Any, Final

from mqstore.conf.settings import parse_delay_levels
from mqstore.engine import jsonconfig
from mqstore.engine.geometry import Geometry
from mqstore.engine.reader import GetStatus
from mqstore.engine.record import SCHEDULE_TOPIC, Message
from mqstore.engine.record_decode import DecodedRecord
from mqstore.engine.retry import timeup_message
from mqstore.ipc.channel import SupervisorUnavailable
from mqstore.ipc.client import StoreClient
from mqstore.ipc.control_views import Positions
from mqstore.ipc.reads import AttachedStore, ClientReads
from mqstore.ipc.results import PutMessageStatus, PutResult
from mqstore.workers.base import WorkerContext, say
from mqstore.workers.service import Service, run

NAME: Final = "scheduler"
DELAY_OFFSET_FILE: Final = "delayOffset.json"
# The longest sleep between rounds. A buffered entry is re-put at its due time (the round
# sleeps until the earliest); TICK_S only bounds how late a new entry is first read, and
# it is due a level's delay (1 s at least by default) after it was stored. Each round reads
# every level: at 20 ms an idle store's scheduler woke 50 times a second for nothing.
TICK_S: Final = 0.1
PULL_BATCH: Final = 64
PERSIST_MIN_S: Final = 0.1
RETRY_PAUSE_S: Final = 0.5  # after a re-put refused for a passing reason
RECHECK_SLACK_MS: Final = 2000
IDLE_DETACH_S: Final = 10.0
_CONTENT: Final = frozenset(
    {PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PROPERTIES_SIZE_EXCEEDED}
)
_MOVE_TO_NEXT: Final = frozenset(
    {GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.OFFSET_FOUND_NULL}
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def delay_offset_path(store_dir: str) -> str:
    return jsonconfig.config_path(store_dir, DELAY_OFFSET_FILE)


def read_progress(store_dir: str) -> dict[int, int]:
    """`config/delayOffset.json`'s offsetTable (level -> next queue offset); {} when the
    file is missing. fastjson's unquoted integer keys are read too."""
    path = delay_offset_path(store_dir)
    if not os.path.exists(path):
        return {}
    doc = jsonconfig.read(path)
    table = doc.get("offsetTable") or {}
    out: dict[int, int] = {}
    if isinstance(table, dict):
        for k, v in table.items():
            if str(k).lstrip("-").isdigit() and isinstance(v, int):
                out[int(k)] = v
    return out


def write_progress(store_dir: str, table: dict[int, int]) -> None:
    """Replace the offsetTable (atomically, fsynced: `engine.jsonconfig.update`)."""

    def change(doc: dict[str, Any]) -> bool:
        doc["offsetTable"] = {str(k): v for k, v in sorted(table.items())}
        return True

    jsonconfig.update(delay_offset_path(store_dir), change)


def due_ms(rec: DecodedRecord, delay_ms: int, now: int) -> int:
    """When `rec` (a record of a level whose delay is `delay_ms`) is due: store time +
    delay, or now when that is further away than the delay (a clock set back)."""
    due = rec.store_timestamp + delay_ms
    return now if due > now + delay_ms else due


def signature(m: Message | DecodedRecord) -> Hashable:
    """What a re-put keeps of its schedule-topic record, to recognise it in its real queue."""
    props = tuple(sorted(m.properties.items()))
    return (m.born_timestamp, m.born_host, bytes(m.body), props, m.flag, m.reconsume_times)


class Scheduler(Service):
    name = NAME
    drain_s = 0.5

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.delays = parse_delay_levels(ctx.settings.message_delay_level)
        self.client: StoreClient | None = None
        geo = Geometry.of(ctx.store_dir, ctx.settings)
        self.reads = ClientReads(
            ctx.store_dir, lambda: AttachedStore(ctx.cb, self.ctx.settings, geo)
        )
        self.last_put = time.monotonic()
        saved = read_progress(ctx.store_dir)
        self.offsets = {lv: max(0, saved.get(lv, 0)) for lv in range(1, len(self.delays) + 1)}
        self.saved = dict(self.offsets)
        self.recovered = False
        self.dispatch_target = -1
        self.buffers: dict[int, deque[DecodedRecord]] = collections.defaultdict(deque)
        # (level, next offset, log end of its re-puts): delivered, not yet known durable
        self.unflushed: deque[tuple[int, int, int]] = deque()
        self.durable = dict(self.offsets)
        self.last_write = time.monotonic()
        self.paused_until: dict[int, float] = {}
        self.empty_at: dict[int, int] = {}  # level -> dispatched when a read found none

    # --- the client -----------------------------------------------------------------------

    def _client(self) -> StoreClient | None:
        if self.client is None:
            try:
                self.client = StoreClient.attach(self.ctx.store_dir, timeout_s=2.0)
            except SupervisorUnavailable:
                return None
        return self.client

    def _detach(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
            self.client = None

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the store may be gone: the file stays
            self._persist(force=True)
        self._detach()
        self.reads.close()

    # --- the loop ---------------------------------------------------------------------------

    def tick(self) -> float:
        try:
            return self._round()
        except SupervisorUnavailable as e:  # stopped or gone: its next run goes on
            say(NAME, f"no store to deliver to: {e}", "WARNING")
            self._detach()
            self.buffers.clear()
            self.empty_at.clear()
            self.unflushed.clear()
            self.offsets = dict(self.durable)  # the rest: checked against the log again
            self.recovered = False
            return 0.5

    def _round(self) -> float:
        if not self.recovered:
            if not self._dispatched_up():
                return 0.02
            self.recover_progress()
            self.recovered = True
        now = now_ms()
        wait_ms = TICK_S * 1000
        for level in self.offsets:
            next_due = self._deliver(level, now)
            if next_due is not None:
                wait_ms = min(wait_ms, max(0, next_due - now_ms()))
        self._persist()
        idle = time.monotonic() - self.last_put > IDLE_DETACH_S
        if self.client is not None and not self.unflushed and idle:
            self._detach()
        return wait_ms / 1000

    def _dispatched_up(self) -> bool:
        """Whether the consume queues cover the log as it was when first asked (recovery's
        re-dispatch included): the real queues must show every re-put before the check.
        The target is taken once: under a steady load the dispatcher trails the log's
        end forever, but passes any point of it."""
        pos = Positions(self.ctx.cb)
        if self.dispatch_target < 0:
            self.dispatch_target = pos.committed
        if pos.dispatched < self.dispatch_target:
            return False
        self.dispatch_target = -1
        return True

    def _fill(self, level: int) -> deque[DecodedRecord]:
        """The level's buffered entries; read more only when it is empty and the
        dispatcher has moved since the last read found nothing (an idle store costs one
        load of a word per level and round)."""
        buf = self.buffers[level]
        dispatched = Positions(self.ctx.cb).dispatched
        if not buf and self.empty_at.get(level) != dispatched:
            offset = self.offsets[level]
            res = self.reads.pull(SCHEDULE_TOPIC, level - 1, offset, PULL_BATCH)
            if not res.messages:
                self.empty_at[level] = dispatched
            if res.status is GetStatus.FOUND:
                buf.extend(r for r in res.messages if r.queue_offset >= offset)
            elif res.status in _MOVE_TO_NEXT and res.next_offset != offset:
                say(NAME, f"level {level}: offset {offset} moved to {res.next_offset} "
                    f"({res.status.value})", "WARNING")  # fmt: skip
                self.offsets[level] = res.next_offset
                self.unflushed.append((level, res.next_offset, 0))
        return buf

    def _deliver(self, level: int, now: int) -> int | None:
        """Re-put the level's due messages; the next due time (None: nothing waits)."""
        if time.monotonic() < self.paused_until.get(level, 0.0):
            return None
        delay = self.delays[level - 1]
        while True:
            buf = self._fill(level)
            if not buf:
                return None
            batch: list[DecodedRecord] = []
            while buf and len(batch) < PULL_BATCH and due_ms(buf[0], delay, now) <= now:
                batch.append(buf.popleft())
            if not batch:
                return due_ms(buf[0], delay, now)
            client = self._client()
            if client is None:
                buf.extendleft(reversed(batch))
                return now + 100
            self.last_put = time.monotonic()
            if not self._reput(client, level, batch):
                buf.extendleft(reversed(batch))
                self.paused_until[level] = time.monotonic() + RETRY_PAUSE_S
                return None
            now = now_ms()

    def _reput(self, client: StoreClient, level: int, batch: list[DecodedRecord]) -> bool:
        """Re-put `batch` (one level's due records, in order) as one all-or-nothing batch;
        False (nothing of it put) to try again later."""
        msgs = [timeup_message(rec) for rec in batch]
        if all(m is not None for m in msgs):
            results = client.put_batch(
                [m for m in msgs if m is not None], wait_store=False, redelivered=True
            )
            status = results[0].status
            if status is PutMessageStatus.PUT_OK:
                self._delivered(level, batch[-1], _end(results))
                return True
            if status not in _CONTENT:
                say(NAME, f"level {level}: re-put refused ({status.value}: "
                    f"{results[0].reason}); trying again", "WARNING")  # fmt: skip
                return False
        return self._one_by_one(client, level, batch)

    def _one_by_one(self, client: StoreClient, level: int, batch: list[DecodedRecord]) -> bool:
        """A batch refused for its content: each record alone, in order; one that cannot
        be stored (no REAL_TOPIC, a REAL_QID beyond its topic's queues, ...) is dropped
        with a log line, as the broker drops it. A refusal for a passing reason stops here:
        the records not put yet go back to the buffer (False)."""
        buf = self.buffers[level]
        for i, rec in enumerate(batch):
            m = timeup_message(rec)
            r = (
                client.put_batch([m], wait_store=False, redelivered=True)[0]
                if m is not None
                else None
            )
            if r is not None and r.status is PutMessageStatus.PUT_OK:
                self._delivered(level, rec, _end([r]))
            elif r is None or r.status in _CONTENT:
                why = r.reason if r is not None else "no REAL_TOPIC / REAL_QID"
                say(NAME, f"level {level}: dropping {rec.msg_id} (queue offset "
                    f"{rec.queue_offset}): {why}", "WARNING")  # fmt: skip
                self._delivered(level, rec, 0)
            else:
                buf.extendleft(reversed(batch[i:]))
                self.paused_until[level] = time.monotonic() + RETRY_PAUSE_S
                return True  # what is left is back in the buffer already
        return True

    def _delivered(self, level: int, rec: DecodedRecord, log_end: int) -> None:
        self.offsets[level] = rec.queue_offset + 1
        self.unflushed.append((level, self.offsets[level], log_end))

    # --- progress ---------------------------------------------------------------------------

    def _persist(self, *, force: bool = False) -> None:
        flushed = Positions(self.ctx.cb).flushed
        while self.unflushed and self.unflushed[0][2] <= flushed:
            level, offset, _end_at = self.unflushed.popleft()
            self.durable[level] = offset
        since = time.monotonic() - self.last_write
        interval = self.ctx.settings.flush_delay_offset_interval_ms / 1000
        if self.durable != self.saved and (force or since >= min(PERSIST_MIN_S, interval)):
            write_progress(self.ctx.store_dir, self.durable)
            self.saved = dict(self.durable)
            self.last_write = time.monotonic()

    def recover_progress(self) -> None:
        """Move each level's offset past the entries already re-put (module docstring)."""
        now = now_ms()
        due: dict[int, list[DecodedRecord]] = {}
        for level in self.offsets:
            delay, offset = self.delays[level - 1], self.offsets[level]
            got: list[DecodedRecord] = []
            while True:
                res = self.reads.pull(SCHEDULE_TOPIC, level - 1, offset, PULL_BATCH)
                if res.status is not GetStatus.FOUND:
                    if res.status in _MOVE_TO_NEXT and not got and res.next_offset != offset:
                        offset = self.offsets[level] = res.next_offset
                        continue
                    break
                recs = [r for r in res.messages if due_ms(r, delay, now) <= now]
                got.extend(recs)
                if len(recs) < len(res.messages):
                    break
                offset = res.next_offset
            if got:
                due[level] = got
        if not due:
            return
        # Each real queue is read once, from the earliest due time of any level's entry
        # bound for it: a level read first may fall due after another's re-puts.
        earliest: dict[tuple[str, int], int] = {}
        for level, recs in due.items():
            delay = self.delays[level - 1]
            for rec in recs:
                m = timeup_message(rec)
                if m is not None:
                    q, at = (m.topic, m.queue_id), due_ms(rec, delay, now)
                    earliest[q] = min(at, earliest.get(q, at))
        seen = {q: self._reputs_since(q, at - RECHECK_SLACK_MS) for q, at in earliest.items()}
        moved = 0
        for level, recs in due.items():
            for rec in recs:
                m = timeup_message(rec)
                if m is not None:
                    found = seen.get((m.topic, m.queue_id))
                    sig = signature(m)
                    if found is None or found[sig] <= 0:
                        break
                    found[sig] -= 1
                self.offsets[level] = rec.queue_offset + 1
                moved += 1
        if moved:
            say(NAME, f"{moved} delayed messages were re-put before the last stop without "
                "their progress saved: not delivered again")  # fmt: skip
            self.durable = dict(self.offsets)
            write_progress(self.ctx.store_dir, self.durable)
            self.saved = dict(self.durable)

    def _reputs_since(self, queue: tuple[str, int], since_ms: int) -> Counter[Hashable]:
        """The signatures of the records of `queue` (topic, queue id) stored since
        `since_ms`."""
        topic, queue_id = queue
        out: Counter[Hashable] = Counter()
        offset = self.reads.offset_for_time(topic, queue_id, max(0, since_ms))
        while True:
            res = self.reads.pull(topic, queue_id, offset, 256)
            if res.status is not GetStatus.FOUND:
                return out
            for r in res.messages:
                if r.store_timestamp >= since_ms:
                    out[signature(r)] += 1
            offset = res.next_offset


def _end(results: list[PutResult]) -> int:
    last = results[-1]
    return int(last.physical_offset + last.size)


def main(ctx: WorkerContext) -> int:
    return run(ctx, Scheduler(ctx))
