"""How runtime processes find the supervisor: a Unix stream socket inside the store.

The socket is `<store>/.mqstore-sup.sock` (`SOCKET_NAME`): a path under the store's
owner-only directory, so no other user can bind it or connect to it (and with
`ipc_allow_group` the group can connect but not bind: the directory is 02750). It is
always addressed through an open descriptor of the store directory
(`/proc/self/fd/N/.mqstore-sup.sock`), so a store path of any length fits `sun_path`'s
108 bytes and the socket is the one in the directory whose owner was checked.

Both ends check who is at the other end (SO_PEERCRED): the supervisor serves only the
store's owner, root and the allowed group (`ipc.access.peer_refusal`); a client talks
only to a supervisor running as the store directory's owner (or root): anything else
answering is refused before a byte of its reply is read (`connect`).

One JSON object per line each way:

* `{"op": "attach", "pid": P, "wait_ms": W}` -> names and layout, the store's settings
  (`conf.settings.settings_doc`) and file geometry (`engine.geometry.Geometry`), which a
  client's reads use instead of guessing (the connection then stays open: the client's
  row is freed when it closes). The answer comes once the store's write path is up
  (`workers.supervisor`); one still down after W ms (default 10,000) is answered
  `{"error": ..., "not_up": {worker: why}}` (`WorkersNotUp`);
* `{"op": "status"}` -> the status document;
* `{"op": "stop"}` -> begins a graceful stop.

No socket is on the put path: sync acknowledgements are futex waits on the owner-only
control block's flushed position (`ipc/native/mqs_futex.c`), so nothing another local user
sends can acknowledge a put.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from typing import Any, Final

from mqstore.ipc import access

SOCKET_NAME: Final = ".mqstore-sup.sock"
_BACKLOG_RETRY_S: Final = 0.002
# The longest an attach may ask the supervisor to wait for the write path (`wait_ms`).
MAX_ATTACH_WAIT_MS: Final = 3_600_000


class SupervisorUnavailable(ConnectionError):
    """No supervisor answers for this store (or what answers is not its supervisor)."""


class WorkersNotUp(SupervisorUnavailable):
    """The supervisor runs, but workers a put waits on (allocator, committer; the flusher
    under SYNC_FLUSH) were not up within the attach's timeout: still booting, or
    crash-looping. `workers` maps each to the supervisor's why."""

    def __init__(self, message: str, workers: dict[str, str]) -> None:
        super().__init__(message)
        self.workers = workers


class SupervisorRefused(SupervisorUnavailable, access.StoreAccessDenied):
    """This user may not reach the store's supervisor (the socket's directory is closed
    to it): both "unavailable" and "access denied" to a caller that catches either."""


def open_store_dir(store_dir: str | os.PathLike[str]) -> int:
    """An O_PATH descriptor of the store directory, which `socket_path` names the socket
    through. Raises OSError."""
    return os.open(store_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def socket_path(dir_fd: int) -> str:
    """The supervisor socket's address, through the open store directory `dir_fd`."""
    return f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}"


def connect(store_dir: str | os.PathLike[str], timeout_s: float = 5.0) -> socket.socket:
    """A connection to the store's supervisor, whose process runs as the store directory's
    owner (or root). Raises SupervisorUnavailable when none answers or the peer is
    someone else, SupervisorRefused when this user may not reach it."""
    where = os.fspath(store_dir)
    try:
        dir_fd = open_store_dir(store_dir)
    except PermissionError as e:
        raise SupervisorRefused(f"{where}: permission denied: {e.strerror}") from e
    except OSError as e:
        raise SupervisorUnavailable(f"no supervisor runs for {where}: {e}") from e
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout_s)
    try:
        st = os.fstat(dir_fd)
        _connect_within(s, socket_path(dir_fd), timeout_s)
        uid = access.peer_uid(s)
    except PermissionError as e:
        s.close()
        why = access.denied(st, os.geteuid(), allow_group=bool(st.st_mode & 0o070))
        raise SupervisorRefused(f"{where}: {why}") from e
    except OSError as e:
        s.close()
        raise SupervisorUnavailable(f"no supervisor runs for {where}: {e}") from e
    finally:
        os.close(dir_fd)
    if uid not in (st.st_uid, 0):
        s.close()
        raise SupervisorUnavailable(
            f"the socket of {where} is served by uid {uid}, not by the store's owner "
            f"(uid {st.st_uid}): refusing to talk to it"
        )
    return s


def _connect_within(s: socket.socket, address: str, timeout_s: float) -> None:
    """Connect, trying again while the listener's backlog is full: a Unix socket with a
    timeout gets EAGAIN at once then, where a flood of connections would otherwise make
    every attach fail. Raises OSError (TimeoutError once `timeout_s` has passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            s.connect(address)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"the supervisor's backlog stayed full for {timeout_s:g} s"
                ) from None
            time.sleep(_BACKLOG_RETRY_S)


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
