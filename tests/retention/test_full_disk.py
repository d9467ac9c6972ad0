"""The full-disk cycle on a real, size-limited filesystem (a tmpfs mounted for the test).

Fill the disk until the guard (real psutil) says DISK_FULL and puts are refused; free
it and see puts resume by themselves; fill it again and let the cleaner free it; every
acknowledged message that was not deleted on purpose reads back intact.
Skips, saying why, where a tmpfs cannot be mounted (not root, no mount permission).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.conf.settings import StoreSettings
from mqstore.engine.commitlog import AppendStatus, CommitLog
from mqstore.engine.diskguard import DiskGuard, guarded_allocator, psutil_usage, store_paths
from mqstore.engine.record import Message
from mqstore.engine.retention import CleanReason, Retention
from mqstore.engine.segment import Segment
from mqstore.engine.segment_queue import SegmentQueue

FS_BYTES = 8 * 1024 * 1024
SEG = 512 * 1024
BODY_LEN = 1000


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root (CAP_SYS_ADMIN); not root here")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES},mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


def _body(i: int) -> bytes:
    return i.to_bytes(8, "big") * (BODY_LEN // 8)


def test_fill_refuse_free_resume_then_clean(small_fs: Path) -> None:
    store = small_fs / "store"
    log_dir = store / "commitlog"
    settings = StoreSettings(segment_size_bytes=SEG)
    guard = DiskGuard(store_paths(store), settings)  # the real psutil probe
    assert psutil_usage(str(store)).total_bytes == FS_BYTES

    def create(start: int) -> Segment:
        return Segment.create(log_dir, start, SEG)

    queue = SegmentQueue(log_dir, SEG, allocator=guarded_allocator(create, log_dir, SEG))
    queue.load()
    log = CommitLog(queue)
    acked: dict[int, int] = {}  # physical offset -> message number
    n = 0

    def put_until_refused(limit: int) -> AppendStatus:
        nonlocal n
        for _ in range(limit):
            guard.check()
            guard.apply(log)
            r = log.append(Message(topic="T", body=_body(n)))
            if not r.ok:
                return r.status
            acked[r.wrote_offset] = n
            n += 1
        raise AssertionError(f"the disk never filled after {limit} puts")

    # 1. Ballast takes 3 MiB; the log fills the rest until the guard trips.
    ballast = small_fs / "ballast"
    fd = os.open(ballast, os.O_CREAT | os.O_RDWR, 0o600)
    os.posix_fallocate(fd, 0, 3 * 1024 * 1024)
    os.close(fd)
    status = put_until_refused(20_000)
    assert status is AppendStatus.SERVICE_NOT_AVAILABLE
    assert guard.disk_full and guard.last is not None and guard.last.ratio > 0.90
    end = log.max_offset()
    refused = log.append(Message(topic="T", body=b"late"))
    assert refused.status is AppendStatus.SERVICE_NOT_AVAILABLE
    assert "DISK_FULL" in refused.reason
    assert log.max_offset() == end  # nothing half-written

    # 2. Free the ballast: the store is writable again by itself, no restart.
    ballast.unlink()
    v = guard.check()
    assert v.ratio <= 0.85 and v.changed and not guard.disk_full
    guard.apply(log)
    assert log.append(Message(topic="T", body=_body(n))).ok
    acked[end] = n
    n += 1

    # 3. Fill again with the log alone; the cleaner (clean immediately, over 85 %)
    #    deletes the oldest flushed segments and the puts resume.
    assert put_until_refused(20_000) is AppendStatus.SERVICE_NOT_AVAILABLE
    log.queue.flush_all()
    ret = Retention(store, log.queue, guard, settings, sleep_ms=lambda ms: None)
    deleted: list[int] = []
    report = ret.run_once(keep_from_offset=log.queue.flushed_where)
    deleted += [d.start_offset for d in report.deleted]
    # The run re-checks the disk after deleting: writable at once, not at the next tick.
    assert report.disk is not None and report.disk.disk_full
    assert report.disk_after is not None and not report.disk_after.disk_full
    assert deleted, "the cleaner deleted nothing"
    assert all(
        d.reason is CleanReason.CLEAN_IMMEDIATELY for d in report.deleted if d.kind == "commitlog"
    )
    assert not guard.disk_full and guard.last is not None and guard.last.ratio <= 0.85
    guard.apply(log)
    r = log.append(Message(topic="T", body=_body(n)))
    assert r.ok
    acked[r.wrote_offset] = n

    # 4. Every acknowledged message still in the log reads back intact.
    low = log.min_offset()
    kept = {off: i for off, i in acked.items() if off >= low}
    assert len(kept) > 100
    for off, i in kept.items():
        got = log.read(off)
        assert got.record is not None and got.record.body == _body(i), off
    assert all(off < low for off in acked if off not in kept)
    assert min(deleted) < low
    log.close()
