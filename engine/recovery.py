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
   of the last zeroed; nothing is written when the tail is zeros already), and
   fdatasync the validated segments.
5. Drop consume-queue units and index entries at or past the end (after 6: units of
   records below the end are never touched by it).
6. Dispatch what the consume queues and index lack, during the same validating pass
   (`Dispatcher.dispatch_record`; a record is parsed in full only when a queue or the
   index lacks it): abnormal, from the validation start (RocketMQ), or from the queues'
   max physical offset when that is earlier; normal, from the queues' max physical
   offset (RocketMQ's reput catch-up at start, usually nothing).
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

import bisect
import contextlib
import itertools
import json
import operator
import os
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from mqstore.conf.settings import StoreSettings
from mqstore.engine import fileio
from mqstore.engine.checkpoint import CheckpointFields, StoreCheckpoint
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue import ConsumeQueue, QueueKey
from mqstore.engine.consumequeue_files import cq_file_size, queue_dirs, zero_tail
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher, DispatchResult, DispatchStop
from mqstore.engine.indexfile import IndexService
from mqstore.engine.logwalk import ScanStop
from mqstore.engine.reader import Geometry
from mqstore.engine.record import (
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    SysFlag,
    check_record,
    takes_queue_offset,
)
from mqstore.engine.scan import RecordScan, scan_records
from mqstore.engine.scan import ScanStop as RecordStop
from mqstore.engine.segment import ReadStatus, Segment, now_ms
from mqstore.engine.segment_queue import SegmentQueue
from mqstore.engine.verify import LogBounds, queue_last_ends, verify_units

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
    segments_extended: list[str] = field(default_factory=list)  # short files, zero-filled
    dispatch_from: int = 0
    records_redispatched: int = 0  # consume-queue units written by the re-dispatch
    index_keys_redispatched: int = 0
    queues_truncated: dict[str, int] = field(default_factory=dict)  # "topic/qid" -> units
    index_entries_truncated: int = 0
    index_files_destroyed: list[str] = field(default_factory=list)
    queue_offsets: dict[str, int] = field(default_factory=dict)  # "topic/qid" -> next
    # consume queues found damaged (a unit that does not match the log, a hole, a file cut
    # short) and rebuilt from the log: "topic/qid" -> the first bad queue offset
    queues_rebuilt: dict[str, int] = field(default_factory=dict)
    queue_files_extended: list[str] = field(default_factory=list)  # short, zero-filled
    # why re-dispatch stopped early ("" if it did not): a full disk had no room for a new
    # consume-queue file; the dispatcher process goes on from there once there is
    dispatch_deferred: str = ""
    seconds: float = 0.0
    finished_at_ms: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RecoveryReport:
        data: dict[str, Any] = json.loads(text)
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

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
            f"{self.index_entries_truncated} index entries cut, "
            + (
                f"{len(self.queues_rebuilt)} damaged consume queues rebuilt, "
                if self.queues_rebuilt
                else ""
            )
            + (f"{self.dispatch_deferred}, " if self.dispatch_deferred else "")
            + f"{self.seconds:.3f} s"
        )


def _qkey(key: tuple[str, int]) -> str:
    return f"{key[0]}/{key[1]}"


def write_report(store_dir: str | os.PathLike[str], report: RecoveryReport) -> None:
    """Keep the report as `<store>/recovery.json` (atomic replace)."""
    fileio.write_file_atomic(os.path.join(store_dir, REPORT_FILE), report.to_json().encode("utf-8"))


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


def _extend_short_files(directory: str, file_size: int) -> list[str]:
    """Zero-extend every file of a segment directory shorter than `file_size` (a torn
    copy, a file system that lost a tail, damage), but an empty last one (the loader
    deletes that), so the files load and validation finds the damage as zeros. Segment
    files are always full-size in mqstore and RocketMQ. Returns the names extended."""
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if len(n) == 20 and n.isdigit())
    out: list[str] = []
    for i, name in enumerate(names):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        size = os.stat(path).st_size
        if size >= file_size or (size == 0 and i == len(names) - 1):
            continue
        fd = fileio.open_file(path, create=False)
        try:
            fileio.ftruncate(fd, file_size, path)
            fileio.fsync(fd, path)
        finally:
            fileio.close(fd, path)
        out.append(name)
    return out


