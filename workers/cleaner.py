"""The cleaner process (retention and the disk guard), and the offline `clean_once`.

The rules are `engine.retention` and `engine.diskguard`; this module only runs them:

* **Disk check** every `DISK_CHECK_S` (1 s; RocketMQ's isSpaceFull runs every 10 s, but a
  store that refuses writes should resume quickly): the guard's state is published in
  the control block's `disk_state` field (written only by the cleaner; layout below).
* **Clean** every `clean_resource_interval_ms` (first run after `FIRST_CLEAN_S`), or at
  once when `mqstore clean DIR --now` leaves a request file: one `Retention.run_once`
  over a fresh read-only view of `commitlog/` (files come and go under other
  processes), protected by min(flushed, dispatched, checkpointed).
* Each run's `CleanReport` and the totals since start go to `<store>/.mqstore-clean.json`
  (atomic replace) for `mqstore status` and `mqstore clean`.

`disk_state` (the control block's `DiskWord` view) is `engine.diskguard.encode_state`:
bit 0 DISK_FULL, bit 1 CLEAN_IMMEDIATELY, bits 16.. the usage in per mille. Producers
refuse puts while bit 0 is set, with `engine.diskguard.refusal_from_state` as reason.

Unconsumed bytes: the committed consumer offsets are read from
`<store>/config/consumerOffset.json` (RocketMQ's ConsumerOffsetManager file) at each
clean, when it exists.

Where the protection comes from: `flushed` is the control block's flushed position (or
the `flushed_offset` file offline); `dispatched` is the dispatcher's published position
(`Positions.dispatched`; offline, the end of the furthest last consume-queue unit);
`checkpointed` is where abnormal recovery would start by the checkpoint
(`checkpoint_protection`; the live physic timestamp in the runtime).

Loop shape as every worker: beat, wait, tick; settings from the context each tick.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any, Final, Protocol, TypedDict, Unpack

from mqstore.conf.settings import StoreSettings
from mqstore.engine import fileio
from mqstore.engine.checkpoint import MIN_TIMESTAMP_SLACK_MS, StoreCheckpoint
from mqstore.engine.consumequeue_files import dispatched_offset_from_files, numbered_queue_dirs
from mqstore.engine.diskguard import (
    DiskGuard,
    DiskState,
    DiskVerdict,
    UsageProbe,
    decode_state,
    encode_state,
    psutil_usage,
    store_paths,
)
from mqstore.engine.offsets import ConsumedOffsets, load_consumer_offsets
from mqstore.engine.retention import (
    CleanReport,
    DeletedFile,
    Retention,
    RetentionTotals,
    checkpointed_offset,
    keep_from,
)
from mqstore.engine.segment import ClockMs, SegmentNameError, SegmentSizeError, now_ms
from mqstore.engine.segment_queue import SegmentQueue, SleepMs
from mqstore.engine.storedir import read_flushed_offset
from mqstore.ipc.control_views import DiskWord, Positions
from mqstore.ipc.locks import store_lock_holder
from mqstore.workers.base import Condition, WorkerContext
from mqstore.workers.service import Service, run

log = logging.getLogger("mqstore.cleaner")

STATUS_FILE: Final = ".mqstore-clean.json"
REQUEST_FILE: Final = ".mqstore-clean-now"
DISK_CHECK_S: Final = 1.0
FIRST_CLEAN_S: Final = 60.0  # RocketMQ's first cleanFilesPeriodically

# The word's layout lives with the guard (engine.diskguard.encode_state); ipc reads it.
encode_disk_state = encode_state
decode_disk_state = decode_state


@dataclass(frozen=True)
class Protection:
    """The offsets no deletion may pass; None = not known (not a bound)."""

    flushed: int | None
    dispatched: int | None
    checkpointed: int | None

    def keep_from(self) -> int | None:
        return keep_from(self.flushed, self.dispatched, self.checkpointed)

    def describe(self) -> str:
        return (
            f"protected from {self.keep_from()} (flushed {self.flushed}, "
            f"dispatched {self.dispatched}, checkpointed {self.checkpointed})"
        )


def checkpoint_protection(
    store_dir: str, queue: SegmentQueue, *, live_physic_ms: int | None = None
) -> int | None:
    """Where abnormal recovery would start by the checkpoint (`checkpointed_offset`).

    The physic timestamp is `live_physic_ms` when given (the runtime: the flusher's
    `flushed_ts`, which the checkpoint file only receives at shutdown; a file pinned to
    the last start would stop all deletion in a long run), else the file's. The logics
    timestamp counts only when it is set and the store has consume queues (min of the
    two, less 3 s, as RocketMQ's getMinTimestamp). None (no bound) when there is no
    physic timestamp: recovery would then start at the first segment whatever is
    deleted. Recovery also starts at the first segment when the start it would pick was
    deleted (engine.recovery), so this bound is conservative, never needed for safety.
    """
    path = os.path.join(store_dir, "checkpoint")
    physic = live_physic_ms or 0
    logics = 0
    if os.path.exists(path):
        with StoreCheckpoint(path, read_only=True) as cp:
            physic = physic or cp.physic_msg_timestamp
            logics = cp.logics_msg_timestamp
    if physic <= 0:
        return None
    bound = physic
    if logics > 0 and numbered_queue_dirs(store_dir):
        bound = min(physic, logics)
    return checkpointed_offset(queue, max(0, bound - MIN_TIMESTAMP_SLACK_MS))


def open_log_view(store_dir: str, settings: StoreSettings, clock_ms: ClockMs) -> SegmentQueue:
    """A read-only view of `commitlog/` as it is now (the cleaner unlinks through it)."""
    log_dir = os.path.join(store_dir, "commitlog")
    return SegmentQueue(
        log_dir, settings.segment_size_bytes, read_only=True, clock_ms=clock_ms
    ).loaded()


def write_status(store_dir: str, doc: dict[str, Any]) -> None:
    fileio.write_file_atomic(
        os.path.join(store_dir, STATUS_FILE), json.dumps(doc, indent=1).encode()
    )


def read_status(store_dir: str) -> dict[str, Any] | None:
    """The last status the cleaner (or `mqstore clean`) wrote; None if none."""
    try:
        with open(os.path.join(store_dir, STATUS_FILE), encoding="utf-8") as f:
            doc: dict[str, Any] = json.load(f)
            return doc
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def store_is_running(store_dir: str) -> bool:
    """Whether a supervisor holds `<store>/lock` (flock, as `ipc.locks.take_store_lock`)."""
    return store_lock_holder(store_dir) is not None


def _no_publish(v: DiskVerdict) -> None:
    pass


def _none_consumed() -> ConsumedOffsets | None:
    return None


class CleanerSeams(TypedDict, total=False):
    """What tests and the offline clean replace in a `Cleaner` (defaults: its own)."""

    probe: UsageProbe
    clock_ms: ClockMs
    sleep_ms: SleepMs | None


@dataclass(eq=False)
class Cleaner:
    """The cleaner's state across ticks: the guard (its DISK_FULL hysteresis), the
    totals, the manual request, and when each job is next due. Not thread-safe.

    `protection()` and `consumed()` are asked at each clean; `publish(verdict)` after
    each disk check (the runtime writes `disk_state`). `probe` and `disk_full` build the
    guard; the first clean is due `first_clean_s` after construction.
    """

    store_dir: str
    settings: StoreSettings
    _: KW_ONLY
    protection: Callable[[SegmentQueue], Protection]
    publish: Callable[[DiskVerdict], None] = _no_publish
    consumed: Callable[[], ConsumedOffsets | None] = _none_consumed
    probe: InitVar[UsageProbe] = psutil_usage
    clock_ms: ClockMs = now_ms
    sleep_ms: SleepMs | None = None
    disk_full: InitVar[bool] = False
    first_clean_s: InitVar[float] = FIRST_CLEAN_S
    on_deleted: Callable[[DeletedFile], None] | None = None
    on_progress: Callable[[], None] | None = None
    totals: RetentionTotals = field(init=False, default_factory=RetentionTotals)
    last_report: CleanReport | None = field(init=False, default=None)

    def __post_init__(self, probe: UsageProbe, disk_full: bool, first_clean_s: float) -> None:
        self.guard = DiskGuard(
            store_paths(self.store_dir), self.settings, probe=probe, disk_full=disk_full
        )
        self._manual = 0
        self._next_disk = 0.0
        self._next_clean = time.monotonic() + first_clean_s
        # Kept across runs (hung-file retry time, consume-queue trigger, manual runs);
        # its segment queue is replaced by a fresh view at every run.
        self._retention: Retention | None = None

    def request_manual(self, runs: int = 1) -> None:
        self._manual = max(self._manual, runs)
        self._next_clean = 0.0

    def check_disk(self) -> DiskVerdict:
        v = self.guard.check(self.settings)
        if v.changed:
            log.warning("%s", self.guard.refusal_reason() or f"writable again: {v.reason}")
        self.publish(v)
        return v

    def clean(self) -> CleanReport:
        """One retention run over the files as they are now; writes the status file."""
        queue = open_log_view(self.store_dir, self.settings, self.clock_ms)
        try:
            ret = self._retention
            if ret is None:
                kwargs: dict[str, Any] = {
                    "clock_ms": self.clock_ms,
                    "on_deleted": self.on_deleted,
                    "on_progress": self.on_progress,
                }
                if self.sleep_ms is not None:
                    kwargs["sleep_ms"] = self.sleep_ms
                ret = Retention(self.store_dir, queue, self.guard, self.settings, **kwargs)
                self._retention = ret
            ret.queue = queue
            if self._manual > 0:
                ret.request_manual(self._manual)
                self._manual = 0
            prot = self.protection(queue)
            report = ret.run_once(
                keep_from_offset=prot.keep_from(), consumed=self.consumed(), settings=self.settings
            )
            report.notes.append(prot.describe())
        finally:
            queue.close()
        self.totals.add(report)
        self.last_report = report
        latest = report.disk_after or report.disk
        if latest is not None:
            self.publish(latest)
        self.write_status()
        return report

    def write_status(self) -> None:
        v = self.guard.last
        write_status(
            self.store_dir,
            {
                "written_ms": self.clock_ms(),
                "pid": os.getpid(),
                "disk": v.to_json_dict() if v is not None else None,
                "totals": self.totals.to_json_dict(),
                "last_clean": self.last_report.to_json_dict() if self.last_report else None,
            },
        )

    def tick(self) -> float:
        """Do whatever is due; return the seconds until something is due again."""
        now = time.monotonic()
        request = os.path.join(self.store_dir, REQUEST_FILE)
        if os.path.exists(request):
            fileio.unlink(request, missing_ok=True)
            self.request_manual()
        if now >= self._next_disk:
            v = self.check_disk()
            self._next_disk = now + DISK_CHECK_S
            if v.changed:
                self.write_status()
        if now >= self._next_clean:
            # Due again one interval on, even if this run raises (no retry storm).
            self._next_clean = now + self.settings.clean_resource_interval_ms / 1000
            self.clean()
        return max(0.0, min(self._next_disk, self._next_clean) - time.monotonic())


def clean_once(
    store_dir: str | os.PathLike[str],
    settings: StoreSettings,
    *,
    now: bool = False,
    **seams: Unpack[CleanerSeams],
) -> CleanReport:
    """One clean of a store that is not running (`mqstore clean DIR [--now]`).

    `now` is RocketMQ's manual delete: the run happens whatever the hour and the disk,
    under the same rules (expired files only, unless the disk is over the force ratio).
    Protection: the `flushed_offset` file and the checkpoint; unconsumed bytes: the
    offsets in `config/consumerOffset.json`. Raises RuntimeError if a supervisor holds
    the store, StoreIOError, SegmentSizeError.
    """
    d = os.fspath(store_dir)
    if store_is_running(d):
        raise RuntimeError(f"{d} is running; the cleaner process cleans it")

    def protection(queue: SegmentQueue) -> Protection:
        return Protection(
            read_flushed_offset(d), dispatched_offset_from_files(d), checkpoint_protection(d, queue)
        )

    prev = read_status(d) or {}
    cleaner = Cleaner(
        d,
        settings,
        protection=protection,
        consumed=lambda: load_consumer_offsets(d),
        disk_full=bool((prev.get("disk") or {}).get("disk_full", False)),
        **seams,
    )
    totals = prev.get("totals")
    if isinstance(totals, dict):
        fields = RetentionTotals.__dataclass_fields__
        cleaner.totals = RetentionTotals(**{k: v for k, v in totals.items() if k in fields})
    if now:
        cleaner.request_manual()
    return cleaner.clean()


def status_doc(store_dir: str, disk_state_word: int | None = None) -> dict[str, Any]:
    """The cleaner's part of `mqstore status`: the disk as the cleaner last published it
    (`disk_state_word` from the control block) and its status file (last clean, totals).
    """
    doc: dict[str, Any] = {"status_file": read_status(store_dir)}
    if disk_state_word is not None:
        full, clean_now, ratio = decode_state(disk_state_word)
        doc["disk"] = {"disk_full": full, "clean_immediately": clean_now, "ratio": ratio}
    return doc


class StopEvent(Protocol):
    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def run_cleaner(store_dir: str, cleaner: Cleaner, stop: StopEvent) -> None:
    """The loop without a worker context (a thread, a test, an embedding program): tick
    until `stop` is set, waiting on it in between. `main` is the same loop for the
    supervisor's process, with heartbeats and signals."""
    while not stop.is_set():
        stop.wait(min(cleaner.tick(), 0.5))


def _say_deleted(d: DeletedFile) -> None:
    # The supervisor shows workers' stderr; every deletion is logged with its reason.
    print(
        f"mqstore cleaner: deleted {d.path} ({d.size_bytes} bytes, {d.reason.value}): {d.detail}",
        file=sys.stderr,
        flush=True,
    )


def main(ctx: WorkerContext) -> int:
    """The worker: `WorkerSpec("cleaner", "mqstore.workers.cleaner:main")` in the supervisor."""
    pos, disk = Positions(ctx.cb), DiskWord(ctx.cb)

    def publish(v: DiskVerdict) -> None:
        disk.set_disk_state(encode_disk_state(v))

    def protection(queue: SegmentQueue) -> Protection:
        # The dispatcher's published position (seeded by the supervisor at boot).
        return Protection(
            pos.flushed,
            pos.dispatched,
            checkpoint_protection(ctx.store_dir, queue, live_physic_ms=pos.flushed_ts),
        )

    def deleted(d: DeletedFile) -> None:
        _say_deleted(d)
        ctx.beat()  # a run may take seconds: keep the heartbeat fresh

    def pause(ms: int) -> None:  # deleteCommitLogFilesInterval, interruptible by SIGTERM
        ctx.beat()
        ctx.wait(ms / 1000)

    was_full, _, _ = decode_disk_state(disk.word)
    cleaner = Cleaner(
        ctx.store_dir,
        ctx.settings,
        protection=protection,
        publish=publish,
        consumed=lambda: load_consumer_offsets(ctx.store_dir),
        disk_full=was_full,
        on_deleted=deleted,
        on_progress=ctx.beat,
        sleep_ms=pause,
    )
    return run(ctx, CleanerService(ctx, cleaner))


class CleanerService(Service):
    """The cleaner's tick as a worker. A failed unlink, read or sync fails the store
    closed like any worker's I/O; two things are retried instead, reported once while
    they repeat: a file in `commitlog/` that is not a segment (deleting nothing is always
    safe) and no space for the status file (the deletions are how space comes back)."""

    name = "cleaner"

    def __init__(self, ctx: WorkerContext, cleaner: Cleaner) -> None:
        super().__init__(ctx)
        self.cleaner = cleaner
        self.failing = Condition("cleaner")

    def tick(self) -> float:
        self.cleaner.settings = self.ctx.settings
        try:
            wait_s = self.cleaner.tick()
        except (fileio.StoreIOError, SegmentSizeError, SegmentNameError) as e:
            if isinstance(e, fileio.StoreIOError) and not fileio.is_no_space(e):
                raise
            self.failing.report(str(e), str(e))
            wait_s = self.cleaner.settings.clean_resource_interval_ms / 1000
        else:
            self.failing.clear("the last run's error is gone")
        return min(wait_s, 0.5)


__all__ = [
    "STATUS_FILE",
    "Cleaner",
    "DiskState",
    "Protection",
    "clean_once",
    "decode_disk_state",
    "encode_disk_state",
    "main",
    "read_status",
]
