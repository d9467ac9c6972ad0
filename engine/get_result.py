"""What a read answers: RocketMQ's GetMessageStatus and the result of a get or pull
(`engine.reader.StoreReader`). Apart from the reader so that a client that only puts
(`ipc.read_results`, through `StoreClient`) does not import the whole read stack."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mqstore.engine.record_decode import RecordFields


class GetStatus(enum.Enum):
    """RocketMQ's GetMessageStatus (spec §7.3)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class GetResult:
    """`messages` are `DecodedRecord`s, or `RecordView`s for a zero-copy read."""

    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[RecordFields] = field(default_factory=list)
