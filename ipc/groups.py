"""Consumer-group membership: who consumes as group G right now, so that an operator's
`mqstore group DIR reset|delete` never changes a group's offsets under a running consumer.

| file in the store dir            | held by                                            |
| -------------------------------- | -------------------------------------------------- |
| `.mqstore-groups/<group>.lock`   | shared: each running consumer of the group          |
|                                  | exclusive: a reset or delete, for its one change    |

A consumer that keeps its positions in memory and commits them (`mqstore tail --group G`,
or a program inside `with GroupMember(DIR, "G"):`) holds the shared `flock` while it
runs; the kernel drops it when the consumer exits or dies, SIGKILL included. A reset or
delete takes the lock exclusively without waiting and is refused (`GroupInUse`) while any
member holds it, since the member's next commit would silently undo the change (Kafka's
`--reset-offsets` refuses an active group for the same reason). A member that starts
during a change waits for it (milliseconds) and then reads the new offsets.

A program that calls `commit_offset` without being a member is not seen: stop it before
resetting its group, or make it a member.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from typing import Final

from mqstore.engine.names import check_group

GROUPS_DIR: Final = ".mqstore-groups"
# RocketMQ's rule for topic and group names (Validators.VALID_PATTERN_STR), also what
# makes a name safe as a file name here.


class GroupInUse(Exception):
    """A consumer of the group is attached: the reset or delete was not done."""

    def __init__(self, group: str) -> None:
        super().__init__(
            f"group {group!r} has a consumer attached (e.g. `mqstore tail --group {group}`); "
            "stop it, then try again"
        )
        self.group = group


def _open(store_dir: str | os.PathLike[str], group: str) -> int:
    check_group(group)
    d = os.path.join(os.fspath(store_dir), GROUPS_DIR)
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o700)  # in the store only: a missing store raises FileNotFoundError
    return os.open(
        os.path.join(d, f"{group}.lock"),
        os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
        0o600,
    )


class GroupMember:
    """Membership of `group` while open: `with GroupMember(DIR, "billing"): ...`.

    Blocks only while a reset or delete of the group is under way. Raises ValueError (a
    bad group name), OSError."""

    def __init__(self, store_dir: str | os.PathLike[str], group: str) -> None:
        self.group = group
        self._fd = _open(store_dir, group)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(self._fd)
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops the lock
            self._fd = -1

    def __enter__(self) -> GroupMember:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def no_members(store_dir: str | os.PathLike[str], group: str) -> Iterator[None]:
    """Hold `group` exclusively for one change of its offsets. Raises GroupInUse at once
    while a member is attached, ValueError for a bad group name."""
    fd = _open(store_dir, group)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise GroupInUse(group) from None
        yield
    finally:
        os.close(fd)
