"""Dispatch: commit log -> consume queues and index (RocketMQ's ReputMessageService,
spec §8.16, with `CommitLogDispatcherBuildConsumeQueue` and `...BuildIndex`).

`Dispatcher.dispatch(from_offset, limit)` walks the message records of the commit log
from `from_offset` and stops before any record that does not end at or below `limit`.
The caller chooses the limit: the committed offset under ASYNC_FLUSH, the flushed
offset under SYNC_FLUSH, so nothing a crash can take back is ever dispatched. It returns
how far it got (`DispatchResult.next_offset`); a process loop calls it again from there.

For every record:

* BLANK (end of segment): hop to the next segment (the walk does it);
* a filler (`engine.filler.is_filler`, what the publisher writes over a dead producer's
  reservation): no index entries; if it holds a queue offset, that offset gets a
  pre-blank unit, so the queue stays dense, its max offset is right after recovery, and
  readers skip it without decoding it;
* a record whose topic breaks RocketMQ's name rule (`engine.names`; the client never
  writes one, an older store or another writer might) or whose queue id is negative:
  no consume-queue unit and no directory, only an entry in `DispatchResult.refused`;
* NOT / COMMIT transaction types: a consume-queue unit at the record's queue offset
  (checked against the queue's own end: duplicates are ignored, gaps are filled with
  pre-blanks and counted, as `ConsumeQueue.put` says); PREPARED / ROLLBACK: none;
* every type but ROLLBACK: index entries (`topic#UNIQ_KEY`, `topic#key` per KEYS token),
  when an `IndexService` is given.
* a record of a topic deleted by `mqstore topic DIR delete`, below the end offset the
  deletion recorded (`engine.deleted_topics`): nothing, so a deleted topic's queues never
  come back from the records that stay in the log.

After each unit written the checkpoint's `logics_msg_timestamp` becomes the record's
store time (in memory; whoever flushes consume queues persists it, spec §5).

Re-dispatching what is already there is harmless (RocketMQ's rule: a queue ignores units
whose commit-log end is not past its own; the index ignores offsets before its end), which
is what abnormal recovery relies on.

Called by the dispatcher process (its own read-only view of the log) and by recovery.
Not thread-safe.
"""

from __future__ import annotations

import enum
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from mqstore.engine import deleted_topics
from mqstore.engine.checkpoint import CheckpointFields
from mqstore.engine.commitlog import CommitLog, ScanStop
from mqstore.engine.consumequeue import ConsumeQueueStore, PutStatus, QueueKey
from mqstore.engine.fileio import StoreIOError, is_no_space
from mqstore.engine.filler import is_filler
from mqstore.engine.indexfile import IndexService
from mqstore.engine.names import topic_problem
from mqstore.engine.reader import Geometry
from mqstore.engine.record import RecordHeader, takes_queue_offset
from mqstore.engine.segment_queue import SegmentQueue


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """What a record tells its consume queue and the index (RocketMQ's DispatchRequest)."""

    topic: str
    queue_id: int
    physical_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    keys: str | None
    uniq_key: str | None
    sys_flag: int
    prepared_transaction_offset: int

    @classmethod
    def from_header(cls, offset: int, h: RecordHeader) -> DispatchRequest:
        """From a checked record at log `offset` (the position, not the stored field)."""
        return cls(
            h.topic,
            h.queue_id,
            offset,
            h.size,
            h.tags_code,
            h.store_timestamp,
            h.queue_offset,
            h.keys,
            h.uniq_key,
            h.sys_flag,
            h.prepared_transaction_offset,
        )


class DispatchStop(enum.Enum):
    """Why `dispatch` stopped; `next_offset` is where the next call starts."""

    LIMIT = "LIMIT"  # reached the limit, or the next record ends past it
    END_OF_DATA = "END_OF_DATA"  # zeros: nothing more written yet
    WAIT_NEXT_SEGMENT = "WAIT_NEXT_SEGMENT"  # a BLANK ends the last segment known
    MAX_RECORDS = "MAX_RECORDS"  # `max_records` reached
    CORRUPT = "CORRUPT"  # an invalid record (reason says why); recovery's business
    OFFSET_NOT_FOUND = "OFFSET_NOT_FOUND"  # from_offset is in no segment


