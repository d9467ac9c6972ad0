"""Filler records: what the publisher writes over space a dead producer reserved.

A producer killed after reserving space leaves bytes that may be half a record. The
publisher (see `ipc.commit`) overwrites the whole reservation with a valid RocketMQ V1
record of the same length that takes over the dead put's topic, queue id and queue
offset, so consume queues stay dense and RocketMQ's own decoder still reads the log.
Readers skip it (`is_filler`):

| field         | value                                                    |
| ------------- | -------------------------------------------------------- |
| FLAG          | `FILLER_FLAG` (0x4D514649, "MQFI")                        |
| BORNTIMESTAMP | 0                                                        |
| properties    | `MQSTORE_FILLER=1` when it fits, else none               |
| body          | zeros, as long as needed to make the reserved length     |

A reservation with no queue row (the BLANK that ends a segment) is refilled as a BLANK;
one for a record that takes no queue offset gets a filler of `INTERNAL_TOPIC`, queue 0.
"""

from __future__ import annotations

from typing import Final

from mqstore.engine import record
from mqstore.engine.record import EncodedRecord, EncodeStatus, Message, WritableBuffer

FILLER_FLAG: Final = 0x4D514649
FILLER_PROPERTY: Final = "MQSTORE_FILLER"
INTERNAL_TOPIC: Final = "MQSTORE_FILLER"  # for a dead put that took no queue offset


def filler_record(
    size: int, topic: str, queue_id: int, store_host: str = "127.0.0.1:10911"
) -> EncodedRecord:
    """An encoded filler of exactly `size` bytes (placeholders for the appender fields).

    Raises ValueError when even an empty-body record of this topic does not fit.
    """
    tlen = len(topic.encode("utf-8"))
    store_v6 = record.parse_host(store_host)[2]
    for props in ({FILLER_PROPERTY: "1"}, {}):
        plen = len(record.encode_properties(props))
        body_len = size - record.record_length(0, tlen, plen, store_v6=store_v6)
        if body_len >= 0:
            msg = Message(
                topic, bytes(body_len), props, queue_id=queue_id, flag=FILLER_FLAG,
                store_host=store_host,
            )  # fmt: skip
            rec = record.encode(msg, max_message_size=max(size, record.DEFAULT_MAX_MESSAGE_SIZE))
            if rec.status is EncodeStatus.OK and len(rec.data) == size:
                return rec
    raise ValueError(f"no filler record of topic {topic!r} fits {size} bytes")


def write_filler(
    buf: WritableBuffer,
    pos: int,
    size: int,
    topic: str | None,
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    store_host: str = "127.0.0.1:10911",
) -> None:
    """Overwrite `buf[pos:pos+size]` with a filler (topic None: a BLANK)."""
    if topic is None:
        record.write_blank(buf, pos, size)
        return
    rec = filler_record(size, topic, queue_id, store_host)
    record.patch_append_fields(buf, pos, rec, queue_offset, physical_offset, store_timestamp)


def is_filler(rec: record.DecodedRecord) -> bool:
    """True for a filler record: readers, the dispatcher's consumers and checks skip it."""
    if rec.flag != FILLER_FLAG or rec.born_timestamp != 0:
        return False
    return rec.properties.get(FILLER_PROPERTY) == "1" or not any(rec.body)
