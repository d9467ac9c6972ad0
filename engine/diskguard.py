"""The disk guard: how full the store's filesystem is, and what follows (spec §8.14).

RocketMQ reads the usage of the commit-log path and of the consume-queue path and acts
on three ratios (`conf.settings.StoreSettings`):

| ratio                               | default | above it                                    |
| ----------------------------------- | ------- | ------------------------------------------- |
| `disk_max_used_space_ratio_pct`     | 75 %    | the cleaner runs outside the delete hour     |
| `disk_space_clean_forcibly_ratio`   | 0.85    | `cleanImmediately`: oldest first, expired or |
|                                     |         | not (if `cleanFileForciblyEnable`)           |
| `disk_space_warning_level_ratio`    | 0.90    | DISK_FULL: puts get SERVICE_NOT_AVAILABLE    |

**Hysteresis.** DISK_FULL is set above the warning ratio and cleared only at or below
the force ratio; in between it stays as it was (RocketMQ's `isSpaceToDelete` does the
same: its middle branch neither sets nor clears the flag). So the store becomes
writable again by itself once the cleaner has brought usage below the force ratio, and
does not flap around the warning ratio.

**Usage ratio** is RocketMQ's `getDiskPartitionSpaceUsedPercent`: `used = total - free`,
`entire = used + usable`, ratio = `ceil(used * 100 / entire) / 100`; psutil's `used` and
`free` are exactly RocketMQ's `used` and `usable` (root-reserved blocks excluded). A path
that cannot be read gives ratio -1, which (as in RocketMQ) lets the cleaner run but sets
no flag.

**Seams.** `UsageProbe` (default `psutil_usage`) is the one place usage is read; tests
pass their own. The guard has no clock: it is checked by whoever owns it (the cleaner
process every `clean_resource_interval_ms`, tests at will).

Pure computation plus one statvfs per path per check. Not thread-safe; one owner.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import psutil

from mqstore.conf.settings import StoreSettings
from mqstore.engine.consumequeue_files import CONSUME_QUEUE_DIR
from mqstore.engine.segment import Segment
from mqstore.engine.segment_queue import Allocator, SegmentAllocationError


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """One filesystem's usage, as psutil reports it. `free_bytes` is what an
    unprivileged writer can still use (statvfs f_bavail)."""

    path: str
    total_bytes: int
    used_bytes: int
    free_bytes: int

    @property
    def ratio(self) -> float:
        """RocketMQ's used fraction, rounded up to a whole percent (see module doc)."""
        entire = self.used_bytes + self.free_bytes
        if entire <= 0:
            return -1.0
        return math.ceil(self.used_bytes * 100 / entire) / 100

    def to_json_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


UsageProbe = Callable[[str], DiskUsage]


def store_paths(store_dir: str | os.PathLike[str]) -> list[str]:
    """What a store's guard watches: its `commitlog/` and `consumequeue/`."""
    d = os.fspath(store_dir)
    return [os.path.join(d, "commitlog"), os.path.join(d, CONSUME_QUEUE_DIR)]


