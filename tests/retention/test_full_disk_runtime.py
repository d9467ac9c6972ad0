"""The full-disk cycle of a running store, on a real size-limited filesystem.

The whole store (segments, consume queues, index) lives on a tmpfs mounted for the test;
the supervisor, its cleaner (real psutil) and producers are real processes. A ballast
file brings the disk near the warning ratio; the puts fill the log until the allocator's
next segment tips it over, the cleaner publishes DISK_FULL and puts are refused with
SERVICE_NOT_AVAILABLE and the reason; nothing half-written. Removing the ballast makes the
store writable again by itself, with no restart. Every acknowledged message still in the
log (the cleaner may delete the oldest segments, over the force ratio) reads back intact.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mqstore import PutMessageStatus, PutResult, StoreClient
from tests.runtime.harness import REPO, Store, wait_for

FS_BYTES = 48 * 1024 * 1024
SEG = 1024 * 1024
CONFIG = {
    "segment_size_bytes": SEG,
    "transient_store_pool_enable": False,
    "consume_queue_file_size_bytes": 20 * 4096,
    "max_hash_slot_num": 1024,
    "max_index_num": 4096,
    # the guard at RocketMQ's defaults (the harness moves it out of the way for the others)
    "disk_space_warning_level_ratio": 0.90,
    "disk_space_clean_forcibly_ratio": 0.85,
}
TINY_FS_BYTES = 24 * 1024 * 1024


@contextlib.contextmanager
def _tmpfs(mnt: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes on `mnt`, unmounted on the way out (skips when the
    test may not mount)."""
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root (CAP_SYS_ADMIN); not root here")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with _tmpfs(tmp_path / "mnt", FS_BYTES) as mnt:
        yield mnt


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    with _tmpfs(tmp_path / "mnt", TINY_FS_BYTES) as mnt:
        yield mnt


def _used(path: Path) -> int:
    return int(psutil.disk_usage(str(path)).used)


@pytest.mark.slow
def test_running_store_refuses_when_full_and_resumes_by_itself(small_fs: Path) -> None:
    st = Store(small_fs / "store", CONFIG)
    st.start()
    try:
        st.wait_workers_running()
        # Ballast up to 87 % of the filesystem: the next segments tip it over 90 %.
        ballast = small_fs / "ballast"
        room = int(FS_BYTES * 0.87) - _used(small_fs)
        assert room > 0
        fd = os.open(ballast, os.O_CREAT | os.O_RDWR, 0o600)
        os.posix_fallocate(fd, 0, room)
        os.close(fd)
        acked: dict[int, bytes] = {}
        refused = None
        with StoreClient.attach(st.path) as client:
            for i in range(40_000):
                body = i.to_bytes(8, "big") * 125
                r = client.put("fill", body, queue_id=0)
                if r.status is PutMessageStatus.PUT_OK:
                    acked[r.physical_offset] = body
                    continue
                refused = r
                break
            assert refused is not None, "the disk never filled"
            assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, refused
            assert "disk is full" in refused.reason, refused.reason
            disk = st.status()["cleaner"]["disk"]
            assert disk["disk_full"] and disk["ratio"] > 0.90, (disk, _used(small_fs), len(acked))
            reserved = st.status()["positions"]["reserved"]
            again = client.put("fill", b"late", queue_id=0)
            assert again.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
            assert st.status()["positions"]["reserved"] == reserved  # nothing half-written

            ballast.unlink()  # space is back: writable again by itself, no restart

            def writable() -> bool:
                r = client.put("fill", b"after", queue_id=0)
                if r.status is PutMessageStatus.PUT_OK:
                    acked[r.physical_offset] = b"after"
                    return True
                assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, r
                return False

            wait_for(writable, 30, "puts to resume after the ballast was removed")
            assert not st.status()["cleaner"]["disk"]["disk_full"]
        assert st.stop() == 0
        recs = st.read_log()
        low = min(r.physical_offset for r in recs)
        kept = {off: body for off, body in acked.items() if off >= low}
        assert len(kept) > 100
        got = {r.physical_offset: r.body for r in recs}
        assert all(got.get(off) == body for off, body in kept.items())
        check = subprocess.run(
            [sys.executable, "-m", "mqstore", "check", str(st.path)],
            capture_output=True, text=True, cwd=str(REPO), timeout=60,
        )  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        st.stop()
    assert st.shm_leftovers() == []


