"""Attaching while the store's write path (allocator, committer; the flusher under
SYNC_FLUSH) is not up. The supervisor listens a second or more before its workers run on
a busy machine; it used to answer attaches at once, and a put that needed the fourth
segment (the supervisor makes the first three) waited osPageCacheBusyTimeOutMills for an
allocator that was not running yet and got CREATE_MAPPED_FILE_FAILED (the flaky
`test_demo_stops_on_a_signal_it_inherited_ignored`). Now the supervisor answers an attach
only once its write path runs, within the wait the client asks for (its timeout), and
else names the workers not up (`WorkersNotUp`). A worker is held at interpreter start, or
made to crash at every start, by `boot_gate/sitecustomize.py`, so each gap is there
every time."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mqstore import PutMessageStatus, StoreClient, WorkersNotUp
from mqstore.ipc import channel
from mqstore.ipc import control as c
from mqstore.workers.control_socket import MAX_UNATTACHED
from mqstore.workers.supervisor import COMING_BACK_S
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import Store, wait_for

GATE_DIR = Path(__file__).parent / "boot_gate"
SEGMENT = 1 << 20  # the harness's segment_size_bytes
_WRITE_PATH = ("allocator", "committer", "flusher")  # a SYNC_FLUSH store's


def _held(gate: Path, worker: str = "allocator") -> dict[str, str]:
    return {"PYTHONPATH": str(GATE_DIR), "MQS_TEST_HOLD_WORKER": f"{worker}:{gate}"}


def _states(client: StoreClient) -> dict[str, str]:
    """The write path's workers' states, as the client's control block has them now."""
    cb = client.live_control_block()
    rows = [cb.worker(i) for i in range(c.MAX_WORKERS)]
    return {r[0]: c.WORKER_STATE_NAMES[r[4]] for r in rows if r[0] in _WRITE_PATH}


def _worker(store: Store, name: str) -> dict[str, Any]:
    return next(w for w in store.status()["workers"] if w["name"] == name)


def _wait_running(store: Store, *names: str) -> None:
    def up() -> bool:
        return all(_worker(store, name)["state"] == "running" for name in names)

    wait_for(up, 60, f"{', '.join(names)} to be running")


