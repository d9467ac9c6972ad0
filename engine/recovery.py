"""Recovery at start: RocketMQ's load + recover (spec §8.15), in one call.

`recover_store(store_dir, settings)` brings a store that is not running back to a state
the runtime can serve from, and says what it did in a `RecoveryReport`:

1. Load the commit log (positions full), the checkpoint, every consume queue
   (`ConsumeQueue.recover`: last 3 files) and the index (after an abnormal exit, index
   files newer than the checkpoint's index timestamp are destroyed, as RocketMQ does).
2. Pick where to validate from:
   * **normal** (`abort` absent): the last 3 commit-log segments;
   * **abnormal** (`abort` present): walking back from the newest segment, the first
     whose first record is a message with a store time <= the checkpoint's min
     timestamp (min(physic, logics) - 3 s; with `message_index_safe` also the index
     timestamp); none (an all-zero checkpoint, say) -> the first segment.
3. Validate every record from there, CRC included (`check_crc_on_recover`), hopping
   BLANKs; valid data ends at the first zero, corrupt or torn record.
4. Cut the log there (`SegmentQueue.truncate_dirty`: later segments destroyed, the tail
   of the last zeroed), and fdatasync the validated segments.
5. Drop consume-queue units and index entries at or past the end.
6. Dispatch what the consume queues and index lack (`Dispatcher`): abnormal, from the
   validation start (re-dispatch is idempotent); normal, from the consume queues' max
   physical offset (RocketMQ's reput catch-up at start, usually nothing).
7. Correct every queue's min offset to the log's first offset, flush queues, index and
   checkpoint, and rebuild the queue-offset table (next queue offset per (topic, queue),
   `RecoveryReport.queue_offsets`) that the appender continues from.

`dry_run=True` opens everything read-only, validates and counts what would be cut and
dispatched, and writes nothing.

The caller holds the store lock (`ipc.locks.take_store_lock`); nothing else may have
the store open for writing. `abort` is left alone unless `clear_abort`. Raises
StoreIOError (and SegmentSizeError, IndexGeometryError for stores it cannot open).
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from conf.settings import StoreSettings
from engine import fileio
from engine.checkpoint import CheckpointFields, StoreCheckpoint
from engine.commitlog import CommitLog, ScanStop
from engine.consumequeue import ConsumeQueueStore
from engine.dispatch import Dispatcher, SkipPredicate
from engine.indexfile import IndexService
from engine.reader import Geometry
from engine.record import MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2, SysFlag, takes_queue_offset
from engine.segment import Segment, now_ms
from engine.segment_queue import SegmentQueue

ABORT_FILE: Final = "abort"
REPORT_FILE: Final = "recovery.json"
NORMAL_RECOVERY_FILES: Final = 3

Progress = Callable[[int, int], None]  # (bytes validated, bytes to validate)


@dataclass
class RecoveryReport:
    """What recovery found and did; `to_json()` is what `mqstore status` shows."""

    mode: str  # "normal" | "abnormal" | "empty"
    store_dir: str
    dry_run: bool = False
    start_file: str | None = None  # the segment validation started from
    start_offset: int = 0
    end_offset: int = 0  # where valid data ends = the log's new end
    stop: str = ""  # why validation stopped (ScanStop value)
    stop_reason: str = ""  # the corrupt record's fault, if any
    bytes_validated: int = 0
    records_validated: int = 0
    bytes_truncated: int = 0  # non-zero bytes cut past the end (incl. deleted segments)
    segments_deleted: int = 0
    dispatch_from: int = 0
    records_redispatched: int = 0  # consume-queue units written by the re-dispatch
    index_keys_redispatched: int = 0
    queues_truncated: dict[str, int] = field(default_factory=dict)  # "topic/qid" -> units
    index_entries_truncated: int = 0
    index_files_destroyed: list[str] = field(default_factory=list)
    queue_offsets: dict[str, int] = field(default_factory=dict)  # "topic/qid" -> next
    seconds: float = 0.0
    finished_at_ms: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RecoveryReport:
        data: dict[str, Any] = json.loads(text)
        return cls(**data)

    def queue_offset_table(self) -> dict[tuple[str, int], int]:
        """`queue_offsets` keyed as the runtime keys it: (topic, queue id)."""
        out: dict[tuple[str, int], int] = {}
        for k, v in self.queue_offsets.items():
            topic, _, qid = k.rpartition("/")
            out[(topic, int(qid))] = v
        return out

    def summary(self) -> str:
        return (
            f"{self.mode} recovery{' (dry run)' if self.dry_run else ''}: log ends at "
            f"{self.end_offset} ({self.stop}{': ' + self.stop_reason if self.stop_reason else ''}"
            f"), validated {self.records_validated} records / {self.bytes_validated} bytes "
            f"from {self.start_file or '-'}, truncated {self.bytes_truncated} bytes "
            f"({self.segments_deleted} segments), re-dispatched {self.records_redispatched} "
            f"records, {sum(self.queues_truncated.values())} queue units and "
            f"{self.index_entries_truncated} index entries cut, {self.seconds:.3f} s"
        )


def _qkey(key: tuple[str, int]) -> str:
    return f"{key[0]}/{key[1]}"


def write_report(store_dir: str | os.PathLike[str], report: RecoveryReport) -> None:
    """Keep the report as `<store>/recovery.json` (atomic replace)."""
    fileio.write_file_atomic(
        os.path.join(store_dir, REPORT_FILE), report.to_json().encode("utf-8"), mode=0o644
    )


def read_report(store_dir: str | os.PathLike[str]) -> RecoveryReport | None:
    """The last kept report, or None."""
    path = os.path.join(store_dir, REPORT_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return RecoveryReport.from_json(f.read())
    except (FileNotFoundError, ValueError, TypeError):
        return None


def first_record_matches(seg: Segment, cp: CheckpointFields, *, index_safe: bool) -> bool:
    """RocketMQ's isMappedFileMatchedRecover: the segment's first record is a message
    whose store time is non-zero and <= the checkpoint's min timestamp."""
    raw = seg.read_bytes(0, 76)
    if len(raw) < 76:
        return False
    magic = struct.unpack_from(">I", raw, 4)[0]
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        return False
    sys_flag = struct.unpack_from(">i", raw, 36)[0]
    bh = 20 if sys_flag & SysFlag.BORNHOST_V6 else 8
    ts = int(struct.unpack_from(">q", raw, 48 + bh)[0])
    if ts == 0:
        return False
    bound = cp.min_timestamp_index() if index_safe else cp.min_timestamp()
    return ts <= bound


