"""Recovery at start: RocketMQ's load + recover (spec §8.15), as plan -> validate -> apply.

`recover_store(store_dir, settings)` brings a store that is not running back to a state
the runtime can serve from, and says what it did in a `RecoveryReport`:

0. **Load**: files cut short are zero-filled first (so they load, and validation finds
   the damage as zeros); then `load_store` opens the commit log (positions full), the
   checkpoint, every consume queue (`ConsumeQueue.recover`: last 3 files) and the index
   (after an abnormal exit, index files newer than the checkpoint's index timestamp are
   destroyed, as RocketMQ does).
1. **Plan** (`plan_recovery`, a pure choice, `RecoveryPlan`): where to validate from:
   * **normal** (`abort` absent): the last 3 commit-log segments;
   * **abnormal** (`abort` present): walking back from the newest segment, the first
     whose first record is a message with a store time <= the checkpoint's min
     timestamp (min(physic, logics) - 3 s; with `message_index_safe` also the index
     timestamp); none (an all-zero checkpoint, say) -> the first segment;
   and (either) from a segment that was cut short, or earlier. Where re-dispatch may
   start: abnormal, from the validation start (RocketMQ), or from the queues' max
   physical offset when that is earlier; normal, from the queues' max physical offset
   (RocketMQ's reput catch-up at start, usually nothing); earlier for destroyed index
   files and queues with a file cut short.
2. **Validate** (`validate`, writes nothing, `Cuts`): every record from there, CRC
   included (`check_crc_on_recover`), hopping BLANKs; valid data ends at the first zero,
   corrupt or torn record. The same pass finds the first record a consume queue or the
   index lacks (`engine.redispatch`), and what lies past the end.
3. **Apply** (`apply`): dispatch what the queues and index lack (`engine.redispatch`;
   a record is parsed in full only then); cut the log at the end
   (`SegmentQueue.truncate_dirty`: later segments destroyed, the tail of the last zeroed;
   nothing is written when the tail is zeros already) and fdatasync the validated
   segments; drop consume-queue units and index entries at or past the end; cut damaged
   consume queues at their first bad unit and re-dispatch them (`verify.verify_queues`);
   correct every queue's min offset to the log's first offset; flush queues, index and
   checkpoint. The queue-offset table (next queue offset per (topic, queue),
   `RecoveryReport.queue_offsets`) is what the appender continues from.

`dry_run=True` is load (read-only) + plan + validate, and counts what apply would cut
and re-dispatch; it writes nothing.

The caller holds the store lock (`ipc.locks.take_store_lock`); nothing else may have
the store open for writing. `abort` is left alone unless `clear_abort`. Raises
StoreIOError (and SegmentSizeError, IndexGeometryError for stores it cannot open).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from mqstore.conf.settings import StoreSettings, parse_delay_levels
from mqstore.engine import fileio
from mqstore.engine.checkpoint import CheckpointFields, StoreCheckpoint
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue import QueueKey
from mqstore.engine.consumequeue_files import cq_file_size, queue_dirs, zero_tail
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher, DispatchResult, DispatchStop
from mqstore.engine.indexservice import IndexService
from mqstore.engine.logwalk import ChunkScan, ScanStop
from mqstore.engine.reader import Geometry
from mqstore.engine.record import (
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    SysFlag,
    takes_queue_offset,
)
from mqstore.engine.recordcodes import DELAY_LEVEL_MS
from mqstore.engine.recovery_progress import VALIDATING, Progress, Step
from mqstore.engine.redispatch import Holdings, first_lacking, redispatch
from mqstore.engine.segment import ClockMs, ReadStatus, Segment, now_ms
from mqstore.engine.segment_queue import SegmentQueue
from mqstore.engine.verify import verify_queues

ABORT_FILE: Final = "abort"
REPORT_FILE: Final = "recovery.json"
NORMAL_RECOVERY_FILES: Final = 3


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
    redispatch_records: int = 0  # records the re-dispatch passed to the dispatcher
    redispatch_seconds: float = 0.0  # how long the re-dispatch took
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
            f"({self.segments_deleted} segments), re-dispatched {self.redispatch_records} "
            f"records ({self.records_redispatched} queue units and "
            f"{self.index_keys_redispatched} index keys written, "
            f"{self.redispatch_seconds:.3f} s), "
            f"{sum(self.queues_truncated.values())} queue units and "
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


def is_abnormal(store_dir: str | os.PathLike[str]) -> bool:
    """`abort` present: the last run did not shut down cleanly."""
    return os.path.exists(os.path.join(store_dir, ABORT_FILE))


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
    passes what it found before writing it); `progress` is called after every chunk
    validated or re-dispatched (`engine.recovery_progress`; it may raise
    `RecoveryInterrupted`, which stops recovery where it is). Fillers are re-dispatched
    as the dispatcher does (`engine.filler`). Raises StoreIOError, SegmentSizeError,
    IndexGeometryError.
    """
    t0 = time.perf_counter()
    s = settings or StoreSettings()
    d = os.fspath(store_dir)
    geo = geometry or Geometry.of(d, s)
    if abnormal is None:  # a supervisor that already wrote its own `abort` says so
        abnormal = is_abnormal(d)
    report = RecoveryReport("abnormal" if abnormal else "normal", d, dry_run=dry_run)
    if not dry_run:
        report.segments_extended = _extend_short_files(
            os.path.join(d, "commitlog"), geo.segment_size_bytes
        )
        report.queue_files_extended = _extend_short_queue_files(
            d, cq_file_size(geo.cq_file_size_bytes)
        )
    with contextlib.ExitStack() as stack:
        clock = clock_ms or now_ms
        st = load_store(stack, d, geo, s, read_only=dry_run, abnormal=abnormal, clock_ms=clock)
        report.index_files_destroyed = st.index_files_destroyed
        report.index_entries_truncated = st.index_entries_cut
        plan = plan_recovery(
            st,
            abnormal=abnormal,
            index_safe=s.message_index_enable and s.message_index_safe,
            segments_extended=report.segments_extended,
            queue_files_extended=report.queue_files_extended,
        )
        cuts = validate(st, plan, check_crc=s.check_crc_on_recover, progress=progress)
        _report_cuts(report, plan, cuts)
        deferred_next: dict[QueueKey, int] = {}
        if dry_run:
            _count_what_apply_would_do(report, st, plan, cuts)
        else:
            deferred_next = apply(report, st, plan, cuts, progress)
        table = st.cqs.queue_offset_table()
        for k, v in deferred_next.items():
            table[k] = max(table.get(k, 0), v)
        report.queue_offsets = {_qkey(k): v for k, v in table.items()}
        if clear_abort and abnormal and not dry_run:
            fileio.unlink(os.path.join(d, ABORT_FILE), missing_ok=True)
            fileio.fsync_dir(d)
    report.seconds = time.perf_counter() - t0
    report.finished_at_ms = time.time_ns() // 1_000_000
    return report


