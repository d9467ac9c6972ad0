"""The control block and the locks, in-process with real shared memory and real files."""

from __future__ import annotations

import ast
import inspect
import multiprocessing
import os
import re
import threading
import time
from pathlib import Path

import pytest

from mqstore import _native
from mqstore.ipc import control as c
from mqstore.ipc import control_views as v
from mqstore.ipc.control_views import Flags
from mqstore.ipc.locks import FileLock, StoreLockHeld, store_lock_holder, take_store_lock


@pytest.fixture
def cb(tmp_path: Path) -> c.ControlBlock:
    block = c.ControlBlock.create(tmp_path, 1, c.Geometry(65536, 2, slot_count=64))
    yield block  # type: ignore[misc]
    block.close()
    assert c.leftover_shm(tmp_path) == []


def test_layout_regions_do_not_overlap() -> None:
    assert c.OFF_COMMITTED_SEQ + 8 <= c.WORKERS_OFF
    assert c.WORKERS_OFF + c.MAX_WORKERS * c.WORKER_ROW <= c.CLIENTS_OFF
    assert c.CLIENTS_OFF + c.MAX_CLIENTS * c.CLIENT_ROW <= c.SLOTS_OFF
    assert c.OFF_SEQ == c.OFF_RESERVED + 8  # written together, one pack: the commit point
    assert c.OFF_CS_SEQ == c.OFF_CS_PID + 8
    # The native area sits between the dispatch-lag histogram and the client rows.
    assert c.OFF_DISPATCH_LAG_HIST + 8 * c.DISPATCH_LAG_BUCKETS <= c.OFF_RESERVE_MUTEX
    assert c.OFF_OWNER_DEAD + 8 <= c.OFF_GATHER_WANT
    assert c.OFF_GATHER_WANT + 8 <= c.OFF_FENCE_SEQ
    assert c.OFF_FENCE_SEQ + 8 <= c.OFF_IDLE_WAKE
    assert c.OFF_IDLE_WAKE + 4 == c.OFF_IDLE_SLEEPS
    assert c.OFF_IDLE_SLEEPS + 4 <= c.OFF_LOCK_SINCE
    assert c.OFF_LOCK_SINCE + 8 == c.OFF_LOCK_QUEUED
    assert c.OFF_LOCK_QUEUED + 8 == c.OFF_ROOM_TIMEOUTS
    assert c.OFF_ROOM_TIMEOUTS + 8 == c.OFF_COMMIT_DRAIN
    assert c.OFF_COMMIT_DRAIN + 8 <= c.CLIENTS_OFF


def test_the_c_core_uses_the_same_layout() -> None:
    """ipc/native/mqs_layout.h mirrors ipc/control.py: every offset C uses, compared."""
    layout = dict(_native.LAYOUT)
    assert layout.pop("MAGIC_VERSION") == c.MAGIC_VERSION
    for name, off in layout.items():
        assert getattr(c, name) == off, name


def test_the_pool_is_allocated_at_create(cb: c.ControlBlock) -> None:
    """Every page of the pool exists once the store has created it (RocketMQ's pool
    warm-up): a put never allocates one, and a /dev/shm too small fails at start."""
    st = os.stat(os.path.join("/dev/shm", cb.pool_name.lstrip("/")))
    assert st.st_size == 2 * 65536
    assert st.st_blocks * 512 >= st.st_size


def test_create_attach_and_fields(cb: c.ControlBlock, tmp_path: Path) -> None:
    assert sorted(c.leftover_shm(tmp_path)) == sorted([cb.ctl_name, cb.pool_name])
    other = c.ControlBlock.attach(cb.ctl_name, cb.pool_name)
    try:
        cb.set(c.OFF_RESERVED, 123)
        assert other.get(c.OFF_RESERVED) == 123
        assert (other.segment_size, other.pool_buffers, other.slot_count) == (65536, 2, 64)
        v = other.pool_view(3)  # segment 3 uses buffer 1
        v[:3] = b"abc"
        v.release()
        assert cb.pool_buf is not None and bytes(cb.pool_buf[65536 : 65536 + 3]) == b"abc"
        Flags(cb).mark_running()
        Flags(cb).mark_read_only()
        assert Flags(other).names() == ["running", "read_only"]
    finally:
        other.close()
    assert len(c.leftover_shm(tmp_path)) == 2  # a non-owner's close unlinks nothing


