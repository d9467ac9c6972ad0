"""The C put path over a real control block (shared memory, no supervisor): every byte
it writes equals the reference encoder's; the lock, its repair after a dead holder, the
liveness bytes and the futex wait. These run under ASan/UBSan too (`make sanitize`)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine import record, recordcodes
from mqstore.engine.record import EncodeStatus, Message
from mqstore.ipc import control as c
from mqstore.ipc.commit import pid_alive
from mqstore.ipc.control_views import Flags
from mqstore.ipc.reservation import LIVE_LOCK, LiveLock, LiveTable
from tests.native.test_record_diff import messages

SEG = 1 << 20


def prep_of(msg: Message) -> _native.Prep:
    born_addr, born_port, _ = recordcodes.parse_host(msg.born_host)
    store_addr, store_port, _ = recordcodes.parse_host(msg.store_host)
    topic, props = msg.topic.encode(), record.encode_properties(msg.properties)
    enc = record.encode(msg, max_message_size=max(len(msg.body), 1))
    return (
        len(enc.data), msg.queue_id, msg.flag, msg.sys_flag, msg.born_timestamp, msg.body,
        topic, props, record.takes_queue_offset(msg.sys_flag), msg.reconsume_times,
        msg.prepared_transaction_offset, born_addr, born_port, store_addr, store_port,
    )  # fmt: skip


def expected(msg: Message, qo: int, po: int, sts: int) -> bytes:
    enc = record.encode(msg, max_message_size=max(len(msg.body), 1))
    out = bytearray(len(enc.data))
    record.patch_append_fields(out, 0, enc, qo, po, sts)
    return bytes(out)


def rewind(cb: c.ControlBlock) -> None:
    """Start the log over (each example is checked on its own)."""
    for off in (c.OFF_RESERVED, c.OFF_SEQ, c.OFF_PUBLISHED_SEQ):
        cb.set(off, 0)


def encodable(msg: Message) -> bool:
    return record.encode(msg, max_message_size=max(len(msg.body), 1)).status is EncodeStatus.OK


@settings(
    max_examples=200, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(st.lists(messages(), min_size=1, max_size=4))
def test_c_put_writes_the_reference_bytes(cb: c.ControlBlock, msgs: list[Message]) -> None:
    msgs = [m for m in msgs if encodable(m)]
    if not msgs:
        return
    rewind(cb)
    assert cb.pool_buf is not None
    app = _native.Appender(cb.buf, cb.pool_buf, os.getpid())
    try:
        preps = [prep_of(m) for m in msgs]
        qslots = [cb.find_or_add_queue(p[6], p[1]) for p in preps]
        before = [cb.get(cb.qrow_off(q) + 8) for q in qslots]
        if len(msgs) == 1:
            got = app.put(None, -1, qslots[0], preps[0], 10**9)
            assert isinstance(got, tuple), got
            seq, start, sts, qo, _lock_ns = got
            qoffs = [qo]
        else:
            got_b = app.put_batch(None, -1, qslots, preps, 10**9)
            assert isinstance(got_b, tuple), got_b
            seq, start, sts, qoffs, _lock_ns = got_b
        assert (seq, start) == (0, 0)
        at = start
        seen: dict[int, int] = {}
        for i, (m, p) in enumerate(zip(msgs, preps, strict=True)):
            want_qo = 0
            if p[8]:
                want_qo = seen.get(qslots[i], before[i])
                seen[qslots[i]] = want_qo + 1
            assert qoffs[i] == want_qo
            assert bytes(cb.pool_buf[at : at + p[0]]) == expected(m, want_qo, at, sts)
            joined = c.STATE_JOINED if i else 0  # one reservation: the rest joined
            assert cb.slot_state(seq + i) == c.STATE_DONE | joined
            at += p[0]
        assert cb.get(c.OFF_RESERVED) == at and cb.get(c.OFF_CS_PID) == 0
    finally:
        app.close()


def test_a_put_that_needs_the_general_path_writes_nothing(cb: c.ControlBlock) -> None:
    app = _native.Appender(cb.buf, cb.pool_buf, os.getpid())
    try:
        msg = Message("t", b"x" * 1000)
        qs = cb.find_or_add_queue(b"t", 0)
        cb.set(c.OFF_RESERVED, SEG - 500)  # the record does not fit: a roll
        assert app.put(None, -1, qs, prep_of(msg), 10**9) == _native.FALLBACK
        cb.set(c.OFF_RESERVED, 0)
        Flags(cb).mark_refusing_writes()
        assert app.put(None, -1, qs, prep_of(msg), 10**9) == _native.FALLBACK
        assert cb.get(c.OFF_SEQ) == 0 and cb.slot_state(0) == c.STATE_FREE
    finally:
        app.close()


def test_a_prep_whose_size_is_wrong_is_refused(cb: c.ControlBlock) -> None:
    app = _native.Appender(cb.buf, cb.pool_buf, os.getpid())
    try:
        bad = (1, *prep_of(Message("t", b"x"))[1:])
        with pytest.raises(ValueError, match="prep says 1 bytes"):
            app.put(None, -1, 0, bad, 10**9)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="prep must be a tuple of 15"):
            app.put(None, -1, 0, ("x",), 10**9)  # type: ignore[arg-type]
    finally:
        app.close()


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