# --- load ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadedStore:
    """A store's files as recovery loaded them (read-only for a dry run)."""

    log: CommitLog
    cp: StoreCheckpoint | None  # None: a dry run of a store without a checkpoint file
    cqs: ConsumeQueueStore
    index: IndexService
    index_enabled: bool  # whether the index is built (`message_index_enable`)
    queues_max_phy: int  # what loading the consume queues found (-1: no unit)
    index_files_destroyed: list[str]  # by the index's load (after an abnormal exit)
    # the store's delay table (`message_delay_level`): the schedule topic's tags codes
    delay_ms: tuple[int, ...] = DELAY_LEVEL_MS
    # entries of kept files cut at load: a record that straddled into a destroyed file
    index_entries_cut: int = 0

    @property
    def cp_fields(self) -> CheckpointFields:
        return self.cp if self.cp is not None else CheckpointFields()

    @property
    def built_index(self) -> IndexService | None:
        """The index when it is built, else None."""
        return self.index if self.index_enabled else None


def load_store(
    stack: contextlib.ExitStack,
    d: str,
    geo: Geometry,
    s: StoreSettings,
    *,
    read_only: bool,
    abnormal: bool,
    clock_ms: ClockMs,
) -> LoadedStore:
    """Open the store's files (closed by `stack`) and load them as RocketMQ's load does:
    writable, the consume queues' tails past their last valid unit are cut and index
    files newer than the checkpoint's index timestamp destroyed (after an abnormal exit);
    read-only, nothing is written and nothing need exist."""
    log_dir = os.path.join(d, "commitlog")
    queue = SegmentQueue(log_dir, geo.segment_size_bytes, read_only=read_only)
    if not read_only or os.path.isdir(log_dir):
        queue.load()
    log = CommitLog(queue, max_message_size=s.max_message_size_bytes)
    stack.callback(log.close)
    cp_path = os.path.join(d, "checkpoint")
    cp: StoreCheckpoint | None = None
    if not read_only or os.path.exists(cp_path):
        cp = StoreCheckpoint(cp_path, read_only=read_only)
        stack.callback(cp.close)
    cqs = ConsumeQueueStore(d, geo.cq_file_size_bytes, read_only=read_only).load()
    stack.callback(cqs.close)
    index = IndexService(
        d,
        geo.hash_slot_num,
        geo.index_num,
        read_only=read_only,
        max_msgs_num_batch=s.max_msgs_num_batch,
        clock_ms=clock_ms,
    )
    stack.callback(index.close)
    queues_max_phy = cqs.max_physical_offset() if read_only else cqs.recover()
    destroyed = index.load(
        last_exit_ok=not abnormal,
        index_msg_timestamp=(cp or CheckpointFields()).index_msg_timestamp,
    )
    cut = 0
    if index.min_destroyed_begin_phy is not None:
        # The first file destroyed began with the record re-dispatch starts from. When
        # that record's first keys are at a kept file's end (it straddled the roll), they
        # go too: left there, the record would count as indexed (`Holdings`: at the kept
        # file's end) and never be re-dispatched, its keys in the destroyed file lost.
        cut = index.truncate_dirty(index.min_destroyed_begin_phy, log.store_time_of)
    return LoadedStore(
        log,
        cp,
        cqs,
        index,
        s.message_index_enable,
        queues_max_phy,
        destroyed,
        parse_delay_levels(s.message_delay_level),
        cut,
    )


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


