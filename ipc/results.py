"""What a put returns: `PutMessageStatus` (RocketMQ's names) and `PutResult`.

Expected outcomes are values, never exceptions: a full pool is `OS_PAGECACHE_BUSY`, a
sync put not on disk in time is `FLUSH_DISK_TIMEOUT`, a failed fsync is
`FLUSH_DISK_FAILED` (mqstore's own status; RocketMQ has none and would not say it).
A caller who prefers exceptions asks for them: `PutResult.raise_for_status()`, or a
client attached with `raise_on_status=True`, raises one `PutError` subclass per status
family (`FlushError`, `ServiceUnavailableError`, `MessageIllegalError`).
"""

from __future__ import annotations

import enum
from typing import Final, NamedTuple


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
    uniq_key: str = ""

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK

    def raise_for_status(self) -> PutResult:
        """Return this result when it is PUT_OK, else raise its status family's
        `PutError` (as `requests.Response.raise_for_status` does for HTTP): for callers
        who would rather not check `status` after every put."""
        if self.status is not PutMessageStatus.PUT_OK:
            raise error_for(self)
        return self


FSYNC_FAILED: Final = "fsync failed: the store is read-only"  # FLUSH_DISK_FAILED's reason


def flush_timed_out(sync_timeout_s: float) -> str:
    """FLUSH_DISK_TIMEOUT's reason, after `sync_timeout_s` (the attach's syncFlushTimeout)."""
    return f"not flushed within syncFlushTimeout ({sync_timeout_s * 1000:.0f} ms)"


class PutError(Exception):
    """A put ended with a status other than PUT_OK; raised only on request
    (`PutResult.raise_for_status()`, or `StoreClient.attach(..., raise_on_status=True)`).

    `result` is the failed `PutResult` (for a batch, its first; all share the status)
    and `results` every result of the call. UNKNOWN_ERROR raises `PutError` itself;
    every other status raises the subclass of its family."""

    def __init__(self, result: PutResult, results: tuple[PutResult, ...] = ()) -> None:
        super().__init__(
            f"{result.status.value}: {result.reason}" if result.reason else result.status.value
        )
        self.result = result
        self.results = results or (result,)

    @property
    def status(self) -> PutMessageStatus:
        return self.result.status


class FlushError(PutError):
    """The record IS in the log, but its durability is not promised: FLUSH_DISK_TIMEOUT,
    FLUSH_DISK_FAILED (the store is now read-only), FLUSH_SLAVE_TIMEOUT,
    SLAVE_NOT_AVAILABLE. Putting it again may store it twice."""


class ServiceUnavailableError(PutError):
    """Nothing was written, and the same put may succeed later: SERVICE_NOT_AVAILABLE
    (stopping, read-only, disk full, no supervisor), OS_PAGECACHE_BUSY (no free pool
    buffer), CREATE_MAPPED_FILE_FAILED (the next segment was not ready)."""


class MessageIllegalError(PutError):
    """Nothing was written, and the same put will always fail: MESSAGE_ILLEGAL,
    PROPERTIES_SIZE_EXCEEDED (bad body, size, topic, properties or queue id)."""


_FAMILY: dict[PutMessageStatus, type[PutError]] = {
    PutMessageStatus.FLUSH_DISK_TIMEOUT: FlushError,
    PutMessageStatus.FLUSH_DISK_FAILED: FlushError,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: FlushError,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: FlushError,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ServiceUnavailableError,
    PutMessageStatus.OS_PAGECACHE_BUSY: ServiceUnavailableError,
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: ServiceUnavailableError,
    PutMessageStatus.MESSAGE_ILLEGAL: MessageIllegalError,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: MessageIllegalError,
    PutMessageStatus.UNKNOWN_ERROR: PutError,
}


def error_for(result: PutResult, results: tuple[PutResult, ...] = ()) -> PutError:
    """The exception of `result`'s status family (which must not be PUT_OK)."""
    return _FAMILY[result.status](result, results)


def raise_if_failed(results: list[PutResult]) -> list[PutResult]:
    """`results` of one put call when the first is PUT_OK (all of a call share a
    status), else raise its family's `PutError` carrying them all."""
    if results and results[0].status is not PutMessageStatus.PUT_OK:
        raise error_for(results[0], tuple(results))
    return results