def _nonzero_tail(seg: Segment, pos: int) -> int:
    """Bytes from `pos` to the last non-zero byte of the segment."""
    tail = seg.read_bytes(pos, seg.size_bytes - pos)
    return len(tail.rstrip(b"\0"))


def recover_store(
    store_dir: str | os.PathLike[str],
    settings: StoreSettings | None = None,
    *,
    geometry: Geometry | None = None,
    dry_run: bool = False,
    skip: SkipPredicate | None = None,
    progress: Progress | None = None,
    clear_abort: bool = False,
    clock_ms: Callable[[], int] | None = None,
) -> RecoveryReport:
    """Recover the store (see the module doc) and return the report. Raises
    StoreIOError, SegmentSizeError, IndexGeometryError."""
    t0 = time.perf_counter()
    s = settings or StoreSettings()
    d = os.fspath(store_dir)
    geo = geometry or Geometry.of(d, s)
    abnormal = os.path.exists(os.path.join(d, ABORT_FILE))
    ro = dry_run
    report = RecoveryReport("abnormal" if abnormal else "normal", d, dry_run=dry_run)
    log_dir = os.path.join(d, "commitlog")
    if ro and not os.path.isdir(log_dir):
        queue = SegmentQueue(log_dir, geo.segment_size_bytes, read_only=True)
    else:
        queue = SegmentQueue(log_dir, geo.segment_size_bytes, read_only=ro)
        queue.load()
    log = CommitLog(queue, max_message_size=s.max_message_size_bytes)
    cp_path = os.path.join(d, "checkpoint")
    cp: StoreCheckpoint | None = None
    if not ro or os.path.exists(cp_path):
        cp = StoreCheckpoint(cp_path, read_only=ro)
    cp_fields: CheckpointFields = cp if cp is not None else CheckpointFields()
    cqs = ConsumeQueueStore.open(d, geo.cq_file_size_bytes, read_only=ro)
    index = IndexService(
        d,
        geo.hash_slot_num,
        geo.index_num,
        read_only=ro,
        max_msgs_num_batch=s.max_msgs_num_batch,
        clock_ms=clock_ms or now_ms,
    )
    try:
        max_phy_cq = cqs.max_physical_offset() if ro else cqs.recover()
        report.index_files_destroyed = index.load(
            last_exit_ok=not abnormal, index_msg_timestamp=cp_fields.index_msg_timestamp
        )
        segs = queue.segments
        if not segs:
            report.mode = "empty" if not abnormal else "abnormal"
            _finish_empty(report, cqs, index, ro)
        else:
            if abnormal:
                start_i = 0
                for i in range(len(segs) - 1, -1, -1):
                    if first_record_matches(
                        segs[i],
                        cp_fields,
                        index_safe=s.message_index_enable and s.message_index_safe,
                    ):
                        start_i = i
                        break
            else:
                start_i = max(0, len(segs) - NORMAL_RECOVERY_FILES)
            start = segs[start_i]
            report.start_file = start.file_name
            report.start_offset = start.start_offset
            _validate(report, log, start.start_offset, s.check_crc_on_recover, progress)
            end = report.end_offset
            _cut_log(report, log, end, ro, start_i)
            # consume queues and index past the end
            if ro:
                for cq in cqs:
                    n = sum(
                        1
                        for _qo, u in cq.units(cq.min_offset(), 1 << 62)
                        if u.is_valid and not u.is_pre_blank and u.end > end
                    )
                    if n:
                        report.queues_truncated[_qkey(cq.key)] = n
            elif max_phy_cq > end or max_phy_cq < 0:
                report.queues_truncated = {_qkey(k): n for k, n in cqs.truncate_dirty(end).items()}
            if not ro:
                report.index_entries_truncated = index.truncate_dirty(end)
            # re-dispatch
            if abnormal:
                dispatch_from = start.start_offset
            else:
                dispatch_from = max(cqs.max_physical_offset(), log.min_offset(), 0)
                dispatch_from = min(dispatch_from, end)
            if index.min_destroyed_begin_phy is not None:
                dispatch_from = max(min(dispatch_from, index.min_destroyed_begin_phy), 0)
            report.dispatch_from = dispatch_from
            if ro:
                _count_missing(report, log, cqs, dispatch_from, end)
            else:
                disp = Dispatcher(log, cqs, index, skip=skip, checkpoint=cp_fields)
                res = disp.dispatch(dispatch_from, end)
                report.records_redispatched = res.units_written
                report.index_keys_redispatched = res.index_keys
                cqs.correct_min_offsets(max(log.min_offset(), 0))
                cqs.flush_all()
                index.flush()
                if cp is not None:
                    last_ts = _last_store_time(log, start.start_offset, end)
                    if last_ts > 0:
                        cp.physic_msg_timestamp = max(cp.physic_msg_timestamp, last_ts)
                        cp.logics_msg_timestamp = max(cp.logics_msg_timestamp, last_ts)
                    if index.files:
                        cp.index_msg_timestamp = max(
                            cp.index_msg_timestamp, index.files[-1].end_timestamp
                        )
                    cp.flush()
        report.queue_offsets = {_qkey(k): v for k, v in cqs.queue_offset_table().items()}
        if clear_abort and abnormal and not ro:
            fileio.unlink(os.path.join(d, ABORT_FILE), missing_ok=True)
            fileio.fsync_dir(d)
    finally:
        log.close()
        cqs.close()
        index.close()
        if cp is not None:
            cp.close()
    report.seconds = time.perf_counter() - t0
    report.finished_at_ms = time.time_ns() // 1_000_000
    return report