# --- plan ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """Where recovery starts (`plan_recovery`)."""

    mode: str  # "normal" | "abnormal" | "empty"
    start_index: int  # the segment validation starts from (-1: the log has none)
    start_file: str | None
    start_offset: int
    dispatch_from: int  # no record below it is re-dispatched
    queues_rebuilt: dict[str, int]  # queues with a file cut short: "topic/qid" -> their end
    # full index files the checkpoint's index timestamp covers: not forced again
    settled_index_files: frozenset[str]


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


def plan_recovery(
    st: LoadedStore,
    *,
    abnormal: bool,
    index_safe: bool,
    segments_extended: list[str],
    queue_files_extended: list[str],
) -> RecoveryPlan:
    """Choose where to validate and re-dispatch from (the module doc's step 1), from the
    abort state, the checkpoint and the loaded files. Writes nothing; reads the first
    record of the segments it walks back over (abnormal)."""
    cp = st.cp_fields
    # A full index file is forced when the next one is made, and only then does the
    # checkpoint's index timestamp reach its end (IndexService._last_file, on_roll);
    # after a clean stop the dispatcher's drain forced them all besides. So a normal
    # recovery leaves alone the full files the checkpoint covers, rather than pay an
    # fsync per index file of the store; the newest, any not covered and any it
    # writes are forced. After a crash all are.
    ts = cp.index_msg_timestamp
    settled = frozenset(
        ()
        if abnormal or ts <= 0
        else (f.file_name for f in st.index.files[:-1] if 0 < f.end_timestamp <= ts)
    )
    segs = st.log.queue.segments
    if not segs:
        return RecoveryPlan("abnormal" if abnormal else "empty", -1, None, 0, 0, {}, settled)
    start_i = max(0, len(segs) - NORMAL_RECOVERY_FILES)
    if abnormal:
        back = range(len(segs) - 1, -1, -1)
        start_i = next(
            (i for i in back if first_record_matches(segs[i], cp, index_safe=index_safe)), 0
        )
    # a file that was cut short lost data: validate from it (or earlier), so the
    # log is cut where its zeros begin and nothing after it is trusted
    names = [sg.file_name for sg in segs]
    for name in segments_extended:
        if name in names:
            start_i = min(start_i, names.index(name))
    start = segs[start_i]
    log_min = max(st.log.min_offset(), 0)
    dispatch_from = max(st.cqs.max_physical_offset(), log_min)
    if abnormal:  # RocketMQ trusts the checkpoint; queues lagging behind it are caught up too
        dispatch_from = min(start.start_offset, dispatch_from)
    if st.index.min_destroyed_begin_phy is not None:
        dispatch_from = max(min(dispatch_from, st.index.min_destroyed_begin_phy), 0)
    # a queue with a file cut short ends early (its recover() stopped at the zeros):
    # re-dispatch from its last unit, before anything fills the gap
    rebuilt: dict[str, int] = {}
    for name in queue_files_extended:
        topic, qid, _f = name.split("/")
        cq = st.cqs.get(topic, int(qid))
        if cq is not None:
            rebuilt[_qkey(cq.key)] = cq.max_offset()
            dispatch_from = min(dispatch_from, max(cq.max_physical_offset, log_min))
    mode = "abnormal" if abnormal else "normal"
    return RecoveryPlan(
        mode, start_i, start.file_name, start.start_offset, dispatch_from, rebuilt, settled
    )