def test_queue_table_rows_are_found_again(cb: c.ControlBlock) -> None:
    rows = {(t, q): cb.find_or_add_queue(t.encode(), q) for t in ("a", "b", "é") for q in range(5)}
    assert len(set(rows.values())) == 15
    for (t, q), row in rows.items():
        assert cb.find_or_add_queue(t.encode(), q) == row
        assert cb.qrow(row) == (t, q, 0)
    assert sorted(cb.queue_rows()) == sorted((t, q, 0) for t, q in rows)


def test_check_reports_positions_out_of_order(cb: c.ControlBlock) -> None:
    cb.set(c.OFF_ALLOCATED, 1 << 20)
    assert cb.check() == []
    cb.set(c.OFF_FLUSHED, 10)
    assert any("out of order" in f.what for f in cb.check())


REPO = Path(__file__).resolve().parent.parent.parent
_SOURCES = ("engine", "ipc", "workers", "pipeline", "bench")


def _calls_and_offsets() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(file, writer method) of every call of a view's write method, and (file, name) of
    every `OFF_*` name used, in the tree outside tests/."""
    calls, offsets = [], []
    for top in _SOURCES:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                func = node.func if isinstance(node, ast.Call) else None
                if isinstance(func, ast.Attribute) and func.attr in v.WRITERS:
                    calls.append((rel, func.attr))
                name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
                if isinstance(name, str) and name.startswith("OFF_"):
                    offsets.append((rel, name))
    return calls, offsets


def test_each_header_field_is_written_by_its_owner_only() -> None:
    """One writer per field as an API: each write method of the views is called only
    from the files `WRITERS` names, and nothing outside the two modules of the layout
    uses a raw offset of the header (the native area is the C core's)."""
    views = [v.Positions, v.Reservation, v.Flags, v.DiskWord, v.FlushStats, v.Histograms]
    views.append(v.DispatchStats)
    methods = {n for view in views for n, f in vars(view).items() if inspect.isfunction(f)}
    reads = {"reserved_and_seq", "readable_end", "names"}
    reads |= {"fsync_us", "group_commits", "dispatch_lag_ms"}
    public = {m for m in methods if not m.startswith("_")}
    assert public - reads == set(v.WRITERS)  # every public method reads, or is a writer
    calls, offsets = _calls_and_offsets()
    assert {m for _f, m in calls} == set(v.WRITERS)  # every writer has its caller
    assert [(f, m) for f, m in calls if f not in v.WRITERS[m]] == []
    layout = ("ipc/control.py", "ipc/control_views.py")
    native = {n for n in dir(c) if n.startswith("OFF_") and getattr(c, n) >= c.OFF_RESERVE_MUTEX}
    assert [u for u in offsets if u[0] not in layout and u[1] not in native] == []


def test_the_layout_table_matches_the_code() -> None:
    """ipc/control.py's docstring: its version is MAGIC_VERSION's, its tables list every
    offset constant below the client rows (and no other), and each view method it names
    as a writer exists, as does each one of `WRITERS` it should name."""
    doc = c.__doc__ or ""
    versions = set(re.findall(r"layout version (\d+)", doc))
    assert versions == {str(c.MAGIC_VERSION & 0xFF)}
    rows = {int(m) for m in re.findall(r"^\| (\d+) +\|", doc, re.MULTILINE)}
    consts = {getattr(c, n) for n in dir(c) if n.startswith("OFF_")}
    unused: set[int] = set()  # every row is a field now (200: topics_deleted)
    assert rows - unused == {off for off in consts if off < c.WORKERS_OFF or off >= 2048}
    named = re.findall(r"`([A-Z]\w+)\.([a-z_]+)`", doc)
    for view, method in named:
        if view != "ControlBlock":
            assert callable(getattr(getattr(v, view), method)), (view, method)
    written = {m for _v, m in named} | set(re.findall(r"`([a-z_]+)`", doc))
    assert set(v.WRITERS) - {"skip_to"} <= written


@pytest.mark.parametrize(("pool", "sync", "end"), [(2, True, 10), (2, False, 20), (0, False, 30)])
def test_readable_end(tmp_path: Path, pool: int, sync: bool, end: int) -> None:
    block = c.ControlBlock.create(tmp_path, 1, c.Geometry(65536, pool, slot_count=8))
    try:
        pos = v.Positions(block)
        for off, value in ((c.OFF_FLUSHED, 10), (c.OFF_COMMITTED, 20), (c.OFF_PUBLISHED, 30)):
            block.set(off, value)
        assert pos.readable_end(sync) == end
    finally:
        block.close()


def test_flush_statistics_and_histograms(cb: c.ControlBlock) -> None:
    stats, hist, pos = v.FlushStats(cb), v.Histograms(cb), v.Positions(cb)
    stats.record_fsync(3000, 5)
    pos.advance_flushed(100, 7, 5)
    hist.count_fsync(100, 5)  # 100 µs: bucket 1 (up to 128); 5 slots: bucket 3 (up to 8)
    assert (stats.fsyncs, stats.fsync_slots, stats.fsync_ns) == (1, 5, 3000)
    assert (pos.flushed, pos.flushed_ts, pos.flushed_seq) == (100, 7, 5)
    assert hist.fsync_us()[:3] == [0, 1, 0] and hist.group_commits()[:4] == [0, 0, 0, 1]
    hist.store_dispatch_lag([1, 2] + [0] * (c.DISPATCH_LAG_BUCKETS - 2), 9)
    assert hist.dispatch_lag_ms()[:3] == [1, 2, 0] and hist.dispatch_lag_sum_ms == 9


def test_remove_leftovers(tmp_path: Path) -> None:
    block = c.ControlBlock.create(tmp_path, 7, c.Geometry(65536, 1, slot_count=8))
    names = c.leftover_shm(tmp_path)
    assert len(names) == 2
    # A crash: the mapping goes away without unlinking.
    block.owner = False
    block.close()
    assert c.remove_leftovers(tmp_path) == names
    assert c.leftover_shm(tmp_path) == []


def _hold_and_die(path: str, ready: multiprocessing.synchronize.Event) -> None:
    lock = FileLock(path)
    lock.acquire()
    ready.set()
    time.sleep(600)


def test_file_lock_is_released_when_its_holder_is_killed(tmp_path: Path) -> None:
    path = str(tmp_path / "l")
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_and_die, args=(path, ready))
    p.start()
    assert ready.wait(60)
    lock = FileLock(path)
    assert not lock.try_acquire()
    p.kill()
    p.join()
    lock.acquire()  # would block forever if death did not release it
    lock.release()
    lock.close()