def existing_ancestor(path: str) -> str:
    """`path` or its nearest existing parent (a consume-queue dir may not exist yet)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def psutil_usage(path: str) -> DiskUsage:
    """The default probe: psutil.disk_usage of the filesystem holding `path`.
    Raises OSError when it cannot be read."""
    u = psutil.disk_usage(existing_ancestor(path))
    return DiskUsage(path, int(u.total), int(u.used), int(u.free))


class WriteGate(Protocol):
    """What the guard drives: `engine.commitlog.CommitLog` (the runtime's control-block
    flag plays the same part across processes)."""

    def refuse_writes(self, reason: str) -> None: ...

    def allow_writes(self) -> None: ...


class DiskState(enum.Enum):
    OK = "OK"
    CLEAN_IMMEDIATELY = "CLEAN_IMMEDIATELY"  # over the force ratio: delete at once
    DISK_FULL = "DISK_FULL"  # writes refused until usage is at or below the force ratio


@dataclass(frozen=True, slots=True)
class DiskVerdict:
    """One check's outcome. `ratio` is the highest over the guarded paths (-1 unknown)."""

    state: DiskState
    ratio: float
    disk_full: bool  # the DISK_FULL flag after this check (hysteresis applied)
    clean_immediately: bool  # usage is over the force ratio (RocketMQ's cleanImmediately)
    space_to_delete: bool  # over diskMaxUsedSpaceRatio, or unknown: the cleaner runs
    changed: bool  # DISK_FULL flipped in this check
    reason: str  # one line for logs, put results and `mqstore status`
    usages: tuple[DiskUsage, ...] = ()

    def to_json_dict(self) -> dict[str, Any]:
        """The fields but `changed`, which says what one check did, not the state."""
        d = asdict(self)
        del d["changed"]
        return d | {"state": self.state.value, "usages": [u.to_json_dict() for u in self.usages]}


@dataclass(frozen=True, slots=True)
class Ratios:
    """The three thresholds as fractions, from the settings (force <= warning enforced)."""

    max_used: float
    clean_forcibly: float
    warning: float

    @classmethod
    def of(cls, s: StoreSettings) -> Ratios:
        warning = s.disk_space_warning_level_ratio
        forcibly = min(s.disk_space_clean_forcibly_ratio, warning)
        return cls(min(95, max(10, s.disk_max_used_space_ratio_pct)) / 100, forcibly, warning)


