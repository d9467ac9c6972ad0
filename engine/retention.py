"""Retention: which files the cleaner deletes, when, and what it reports (spec §8.14).

RocketMQ's CleanCommitLogService and CleanConsumeQueueService, as one policy over a
store directory. The rules:

* **When** (`decide`): a run deletes commit-log segments if the local hour is one of
  `delete_when` (RocketMQ's `deleteWhen`, "04" or "04;05"), or the disk is over
  `disk_max_used_space_ratio_pct` (or its usage is unknown), or a manual clean is
  pending (`mqstore clean --now`; RocketMQ's `executeDeleteFilesManually` counts 20
  runs). Over the force ratio with `clean_file_forcibly_enable`, the run is
  `clean_at_once`: oldest first whether expired or not.
* **What** (`select_expired`, and `SegmentQueue.delete_expired_by_time` which carries it
  out): every segment but the last, oldest first; one whose mtime is
  `file_reserved_time_hours` old (or any, when `clean_at_once`) goes; the first that is
  not expired stops the walk ("never delete in the middle"); at most
  `delete_file_batch_max` (10) per run, `delete_commitlog_files_interval_ms` apart.
* **Never** the segment being written (the last) nor any segment that does not end at
  or below `keep_from_offset`, which the caller sets to min(flushed, dispatched,
  checkpointed) (`keep_from`).
* **Held files**: a segment a reader still holds is made unavailable and destroyed by
  force once `destroy_mapped_file_interval_forcibly_ms` has passed (Segment's reference
  count); a first segment whose destroy hung is retried every
  `redelete_hanged_file_interval_ms`.
* **Consume queues and index** (`delete_consume_queue_files`, `delete_index_files`):
  once the log's minimum offset has grown, every file but the last of each
  `consumequeue/<topic>/<queueId>/` whose last entry points below it, and every index
  file but the last whose `endPhyOffset` is below it, oldest first, stopping at the
  first that is not. These work on the files directly (names, one pread each;
  `engine.consumequeue_files.expired_files` chooses a queue's files), so they need no
  open consume-queue objects.

Every deletion is logged with its reason and listed in a `CleanReport` (JSON for
`mqstore status`), with the bytes no consumer group had consumed when the committed
consumer offsets are given (`engine.offsets.load_consumer_offsets`).

Seams: the clock (`clock_ms`; the segment queue must share it, since segment expiry
and forced destroys read the queue's clock), the sleep between deletions, and the disk
guard's usage probe. Not thread-safe: the owner of the segment queue runs it.
"""

from __future__ import annotations

import enum
import logging
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import Any, Final

from mqstore.conf.settings import StoreSettings
from mqstore.engine import fileio
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue_files import expired_files, numbered_queue_dirs
from mqstore.engine.diskguard import DiskGuard, DiskVerdict
from mqstore.engine.offsets import ConsumedOffsets
from mqstore.engine.record import CheckStatus, check_record, takes_queue_offset
from mqstore.engine.segment import ClockMs, Segment, now_ms
from mqstore.engine.segment_files import numbered_files
from mqstore.engine.segment_queue import SegmentQueue, SleepMs

log = logging.getLogger(__name__)

HOUR_MS: Final = 3_600_000
MANUAL_DELETE_RUNS: Final = 20  # RocketMQ's executeDeleteFilesManually
INDEX_HEADER_SIZE_BYTES: Final = 40
INDEX_END_PHY_OFFSET_POS: Final = 24
INDEX_DESTROY_INTERVAL_MS: Final = 3000
_I64: Final = struct.Struct(">q")


def _sleep_ms(ms: int) -> None:
    time.sleep(ms / 1000)


# --- when --------------------------------------------------------------------------------


def is_delete_hour(now: int, delete_when: Sequence[int]) -> bool:
    """Whether the local hour of `now` (epoch ms) is one of `delete_when` (RocketMQ's
    `UtilAll.isItTimeToDo`, local time as Java's Calendar)."""
    return time.localtime(now / 1000).tm_hour in delete_when


