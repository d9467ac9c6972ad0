"""Who may use a running store: its owner, and with `ipc_allow_group` its group.

* The store directory and the files mqstore creates are owner-only (0700 / 0600); with
  `ipc_allow_group` the store directory, the shared memory, the reservation lock and the
  names file are group-accessible and owned by the store directory's group.
* The supervisor's socket is a path in the store directory (`ipc.channel`): other users
  can neither bind nor reach it. Both ends still check the other's credentials
  (SO_PEERCRED): the supervisor answers a peer of another user (outside the group) with
  one error line, nothing else: no attach, no status, no stop; a client refuses a peer
  that is not the store directory's owner (or root).
* Shared-memory names carry a random part chosen at each boot, so they can be neither
  guessed nor squatted; the supervisor records them, with a random nonce it also writes
  into the control block, in `.mqstore-ipc.json` in the store directory (owner-only, or
  group-readable with the option). Before using segments, a client checks that they
  belong to the store's owner, are not open to others, and carry the recorded nonce: it
  refuses segments the store did not create (`StoreAccessDenied`).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from typing import Any, Final

from mqstore.engine import fileio

NAMES_FILE: Final = ".mqstore-ipc.json"
_PEERCRED: Final = struct.Struct("3i")  # pid, uid, gid


class StoreAccessDenied(PermissionError):
    """This process may not use the store, or the store's IPC is not what it created."""


def modes(allow_group: bool) -> tuple[int, int]:
    """(mode of shared files and segments, mode of the store directory)."""
    return (0o660, 0o2750) if allow_group else (0o600, 0o700)


def _groups_of(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


def _peercred(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of the Unix socket `conn`."""
    pid, uid, gid = _PEERCRED.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return pid, uid, gid


def peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of the Unix socket `conn`."""
    return _peercred(conn)[1]


def peer_pid(conn: socket.socket) -> int:
    """The process id of the process at the other end of the Unix socket `conn`."""
    return _peercred(conn)[0]


def peer_refusal(conn: socket.socket, store_dir: str, allow_group: bool) -> str:
    """Why the peer of `conn` may not use the store ("" when it may): the store's owner
    and root may; with `allow_group`, members of the store directory's group too."""
    pid, uid, gid = _peercred(conn)
    st = os.stat(store_dir)
    if uid in (st.st_uid, 0):
        return ""
    if allow_group and (gid == st.st_gid or st.st_gid in _groups_of(pid)):
        return ""
    return denied(st, uid, allow_group)


def denied(store: os.stat_result, uid: int, allow_group: bool) -> str:
    """Why user `uid` may not use the store whose directory's `stat` is `store`, and how
    the owner would allow it."""
    how = (
        f"add it to group {store.st_gid}"
        if allow_group
        else "set ipc_allow_group = true and add it to the store directory's group"
    )
    return (
        f"permission denied: the store belongs to uid {store.st_uid}; uid {uid} may not use "
        f"it (to allow another user: {how})"
    )


def share_with_group(path: str, store_dir: str, fd: int | None = None) -> None:
    """Give `path` (or the open `fd`) the store directory's group and mode 0660."""
    gid = os.stat(store_dir).st_gid
    if fd is not None:
        os.fchown(fd, -1, gid)
        os.fchmod(fd, 0o660)
    else:
        os.chown(path, -1, gid)
        os.chmod(path, 0o660)


def write_names(store_dir: str, names: dict[str, Any], allow_group: bool) -> None:
    """Record this boot's shared-memory names and nonce (atomically)."""
    path = os.path.join(store_dir, NAMES_FILE)
    fileio.write_file_atomic(path, json.dumps(names).encode(), mode=0o600)
    if allow_group:
        os.chown(path, -1, os.stat(store_dir).st_gid)
        os.chmod(path, 0o640)


def read_names(store_dir: str) -> dict[str, Any]:
    """The names file's content. Raises StoreAccessDenied when it cannot be read."""
    path = os.path.join(store_dir, NAMES_FILE)
    try:
        with open(path, "rb") as f:
            doc: dict[str, Any] = json.loads(f.read())
    except PermissionError as e:
        raise StoreAccessDenied(f"{path}: {e.strerror}: the store belongs to another user") from e
    except (OSError, ValueError) as e:
        raise StoreAccessDenied(f"{path}: cannot read the store's IPC names: {e}") from e
    return doc


def check_segment(name: str, store_dir: str) -> None:
    """Refuse a shared-memory segment the store did not create: not owned by the store
    directory's owner, or open to other users. Raises StoreAccessDenied."""
    try:
        st = os.stat(os.path.join("/dev/shm", name))
    except OSError as e:
        raise StoreAccessDenied(f"shared memory {name}: {e}") from e
    owner = os.stat(store_dir).st_uid
    if st.st_uid != owner:
        raise StoreAccessDenied(
            f"shared memory {name} belongs to uid {st.st_uid}, not to the store's owner "
            f"{owner}: refusing a segment the store did not create"
        )
    if stat.S_IMODE(st.st_mode) & 0o007:
        raise StoreAccessDenied(f"shared memory {name} is open to other users: refusing it")
