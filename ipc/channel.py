"""How runtime processes find the supervisor (a Linux abstract Unix socket).

Abstract socket names leave nothing in the file system, so a crashed run leaves no
stale socket file behind; they are derived from the store's real path, like the
shared-memory names.

* Supervisor: a stream socket `\\0mqstore-<h>-sup`. One JSON object per line each way.
  `{"op": "attach", "pid": P}` -> names and layout, the store's settings
  (`conf.settings.settings_doc`) and file geometry (`engine.reader.Geometry`), which a
  client's reads use instead of guessing (the connection then stays open: the client's
  row is freed when it closes); `{"op": "status"}` -> the status document;
  `{"op": "stop"}` -> begins a graceful stop.

No socket is on the put path: sync acknowledgements are futex waits on the owner-only
control block's flushed position (`ipc/native/mqs_futex.c`), so nothing another local user
sends can acknowledge a put.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import Any

from mqstore.ipc.control import store_hash


def supervisor_address(store_dir: str | os.PathLike[str]) -> str:
    return f"\0mqstore-{store_hash(store_dir)}-sup"


class SupervisorUnavailable(ConnectionError):
    """No supervisor answers for this store."""


def connect(store_dir: str | os.PathLike[str], timeout_s: float = 5.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout_s)
    try:
        s.connect(supervisor_address(store_dir))
    except OSError as e:
        s.close()
        raise SupervisorUnavailable(f"no supervisor runs for {os.fspath(store_dir)}: {e}") from e
    return s


def send_json(s: socket.socket, obj: dict[str, Any]) -> None:
    """Send one JSON line. A peer that already closed after answering (the supervisor
    refusing another user says why and hangs up) is not an error here: the answer is
    read next."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        s.sendall(json.dumps(obj).encode() + b"\n")


def recv_json(s: socket.socket, buf: bytearray | None = None) -> dict[str, Any]:
    """Read one JSON line (blocking, with the socket's timeout)."""
    data = buf if buf is not None else bytearray()
    while b"\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise SupervisorUnavailable("the supervisor closed the connection")
        data += chunk
    line, _, rest = bytes(data).partition(b"\n")
    if buf is not None:
        buf[:] = rest
    obj: dict[str, Any] = json.loads(line)
    return obj


def request(
    store_dir: str | os.PathLike[str], obj: dict[str, Any], timeout_s: float = 5.0
) -> dict[str, Any]:
    """One request, one answer, connection closed. Raises SupervisorUnavailable."""
    s = connect(store_dir, timeout_s)
    try:
        send_json(s, obj)
        try:
            return recv_json(s)
        except (OSError, ValueError) as e:
            raise SupervisorUnavailable(f"no answer from the supervisor: {e}") from e
    finally:
        s.close()