@dataclass(frozen=True, slots=True)
class Trigger:
    """Why a run deletes commit-log segments, if it does."""

    time_up: bool  # the delete hour
    space_to_delete: bool  # disk over diskMaxUsedSpaceRatio (or unknown)
    manual: bool  # a manual clean is pending
    clean_at_once: bool  # over the force ratio, forced clean enabled

    @property
    def run(self) -> bool:
        return self.time_up or self.space_to_delete or self.manual

    def describe(self) -> str:
        parts = []
        if self.time_up:
            parts.append("delete hour")
        if self.space_to_delete:
            parts.append("disk over the max used ratio")
        if self.manual:
            parts.append("manual")
        if self.clean_at_once:
            parts.append("clean immediately")
        return ", ".join(parts) or "not triggered"

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(now: int, settings: StoreSettings, verdict: DiskVerdict, *, manual: bool) -> Trigger:
    """RocketMQ's deleteExpiredFiles trigger from the time, the disk and a manual request."""
    return Trigger(
        time_up=is_delete_hour(now, settings.delete_when),
        space_to_delete=verdict.space_to_delete,
        manual=manual,
        clean_at_once=settings.clean_file_forcibly_enable and verdict.clean_immediately,
    )


# --- what --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentFileInfo:
    """What the policy needs of one commit-log segment."""

    path: str
    start_offset: int
    size_bytes: int
    mtime_ms: int

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size_bytes

    @classmethod
    def of(cls, seg: Segment) -> SegmentFileInfo:
        return cls(seg.path, seg.start_offset, seg.size_bytes, seg.last_modified_ms())

    def deleted(
        self, reason: CleanReason, detail: str, unconsumed_bytes: int | None = None
    ) -> DeletedFile:
        """The report's entry for this segment, deleted."""
        return DeletedFile(
            "commitlog",
            self.path,
            self.size_bytes,
            reason,
            detail,
            self.start_offset,
            unconsumed_bytes,
        )


def select_expired(
    segments: Sequence[SegmentFileInfo],
    *,
    now: int,
    reserved_ms: int,
    clean_at_once: bool,
    keep_from_offset: int | None,
    max_files: int,
) -> list[SegmentFileInfo]:
    """The segments a run would delete, oldest first (pure; the rules in the module doc).

    `segments` is the whole chain, oldest first; the last is never chosen.
    """
    out: list[SegmentFileInfo] = []
    for seg in segments[:-1]:
        if keep_from_offset is not None and seg.end_offset > keep_from_offset:
            break
        if not (clean_at_once or now >= seg.mtime_ms + reserved_ms):
            break
        out.append(seg)
        if len(out) >= max_files:
            break
    return out


def keep_from(*offsets: int | None) -> int | None:
    """min of the known protecting offsets (flushed, dispatched, checkpointed); None if
    none is known."""
    known = [o for o in offsets if o is not None]
    return min(known) if known else None


def checkpointed_offset(queue: SegmentQueue, min_timestamp_ms: int) -> int:
    """Start of the segment abnormal recovery would begin with, given the checkpoint's
    `min_timestamp()` (RocketMQ's isMappedFileMatchedRecover: the last segment whose
    first record has a store timestamp in (0, min_timestamp]). Segments before it are
    not needed by recovery; with no match recovery starts at the first segment, so
    nothing is. Reads one record header per segment, newest first."""
    for seg in reversed(queue.segments):
        read = min(seg.read_position, seg.size_bytes)
        if read <= 0:
            continue
        with seg.select(0, read) as sl:
            if len(sl) == 0:
                continue
            h = check_record(sl.view, 0, check_crc=False, read_body=False)
        if h.status is CheckStatus.OK and 0 < h.store_timestamp <= min_timestamp_ms:
            return seg.start_offset
    return max(queue.min_offset(), 0)


# --- reporting ---------------------------------------------------------------------------


class CleanReason(enum.Enum):
    EXPIRED = "EXPIRED"  # older than fileReservedTime
    CLEAN_IMMEDIATELY = "CLEAN_IMMEDIATELY"  # not expired; disk over the force ratio
    HANGED_RETRY = "HANGED_RETRY"  # a held first segment, destroyed on retry
    BELOW_MIN_OFFSET = "BELOW_MIN_OFFSET"  # consume queue / index wholly below the log


@dataclass(frozen=True, slots=True)
class DeletedFile:
    kind: str  # "commitlog", "consumequeue" or "index"
    path: str
    size_bytes: int
    reason: CleanReason
    detail: str
    start_offset: int = -1
    unconsumed_bytes: int | None = None  # commit log only, when offsets were given

    def to_json_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reason": self.reason.value}


