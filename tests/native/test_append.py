"""The reservation step's native parts over a real control block (shared memory, no
supervisor): the lock, its repair after a dead holder, the liveness bytes and the futex
wait (the put's records against the reference: test_put_message.py). These run under
ASan/UBSan too (`make sanitize`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.ipc import control as c
from mqstore.ipc.commit import pid_alive
from mqstore.ipc.control_views import Flags
from mqstore.ipc.reservation import LIVE_LOCK, LiveLock, LiveTable
from tests.native.lock_reference import lock_held_reference
from tests.runtime.harness import wait_for

SEG = 1 << 20


def test_the_lock_times_out_while_another_thread_holds_it(cb: c.ControlBlock) -> None:
    a, b = (_native.Appender(cb.buf, cb.pool_buf, os.getpid()) for _ in range(2))
    try:
        assert a.lock(0) == 0
        got: list[int] = []
        t0 = time.monotonic()
        t = threading.Thread(target=lambda: got.append(b.lock(200_000_000)))
        t.start()
        t.join(10)
        assert got == [_native.LOCK_TIMEOUT] and time.monotonic() - t0 >= 0.19
        assert cb.get(c.OFF_LOCK_TIMEOUTS) == 1
        a.unlock()
        assert b.lock(0) == 0
        b.unlock()
    finally:
        a.close()
        b.close()


def test_the_wait_is_the_holders_hold_not_the_waiters_queue(cb: c.ControlBlock) -> None:
    """After RocketMQ's isOSPageCacheBusy: busy once the put lock has been held longer
    than osPageCacheBusyTimeOutMills by one holder. A waiter behind a queue of holders
    that each hold it briefly waits them out (it used to time out after its own wait of
    the timeout: 2 of 32,000 sync puts under load 40); one that has held it longer than
    the timeout makes a newcomer busy after the newcomer's own wait of the timeout."""
    a, b = (_native.Appender(cb.buf, cb.pool_buf, os.getpid()) for _ in range(2))
    try:
        assert a.lock(0) == 0
        since = cb.get(c.OFF_LOCK_SINCE)
        assert 0 < since <= time.monotonic_ns()
        got: list[int] = []
        released: list[bool] = []

        def wait() -> None:  # the waiter's own thread takes and releases the mutex
            got.append(b.lock_held(1_000_000_000, 10**10))
            if got[-1] == 0:
                released.append(cb.get(c.OFF_LOCK_SINCE) > 0)
                b.unlock()

        t = threading.Thread(target=wait)
        t0 = time.monotonic()
        t.start()

        # The holder hands over four times within the timeout: each new holder stamps the
        # time it took the lock (what a real handover writes), and the waiter waits on.
        def held(ns: int) -> None:
            wait_for(lambda: time.monotonic_ns() - cb.get(c.OFF_LOCK_SINCE) > ns, 30, "the hold")

        for _ in range(4):
            held(300_000_000)
            assert got == []
            cb.set(c.OFF_LOCK_SINCE, time.monotonic_ns())
        held(300_000_000)
        assert got == []  # 1.5 s of waiting: more than its timeout, no hold over it
        a.unlock()
        t.join(30)
        assert got == [0] and time.monotonic() - t0 >= 1.5
        assert cb.get(c.OFF_LOCK_TIMEOUTS) == 0
        assert released == [True] and cb.get(c.OFF_LOCK_SINCE) == 0
        # A holder that has held it for 5 s already: a newcomer with 0.5 s is busy after
        # its own 0.5 s (the holder may be about to let go).
        assert a.lock(0) == 0
        cb.set(c.OFF_LOCK_SINCE, time.monotonic_ns() - 5_000_000_000)
        t0 = time.monotonic()
        assert b.lock_held(500_000_000, 10**10) == _native.LOCK_TIMEOUT
        assert time.monotonic() - t0 >= 0.49
        assert cb.get(c.OFF_LOCK_TIMEOUTS) == 1
        # A fresh holder, but the waiter's cap (a sync put's flush timeout) is shorter
        # than the hold it would allow: refused at the cap, counted apart.
        cb.set(c.OFF_LOCK_SINCE, time.monotonic_ns())
        t0 = time.monotonic()
        assert b.lock_held(10**10, 300_000_000) == _native.LOCK_QUEUED
        assert time.monotonic() - t0 >= 0.29
        assert (cb.get(c.OFF_LOCK_TIMEOUTS), cb.get(c.OFF_LOCK_QUEUED)) == (1, 1)
        a.unlock()
        assert b.lock_held(10**9, 10**9) == 0
        b.unlock()
    finally:
        a.close()
        b.close()


_TICK = 100_000_000  # 0.1 s: the steps apart that a late wake-up cannot blur


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(held=st.integers(0, 4), hold=st.integers(1, 3), cap=st.integers(1, 3))
def test_the_lock_wait_matches_its_reference(
    cb: c.ControlBlock, held: int, hold: int, cap: int
) -> None:
    """`mqs_lock_held` against `lock_held_reference`: one holder that has held the lock for
    `held` ticks and keeps it; the waiter's answer, and it comes no sooner than said."""
    assume(cap != hold)  # not both at the same instant
    a, b = (_native.Appender(cb.buf, cb.pool_buf, os.getpid()) for _ in range(2))
    try:
        assert a.lock(0) == 0
        cb.set(c.OFF_LOCK_SINCE, time.monotonic_ns() - held * _TICK)
        want, after = lock_held_reference(held * _TICK, hold * _TICK, cap * _TICK)
        t0 = time.monotonic_ns()
        assert b.lock_held(hold * _TICK, cap * _TICK) == want
        assert time.monotonic_ns() - t0 >= after - _TICK // 10
        a.unlock()
    finally:
        a.close()
        b.close()