def _extend_short_queue_files(store_dir: str, file_size: int) -> list[str]:
    """`_extend_short_files` over every consume-queue directory; "topic/qid/file" names."""
    return [
        f"{topic}/{qid}/{name}"
        for topic, qid, qdir in queue_dirs(store_dir)
        for name in _extend_short_files(qdir, file_size)
    ]


def _verify_queues(
    cqs: ConsumeQueueStore,
    log: CommitLog,
    log_end: int,
    *,
    headers_from: int,
    all_files: bool,
) -> dict[QueueKey, tuple[int, int]]:
    """Find each consume queue's first unit that cannot be right, and cut the queue there.

    The rules are `engine.verify`'s (in C): units (pre-blanks aside) must be valid, point
    at or past the log's first offset and past the previous unit's end, and end by
    `log_end`; units at commit-log offsets >= `headers_from` are also compared with the
    record they point at (its size, magic, queue id, queue offset and physical offset).
    `all_files`: every unit of the queue, else those from the first pointing at or past
    `headers_from` (found by binary search: the units of the segments validated, so a
    normal recovery's cost does not grow with the store). Returns, per queue cut, (the
    first bad queue offset, the commit-log offset to re-dispatch from). O(units checked),
    tens of ns a unit; one held slice per commit-log segment from `headers_from` on."""
    out: dict[QueueKey, tuple[int, int]] = {}
    log_min = max(log.min_offset(), 0)
    with contextlib.ExitStack() as stack:
        bounds = _log_bounds(stack, log, log_min, log_end, headers_from)
        for cq in cqs:
            lo, hi = cq.min_offset(), cq.max_offset()
            if not all_files:
                lo = _first_unit_from(cq, lo, hi, headers_from)
            prev_end, bad_qo = -1, -1
            with contextlib.closing(cq.unit_runs(lo, hi - lo)) as runs:
                for qo, view in runs:
                    bad_qo, prev_end = verify_units(view, qo, cq.queue_id, prev_end, bounds)
                    if bad_qo >= 0:
                        break
            if bad_qo >= 0:
                cq.cut_at(bad_qo)
                out[cq.key] = (bad_qo, max(prev_end, log_min))
    return out


def _log_bounds(
    stack: contextlib.ExitStack, log: CommitLog, log_min: int, log_end: int, headers_from: int
) -> LogBounds:
    """The check's view of the log: a slice (held on `stack`) of every segment from the
    one holding max(headers_from, log_min) on, None for a segment that cannot be read."""
    size = log.queue.segment_size_bytes
    first = max(headers_from, log_min)
    base = first - first % size
    segments: list[memoryview | None] = []
    for seg in log.queue.segments:
        if seg.start_offset < base or seg.start_offset % size:
            continue
        k = (seg.start_offset - base) // size
        segments.extend([None] * (k + 1 - len(segments)))
        sl = stack.enter_context(seg.select(0, seg.read_position))
        segments[k] = sl.view if sl.status is ReadStatus.OK else None
    return LogBounds(log_min, log_end, headers_from, segments, base, size)


def _first_unit_from(cq: ConsumeQueue, lo: int, hi: int, phy: int) -> int:
    """The first queue offset in [lo, hi) whose unit points at or past `phy`, by binary
    search (pre-blanks count as before it: a search may start a few units late)."""
    while lo < hi:
        mid = (lo + hi) // 2
        u = cq.get(mid)
        if u is not None and u.is_valid and not u.is_pre_blank and u.physical_offset >= phy:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _nonzero_tail(seg: Segment, pos: int) -> int:
    """Bytes from `pos` to the last non-zero byte of the segment, up to its read
    position (0 when it cannot be read). Walked in C over the mapping, from the end
    (`zero_tail`: no copy; an all-zero tail costs a read of memory, a few ms for 64 MiB)."""
    read = min(seg.read_position, seg.size_bytes)
    if pos >= read:
        return 0
    with seg.select(pos, read - pos) as sl:
        if sl.status is not ReadStatus.OK:
            return 0
        return zero_tail(sl.view, 0)