@dataclass
class CleanReport:
    """One run of the cleaner. JSON-serialisable (`to_json_dict`) for `mqstore status`."""

    started_ms: int
    finished_ms: int = 0
    trigger: Trigger | None = None
    disk: DiskVerdict | None = None
    disk_after: DiskVerdict | None = None  # re-checked when the run deleted something
    keep_from_offset: int | None = None
    min_offset_before: int = -1
    min_offset_after: int = -1
    deleted: list[DeletedFile] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # segments still held by a reader
    notes: list[str] = field(default_factory=list)

    @property
    def files_deleted(self) -> int:
        return len(self.deleted)

    @property
    def bytes_deleted(self) -> int:
        return sum(d.size_bytes for d in self.deleted)

    @property
    def unconsumed_bytes_deleted(self) -> int | None:
        """Message bytes deleted that no consumer group had consumed; None if unknown."""
        known = [d.unconsumed_bytes for d in self.deleted if d.kind == "commitlog"]
        if any(u is None for u in known):
            return None
        return sum(u for u in known if u is not None)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
            "trigger": self.trigger.to_json_dict() if self.trigger else None,
            "disk": self.disk.to_json_dict() if self.disk else None,
            "disk_after": self.disk_after.to_json_dict() if self.disk_after else None,
            "keep_from_offset": self.keep_from_offset,
            "min_offset_before": self.min_offset_before,
            "min_offset_after": self.min_offset_after,
            "files_deleted": self.files_deleted,
            "bytes_deleted": self.bytes_deleted,
            "unconsumed_bytes_deleted": self.unconsumed_bytes_deleted,
            "deleted": [d.to_json_dict() for d in self.deleted],
            "held": list(self.held),
            "notes": list(self.notes),
        }


def unconsumed_bytes(
    log_: CommitLog, start: int, end: int, consumed: ConsumedOffsets
) -> tuple[int, int]:
    """(bytes, records) of messages in `[start, end)` that no group had consumed: a
    record is consumed by a group whose next offset for its (topic, queue) is past the
    record's queue offset. Records that take no queue offset (PREPARED, ROLLBACK) are
    not counted. O(records): one header parse each."""
    best: dict[tuple[str, int], int] = {}
    for offsets in consumed.values():
        for key, nxt in offsets.items():
            if nxt > best.get(key, -1):
                best[key] = nxt
    total = 0
    records = 0
    for rec in log_.scan(start, check_crc=False, read_body=False, to_offset=end):
        h = rec.header
        if not takes_queue_offset(h.sys_flag):
            continue
        if best.get((h.topic, h.queue_id), 0) <= h.queue_offset:
            total += h.size
            records += 1
    return total, records


# --- consume queues and index, on the files -----------------------------------------------


def _pread_at(path: str, n: int, offset: int) -> bytes:
    fd = fileio.open_file(path, create=False, read_only=True)
    try:
        return fileio.pread(fd, n, offset, path)
    finally:
        fileio.close(fd, path)


def _delete_below(kind: str, path: str, size: int, detail: str, start: int = -1) -> DeletedFile:
    """Unlink a consume-queue or index file wholly below the log's minimum offset and
    log it; its entry for the report. Raises StoreIOError."""
    fileio.unlink(path, missing_ok=True)
    d = DeletedFile(kind, path, size, CleanReason.BELOW_MIN_OFFSET, detail, start)
    log.info("deleted %s (%d bytes): %s", path, size, d.detail)
    return d


def delete_consume_queue_files(
    store_dir: str | os.PathLike[str],
    min_offset: int,
    *,
    file_size_bytes: int,
    interval_ms: int = 0,
    sleep_ms: SleepMs = _sleep_ms,
) -> list[DeletedFile]:
    """RocketMQ's ConsumeQueue.deleteExpiredFile(minOffset) for every queue, on files.

    Per queue, every file but the last, oldest first: its last 20-byte unit is read;
    the file goes if that unit is written (size > 0) and points below `min_offset`;
    otherwise the queue's walk stops. A file that is not `file_size_bytes` long stops
    it too. Sleeps `interval_ms` after a queue that lost files. Raises StoreIOError.
    """
    deleted: list[DeletedFile] = []
    for _topic, _qid, qdir in numbered_queue_dirs(store_dir):
        try:
            expired = expired_files(qdir, min_offset, file_size_bytes)
            for path, size, phys in expired:
                why = f"last entry points at {phys}, below the log's minimum offset {min_offset}"
                start = int(os.path.basename(path))
                deleted.append(_delete_below("consumequeue", path, size, why, start))
            if expired:
                fileio.fsync_dir(qdir)
        except (FileNotFoundError, fileio.StoreIOError):
            if os.path.isdir(qdir):
                raise
            continue  # its topic was deleted meanwhile (`workers.topic_delete`)
        if expired and interval_ms > 0:
            sleep_ms(interval_ms)
    return deleted