# --- validate ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cuts:
    """What validation found (`validate`): where the log's valid data ends, why, and
    what lies past it; where re-dispatch must start."""

    end_offset: int
    stop: ScanStop
    stop_reason: str  # the corrupt record's fault, if any
    records_validated: int
    bytes_validated: int
    last_store_timestamp: int  # of the last valid record (0: none)
    bytes_truncated: int  # non-zero bytes past the end (deleted segments included)
    segments_deleted: int
    # the first valid record at or past the plan's dispatch_from that a consume queue or
    # the index lacks (end_offset: none)
    lacking_from: int


def validate(
    st: LoadedStore, plan: RecoveryPlan, *, check_crc: bool, progress: Progress | None
) -> Cuts:
    """Validate the log from the plan's start (the module doc's step 2): RocketMQ's
    checkMessageAndReturnSize with the CRC, through the record scanner (`engine.scan`,
    in C), a chunk at a time; in the same pass, find the first record the queues or the
    index lack. Writes nothing. O(bytes validated)."""
    if plan.start_index < 0:
        return Cuts(0, ScanStop.END_OF_DATA, "", 0, 0, 0, 0, 0, 0)
    q = st.log.queue
    start = plan.start_offset
    total = max(q.max_offset() - start, 0)
    holdings = Holdings(st.cqs, st.built_index)
    walk = ChunkScan(q, start, check_crc=check_crc, to_offset=1 << 62, delay_ms=st.delay_ms)
    last_ts, lacking = 0, None
    for base, view, scan in walk:
        last_ts = scan.store_timestamp[scan.count - 1]
        if lacking is None:
            lacking = first_lacking(holdings, view, base, scan, plan.dispatch_from)
        if progress is not None:
            done = base + scan.pos[scan.count - 1] + scan.size[scan.count - 1] - start
            progress(Step(VALIDATING, done, total, walk.records))
    end = walk.end_offset
    truncated, deleted = _past_end(q, end)
    return Cuts(end, walk.stop, walk.reason, walk.records, end - start, last_ts, truncated,
                deleted, end if lacking is None else lacking)  # fmt: skip


def _past_end(q: SegmentQueue, end: int) -> tuple[int, int]:
    """(non-zero bytes past `end`, whole segments past it)."""
    truncated = deleted = 0
    for seg in q.segments:
        if seg.end_offset <= end:
            continue
        if seg.start_offset <= end:
            truncated += _nonzero_tail(seg, end - seg.start_offset)
        else:
            truncated += _nonzero_tail(seg, 0)
            deleted += 1
    return truncated, deleted


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