def test_store_lock_names_its_holder(tmp_path: Path) -> None:
    assert store_lock_holder(str(tmp_path)) is None
    fd = take_store_lock(str(tmp_path))
    try:
        assert store_lock_holder(str(tmp_path)) == os.getpid()
        with pytest.raises(StoreLockHeld, match=f"pid {os.getpid()}"):
            take_store_lock(str(tmp_path))
    finally:
        os.close(fd)
    assert store_lock_holder(str(tmp_path)) is None


def test_client_row_has_a_field_per_put_status() -> None:
    from mqstore.ipc.results import PutMessageStatus

    assert len(PutMessageStatus) == c.STATUS_FIELDS
    assert c.CLIENTS_OFF + c.MAX_CLIENTS * c.CLIENT_ROW <= c.SLOTS_OFF


def test_flusher_gather_waits_for_the_group_not_for_each_arrival(cb: c.ControlBlock) -> None:
    """The flusher's gather (workers/flusher.py) sleeps until published_seq reaches the
    group it wants; a producer whose arrival leaves the group short does not wake it, the
    one that completes it does, and the timeout bounds it."""

    def u32(off: int) -> int:
        return int.from_bytes(cb.buf[off : off + 4], "little")

    cb.set(c.OFF_PUBLISHED_SEQ, 5)
    assert _native.flusher_gather(cb.buf, 5, 10**9) is True  # already there: at once
    t0 = time.monotonic()
    assert _native.flusher_gather(cb.buf, 6, 20_000_000) is False  # never reached
    assert time.monotonic() - t0 >= 0.019
    assert cb.get(c.OFF_GATHER_WANT) == 0

    got: list[bool] = []
    waiter = threading.Thread(
        target=lambda: got.append(_native.flusher_gather(cb.buf, 8, 60 * 10**9))
    )
    waiter.start()
    deadline = time.monotonic() + 30
    while cb.get(c.OFF_GATHER_WANT) != 8:  # it is gathering
        assert time.monotonic() < deadline, "the gather never started"
        time.sleep(0.001)
    while u32(c.OFF_FLUSHER_SLEEPS) != 1:
        assert time.monotonic() < deadline, "the gather never slept"
        time.sleep(0.001)
    wakes = u32(c.OFF_FLUSHER_WAKE)
    cb.set(c.OFF_PUBLISHED_SEQ, 7)
    _native.flusher_wake(cb.buf)  # one short: no wake-up
    assert u32(c.OFF_FLUSHER_WAKE) == wakes
    waiter.join(0.2)
    assert waiter.is_alive() and not got
    cb.set(c.OFF_PUBLISHED_SEQ, 8)
    _native.flusher_wake(cb.buf)  # completes the group
    waiter.join(30)
    assert got == [True]
    assert u32(c.OFF_FLUSHER_WAKE) == wakes + 1
    assert cb.get(c.OFF_GATHER_WANT) == 0 and u32(c.OFF_FLUSHER_SLEEPS) == 0