def delete_index_files(store_dir: str | os.PathLike[str], min_offset: int) -> list[DeletedFile]:
    """RocketMQ's IndexService.deleteExpiredFile(minOffset), on files: every index file
    but the last whose header `endPhyOffset` is below `min_offset`, oldest first,
    stopping at the first that is not. Raises StoreIOError."""
    idir = os.path.join(os.fspath(store_dir), "index")
    deleted: list[DeletedFile] = []
    for path in numbered_files(idir, 17)[:-1]:
        raw = _pread_at(path, INDEX_HEADER_SIZE_BYTES, 0)
        if len(raw) < INDEX_HEADER_SIZE_BYTES:
            break
        end_phy = _I64.unpack_from(raw, INDEX_END_PHY_OFFSET_POS)[0]
        if end_phy >= min_offset:
            break
        why = f"endPhyOffset {end_phy} below the log's minimum offset {min_offset}"
        deleted.append(_delete_below("index", path, os.stat(path).st_size, why))
    if deleted:
        fileio.fsync_dir(idir)
    return deleted


# --- the run -----------------------------------------------------------------------------


@dataclass
class RetentionTotals:
    """Since the owner started: for `mqstore status`."""

    runs: int = 0
    files_deleted: int = 0
    bytes_deleted: int = 0
    unconsumed_bytes_deleted: int = 0
    unconsumed_unknown_runs: int = 0

    def add(self, r: CleanReport) -> None:
        self.runs += 1
        self.files_deleted += r.files_deleted
        self.bytes_deleted += r.bytes_deleted
        u = r.unconsumed_bytes_deleted
        if u is None:
            self.unconsumed_unknown_runs += 1
        else:
            self.unconsumed_bytes_deleted += u

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(eq=False)
class Retention:
    """Runs the rules over one store: a commit-log `SegmentQueue`, its disk guard, and the
    consume-queue and index files beside it. See the module doc.

    `queue` must use the same clock as `clock_ms`. `on_deleted` is called for every file
    deleted (after the unlink), e.g. to tell other processes; `on_progress` between the
    long steps of a run (a worker beats its heartbeat there).
    """

    store_dir: str | os.PathLike[str]
    queue: SegmentQueue
    guard: DiskGuard
    settings: StoreSettings
    _: KW_ONLY
    clock_ms: ClockMs = now_ms
    sleep_ms: SleepMs = _sleep_ms
    on_deleted: Callable[[DeletedFile], None] | None = None
    on_progress: Callable[[], None] | None = None
    totals: RetentionTotals = field(default_factory=RetentionTotals, init=False)
    last_report: CleanReport | None = field(default=None, init=False)
    _manual_left: int = field(default=0, init=False)
    _last_redelete_ms: int = field(default=0, init=False)
    _last_cq_min_offset: int = field(default=-1, init=False)

    def request_manual(self, runs: int = MANUAL_DELETE_RUNS) -> None:
        """Make the next `runs` runs delete regardless of the hour and the disk."""
        self._manual_left = max(self._manual_left, runs)

    def run_once(
        self,
        *,
        keep_from_offset: int | None,
        consumed: ConsumedOffsets | None = None,
        settings: StoreSettings | None = None,
    ) -> CleanReport:
        """One clean: check the disk, delete commit-log segments if triggered, retry a hung
        first segment, then consume-queue and index files below the log's new minimum.

        `keep_from_offset`: min(flushed, dispatched, checkpointed) (`keep_from`); None
        means no protection beyond the last segment (tests, a stopped store's tools).
        Raises StoreIOError.
        """
        if settings is not None:
            self.settings = settings
        s = self.settings
        now = self.clock_ms()
        report = CleanReport(started_ms=now, keep_from_offset=keep_from_offset)
        report.min_offset_before = self.queue.min_offset()
        verdict = self.guard.check(s)
        report.disk = verdict
        manual = self._manual_left > 0
        if manual:
            self._manual_left -= 1
        trigger = decide(now, s, verdict, manual=manual)
        report.trigger = trigger
        if trigger.run:
            self._delete_segments(report, trigger, keep_from_offset, consumed, s)
        else:
            report.notes.append("not triggered: not the delete hour, disk below the max ratio")
        now = self.clock_ms()
        if now - self._last_redelete_ms >= s.redelete_hanged_file_interval_ms:
            self._last_redelete_ms = now
            first = self.queue.first()
            if first is not None and not first.available:
                info = SegmentFileInfo.of(first)
                if self.queue.retry_delete_first(s.destroy_mapped_file_interval_forcibly_ms):
                    why = "held by a reader; destroyed on retry"
                    self._record(report, info.deleted(CleanReason.HANGED_RETRY, why))
        first = self.queue.first()
        if first is not None and not first.available:
            report.held.append(first.path)
        min_offset = self.queue.min_offset()
        report.min_offset_after = min_offset
        if min_offset > self._last_cq_min_offset and min_offset > 0:
            for d in delete_consume_queue_files(
                self.store_dir,
                min_offset,
                file_size_bytes=s.consume_queue_file_size_bytes,
                interval_ms=s.delete_consume_queue_files_interval_ms,
                sleep_ms=self.sleep_ms,
            ):
                self._record(report, d, logged=True)
            for d in delete_index_files(self.store_dir, min_offset):
                self._record(report, d, logged=True)
            self._last_cq_min_offset = min_offset
        if report.deleted:  # what the deletions freed counts now, not at the next check
            report.disk_after = self.guard.check(s)
        report.finished_ms = self.clock_ms()
        self.totals.add(report)
        self.last_report = report
        return report

    def _delete_segments(
        self,
        report: CleanReport,
        trigger: Trigger,
        keep_from_offset: int | None,
        consumed: ConsumedOffsets | None,
        s: StoreSettings,
    ) -> None:
        reserved_ms = s.file_reserved_time_hours * HOUR_MS
        segs = self.queue.segments
        infos = {seg.start_offset: SegmentFileInfo.of(seg) for seg in segs}
        now = self.clock_ms()
        predicted = select_expired(
            [infos[seg.start_offset] for seg in segs],
            now=now,
            reserved_ms=reserved_ms,
            clean_at_once=trigger.clean_at_once,
            keep_from_offset=keep_from_offset,
            max_files=s.delete_file_batch_max,
        )
        unconsumed: dict[int, int] = {}
        if consumed is not None and predicted:
            log_ = CommitLog(self.queue)
            for info in predicted:
                unconsumed[info.start_offset] = unconsumed_bytes(
                    log_, info.start_offset, info.end_offset, consumed
                )[0]
                if self.on_progress is not None:
                    self.on_progress()
        before = {seg.start_offset for seg in segs}
        self.queue.delete_expired_by_time(
            reserved_ms,
            delete_files_interval_ms=s.delete_commitlog_files_interval_ms,
            interval_forcibly_ms=s.destroy_mapped_file_interval_forcibly_ms,
            clean_immediately=trigger.clean_at_once,
            max_files=s.delete_file_batch_max,
            sleep_ms=self.sleep_ms,
            keep_from_offset=keep_from_offset,
        )
        after = {seg.start_offset for seg in self.queue.segments}
        for start in sorted(before - after):
            info = infos[start]
            expired = now >= info.mtime_ms + reserved_ms
            reason = CleanReason.EXPIRED if expired else CleanReason.CLEAN_IMMEDIATELY
            age_h = (now - info.mtime_ms) / HOUR_MS
            detail = (
                f"last written {age_h:.1f} h ago (reserved {s.file_reserved_time_hours} h); "
                f"trigger: {trigger.describe()}"
            )
            if report.disk is not None and trigger.clean_at_once:
                detail += f"; {report.disk.reason}"
            left = unconsumed.get(start) if consumed is not None else None
            self._record(report, info.deleted(reason, detail, left))
        if not predicted and segs:
            if keep_from_offset is not None and segs[0].start_offset + segs[0].size_bytes > (
                keep_from_offset
            ):
                report.notes.append(
                    f"the oldest segment ends past {keep_from_offset} "
                    "(not yet flushed, dispatched or checkpointed)"
                )
            elif len(segs) <= 1:
                report.notes.append("only the segment being written is left")
            else:
                report.notes.append("the oldest segment has not expired")

    def _record(self, report: CleanReport, d: DeletedFile, *, logged: bool = False) -> None:
        if not logged:
            log.info(
                "deleted %s (%d bytes, %s): %s", d.path, d.size_bytes, d.reason.value, d.detail
            )
        report.deleted.append(d)
        if self.on_deleted is not None:
            self.on_deleted(d)