def _report_cuts(report: RecoveryReport, plan: RecoveryPlan, cuts: Cuts) -> None:
    report.mode = plan.mode
    report.start_file, report.start_offset = plan.start_file, plan.start_offset
    report.queues_rebuilt.update(plan.queues_rebuilt)
    report.end_offset = cuts.end_offset
    report.stop, report.stop_reason = cuts.stop.value, cuts.stop_reason
    report.records_validated, report.bytes_validated = cuts.records_validated, cuts.bytes_validated
    report.bytes_truncated, report.segments_deleted = cuts.bytes_truncated, cuts.segments_deleted
    report.dispatch_from = min(plan.dispatch_from, cuts.end_offset)


def _count_what_apply_would_do(
    report: RecoveryReport, st: LoadedStore, plan: RecoveryPlan, cuts: Cuts
) -> None:
    """A dry run's prediction: consume-queue units past the end, and records whose unit
    a re-dispatch would write. Writes nothing. O(units + records re-dispatched)."""
    end = cuts.end_offset
    for cq in st.cqs:
        if plan.start_index < 0:  # no log: every unit goes
            n = cq.max_offset() - cq.min_offset()
        else:
            units = cq.units(cq.min_offset(), 1 << 62)
            n = sum(1 for _qo, u in units if u.is_valid and not u.is_pre_blank and u.end > end)
        if n > 0:
            report.queues_truncated[_qkey(cq.key)] = n
    if plan.start_index < 0:
        return
    n = 0
    for rec in st.log.scan(report.dispatch_from, check_crc=False, read_body=False, to_offset=end):
        h = rec.header
        if not takes_queue_offset(h.sys_flag):
            continue
        held = st.cqs.get(h.topic, h.queue_id)
        if held is None or h.queue_offset >= held.max_offset():
            n += 1
    report.records_redispatched = n


# --- apply ---------------------------------------------------------------------------


def apply(
    report: RecoveryReport,
    st: LoadedStore,
    plan: RecoveryPlan,
    cuts: Cuts,
    progress: Progress | None = None,
) -> dict[QueueKey, int]:
    """Make the store what validation found (the module doc's step 3): re-dispatch, cut
    the log, the queues and the index, rebuild damaged queues, flush and write the
    checkpoint; what it did goes into `report`. Returns the next queue offsets the
    dispatcher left to the runtime (a full disk). Raises StoreIOError."""
    log, cqs, index = st.log, st.cqs, st.index
    end = cuts.end_offset
    if plan.start_index < 0:  # no commit-log segment: every unit and entry points at nothing
        report.queues_truncated = {_qkey(k): n for k, n in cqs.truncate_dirty(0).items()}
        report.index_entries_truncated += index.truncate_dirty(0, log.store_time_of)
        return {}
    disp = Dispatcher(log, cqs, st.built_index, checkpoint=st.cp_fields, delay_ms=st.delay_ms)
    disp.defer_on_no_space = True  # boot needs no new space: see Dispatcher
    res = DispatchResult(plan.dispatch_from, plan.dispatch_from, DispatchStop.END_OF_DATA)
    spans = [(plan.dispatch_from, min(plan.start_offset, end)), (cuts.lacking_from, end)]
    held = {cq.key: cq.max_offset() for cq in cqs}
    for span in spans:
        if span[0] < span[1]:
            redispatch(log, Holdings(cqs, st.built_index), disp, res, span, progress)
    _refill_gaps(report, st, disp, res, held, end, progress)
    _cut_log(log.queue, end, cuts, plan.start_index)
    # consume queues and index past the end
    if st.queues_max_phy > end or st.queues_max_phy < 0 or cqs.max_physical_offset() > end:
        report.queues_truncated = {_qkey(k): n for k, n in cqs.truncate_dirty(end).items()}
    report.index_entries_truncated += index.truncate_dirty(end, log.store_time_of)
    _rebuild_damaged_queues(report, st, plan, disp, res, end, progress)
    report.dispatch_deferred = disp.deferred
    report.records_redispatched = res.units_written
    report.index_keys_redispatched = res.index_keys
    report.redispatch_records = res.records
    report.redispatch_seconds = res.seconds
    cqs.correct_min_offsets(max(log.min_offset(), 0))
    cqs.flush_all()
    for f in index.files:
        if f.file_name not in plan.settled_index_files:
            f.flush()
    if st.cp is not None:
        _write_checkpoint(st.cp, cuts.last_store_timestamp, index)
    return disp.deferred_next