def test_a_holder_killed_in_the_section_is_repaired(cb: c.ControlBlock) -> None:
    """A child takes the lock, writes its intent and a committed slot for queue offset 5,
    and dies before writing the queue row back: the next locker sees EOWNERDEAD and
    moves the row past 5."""
    qs = cb.find_or_add_queue(b"t", 0)
    pid = os.fork()
    if pid == 0:  # the child: no Python-level cleanup, it dies holding the lock
        app = _native.Appender(cb.buf, cb.pool_buf, os.getpid())
        app.lock(0)
        cb.set(c.OFF_CS_SEQ, 0)
        cb.set(c.OFF_CS_PID, os.getpid())
        c.SLOT.pack_into(cb.buf, c.SLOTS_OFF, 0, 5, 1, 100, os.getpid(), qs, c.STATE_RESERVED)
        c.PAIR.pack_into(cb.buf, c.OFF_RESERVED, 100, 1)
        os._exit(0)
    os.waitpid(pid, 0)
    app = _native.Appender(cb.buf, cb.pool_buf, os.getpid())
    try:
        assert app.lock(10**9) == 0
        app.unlock()
        assert cb.get(cb.qrow_off(qs) + 8) == 6
        assert cb.get(c.OFF_CS_PID) == 0 and cb.get(c.OFF_OWNER_DEAD) == 1
    finally:
        app.close()


def test_liveness_is_the_held_byte_not_the_pid(tmp_path: Path) -> None:
    """A live process that is not a producer of this store (what a reused pid is) is not
    taken for one; a producer is alive while it holds its byte and dead once gone."""
    (tmp_path / LIVE_LOCK).touch()
    table = LiveTable(str(tmp_path))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(other.pid) and not table.alive(other.pid)
    finally:
        other.kill()
        other.wait()
    code = (
        "import sys; from mqstore.ipc.reservation import LiveLock; "
        f"lock = LiveLock({str(tmp_path)!r}); print('held', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    try:
        assert child.stdout.readline().strip() == "held"
        assert table.alive(child.pid)
        mine = LiveLock(str(tmp_path))  # a second holder in another process: shared
        assert table.alive(os.getpid())
        mine.close()
        assert not table.alive(os.getpid())
    finally:
        child.stdin.close()
        child.wait(30)
        child.stdout.close()
    assert not table.alive(child.pid)
    table.close()


def test_the_flush_wait_decides_from_the_flushed_position(cb: c.ControlBlock) -> None:
    app = _native.Appender(cb.buf, cb.pool_buf, os.getpid())
    try:
        cb.set(c.OFF_FLUSHED, 100)
        assert app.wait_flushed(100, 10**9) == 0
        t0 = time.monotonic()
        assert app.wait_flushed(200, 100_000_000) == 1  # nobody flushes: timed out
        assert 0.09 <= time.monotonic() - t0 < 5
        assert _native.sync_request(cb.buf) == 200  # the flusher would see the request

        def flusher() -> None:
            time.sleep(0.05)
            cb.set(c.OFF_FLUSHED, 300)
            _native.flushed_wake_all(cb.buf)

        t = threading.Thread(target=flusher)
        t.start()
        t0 = time.monotonic()
        assert app.wait_flushed(300, 5 * 10**9) == 0
        assert time.monotonic() - t0 < 2
        t.join()
        _native.flushed_wake_all(cb.buf)  # a wake without progress changes nothing
        assert app.wait_flushed(400, 50_000_000) == 1
        Flags(cb).mark_read_only()
        assert app.wait_flushed(400, 10**9) == 2
    finally:
        app.close()


@pytest.mark.parametrize("value", ["nowhere:kill", "copy-half:explode", "copy-half:kill:0"])
def test_a_malformed_crash_point_is_an_error_at_import(value: str) -> None:
    env = {**os.environ, "MQSTORE_CRASHPOINT": value}
    proc = subprocess.run(
        [sys.executable, "-c", "import mqstore._native"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0 and "expected <point>:<kill|stop>[:<nth>]" in proc.stderr


def test_a_crash_point_python_reaches_acts_at_its_nth_hit_only() -> None:
    """`_native.crash_point`: the dispatcher's index roll (Python) at the points the C
    table names; others and earlier hits are no-ops; a name it lacks is a ValueError."""
    code = (
        "from mqstore import _native\n"
        "_native.crash_point('index-roll'); _native.crash_point('copy-half')\n"
        "print('first', flush=True)\n"
        "_native.crash_point('index-roll')\n"
        "print('after')\n"
    )
    env = {**os.environ, "MQSTORE_CRASHPOINT": "index-roll:kill:2"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "first\n", proc
    _native.crash_point("index-roll-made")  # not armed here: nothing
    with pytest.raises(ValueError, match="no crash point named 'nowhere'"):
        _native.crash_point("nowhere")
    with pytest.raises(TypeError, match="'point' must be str"):
        _native.crash_point(1)  # type: ignore[arg-type]