def test_an_attach_during_boot_is_answered_once_the_write_path_runs(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "allocator-may-boot"
    store = make_store(env=_held(gate), write_path=False)
    assert _worker(store, "allocator")["state"] == "starting"  # held at the gate
    _wait_running(store, "committer", "flusher")

    # An attach that may wait 1 s is refused after it, naming the allocator.
    t0 = time.monotonic()
    with pytest.raises(WorkersNotUp) as refused:
        StoreClient.attach(store.path, timeout_s=1)
    assert time.monotonic() - t0 < 1.0 + 0.5
    assert list(refused.value.workers) == ["allocator"], refused.value
    assert "booting" in refused.value.workers["allocator"], refused.value
    assert "allocator booting" in str(refused.value)
    assert store.status()["clients"] == 0

    # One that may wait longer waits in the supervisor, holding no client row, until the
    # allocator runs; it is answered then, not before.
    got: dict[str, Any] = {}

    def attach() -> None:
        client = StoreClient.attach(store.path, timeout_s=60)
        got["states"] = _states(client)
        got["client"] = client

    waiter = threading.Thread(target=attach, daemon=True)
    waiter.start()
    wait_for(lambda: store.status()["attaches_waiting"] == 1, 60, "the attach to wait")
    assert waiter.is_alive() and store.status()["clients"] == 0
    gate.touch()
    waiter.join(60)
    assert not waiter.is_alive()
    assert got["states"] == dict.fromkeys(_WRITE_PATH, "running")
    with got["client"] as client:
        body = b"x" * 256
        statuses: dict[str, int] = {}
        # four segments and more: the fourth and later are the allocator's to make
        while client.positions()["reserved"] < 4 * SEGMENT + SEGMENT // 2:
            r = client.put("boot", body, wait_store=False)
            statuses[r.status.name] = statuses.get(r.status.name, 0) + 1
            assert r.status is PutMessageStatus.PUT_OK, (r.reason, statuses)
    assert store.status()["attaches_waiting"] == 0


def test_a_crash_looping_committer_fails_the_attach_within_its_timeout(
    make_store: StoreFactory,
) -> None:
    store = make_store(
        env={"PYTHONPATH": str(GATE_DIR), "MQS_TEST_CRASH_WORKER": "committer"}, write_path=False
    )
    wait_for(lambda: _worker(store, "committer")["restarts"] >= 1, 60, "the committer to crash")
    _wait_running(store, "allocator", "flusher")
    t0 = time.monotonic()
    with pytest.raises(WorkersNotUp) as refused:
        StoreClient.attach(store.path, timeout_s=2)
    assert time.monotonic() - t0 < 2.0 + 0.5
    assert list(refused.value.workers) == ["committer"], refused.value
    why = refused.value.workers["committer"]
    assert "restart" in why and "exited with 1 (CRASH)" in why, why
    status = store.status()
    assert status["clients"] == 0 and status["attaches_waiting"] == 0
    assert store.proc is not None and store.proc.poll() is None  # it serves on, refusing


def test_a_write_path_worker_restarting_after_a_crash_holds_no_attach(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    """A worker that was running and crashed is coming back: attaches are answered at
    once meanwhile and puts go on (the files it made ahead carry them). Down for longer
    than COMING_BACK_S, it holds attaches as at boot."""
    gate = tmp_path / "allocator-may-boot"
    gate.touch()
    store = make_store(env=_held(gate), write_path=False)
    store.wait_workers_running()
    gate.unlink()  # its restart is held
    os.kill(_worker(store, "allocator")["pid"], signal.SIGKILL)
    wait_for(
        lambda: (w := _worker(store, "allocator"))["restarts"] == 1 and w["state"] == "starting",
        60,
        "the allocator's restart, held at the gate",
    )
    with StoreClient.attach(store.path, timeout_s=60) as client:
        assert _states(client)["allocator"] == "starting"  # answered without waiting
        for i in range(100):
            r = client.put("restart", b"y" * 256, wait_store=False)
            assert r.status is PutMessageStatus.PUT_OK, (i, r.reason)

    def refused() -> bool:
        try:
            StoreClient.attach(store.path, timeout_s=0.5).close()
        except WorkersNotUp as e:
            assert list(e.workers) == ["allocator"], e
            assert "last running" in e.workers["allocator"], e
            return True
        return False

    wait_for(refused, COMING_BACK_S + 30, "attaches to wait for the allocator again")
    gate.touch()
    with StoreClient.attach(store.path, timeout_s=60) as client:
        assert _states(client)["allocator"] == "running"


def test_waiting_attaches_stall_nothing(make_store: StoreFactory, tmp_path: Path) -> None:
    """Peers whose attaches wait hold a connection each and nothing else: status and
    other connections are served meanwhile, one that leaves or sends more than a request
    is dropped, a flood of idle connections closes idle ones first, and a stop answers
    the others."""
    gate = tmp_path / "allocator-may-boot"
    store = make_store(env=_held(gate), write_path=False)
    _wait_running(store, "committer", "flusher")
    socks: list[socket.socket] = []
    try:
        for _ in range(20):
            socks.append(channel.connect(store.path))
            socks[-1].sendall(b'{"op": "attach", "pid": 4242, "wait_ms": 3600000}\n')
        wait_for(lambda: store.status()["attaches_waiting"] == 20, 60, "20 waiting attaches")
        # another attach is not behind them: refused at its own timeout
        t0 = time.monotonic()
        with pytest.raises(WorkersNotUp):
            StoreClient.attach(store.path, timeout_s=1)
        assert time.monotonic() - t0 < 1.0 + 0.5
        socks.pop().close()  # a peer that leaves
        noisy = socks.pop()  # one that sends more than a request meanwhile
        with contextlib.suppress(OSError):
            noisy.sendall(b"x" * (2 << 20))
        with pytest.raises(OSError):  # dropped unanswered
            channel.recv_json(noisy)
        noisy.close()
        wait_for(lambda: store.status()["attaches_waiting"] == 18, 60, "two to be dropped")
        # idle connections beyond the 64 kept close idle ones, not the waiting attaches
        # (a status answered on a later connection: every earlier one was accepted)
        idle = [channel.connect(store.path) for _ in range(MAX_UNATTACHED + 6)]
        try:
            status = store.status()
            assert status["attaches_waiting"] == 18 and status["clients"] == 0, status
        finally:
            for sock in idle:
                sock.close()
        store.stop()
        for sock in socks:
            sock.settimeout(60)
            assert channel.recv_json(sock) == {"error": "the supervisor is stopping"}
    finally:
        for sock in socks:
            sock.close()


def test_a_timeout_longer_than_the_supervisor_waits_is_asked_as_its_longest(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    with StoreClient.attach(store.path, timeout_s=1e9) as client:  # wait_ms 3,600,000
        assert client.put("long", b"z", queue_id=0).ok


def test_the_harness_start_waits_for_the_write_path(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    """The test harness's start (`Store.start`) returns once the write path runs, however
    long the boot: a boot under load took the flusher 9.7 s once, longer than an attach's
    10 s timeout leaves, and a test that was not about boot failed with WorkersNotUp. The
    allocator is held 1.5 s here; an attach that waits 0.2 s right after the start is
    answered."""
    gate = tmp_path / "allocator-may-boot"
    t0 = time.monotonic()
    opener = threading.Timer(1.5, gate.touch)
    opener.start()
    try:
        store = make_store(env=_held(gate))
        held_s = time.monotonic() - t0
    finally:
        opener.cancel()
    assert held_s >= 1.5, held_s
    assert {_worker(store, n)["state"] for n in _WRITE_PATH} == {"running"}
    with StoreClient.attach(store.path, timeout_s=0.2) as client:
        assert client.put("ready", b"x", queue_id=0).ok