def _refill_gaps(
    report: RecoveryReport,
    st: LoadedStore,
    disp: Dispatcher,
    res: DispatchResult,
    held: dict[QueueKey, int],
    end: int,
    progress: Progress | None,
) -> None:
    """A queue the re-dispatch filled a gap in (a unit came past its end) lacks records
    below where the re-dispatch started: a checkpoint ahead of the queues (damaged, or
    stamped before a clock step back) starts abnormal recovery past them, and their units
    would stay pre-blanks, the messages never served. Cut such a queue back to where it
    ended and re-dispatch from its last record's end: what the log holds of it comes
    back; a gap the log has too (retention deleted the records) is filled again."""
    log, cqs = st.log, st.cqs
    redos = []
    for key in sorted(res.gaps_filled):
        cq = cqs.get(*key)
        if cq is None or key not in held:
            continue
        cq.cut_at(held[key])
        report.queues_rebuilt[_qkey(key)] = held[key]
        redos.append(max(cq.max_physical_offset, log.min_offset(), 0))
    res.gaps_filled.clear()
    redos = [r for r in redos if r < end]
    if redos:
        redo = min(redos)
        redispatch(log, Holdings(cqs, st.built_index), disp, res, (redo, end), progress)
        report.dispatch_from = min(report.dispatch_from, redo)


def _cut_log(q: SegmentQueue, end: int, cuts: Cuts, start_i: int) -> None:
    """Make `end` the log's end and force the validated segments from `start_i` on."""
    if cuts.bytes_truncated == 0 and cuts.segments_deleted == 0:
        # nothing but zeros past the end: set positions, write nothing
        holder = q.find(end)
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


def _rebuild_damaged_queues(
    report: RecoveryReport,
    st: LoadedStore,
    plan: RecoveryPlan,
    disp: Dispatcher,
    res: DispatchResult,
    end: int,
    progress: Progress | None,
) -> None:
    """Cut damaged consume queues at their first bad unit and rebuild them from the log:
    after a crash every unit is compared with its record, after a clean stop those in
    the segments validated (the rest are checked for order and range only)."""
    log, cqs = st.log, st.cqs
    abnormal = plan.mode == "abnormal"
    headers_from = 0 if abnormal else plan.start_offset
    cut = verify_queues(cqs, log, end, headers_from=headers_from, all_files=abnormal)
    for key, (bad_qo, _redo) in cut.items():
        report.queues_rebuilt[_qkey(key)] = bad_qo
    redos = [r for _qo, r in cut.values()]
    # a unit past the end may be a damaged unit of a record below it (the walk found
    # the queue holding that offset): catch truncated queues up
    for qk in report.queues_truncated:
        topic, _, qid = qk.rpartition("/")
        tq = cqs.get(topic, int(qid))
        if tq is not None:
            redos.append(max(tq.max_physical_offset, log.min_offset(), 0))
    redos = [r for r in redos if r < end]
    if redos:
        redo = min(redos)
        redispatch(log, Holdings(cqs, st.built_index), disp, res, (redo, end), progress)
        report.dispatch_from = min(report.dispatch_from, redo)


def _write_checkpoint(cp: StoreCheckpoint, last_store_timestamp: int, index: IndexService) -> None:
    """Everything validated is on disk (forced by `_cut_log`) and the queues hold it: the
    checkpoint says exactly that, no more (data cut, or a damaged checkpoint claiming
    the future) and no less."""
    if last_store_timestamp > 0:
        cp.physic_msg_timestamp = last_store_timestamp
        cp.logics_msg_timestamp = last_store_timestamp
    if index.files:
        cp.index_msg_timestamp = index.files[-1].end_timestamp
    cp.flush()