# RocketMQ's default 6 MB consume-queue files on a 24 MiB disk: each new topic's queue takes
# a quarter of it.
TINY_CONFIG = {
    "segment_size_bytes": SEG,
    "transient_store_pool_enable": False,
    "max_hash_slot_num": 1024,
    "max_index_num": 4096,
    "clean_file_forcibly_enable": False,  # nothing acknowledged may be deleted here
    "clean_resource_interval_ms": 200,
    "disk_space_warning_level_ratio": 0.90,  # RocketMQ's, as in CONFIG
    "disk_space_clean_forcibly_ratio": 0.85,
}


def _fill(path: Path, leave: int = 0) -> None:
    """Take the free blocks of the filesystem holding `path` with one file, all but
    about `leave` bytes."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        size = 0
        step = 1 << 20
        while step >= 4096:
            try:
                if _free(path) - step < leave:
                    raise OSError(errno.ENOSPC, "leaving room")
                os.posix_fallocate(fd, 0, size + step)
                size += step
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                step //= 2
    finally:
        os.close(fd)


def _free(path: Path) -> int:
    return int(psutil.disk_usage(str(path.parent)).free)


def _workers(st: Store) -> dict[str, tuple[str, int]]:
    return {w["name"]: (w["state"], w["restarts"]) for w in st.status()["workers"]}


def _space_lines(st: Store) -> list[str]:
    return [ln for ln in st.output().splitlines() if "space" in ln and "DISK_FULL" not in ln]


@pytest.mark.slow
def test_full_disk_no_crash_loop_boots_and_resumes(tiny_fs: Path, tmp_path: Path) -> None:
    """A full disk is a condition that passes. The dispatcher waits for room for a new
    6 MB consume-queue file (it failed the store closed before); the store refuses puts
    with a status, stops, boots and recovers on the full disk (recovery needed the same
    file before), gives queue offsets past the undispatched records, and once space
    returns puts and dispatch resume by themselves with every acknowledged message
    readable. No worker restarts; each repeating condition is logged once."""
    st = Store(tiny_fs / "store", TINY_CONFIG, log_path=tmp_path / "supervisor.log")
    acked: dict[int, tuple[str, bytes]] = {}
    st.start()
    try:
        st.wait_workers_running()
        with StoreClient.attach(st.path) as client:

            def put(topic: str, body: bytes) -> PutResult:
                r = client.put(topic, body, queue_id=0)
                if r.status is PutMessageStatus.PUT_OK:
                    acked[r.physical_offset] = (topic, body)
                else:
                    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, r
                return r

            for t in range(2):
                for i in range(20):
                    put(f"t{t}", f"t{t}-{i}".encode() * 50)
            wait_for(lambda: client.max_offset("t1", 0) == 20, 30, "t0 and t1 to be dispatched")
            # Room left for the log, not for a third topic's 6 MB queue file, under the
            # warning ratio: puts are stored, the dispatcher waits for space for t2's queue.
            fillers = [tiny_fs / "filler-1", tiny_fs / "filler-2"]
            _fill(fillers[0], leave=4 << 20)
            for i in range(20):
                assert put("t2", f"t2-{i}".encode() * 50).status is PutMessageStatus.PUT_OK
            wait_for(lambda: any("dispatcher" in ln for ln in _space_lines(st)), 30,
                     "the dispatcher to say it waits for space")  # fmt: skip
            _fill(fillers[1])  # and now not a block is left
            wait_for(lambda: put("t0", b"late").status is not PutMessageStatus.PUT_OK, 30,
                     "puts to be refused on the full disk")  # fmt: skip
            refused = put("t0", b"refused")
            assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, refused
            assert "full" in refused.reason, refused.reason
            wait_for(lambda: st.status()["cleaner"]["disk"]["disk_full"], 30, "DISK_FULL")
            status = st.status()
            assert not status.get("read_only"), status.get("read_only_reason")
            assert all(state == "running" and n == 0 for state, n in _workers(st).values()), (
                _workers(st),
                st.output()[-3000:],
            )
        assert st.stop() == 0, st.output()[-3000:]
        # Restart on the still-full disk: recovery needs no new space.
        st.start()
        st.wait_workers_running()
        status = st.status()
        assert not status.get("read_only"), status.get("read_only_reason")
        wait_for(lambda: st.status()["cleaner"]["disk"]["disk_full"], 30, "DISK_FULL again")
        with StoreClient.attach(st.path) as client:
            still = client.put("t0", b"still full", queue_id=0)
            assert still.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, still
            for f in fillers:  # space is back: writes and dispatch resume by themselves
                f.unlink()

            def resumed() -> bool:
                r = client.put("t0", b"after", queue_id=0)
                if r.status is PutMessageStatus.PUT_OK:
                    acked[r.physical_offset] = ("t0", b"after")
                    return True
                return False

            wait_for(resumed, 30, "puts to resume once the filler was deleted")
            per_topic: dict[str, int] = {}
            for topic, _ in acked.values():
                per_topic[topic] = per_topic.get(topic, 0) + 1

            def dispatched() -> dict[str, int]:
                return {t: client.max_offset(t, 0) for t in per_topic}

            wait_for(lambda: dispatched() == per_topic, 30, "every message to be dispatched")
            for off, (topic, body) in acked.items():
                rec = client.get(off)
                assert rec is not None and (rec.topic, rec.body) == (topic, body), off
        assert all(n == 0 for _, n in _workers(st).values()), _workers(st)
        # A repeating condition is logged when it starts and when it changes, not every tick.
        lines = _space_lines(st)
        assert len(lines) <= 12, "\n".join(lines)
        assert st.stop() == 0
    finally:
        st.stop()
    assert st.shm_leftovers() == []


# An index file of 8.4 MB on the 24 MiB disk, nearly all of it pages no key touched yet.
BIG_INDEX_CONFIG = {
    **TINY_CONFIG,
    "consume_queue_file_size_bytes": 20 * 4096,
    "max_hash_slot_num": 100_000,
    "max_index_num": 400_000,
    "disk_space_warning_level_ratio": 1.0,  # the guard out of the way: this is the index's
    "disk_space_clean_forcibly_ratio": 1.0,
}


@pytest.mark.slow
def test_index_pages_are_taken_before_the_disk_fills(tiny_fs: Path, tmp_path: Path) -> None:
    """The index file is allocated when it is created. It was sparse: once the tmpfs was
    full, the dispatcher's first touch of an untouched index page was SIGBUS and it
    crash-looped; now every key still goes in, and a query finds it."""
    st = Store(tiny_fs / "store", BIG_INDEX_CONFIG, log_path=tmp_path / "supervisor.log")
    st.start()
    try:
        st.wait_workers_running()
        with StoreClient.attach(st.path) as client:
            first = client.put("idx", b"first", keys="k-first", queue_id=0)
            assert first.status is PutMessageStatus.PUT_OK, first
            wait_for(lambda: client.max_offset("idx", 0) == 1, 30, "the first dispatch")
            _fill(tiny_fs / "filler")  # not a block left
            n = 300  # keys over most of the 98 hash-slot pages
            for i in range(n):
                r = client.put("idx", b"m%d" % i, keys=f"key-{i}", queue_id=0)
                assert r.status is PutMessageStatus.PUT_OK, r
            wait_for(lambda: client.max_offset("idx", 0) == n + 1, 30, "every put dispatched")
            hits = client.query("idx", f"key-{n - 1}")
            assert [h.body for h in hits] == [b"m%d" % (n - 1)], hits
        workers = _workers(st)
        assert workers["dispatcher"] == ("running", 0), (workers, st.output()[-3000:])
        assert st.stop() == 0, st.output()[-3000:]
    finally:
        st.stop()
    assert st.shm_leftovers() == []
