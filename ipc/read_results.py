"""What a read returns: `GetMessageStatus` (RocketMQ's names), `PullResult` and
`PullViews` (a zero-copy pull).

`GetMessageStatus` is `engine.reader.GetStatus` under RocketMQ's own name. A pulled
message is an `engine.record.DecodedRecord` (body, topic, queue_id, queue_offset,
physical_offset, properties, tags, keys, msg_id, born_timestamp, store_timestamp, ...);
in a `PullViews` it is an `engine.record.RecordView`, the same fields with the body a
read-only memoryview of the mapped commit log (see `RecordView` for how long it lives).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from mqstore.engine.get_result import GetResult, GetStatus
from mqstore.engine.record_decode import DecodedRecord, RecordFields, RecordView

GetMessageStatus = GetStatus


@dataclass(slots=True)
class _Pulled:
    """The outcome of one pull. `next_offset` is where the next pull of this queue should
    start (also after NO_MATCHED_MESSAGE: the filtered-out units are behind it);
    `min_offset`/`max_offset` are the queue's readable range when the pull ran."""

    status: GetMessageStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: Sequence[RecordFields] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return self.status is GetMessageStatus.FOUND


@dataclass(slots=True)
class PullResult(_Pulled):
    """A pull whose messages own their bodies (`bytes`)."""

    messages: list[DecodedRecord] = field(default_factory=list)

    @classmethod
    def of(cls, res: GetResult) -> PullResult:
        """From a copying `StoreReader.get_messages` (its messages are DecodedRecords)."""
        msgs = cast(list[DecodedRecord], res.messages)
        return cls(res.status, res.next_offset, res.min_offset, res.max_offset, msgs)


@dataclass(slots=True)
class PullViews(_Pulled):
    """A zero-copy pull: every body is a read-only memoryview of the mapped log, alive
    (with the mapping under it) until released; `with` releases them all on exit."""

    messages: list[RecordView] = field(default_factory=list)

    @classmethod
    def of(cls, res: GetResult) -> PullViews:
        """From a `StoreReader.get_messages(..., zero_copy=True)`."""
        msgs = cast(list[RecordView], res.messages)
        return cls(res.status, res.next_offset, res.min_offset, res.max_offset, msgs)

    def release(self) -> None:
        """Release every body view (slices taken of them stay valid until released)."""
        for m in self.messages:
            m.body.release()

    def __enter__(self) -> PullViews:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