def recover_store(
    store_dir: str | os.PathLike[str],
    settings: StoreSettings | None = None,
    *,
    geometry: Geometry | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    clear_abort: bool = False,
    clock_ms: Callable[[], int] | None = None,
    abnormal: bool | None = None,
) -> RecoveryReport:
    """Recover the store (see the module doc) and return the report.

    `abnormal` overrides the `abort` test (a supervisor that writes `abort` at boot
    passes what it found before writing it); `progress(done, total)` is called per
    segment. Fillers are re-dispatched as the dispatcher does (`engine.filler`). Raises
    StoreIOError, SegmentSizeError, IndexGeometryError.
    """
    t0 = time.perf_counter()
    s = settings or StoreSettings()
    d = os.fspath(store_dir)
    geo = geometry or Geometry.of(d, s)
    if abnormal is None:  # a supervisor that already wrote its own `abort` says so
        abnormal = os.path.exists(os.path.join(d, ABORT_FILE))
    ro = dry_run
    report = RecoveryReport("abnormal" if abnormal else "normal", d, dry_run=dry_run)
    log_dir = os.path.join(d, "commitlog")
    if not ro:
        report.segments_extended = _extend_short_files(log_dir, geo.segment_size_bytes)
        report.queue_files_extended = _extend_short_queue_files(
            d, cq_file_size(geo.cq_file_size_bytes)
        )
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
    cqs = ConsumeQueueStore(d, geo.cq_file_size_bytes, read_only=ro).load()
    index = IndexService(
        d,
        geo.hash_slot_num,
        geo.index_num,
        read_only=ro,
        max_msgs_num_batch=s.max_msgs_num_batch,
        clock_ms=clock_ms or now_ms,
    )
    disp: Dispatcher | None = None
    try:
        max_phy_cq = cqs.max_physical_offset() if ro else cqs.recover()
        report.index_files_destroyed = index.load(
            last_exit_ok=not abnormal, index_msg_timestamp=cp_fields.index_msg_timestamp
        )
        # A full index file is forced when the next one is made, and only then does the
        # checkpoint's index timestamp reach its end (IndexService._last_file, on_roll);
        # after a clean stop the dispatcher's drain forced them all besides. So a normal
        # recovery leaves alone the full files the checkpoint covers, rather than pay an
        # fsync per index file of the store; the newest, any not covered and any it
        # writes are forced. After a crash all are.
        cp_index_ts = cp_fields.index_msg_timestamp
        settled = (
            []
            if abnormal or cp_index_ts <= 0
            else [f for f in index.files[:-1] if 0 < f.end_timestamp <= cp_index_ts]
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
            # a file that was cut short lost data: validate from it (or earlier), so the
            # log is cut where its zeros begin and nothing after it is trusted
            names = [sg.file_name for sg in segs]
            for name in report.segments_extended:
                if name in names:
                    start_i = min(start_i, names.index(name))
            start = segs[start_i]
            report.start_file = start.file_name
            report.start_offset = start.start_offset
            if abnormal:
                # RocketMQ trusts the checkpoint; queues lagging behind it are caught up too
                caught_up = max(cqs.max_physical_offset(), log.min_offset(), 0)
                dispatch_from = min(start.start_offset, caught_up)
            else:
                dispatch_from = max(cqs.max_physical_offset(), log.min_offset(), 0)
            if index.min_destroyed_begin_phy is not None:
                dispatch_from = max(min(dispatch_from, index.min_destroyed_begin_phy), 0)
            # a queue with a file cut short ends early (its recover() stopped at the
            # zeros): re-dispatch from its last unit, before anything fills the gap
            for name in report.queue_files_extended:
                topic, qid, _f = name.split("/")
                cq = cqs.get(topic, int(qid))
                if cq is not None:
                    report.queues_rebuilt[_qkey(cq.key)] = cq.max_offset()
                    redo = cq.max_physical_offset
                    dispatch_from = min(dispatch_from, max(redo, log.min_offset(), 0))
            build = index if s.message_index_enable else None
            if not ro:
                disp = Dispatcher(log, cqs, build, checkpoint=cp_fields)
            if disp is not None:
                disp.defer_on_no_space = True  # boot needs no new space: see Dispatcher
            res = DispatchResult(dispatch_from, dispatch_from, DispatchStop.END_OF_DATA)
            if disp is not None and dispatch_from < start.start_offset:
                pre = disp.dispatch(dispatch_from, start.start_offset)
                res.units_written, res.index_keys = pre.units_written, pre.index_keys
            walk = _Walk(log, cqs, index, disp, res, dispatch_from, s.check_crc_on_recover)
            walk.run(report, start.start_offset, progress)
            end = report.end_offset
            report.dispatch_from = min(dispatch_from, end)
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
                _count_missing(report, log, cqs, report.dispatch_from, end)
            else:
                if max_phy_cq > end or max_phy_cq < 0 or cqs.max_physical_offset() > end:
                    report.queues_truncated = {
                        _qkey(k): n for k, n in cqs.truncate_dirty(end).items()
                    }
                report.index_entries_truncated = index.truncate_dirty(end)
                if disp is not None:
                    # damaged consume queues are cut at their first bad unit and rebuilt
                    # from the log: after a crash every unit is compared with its record,
                    # after a clean stop those in the segments validated (the rest are
                    # checked for order and range only)
                    cut = _verify_queues(
                        cqs,
                        log,
                        end,
                        headers_from=0 if abnormal else start.start_offset,
                        all_files=abnormal,
                    )
                    for key, (bad_qo, _redo) in cut.items():
                        report.queues_rebuilt[_qkey(key)] = bad_qo
                    redos = [r for _qo, r in cut.values()]
                    # a unit past the end may be a damaged unit of a record below it (the
                    # walk found the queue holding that offset): catch truncated queues up
                    for qk in report.queues_truncated:
                        topic, _, qid = qk.rpartition("/")
                        tq = cqs.get(topic, int(qid))
                        if tq is not None:
                            redos.append(max(tq.max_physical_offset, log.min_offset(), 0))
                    redos = [r for r in redos if r < end]
                    if redos:
                        redo = min(redos)
                        more = disp.dispatch(redo, end)
                        res.units_written += more.units_written
                        res.index_keys += more.index_keys
                        report.dispatch_from = min(report.dispatch_from, redo)
                report.dispatch_deferred = disp.deferred if disp is not None else ""
                report.records_redispatched = res.units_written
                report.index_keys_redispatched = res.index_keys
                cqs.correct_min_offsets(max(log.min_offset(), 0))
                cqs.flush_all()
                skip = {id(f) for f in settled}  # `settled` keeps them alive: ids stay theirs
                for f in index.files:
                    if id(f) not in skip:
                        f.flush()
                if cp is not None:
                    last_ts = walk.last_store_timestamp
                    if last_ts > 0:
                        # Everything validated is on disk (fsynced above) and the queues
                        # hold it: the checkpoint says exactly that, no more (data cut, or
                        # a damaged checkpoint claiming the future) and no less.
                        cp.physic_msg_timestamp = last_ts
                        cp.logics_msg_timestamp = last_ts
                    if index.files:
                        cp.index_msg_timestamp = index.files[-1].end_timestamp
                    cp.flush()
        table = cqs.queue_offset_table()
        if disp is not None:
            for k, v in disp.deferred_next.items():
                table[k] = max(table.get(k, 0), v)
        report.queue_offsets = {_qkey(k): v for k, v in table.items()}
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


_CHUNK: Final = 8192  # records per scanner call: bounded columns, the GIL free meanwhile


class _Walk:
    """Recovery's validating walk: RocketMQ's checkMessageAndReturnSize with the CRC, in
    one pass that also dispatches what the consume queues and index lack.

    The records are checked by the record scanner (`engine.scan`, in C: the same verdicts
    and reasons as `engine.record.check_record`), a chunk at a time. A record is parsed
    in full only when a queue or the index lacks it. Stops as `CommitLog.scan` does
    (zeros, corrupt record, BLANK in the last segment).
    """

    def __init__(
        self,
        log: CommitLog,
        cqs: ConsumeQueueStore,
        index: IndexService,
        disp: Dispatcher | None,
        res: DispatchResult,
        dispatch_from: int,
        check_crc: bool,
    ) -> None:
        self.log = log
        self.cqs = cqs
        self.index = index
        self.disp = disp
        self.res = res
        self.dispatch_from = dispatch_from
        self.check_crc = check_crc
        self.last_store_timestamp = 0
        self._cq_cache: dict[tuple[bytes, int], ConsumeQueue] = {}
        self._index_end = self._read_index_end()

    def run(self, report: RecoveryReport, start: int, progress: Progress | None) -> None:
        q = self.log.queue
        total = max(q.max_offset() - start, 0)
        records = 0
        end, stop, reason = start, ScanStop.END_OF_DATA, ""
        seg = q.find(start)
        pos = 0 if seg is None else start - seg.start_offset
        while seg is not None:
            read = seg.read_position
            nxt = q.find(seg.start_offset + seg.size_bytes)
            with seg.select(0, read) as sl:
                if sl.status is not ReadStatus.OK:
                    end, stop, reason = seg.start_offset + pos, ScanStop.CORRUPT, sl.status.value
                    break
                pos, n, stop, reason = self._segment(
                    sl.view, seg.start_offset, pos, read, seg.size_bytes
                )
                records += n
            end = seg.start_offset + pos
            if progress is not None:
                progress(end - start, total)
            if stop is ScanStop.LIMIT:  # hop to the next segment
                if nxt is None:
                    stop = ScanStop.BLANK_IN_LAST_SEGMENT if pos < read else ScanStop.END_OF_DATA
                    break
                seg, pos = nxt, 0
                continue
            break
        report.end_offset = end
        report.stop = stop.value
        report.stop_reason = reason
        report.records_validated = records
        report.bytes_validated = end - start

    def _segment(
        self, view: memoryview, base: int, pos: int, read: int, size: int
    ) -> tuple[int, int, ScanStop, str]:
        """Walk one segment from `pos`. Returns (pos where it stopped, records, why,
        reason); LIMIT here means "go on in the next segment" (a BLANK or the end of a
        full segment)."""
        n = 0
        while pos < read:
            scan = scan_records(view, pos, read, check_crc=self.check_crc, max_records=_CHUNK)
            if scan.count:
                n += scan.count
                self.last_store_timestamp = scan.store_timestamp[scan.count - 1]
                if self.disp is not None:
                    self._dispatch(view, base, read, scan)
            pos = scan.stop_pos
            if scan.stop is RecordStop.BLANK:
                return pos, n, ScanStop.LIMIT, ""
            if scan.stop is RecordStop.CORRUPT:
                head = bytes(view[pos : pos + 8])
                if head == bytes(len(head)):
                    return pos, n, ScanStop.END_OF_DATA, ""
                return pos, n, ScanStop.CORRUPT, scan.reason
        return pos, n, ScanStop.LIMIT if pos >= size else ScanStop.END_OF_DATA, ""

    def _dispatch(self, view: memoryview, base: int, read: int, scan: RecordScan) -> None:
        """Dispatch the scanned records at or past `dispatch_from` that the queue or the
        index lacks (a record whose queue unit and index keys are there is skipped)."""
        start = bisect.bisect_left(scan.pos, self.dispatch_from - base)
        if start < scan.count and not self._all_held(view, base, scan, start):
            self._dispatch_each(view, base, read, scan, start)

    def _all_held(self, view: memoryview, base: int, scan: RecordScan, start: int) -> bool:
        """True when the queues and the index hold every record from `start` on: decided
        per queue (its last record in the chunk, found in C) and from the index's end.
        False sends the chunk record by record (`_dispatch_each`)."""
        end_phy, has_end = self._index_end
        first = max(bisect.bisect_left(scan.pos, end_phy - base), start)
        if first < scan.count and has_end and base + scan.pos[first] == end_phy:
            first += 1  # the record at the index's end is indexed
        if first < scan.count and scan.key_first[scan.count] > scan.key_first[first]:
            return False  # a record past the index's end has keys
        if any(map(operator.and_, scan.sys_flag[start:], itertools.repeat(0x4))):
            return False  # PREPARED / ROLLBACK records: see record by record
        last_end = queue_last_ends(view, scan, start)  # per queue: its last record's end
        return all(base + end <= self._queue_end(key) for key, end in last_end.items())

    def _dispatch_each(
        self, view: memoryview, base: int, read: int, scan: RecordScan, start: int
    ) -> None:
        """`_dispatch`, record by record from `start`."""
        assert self.disp is not None
        pos, size, queue_id, sys_flag = scan.pos, scan.size, scan.queue_id, scan.sys_flag
        topic_pos, topic_len, key_first = scan.topic_pos, scan.topic_len, scan.key_first
        ends: dict[tuple[bytes, int], int] = {}  # queue -> its max physical offset, -1 none
        for i in range(start, scan.count):
            offset = base + pos[i]
            need = False
            if not sys_flag[i] & 0x4:  # takes a queue offset (NOT, COMMIT)
                tp = topic_pos[i]
                key = (view[tp : tp + topic_len[i]].tobytes(), queue_id[i])
                cq_end = ends.get(key)
                if cq_end is None:
                    cq_end = ends[key] = self._queue_end(key)
                need = offset + size[i] > cq_end
            if not need and key_first[i + 1] > key_first[i]:  # has index keys
                end_phy, has_end = self._index_end
                need = not (offset < end_phy or (offset == end_phy and has_end))
            if need:
                h = check_record(view, pos[i], check_crc=False, read_body=False, limit=read)
                self.disp.dispatch_record(offset, h, self.res)
                self._index_end = self._read_index_end()
                ends.clear()

    def _queue_end(self, key: tuple[bytes, int]) -> int:
        """The max physical offset of the queue of (topic bytes, queue id); -1 if none."""
        cq = self._cq_cache.get(key)
        if cq is None:
            cq = self.cqs.get(key[0].decode("utf-8", errors="replace"), key[1])
            if cq is None:
                return -1
            self._cq_cache[key] = cq
        return cq.max_physical_offset

    def _read_index_end(self) -> tuple[int, bool]:
        if self.disp is None or self.disp.index is None:
            return 1 << 62, True  # no index to build: everything counts as indexed
        files = self.index.files
        if not files:
            return -1, False
        f = files[-1]
        return f.end_phy_offset, f.end_timestamp > 0


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
    holder = q.find(end)
    if truncated == 0 and deleted == 0:
        # nothing but zeros past the end: set positions, write nothing
        if holder is not None:
            pos = end - holder.start_offset
            holder.adopt_positions(pos, pos, min(holder.flushed_position, pos))
    else:
        q.truncate_dirty(end)
    q.committed_where = end
    q.flushed_where = end
    # the validated prefix is what we now promise: force it
    for seg in q.segments[start_i:]:
        w = seg.wrote_position
        seg.adopt_positions(w, w, 0)
        seg.flush_to(w, wrote_through_pwrite=True)


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
