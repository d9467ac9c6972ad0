"""The files a store writes (issue 15): owner-only modes for every file and directory,
and no store file is ever a symbolic link that the store writes through."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mqstore import StoreClient
from mqstore.engine.recovery import REPORT_FILE
from mqstore.workers.cleaner import STATUS_FILE
from tests.engine.extents import mapped_store_dirties, unwritten_bytes
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import wait_for


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_every_file_and_directory_the_store_writes_is_owner_only(
    make_store: StoreFactory,
) -> None:
    store = make_store({"clean_resource_interval_ms": 200})  # the cleaner's status soon
    with StoreClient.attach(store.path) as client:
        for i in range(20):
            assert client.put("t", b"m%d" % i, queue_id=0).ok
        client.commit_offset("g", "t", 0, 5)  # a consumer-offsets file (engine.jsonconfig)
    wait_for(lambda: (store.path / STATUS_FILE).exists(), 120, "the cleaner's status file")
    assert store.stop() == 0
    written = (store.path / REPORT_FILE, store.path / STATUS_FILE)
    assert all(p.exists() for p in written), written
    wrong = []
    for root, dirs, files in os.walk(store.path):
        for d in dirs:
            if _mode(Path(root) / d) != 0o700:
                wrong.append((Path(root) / d, oct(_mode(Path(root) / d))))
        for f in files:
            p = Path(root) / f
            if p.name == "mqstore.toml":  # the test's own configuration file
                continue
            if _mode(p) != 0o600:
                wrong.append((p, oct(_mode(p))))
    assert wrong == []
    assert _mode(store.path) == 0o700


@pytest.mark.parametrize("which", [0, -1], ids=["segment-with-data", "last-segment"])
def test_a_segment_that_is_a_symlink_is_refused_not_written_through(
    make_store: StoreFactory, tmp_path: Path, which: int
) -> None:
    store = make_store()
    with StoreClient.attach(store.path) as client:
        assert client.put("t", b"x" * 100, queue_id=0).ok
    assert store.stop() == 0
    last = sorted((store.path / "commitlog").iterdir())[which]
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not the store's" * 10)
    before = outside.read_bytes()
    last.unlink()
    last.symlink_to(outside)
    store.start(wait=False)
    assert store.proc is not None
    code = store.proc.wait(60)
    assert code != 0
    out = store.output()
    assert "is a symbolic link" in out and last.name in out, out[-2000:]
    assert outside.read_bytes() == before  # not extended, not truncated
    assert last.is_symlink()  # not deleted
    store.proc = None
    store._log.close()


@pytest.mark.parametrize(
    ("mode", "zeros", "unwritten"),
    [("SYNC_FLUSH", True, False), ("SYNC_FLUSH", False, True), ("ASYNC_FLUSH", True, True)],
    ids=["sync-zeroed", "sync-not-asked", "async"],
)
def test_segments_made_ahead_under_sync_flush_are_written_with_zeros(
    make_store: StoreFactory, mode: str, zeros: bool, unwritten: bool
) -> None:
    """The allocator's segments, those made at boot and those made ahead as the log grows:
    under SYNC_FLUSH (`sync_flush_zero_segments`) every block is written, so the sync
    round's fdatasync never converts an extent; otherwise they are only fallocated."""
    store = make_store({"flush_disk_type": mode, "sync_flush_zero_segments": zeros})
    log_dir = store.path / "commitlog"
    with StoreClient.attach(store.path) as client:
        for _ in range(24):  # 1.5 segments: the allocator makes the next ones ahead
            assert client.put("t", b"x" * 65536, queue_id=0, wait_store=False).ok
    wait_for(lambda: len(list(log_dir.iterdir())) >= 4, 60, "segments made ahead")
    assert store.stop() == 0
    newest = sorted(log_dir.iterdir())[-1]  # made ahead, never written by a put
    size = newest.stat().st_size
    assert unwritten_bytes(newest) == (size if unwritten else 0)


