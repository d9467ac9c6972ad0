"""Finding the supervisor against hostile neighbours (issue 24): a client talks only to the
supervisor of its store, running as the store's owner; another user can neither answer
in its place, nor flood it into refusing attaches or into a log of one line per
connection; idle connections of the same user cannot use up its descriptors."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqstore import StoreClient
from mqstore.ipc import channel
from mqstore.ipc.commit import pid_alive
from mqstore.ipc.control import leftover_shm, store_hash
from mqstore.workers.control_socket import FD_HEADROOM, RefusalLog
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, wait_for
from tests.runtime.other_user import NOBODY, ROOT_ONLY, Squatter, as_user, open_to_others

# What a squatter answers: an attach that says ASYNC_FLUSH (so a SYNC put would not wait
# for a flush), a status document of its own.
FORGED = {
    "ctl": "", "pool": "", "generation": 1, "client_index": 0,
    "flush_disk_type": "ASYNC_FLUSH", "sync_flush_timeout_ms": 1,
    "os_page_cache_busy_timeout_ms": 1, "fast_fail_if_no_buffer_in_store_pool": True,
    "max_message_size_bytes": 4096, "default_topic_queue_nums": 1,
    "store_host": "127.0.0.1:1", "forged": True,
}  # fmt: skip


def _serve_forged(sock: socket.socket) -> None:
    """Answer every request line on every connection with FORGED, until killed."""
    while True:
        conn, _ = sock.accept()
        with contextlib.suppress(OSError):
            if conn.recv(65536):
                conn.sendall(json.dumps(FORGED).encode() + b"\n")
        conn.close()


def _mqstore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=60,
    )  # fmt: skip


def _kill_supervisor(store: Store) -> None:
    """SIGKILL the supervisor and wait for its workers to follow it."""
    assert store.proc is not None
    workers = [w["pid"] for w in store.status()["workers"]]
    store.proc.kill()
    store.proc.wait()
    store.proc = None
    store._log.close()
    wait_for(lambda: not any(pid_alive(p) for p in workers), 30, "the workers to exit")


@ROOT_ONLY
def test_another_user_cannot_answer_for_a_dead_supervisor(shared_dir: Path) -> None:
    """The supervisor dies; another user binds every name it can think of for it (the
    abstract name the store used to have, the socket file in the store directory). No
    client reaches the squatter: attach and status say no supervisor runs."""
    store = Store(shared_dir / "store")
    store.start()
    store.wait_workers_running()
    _kill_supervisor(store)
    path = str(store.path)
    abstract = f"\0mqstore-{store_hash(path)}-sup"
    held: list[socket.socket] = []

    def squat() -> str:
        said = []
        for name, addr in (
            ("abstract", abstract),
            ("file", os.path.join(path, channel.SOCKET_NAME)),
        ):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                if name == "file":
                    os.unlink(addr)
                s.bind(addr)
                s.listen(16)
                held.append(s)
                said.append(f"{name}: bound")
            except OSError as e:
                said.append(f"{name}: {type(e).__name__}")
        return ", ".join(said)

    def serve() -> None:
        _serve_forged(held[0])

    with Squatter(squat, serve) as squatter:
        # the squatter has the abstract name, but nothing in the store directory
        assert squatter.said == "abstract: bound, file: PermissionError", squatter.said
        with pytest.raises(channel.SupervisorUnavailable, match="no supervisor runs"):
            StoreClient.attach(store.path, timeout_s=2.0)
        st = _mqstore("status", path)
        assert st.returncode == 1 and "no supervisor runs" in st.stderr, st.stderr
        as_json = _mqstore("status", path, "--json")
        assert as_json.returncode == 1 and as_json.stdout == "", as_json.stdout
        # a restart serves the store again, the squatter still in place
        store.start()
        with StoreClient.attach(store.path) as client:
            assert client.put("t", b"after the squat", queue_id=0).ok
        assert "forged" not in store.status()
    assert store.stop() == 0
    assert leftover_shm(path) == []


@ROOT_ONLY
def test_a_client_refuses_a_supervisor_of_another_user(shared_dir: Path) -> None:
    """A socket in the store directory served by a process of another user (possible
    only while that user owned the directory) is refused by its peer credentials before
    anything it says is read."""
    d = shared_dir / "store"
    d.mkdir(mode=0o700)
    os.chown(d, NOBODY, NOBODY)
    listener: list[socket.socket] = []

    def bind() -> str:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(d / channel.SOCKET_NAME))
        s.listen(16)
        listener.append(s)
        return "bound"

    with Squatter(bind, lambda: _serve_forged(listener[0])) as squatter:
        assert squatter.said == "bound"
        os.chown(d, os.getuid(), os.getgid())  # the directory is the owner's again
        with pytest.raises(channel.SupervisorUnavailable, match="served by uid 65534"):
            channel.request(d, {"op": "status"})
        with pytest.raises(channel.SupervisorUnavailable, match="served by uid 65534"):
            StoreClient.attach(d, timeout_s=2.0)


def _refusal_lines(store: Store) -> int:
    return store.output().count("refused a connection")


@ROOT_ONLY
def test_another_user_flooding_connect_neither_blocks_attaches_nor_floods_the_log(
    shared_dir: Path,
) -> None:
    """2,000 connection attempts by another user: none reaches the supervisor; 20 of 20
    owner attaches succeed meanwhile. Then with the store opened to others (so that every
    attempt reaches the supervisor's own check): each is refused, and the log says so in
    a line or two, not one per connection."""
    store = Store(shared_dir / "store")
    store.start()
    store.wait_workers_running()
    path = store.path

    def flood() -> str:
        outcomes: dict[str, int] = {}
        for _ in range(2000):
            try:
                got = channel.request(path, {"op": "status"}, timeout_s=2.0)
                key = "denied" if got.get("denied") else "answered"
            except OSError as e:
                key = type(e).__name__
            outcomes[key] = outcomes.get(key, 0) + 1
        return json.dumps(outcomes)

    def attaches_while(squatter: Squatter) -> None:
        assert squatter.said == "ready"
        for i in range(20):
            with StoreClient.attach(path, timeout_s=5.0) as client:
                assert client.put("t", b"owner %d" % i, queue_id=0).ok

    with Squatter(lambda: "ready", lambda: print(flood(), flush=True)) as squatter:
        attaches_while(squatter)
    assert json.loads(as_user(flood)) == {"SupervisorRefused": 2000}
    before = _refusal_lines(store)
    open_to_others(path)
    assert json.loads(as_user(flood)) == {"denied": 2000}
    with Squatter(lambda: "ready", lambda: print(flood(), flush=True)) as squatter:
        attaches_while(squatter)
    assert 1 <= _refusal_lines(store) - before <= 3, store.output()[-3000:]
    assert store.status()["flags"] == ["running"]
    assert store.stop() == 0


def test_idle_connections_cannot_exhaust_the_supervisors_descriptors(
    make_store: StoreFactory,
) -> None:
    """1,000 idle connections against a supervisor allowed 64 descriptors (it holds about
    20 of its own): it used to die of EMFILE in accept. It keeps the newest ones and
    descriptors for its own work: status answers, a client attaches meanwhile, and a
    killed worker is spawned again."""
    store = make_store()
    store.wait_workers_running()
    assert store.proc is not None
    resource.prlimit(store.proc.pid, resource.RLIMIT_NOFILE, (64, 64))
    idle: list[socket.socket] = []
    try:
        for _ in range(1000):
            with contextlib.suppress(channel.SupervisorUnavailable):
                idle.append(channel.connect(store.path, timeout_s=5.0))
        assert len(idle) >= 900  # the backlog takes what accept has not reached yet
        t0 = time.monotonic()
        with StoreClient.attach(store.path, timeout_s=10.0) as client:
            assert client.put("t", b"meanwhile", queue_id=0).ok
        assert time.monotonic() - t0 < 10.0
        assert store.proc.poll() is None, store.output()[-3000:]
        status = store.status()
        assert status["flags"] == ["running"]
        held = sum(_still_open(s) for s in idle)
        assert held <= 64 - FD_HEADROOM, held
        (cleaner,) = [w for w in status["workers"] if w["name"] == "cleaner"]
        os.kill(cleaner["pid"], signal.SIGKILL)

        def respawned() -> bool:
            (now,) = [w for w in store.status()["workers"] if w["name"] == "cleaner"]
            return now["pid"] not in (0, cleaner["pid"]) and now["state"] == "running"

        wait_for(respawned, 60, "the cleaner to be spawned again")
    finally:
        for s in idle:
            s.close()
    assert store.stop() == 0, store.output()[-3000:]


def _still_open(s: socket.socket) -> bool:
    """The supervisor has not closed its end of `s`."""
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_refusals_are_said_at_a_bounded_rate() -> None:
    said: list[str] = []
    now = [100.0]
    log = RefusalLog(lambda msg, _level: said.append(msg), interval_s=10.0, clock=lambda: now[0])
    for _ in range(500):
        log.refused("permission denied")
    assert said == ["refused a connection: permission denied"]
    now[0] += 10.0
    log.refused("permission denied")
    assert said[1:] == ["refused a connection: permission denied (499 more since the last line)"]
