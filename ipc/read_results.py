"""What a read returns: `GetMessageStatus` (RocketMQ's names) and `PullResult`.

`GetMessageStatus` is `engine.reader.GetStatus` under RocketMQ's own name. A pulled
message is an `engine.record.DecodedRecord` (body, topic, queue_id, queue_offset,
physical_offset, properties, tags, keys, msg_id, born_timestamp, store_timestamp, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mqstore.engine.reader import GetResult, GetStatus
from mqstore.engine.record import DecodedRecord

GetMessageStatus = GetStatus


@dataclass(slots=True)
class PullResult:
    """The outcome of one pull. `next_offset` is where the next pull of this queue should
    start (also after NO_MATCHED_MESSAGE: the filtered-out units are behind it);
    `min_offset`/`max_offset` are the queue's readable range when the pull ran."""

    status: GetMessageStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[DecodedRecord] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return self.status is GetMessageStatus.FOUND

    @classmethod
    def of(cls, res: GetResult) -> PullResult:
        return cls(res.status, res.next_offset, res.min_offset, res.max_offset, res.messages)