def test_with_the_pool_off_a_put_through_the_mapping_dirties_one_page_of_a_new_segment(
    make_store: StoreFactory,
) -> None:
    """Pool off under SYNC_FLUSH, producers store into the segments' mappings, and the
    sync round's fdatasync writes every page-cache folio they dirtied. The allocator
    writes those segments' zeros a page at a time, so a 1 KiB record dirties one 4 KiB
    page, not a folio of the 1 MiB write that zeroed it (3x the fdatasync measured)."""
    store = make_store({"flush_disk_type": "SYNC_FLUSH", "transient_store_pool_enable": False})
    log_dir = store.path / "commitlog"
    with StoreClient.attach(store.path) as client:
        for _ in range(24):  # 1.5 segments: the allocator makes the next ones ahead
            assert client.put("t", b"x" * 65536, queue_id=0, wait_store=False).ok
    wait_for(lambda: len(list(log_dir.iterdir())) >= 4, 60, "segments made ahead")
    assert store.stop() == 0
    newest = sorted(log_dir.iterdir())[-1]  # made ahead by the allocator, never written
    assert unwritten_bytes(newest) == 0
    for offset in (0, 512 * 1024 + 100, newest.stat().st_size - 1024):
        assert mapped_store_dirties(newest, offset) == 4096


def test_the_supervisor_and_its_workers_run_at_store_nice(make_store: StoreFactory) -> None:
    """`store_nice` is set by the supervisor before it starts the workers, which inherit
    it (a higher value than the test's own is allowed without privileges)."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    nice = min(mine + 3, 19)
    store = make_store({"store_nice": nice})
    store.wait_workers_running()
    assert store.proc is not None
    pids = [store.proc.pid] + [w["pid"] for w in store.status()["workers"]]
    assert len(pids) >= 6
    assert {os.getpriority(os.PRIO_PROCESS, pid) for pid in pids} == {nice}
    assert f"nice {nice}" in store.output()


def _slice_ns(pid: int) -> int | None:
    """The process's scheduler slice (`se.slice` in /proc/<pid>/sched), None if not shown."""
    with open(f"/proc/{pid}/sched") as f:
        for line in f:
            if line.startswith("se.slice"):
                return int(line.split(":")[1])
    return None


def _custom_slices() -> bool:
    """Linux 6.12 or later: a SCHED_OTHER task's `sched_runtime` is its slice."""
    parts = os.uname().release.split(".")
    major, minor = int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    return (major, minor) >= (6, 12) and _slice_ns(os.getpid()) is not None


@pytest.mark.parametrize("us", [250, 0])
def test_the_supervisor_and_its_workers_ask_for_store_slice_us(
    make_store: StoreFactory, us: int
) -> None:
    """`store_slice_us` is asked for by the supervisor before it starts the workers, which
    inherit it (a woken flusher preempts a producer's longer slice); 0 leaves the kernel's
    default, the slice this test runs with."""
    if not _custom_slices():
        pytest.skip("kernel before 6.12: no custom EEVDF slices")
    store = make_store({"store_slice_us": us})
    store.wait_workers_running()
    assert store.proc is not None
    pids = [store.proc.pid] + [w["pid"] for w in store.status()["workers"]]
    assert len(pids) >= 6
    want = us * 1000 if us else _slice_ns(os.getpid())
    assert {_slice_ns(pid) for pid in pids} == {want}
    assert (f"time slice {us} us" in store.output()) == bool(us)


def _may_run_real_time() -> bool:
    """Whether this process may ask for SCHED_FIFO (CAP_SYS_NICE or RLIMIT_RTPRIO)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            os._exit(1)
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_the_flusher_runs_at_flusher_rt_priority_under_sync_flush(
    make_store: StoreFactory, flush: str
) -> None:
    """`flusher_rt_priority` makes the flusher alone SCHED_FIFO at that priority, under
    SYNC_FLUSH only; refused (no CAP_SYS_NICE), the log says so and the store runs. Sync
    puts stay PUT_OK: the real-time flusher sleeps between rounds rather than yield."""
    store = make_store({"flush_disk_type": flush, "flusher_rt_priority": 2})
    store.wait_workers_running()
    workers = {w["name"]: w["pid"] for w in store.status()["workers"]}
    with StoreClient.attach(store.path) as client:
        for i in range(50):
            assert client.put("t", b"m%d" % i).ok
    allowed, sync = _may_run_real_time(), flush == "SYNC_FLUSH"
    for name, pid in workers.items():
        rt = sync and allowed and name == "flusher"
        assert os.sched_getscheduler(pid) == (os.SCHED_FIFO if rt else os.SCHED_OTHER), name
        assert os.sched_getparam(pid).sched_priority == (2 if rt else 0), name
    said = store.output()
    assert ("real-time priority 2 (SCHED_FIFO)" in said) == (sync and allowed)
    assert ("real-time priority 2 not applied" in said) == (sync and not allowed)
