"""What a put returns: `PutMessageStatus` (RocketMQ's names) and `PutResult`.

Expected outcomes are values, never exceptions: a full pool is `OS_PAGECACHE_BUSY`, a
sync put not on disk in time is `FLUSH_DISK_TIMEOUT`, a failed fsync is
`FLUSH_DISK_FAILED` (mqstore's own status; RocketMQ has none and would not say it).
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class PutMessageStatus(enum.Enum):
    """RocketMQ's PutMessageStatus member names, plus FLUSH_DISK_FAILED."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    FLUSH_DISK_FAILED = "FLUSH_DISK_FAILED"


class PutResult(NamedTuple):
    """The outcome of one put. For anything but PUT_OK, `reason` says why and the
    position fields are 0 / "" unless the record was written (FLUSH_DISK_TIMEOUT,
    FLUSH_DISK_FAILED: the record is in the log, its durability is not promised)."""

    status: PutMessageStatus
    reason: str = ""
    msg_id: str = ""
    physical_offset: int = 0
    size: int = 0
    queue_id: int = 0
    queue_offset: int = 0
    store_timestamp: int = 0

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


def failed(status: PutMessageStatus, reason: str) -> PutResult:
    return PutResult(status, reason)
