"""Acting as another local user in a test (the tests run as root): a forked child drops to
an unprivileged uid and runs a function once (`as_user`) or serves on a socket until it
is stopped (`Squatter`)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from mqstore.ipc import channel

NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0, reason="dropping privileges to another user needs root"
)


def _drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _run_as(fn: Callable[[], str], uid: int, gid: int, w: int, end: bytes = b"") -> None:
    """In the forked child: drop to `uid`/`gid`, run `fn` and write what it returned, or
    `"<exception class>: <message>"` for what it raised, to the pipe `w`."""
    _drop_to(uid, gid)
    try:
        out = fn()
    except BaseException as e:
        out = f"{type(e).__name__}: {e}"
    os.write(w, out.encode()[:60000] + end)


def as_user(fn: Callable[[], str], uid: int = NOBODY, gid: int = NOBODY) -> str:
    """Run `fn` in a forked child that has dropped to `uid`/`gid` (no other groups);
    return what it returned, or `"<exception class>: <message>"` for what it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            _run_as(fn, uid, gid, w)
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


class Squatter:
    """A forked child of another user that runs `setup()` (what it says is `said`), then
    `serve()` until `stop()` kills it. Use as a context manager."""

    def __init__(
        self,
        setup: Callable[[], str],
        serve: Callable[[], None],
        uid: int = NOBODY,
        gid: int = NOBODY,
    ) -> None:
        r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            try:
                os.close(r)
                _run_as(setup, uid, gid, w, b"\n")
                os.close(w)
                serve()
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            self.said = f.readline().decode().strip()

    def stop(self) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0

    def __enter__(self) -> Squatter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def open_to_others(store_dir: str | os.PathLike[str]) -> None:
    """Open a running store's directory (0711) and supervisor socket (0666) to every
    user, as a careless operator might: only the supervisor's credential check is then
    left between other users and the store."""
    os.chmod(store_dir, 0o711)
    os.chmod(os.path.join(store_dir, channel.SOCKET_NAME), 0o666)
