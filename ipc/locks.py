"""Locks that survive the death of their holder: `flock` on files.

The kernel drops a `flock` lock when the last descriptor of its open file goes, which a
dying holder's exit (SIGKILL included) does, so a killed producer never wedges the
store; a POSIX semaphore or `multiprocessing.Lock` would.

`flock` locks belong to the open file, not to the process: two `FileLock`s, even in one
process (two clients in two threads), exclude each other. fcntl record locks
(`lockf`) would not: they belong to the process, so a second client in another thread
got in beside the first, and closing any descriptor of the file dropped the process's
lock. One `FileLock` shared between threads needs a `threading.Lock` in front (the
client has one). A forked child shares its parent's open files, locks included: it
closes the inherited descriptor and opens its own (`FileLock.forget`).

| file in the store dir      | what it serialises                                     |
| -------------------------- | ------------------------------------------------------ |
| the store directory itself | the supervisor's exclusive hold on the store (`lock`   |
|                            | holds its pid, for people: deleting it changes nothing)|
| `.mqstore-commit.lock`     | the commit step (committer, or the flusher on demand)  |
"""

from __future__ import annotations

import fcntl
import os
from typing import Final

STORE_LOCK: Final = "lock"
COMMIT_LOCK: Final = ".mqstore-commit.lock"


class FileLock:
    """An exclusive flock on one file; `acquire` blocks. Cost: one syscall each way."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)

    def acquire(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def try_acquire(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            return False
        return True

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def forget(self) -> None:
        """In a forked child: close the descriptor inherited from the parent without
        unlocking (the open file, and any lock the parent holds on it, stay the
        parent's); the child then opens its own `FileLock`."""
        self.close()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class StoreLockHeld(Exception):
    """Another supervisor holds the store."""

    def __init__(self, store_dir: str, holder: str) -> None:
        super().__init__(
            f"{store_dir} is locked by another supervisor (pid {holder or 'unknown'}); "
            "stop it first with `mqstore stop`"
        )
        self.holder = holder


def take_store_lock(store_dir: str) -> int:
    """Supervisor only (and the offline tools that must not run beside one): take the
    store exclusively and write our pid into `<store>/lock`.

    The lock is a `flock` on the store directory itself, not on a file in it: a user
    who deletes `lock` (or anything else in the directory) cannot make a second
    supervisor believe the store is free and "recover" a live one. `lock` only tells
    who holds it. Returns the directory's fd (keep it open for the holder's life).
    Raises StoreLockHeld, or OSError (a `lock` that is a symbolic link: ELOOP).
    """
    fd = os.open(store_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockHeld(store_dir, _recorded_holder(store_dir)) from None
    try:
        path = os.path.join(store_dir, STORE_LOCK)
        pfd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(pfd, 0)
            os.pwrite(pfd, f"{os.getpid()}\n".encode(), 0)
        finally:
            os.close(pfd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _recorded_holder(store_dir: str) -> str:
    """The pid `<store>/lock` names ("" when it is gone or unreadable)."""
    try:
        path = os.path.join(store_dir, STORE_LOCK)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return ""
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    finally:
        os.close(fd)


def store_lock_holder(store_dir: str) -> int | None:
    """The pid of the supervisor holding the store (-1 when `lock` does not say), or None
    when nobody holds it."""
    try:
        fd = os.open(store_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raw = _recorded_holder(store_dir)
            return int(raw) if raw.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
