"""The read API: messages by queue offset, physical offset, message id, key and time
(spec §8.17, §4.5 queryMessage, §3.6), in the reader's own process.

`StoreReader` maps the commit log, the consume queues and the index files read-only.
Nothing is copied through another process; nothing is written. It never returns a
record that does not end at or below its **limit**: `max_offset_fn()` when given (the
runtime passes the committed offset under ASYNC_FLUSH, the flushed one under
SYNC_FLUSH), else the end of the valid data found when the reader opened (a stopped
store; `refresh()` finds it again).

Files another process creates later (a new commit-log segment, consume-queue file,
queue, index file) are picked up when a read runs off what the reader knows.

Statuses are RocketMQ's GetMessageStatus. Pre-blank units and fillers
(`engine.filler.is_filler`: what the publisher writes over a dead producer's reservation)
are skipped like filtered-out messages; no lookup returns a filler.

A pull (`get_messages`) walks its consume-queue units and builds its messages in C
(`engine.pull.pull_units`: RocketMQ's per-unit rules, the record check, one message
object per record with its slots filled from C), one call per consume-queue file read
and commit-log segment mapped. Other lookups find and decode records through the record
scanner (`engine.scan_decode`). `get_messages(..., zero_copy=True)` gives `RecordView`s,
whose bodies are views of the mapping (`engine.record.RecordView` says how long they
live).

Cost of a pull: a look at the queue (a search from the end of the last file's units
found at the last look; none while the limit has not moved, when it follows the
dispatcher), two held slices (the units, the log), then O(units walked) in C and one
message object per record. Not thread-safe: one reader per thread.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from typing import Final

from mqstore.conf.settings import StoreSettings
from mqstore.engine import compression, deleted_topics
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue import ConsumeQueue
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.filler import is_filler
from mqstore.engine.geometry import Geometry as Geometry  # its home before engine.geometry
from mqstore.engine.get_result import GetResult as GetResult  # their home before get_result
from mqstore.engine.get_result import GetStatus as GetStatus
from mqstore.engine.indexservice import IndexService
from mqstore.engine.pull import PullStop, TagFilter, pull_units
from mqstore.engine.record import PROPERTY_KEYS, PROPERTY_UNIQ_KEY, SysFlag
from mqstore.engine.record_decode import DecodedRecord, RecordFields
from mqstore.engine.recordcodes import parse_msg_id
from mqstore.engine.scan_decode import read_records, segment_of
from mqstore.engine.segment import ReadStatus, SegmentSlice
from mqstore.engine.segment_queue import SegmentQueue

MAX_TIMESTAMP_MS = (1 << 63) - 1
DEFAULT_MAX_BYTES = 256 * 1024  # maxTransferBytesOnMessageInMemory
MIN_SCAN_UNITS = 16000 // 20  # RocketMQ scans at least 16000 bytes of units per pull
QUERY_ROUNDS = 3
_NO_LOG: Final = memoryview(b"")
_PHYS: Final = struct.Struct(">q")

MaxOffsetFn = Callable[[], int]


def record_has_key(rec: RecordFields, topic: str, key: str) -> bool:
    """The message really carries `key` (as UNIQ_KEY or a KEYS token) in `topic`."""
    if rec.topic != topic:
        return False
    if rec.properties.get(PROPERTY_UNIQ_KEY) == key:
        return True
    keys = rec.properties.get(PROPERTY_KEYS)
    return keys is not None and key in keys.split(" ")


class StoreReader:
    """Read-only access to one store directory. See the module docstring."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        geometry: Geometry,
        *,
        max_offset_fn: MaxOffsetFn | None = None,
        max_msgs_num_batch: int = 64,
        limit_follows_dispatch: bool = False,
    ) -> None:
        """Open everything read-only. `limit_follows_dispatch`: the limit never passes
        the dispatcher's published position (`ipc.reads`), so every unit of a record
        that ends below it was written before the limit showed it, and a queue needs no
        new look while the limit stays put. Raises SegmentSizeError, IndexGeometryError,
        StoreIOError."""
        self.store_dir = os.fspath(store_dir)
        self.geometry = geometry
        self._max_offset_fn = max_offset_fn
        queue = SegmentQueue(
            os.path.join(self.store_dir, "commitlog"), geometry.segment_size_bytes, read_only=True
        )
        queue.load()
        self.log = CommitLog(queue)
        try:
            self.queues = ConsumeQueueStore(
                self.store_dir, geometry.cq_file_size_bytes, read_only=True
            ).load()
            self.index = IndexService(
                self.store_dir,
                geometry.hash_slot_num,
                geometry.index_num,
                read_only=True,
                max_msgs_num_batch=max_msgs_num_batch,
            )
            self.index.load()
        except BaseException:
            self.log.close()
            raise
        self._static_limit = -1  # found on first use when no max_offset_fn is given
        self._min_seen: dict[tuple[str, int], int] = {}
        self._limit_follows_dispatch = limit_follows_dispatch
        # queue -> (limit, log min offset, min offset, visible max offset) at the last look
        self._looked: dict[tuple[str, int], tuple[int, int, int, int]] = {}
        # deleted topics (engine.deleted_topics): lookups skip their records below the end
        self.deleted = self._load_deleted()

    def _load_deleted(self) -> dict[str, int]:
        try:
            return deleted_topics.load(self.store_dir)
        except (ValueError, OSError):
            return {}  # `mqstore check` reports a bad file; reads go on without it

    def forget_deleted(self) -> None:
        """Topics were deleted while the store runs (`workers.topic_delete`): drop the
        cached queues of every deleted topic (their files are gone; a queue of the same
        name made since is opened afresh) and skip their records below the end in
        lookups. `ipc.reads` calls it when the control block's counter moves."""
        self.deleted = self._load_deleted()
        for topic in self.deleted:
            self.queues.forget(topic)
        for cache in (self._looked, self._min_seen):
            for key in [k for k in cache if k[0] in self.deleted]:
                del cache[key]

    @classmethod
    def open(
        cls,
        store_dir: str | os.PathLike[str],
        settings: StoreSettings | None = None,
        *,
        max_offset_fn: MaxOffsetFn | None = None,
    ) -> StoreReader:
        """A reader with the store's own geometry (`Geometry.of`)."""
        s = settings or StoreSettings()
        return cls(
            store_dir,
            Geometry.of(store_dir, s),
            max_offset_fn=max_offset_fn,
            max_msgs_num_batch=s.max_msgs_num_batch,
        )

    def _valid_end(self) -> int:
        """Where valid records end: a walk (no CRC) over the last segment only."""
        last = self.log.queue.last()
        if last is None:
            return 0
        sc = self.log.scan(last.start_offset, check_crc=False, read_body=False)
        for _ in sc:
            pass
        return sc.end_offset

    def refresh(self) -> None:
        """Pick up new commit-log segments and index files; recompute the static limit."""
        self.log.queue.refresh()
        self.index.refresh()
        self._static_limit = -1
        self._looked.clear()

    def limit(self) -> int:
        """Records must end at or below this offset to be returned."""
        if self._max_offset_fn is not None:
            return self._max_offset_fn()
        if self._static_limit < 0:
            self._static_limit = self._valid_end()
        return self._static_limit

    def close(self) -> None:
        self.log.close()
        self.queues.close()
        self.index.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- single records ---------------------------------------------------------------

    def min_log_offset(self) -> int:
        return self.log.min_offset()

    def get_by_offset(self, physical_offset: int) -> DecodedRecord | None:
        """The message starting at `physical_offset`; None when there is none (or it is
        past the limit, or not a valid record, or its body fails its CRC, or a filler)."""
        rec = self._records([(physical_offset, 0)]).get(physical_offset)
        if rec is None or is_filler(rec):
            return None
        assert isinstance(rec, DecodedRecord)  # a copying read
        return compression.inflate(rec)

    def _records(
        self, spans: Sequence[tuple[int, int]], *, zero_copy: bool = False
    ) -> dict[int, RecordFields]:
        """`engine.scan_decode.read_records` of the log, up to the limit: fillers
        included, only valid records (CRC checked) that end at or below the limit."""
        return read_records(self.log.queue, spans, self.limit(), zero_copy=zero_copy)

    def get_by_msg_id(self, msg_id: str) -> DecodedRecord | None:
        """Through the physical offset inside the id (`engine.recordcodes.parse_msg_id`); the
        record's own id must match. Raises ValueError for a malformed id."""
        _addr, _port, offset = parse_msg_id(msg_id)
        rec = self.get_by_offset(offset)
        if rec is None or rec.msg_id != msg_id.upper():
            return None
        return rec

    def store_time_of(self, physical_offset: int, size: int = 0) -> int:
        """RocketMQ's pickupStoreTimestamp: the record's store time, -1 if gone."""
        if physical_offset < self.log.min_offset():
            return -1
        raw = self.log.read_bytes(physical_offset, 76)
        if len(raw) < 64:
            return -1
        sys_flag = struct.unpack_from(">i", raw, 36)[0]
        bh = 20 if sys_flag & SysFlag.BORNHOST_V6 else 8
        return int(struct.unpack_from(">q", raw, 48 + bh)[0])

    # --- consume queues ---------------------------------------------------------------

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        cq = self.queues.get(topic, queue_id)
        if cq is not None:
            cq.refresh()
        return cq

    def _visible_max(self, cq: ConsumeQueue, limit: int) -> int:
        """The queue's max offset, less the units at its end not yet readable (their
        message ends past the limit). Binary search: units' ends rise with the queue
        offset; a pre-blank takes the verdict of the nearest real unit before it."""
        lo, hi = cq.min_offset(), cq.max_offset()

        def readable(qo: int) -> bool:
            while qo >= lo:
                u = cq.get(qo)
                if u is None:
                    return True
                if not u.is_pre_blank:
                    return u.end <= limit
                qo -= 1
            return True

        if hi <= lo or readable(hi - 1):
            return hi
        a, b = lo, hi - 1  # the first unreadable queue offset lies in [a, b]
        while a < b:
            mid = (a + b) // 2
            if readable(mid):
                a = mid + 1
            else:
                b = mid
        return a

    def _correct_min(self, cq: ConsumeQueue) -> None:
        """Move the queue's min past units whose messages the log no longer holds; only
        when the log's first offset moved since the last look (it costs a file scan)."""
        log_min = max(self.log.min_offset(), 0)
        key = cq.key
        if self._min_seen.get(key) != log_min:
            cq.correct_min_offset(log_min)
            self._min_seen[key] = log_min

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._queue(topic, queue_id)
        if cq is None:
            return 0
        self._correct_min(cq)
        return cq.min_offset()

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._queue(topic, queue_id)
        return 0 if cq is None else self._visible_max(cq, self.limit())

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        tags: str | None = None,
        zero_copy: bool = False,
        into: tuple[object, object] | None = None,
    ) -> GetResult:
        """RocketMQ's getMessage (spec §8.17): up to `max_count` messages (and about
        `max_bytes`; at least one) from queue offset `offset`. `tags` ("a || b")
        filters on the unit's tag code, then on the record's TAGS. With `zero_copy` the
        messages are `RecordView`s (bodies are views of the mapped log: see its doc for
        how long they live), else `DecodedRecord`s; with `into` (owner, tag), lazy
        messages (`engine.pull`: a group consumer's, bodies not inflated). The units are walked in C
        (`engine.pull`), which decodes no record but those of the messages it takes."""
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        limit = self.limit()
        lo, hi = self._bounds(cq, limit)
        if hi == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, lo if lo == 0 else hi, lo, hi)
        scan = min(max(MIN_SCAN_UNITS, max_count), hi - offset)
        res = GetResult(GetStatus.NO_MATCHED_MESSAGE, offset, lo, hi)
        if not self._walk(cq, res, scan, limit, max_count, max_bytes, tags, zero_copy, into):
            per = cq.file_size_bytes // 20
            return GetResult(GetStatus.OFFSET_FOUND_NULL, offset + per - offset % per, lo, hi)
        if into is None:  # compressed bodies: their original bytes (lazy ones on demand)
            compression.inflate_all(res.messages)
        return res

    def _bounds(self, cq: ConsumeQueue, limit: int) -> tuple[int, int]:
        """The queue's min offset and its max offset under `limit` (`_visible_max`),
        after a refresh; with `limit_follows_dispatch`, the last answer again while the
        limit and the log's first offset stay where they were."""
        log_min = max(self.log.min_offset(), 0)
        looked = self._looked.get(cq.key)
        if looked is not None and looked[0] == limit and looked[1] == log_min:
            return looked[2], looked[3]
        cq.refresh()
        self._correct_min(cq)
        lo, hi = cq.min_offset(), self._visible_max(cq, limit)
        if self._limit_follows_dispatch:
            self._looked[cq.key] = (limit, log_min, lo, hi)
        return lo, hi

    def _walk(
        self,
        cq: ConsumeQueue,
        res: GetResult,
        scan: int,
        limit: int,
        max_count: int,
        max_bytes: int,
        tags: str | None,
        zero_copy: bool,
        into: tuple[object, object] | None = None,
    ) -> bool:
        """`engine.pull.pull_units` over up to `scan` units from `res.next_offset`, each
        consume-queue file's units in one call, into `res`; False when no unit could be
        read. The commit-log segment the records are in is mapped once per pull (again
        when the records run into the next segment)."""
        tf = TagFilter.of(tags)
        msgs = res.messages
        got, removing, read_any = 0, False, False
        log: SegmentSlice | None = None
        # from the unit before the first (when there is one): the walk checks each unit
        # against the one before it (`engine.pull`, step 1)
        first = res.next_offset
        before = 1 if first > res.min_offset else 0
        runs = cq.unit_runs(first - before, scan + before)
        try:
            for qo, units in runs:
                i, stop = max(0, first - qo), PullStop.NEED_LOG
                if i * 20 >= len(units):  # only the unit before: in the file before
                    continue
                read_any = True
                if log is None:  # map the first unit's segment now
                    log = self._log_slice(_PHYS.unpack_from(units, i * 20)[0], limit)
                while stop is PullStop.NEED_LOG:
                    view, base = (_NO_LOG, 0) if log is None else (log.view, log.physical_offset)
                    i, code, got, rem = pull_units(
                        units, i, view, base, limit, tf.codes, tf.wanted, max_count, max_bytes,
                        got, zero_copy, msgs, into,
                    )  # fmt: skip
                    removing |= rem
                    stop = PullStop(code)
                    if stop is PullStop.NEED_LOG:
                        if log is not None:
                            log.release()
                        log = self._log_slice(_PHYS.unpack_from(units, i * 20)[0], limit)
                        if log is None:  # no segment holds it: the message is gone
                            removing |= not msgs
                            i += 1
                res.next_offset = qo + i
                if stop is not PullStop.END:  # FULL, or UNWRITTEN: the queue ends there
                    break
        finally:
            runs.close()
            if log is not None:
                log.release()
        if msgs:
            res.status = GetStatus.FOUND
        elif removing:
            res.status = GetStatus.MESSAGE_WAS_REMOVING
        return read_any

    def _log_slice(self, physical_offset: int, limit: int) -> SegmentSlice | None:
        """The commit-log segment holding `physical_offset`, held and mapped up to the
        limit; None when no readable segment holds it."""
        if not 0 <= physical_offset < limit:
            return None
        seg = segment_of(self.log.queue, physical_offset)
        if seg is None:
            return None
        sl = seg.select(0, min(seg.read_position, limit - seg.start_offset))
        if sl.status is ReadStatus.OK and physical_offset < sl.physical_offset + len(sl.view):
            return sl
        sl.release()
        return None

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """RocketMQ's getOffsetInQueueByTime (see `ConsumeQueue.offset_for_time`)."""
        cq = self._queue(topic, queue_id)
        if cq is None:
            return 0
        return cq.offset_for_time(timestamp_ms, self.store_time_of, max(self.log.min_offset(), 0))

    # --- index ------------------------------------------------------------------------

    def query_by_key(
        self,
        topic: str,
        key: str,
        max_count: int = 32,
        begin_ms: int = 0,
        end_ms: int = MAX_TIMESTAMP_MS,
    ) -> list[DecodedRecord]:
        """RocketMQ's queryMessage (spec §4.5): up to 3 rounds through the index, offsets
        ascending, each round ending at the first found message's store time. Unlike
        RocketMQ, every record is re-checked to really carry the key (hash collisions)."""
        self.index.refresh()
        out: list[DecodedRecord] = []
        seen: set[int] = set()
        end = end_ms
        for _ in range(QUERY_ROUNDS):
            found = self.index.query_offsets(topic, key, max_count, begin_ms, end)
            offsets = sorted(set(found.phy_offsets) - seen)
            if not offsets:
                break
            first_ts = -1
            recs = self._records([(off, 0) for off in offsets])
            for off in offsets:
                seen.add(off)
                rec = recs.get(off)
                if rec is None:
                    continue
                if first_ts < 0:
                    first_ts = rec.store_timestamp
                gone = rec.physical_offset < self.deleted.get(topic, -1)  # deleted topic
                if record_has_key(rec, topic, key) and not is_filler(rec) and not gone:
                    assert isinstance(rec, DecodedRecord)  # a copying read
                    out.append(compression.inflate(rec))
            if out or first_ts < 0:
                break
            end = first_ts
            if end < begin_ms:
                break
        out.sort(key=lambda r: r.physical_offset)
        return out[:max_count]