@dataclass(slots=True)
class DispatchResult:
    from_offset: int
    next_offset: int
    stop: DispatchStop
    reason: str = ""
    records: int = 0  # message records walked (skipped ones included)
    units_written: int = 0
    skipped: int = 0  # fillers (a pre-blank unit each) and records of deleted topics
    index_keys: int = 0
    last_store_timestamp: int = 0
    put_statuses: Counter[PutStatus] = field(default_factory=Counter)
    refused: list[tuple[QueueKey, int, int]] = field(default_factory=list)  # key, qo, phys
    seconds: float = 0.0


_SCAN_TO_STOP = {
    ScanStop.END_OF_DATA: DispatchStop.END_OF_DATA,
    ScanStop.BLANK_IN_LAST_SEGMENT: DispatchStop.WAIT_NEXT_SEGMENT,
    ScanStop.CORRUPT: DispatchStop.CORRUPT,
    ScanStop.OFFSET_NOT_FOUND: DispatchStop.OFFSET_NOT_FOUND,
    ScanStop.LIMIT: DispatchStop.LIMIT,
}


class Dispatcher:
    """Builds consume queues and the index from the commit log. See the module doc."""

    def __init__(
        self,
        log: CommitLog,
        queues: ConsumeQueueStore,
        index: IndexService | None = None,
        *,
        checkpoint: CheckpointFields | None = None,
    ) -> None:
        self.log = log
        self.queues = queues
        self.index = index
        self.checkpoint = checkpoint
        # Topics deleted while the store was stopped: their records below the end offset
        # stay out of the queues and the index (engine.deleted_topics).
        self.deleted = deleted_topics.load(queues.store_dir)
        # Dispatch lag per record, when a caller wants it (the dispatcher process's
        # metrics): bucket i counts records dispatched within 2^i ms of their store time.
        self.lag_hist: list[int] | None = None
        self.lag_sum_ms = 0
        # Recovery sets `defer_on_no_space`: a record whose consume-queue file cannot be
        # created on a full disk, and every record after it, is left to the dispatcher
        # process (it resumes from the queues' end once there is room), so that a full
        # disk never stops a store from booting. `deferred` says why ("" if nothing was).
        self.defer_on_no_space = False
        self.deferred = ""
        # The next queue offset of each queue as the deferred records say: the queues
        # lag the log, and the producers' offset table must not (recovery merges it).
        self.deferred_next: dict[QueueKey, int] = {}

    @classmethod
    def open(
        cls,
        store_dir: str | os.PathLike[str],
        geometry: Geometry,
        *,
        checkpoint: CheckpointFields | None = None,
        index_enabled: bool = True,
        max_msgs_num_batch: int = 64,
        on_index_roll: Callable[[int], None] | None = None,
    ) -> Dispatcher:
        """The dispatcher process's set-up: a read-only view of the commit log (it follows
        the appenders through `SegmentQueue.refresh`), the consume queues opened for
        writing and recovered (positions found: the last 3 files of each), the index
        loaded. Start dispatching from `resume_offset()`. `close()` closes them all.
        Raises SegmentSizeError, IndexGeometryError, StoreIOError."""
        d = os.fspath(store_dir)
        q = SegmentQueue(os.path.join(d, "commitlog"), geometry.segment_size_bytes, read_only=True)
        q.load()
        log = CommitLog(q)
        queues = ConsumeQueueStore.open(d, geometry.cq_file_size_bytes)
        queues.recover()
        index = None
        if index_enabled:
            index = IndexService(
                d,
                geometry.hash_slot_num,
                geometry.index_num,
                max_msgs_num_batch=max_msgs_num_batch,
                on_roll=on_index_roll,
            )
            index.load()
        return cls(log, queues, index, checkpoint=checkpoint)

    def resume_offset(self) -> int:
        """Where dispatching resumes (RocketMQ's reputFromOffset at start): the queues'
        max physical offset, at least the log's first offset. Re-dispatching a few
        records (transactions, fillers) from there is harmless."""
        return max(self.queues.max_physical_offset(), self.log.min_offset(), 0)

    def close(self) -> None:
        """Close the log view, the queues and the index (not the checkpoint)."""
        self.log.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()

    def dispatch(
        self, from_offset: int, limit: int, *, max_records: int | None = None
    ) -> DispatchResult:
        """Dispatch records from `from_offset` while they end at or below `limit`.

        A read-only log (another process appends) is refreshed once when the walk runs
        off its last known segment. Raises StoreIOError (consume-queue or index files).
        O(records + bytes of their properties).
        """
        t0 = time.perf_counter()
        res = self._walk(from_offset, limit, max_records)
        if res.stop in (DispatchStop.WAIT_NEXT_SEGMENT, DispatchStop.OFFSET_NOT_FOUND) and (
            self.log.queue.read_only and self.log.queue.refresh()
        ):
            more = self._walk(res.next_offset, limit, max_records)
            more.from_offset = res.from_offset
            more.records += res.records
            more.units_written += res.units_written
            more.skipped += res.skipped
            more.index_keys += res.index_keys
            more.put_statuses.update(res.put_statuses)
            more.refused[:0] = res.refused
            more.last_store_timestamp = more.last_store_timestamp or res.last_store_timestamp
            res = more
        res.seconds = time.perf_counter() - t0
        return res

    def _walk(self, from_offset: int, limit: int, max_records: int | None) -> DispatchResult:
        res = DispatchResult(from_offset, from_offset, DispatchStop.END_OF_DATA)
        if from_offset >= limit:
            res.stop = DispatchStop.LIMIT
            return res
        sc = self.log.scan(from_offset, check_crc=False, read_body=False, to_offset=limit)
        it = iter(sc)
        stopped_early: DispatchStop | None = None
        lag = self.lag_hist
        now_ms = time.time_ns() // 1_000_000 if lag is not None else 0
        try:
            for rec in it:
                h = rec.header
                if rec.offset + h.size > limit:
                    stopped_early = DispatchStop.LIMIT
                    res.next_offset = rec.offset
                    break
                self.dispatch_record(rec.offset, h, res)
                if lag is not None:
                    ms = max(0, now_ms - h.store_timestamp)
                    self.lag_sum_ms += ms
                    b = ms.bit_length()
                    lag[b if b < len(lag) else -1] += 1
                res.next_offset = rec.offset + h.size
                if max_records is not None and res.records >= max_records:
                    stopped_early = DispatchStop.MAX_RECORDS
                    break
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        if stopped_early is not None:
            res.stop = stopped_early
            return res
        res.stop = _SCAN_TO_STOP[sc.stop]
        res.reason = sc.reason
        res.next_offset = sc.end_offset
        return res

    def dispatch_record(self, offset: int, h: RecordHeader, res: DispatchResult) -> None:
        """Dispatch one checked message record at log `offset` into `res` (recovery
        drives its own validating walk and calls this). Raises StoreIOError (with
        `defer_on_no_space`, not for a full disk: see `deferred`)."""
        if not self.deferred:
            try:
                self._dispatch_record(offset, h, res)
                return
            except StoreIOError as e:
                if not (self.defer_on_no_space and is_no_space(e)):
                    raise
                self.deferred = f"dispatch from {offset} left to the dispatcher: {e}"
        if takes_queue_offset(h.sys_flag) and h.queue_id >= 0:
            key = (h.topic, h.queue_id)
            self.deferred_next[key] = max(self.deferred_next.get(key, 0), h.queue_offset + 1)

    def _dispatch_record(self, offset: int, h: RecordHeader, res: DispatchResult) -> None:
        res.records += 1
        if self.deleted and offset < self.deleted.get(h.topic, -1):
            res.skipped += 1  # a record of a deleted topic
            return
        takes = takes_queue_offset(h.sys_flag)
        if is_filler(h):
            res.skipped += 1
            if takes and topic_problem(h.topic) is None and h.queue_id >= 0:
                cq = self.queues.find_or_create(h.topic, h.queue_id)
                st = cq.put_pre_blank(h.queue_offset)
                res.put_statuses[st] += 1
            return
        if takes:
            if topic_problem(h.topic) is not None or h.queue_id < 0:
                res.refused.append(((h.topic, h.queue_id), h.queue_offset, offset))
            else:
                cq = self.queues.find_or_create(h.topic, h.queue_id)
                st = cq.put(offset, h.size, h.tags_code, h.queue_offset)
                res.put_statuses[st] += 1
                if st is PutStatus.REFUSED_GAP:
                    res.refused.append(((h.topic, h.queue_id), h.queue_offset, offset))
                elif st in (PutStatus.OK, PutStatus.GAP_FILLED):
                    res.units_written += 1
                    res.last_store_timestamp = h.store_timestamp
                    if self.checkpoint is not None:
                        self.checkpoint.logics_msg_timestamp = h.store_timestamp
        if self.index is not None:
            res.index_keys += self.index.build_index(
                h.topic, h.keys, h.uniq_key, offset, h.store_timestamp, h.sys_flag
            )