def _finish_empty(
    report: RecoveryReport, cqs: ConsumeQueueStore, index: IndexService, ro: bool
) -> None:
    """No commit-log segment: every queue and index entry points at nothing."""
    report.stop = ScanStop.END_OF_DATA.value
    if ro:
        for cq in cqs:
            if cq.max_offset() > cq.min_offset():
                report.queues_truncated[_qkey(cq.key)] = cq.max_offset() - cq.min_offset()
        return
    report.queues_truncated = {_qkey(k): n for k, n in cqs.truncate_dirty(0).items()}
    report.index_entries_truncated = index.truncate_dirty(0)


def _validate(
    report: RecoveryReport,
    log: CommitLog,
    start: int,
    check_crc: bool,
    progress: Progress | None,
) -> None:
    total = max(log.queue.max_offset() - start, 0)
    sc = log.scan(start, check_crc=check_crc)
    seg_size = log.queue.segment_size_bytes
    next_report = start + seg_size
    for rec in sc:
        if progress is not None and rec.offset >= next_report:
            progress(rec.offset - start, total)
            next_report = rec.offset - rec.offset % seg_size + seg_size
    report.end_offset = sc.end_offset
    report.stop = sc.stop.value
    report.stop_reason = sc.reason
    report.records_validated = sc.records
    report.bytes_validated = sc.end_offset - start
    if progress is not None:
        progress(sc.end_offset - start, total)


