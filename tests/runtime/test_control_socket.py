"""The supervisor's control socket against bad and hostile peers (issue 15): every field
of a request checked and answered, attach rows freed with their connection, a reader
that never reads cannot stall the supervisor's loop."""

from __future__ import annotations

import contextlib
import signal
import socket
import time

import pytest

from mqstore import StoreClient
from mqstore.ipc import channel
from mqstore.ipc import control as c
from mqstore.workers.control_socket import REPLY_TIMEOUT_S
from tests.runtime.harness import Store, wait_for


def _ask(sock: socket.socket, line: bytes, buf: bytearray) -> dict[str, object]:
    sock.sendall(line)
    return channel.recv_json(sock, buf)


@pytest.mark.parametrize(
    "line",
    [
        b'{"op": "attach", "pid": 1e400}\n',  # inf: int() raised OverflowError
        b'{"op": "attach", "pid": 12.5}\n',
        b'{"op": "attach", "pid": true}\n',
        b'{"op": "attach", "pid": -1}\n',
        b'{"op": "attach", "pid": 0}\n',
        b'{"op": "attach", "pid": 99999999999999999999999}\n',
        b'{"op": "attach"}\n',
        b'{"op": "attach", "pid": 1, "row": 3}\n',
        b'{"op": "attach", "pid": 1, "wait_ms": -1}\n',
        b'{"op": "attach", "pid": 1, "wait_ms": 1e400}\n',
        b'{"op": "attach", "pid": 1, "wait_ms": 3600001}\n',
        b'{"op": "attach", "pid": 1, "wait_ms": true}\n',
        b'{"op": "attach", "pid": 1, "wait_ms": "10"}\n',
        b'{"op": "status", "extra": 1}\n',
        b'{"op": ["status"]}\n',
        b'{"op": "attach", "pid": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
    ],
    ids=lambda b: b[:40].decode(),
)
def test_every_field_is_checked_and_answered(store: Store, line: bytes) -> None:
    with channel.connect(store.path) as sock:
        buf = bytearray()
        reply = _ask(sock, line, buf)
        assert str(reply.get("error", "")).startswith("bad request: "), reply
        # the same connection still works, and took no client row
        assert _ask(sock, b'{"op": "status"}\n', buf)["clients"] == 0
    assert store.proc is not None and store.proc.poll() is None, store.output()[-2000:]
    with StoreClient.attach(store.path) as client:
        assert client.put("t", b"after", queue_id=0).ok


def test_many_attaches_on_one_connection_leave_no_row_behind(store: Store) -> None:
    with channel.connect(store.path) as sock:
        buf = bytearray()
        first = _ask(sock, b'{"op": "attach", "pid": 4242}\n', buf)
        assert "client_index" in first, first
        for _ in range(299):
            again = _ask(sock, b'{"op": "attach", "pid": 4242}\n', buf)
            assert "already attached" in str(again.get("error")), again
        assert store.status()["clients"] == 1
    wait_for(lambda: store.status()["clients"] == 0, 30, "the connection's row to be freed")
    # every row is free again: as many clients as the control block has rows attach
    socks: list[socket.socket] = []
    try:
        for _ in range(c.MAX_CLIENTS):
            socks.append(channel.connect(store.path))
            got = _ask(socks[-1], b'{"op": "attach", "pid": 4242}\n', bytearray())
            assert "client_index" in got, got
    finally:
        for sock in socks:
            sock.close()


def _flood(store: Store) -> tuple[socket.socket, int]:
    """A connection that sends status requests in bulk, until the socket takes no more
    for a second, and never reads a reply; returns it and the bytes sent."""
    hostile = channel.connect(store.path, timeout_s=1.0)
    chunk = b'{"op": "status"}\n' * 2000
    sent = 0
    with contextlib.suppress(TimeoutError):
        for _ in range(200):
            sent += hostile.send(chunk)
    return hostile, sent


def test_a_reader_that_never_reads_cannot_stall_the_supervisor(store: Store) -> None:
    store.wait_workers_running()
    hostile = channel.connect(store.path)
    hostile.setblocking(False)
    sent = 0
    try:
        for _ in range(20_000):  # until the socket takes no more; replies never read
            sent += hostile.send(b'{"op": "status"}\n')
    except BlockingIOError:
        pass
    try:
        assert sent > 1000
        # the loop still serves others at once, attaches included
        t0 = time.monotonic()
        assert store.status()["flags"] == ["running"]
        with StoreClient.attach(store.path) as client:
            assert client.put("t", b"meanwhile", queue_id=0).ok
        assert time.monotonic() - t0 < REPLY_TIMEOUT_S
        wait_for(
            lambda: "took no reply" in store.output(), 30 + REPLY_TIMEOUT_S, "the reader dropped"
        )
    finally:
        hostile.close()
    assert store.stop() == 0, store.output()[-2000:]


def test_sigterm_is_not_held_up_by_a_reader_that_never_reads(store: Store) -> None:
    store.wait_workers_running()
    hostile, sent = _flood(store)
    try:
        assert sent > 100_000
        assert store.proc is not None
        t0 = time.monotonic()
        store.proc.send_signal(signal.SIGTERM)
        code = store.proc.wait(60)
        assert code == 0, store.output()[-2000:]
        assert time.monotonic() - t0 < 30
    finally:
        hostile.close()
    assert "stopped (exit 0)" in store.output()
