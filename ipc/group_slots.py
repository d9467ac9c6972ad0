"""Offset slots of a consumer group: where a member keeps each queue's consumed offset
(the lowest offset not yet acked) so that it outlives the member, SIGKILL included.

| file in the store dir              | written by                                        |
| ---------------------------------- | ------------------------------------------------- |
| `.mqstore-groups/<group>.slots`    | the supervisor creates it (a fresh inode per run); |
|                                    | a queue's owner writes the slot of its grant       |
| `.mqstore-groups/longest-session-ms` | the supervisor: the longest `session_ms` its run |
|                                    | granted, read by the next run after a crash        |

`SLOTS` 64-bit words. The supervisor (`workers.group_coord`) gives each grant of a queue
to a member a slot and a tag (24 bits, new per grant); the member stores `tag << 40 |
offset` into that slot at every ack, one aligned 8-byte store (it cannot tear). Whoever
reads a slot keeps the value only when its tag is the grant's: a member that lost its
grant (its lease ran out while it was stopped) and stores late writes a stale tag, which
nobody takes, into a slot nobody else was given: the supervisor fences a lapsed grant's
slot until its member released the tag or exited (`workers.group_coord`). The kernel
keeps a shared mapping's stores when the process dies, so an acked offset is never lost
with its member (the supervisor then writes it to `config/consumerOffset.json`).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import stat
from typing import Final

from mqstore.engine import jsonconfig
from mqstore.engine.names import check_group

GROUPS_DIR: Final = ".mqstore-groups"
SLOTS: Final = 4096
SIZE: Final = SLOTS * 8
OFFSET_BITS: Final = 40
OFFSET_MASK: Final = (1 << OFFSET_BITS) - 1
TAG_MASK: Final = (1 << 24) - 1


LONGEST_SESSION: Final = "longest-session-ms"
_LONGEST_UNKNOWN_MS: Final = 60_000  # an unreadable record: the longest session allowed


def longest_session_path(store_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(store_dir), GROUPS_DIR, LONGEST_SESSION)


def read_longest_session(store_dir: str | os.PathLike[str]) -> int:
    """The longest session (ms) the last run granted a member: 0 when it recorded none
    (no member joined), the longest allowed when the record cannot be read or is not a
    plain file holding a session (never followed through a link, never waited on)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(longest_session_path(store_dir), flags)
    except FileNotFoundError:
        return 0
    except OSError:
        return _LONGEST_UNKNOWN_MS
    try:
        text = os.read(fd, 32) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        text = b""
    finally:
        os.close(fd)
    ms = int(text) if text.isdigit() else 0
    return ms if 0 < ms <= _LONGEST_UNKNOWN_MS else _LONGEST_UNKNOWN_MS


def write_longest_session(store_dir: str | os.PathLike[str], session_ms: int, mode: int) -> None:
    """Record `session_ms` as the longest this run granted (atomically: a crash leaves
    the old record or the new). No fsync: what it guards against, a member outliving
    its supervisor, cannot outlive the machine. Raises OSError."""
    path = longest_session_path(store_dir)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, str(session_ms).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def slots_path(store_dir: str | os.PathLike[str], group: str) -> str:
    check_group(group)
    return os.path.join(os.fspath(store_dir), GROUPS_DIR, f"{group}.slots")


def pack(tag: int, offset: int) -> int:
    if not 0 <= offset <= OFFSET_MASK:
        raise ValueError(f"offset {offset} out of a slot's range")
    return (tag & TAG_MASK) << OFFSET_BITS | offset


def unpack(word: int) -> tuple[int, int]:
    """(tag, offset) of a slot word; tag 0 is an empty slot."""
    return word >> OFFSET_BITS, word & OFFSET_MASK


class Slots:
    """The mapped slot file of one group."""

    def __init__(self, fd: int) -> None:
        try:
            st = os.fstat(fd)
            if st.st_size != SIZE:
                raise ValueError(f"a group slot file has {st.st_size} bytes, not {SIZE}")
            self._mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._words = (ctypes.c_uint64 * SLOTS).from_buffer(self._mm)
        self.words = self._words  # a slot's owner stores `pack(tag, offset)` words here

    @classmethod
    def create(cls, store_dir: str | os.PathLike[str], group: str, mode: int) -> Slots:
        """A fresh, zeroed slot file (a new inode: a member of an earlier run that still
        maps the old one writes nothing the new run reads). Supervisor only."""
        path = slots_path(store_dir, group)
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.dirname(path), 0o770 if jsonconfig.group_shared(store_dir) else 0o700)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        try:
            os.fchmod(fd, mode)
            os.ftruncate(fd, SIZE)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    @classmethod
    def open(cls, store_dir: str | os.PathLike[str], group: str) -> Slots:
        """The slot file the running supervisor made, checked to be the store owner's.
        Raises OSError, ValueError."""
        path = slots_path(store_dir, group)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            owner = os.stat(store_dir).st_uid
            if os.fstat(fd).st_uid != owner:
                raise ValueError(f"{path} is not owned by the store's owner")
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def read(self, index: int) -> tuple[int, int]:
        return unpack(self._words[index])

    def write(self, index: int, tag: int, offset: int) -> None:
        self._words[index] = pack(tag, offset)

    def close(self) -> None:
        words = getattr(self, "_words", None)
        if words is not None:
            del self._words
            del self.words
            del words
            with contextlib.suppress(BufferError):
                self._mm.close()