class DiskGuard:
    """Computes the disk state of a store's paths with hysteresis. See the module doc.

    `paths`: the directories to watch (the store's `commitlog/` and `consumequeue/`);
    each is probed, the highest ratio counts (RocketMQ trips on either). Owned by one
    caller (the cleaner); others read the published flag.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        settings: StoreSettings,
        *,
        probe: UsageProbe = psutil_usage,
        disk_full: bool = False,
    ) -> None:
        if not paths:
            raise ValueError("a disk guard needs at least one path")
        self.paths = tuple(os.fspath(p) for p in paths)
        self.settings = settings
        self.probe = probe
        self.disk_full = disk_full
        self.last: DiskVerdict | None = None

    def check(self, settings: StoreSettings | None = None) -> DiskVerdict:
        """Probe every path and update DISK_FULL. `settings` replaces the guard's own
        (re-read each tick). O(paths) statvfs calls; never raises for a probe failure."""
        if settings is not None:
            self.settings = settings
        r = Ratios.of(self.settings)
        usages: list[DiskUsage] = []
        ratio = -1.0
        unknown = False
        for p in self.paths:
            try:
                u = self.probe(p)
            except OSError:
                unknown = True
                continue
            usages.append(u)
            ratio = max(ratio, u.ratio)
        if not usages:
            unknown = True
        was_full = self.disk_full
        if unknown and not usages:
            reason = "disk usage unknown (probe failed); cleaning runs, flags unchanged"
        elif ratio > r.warning:
            self.disk_full = True
            reason = f"disk {ratio:.0%} used, over the warning ratio {r.warning:.0%}"
        elif ratio > r.clean_forcibly:
            reason = f"disk {ratio:.0%} used, over the force-clean ratio {r.clean_forcibly:.0%}" + (
                " (still full until at or below it)" if self.disk_full else ""
            )
        else:
            self.disk_full = False
            reason = f"disk {ratio:.0%} used"
        clean_immediately = ratio > r.clean_forcibly
        space_to_delete = unknown or ratio < 0 or ratio > r.max_used
        if self.disk_full:
            state = DiskState.DISK_FULL
        elif clean_immediately:
            state = DiskState.CLEAN_IMMEDIATELY
        else:
            state = DiskState.OK
        verdict = DiskVerdict(
            state,
            ratio,
            self.disk_full,
            clean_immediately,
            space_to_delete,
            self.disk_full != was_full,
            reason,
            tuple(usages),
        )
        self.last = verdict
        return verdict

    def apply(self, gate: WriteGate) -> None:
        """Refuse writes on `gate` while DISK_FULL, allow them otherwise."""
        if self.disk_full:
            gate.refuse_writes(self.refusal_reason())
        else:
            gate.allow_writes()

    def refusal_reason(self) -> str:
        """The reason puts are refused with while DISK_FULL ("" when writable)."""
        if not self.disk_full:
            return ""
        detail = self.last.reason if self.last is not None else "disk full"
        return f"DISK_FULL: {detail}; writes resume once the cleaner frees space"


# --- the state word shared between processes ----------------------------------------------

DISK_FULL_BIT = 1
CLEAN_IMMEDIATELY_BIT = 2


def encode_state(v: DiskVerdict) -> int:
    """The int64 the cleaner publishes (the control block's `disk_state`):

    | bits   | meaning                                       |
    | ------ | --------------------------------------------- |
    | 0      | DISK_FULL: producers must refuse puts          |
    | 1      | CLEAN_IMMEDIATELY: usage over the force ratio  |
    | 16..31 | disk usage in per mille (0 when unknown)       |
    """
    bits = (DISK_FULL_BIT if v.disk_full else 0) | (
        CLEAN_IMMEDIATELY_BIT if v.clean_immediately else 0
    )
    permille = max(0, min(1000, round(v.ratio * 1000))) if v.ratio >= 0 else 0
    return bits | (permille << 16)


def decode_state(word: int) -> tuple[bool, bool, float]:
    """(disk_full, clean_immediately, ratio) from a state word."""
    return bool(word & DISK_FULL_BIT), bool(word & CLEAN_IMMEDIATELY_BIT), (word >> 16) / 1000


def refusal_from_state(word: int, settings: StoreSettings) -> str:
    """What a producer tells its caller while the state word says DISK_FULL ("" if not):
    the reason of SERVICE_NOT_AVAILABLE."""
    full, _, ratio = decode_state(word)
    if not full:
        return ""
    r = Ratios.of(settings)
    return (
        f"DISK_FULL: the disk is {ratio:.1%} used (warning ratio {r.warning:.0%}); "
        f"writes resume once the cleaner brings it to {r.clean_forcibly:.0%} or below"
    )


# --- space for a new segment ------------------------------------------------------------


def space_problem(
    directory: str | os.PathLike[str],
    size_bytes: int,
    *,
    probe: UsageProbe = psutil_usage,
    headroom_bytes: int = 0,
) -> str:
    """Why a new `size_bytes` segment cannot be pre-allocated in `directory` ("" if it can).

    Called by the allocator before it creates or maps a new segment: the free space must
    hold the whole segment plus `headroom_bytes`. A probe failure is not a refusal (the
    fallocate itself will then say). One statvfs.
    """
    d = os.fspath(directory)
    try:
        u = probe(d)
    except OSError:
        return ""
    need = size_bytes + headroom_bytes
    if u.free_bytes < need:
        return (
            f"no space for a new {size_bytes}-byte segment in {d}: "
            f"{u.free_bytes} bytes free of {u.total_bytes} (need {need})"
        )
    return ""


def guarded_allocator(
    inner: Allocator,
    directory: str | os.PathLike[str],
    size_bytes: int,
    *,
    probe: UsageProbe = psutil_usage,
    guard: DiskGuard | None = None,
    headroom_bytes: int = 0,
) -> Allocator:
    """Wrap a segment allocator: refuse (SegmentAllocationError, which the commit log
    reports as CREATE_MAPPED_FILE_FAILED) while the guard says DISK_FULL or when the
    free space cannot hold the segment; otherwise call `inner`."""

    def allocate(start_offset: int) -> Segment:
        if guard is not None and guard.disk_full:
            raise SegmentAllocationError(guard.refusal_reason())
        problem = space_problem(directory, size_bytes, probe=probe, headroom_bytes=headroom_bytes)
        if problem:
            raise SegmentAllocationError(problem)
        return inner(start_offset)

    return allocate
