"""Shared pieces of the retention tests: a movable clock, a usage probe, a small log."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

from mqstore.engine.commitlog import CommitLog
from mqstore.engine.diskguard import DiskUsage
from mqstore.engine.record import Message
from mqstore.engine.segment_queue import SegmentQueue

SEG = 8192
BODY = b"m" * 1000  # ~1.1 KiB records: 7 per 8 KiB segment
HOUR_MS = 3_600_000


class Clock:
    """Epoch milliseconds the test moves by hand."""

    def __init__(self, ms: int | None = None) -> None:
        self.ms = ms if ms is not None else time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> None:
        self.ms += ms


class Probe:
    """A usage probe whose ratio the test sets; counts its calls."""

    def __init__(self, ratio: float = 0.5, total: int = 1_000_000_000) -> None:
        self.ratio = ratio
        self.total = total
        self.calls = 0
        self.fail = False

    def __call__(self, path: str) -> DiskUsage:
        self.calls += 1
        if self.fail:
            raise OSError(5, "probe failed")
        used = int(self.total * self.ratio)
        return DiskUsage(path, self.total, used, self.total - used)


def local_time_at_hour(after_ms: int, hour: int, minute: int = 30) -> int:
    """The first local `hour:minute` at or after `after_ms` (epoch ms)."""
    t = time.localtime(after_ms / 1000)
    for day in range(3):
        cand = time.mktime((t.tm_year, t.tm_mon, t.tm_mday + day, hour, minute, 0, 0, 0, -1))
        if cand * 1000 >= after_ms:
            return int(cand * 1000)
    raise AssertionError("no such hour within three days")


def build_log(store: Path, clock: Clock, segments: int, *, topic: str = "T") -> CommitLog:
    """A commit log under `store/commitlog` with `segments` segments, the last partly
    written; every message in queue 0 of `topic`."""
    queue = SegmentQueue(store / "commitlog", SEG, clock_ms=clock)
    queue.load()
    log = CommitLog(queue, clock_ms=clock)
    while len(queue) < segments or queue.last() is None:
        r = log.append(Message(topic=topic, body=BODY))
        assert r.ok, r
    return log


def set_mtime(path: str, ms: int) -> None:
    os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))


def age_all(log: CommitLog, ms: int) -> None:
    """Make every segment's mtime `ms`."""
    for seg in log.queue.segments:
        set_mtime(seg.path, ms)


_CQ_UNIT = struct.Struct(">qiq")


def write_cq_file(qdir: Path, start: int, entries: list[tuple[int, int]], size: int) -> Path:
    """A consume-queue file named `start` holding (phys offset, size) entries."""
    qdir.mkdir(parents=True, exist_ok=True)
    raw = bytearray(size)
    for i, (phys, n) in enumerate(entries):
        _CQ_UNIT.pack_into(raw, i * 20, phys, n, 0)
    p = qdir / f"{start:020d}"
    p.write_bytes(bytes(raw))
    return p


def write_index_file(idir: Path, name: str, end_phy: int, size: int = 4096) -> Path:
    idir.mkdir(parents=True, exist_ok=True)
    raw = bytearray(size)
    struct.pack_into(">qqqqii", raw, 0, 1, 2, 0, end_phy, 1, 2)
    p = idir / name
    p.write_bytes(bytes(raw))
    return p