def _u32(cb: c.ControlBlock, off: int) -> int:
    return int.from_bytes(cb.buf[off : off + 4], "little")


def _sleeper(call: object) -> tuple[threading.Thread, list[bool]]:
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(call()))  # type: ignore[operator]
    t.start()
    return t, got


def test_an_idle_sleep_ends_at_the_next_publish_and_costs_one_wake(cb: c.ControlBlock) -> None:
    """The idle committer's and dispatcher's sleep (workers/committer.py,
    workers/dispatcher.py): at once when published_pos is past what they saw, the whole
    timeout when nothing comes, and woken by the first publish that moves it, long
    before its timeout; that publish takes the flag back, so the next ones wake no one."""
    cb.set(c.OFF_PUBLISHED, 100)
    assert _native.idle_sleep(cb.buf, 99, 60 * 10**9) is True  # already past: at once
    t0 = time.monotonic()
    assert _native.idle_sleep(cb.buf, 100, 20_000_000) is False  # nothing came
    assert time.monotonic() - t0 >= 0.019
    _native.idle_wake(cb.buf)  # the flag that sleep left: taken, one bump
    wakes = _u32(cb, c.OFF_IDLE_WAKE)
    assert _u32(cb, c.OFF_IDLE_SLEEPS) == 0

    t, got = _sleeper(lambda: _native.idle_sleep(cb.buf, 100, 60 * 10**9))
    deadline = time.monotonic() + 30
    while _u32(cb, c.OFF_IDLE_SLEEPS) != 1:
        assert time.monotonic() < deadline, "the sleep never said so"
        time.sleep(0.001)
    t.join(0.2)
    assert t.is_alive() and not got  # asleep, nothing published
    # one DONE slot at seq 0, published by the producers' own step
    cb.set(c.OFF_SEQ, 1)
    c.SLOT.pack_into(cb.buf, c.SLOTS_OFF, 100, 0, 1, 50, os.getpid(), 0, c.STATE_DONE)
    t0 = time.monotonic()
    assert _native.publish(cb.buf) == 1
    t.join(30)
    assert got == [True] and time.monotonic() - t0 < 30
    assert _u32(cb, c.OFF_IDLE_WAKE) == wakes + 1 and _u32(cb, c.OFF_IDLE_SLEEPS) == 0
    cb.set(c.OFF_SEQ, 2)
    c.SLOT.pack_into(cb.buf, c.SLOTS_OFF + c.SLOT_ROW, 150, 1, 2, 50, os.getpid(), 0, 2)
    assert _native.publish(cb.buf) == 1
    assert _u32(cb, c.OFF_IDLE_WAKE) == wakes + 1  # nobody sleeps: no wake


def test_the_dispatcher_sleeps_until_a_flush_and_asks_for_none(cb: c.ControlBlock) -> None:
    """`wait_flushed_past` (the dispatcher under SYNC_FLUSH): woken by the flusher's
    wake after a flush, long before its timeout, answering from the flushed position
    (a wake without progress answers False); it records no sync request and does not
    wake the flusher."""
    cb.set(c.OFF_FLUSHED, 100)
    assert _native.wait_flushed_past(cb.buf, 99, 60 * 10**9) is True
    assert _native.wait_flushed_past(cb.buf, 100, 10_000_000) is False
    flusher_wakes = _u32(cb, c.OFF_FLUSHER_WAKE)

    def woken(flushed: int) -> list[bool]:
        t, got = _sleeper(lambda: _native.wait_flushed_past(cb.buf, 100, 60 * 10**9))
        while t.is_alive() and not got:  # until it is woken: it may not sleep yet
            cb.set(c.OFF_FLUSHED, flushed)
            _native.flushed_wake(cb.buf, 100)  # the round's wake: bits of (100, flushed]
            t.join(0.01)
        t.join()
        return got

    assert woken(100) == [False]  # a wake, nothing flushed: not an answer
    cb.set(c.OFF_FLUSHED, 100)
    assert woken(200) == [True]
    assert _native.sync_request(cb.buf) == 0 and _u32(cb, c.OFF_FLUSHER_WAKE) == flusher_wakes
