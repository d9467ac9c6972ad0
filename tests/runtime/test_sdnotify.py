"""sd_notify readiness: a real supervisor under a fake systemd (a datagram socket named
by NOTIFY_SOCKET) sends READY=1 once recovery is done and every worker runs, and
STOPPING=1 when it drains."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests.runtime.conftest import StoreFactory


def _listen(addr: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(addr)
    s.settimeout(60)  # generous: the machine is shared
    return s


def _fields(s: socket.socket) -> dict[str, str]:
    data = s.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines())


@pytest.mark.parametrize("abstract", [False, True])
def test_ready_once_workers_run_then_stopping(
    make_store: StoreFactory, tmp_path: Path, abstract: bool
) -> None:
    if abstract:
        name = f"mqstore-test-notify-{os.getpid()}"
        sock, env_addr = _listen("\0" + name), "@" + name
    else:
        path = str(tmp_path / "notify.sock")
        sock, env_addr = _listen(path), path
    with sock:
        st = make_store(env={"NOTIFY_SOCKET": env_addr}, start=False)
        st.start({"NOTIFY_SOCKET": env_addr}, wait=False)
        ready = _fields(sock)
        assert ready["READY"] == "1" and str(st.path) in ready["STATUS"]
        assert st.proc is not None and ready["MAINPID"] == str(st.proc.pid)
        # when READY=1 arrives, recovery is done and the store serves with every worker up
        doc = st.status()
        assert [w["state"] for w in doc["workers"]] == ["running"] * len(doc["workers"])
        assert st.stop() == 0
        assert _fields(sock)["STOPPING"] == "1"
        sock.settimeout(0)
        with pytest.raises(BlockingIOError):
            sock.recv(4096)  # READY=1 was sent once, nothing else after STOPPING=1