def _cut_log(report: RecoveryReport, log: CommitLog, end: int, ro: bool, start_i: int) -> None:
    q = log.queue
    truncated = 0
    deleted = 0
    for seg in q.segments:
        if seg.end_offset <= end:
            continue
        if seg.start_offset <= end:
            truncated += _nonzero_tail(seg, end - seg.start_offset)
        else:
            truncated += _nonzero_tail(seg, 0)
            deleted += 1
    report.bytes_truncated = truncated
    report.segments_deleted = deleted
    if ro:
        return
    q.truncate_dirty(end)
    q.committed_where = end
    q.flushed_where = end
    # the validated prefix is what we now promise: force it
    for seg in q.segments[start_i:]:
        w = seg.wrote_position
        seg.adopt_positions(w, w, 0)
        seg.flush_to(w, wrote_through_pwrite=True)


def _last_store_time(log: CommitLog, start: int, end: int) -> int:
    last = 0
    for rec in log.scan(start, check_crc=False, read_body=False, to_offset=end):
        last = rec.header.store_timestamp
    return last


def _count_missing(
    report: RecoveryReport, log: CommitLog, cqs: ConsumeQueueStore, start: int, end: int
) -> None:
    """Dry run: records whose consume-queue unit a re-dispatch would write."""
    n = 0
    for rec in log.scan(start, check_crc=False, read_body=False, to_offset=end):
        h = rec.header
        if not takes_queue_offset(h.sys_flag):
            continue
        cq = cqs.get(h.topic, h.queue_id)
        if cq is None or h.queue_offset >= cq.max_offset():
            n += 1
    report.records_redispatched = n


def is_abnormal(store_dir: str | os.PathLike[str]) -> bool:
    """`abort` present: the last run did not shut down cleanly."""
    return os.path.exists(os.path.join(store_dir, ABORT_FILE))
